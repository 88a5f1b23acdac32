/* timer.c - SIGALRM every millisecond (setitimer ITIMER_REAL) while timer_compute runs a fixed
 * loop: the signals arrive anywhere in it, so a recorder that stops mid-block must place
 * them exactly. timer_compute's own instruction count does not depend on where or how often
 * it is interrupted; timer_handler's is the same for each call. */
#include <signal.h>
#include <stdio.h>
#include <sys/time.h>

static volatile sig_atomic_t timer_ticks;

__attribute__((noinline)) void timer_handler(int signo)
{
    (void)signo;
    timer_ticks++;
}

__attribute__((noinline)) long timer_compute(long n)
{
    long t = 0;
    for (long i = 0; i < n; i++)
        t += (i * 7) % 13 + (i & 1 ? i >> 2 : -i);
    return t;
}

int main(void)
{
    static struct sigaction sa; /* static: zeroed without a rep stos */
    sa.sa_handler = timer_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGALRM, &sa, NULL) != 0)
        return 2;
    struct itimerval it = { { 0, 1000 }, { 0, 1000 } };
    if (setitimer(ITIMER_REAL, &it, NULL) != 0)
        return 3;
    long t = timer_compute(20000);
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);
    printf("%ld %s\n", t, timer_ticks > 0 ? "ticked" : "no tick");
    return 0;
}
