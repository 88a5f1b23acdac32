/* xl_jit.c - code written after it was translated (tests/tests/translate.rs). A function
 * `mov $imm32,%eax; ret` is written into a page, called, rewritten with another immediate and
 * called again, twice over:
 *   xl_jit mprotect   the page is RW while written and RX while run (mprotect between);
 *   xl_jit rwx        the page is RWX and rewritten with no system call in between
 *                     (self-modifying code).
 * Prints both results; exit 0 if they are 1111 then 2222. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static void xl_jit_emit(unsigned char *at, int imm)
{
    at[0] = 0xb8; /* mov $imm32,%eax */
    memcpy(at + 1, &imm, 4);
    at[5] = 0xc3; /* ret */
}

__attribute__((noinline)) int xl_jit_call(unsigned char *at) { return ((int (*)(void))at)(); }

int main(int argc, char **argv)
{
    int rwx = argc > 1 && strcmp(argv[1], "rwx") == 0;
    int prot = PROT_READ | PROT_WRITE | (rwx ? PROT_EXEC : 0);
    unsigned char *page = mmap(0, 4096, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 2;
    xl_jit_emit(page + 0x80, 1111);
    if (!rwx && mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0)
        return 3;
    int first = xl_jit_call(page + 0x80);
    if (!rwx && mprotect(page, 4096, PROT_READ | PROT_WRITE) != 0)
        return 3;
    xl_jit_emit(page + 0x80, 2222);
    if (!rwx && mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0)
        return 3;
    int second = xl_jit_call(page + 0x80);
    printf("xl_jit %s: %d then %d\n", rwx ? "rwx" : "mprotect", first, second);
    return first == 1111 && second == 2222 ? 0 : 1;
}
