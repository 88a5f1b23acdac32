/* signal.c - a SIGUSR1 handler run three times through raise(). */
#include <signal.h>
#include <stdio.h>

static volatile sig_atomic_t sig_count;
static volatile long sig_work;

__attribute__((noinline)) long sig_compute(int k)
{
    long t = 0;
    for (int i = 0; i < 50 + k; i++)
        t += (i * 7) % 13;
    return t;
}

__attribute__((noinline)) void sig_handler(int signo)
{
    if (signo == SIGUSR1) {
        sig_count++;
        sig_work += sig_compute(sig_count);
    }
}

int main(void)
{
    static struct sigaction sa; /* static: zeroed without a rep stos */
    sa.sa_handler = sig_handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0)
        return 2;
    for (int i = 0; i < 3; i++)
        raise(SIGUSR1);
    printf("signal: count=%d work=%ld\n", (int)sig_count, sig_work);
    return sig_count == 3 ? 0 : 1;
}
