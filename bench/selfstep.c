/* selfstep.c - the baseline for the in-process recorder: a thread sets the
 * trap flag on itself and counts steps in a SIGTRAP handler, over the same
 * work() as region_workload.c. Prints steps and the steps per second. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile long steps;
static void on_trap(int s) { (void)s; steps++; }

__attribute__((noinline)) long leaf(long x) { return (x * 2654435761u) >> 7; }

__attribute__((noinline)) long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += (i & 3) ? leaf(i) : i;
    return s;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000;
    signal(SIGTRAP, on_trap);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    __asm__ volatile("pushfq; orq $0x100, (%%rsp); popfq" ::: "memory", "cc");
    long s = work(n);
    __asm__ volatile("pushfq; andq $~0x100, (%%rsp); popfq" ::: "memory", "cc");
    clock_gettime(CLOCK_MONOTONIC, &b);
    double secs = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    printf("selfstep n %ld steps %ld seconds %.6f rate %.0f result %ld\n", n, steps, secs, steps / secs, s);
    return 0;
}
