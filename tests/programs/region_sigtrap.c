/* region_sigtrap.c - a program with its own SIGTRAP handler, raising
 * SIGTRAP inside and outside a region: both must reach the handler. */
#include <signal.h>
#include <stdio.h>
#include "itrace.h"

static volatile int traps;
static void on_trap(int sig) { traps += sig == SIGTRAP; }

__attribute__((noinline)) long rq_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i & 3;
    return s;
}

int main(void) {
    signal(SIGTRAP, on_trap);
    raise(SIGTRAP);
    ITraceOn();
    long w = rq_work(30);
    raise(SIGTRAP);
    w += rq_work(10);
    ITraceOff();
    printf("region_sigtrap: traps %d work %ld\n", traps, w);
    return traps == 2 ? 0 : 1;
}
