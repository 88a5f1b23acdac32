/* funcptr.c - calls through function pointers (a table of operations and a
 * callback passed to a higher-order function). */
#include <stdio.h>

typedef long (*op_fn)(long, long);

__attribute__((noinline)) long fp_add(long a, long b) { return a + b; }
__attribute__((noinline)) long fp_sub(long a, long b) { return a - b; }
__attribute__((noinline)) long fp_mul(long a, long b) { return a * b; }
__attribute__((noinline)) long fp_xor(long a, long b) { return a ^ b; }

static op_fn volatile ops[4] = { fp_add, fp_sub, fp_mul, fp_xor };

__attribute__((noinline)) long fp_fold(op_fn fn, long init, int n)
{
    long acc = init;
    for (int i = 1; i <= n; i++)
        acc = fn(acc, i);
    return acc;
}

int main(void)
{
    long acc = 1;
    for (int i = 0; i < 200; i++)
        acc = ops[i % 4](acc, i + 3) & 0xffffff;
    long folded = fp_fold(fp_add, 0, 50) + fp_fold(ops[3], 7, 20);
    printf("funcptr: acc=%ld folded=%ld\n", acc, folded);
    return 0;
}
