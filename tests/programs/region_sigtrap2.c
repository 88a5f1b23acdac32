/* region_sigtrap2.c - inside a region, the program installs its own SIGTRAP
 * handler (with sigaction), raises SIGTRAP, and blocks SIGTRAP for a while:
 * the region must go on, and the handler must get exactly its SIGTRAP. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "itrace.h"

static volatile int traps;
static void on_trap(int sig) { traps += sig == SIGTRAP; }

__attribute__((noinline)) long rq2_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i % 7;
    return s;
}

int main(void) {
    ITraceOn();
    long w = rq2_work(20);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_trap;
    sigaction(SIGTRAP, &sa, 0);
    raise(SIGTRAP);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTRAP);
    sigprocmask(SIG_BLOCK, &set, 0);
    w += rq2_work(20);
    sigprocmask(SIG_UNBLOCK, &set, 0);
    w += rq2_work(20);
    ITraceOff();
    printf("region_sigtrap2: traps %d work %ld\n", traps, w);
    return traps == 1 ? 0 : 1;
}
