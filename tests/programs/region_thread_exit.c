/* region_thread_exit.c - a thread exits inside its region (no ITraceOff):
 * its region ends with it; the main thread goes on untraced. */
#include <pthread.h>
#include <stdio.h>
#include "itrace.h"

__attribute__((noinline)) long rte_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s ^= i + (s << 1);
    return s;
}

static void *thread_main(void *arg) {
    ITraceOn();
    long w = rte_work((long)arg);
    pthread_exit((void *)w);
}

int main(void) {
    pthread_t t;
    pthread_create(&t, 0, thread_main, (void *)40);
    void *r;
    pthread_join(t, &r);
    printf("region_thread_exit: %ld %ld\n", (long)r, rte_work(5));
    return 0;
}
