/* region_loop.c - a long-running program with a region in each round, for
 * `itrace record --region -p PID`. Prints its pid, runs ROUNDS rounds
 * (untraced work, a region, a short sleep), then a result that depends only
 * on ROUNDS. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "itrace.h"

__attribute__((noinline)) unsigned long rl_untraced(unsigned long h, int r) {
    for (int i = 0; i < 500; i++) h = (h ^ (unsigned long)(r + i)) * 0x100000001b3ul;
    return h;
}

__attribute__((noinline)) unsigned long rl_work(unsigned long h, int r) {
    for (int i = 0; i < 50; i++) h += (unsigned long)(r * i) ^ (h >> 5);
    return h;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    long sleep_us = argc > 2 ? atol(argv[2]) : 10000;
    printf("region_loop: started pid=%d\n", (int)getpid());
    fflush(stdout);
    unsigned long h = 1469598103934665603ul;
    for (int r = 0; r < rounds; r++) {
        h = rl_untraced(h, r);
        ITraceOn();
        h = rl_work(h, r);
        ITraceOff();
        struct timespec ts = {0, sleep_us * 1000};
        while (nanosleep(&ts, &ts) == -1)
            ;
    }
    printf("region_loop: result=%lx\n", h);
    return 0;
}
