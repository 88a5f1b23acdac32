/* loops.c - plain loops (counted, nested, data-dependent while loop).
 * Deterministic: no input, no addresses, no time. */
#include <stdio.h>

#define N 64

static int data[N];

__attribute__((noinline)) void loops_fill(int *a, int n, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        a[i] = (int)((seed >> 8) & 0xff);
    }
}

__attribute__((noinline)) long loops_sum(const int *a, int n)
{
    long total = 0;
    for (int i = 0; i < n; i++)
        total += a[i];
    return total;
}

__attribute__((noinline)) long loops_nested(int n)
{
    long total = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            total += (i * j) ^ (j >> 1);
    return total;
}

__attribute__((noinline)) int loops_bits(unsigned x)
{
    int bits = 0;
    while (x != 0) {
        bits += x & 1;
        x >>= 1;
    }
    return bits;
}

int main(void)
{
    int bits = 0;
    loops_fill(data, N, 42);
    long sum = loops_sum(data, N);
    long nested = loops_nested(40);
    for (int i = 0; i < N; i++)
        bits += loops_bits((unsigned)data[i] * 2654435761u);
    printf("loops: sum=%ld nested=%ld bits=%d\n", sum, nested, bits);
    return 0;
}
