/* A sibling call compiled by gcc -O2: on 64-bit PowerPC ELFv2 tc_mid ends in a branch to
 * tc_inner's local entry (8 bytes past its symbol). */
#include <stdio.h>
__attribute__((noinline)) long tc_leaf(long x) { long s = 0; for (long i = 0; i < x; i++) s += i * 3; return s; }
__attribute__((noinline)) long tc_inner(long x) { return tc_leaf(x) + 1; }
__attribute__((noinline)) long tc_mid(long x) { return tc_inner(x + 1); }
__attribute__((noinline)) long tc_top(long x) { return tc_mid(x) * 2; }
int main(void) { long t = 0; for (int i = 0; i < 3; i++) t += tc_top(10 + i); printf("tailcall: %ld\n", t); return 0; }
