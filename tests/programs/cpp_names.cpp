// C++ names a person types (tests/tests/names.rs): namespaces, classes with const methods
// of the same name, overloads, a function template with two instances, operators, a
// class template's method. Every function below runs, and none is inlined; no library
// beyond libc's start-up, so the names in the trace are these and glibc's.
#define KEEP __attribute__((noinline))

namespace geo {
struct Shape {
    virtual int area() const = 0;
};
struct Rect : Shape {
    int w, h;
    Rect(int w_, int h_) : w(w_), h(h_) {}
    KEEP int area() const override { return w * h; }
};
struct Tri : Shape {
    int b, h;
    Tri(int b_, int h_) : b(b_), h(h_) {}
    KEEP int area() const override { return b * h / 2; }
};
struct V {
    int x;
    KEEP V operator+(const V &o) const { return V{x + o.x}; }
    KEEP int operator()(int k) const { return x * k; }
};
template <typename T> struct Box {
    T v;
    KEEP T get() const { return v; }
};
KEEP int scale(int x) { return x * 3; }
KEEP double scale(double x) { return x * 2.5; }
template <typename T> KEEP T biggest(T a, T b) { return a > b ? a : b; }
KEEP int total(const Shape *const *shapes, int n) {
    int sum = 0;
    for (int i = 0; i < n; i++)
        sum += shapes[i]->area();
    return sum;
}
} // namespace geo

KEEP int square(int side) { return side * side; }

int main() {
    geo::Rect r(3, 4);
    geo::Tri t(6, 2);
    const geo::Shape *shapes[] = {&r, &t, &r};
    int s = geo::total(shapes, 3);
    s += geo::scale(2) + (int)geo::scale(2.0);
    s += geo::biggest(s, 7) + (int)geo::biggest(1.5, 0.5);
    geo::V a{2}, b{5};
    s += (a + b)(3);
    geo::Box<int> box{s};
    s += box.get() + square(2);
    return s == 0;
}
