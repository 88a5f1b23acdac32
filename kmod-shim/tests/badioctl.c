/* badioctl.c - the device refuses bad ioctl arguments and mmap ranges (run as root in the guest). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "itrace_kmod.h"

static int fails;

static void expect(const char *what, int r, int want_errno)
{
    int e = r < 0 ? errno : 0;
    if (e != want_errno) {
        printf("badioctl: FAIL %s: errno %d (%s), want %d\n", what, e, strerror(e), want_errno);
        fails++;
    }
}

int main(void)
{
    int fd = open("/dev/itrace", O_RDWR), other = open("/dev/itrace", O_RDWR);
    if (fd < 0 || other < 0) {
        printf("badioctl: FAIL open\n");
        return 1;
    }
    struct itr_config cfg = { .mode = 7, .buffer_size = 1 << 16, .mte_size = 1 << 16 };
    struct itr_target tg = { 0 };
    struct itr_consume c = { 0 };
    struct itr_status st;
    expect("enable before install", ioctl(fd, ITR_IOC_ENABLE, &tg), EPERM);
    expect("install mode 7", ioctl(fd, ITR_IOC_INSTALL, &cfg), EINVAL);
    cfg.mode = ITR_MODE_NORMAL;
    cfg.buffer_size = 1;
    expect("install size 1", ioctl(fd, ITR_IOC_INSTALL, &cfg), EINVAL);
    cfg.buffer_size = 1ULL << 40;
    expect("install size 1T", ioctl(fd, ITR_IOC_INSTALL, &cfg), EINVAL);
    cfg.buffer_size = 1 << 16;
    cfg.flags = 0x80;
    expect("install flags", ioctl(fd, ITR_IOC_INSTALL, &cfg), EINVAL);
    cfg.flags = 0;
    expect("install bad pointer", ioctl(fd, ITR_IOC_INSTALL, (void *)8), EFAULT);
    expect("install", ioctl(fd, ITR_IOC_INSTALL, &cfg), 0);
    expect("install twice", ioctl(other, ITR_IOC_INSTALL, &cfg), EBUSY);
    expect("status", ioctl(fd, ITR_IOC_STATUS, &st), 0);
    tg.flags = 0x80;
    expect("enable flags", ioctl(fd, ITR_IOC_ENABLE, &tg), EINVAL);
    tg.flags = 0;
    tg.pid = -5;
    expect("enable pid -5", ioctl(fd, ITR_IOC_ENABLE, &tg), EINVAL);
    tg.pid = 999999;
    expect("enable no such pid", ioctl(fd, ITR_IOC_ENABLE, &tg), ESRCH);
    tg.pid = 2; /* kthreadd */
    expect("enable a kernel thread", ioctl(fd, ITR_IOC_ENABLE, &tg), EPERM);
    tg.pid = getpid();
    expect("enable from another file", ioctl(other, ITR_IOC_ENABLE, &tg), EPERM);
    c.stream = 99;
    expect("consume stream 99", ioctl(fd, ITR_IOC_CONSUME, &c), EINVAL);
    c.stream = 0;
    c.tail = 1 << 20;
    expect("consume past head", ioctl(fd, ITR_IOC_CONSUME, &c), EINVAL);
    c.tail = 0;
    expect("consume from another file", ioctl(other, ITR_IOC_CONSUME, &c), EPERM);
    expect("unknown ioctl", ioctl(fd, _IO('i', 99), 0), ENOTTY);
    expect("on, not traced", ioctl(other, ITR_IOC_ON, 0), ENOENT);
    size_t len = st.map_size;
    expect("mmap writable", mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED ? -1 : 0, EACCES);
    expect("mmap too long", mmap(NULL, len + 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED ? -1 : 0, EINVAL);
    expect("mmap offset", mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 4096) == MAP_FAILED ? -1 : 0, EINVAL);
    expect("mmap from another file", mmap(NULL, 4096, PROT_READ, MAP_SHARED, other, 0) == MAP_FAILED ? -1 : 0, EPERM);
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    expect("mmap", p == MAP_FAILED ? -1 : 0, 0);
    if (p != MAP_FAILED) {
        expect("mprotect writable", mprotect(p, 4096, PROT_READ | PROT_WRITE), EACCES);
        const struct itr_ctl *ctl = p;
        if (ctl->magic != ITR_MAGIC || ctl->ncpu != st.ncpu) {
            printf("badioctl: FAIL control block\n");
            fails++;
        }
    }
    if (fails == 0)
        printf("badioctl: ok\n");
    return fails != 0;
}
