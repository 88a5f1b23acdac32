/* threads.c - four pthreads, each doing a fixed computation, joined. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>

#define NTHREADS 4

static long thr_results[NTHREADS];

__attribute__((noinline)) long thr_compute(long seed, int n)
{
    long x = seed;
    for (int i = 0; i < n; i++)
        x = (x * 31 + i) % 1000003;
    return x;
}

__attribute__((noinline)) void *thr_main(void *arg)
{
    long idx = (long)arg;
    char name[16];
    snprintf(name, sizeof name, "worker%ld", idx);
    pthread_setname_np(pthread_self(), name);
    thr_results[idx] = thr_compute(idx + 1, 2000);
    return NULL;
}

int main(void)
{
    pthread_t tids[NTHREADS];
    for (long i = 0; i < NTHREADS; i++)
        if (pthread_create(&tids[i], NULL, thr_main, (void *)i) != 0)
            return 2;
    long total = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(tids[i], NULL);
        total += thr_results[i];
    }
    printf("threads: total=%ld\n", total);
    return 0;
}
