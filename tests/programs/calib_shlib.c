/* Calibration: functions of a shared library, called through its PLT. */
#include "calib_shlib.h"
int shlib_square(int x) { return x * x; }
int shlib_mix(int a, int b) { return shlib_square(a & 7) + b; }
