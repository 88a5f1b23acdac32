/* region_threads.c - two threads trace a region each at the same time;
 * the main thread traces nothing. */
#include <pthread.h>
#include <stdio.h>
#include "itrace.h"

__attribute__((noinline)) long rt_untraced(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i * i;
    return s;
}

__attribute__((noinline)) long rt_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s = (s << 1) ^ i;
    return s;
}

static void *thread_main(void *arg) {
    long n = (long)arg;
    long u = rt_untraced(n);
    ITraceOn();
    long w = rt_work(n);
    ITraceOff();
    return (void *)(u + w);
}

int main(void) {
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, thread_main, (void *)(100 + 50 * i));
    long s = rt_untraced(10);
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        s += (long)r;
    }
    printf("region_threads: %ld\n", s);
    return 0;
}
