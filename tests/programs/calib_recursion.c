/* Calibration: deep recursion (depth: 300 deep, twice) and a branching recursion (fib). */
__attribute__((noinline)) int depth(int n) { return n == 0 ? 0 : 1 + depth(n - 1); }
__attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

int main(void) {
    int s = 0;
    for (int i = 0; i < 2; i++)
        s += depth(300);
    s += fib(11);
    return s == 600 + 89 ? 0 : 1;
}
