// attach_cpp.cpp - a self-checking C++ target for repeated attach/detach
// (tests/tests/attach_stress.rs): threads that throw and catch exceptions through several
// frames and virtual calls, while the main thread waits for end of file on standard input.
//
// Prints "attach_cpp: started pid=N"; at end of input prints
// "attach_cpp: items=N errors=E" and exits with status 0 when E is 0, 3 otherwise.  Each
// item checks the value its exception carries and the sum its virtual calls make against
// what they must be: an unwinder or a register disturbed by a tracer shows as an error.
#include <atomic>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

std::atomic<bool> stop{false};
std::atomic<unsigned long> items{0}, errors{0};

struct Shape {
    virtual ~Shape() = default;
    virtual long area() const = 0;
};
struct Rect : Shape {
    long w, h;
    Rect(long w, long h) : w(w), h(h) {}
    long area() const override { return w * h; }
};
struct Tri : Shape {
    long b, h;
    Tri(long b, long h) : b(b), h(h) {}
    long area() const override { return b * h / 2; }
};

struct Found : std::runtime_error {
    long value;
    explicit Found(long v) : std::runtime_error("found"), value(v) {}
};

__attribute__((noinline)) void dig(long depth, long value)
{
    if (depth == 0)
        throw Found(value);
    std::vector<long> keep(4, depth); // a destructor to run while unwinding
    dig(depth - 1, value + keep[0]);
}

__attribute__((noinline)) bool item(long seed)
{
    bool bad = false;
    long depth = 1 + seed % 8;
    try {
        dig(depth, seed);
        bad = true; // never returns normally
    } catch (const Found &f) {
        // value = seed + depth + (depth-1) + ... + 1
        bad |= f.value != seed + depth * (depth + 1) / 2;
    }
    std::vector<std::unique_ptr<Shape>> shapes;
    for (long k = 1; k <= 10; k++) {
        if (k % 2)
            shapes.push_back(std::make_unique<Rect>(k, seed % 7 + 1));
        else
            shapes.push_back(std::make_unique<Tri>(k, 2 * (seed % 5 + 1)));
    }
    long sum = 0;
    for (auto &s : shapes)
        sum += s->area();
    // odd k: k*(seed%7+1); even k: k*(seed%5+1)
    long want = (1 + 3 + 5 + 7 + 9) * (seed % 7 + 1) + (2 + 4 + 6 + 8 + 10) * (seed % 5 + 1);
    bad |= sum != want;
    return bad;
}

void worker(long first)
{
    for (long seed = first; !stop.load(std::memory_order_relaxed); seed++) {
        bool bad = item(seed);
        items++;
        if (bad)
            errors++;
    }
}

} // namespace

int main()
{
    std::vector<std::thread> threads;
    for (long i = 0; i < 2; i++)
        threads.emplace_back(worker, i * 1000003);
    std::printf("attach_cpp: started pid=%d\n", (int)getpid());
    std::fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    stop = true;
    for (auto &t : threads)
        t.join();
    std::printf("attach_cpp: items=%lu errors=%lu\n", items.load(), errors.load());
    std::fflush(stdout);
    return errors ? 3 : 0;
}
