/* fib.c - recursion.
 *
 * fib() is plain C.  fib_asm() is the same function written in assembly so
 * that its instruction count has a closed form independent of the compiler:
 *
 *   n < 2  (leaf):      cmp, jl, mov, ret                        = 4
 *   n >= 2 (internal):  cmp, jl, push, push, mov, lea, call, mov,
 *                       lea, call, add, pop, pop, ret            = 14
 *
 * fib_asm(n) makes F(n+1) leaf calls and F(n+1) - 1 internal calls, so its
 * self count is 4 F(n+1) + 14 (F(n+1) - 1) over 2 F(n+1) - 1 calls.
 * main() calls it with n = FIB_N = 15: F(16) = 987,
 *   self = 4 * 987 + 14 * 986 = 17752 instructions, 1973 calls.
 */
#include <stdio.h>

#define FIB_N 15

long fib_asm(long n);
__asm__(
    ".text\n"
    ".globl fib_asm\n"
    ".type fib_asm, @function\n"
    "fib_asm:\n"
    "    cmp $2, %rdi\n"
    "    jl 1f\n"
    "    push %rbx\n"
    "    push %rbp\n"
    "    mov %rdi, %rbx\n"
    "    lea -1(%rdi), %rdi\n"
    "    call fib_asm\n"
    "    mov %rax, %rbp\n"
    "    lea -2(%rbx), %rdi\n"
    "    call fib_asm\n"
    "    add %rbp, %rax\n"
    "    pop %rbp\n"
    "    pop %rbx\n"
    "    ret\n"
    "1:  mov %rdi, %rax\n"
    "    ret\n"
    ".size fib_asm, .-fib_asm\n");

__attribute__((noinline)) long fib(int n)
{
    if (n < 2)
        return n;
    return fib(n - 1) + fib(n - 2);
}

int main(void)
{
    long a = fib(FIB_N);
    long b = fib_asm(FIB_N);
    printf("fib: fib(%d)=%ld fib_asm(%d)=%ld\n", FIB_N, a, FIB_N, b);
    return a == b ? 0 : 1;
}
