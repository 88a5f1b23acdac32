/* spinner.c - a target for attach tests.
 *
 *   spinner [ROUNDS [SLEEP_US]]     (defaults: 300 rounds, 10000 us)
 *
 * Prints "spinner: started pid=N", then runs ROUNDS rounds of a fixed
 * computation, each followed by a short nanosleep of SLEEP_US (restarted
 * when interrupted), and prints "spinner: result=<hex>".  The result depends
 * only on ROUNDS, so a run with SLEEP_US = 0 gives the expected line.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) unsigned long spin_round(unsigned long h, int round)
{
    for (int i = 0; i < 2000; i++) {
        h ^= (unsigned long)(round * 2000 + i);
        h *= 0x100000001b3ul;
    }
    return h;
}

static void spin_sleep(long usec)
{
    struct timespec req = { usec / 1000000, (usec % 1000000) * 1000 };
    while (nanosleep(&req, &req) == -1 && errno == EINTR)
        ;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 300;
    long sleep_us = argc > 2 ? atol(argv[2]) : 10000;
    printf("spinner: started pid=%d\n", (int)getpid());
    fflush(stdout);
    unsigned long h = 0xcbf29ce484222325ul;
    for (int r = 0; r < rounds; r++) {
        h = spin_round(h, r);
        if (sleep_us > 0)
            spin_sleep(sleep_us);
    }
    printf("spinner: result=%016lx\n", h);
    fflush(stdout);
    return 0;
}
