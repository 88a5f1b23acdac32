/*
 * attach_busy: the target of bench/attach.py (issue 29): THREADS threads that compute until
 * standard input reaches end of file, then print their checksum.
 *
 * Usage: attach_busy THREADS
 * Prints "attach_busy: started pid=N" once every thread runs.  Each thread runs a mix of
 * calls, data-dependent branches, a short loop and a small recursion (as bench/workload.c),
 * no system call in its loop.  Build: gcc -O1 -pthread.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define NOIPA __attribute__((noipa))

static volatile int stop;
static volatile int running;

NOIPA static unsigned long lcg(unsigned long x) { return x * 6364136223846793005UL + 1442695040888963407UL; }

NOIPA static unsigned long fold(unsigned long x, unsigned depth)
{
    return depth == 0 ? x ^ (x >> 29) : fold(x + depth, depth - 1) * 3;
}

NOIPA static unsigned long step(unsigned long x, unsigned long i)
{
    unsigned long h = lcg(x ^ i);
    for (int k = 0; k < 4; k++)
        h = (h & 1) ? h * 3 + k : h >> 1;
    if ((h & 7) == 3)
        h = fold(h, 3);
    return h;
}

static void *worker(void *arg)
{
    unsigned long x = (unsigned long)(size_t)arg, i = 0;
    __atomic_add_fetch(&running, 1, __ATOMIC_SEQ_CST);
    while (!stop)
        x = step(x, i++);
    return (void *)(size_t)x;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    if (n < 1 || n > 64)
        return 2;
    pthread_t t[64];
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, worker, (void *)(size_t)(i + 1));
    while (__atomic_load_n(&running, __ATOMIC_SEQ_CST) < n)
        usleep(1000);
    printf("attach_busy: started pid=%d\n", (int)getpid());
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0)
        ;
    stop = 1;
    unsigned long sum = 0;
    for (int i = 0; i < n; i++) {
        void *r;
        pthread_join(t[i], &r);
        sum += (unsigned long)(size_t)r;
    }
    printf("attach_busy: done %lx\n", sum);
    return 0;
}
