/* region_segv.c - a region that ends in SIGSEGV two calls deep. */
#include <stdio.h>
#include "itrace.h"

__attribute__((noinline)) void rs_store(volatile int *p) { *p = 42; }
__attribute__((noinline)) void rs_outer(volatile int *p) { rs_store(p); }

/* Opaque to the optimiser, so the null store is not removed as undefined behaviour. */
static volatile int *volatile nowhere = 0;

int main(void) {
    puts("region_segv: about to crash");
    fflush(stdout);
    ITraceOn();
    rs_outer(nowhere);
    ITraceOff();
    return 0;
}
