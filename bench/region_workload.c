/* region_workload.c - the region benchmarked by bench/region.sh.
 *   region_workload N        run work(N) inside ITraceOn/ITraceOff, print the time it took
 *   region_workload pairs M  time M untraced ITraceOn+ITraceOff pairs, print ns per pair */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "itrace.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((noinline)) long leaf(long x) { return (x * 2654435761u) >> 7; }

__attribute__((noinline)) long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += (i & 3) ? leaf(i) : i;
    return s;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "pairs") == 0) {
        long m = atol(argv[2]);
        double t0 = now();
        for (long i = 0; i < m; i++) {
            ITraceOn();
            ITraceOff();
        }
        double t1 = now();
        printf("pairs %ld ns_per_pair %.2f\n", m, (t1 - t0) * 1e9 / m);
        return 0;
    }
    long n = argc > 1 ? atol(argv[1]) : 10000;
    double t0 = now();
    ITraceOn();
    long s = work(n);
    ITraceOff();
    double t1 = now();
    printf("region n %ld seconds %.6f result %ld\n", n, t1 - t0, s);
    return 0;
}
