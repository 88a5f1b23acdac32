/* region_fork.c - a fork inside a region: the child (not followed) must run
 * normally, and the parent's region goes on. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itrace.h"

__attribute__((noinline)) long rf_child_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i;
    return s;
}

__attribute__((noinline)) long rf_parent_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s ^= i * 5;
    return s;
}

int main(void) {
    ITraceOn();
    pid_t p = fork();
    if (p == 0) {
        /* ITraceOn/Off in the child too: nobody traces it, they must do nothing. */
        ITraceOn();
        long s = rf_child_work(1000);
        ITraceOff();
        _exit(s == 499500 ? 0 : 1);
    }
    int st = -1;
    waitpid(p, &st, 0);
    long w = rf_parent_work(20);
    ITraceOff();
    printf("region_fork: child %s, parent %ld\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "FAILED", w);
    return 0;
}
