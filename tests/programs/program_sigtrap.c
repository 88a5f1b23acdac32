/* program_sigtrap.c - a program that handles SIGTRAP itself: it raises SIGTRAP
 * twice, executes an int3 of its own, then raises again. Untraced it prints
 * "handled 4" and exits 0; a tracer must deliver all four traps to pt_on_trap
 * (4 calls) and never take the int3 for one of its own breakpoints. */
#include <signal.h>
#include <stdio.h>

static volatile int handled;

__attribute__((noinline)) void pt_on_trap(int sig) {
    if (sig == SIGTRAP)
        handled++;
}

int main(void) {
    /* Static, so zeroed without a memset (a rep stos, which callgrind counts per iteration). */
    static struct sigaction sa;
    sa.sa_handler = pt_on_trap;
    sigaction(SIGTRAP, &sa, 0);
    raise(SIGTRAP);
    raise(SIGTRAP);
    /* The kernel reports an int3 as SIGTRAP with si_code SI_KERNEL; the pc is
     * already past it, so the handler returns to the next instruction. */
    __asm__ volatile("int3");
    raise(SIGTRAP);
    printf("handled %d\n", handled);
    return handled == 4 ? 0 : 1;
}
