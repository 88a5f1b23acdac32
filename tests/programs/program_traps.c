/* program_traps.c - int3, ud2 and longjmp in sequence, as a crash-handler test
 * does: an int3 goes to pt2_on_trap (SIGTRAP, returns past the int3), a ud2 to
 * pt2_on_ill (SIGILL), which siglongjmps back to main. Three rounds; untraced
 * it prints "traps 3 ills 3" and exits 0. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>

static volatile int traps, ills;
static sigjmp_buf pt2_env;

__attribute__((noinline)) void pt2_on_trap(int sig) {
    if (sig == SIGTRAP)
        traps++;
}

__attribute__((noinline)) void pt2_on_ill(int sig) {
    if (sig == SIGILL)
        ills++;
    siglongjmp(pt2_env, 1);
}

__attribute__((noinline)) void pt2_round(void) {
    __asm__ volatile("int3");
    __asm__ volatile("ud2");
}

int main(void) {
    /* Static, so zeroed without a memset (a rep stos, which callgrind counts per iteration). */
    static struct sigaction sa;
    sa.sa_handler = pt2_on_trap;
    sigaction(SIGTRAP, &sa, 0);
    sa.sa_handler = pt2_on_ill;
    sigaction(SIGILL, &sa, 0);
    for (volatile int i = 0; i < 3; i++) { /* volatile: kept across siglongjmp */
        if (sigsetjmp(pt2_env, 1) == 0)
            pt2_round();
    }
    printf("traps %d ills %d\n", traps, ills);
    return traps == 3 && ills == 3 ? 0 : 1;
}
