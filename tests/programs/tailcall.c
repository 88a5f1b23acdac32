/* tailcall.c - a tail call: tc_mid ends in `jmp tc_inner` (written in assembly, so that it
 * does not depend on the compiler's sibling-call optimisation), and tc_inner calls tc_leaf.
 * callgrind counts the jump as a call of tc_inner from tc_mid; so does itrace. */
#include <stdio.h>

__attribute__((noinline)) long tc_leaf(long x)
{
    long s = 0;
    for (long i = 0; i < x; i++)
        s += i * 3;
    return s;
}

__attribute__((noinline)) long tc_inner(long x)
{
    return tc_leaf(x) + 1;
}

long tc_mid(long x);
__asm__(".text\n"
        ".globl tc_mid\n"
        ".type tc_mid, @function\n"
        "tc_mid:\n"
        "    add $1, %rdi\n"
        "    jmp tc_inner\n"
        ".size tc_mid, .-tc_mid\n");

__attribute__((noinline)) long tc_top(long x)
{
    return tc_mid(x) * 2;
}

int main(void)
{
    long t = 0;
    for (int i = 0; i < 3; i++)
        t += tc_top(10 + i);
    printf("tailcall: %ld\n", t);
    return t == 2 * (3 + 165 + 198 + 234) ? 0 : 1;
}
