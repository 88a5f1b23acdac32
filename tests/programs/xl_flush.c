/* xl_flush.c - more code than a tiny code cache holds (tests/tests/translate.rs, the flush of
 * a full cache). 300 functions, each a switch (a jump table at -O1) and a short loop, called
 * through a table of pointers in an order that visits every one. `xl_flush` walks them in the
 * main thread; `xl_flush threads` in two threads at once, each in its own order, so that one
 * fills the cache while the other runs in it. Each thread does fixed work and ends as in
 * xl_threads.c (a byte to a pipe, then pause), so its instructions do not depend on timing. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define XF(n)                                                                                      \
    __attribute__((noinline)) static long xf_##n(long x)                                           \
    {                                                                                              \
        switch ((x ^ n) & 7) {                                                                     \
        case 0: x = x * 3 + n; break;                                                              \
        case 1: x ^= (long)n << 3; break;                                                          \
        case 2: x += n * 7; break;                                                                 \
        case 3: x = (x >> 1) + n; break;                                                           \
        case 4: x -= n; break;                                                                     \
        case 5: x = x * 5 - n; break;                                                              \
        case 6: x = ~x + n; break;                                                                 \
        default: x += 1;                                                                           \
        }                                                                                          \
        for (int i = 0; i < (n & 3) + 1; i++)                                                      \
            x = x * 31 + i;                                                                        \
        return x & 0xffffffffffffL;                                                                \
    }
#define XT(n) xf_##n,
#define X10(M, a) M(a##0) M(a##1) M(a##2) M(a##3) M(a##4) M(a##5) M(a##6) M(a##7) M(a##8) M(a##9)
#define X100(M, a)                                                                                 \
    X10(M, a##0) X10(M, a##1) X10(M, a##2) X10(M, a##3) X10(M, a##4) X10(M, a##5) X10(M, a##6)     \
        X10(M, a##7) X10(M, a##8) X10(M, a##9)

X100(XF, 1)
X100(XF, 2)
X100(XF, 3)

static long (*const xf_table[])(long) = {X100(XT, 1) X100(XT, 2) X100(XT, 3)};
#define XF_COUNT ((int)(sizeof xf_table / sizeof xf_table[0]))

/* Every function, `rounds` times, in the order of `stride` (prime to XF_COUNT). */
__attribute__((noinline)) static long xf_walk(long x, int stride, int rounds)
{
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < XF_COUNT; i++)
            x = xf_table[(i * stride + r) % XF_COUNT](x);
    return x;
}

static long xf_results[2];
static int xf_done[2];

static void *xf_thread(void *arg)
{
    long k = (long)arg;
    xf_results[k] = xf_walk(k + 1, k ? 11 : 7, 2);
    char c = 1;
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_write), "D"(xf_done[1]), "S"(&c), "d"(1L) : "rcx", "r11", "memory");
    for (;;)
        __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_pause) : "rcx", "r11", "memory");
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "threads") != 0) {
        printf("xl_flush: %ld\n", xf_walk(1, 7, 2));
        return 0;
    }
    pthread_t t[2];
    char c;
    if (pipe(xf_done) != 0)
        return 4;
    for (long k = 0; k < 2; k++)
        if (pthread_create(&t[k], NULL, xf_thread, (void *)k) != 0)
            return 2;
    for (int k = 0; k < 2; k++)
        if (read(xf_done[0], &c, 1) != 1)
            return 5;
    printf("xl_flush threads: %ld %ld\n", xf_results[0], xf_results[1]);
    fflush(stdout);
    _exit(0);
}
