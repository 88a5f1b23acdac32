/* A C program that traces one region with ITraceOn()/ITraceOff().
 * Build: gcc -O1 -g -I libitrace/include region.c -L target/debug -litrace -Wl,-rpath,target/debug
 * Run:   itrace record --region -- ./region */
#include <stdio.h>
#include "itrace.h"

__attribute__((noinline)) static int collatz_steps(unsigned long n) {
    int steps = 0;
    while (n != 1) {
        n = (n % 2 == 0) ? n / 2 : 3 * n + 1;
        steps++;
    }
    return steps;
}

int main(void) {
    int total = 0;
    ITraceOn();
    for (unsigned long n = 1; n <= 20; n++) total += collatz_steps(n);
    int traced = ITraceEnabled();
    ITraceOff();
    printf("region: collatz steps %d traced %d\n", total, traced);
    return 0;
}
