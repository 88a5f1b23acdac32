/* Calibration: two threads calling the same small functions. main is not profiled: the
 * in-process recorder ends a thread's tracing where glibc blocks every signal (pthread_create
 * does), so a profiled thread must not create threads. */
#include <pthread.h>
__attribute__((noinline)) int work(int x) { return x * 3 + 1; }
__attribute__((noinline)) int step2(int x) { return work(x) + work(x + 1); }

static void *thread_main(void *arg) {
    long s = (long)arg;
    for (int i = 0; i < 150; i++)
        s += step2(i);
    return (void *)s;
}

__attribute__((no_instrument_function)) int main(void) {
    pthread_t a, b;
    pthread_create(&a, 0, thread_main, 0);
    pthread_create(&b, 0, thread_main, 0);
    pthread_join(a, 0);
    pthread_join(b, 0);
    return 0;
}
