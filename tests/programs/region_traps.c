/* region_traps.c - program_sigtrap.c and program_traps.c inside a region
 * (ITraceOn/ITraceOff): a SIGTRAP handler (rt_on_trap) for two raises, an
 * int3 and a raise, then int3/ud2 rounds with a SIGILL handler (rt_on_ill)
 * that siglongjmps out. Untraced it prints "handled 7 ills 3" and exits 0. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include "itrace.h"

static volatile int handled, ills;
static sigjmp_buf rt_env;

__attribute__((noinline)) void rt_on_trap(int sig) {
    if (sig == SIGTRAP)
        handled++;
}

__attribute__((noinline)) void rt_on_ill(int sig) {
    if (sig == SIGILL)
        ills++;
    siglongjmp(rt_env, 1);
}

__attribute__((noinline)) void rt_round(void) {
    __asm__ volatile("int3");
    __asm__ volatile("ud2");
}

int main(void) {
    /* Static, so zeroed without a memset (a rep stos, which callgrind counts per iteration). */
    static struct sigaction sa;
    sa.sa_handler = rt_on_trap;
    sigaction(SIGTRAP, &sa, 0);
    sa.sa_handler = rt_on_ill;
    sigaction(SIGILL, &sa, 0);
    ITraceOn();
    raise(SIGTRAP);
    raise(SIGTRAP);
    __asm__ volatile("int3");
    raise(SIGTRAP);
    for (volatile int i = 0; i < 3; i++) { /* volatile: kept across siglongjmp */
        if (sigsetjmp(rt_env, 1) == 0)
            rt_round();
    }
    ITraceOff();
    printf("handled %d ills %d\n", handled, ills);
    return handled == 7 && ills == 3 ? 0 : 1;
}
