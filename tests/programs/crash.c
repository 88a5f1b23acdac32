/* crash.c - dies of SIGSEGV (a write through a NULL pointer) three calls
 * deep: main -> crash_level1 -> crash_level2 -> crash_level3. */
#include <stdio.h>

int *volatile crash_target; /* NULL, and volatile so the store is real */

__attribute__((noinline)) void crash_level3(int v)
{
    *crash_target = v;
}

__attribute__((noinline)) void crash_level2(int v)
{
    crash_level3(v + 1);
    crash_target = 0; /* not reached; keeps the call from being a tail call */
}

__attribute__((noinline)) void crash_level1(int v)
{
    crash_level2(v * 2);
    crash_target = 0;
}

int main(void)
{
    printf("crash: about to crash\n");
    fflush(stdout);
    crash_level1(20);
    return 0;
}
