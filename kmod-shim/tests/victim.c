/* victim.c - a target for the fault-injection checks of the kmod guest test:
 * itrace is killed (SIGINT, SIGTERM, SIGHUP, SIGKILL) while it traces this
 * program, which must run on unharmed.
 *
 *   victim [ROUNDS [SLEEP_US]]     (defaults: 40 rounds, 10000 us)
 *
 * Two threads each run ROUNDS rounds of a fixed computation with a short
 * nanosleep between rounds (restarted when interrupted); a SIGALRM handler
 * runs every 5 ms of real time and does some work of its own, so that a
 * detach often comes while a thread is inside the handler (its signal frame
 * then holds the flags the thread had when the signal came). Prints
 * "victim: sum=<hex> <hex>", which depends only on ROUNDS, and exits 0.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile unsigned long handler_sink;
static volatile long alarms;

static void on_alarm(int sig)
{
	unsigned long h = (unsigned long)sig;

	for (int i = 0; i < 300; i++)
		h = (h ^ (unsigned long)i) * 0x100000001b3ul;
	handler_sink = h;
	alarms++;
}

static int rounds = 40;
static long sleep_us = 10000;

static void pause_a_bit(void)
{
	struct timespec req = { sleep_us / 1000000, (sleep_us % 1000000) * 1000 };

	while (nanosleep(&req, &req) == -1 && errno == EINTR)
		;
}

static unsigned long work(unsigned long seed)
{
	unsigned long h = seed;

	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < 200; i++)
			h = (h ^ (unsigned long)(r * 200 + i)) * 0x100000001b3ul;
		if (sleep_us > 0)
			pause_a_bit();
	}
	return h;
}

static void *worker(void *arg)
{
	*(unsigned long *)arg = work(0x84222325cbf29ce4ul);
	return NULL;
}

int main(int argc, char **argv)
{
	struct itimerval it = { { 0, 5000 }, { 0, 5000 } };
	struct sigaction sa;
	unsigned long a, b = 0;
	pthread_t th;

	if (argc > 1)
		rounds = atoi(argv[1]);
	if (argc > 2)
		sleep_us = atol(argv[2]);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	if (pthread_create(&th, NULL, worker, &b))
		return 2;
	a = work(0xcbf29ce484222325ul);
	if (pthread_join(th, NULL))
		return 3;
	/* stop the alarms before printing: the output does not depend on them */
	memset(&it, 0, sizeof(it));
	setitimer(ITIMER_REAL, &it, NULL);
	printf("victim: sum=%016lx %016lx\n", a, b);
	return 0;
}
