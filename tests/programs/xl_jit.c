/* xl_jit.c - code written after it was translated (tests/tests/translate.rs). A function
 * `mov $imm32,%eax; ret` is written into a page, called, rewritten with another immediate and
 * called again, twice over:
 *   xl_jit mprotect   the page is RW while written and RX while run (mprotect between);
 *   xl_jit rwx        the page is RWX and rewritten with no system call in between
 *                     (self-modifying code).
 * Prints both results; exit 0 if they are 1111 then 2222.
 *
 *   xl_jit rwx-loop ROUNDS CALLS   a function with a loop, rewritten in place ROUNDS times in an
 *                                  RWX page (immediates, the loop's count, one opcode; in its
 *                                  first part or in its loop, which a jump leads to), called
 *                                  CALLS times after each rewrite;
 *   xl_jit rx-loop ROUNDS CALLS    the same, the page RX while run and RW while written.
 * Prints the sum of the results; exit 0 if every call returned what the code it ran computes.
 *
 *   xl_jit ahead   in an RX page, `f(x)`: `x == 0` returns 1, else jumps to `g`, which returns
 *                  an immediate; f(0) is called (g is not run, but the translator may have
 *                  translated it ahead, as the jump's target), g's immediate rewritten with
 *                  mprotect around the write, then f(1). Prints both results; exit 0 if they
 *                  are 1 then 2222. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void xl_jit_emit(unsigned char *at, int imm)
{
    at[0] = 0xb8; /* mov $imm32,%eax */
    memcpy(at + 1, &imm, 4);
    at[5] = 0xc3; /* ret */
}

__attribute__((noinline)) int xl_jit_call(unsigned char *at) { return ((int (*)(void))at)(); }

__attribute__((noinline)) int xl_jit_call_with(unsigned char *at, int x) { return ((int (*)(int))at)(x); }

/* f(x) and g of `xl_jit ahead`: f: 0: test %edi,%edi ; 2: jz 9 ; 4: jmp 10 (g) ; 9: mov $1,%eax ;
 * e: ret ; f: nop ; g: 10: mov $imm,%eax (the immediate at 11) ; 15: ret */
static const unsigned char xl_jit_ahead_code[] = {
    0x85, 0xff, 0x74, 0x05, 0xe9, 0x07, 0, 0, 0, 0xb8, 1, 0, 0, 0, 0xc3, 0x90, 0xb8, 0, 0, 0, 0, 0xc3,
};
enum { XL_G_IMM = 0x11 };

static int xl_jit_ahead(void)
{
    unsigned char *page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 2;
    int imm = 1111;
    memcpy(page, xl_jit_ahead_code, sizeof xl_jit_ahead_code);
    memcpy(page + XL_G_IMM, &imm, 4);
    if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0)
        return 3;
    int first = xl_jit_call_with(page, 0);
    if (mprotect(page, 4096, PROT_READ | PROT_WRITE) != 0)
        return 3;
    imm = 2222;
    memcpy(page + XL_G_IMM, &imm, 4);
    if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0)
        return 3;
    int second = xl_jit_call_with(page, 1);
    printf("xl_jit ahead: %d then %d\n", first, second);
    return first == 1 && second == 2222 ? 0 : 1;
}

/* The loop function: a + n * b (or a - n * b), in two parts (the jump ends the first; the loop
 * is the second):
 *   0: mov $a,%eax ; 5: mov $n,%ecx ; a: jmp c ; c: add/sub $b,%eax ; 11: dec %ecx ; 13: jnz c ;
 *   15: ret */
static const unsigned char xl_jit_loop_code[] = {
    0xb8, 0, 0, 0, 0, 0xb9, 0, 0, 0, 0, 0xeb, 0x00, 0x05, 0, 0, 0, 0, 0xff, 0xc9, 0x75, 0xf7, 0xc3,
};
enum { XL_A = 1, XL_N = 6, XL_OP = 12, XL_B = 13 };
#define XL_ADD 0x05
#define XL_SUB 0x2d

/* Rewrite round `r` of the loop function in place: the first part (an immediate, one byte in
 * the middle) or the loop (an immediate, the opcode), one each round. */
static void xl_jit_rewrite(unsigned char *at, unsigned r)
{
    int v = (int)(r * 7 + 3);
    switch (r % 4) {
    case 0:
        memcpy(at + XL_A, &v, 4);
        break;
    case 1:
        memcpy(at + XL_B, &v, 4);
        break;
    case 2:
        at[XL_N] = (unsigned char)(1 + r % 9); /* one byte in the middle of the unit */
        break;
    default:
        at[XL_OP] = at[XL_OP] == XL_ADD ? XL_SUB : XL_ADD;
        break;
    }
}

/* What the loop function as written at `at` returns, read from its bytes. */
static int xl_jit_expected(const unsigned char *at)
{
    int a, b, n = 0;
    memcpy(&a, at + XL_A, 4);
    memcpy(&b, at + XL_B, 4);
    memcpy(&n, at + XL_N, 4);
    return at[XL_OP] == XL_ADD ? a + n * b : a - n * b;
}

static int xl_jit_loop(int rwx, unsigned rounds, unsigned calls)
{
    int run = PROT_READ | (rwx ? PROT_WRITE | PROT_EXEC : PROT_EXEC);
    unsigned char *page = mmap(0, 4096, PROT_READ | PROT_WRITE | (rwx ? PROT_EXEC : 0), MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 2;
    unsigned char *f = page + 0x100;
    memcpy(f, xl_jit_loop_code, sizeof xl_jit_loop_code);
    f[XL_N] = 5;
    long long sum = 0;
    int wrong = 0;
    for (unsigned r = 0; r < rounds; r++) {
        if (!rwx && mprotect(page, 4096, PROT_READ | PROT_WRITE) != 0)
            return 3;
        xl_jit_rewrite(f, r);
        int expected = xl_jit_expected(f);
        if (!rwx && mprotect(page, 4096, run) != 0)
            return 3;
        for (unsigned c = 0; c < calls; c++) {
            int got = xl_jit_call(f);
            sum += got;
            wrong += got != expected;
        }
    }
    printf("xl_jit %s-loop: %lld\n", rwx ? "rwx" : "rx", sum);
    return wrong ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "rwx-loop") == 0 || strcmp(mode, "rx-loop") == 0) {
        unsigned rounds = argc > 2 ? (unsigned)strtoul(argv[2], 0, 0) : 100;
        unsigned calls = argc > 3 ? (unsigned)strtoul(argv[3], 0, 0) : 3;
        return xl_jit_loop(mode[1] == 'w', rounds, calls);
    }
    if (strcmp(mode, "ahead") == 0)
        return xl_jit_ahead();
    int rwx = strcmp(mode, "rwx") == 0;
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
