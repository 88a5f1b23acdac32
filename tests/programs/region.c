/* region.c - ITraceOn/ITraceOff around part of main: nested pairs,
 * ITraceEnabled inside and outside, system calls inside the region.
 * Functions named rg_untraced_* run only outside regions; rg_* others only
 * inside, so callgrind's full-run self counts are the region's. */
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "itrace.h"

__attribute__((noinline)) long rg_untraced_sum(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i ^ (s >> 1);
    return s;
}

__attribute__((noinline)) long rg_leaf(long x) { return x * 3 + 1; }

__attribute__((noinline)) long rg_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += (i & 1) ? rg_leaf(i) : i;
    return s;
}

__attribute__((noinline)) long rg_nested(long n) {
    long s = 1;
    for (long i = 1; i <= n; i++) s = s * 7 % 1000003 + i;
    return s;
}

int main(void) {
    long a = rg_untraced_sum(100);
    int before = ITraceEnabled();
    ITraceOn();
    long b = rg_work(50);
    ITraceOn(); /* nested: the region goes on after the inner ITraceOff */
    long c = rg_nested(10);
    ITraceOff();
    int inside = ITraceEnabled();
    long d = rg_leaf(7);
    write(1, "region: in a system call\n", 25);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, 0);
    ITraceOff();
    int after = ITraceEnabled();
    long e = rg_untraced_sum(200);
    printf("region: %ld %ld %ld %ld %ld enabled before %d inside %d after %d\n", a, b, c, d, e, before, inside, after);
    return 0;
}
