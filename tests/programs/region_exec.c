/* region_exec.c - exec inside a region: the region ends there, and the new
 * image (this program with an argument) runs normally, untraced. */
#include <stdio.h>
#include <unistd.h>
#include "itrace.h"

__attribute__((noinline)) long rx_before(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i * 3;
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1) {
        printf("region_exec: new image %s\n", argv[1]);
        return 0;
    }
    ITraceOn();
    long s = rx_before(25);
    printf("region_exec: before exec %ld\n", s);
    fflush(stdout);
    execl(argv[0], argv[0], "ok", (char *)0);
    return 1;
}
