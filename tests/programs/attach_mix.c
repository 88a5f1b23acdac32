/* attach_mix.c - a self-checking target for repeated attach/detach (tests/tests/attach_stress.rs).
 *
 *   attach_mix MODE      MODE: busy | churn | signals [TIMER_US] | blocked
 *
 * Prints "attach_mix: started pid=N", then works until its standard input reaches end of
 * file (a line "map ADDR SIZE", hex, on it maps SIZE bytes of anonymous r-x zeros at ADDR with
 * MAP_FIXED and answers "attach_mix: mapped ADDR", 0 if that failed), then prints
 * "attach_mix: MODE items=N errors=E [extra]" and exits with status 0 when E is 0, 3 otherwise.  Every work item checks itself against an independent computation
 * (a closed form, or the same value computed by other code), so a register, flag or stack
 * slot that a tracer disturbs shows as an error, not as a different number.
 *
 *   busy     three threads compute items (calls through function pointers, a switch,
 *            recursion, floating point); the main thread sleeps in read(0).
 *   churn    a thread starts and joins short-lived threads that compute items (then sleep 30 ms),
 *            over and over.
 *   signals  busy, plus an interval timer (SIGALRM; every TIMER_US microseconds, 2000 by
 *            default) whose handler computes an item, and a SIGUSR1 handler that counts; prints
 *            "usr1=N" (signals sent from outside).
 *   blocked  threads blocked in system calls: nanosleep, a futex (condition variable with a
 *            timeout), read and epoll_wait on a pipe a writer feeds in sequence; a system call
 *            failing with EINTR (no handler is installed, so it never may) is an error.
 *
 * Every item also checks that the thread's rseq registration (glibc's) is still in place:
 * the kernel keeps its cpu_id at the CPU the thread runs on, -1 once unregistered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/rseq.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;
static volatile unsigned long items, errors;
static volatile unsigned long usr1;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
/* blocked mode: which call failed (printed after the totals) */
enum { E_SLEEP, E_COND, E_EPOLL, E_READ, E_SEQ, E_WRITE, E_MAIN, E_KINDS };
static volatile unsigned long failed[E_KINDS];
static const char *const failed_names[E_KINDS] = { "nanosleep", "cond", "epoll_wait", "read", "sequence", "write", "main_read" };

static void failure(int kind)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    fprintf(stderr, "attach_mix: %s failed (errno %d) at %ld.%09ld\n", failed_names[kind], errno, (long)now.tv_sec, now.tv_nsec);
    pthread_mutex_lock(&count_lock);
    failed[kind]++;
    errors++;
    pthread_mutex_unlock(&count_lock);
}

static void count(unsigned long n, unsigned long bad)
{
    pthread_mutex_lock(&count_lock);
    items += n;
    errors += bad;
    pthread_mutex_unlock(&count_lock);
}

typedef uint64_t (*step_fn)(uint64_t, uint64_t);
__attribute__((noinline)) static uint64_t sq(uint64_t acc, uint64_t k) { return acc + k * k; }
__attribute__((noinline)) static uint64_t cube(uint64_t acc, uint64_t k) { return acc + k * k * k; }
__attribute__((noinline)) static uint64_t lin(uint64_t acc, uint64_t k) { return acc + k; }

__attribute__((noinline)) static uint64_t fib(unsigned n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

/* The thread's rseq area is registered (when glibc registered one: __rseq_size > 0). */
static int rseq_lost(void)
{
    if (__rseq_size == 0)
        return 0;
    struct rseq *rs = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
    return (int)__atomic_load_n(&rs->cpu_id, __ATOMIC_RELAXED) < 0;
}

/* One item: sums through function pointers chosen by a switch, recursion and floating point,
 * each checked against its closed form.  Returns 1 when something is wrong. */
__attribute__((noinline)) static int item(uint64_t seed)
{
    static const step_fn steps[3] = { lin, sq, cube };
    uint64_t n = 50 + seed % 200, which = seed % 3, acc = 0, want = 0;
    step_fn f = steps[which];
    for (uint64_t k = 1; k <= n; k++)
        acc = f(acc, k);
    switch (which) {
    case 0: want = n * (n + 1) / 2; break;
    case 1: want = n * (n + 1) * (2 * n + 1) / 6; break;
    default: want = (n * (n + 1) / 2) * (n * (n + 1) / 2); break;
    }
    int bad = acc != want;
    /* fib(20) = 6765 */
    bad |= fib(20 - (unsigned)(seed & 1)) != ((seed & 1) ? 4181u : 6765u);
    double x = 0;
    for (uint64_t k = 1; k <= n; k++)
        x += (double)k;
    bad |= x != (double)(n * (n + 1) / 2);
    bad |= rseq_lost();
    return bad;
}

static void *worker(void *arg)
{
    uint64_t seed = (uintptr_t)arg * 7919;
    while (!stop) {
        unsigned long bad = 0;
        for (int i = 0; i < 64; i++)
            bad += item(seed++);
        count(64, bad);
    }
    return NULL;
}

static void *short_lived(void *arg)
{
    uint64_t seed = (uintptr_t)arg;
    unsigned long bad = 0;
    for (int i = 0; i < 16; i++)
        bad += item(seed + i);
    count(16, bad);
    /* linger, so that threads made while itrace is attached are still there at its detach */
    struct timespec req = { 0, 30 * 1000 * 1000 };
    nanosleep(&req, NULL);
    return NULL;
}

static void *spawner(void *arg)
{
    (void)arg;
    for (uintptr_t round = 0; !stop; round++) {
        pthread_t t[3];
        int started = 0;
        for (int i = 0; i < 3; i++)
            if (pthread_create(&t[i], NULL, short_lived, (void *)(round * 3 + i)) == 0)
                started++;
            else
                count(0, 1);
        for (int i = 0; i < started; i++)
            pthread_join(t[i], NULL);
    }
    return NULL;
}

static void on_alarm(int sig)
{
    (void)sig;
    int saved = errno;
    static uint64_t seed = 11;
    unsigned long bad = item(seed++);
    /* the handler runs on whatever thread; items and errors are updated without the lock
     * (a handler may not take it), so only errors is trusted: it is 0 unless something broke */
    if (bad)
        errors += bad;
    errno = saved;
}

static void on_usr1(int sig)
{
    (void)sig;
    usr1++;
}

/* blocked mode */
static int pipefd[2];
static pthread_mutex_t cv_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void *sleeper(void *arg)
{
    (void)arg;
    while (!stop) {
        struct timespec req = { 0, 20 * 1000 * 1000 };
        if (nanosleep(&req, NULL) != 0)
            failure(E_SLEEP); /* EINTR with no handler: never untraced */
        count(1, 0);
    }
    return NULL;
}

static void *waiter(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&cv_lock);
    while (!stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 30 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        int r = pthread_cond_timedwait(&cv, &cv_lock, &until);
        if (r != 0 && r != ETIMEDOUT)
            failure(E_COND);
        else
            count(1, 0);
    }
    pthread_mutex_unlock(&cv_lock);
    return NULL;
}

static void *writer(void *arg)
{
    (void)arg;
    for (uint64_t seq = 0; !stop; seq++) {
        if (write(pipefd[1], &seq, sizeof seq) != sizeof seq)
            failure(E_WRITE);
        struct timespec req = { 0, 5 * 1000 * 1000 };
        nanosleep(&req, NULL);
        pthread_mutex_lock(&cv_lock);
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&cv_lock);
    }
    uint64_t end = UINT64_MAX;
    if (write(pipefd[1], &end, sizeof end) != sizeof end)
        count(0, 1);
    return NULL;
}

/* Reads the writer's numbers through epoll_wait and read: they must come in sequence. */
static void *reader(void *arg)
{
    (void)arg;
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = pipefd[0] };
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, pipefd[0], &ev) != 0) {
        count(0, 1);
        return NULL;
    }
    for (uint64_t want = 0;;) {
        struct epoll_event got;
        int n = epoll_wait(ep, &got, 1, 1000);
        if (n < 0) {
            failure(E_EPOLL);
            continue;
        }
        if (n == 0)
            continue;
        uint64_t seq;
        ssize_t r = read(pipefd[0], &seq, sizeof seq);
        if (r != sizeof seq) {
            failure(E_READ);
            break;
        }
        if (seq == UINT64_MAX)
            break;
        if (seq != want)
            failure(E_SEQ);
        count(1, 0);
        want = seq + 1;
    }
    close(ep);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "busy";
    pthread_t t[8];
    int n = 0;
    char extra[64] = "";
    if (!strcmp(mode, "busy") || !strcmp(mode, "signals")) {
        if (!strcmp(mode, "signals")) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_flags = SA_RESTART;
            sa.sa_handler = on_alarm;
            sigaction(SIGALRM, &sa, NULL);
            sa.sa_handler = on_usr1;
            sigaction(SIGUSR1, &sa, NULL);
            long us = argc > 2 ? atol(argv[2]) : 2000;
            if (us < 1 || us > 999999) {
                fprintf(stderr, "attach_mix: timer interval %s not in 1..999999 us\n", argv[2]);
                return 2;
            }
            struct itimerval it = { { 0, us }, { 0, us } };
            setitimer(ITIMER_REAL, &it, NULL);
        }
        for (uintptr_t i = 0; i < 3; i++)
            pthread_create(&t[n++], NULL, worker, (void *)(i + 1));
    } else if (!strcmp(mode, "churn")) {
        pthread_create(&t[n++], NULL, spawner, NULL);
    } else if (!strcmp(mode, "blocked")) {
        if (pipe(pipefd) != 0)
            return 2;
        pthread_create(&t[n++], NULL, sleeper, NULL);
        pthread_create(&t[n++], NULL, waiter, NULL);
        pthread_create(&t[n++], NULL, reader, NULL);
        pthread_create(&t[n++], NULL, writer, NULL);
    } else {
        fprintf(stderr, "attach_mix: unknown mode %s\n", mode);
        return 2;
    }
    printf("attach_mix: started pid=%d\n", (int)getpid());
    fflush(stdout);
    char buf[64];
    for (;;) {
        ssize_t r = read(0, buf, sizeof buf);
        if (r == 0)
            break;
        if (r < 0 && errno != EINTR) {
            errors++;
            break;
        }
        if (r < 0 && strcmp(mode, "signals"))
            failure(E_MAIN); /* EINTR without a handler */
        unsigned long at, size;
        if (r > 0 && r < (ssize_t)sizeof buf) {
            buf[r] = 0;
            if (sscanf(buf, "map %lx %lx", &at, &size) == 2) {
                /* A mapping of the program's own over [at, at + size): anonymous, r-x, zeros. */
                void *p = mmap((void *)at, size, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
                printf("attach_mix: mapped %lx\n", p == MAP_FAILED ? 0ul : (unsigned long)p);
                fflush(stdout);
            }
        }
    }
    if (!strcmp(mode, "signals")) {
        struct itimerval off = { { 0, 0 }, { 0, 0 } };
        setitimer(ITIMER_REAL, &off, NULL);
        snprintf(extra, sizeof extra, " usr1=%lu", usr1);
    }
    stop = 1;
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    for (int k = 0; k < E_KINDS; k++)
        if (failed[k])
            fprintf(stderr, "attach_mix: %lu failed %s\n", failed[k], failed_names[k]);
    printf("attach_mix: %s items=%lu errors=%lu%s\n", mode, items, errors, extra);
    fflush(stdout);
    return errors ? 3 : 0;
}
