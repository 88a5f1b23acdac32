/* Freestanding s390x test program: a loop, a call and return, an indirect
 * branch, a conditional branch taken and not taken, a no-op branch (nopr,
 * not a branch), a write system call and exit.
 *
 * Hand count of executed instructions:
 *   _start prologue  lghi, lghi, nopr                          3
 *   loop x5          aghi, brasl, [add_two: aghi, br %r14], brctg  5 x 5 = 25
 *                    (brctg taken 4 times, falls through once)
 *   indirect         larl, br %r1                              2
 *   target           cghi, je (not taken)                      2
 *   write            lghi, larl, lghi, svc 4                   4
 *   skip             lghi, svc 1 (exit)                        2
 *                                                      total  38
 * Taken branches (blocks): 5 brasl, 5 br %r14, 4 brctg, 1 br %r1, 1 svc write, 1 svc exit = 17.
 */
    .text
    .globl  _start
    .type   _start,@function
_start:
    lghi    %r2, 5
    lghi    %r3, 0
    nopr    %r7
.Lloop:
    aghi    %r3, 1
    brasl   %r14, add_two
    brctg   %r2, .Lloop
    larl    %r1, target
    br      %r1
    nopr    %r7             /* never executed */
target:
    cghi    %r3, 100
    je      skip
    lghi    %r2, 1          /* write(1, msg, 3) */
    larl    %r3, msg
    lghi    %r4, 3
    svc     4
skip:
    lghi    %r2, 0          /* exit(0) */
    svc     1

add_two:
    aghi    %r3, 2
    br      %r14

    .data
msg:
    .ascii  "ok\n"
