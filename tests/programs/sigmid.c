/* sigmid.c - SIGUSR1 sent by another process (the test) while sigmid_body runs a long
 * straight-line block in a loop: under block stepping the signals stop the thread mid-run.
 * The program counts its own loop iterations and handler calls and prints them at the end:
 * the trace must show exactly as many calls of each, every one of the same length. */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#define SIGNALS 20

static volatile sig_atomic_t sigmid_handled;
static volatile unsigned long sigmid_sink;

__attribute__((noinline)) void sigmid_handler(int signo)
{
    (void)signo;
    sigmid_handled++;
}

/* Multiplies and shifts interleaved so the compiler cannot fold the chain into one step. */
#define MIX x = x * 7 + 3; x ^= x >> 5;
__attribute__((noinline)) void sigmid_body(unsigned long i)
{
    unsigned long x = i;
    MIX MIX MIX MIX MIX MIX MIX MIX MIX MIX
    MIX MIX MIX MIX MIX MIX MIX MIX MIX MIX
    sigmid_sink += x;
}

int main(void)
{
    static struct sigaction sa; /* static: zeroed without a rep stos */
    sa.sa_handler = sigmid_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGUSR1, &sa, NULL) != 0)
        return 2;
    printf("sigmid: ready pid=%d\n", (int)getpid());
    fflush(stdout);
    unsigned long i = 0;
    while (sigmid_handled < SIGNALS)
        sigmid_body(i++);
    /* Later signals stay pending until exit, which discards them: the count below is final. */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, NULL);
    printf("sigmid: iterations=%lu handled=%d\n", i, (int)sigmid_handled);
    return 0;
}
