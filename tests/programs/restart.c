/* System calls interrupted by a signal handler (the native s390x recorder's guest test):
 *   restart          a SIGALRM every 50 ms, its handler installed with SA_RESTART; a read() on
 *                    an empty pipe, interrupted and restarted by the kernel until the third
 *                    alarm's handler writes a byte into the pipe (the first two find the read
 *                    blocked even when tracing slows the program a hundredfold); then
 *                    nanosleep() for 300 ms, ended by EINTR (a handler ran: no transparent
 *                    restart) and slept again for the time left. Prints
 *                    "restart: read 1, nanosleep interrupted" and exits 0.
 *   restart forever  the read again and again, each alarm's handler writing the byte (to attach
 *                    to a program sitting in a system call); never ends. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int pipe_fds[2];
static volatile int alarms;
/* The alarm whose handler writes the byte, and every one after it. */
static int write_from = 3;

static void on_alarm(int sig)
{
    (void)sig;
    if (++alarms >= write_from) {
        char b = 'x';
        if (write(pipe_fds[1], &b, 1) != 1)
            _exit(3);
    }
}

static void every(long usec)
{
    struct itimerval t = { 0 };
    t.it_value.tv_usec = usec;
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
        write_from = 1;
        every(100000);
        for (;;)
            if (read(pipe_fds[0], &b, 1) != 1)
                return 4;
    }
    every(50000);
    ssize_t n = read(pipe_fds[0], &b, 1);
    int at_read = alarms;
    struct timespec left = { 0, 300000000 };
    int eintr = 0;
    while (nanosleep(&left, &left) != 0) {
        if (errno != EINTR)
            return 5;
        eintr++;
    }
    every(0);
    printf("restart: read %zd, nanosleep %s\n", n, eintr > 0 ? "interrupted" : "not interrupted");
    return n == 1 && at_read >= 3 && eintr > 0 ? 0 : 1;
}
