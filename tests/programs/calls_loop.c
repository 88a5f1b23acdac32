/* calls_loop.c - ROUNDS rounds (argv[1], default 1000) of calls three deep with a
 * data-dependent branch: its trace grows with ROUNDS while its call stacks stay the
 * same ones (tests/tests/bigtrace.rs). Prints a checksum that depends only on ROUNDS. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) unsigned cl_leaf(unsigned x)
{
    return x * 2654435761u;
}

__attribute__((noinline)) unsigned cl_mid(unsigned x)
{
    return (x & 8) ? cl_leaf(x) : cl_leaf(x + 1) ^ 1u;
}

__attribute__((noinline)) unsigned cl_top(unsigned x)
{
    return cl_mid(x) + cl_mid(x >> 3);
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    unsigned h = 1;
    for (long i = 0; i < rounds; i++)
        h = cl_top(h + (unsigned)i);
    printf("calls_loop: %u\n", h);
    return 0;
}
