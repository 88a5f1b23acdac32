/* xl_kill.c - a target for kill -9 of an attached itrace --backend translate
 * (tests/tests/translate_kill.rs).
 *
 *   xl_kill THREADS ROUNDS SLEEP_US
 *
 * Prints "xl_kill: started pid=N". THREADS workers each run ROUNDS rounds of a checksum made
 * through a table of function pointers (indirect calls and returns, a jump table), with a
 * nanosleep of SLEEP_US after each round for as long as stdin has not been closed: one more
 * thread waits in read(0) for that, blocked in a system call the whole time. Then main prints
 * each worker's checksum and exits 0. The output depends only on THREADS and ROUNDS, so a run
 * with stdin at EOF gives the expected lines. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 8

typedef unsigned long (*xl_op)(unsigned long, unsigned long);

__attribute__((noinline)) static unsigned long xl_add(unsigned long x, unsigned long i) { return x + i * 0x9e3779b9ul; }
__attribute__((noinline)) static unsigned long xl_xor(unsigned long x, unsigned long i) { return x ^ (x >> 7) ^ i; }
__attribute__((noinline)) static unsigned long xl_mul(unsigned long x, unsigned long i) { return x * 0x100000001b3ul + i; }
__attribute__((noinline)) static unsigned long xl_rot(unsigned long x, unsigned long i)
{
    switch ((x ^ i) & 7) {
    case 0: return (x << 13) | (x >> 51);
    case 1: return (x << 7) | (x >> 57);
    case 2: return x + 0x1234567ul;
    case 3: return ~x;
    case 4: return x - i;
    case 5: return x ^ 0xdeadbeeful;
    case 6: return (x >> 3) | (x << 61);
    default: return x * 3;
    }
}

static xl_op xl_ops[4] = { xl_add, xl_xor, xl_mul, xl_rot };

static volatile int xl_slow = 1;
static long xl_rounds;
static long xl_sleep_us;
static unsigned long xl_sums[MAX_THREADS];

__attribute__((noinline)) static unsigned long xl_round(unsigned long x, long round)
{
    for (unsigned long i = 0; i < 300; i++)
        x = xl_ops[(x >> 11) & 3](x, i + (unsigned long)round);
    return x;
}

static void xl_nap(void)
{
    struct timespec req = { xl_sleep_us / 1000000, (xl_sleep_us % 1000000) * 1000 };
    while (nanosleep(&req, &req) == -1 && errno == EINTR)
        ;
}

static void *xl_worker(void *arg)
{
    long k = (long)arg;
    unsigned long x = 0xcbf29ce484222325ul + (unsigned long)k;
    for (long r = 0; r < xl_rounds; r++) {
        x = xl_round(x, r);
        if (xl_slow && xl_sleep_us > 0)
            xl_nap();
    }
    xl_sums[k] = x;
    return NULL;
}

static void *xl_reader(void *arg)
{
    (void)arg;
    char buf[64];
    /* Blocked here until stdin is closed (EINTR from an attach is restarted by the kernel). */
    while (read(0, buf, sizeof buf) != 0)
        ;
    xl_slow = 0;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    int threads = atoi(argv[1]);
    xl_rounds = atol(argv[2]);
    xl_sleep_us = atol(argv[3]);
    if (threads < 1 || threads > MAX_THREADS)
        return 2;
    printf("xl_kill: started pid=%d\n", (int)getpid());
    fflush(stdout);
    pthread_t reader, workers[MAX_THREADS];
    if (pthread_create(&reader, NULL, xl_reader, NULL) != 0)
        return 3;
    for (long k = 0; k < threads; k++)
        if (pthread_create(&workers[k], NULL, xl_worker, (void *)k) != 0)
            return 3;
    for (int k = 0; k < threads; k++)
        pthread_join(workers[k], NULL);
    pthread_join(reader, NULL);
    for (int k = 0; k < threads; k++)
        printf("xl_kill: thread %d sum=%016lx\n", k, xl_sums[k]);
    return 0;
}
