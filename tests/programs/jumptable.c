/* jumptable.c - a dense switch that gcc -O1 compiles to a jump table
 * (an indirect jmp; the tests check objdump for it). */
#include <stdio.h>

__attribute__((noinline)) int jt_classify(int c)
{
    int r;
    switch (c) {
    case 0: r = 17; break;
    case 1: r = 3 * c + 1; break;
    case 2: r = c << 4; break;
    case 3: r = 91; break;
    case 4: r = c * c; break;
    case 5: r = 1000 - c; break;
    case 6: r = c ^ 0x55; break;
    case 7: r = 7777; break;
    case 8: r = c + 29; break;
    default: r = -1; break;
    }
    return r;
}

int main(void)
{
    long total = 0;
    for (int i = 0; i < 300; i++)
        total += jt_classify(i % 11);
    printf("jumptable: total=%ld\n", total);
    return 0;
}
