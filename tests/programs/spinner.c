/* spinner.c - a target for attach tests.
 *
 *   spinner [ROUNDS [SLEEP_US]]     (defaults: 300 rounds, 10000 us)
 *
 * Prints "spinner: started pid=N", then runs ROUNDS rounds of a fixed
 * computation, each followed by a short nanosleep of SLEEP_US (restarted
 * when interrupted), and prints "spinner: result=<hex>".  The result depends
 * only on ROUNDS, so a run with SLEEP_US = 0 gives the expected line.
 *
 * SIGUSR2 (tests/tests/attach.rs sends it once itrace has let the spinner go, having seen
 * what it waited for) hurries it: the rounds left run as before, each nanosleep still called,
 * for 0 ns, so the same code runs as many times, but the program ends without waiting out
 * seconds of sleeps.
 */
#include <errno.h>
#include <signal.h>
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

static volatile sig_atomic_t hurry;

static void on_usr2(int sig)
{
    (void)sig;
    hurry = 1;
}

static void spin_sleep(long usec)
{
    struct timespec req = { usec / 1000000, (usec % 1000000) * 1000 };
    const struct timespec none = { 0, 0 };
    if (hurry)
        req = none;
    while (nanosleep(&req, &req) == -1 && errno == EINTR)
        if (hurry)
            req = none;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 300;
    long sleep_us = argc > 2 ? atol(argv[2]) : 10000;
    /* signal(), not a zeroed struct sigaction: that is a rep stos in main, whose count itrace
     * and callgrind give differently (tests/tests/oracles.rs keeps such instructions out) */
    signal(SIGUSR2, on_usr2);
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
