/* xl_segv.c - SIGSEGV handlers and the pc in their ucontext (tests/tests/translate.rs).
 * Fault 1: a load from address 8 at the global label xl_fault_load; the handler checks that
 * uc_mcontext's RIP is that label's address, and jumps back to main with siglongjmp.
 * Fault 2: a store to address 16 at xl_fault_skip, 7 bytes (movl $imm,abs); the handler
 * moves RIP past it (to xl_after_skip) and returns, so the next instruction runs: the result
 * printed is 5 + 1000 + 2 (the store skipped). It prints what it saw; exit 0 if all matched. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <ucontext.h>

extern char xl_fault_load[], xl_fault_skip[], xl_after_skip[];

static sigjmp_buf xl_back;
static volatile int xl_mode, xl_rip_ok, xl_skips;

__attribute__((noinline)) void xl_segv_handler(int sig, siginfo_t *si, void *ctx)
{
    ucontext_t *uc = ctx;
    unsigned long rip = uc->uc_mcontext.gregs[REG_RIP];
    (void)sig;
    if (xl_mode == 1) {
        xl_rip_ok = rip == (unsigned long)xl_fault_load && si->si_addr == (void *)8;
        siglongjmp(xl_back, 1);
    }
    if (rip == (unsigned long)xl_fault_skip) {
        uc->uc_mcontext.gregs[REG_RIP] = (unsigned long)xl_after_skip;
        xl_skips++;
    }
}

__attribute__((noinline)) long xl_load_fault(void)
{
    long v;
    __asm__ volatile("movl $8, %%eax\n\t"
                     ".globl xl_fault_load\n"
                     "xl_fault_load:\n\t"
                     "movq (%%rax), %0\n\t"
                     : "=r"(v)
                     :
                     : "rax", "memory");
    return v;
}

__attribute__((noinline)) long xl_skip_fault(long x)
{
    __asm__ volatile("addq $1000, %0\n\t"
                     ".globl xl_fault_skip\n"
                     "xl_fault_skip:\n\t"
                     "movl $1, 0x10\n\t"
                     ".globl xl_after_skip\n"
                     "xl_after_skip:\n\t"
                     "addq $2, %0\n\t"
                     : "+r"(x)
                     :
                     : "memory");
    return x;
}

int main(void)
{
    static struct sigaction sa;
    sa.sa_sigaction = xl_segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL) != 0)
        return 2;
    xl_mode = 1;
    if (sigsetjmp(xl_back, 1) == 0)
        xl_load_fault();
    printf("fault rip is xl_fault_load: %s\n", xl_rip_ok ? "yes" : "no");
    xl_mode = 2;
    long r = xl_skip_fault(5);
    printf("after the skipped store: %ld, skips %d\n", r, xl_skips);
    return xl_rip_ok && r == 1007 && xl_skips == 1 ? 0 : 1;
}
