/* Signals through the GDB stub: a handler run three times by raise(). */
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

static volatile int handled;

static void on_usr1(int sig)
{
    handled += sig;
}

int main(void)
{
    struct sigaction sa = { 0 };
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    for (int i = 0; i < 3; i++)
        raise(SIGUSR1);
    write(1, handled == 3 * SIGUSR1 ? "ok\n" : "no\n", 3);
    return handled == 3 * SIGUSR1 ? 0 : 1;
}
