/* Freestanding PowerPC64 test program (ppc64le ELFv2 and big-endian ppc64
 * ELFv1): a loop, a call and return, an indirect branch, a conditional branch
 * taken and not taken, a write system call and exit.
 *
 * Hand count of executed instructions:
 *   _start prologue  li, li                                   2
 *   loop x5          addi, bl, [add_two: addi, blr], addic., bne   6 x 5 = 30
 *                    (bne taken 4 times, falls through once)
 *   indirect         lis, addi, mtctr, bctr                   4
 *   target           cmpwi, beq (not taken)                   2
 *   write            li, li, lis, addi, li, sc                6
 *   skip             li, li, sc (exit)                        3
 *                                                     total  47
 * Taken branches (blocks): 5 bl, 5 blr, 4 bne, 1 bctr, 1 sc write, 1 sc exit = 17.
 */
#if defined(_CALL_ELF) && _CALL_ELF == 2
/* ELFv2: say so in e_flags (qemu and the kernel read the entry as a descriptor otherwise). */
    .abiversion 2
#define ENTRY(name) .globl name; .type name,@function; name:
#else
/* ELFv1: the ELF entry point is a function descriptor in .opd. */
#define ENTRY(name) .globl name; .section ".opd","aw"; .align 3; name: .quad .L.name,.TOC.@tocbase,0; .previous; .type name,@function; .L.name:
#endif

    .text
ENTRY(_start)
    li      3, 5
    li      4, 0
.Lloop:
    addi    4, 4, 1
    bl      add_two
    addic.  3, 3, -1
    bne     .Lloop
    lis     9, target@ha
    addi    9, 9, target@l
    mtctr   9
    bctr
    nop                     /* never executed */
target:
    cmpwi   4, 100
    beq     skip
    li      0, 4            /* write(1, msg, 3) */
    li      3, 1
    lis     4, msg@ha
    addi    4, 4, msg@l
    li      5, 3
    sc
skip:
    li      0, 1            /* exit(0) */
    li      3, 0
    sc

add_two:
    addi    4, 4, 2
    blr

    .data
msg:
    .ascii  "ok\n"
