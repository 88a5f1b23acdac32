/* xl_threads.c - threads made by clone3 (glibc 2.36's pthread_create) and by a raw clone
 * (glibc's clone(), the clone system call) (tests/tests/translate.rs). Each thread runs a fixed
 * computation; main joins them in order and prints each result. The raw clone thread uses no
 * libc (it shares main's TLS) and leaves with the exit system call. */
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

static void *xl_pthread_main(void *arg)
{
    long k = (long)arg;
    xl_results[k] = xl_thread_work(k + 1, 2000);
    return NULL;
}

static volatile pid_t xl_clone_tid = 1;
static char xl_clone_stack[64 * 1024] __attribute__((aligned(16)));

static int xl_clone_main(void *arg)
{
    (void)arg;
    xl_results[2] = xl_thread_work(3, 2000);
    /* No libc after this: the thread shares main's TLS. */
    __asm__ volatile("syscall" : : "a"(SYS_exit), "D"(0) : "rcx", "r11", "memory");
    return 0;
}

int main(void)
{
    pthread_t t[2];
    for (long k = 0; k < 2; k++)
        if (pthread_create(&t[k], NULL, xl_pthread_main, (void *)k) != 0)
            return 2;
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM
        | CLONE_CHILD_CLEARTID;
    if (clone(xl_clone_main, xl_clone_stack + sizeof xl_clone_stack, flags, NULL, NULL, NULL,
              (pid_t *)&xl_clone_tid) == -1)
        return 3;
    /* The kernel clears xl_clone_tid and wakes this futex when the thread has exited. */
    while (xl_clone_tid != 0)
        syscall(SYS_futex, &xl_clone_tid, FUTEX_WAIT, xl_clone_tid, NULL, NULL, 0);
    for (int k = 0; k < 3; k++)
        printf("thread %d: %ld\n", k, xl_results[k]);
    return 0;
}
