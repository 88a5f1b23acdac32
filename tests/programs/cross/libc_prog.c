/* A small glibc program for the cross-architecture tests (built -static -O1 -g
 * for each architecture): recursion, a call through a function pointer,
 * malloc (whose locks use lwarx/stwcx. on PowerPC) and printf. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__attribute__((noinline)) int twice(int x) { return 2 * x; }
__attribute__((noinline)) int thrice(int x) { return 3 * x; }

int (*volatile pick[2])(int) = {twice, thrice};

__attribute__((noinline)) int sum_list(int n) {
    int *v = malloc(n * sizeof *v);
    if (!v)
        return -1;
    for (int i = 0; i < n; i++)
        v[i] = pick[i & 1](i);
    int s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    free(v);
    return s;
}

int main(void) {
    int f = fib(10);
    int s = sum_list(8);
    printf("fib %d sum %d\n", f, s);
    return 0;
}
