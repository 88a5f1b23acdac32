/* Calibration: many tiny leaf functions, 400 calls each. */
volatile int v;
__attribute__((noinline)) void t0(void) { v++; }
__attribute__((noinline)) int t1(int x) { return x + 1; }
__attribute__((noinline)) int t2(int x, int y) { return x * y; }
__attribute__((noinline)) void t3(void) {}
__attribute__((noinline)) int t4(void) { return v; }

int main(void) {
    int s = 0;
    for (int i = 0; i < 400; i++) {
        t0();
        s += t1(i);
        s += t2(i, 3);
        t3();
        s += t4();
    }
    return s > 0 ? 0 : 1;
}
