/* kmodstat.c - prints the module's status (ITR_IOC_STATUS) as
 * "threads=N traps=N": the fault-injection checks of the kmod guest test
 * use it to see that no thread is left known to the module. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include "itrace_kmod.h"

int main(void)
{
	struct itr_status st;
	int fd = open("/dev/itrace", O_RDWR | O_CLOEXEC);

	if (fd < 0 || ioctl(fd, ITR_IOC_STATUS, &st)) {
		perror("kmodstat: /dev/itrace");
		return 1;
	}
	printf("threads=%u traps=%llu\n", st.threads, (unsigned long long)st.traps);
	close(fd);
	return 0;
}
