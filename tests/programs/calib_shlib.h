/* The shared library of calib_pointers. */
int shlib_square(int x);
int shlib_mix(int a, int b);
