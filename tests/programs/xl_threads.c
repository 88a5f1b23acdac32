/* xl_threads.c - threads made by clone3 (glibc 2.36's pthread_create) and by a raw clone
 * (glibc's clone(), the clone system call) (tests/tests/translate.rs). Each thread runs a fixed
 * computation, writes a byte to a pipe and waits in pause() for the end; main reads one byte per
 * thread (a blocking read takes the same instructions whether it waits or not: a join, or a
 * futex loop, would spin a number of times that depends on timing), prints each result and
 * exits, which ends the threads. The raw clone thread uses no libc (it shares main's TLS). */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline)) long xl_thread_work(long seed, int n)
{
    long x = seed;
    for (int i = 0; i < n; i++)
        x = (x * 1103515245 + 12345) & 0x7fffffff;
    return x;
}

static long xl_results[3];
static int xl_done[2];

/* Say this thread is done, and wait for the end (raw system calls: no libc, for the clone thread). */
static void xl_finish(void)
{
    char c = 1;
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_write), "D"(xl_done[1]), "S"(&c), "d"(1L) : "rcx", "r11", "memory");
    for (;;)
        __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_pause) : "rcx", "r11", "memory");
}

static void *xl_pthread_main(void *arg)
{
    long k = (long)arg;
    xl_results[k] = xl_thread_work(k + 1, 2000);
    xl_finish();
    return NULL;
}

static char xl_clone_stack[64 * 1024] __attribute__((aligned(16)));

static int xl_clone_main(void *arg)
{
    (void)arg;
    xl_results[2] = xl_thread_work(3, 2000);
    xl_finish();
    return 0;
}

int main(void)
{
    pthread_t t[2];
    char c;
    if (pipe(xl_done) != 0)
        return 4;
    for (long k = 0; k < 2; k++)
        if (pthread_create(&t[k], NULL, xl_pthread_main, (void *)k) != 0)
            return 2;
    int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
    if (clone(xl_clone_main, xl_clone_stack + sizeof xl_clone_stack, flags, NULL) == -1)
        return 3;
    for (int k = 0; k < 3; k++)
        if (read(xl_done[0], &c, 1) != 1)
            return 5;
    for (int k = 0; k < 3; k++)
        printf("thread %d: %ld\n", k, xl_results[k]);
    fflush(stdout);
    _exit(0);
}
