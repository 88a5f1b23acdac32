/* syscalls.c - many system calls, some of them blocking (context switches). */
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long sc_work(int i)
{
    long t = 0;
    for (int k = 0; k < 10 + i % 7; k++)
        t += k ^ i;
    return t;
}

int main(void)
{
    int fd = open("/dev/null", O_WRONLY);
    long sum = 0;
    struct timespec ts = { 0, 200000 };
    for (int i = 0; i < 300; i++) {
        sum += getpid() & 1;
        sum += sc_work(i);
        if (write(fd, "x", 1) != 1)
            return 2;
        if (i % 25 == 0)
            nanosleep(&ts, NULL);
    }
    close(fd);
    return sum == 0 ? 3 : 0;
}
