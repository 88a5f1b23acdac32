/* System calls interrupted by a signal handler (the native s390x recorder's guest test):
 *   restart          read() on an empty pipe, interrupted by SIGALRM whose handler (SA_RESTART)
 *                    writes a byte into the pipe: the kernel restarts the read, which returns it;
 *                    then nanosleep() interrupted by a second SIGALRM: EINTR (a handler ran, so
 *                    no transparent restart), slept again for the time remaining. Prints
 *                    "restart: read 1, nanosleep eintr 1".
 *   restart forever  the same read, again and again, a SIGALRM every 100 ms (to attach to a
 *                    program sitting in a system call); never ends. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int pipe_fds[2];
static volatile int alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
    char b = 'x';
    if (write(pipe_fds[1], &b, 1) != 1)
        _exit(3);
}

static void arm(long usec, int periodic)
{
    struct itimerval t = { 0 };
    t.it_value.tv_usec = usec;
    if (periodic)
        t.it_interval.tv_usec = usec;
    setitimer(ITIMER_REAL, &t, NULL);
}

int main(int argc, char **argv)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    if (pipe(pipe_fds) != 0)
        return 2;
    char b;
    if (argc > 1) {
        arm(100000, 1);
        for (;;)
            if (read(pipe_fds[0], &b, 1) != 1)
                return 4;
    }
    arm(50000, 0);
    ssize_t n = read(pipe_fds[0], &b, 1);
    /* The handler's byte was read: empty the pipe of nothing more; now a sleep it interrupts. */
    arm(50000, 0);
    struct timespec left = { 0, 300000000 };
    int eintr = 0;
    while (nanosleep(&left, &left) != 0) {
        if (errno != EINTR)
            return 5;
        eintr++;
    }
    printf("restart: read %zd, nanosleep eintr %d\n", n, eintr);
    return n == 1 && eintr == 1 && alarms == 2 ? 0 : 1;
}
