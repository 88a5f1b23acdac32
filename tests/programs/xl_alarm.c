/* xl_alarm.c - SIGALRM (setitimer, every 2 ms) interrupting translated code anywhere
 * (tests/tests/translate.rs). xl_alarm_work runs a fixed loop (its count does not depend on the
 * signals), then xl_alarm_spin spins until the handler has run 5 times. Built -no-pie so that the trace's
 * addresses are objdump's. Prints the work's result and whether enough ticks came (the same
 * natively), then how many times the handler ran and the spin loop went round (the trace must
 * have as many handler calls, and as many loop back edges give or take a constant). */
#include <signal.h>
#include <stdio.h>
#include <sys/time.h>

static volatile sig_atomic_t xl_ticks;

__attribute__((noinline)) void xl_alarm_handler(int signo)
{
    (void)signo;
    xl_ticks++;
}

/* Spins until the handler has run 5 times; returns how many times the loop went round (at least
 * once: a loop tested at its bottom only, so its branch is taken spins - 1 times). */
__attribute__((noinline)) long xl_alarm_spin(void)
{
    long spins = 0;
    do
        spins++;
    while (xl_ticks < 5);
    return spins;
}

__attribute__((noinline)) long xl_alarm_work(long n)
{
    long t = 0;
    for (long i = 0; i < n; i++)
        t += (i * 7) % 13 + (i & 1 ? i >> 2 : -i);
    return t;
}

int main(void)
{
    static struct sigaction sa; /* static: zeroed without a rep stos */
    sa.sa_handler = xl_alarm_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGALRM, &sa, NULL) != 0)
        return 2;
    struct itimerval it = { { 0, 2000 }, { 0, 2000 } };
    if (setitimer(ITIMER_REAL, &it, NULL) != 0)
        return 3;
    long t = xl_alarm_work(20000);
    long spins = xl_alarm_spin();
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);
    printf("xl_alarm: work=%ld ticks>=5: %s\n", t, xl_ticks >= 5 ? "yes" : "no");
    printf("xl_alarm: handled=%d spins=%ld\n", (int)xl_ticks, spins);
    return 0;
}
