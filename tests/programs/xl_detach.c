/* xl_detach.c - a target for detaching the translating recorder (tests/tests/attach.rs,
 * `a_detach_leaves_every_register_as_the_program_keeps_it`).
 *
 *   xl_detach THREADS
 *
 * Prints "xl_detach: started pid=N" once every worker runs. Each worker runs a loop in
 * assembly that keeps rax, rcx, rdx and r11 live across an indirect jump, a direct call, a
 * return and a conditional branch (the registers a trap of the code cache spills, and the two
 * a record stub spills), and checks at the top of each round that each still holds what the
 * round counter in r8 says it must: rax = 3*r8 + 0x5a5a, rcx = r8 ^ 0x3c3c, rdx = ~r8,
 * r11 = r8 + 0x777. A mismatch counts an error and the registers are set again from r8. No
 * system call in the loop: a detach finds the workers in the cache, most of them waiting at
 * a full ring's trap. When stdin reaches end of file the workers stop, and main prints
 * "xl_detach: threads=N errors=E" and exits 0 (1 if any error). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 16

/* rdi = &stop (int), rsi = &errors (unsigned long), rdx = &rounds (unsigned long). */
void xl_detach_loop(volatile int *stop, unsigned long *errors, unsigned long *rounds);

__asm__(".text\n"
        ".globl xl_detach_loop\n"
        ".type xl_detach_loop, @function\n"
        "xl_detach_loop:\n"
        "    push %r12\n"
        "    push %r15\n"
        "    mov %rdx, %r15\n"
        "    lea xl_detach_after_jump(%rip), %r12\n"
        "    xor %r8d, %r8d\n"
        "xl_detach_reset:\n"
        "    lea (%r8,%r8,2), %rax\n"
        "    lea 0x5a5a(%rax), %rax\n"
        "    mov %r8, %rcx\n"
        "    xor $0x3c3c, %rcx\n"
        "    mov %r8, %rdx\n"
        "    not %rdx\n"
        "    lea 0x777(%r8), %r11\n"
        "xl_detach_top:\n"
        "    lea (%r8,%r8,2), %r9\n"
        "    lea 0x5a5a(%r9), %r9\n"
        "    cmp %r9, %rax\n"
        "    jne xl_detach_bad\n"
        "    mov %r8, %r9\n"
        "    xor $0x3c3c, %r9\n"
        "    cmp %r9, %rcx\n"
        "    jne xl_detach_bad\n"
        "    mov %r8, %r9\n"
        "    not %r9\n"
        "    cmp %r9, %rdx\n"
        "    jne xl_detach_bad\n"
        "    lea 0x777(%r8), %r9\n"
        "    cmp %r9, %r11\n"
        "    jne xl_detach_bad\n"
        "xl_detach_next:\n"
        "    inc %r8\n"
        "    lea 3(%rax), %rax\n"
        "    mov %r8, %rcx\n"
        "    xor $0x3c3c, %rcx\n"
        "    call xl_detach_set_rdx\n"
        "    jmp *%r12\n"
        "xl_detach_after_jump:\n"
        "    lea 1(%r11), %r11\n"
        "    test $1, %r8b\n"
        "    jnz xl_detach_odd\n"
        "    nop\n"
        "xl_detach_odd:\n"
        "    incq (%r15)\n"
        "    cmpl $0, (%rdi)\n"
        "    je xl_detach_top\n"
        "    pop %r15\n"
        "    pop %r12\n"
        "    ret\n"
        "xl_detach_bad:\n"
        "    incq (%rsi)\n"
        "    jmp xl_detach_reset\n"
        "xl_detach_set_rdx:\n"
        "    mov %r8, %rdx\n"
        "    not %rdx\n"
        "    ret\n"
        ".size xl_detach_loop, .-xl_detach_loop\n");

static volatile int xl_stop;
static volatile int xl_running;
static unsigned long xl_errors[MAX_THREADS];
static unsigned long xl_rounds[MAX_THREADS];

static void *worker(void *arg)
{
    long n = (long)arg;
    __atomic_add_fetch(&xl_running, 1, __ATOMIC_SEQ_CST);
    xl_detach_loop(&xl_stop, &xl_errors[n], &xl_rounds[n]);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "usage: xl_detach THREADS (1 to %d)\n", MAX_THREADS);
        return 2;
    }
    pthread_t t[MAX_THREADS];
    for (long i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    while (__atomic_load_n(&xl_running, __ATOMIC_SEQ_CST) < threads)
        usleep(1000);
    printf("xl_detach: started pid=%d\n", (int)getpid());
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0)
        ;
    xl_stop = 1;
    unsigned long errors = 0, rounds = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        errors += xl_errors[i];
        rounds += xl_rounds[i];
    }
    printf("xl_detach: threads=%d errors=%lu\n", threads, errors);
    return errors != 0 || rounds == 0;
}
