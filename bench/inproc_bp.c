/* bench/inproc_bp.c - in-process stepping cost on this machine (issue 15): the trap flag (one
 * SIGTRAP per instruction, what the in-process recorder does) against a
 * perf_event_open(PERF_TYPE_BREAKPOINT) execute breakpoint with sigtrap=1, moved at each hit with
 * PERF_EVENT_IOC_MODIFY_ATTRIBUTES (one SIGTRAP and one ioctl per stop, what an in-process block
 * stepper would pay per stop). Exits 2 if a breakpoint hit was lost. Build: gcc -O1 -o inproc_bp
 * bench/inproc_bp.c; run: ./inproc_bp [N] (N pairs of calls, 20000). */
#define _GNU_SOURCE
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

static volatile long sink;
__attribute__((noinline)) void fa(void) { sink++; }
__attribute__((noinline)) void fb(void) { sink += 2; }
static int fd;
static struct perf_event_attr attr;
static volatile long hits, steps;
static volatile int stepping;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static void on_bp(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)si; (void)uc;
    hits++;
    attr.bp_addr = attr.bp_addr == (unsigned long)fa ? (unsigned long)fb : (unsigned long)fa;
    if (ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &attr) != 0) { perror("modify"); _exit(1); }
}
static void on_step(int sig, siginfo_t *si, void *ucv) {
    (void)sig; (void)si;
    ucontext_t *uc = ucv;
    steps++;
    if (!stepping) uc->uc_mcontext.gregs[REG_EFL] &= ~0x100L;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_flags = SA_SIGINFO;
    /* trap flag */
    sa.sa_sigaction = on_step; sigaction(SIGTRAP, &sa, 0);
    double t0 = now();
    stepping = 1;
    __asm__ volatile("pushf; orq $0x100, (%%rsp); popf" ::: "memory", "cc");
    for (long i = 0; i < n; i++) { fa(); fb(); }
    stepping = 0;
    __asm__ volatile("nop");
    double t1 = now();
    printf("trap flag: %ld steps in %.3f s: %.0f steps/s\n", steps, t1 - t0, steps / (t1 - t0));
    /* perf breakpoint */
    sa.sa_sigaction = on_bp; sigaction(SIGTRAP, &sa, 0);
    memset(&attr, 0, sizeof attr);
    attr.type = PERF_TYPE_BREAKPOINT; attr.size = sizeof attr;
    attr.bp_type = HW_BREAKPOINT_X; attr.bp_addr = (unsigned long)fa; attr.bp_len = sizeof(long);
    attr.sample_period = 1; attr.sigtrap = 1; attr.remove_on_exec = 1; attr.exclude_kernel = 1; attr.exclude_hv = 1;
    attr.precise_ip = 0;
    fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) { perror("perf_event_open"); return 1; }
    t0 = now();
    for (long i = 0; i < n; i++) { fa(); fb(); }
    t1 = now();
    printf("perf breakpoint: %ld hits (want %ld) in %.3f s: %.0f stops/s\n", hits, 2 * n, t1 - t0, hits / (t1 - t0));
    return hits == 2 * n ? 0 : 2;
}
