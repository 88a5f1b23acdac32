/*
 * workload: a deterministic CPU loop for the itrace benchmark.
 *
 * Usage: workload N [mix|branchy]
 *   mix      (default) N iterations of a mix of calls, data-dependent
 *            conditional branches, a short inner loop and a small recursion
 *            (about 90 instructions and 25 taken branches per iteration).
 *   branchy  N iterations of a tight call/return loop: about 3 instructions
 *            per taken branch, to make traces with many records cheaply.
 * No system calls inside the loop; the checksum is printed at the end so
 * nothing can be optimised away.  Build: gcc -O1 -static.
 * The same N always executes the same instructions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOIPA __attribute__((noipa))

static unsigned long table[16];

NOIPA static unsigned long lcg(unsigned long x)
{
    return x * 6364136223846793005UL + 1442695040888963407UL;
}

NOIPA static unsigned long rotl(unsigned long x, unsigned r)
{
    return (x << (r & 63)) | (x >> ((64 - r) & 63));
}

NOIPA static unsigned long fold(unsigned long x, unsigned depth)
{
    if (depth == 0)
        return x ^ (x >> 29);
    return fold(x + depth, depth - 1) * 3;
}

NOIPA static unsigned long step(unsigned long x, unsigned long i)
{
    x = lcg(x);
    if (x & 0x100)          /* data dependent, roughly 50/50 */
        x ^= rotl(x, (unsigned)(i & 31));
    else
        x += i;
    for (unsigned j = 0; j < (unsigned)((x >> 7) & 3) + 1; j++)
        table[(x + j) & 15] += x >> j;
    switch ((x >> 11) & 3) {
    case 0: x = fold(x, 2); break;
    case 1: x -= table[i & 15]; break;
    case 2: x = rotl(x, 7); break;
    default: break;
    }
    return x;
}

NOIPA static unsigned long leaf(unsigned long x)
{
    return x + 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s N [mix|branchy]\n", argv[0]);
        return 2;
    }
    unsigned long n = strtoul(argv[1], NULL, 0);
    int branchy = argc > 2 && strcmp(argv[2], "branchy") == 0;

    unsigned long x = 12345;
    if (branchy) {
        for (unsigned long i = 0; i < n; i++)
            x = leaf(x);
    } else {
        for (unsigned long i = 0; i < n; i++)
            x = step(x, i);
    }
    printf("%lu\n", x);
    return 0;
}
