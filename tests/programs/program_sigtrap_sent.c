/* program_sigtrap_sent.c - SIGTRAPs sent by another process: a forked child
 * sends its parent 5 SIGTRAPs with kill(), one at a time, each after the
 * parent's handler (ps_on_trap) acknowledged the one before through a pipe.
 * A tracer stepping the parent sees each with its step trap (one pending
 * SIGTRAP) and must deliver it. Untraced it prints "handled 5" and exits 0;
 * alarm(60) ends a run whose SIGTRAPs are lost instead of spinning forever. */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#define SENT 5

static volatile int handled;

__attribute__((noinline)) void ps_on_trap(int sig) {
    if (sig == SIGTRAP)
        handled++;
}

int main(void) {
    static struct sigaction sa; /* static: zeroed without a rep stos */
    sa.sa_handler = ps_on_trap;
    sigaction(SIGTRAP, &sa, 0);
    alarm(60);
    int ack[2];
    if (pipe(ack) != 0)
        return 2;
    pid_t parent = getpid();
    pid_t child = fork();
    if (child == 0) {
        char c;
        close(ack[1]); /* so that read ends (0) if the parent dies */
        for (int i = 0; i < SENT; i++) {
            kill(parent, SIGTRAP);
            if (read(ack[0], &c, 1) != 1)
                _exit(3);
        }
        _exit(0);
    }
    close(ack[0]);
    int seen = 0;
    while (seen < SENT) {
        if (handled > seen) {
            seen++;
            if (write(ack[1], "a", 1) != 1)
                return 4;
        }
    }
    int status;
    waitpid(child, &status, 0);
    printf("handled %d\n", handled);
    return handled == SENT && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
