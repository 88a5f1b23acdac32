/* The bundled example traced by scripts/demo.sh: a little of everything an
 * arc shows (calls, a loop, a jump table, a system call, a signal handler). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile int ticks;

static void on_signal(int sig) { ticks += sig; }

static int classify(int c) {
    switch (c % 6) {
    case 0: return 3;
    case 1: return 5;
    case 2: return 7;
    case 3: return 11;
    case 4: return 13;
    default: return 17;
    }
}

static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

int main(void) {
    signal(SIGUSR1, on_signal);
    int sum = 0;
    for (int i = 0; i < 20; i++) sum += classify(i);
    raise(SIGUSR1);
    char line[64];
    int n = snprintf(line, sizeof line, "demo: sum %d fib(12) %d ticks %d\n", sum, fib(12), ticks);
    write(1, line, n);
    return 0;
}
