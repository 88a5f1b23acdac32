/* longjmp.c - setjmp/longjmp out of a recursion. */
#include <setjmp.h>
#include <stdio.h>

static jmp_buf lj_env;
static volatile long lj_sink;

__attribute__((noinline)) void lj_dive(int depth)
{
    if (depth < 0)
        return;
    if (depth == 0)
        longjmp(lj_env, 7);
    lj_dive(depth - 1);
    lj_sink += depth; /* never reached: keeps the recursion a real call */
}

__attribute__((noinline)) int lj_round(int depth)
{
    volatile int result = 0;
    if (setjmp(lj_env) == 0) {
        result = 1;
        lj_dive(depth);
        result = 2; /* never reached */
    } else {
        result += 10 + depth;
    }
    return result;
}

int main(void)
{
    int total = 0;
    for (int i = 0; i < 5; i++)
        total += lj_round(8 + i);
    printf("longjmp: total=%d sink=%ld\n", total, lj_sink);
    return total == 5 * 11 + 8 + 9 + 10 + 11 + 12 ? 0 : 1;
}
