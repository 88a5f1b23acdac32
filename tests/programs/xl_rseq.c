/* xl_rseq.c - rseq under translation (tests/tests/translate.rs).
 *   xl_rseq      glibc 2.36 registers an rseq area for each thread; the program checks that it
 *                is registered, that the kernel keeps its cpu_id (it equals the getcpu system
 *                call's answer, read again if the thread moved between), and that
 *                sched_getcpu() gives a cpu this process may run on. Prints yes/no for each.
 *   xl_rseq cs [ROUNDS]
 *                four threads each add 1 to a per-cpu counter ROUNDS times (300,000) in an rseq critical
 *                section (read cpu_id, load, 300 instructions of delay, no branch, store: the commit). The
 *                kernel aborts a section that is preempted or migrated, and it starts again,
 *                so the counters add up to 4 * ROUNDS. Prints the sum. (Single-stepping cannot run
 *                it: every step stop is a preemption, so every pass aborts.) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/rseq.h>
#include <sys/syscall.h>
#include <unistd.h>

#define XL_THREADS 4
#define XL_CPUS 1024

/* Each thread's sections (the second argument after `cs`). */
static long xl_rounds = 300000;

/* One counter per cpu, 64 bytes apart. */
static long xl_counters[XL_CPUS * 8];

__attribute__((noinline)) void xl_percpu_inc(struct rseq *rs)
{
    __asm__ volatile(".pushsection .data.rel.local, \"aw\"\n\t"
                     ".balign 32\n"
                     "9:\n\t"
                     ".long 0, 0\n\t"
                     ".quad 1f, 2f - 1f, 4f\n\t"
                     ".popsection\n"
                     "0:\n\t"
                     "leaq 9b(%%rip), %%rax\n\t"
                     "movq %%rax, 8(%[rs])\n"
                     "1:\n\t"
                     "movl 4(%[rs]), %%eax\n\t"
                     "shlq $6, %%rax\n\t"
                     "movq (%[c], %%rax), %%rdx\n\t"
                     ".rept 300\n\t"
                     "leal 1(%%rcx), %%ecx\n\t"
                     ".endr\n\t"
                     "addq $1, %%rdx\n\t"
                     "movq %%rdx, (%[c], %%rax)\n"
                     "2:\n\t"
                     "jmp 6f\n\t"
                     ".long 0x53053053\n" /* RSEQ_SIG, glibc's on x86 */
                     "4:\n\t"
                     "jmp 0b\n"
                     "6:\n\t"
                     :
                     : [rs] "r"(rs), [c] "r"(xl_counters)
                     : "rax", "rcx", "rdx", "memory", "cc");
}

static void *xl_cs_thread(void *arg)
{
    (void)arg;
    struct rseq *rs = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
    for (long i = 0; i < xl_rounds; i++)
        xl_percpu_inc(rs);
    return NULL;
}

static int xl_critical_sections(void)
{
    if (__rseq_size == 0)
        return 2;
    pthread_t t[XL_THREADS];
    for (int k = 0; k < XL_THREADS; k++)
        if (pthread_create(&t[k], NULL, xl_cs_thread, NULL) != 0)
            return 3;
    for (int k = 0; k < XL_THREADS; k++)
        pthread_join(t[k], NULL);
    long sum = 0;
    for (int c = 0; c < XL_CPUS; c++)
        sum += xl_counters[c * 8];
    printf("xl_rseq cs: %ld of %ld\n", sum, XL_THREADS * xl_rounds);
    return sum == XL_THREADS * xl_rounds ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "cs") == 0) {
        if (argc > 2)
            xl_rounds = atol(argv[2]);
        return xl_critical_sections();
    }
    int registered = __rseq_size > 0;
    int agree = 0, valid = 0;
    if (registered) {
        struct rseq *rs = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
        for (int tries = 0; tries < 1000 && !agree; tries++) {
            unsigned before = rs->cpu_id, cpu = ~0u;
            syscall(SYS_getcpu, &cpu, NULL, NULL);
            agree = before == cpu && rs->cpu_id == cpu;
        }
    }
    cpu_set_t allowed;
    int cpu = sched_getcpu();
    valid = cpu >= 0 && sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_ISSET(cpu, &allowed);
    printf("rseq registered: %s\n", registered ? "yes" : "no");
    printf("rseq cpu_id is getcpu's: %s\n", agree ? "yes" : "no");
    printf("sched_getcpu valid: %s\n", valid ? "yes" : "no");
    return registered && agree && valid ? 0 : 1;
}
