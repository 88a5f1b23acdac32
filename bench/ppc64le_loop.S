/* Freestanding ppc64le benchmark loop (bench/ppc64le.sh, ppc64le-guest/): no libc, so no
 * lwarx/stwcx. sequence, which a raw single-step loop cannot get through. ITERATIONS
 * iterations of a call, a few arithmetic instructions and a data-dependent conditional
 * branch (9 each), then exit(0). With any argument it loops until
 * killed (the attach test). */
    .abiversion 2
    .set ITERATIONS, 5000
    .text
    .globl _start
    .type _start,@function
_start:
    ld      5, 0(1)             /* argc */
    lis     3, ITERATIONS@ha
    addi    3, 3, ITERATIONS@l
    cmpdi   5, 1
    beq     .Lgo
    lis     3, 0x7fff           /* "forever" */
.Lgo:
    li      4, 0
.Lloop:
    bl      step
    addic.  3, 3, -1
    bne     .Lloop
    li      0, 1                /* exit(0) */
    li      3, 0
    sc

/* r4 = r4 * 5 + 1, plus 7 when the result is odd. */
    .type   step,@function
step:
    mulli   6, 4, 5
    addi    4, 6, 1
    andi.   7, 4, 1
    beq     .Leven
    addi    4, 4, 7
.Leven:
    blr
