/* forkexec.c - fork + exec.
 *
 *   forkexec          the parent computes fe_parent_work() and forks; the
 *                     child computes fe_child_work() and execs
 *                     "<argv[0]> child"; the parent waits for it.
 *   forkexec child    computes fe_exec_work() and exits.
 *
 * argv[0] must be a path to this program (the tests pass an absolute one).
 *
 * Two callgrind client requests (no-op sequences of rotates when not under
 * valgrind) make callgrind an exact oracle for this program:
 *   - a forked child inherits callgrind's counters, so its dump would count
 *     the parent's work before the fork twice: fe_spawn() zeroes them
 *     (CALLGRIND_ZERO_STATS) in the child right after fork();
 *   - callgrind writes its counts when a process exits, never at exec, so
 *     fe_exec_self() dumps them (CALLGRIND_DUMP_STATS) just before execl().
 * The child's instructions in fe_spawn() before the zeroing and in
 * fe_exec_self() after the dump are invisible to callgrind, so the tests
 * leave those two functions out of the comparison (FORKEXEC_EXEMPT).
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

__attribute__((noinline)) long fe_mix(long x, int n)
{
    for (int i = 0; i < n; i++)
        x = (x * 1103515245 + 12345) & 0x7fffffff;
    return x;
}

__attribute__((noinline)) long fe_parent_work(void) { return fe_mix(1, 300); }
__attribute__((noinline)) long fe_child_work(void) { return fe_mix(2, 500); }
__attribute__((noinline)) long fe_exec_work(void) { return fe_mix(3, 700); }

static volatile long fe_sink;

__attribute__((noinline, noreturn)) void fe_exec_self(const char *self)
{
    CALLGRIND_DUMP_STATS;
    execl(self, self, "child", (char *)NULL);
    _exit(127);
}

__attribute__((noinline, noreturn)) void fe_child_main(const char *self)
{
    fe_sink = fe_child_work();
    fe_exec_self(self);
}

__attribute__((noinline)) pid_t fe_spawn(const char *self)
{
    pid_t pid = fork();
    if (pid == 0) {
        CALLGRIND_ZERO_STATS;
        fe_child_main(self);
    }
    return pid;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        printf("forkexec: exec'd child %ld\n", fe_exec_work());
        return 0;
    }
    long p = fe_parent_work();
    fflush(stdout);
    pid_t pid = fe_spawn(argv[0]);
    if (pid < 0)
        return 2;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return 3;
    printf("forkexec: parent %ld, child status %d\n", p, status);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
