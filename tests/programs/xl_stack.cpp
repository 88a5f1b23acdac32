/* xl_stack.cpp - what reads the stack's return addresses (tests/tests/translate.rs): a C++
 * exception thrown three frames down and caught, backtrace() with the names of the frames
 * (linked -rdynamic), longjmp out of a recursion, and swapcontext between two stacks. It prints
 * what it saw; run natively and translated, the output must be the same. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <execinfo.h>
#include <setjmp.h>
#include <stdexcept>
#include <ucontext.h>

extern "C" {
__attribute__((noinline)) int xs_thrower(int depth)
{
    if (depth == 0)
        throw std::runtime_error("deep");
    return xs_thrower(depth - 1) + 1;
}

__attribute__((noinline)) int xs_catcher(void)
{
    try {
        return xs_thrower(3);
    } catch (const std::runtime_error &e) {
        std::printf("caught %s\n", e.what());
        return 42;
    }
}

/* Prints each frame's function name (from backtrace_symbols: "prog(name+0x1f) [0x...]"),
 * without addresses, down to main. */
__attribute__((noinline)) void xs_backtrace_leaf(void)
{
    void *frames[32];
    int n = backtrace(frames, 32);
    char **names = backtrace_symbols(frames, n);
    if (!names)
        std::exit(4);
    std::printf("backtrace:");
    for (int i = 0; i < n; i++) {
        const char *open = std::strchr(names[i], '(');
        const char *plus = open ? std::strchr(open, '+') : nullptr;
        if (open && plus && plus > open + 1)
            std::printf(" %.*s", (int)(plus - open - 1), open + 1);
        else
            std::printf(" ?");
        if (open && std::strncmp(open + 1, "main+", 5) == 0)
            break;
    }
    std::printf("\n");
    std::free(names);
}

__attribute__((noinline)) void xs_backtrace_mid(void) { xs_backtrace_leaf(); std::printf("back in mid\n"); }
__attribute__((noinline)) void xs_backtrace_top(void) { xs_backtrace_mid(); std::printf("back in top\n"); }

static jmp_buf xs_jump;

__attribute__((noinline)) int xs_dive(int depth)
{
    if (depth <= 0)
        longjmp(xs_jump, 7);
    return depth > 100 ? 0 : xs_dive(depth - 1) + 1;
}

static ucontext_t xs_main_ctx, xs_co_ctx;
static char xs_co_stack[64 * 1024];
static volatile int xs_co_steps;

__attribute__((noinline)) void xs_coroutine(void)
{
    for (int i = 0; i < 3; i++) {
        xs_co_steps += 10;
        swapcontext(&xs_co_ctx, &xs_main_ctx);
    }
}
}

int main(void)
{
    std::printf("catcher: %d\n", xs_catcher());
    xs_backtrace_top();
    int v = setjmp(xs_jump);
    if (v == 0)
        xs_dive(5);
    std::printf("longjmp: %d\n", v);
    getcontext(&xs_co_ctx);
    xs_co_ctx.uc_stack.ss_sp = xs_co_stack;
    xs_co_ctx.uc_stack.ss_size = sizeof xs_co_stack;
    xs_co_ctx.uc_link = &xs_main_ctx;
    makecontext(&xs_co_ctx, xs_coroutine, 0);
    for (int i = 0; i < 4; i++) {
        swapcontext(&xs_main_ctx, &xs_co_ctx);
        std::printf("coroutine steps: %d\n", xs_co_steps);
    }
    return 0;
}
