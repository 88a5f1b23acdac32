/* inherit.c - prints what the program inherited from whoever started it: the
 * signals it starts with ignored, the signals it starts with blocked, and its
 * environment in order, one variable a line. tests/tests/inherit.rs compares
 * this output under itrace with the output of the untraced program started
 * the same way. A short region (ITraceOn/ITraceOff) lets the in-process
 * backend (--region) record something. */
#include <signal.h>
#include <stdio.h>
#ifdef INHERIT_STATIC
/* inherit_static: linked statically, without libitrace, for the backends that trace it whole
 * and slowly (qemu's GDB stub steps some 1,000 branches a second: the dynamic program's 281,000
 * instructions of loader and libitrace took 20 s, the static one's start-up a few); its region
 * calls do nothing. */
static void ITraceOn(void) {}
static void ITraceOff(void) {}
#else
#include "itrace.h"
#endif

extern char **environ;

__attribute__((noinline)) unsigned long ih_work(unsigned long n) {
    unsigned long h = 1;
    for (unsigned long i = 0; i < n; i++) h = h * 31 + i;
    return h;
}

int main(void) {
    sigset_t blocked;
    sigprocmask(SIG_BLOCK, NULL, &blocked);
    printf("ignored:");
    for (int sig = 1; sig <= 64; sig++) {
        struct sigaction sa;
        if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN) printf(" %d", sig);
    }
    printf("\nblocked:");
    for (int sig = 1; sig <= 64; sig++)
        if (sigismember(&blocked, sig) == 1) printf(" %d", sig);
    printf("\n");
    for (char **e = environ; *e; e++) printf("env %s\n", *e);
    ITraceOn();
    unsigned long h = ih_work(100);
    ITraceOff();
    printf("work %lu\n", h & 1);
    return 0;
}
