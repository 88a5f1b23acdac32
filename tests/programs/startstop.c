/* startstop.c - no library: traced with --start ss_target --stop ss_marker.
 * ss_target runs twice, each time followed by ss_after and then ss_marker. */
#include <stdio.h>

__attribute__((noinline)) long ss_before(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i;
    return s;
}
__attribute__((noinline)) long ss_target(long n) {
    long s = 1;
    for (long i = 0; i < n; i++) s = s * 3 % 10007;
    return s;
}
__attribute__((noinline)) long ss_after(long n) { return n * n + 1; }
__attribute__((noinline)) void ss_marker(void) { __asm__ volatile("" ::: "memory"); }
__attribute__((noinline)) long ss_between(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s ^= i << 2;
    return s;
}

int main(void) {
    long t = ss_before(100);
    for (int r = 0; r < 2; r++) {
        t += ss_target(40 + r);
        t += ss_after(r);
        ss_marker();
        t += ss_between(30);
    }
    printf("startstop: %ld\n", t);
    return 0;
}
