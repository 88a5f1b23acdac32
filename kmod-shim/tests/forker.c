/* forker.c - forks a child that computes and exits; the parent waits. */
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) long fk_work(int n)
{
    long t = 0;
    for (int i = 0; i < n; i++)
        t += (i * 3) % 11;
    return t;
}

int main(void)
{
    long a = fk_work(100);
    pid_t pid = fork();
    if (pid < 0)
        return 2;
    if (pid == 0)
        _exit(fk_work(200) > 0 ? 7 : 8);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 7)
        return 3;
    return a > 0 ? 0 : 4;
}
