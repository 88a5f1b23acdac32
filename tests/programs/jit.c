/* JIT code for the perf-map test: copies a 3-instruction function into an
 * executable anonymous page, publishes it in /tmp/perf-PID.map as
 * "jit_double", and calls it 3 times (9 instructions, 3 calls in all). */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(void) {
    static const unsigned char code[] = {
        0x89, 0xf8, /* mov %edi,%eax */
        0x01, 0xc0, /* add %eax,%eax */
        0xc3,       /* ret */
    };
    unsigned char *page = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 1;
    memcpy(page + 0x40, code, sizeof code);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    FILE *f = fopen(path, "w");
    if (!f) return 2;
    fprintf(f, "%lx %zx jit_double\n", (unsigned long)(page + 0x40), sizeof code);
    fclose(f);
    int (*fn)(int) = (int (*)(int))(page + 0x40);
    int s = fn(1) + fn(2) + fn(3);
    printf("jit: %d\n", s);
    return s == 12 ? 0 : 3;
}
