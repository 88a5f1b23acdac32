/* segv.c - SIGSEGV mid-block, with a handler: segv_touch loads through a null pointer in the
 * middle of straight-line code; the handler counts and siglongjmps back to main. Three rounds,
 * then the same fault without a handler ends the program (status 128+11 under itrace). */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static sigjmp_buf segv_env;
static volatile int segv_count;
static int *volatile segv_ptr; /* null: read through it faults */

__attribute__((noinline)) void segv_handler(int signo)
{
    (void)signo;
    segv_count++;
    siglongjmp(segv_env, 1);
}

__attribute__((noinline)) int segv_touch(int k)
{
    int a = k * 3 + 1;
    a ^= k << 2;
    a += *segv_ptr; /* faults here, mid-block */
    return a;
}

int main(void)
{
    static struct sigaction sa; /* static: zeroed without a rep stos */
    sa.sa_handler = segv_handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL) != 0)
        return 2;
    for (volatile int i = 0; i < 3; i++)
        if (sigsetjmp(segv_env, 1) == 0)
            segv_touch(i);
    printf("faults %d\n", segv_count);
    fflush(stdout);
    signal(SIGSEGV, SIG_DFL);
    return segv_touch(9);
}
