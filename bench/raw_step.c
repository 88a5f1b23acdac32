/*
 * raw_step: the baseline for itrace's recording rate.
 *
 * The smallest ptrace single-step loop there is: fork, PTRACE_TRACEME, exec
 * the workload, then PTRACE_SINGLESTEP + waitpid until the tracee exits,
 * counting steps.  No registers are read and nothing is recorded, so its
 * rate (steps per second) is the ceiling for any ptrace single-step tracer.
 *
 * Usage: raw_step PROGRAM [ARGS...]
 * Prints one line on stderr (the workload keeps stdout):
 *   raw_step steps=N seconds=S rate=R status=X
 * steps counts instructions from the first instruction after exec up to and
 * including the exit_group syscall (a `rep`-prefixed string instruction is
 * counted once per iteration, as the CPU traps after each one).
 * seconds runs from the stop at exec to the exit.  Exit status: the
 * workload's, or 125 on a tracing error.
 *
 * With RAW_STEP_BLOCK=1 in its environment it block-steps instead
 * (PTRACE_SINGLEBLOCK: a stop after each branch where the CPU's branch trace
 * works), the floor for a block-stepping tracer; steps then counts stops, and
 * the line ends with request=singleblock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PROGRAM [ARGS...]\n", argv[0]);
        return 125;
    }

    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 125;
    }
    if (pid == 0) {
        if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0) {
            perror("PTRACE_TRACEME");
            _exit(126);
        }
        execvp(argv[1], argv + 1);
        perror("execvp");
        _exit(127);
    }

    int status;
    /* First stop: SIGTRAP after a successful exec. */
    if (waitpid(pid, &status, 0) != pid) {
        perror("waitpid");
        return 125;
    }
    if (!WIFSTOPPED(status)) {
        fprintf(stderr, "raw_step: child did not stop at exec (status 0x%x)\n", status);
        return 125;
    }
    /* Kill the tracee if we die. */
    ptrace(PTRACE_SETOPTIONS, pid, NULL, (void *)(long)PTRACE_O_EXITKILL);

    int request = PTRACE_SINGLESTEP;
    const char *block = getenv("RAW_STEP_BLOCK");
    if (block && strcmp(block, "1") == 0) {
#ifdef PT_STEPBLOCK
        request = PT_STEPBLOCK;
#else
        fprintf(stderr, "raw_step: no PTRACE_SINGLEBLOCK on this architecture\n");
        kill(pid, SIGKILL);
        return 125;
#endif
    }

    double t0 = now();
    unsigned long long steps = 0;
    int sig = 0;
    for (;;) {
        if (ptrace(request, pid, NULL, (void *)(long)sig) != 0) {
            fprintf(stderr, "raw_step: ptrace step request %d: %s\n", request, strerror(errno));
            kill(pid, SIGKILL);
            return 125;
        }
        steps++;
        if (waitpid(pid, &status, 0) != pid) {
            if (errno == EINTR)
                continue;
            perror("waitpid");
            return 125;
        }
        if (WIFEXITED(status) || WIFSIGNALED(status))
            break;
        /* Pass on any signal other than our own single-step trap. */
        sig = WIFSTOPPED(status) && WSTOPSIG(status) != SIGTRAP ? WSTOPSIG(status) : 0;
        if (sig)
            steps--; /* a signal stop executed no instruction */
    }
    double secs = now() - t0;

    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    fprintf(stderr, "raw_step steps=%llu seconds=%.6f rate=%.0f status=%d%s\n",
            steps, secs, secs > 0 ? steps / secs : 0.0, code,
            request == PTRACE_SINGLESTEP ? "" : " request=singleblock");
    return code;
}
