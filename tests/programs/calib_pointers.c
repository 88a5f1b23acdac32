/* Calibration: functions called through pointers, and through the PLT of a shared library. */
#include "calib_shlib.h"
__attribute__((noinline)) int add1(int x) { return x + 1; }
__attribute__((noinline)) int dbl(int x) { return x * 2; }
__attribute__((noinline)) int neg(int x) { return -x; }
int (*volatile ops[3])(int) = {add1, dbl, neg};
volatile int out;

int main(void) {
    int s = 0;
    for (int i = 0; i < 300; i++) {
        s += ops[i % 3](i);
        s += shlib_square(i);
        s = shlib_mix(s, i);
    }
    out = s;
    return 0;
}
