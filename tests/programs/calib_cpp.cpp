// Calibration: a C++ class with inlined (bump) and non-inlined (add, get) methods.
struct Counter {
    int n = 0;
    inline void bump() { n++; }
    __attribute__((noinline)) int get() const { return n; }
    __attribute__((noinline)) void add(int k) {
        for (int i = 0; i < k; i++)
            bump();
    }
};

int main() {
    Counter c;
    int s = 0;
    for (int i = 0; i < 200; i++) {
        c.add(2);
        s += c.get();
    }
    return s > 0 ? 0 : 1;
}
