/* Freestanding s390x test program (the native s390x recorder, s390x-guest/): execute
 * instructions and compare-and-branch right before system calls.
 * - `exrl` of a plain instruction (aghi), of one whose length byte comes from R1 (mvc), of an
 *   unconditional jump and of a conditional one (taken, then not), and `ex` with its address in
 *   a register: each runs its instruction out of line (two instructions; a branch it runs is
 *   taken at the execute's address, relative to the executed instruction's own address);
 * - compare-and-branch and branch-on-count immediately before `svc`, taken and not taken;
 * - an execute instruction first in a block whose path holds a conditional branch and then an
 *   `svc` (the recorder must not single-step it).
 * Hand count: 59 instructions (an execute counts two), 14 blocks.
 * Checked against qemu-s390x's log block for block (tests/tests/s390x_native.rs). */
    .text
    .globl  _start
    .type   _start,@function
_start:
    lghi    %r6, 3              /* iterations; r3 = 3, 6, 9 after each */
    lghi    %r3, 0
    larl    %r9, .Lagh1
    larl    %r4, dst
    larl    %r5, src
.Lloop:
    exrl    %r0, .Laghi         /* r3 += 2, out of line */
    lghi    %r1, 2
    exrl    %r1, .Lmvc          /* mvc 0(3,%r4),0(%r5): the length from r1's low byte */
    ex      %r0, 0(%r9)         /* r3 += 1, out of line, the address in r9 */
    exrl    %r0, .Lj            /* j .Lback, out of line */
    nopr    %r7                 /* never runs */
.Lback:
    cghi    %r3, 6
    exrl    %r0, .Ljne          /* jne .Lnext: taken unless r3 = 6 (the second iteration) */
    cije    %r3, 7, .Lbad       /* never taken: r3 is 3, 6, 9 */
.Lnext:
    cijl    %r3, 4, .Lnocall    /* taken on the first iteration only, right before svc */
    svc     20                  /* getpid */
.Lnocall:
    brctg   %r6, .Lloop
    lghi    %r7, 2
    brct    %r7, .Lonce         /* taken once, right before svc */
    svc     20
.Lonce:
    j       .Lexsvc
    nopr    %r7                 /* never runs */
.Lexsvc:
    exrl    %r0, .Laghi         /* r3 = 11; a block's first instruction with a conditional */
    cijl    %r3, 100, .Lexit    /* branch and an svc after it (taken: r3 < 100) */
    svc     20
.Lexit:
    lghi    %r2, 0
    cgijne  %r3, 11, .Lbad      /* not taken (r3 = 11), right before svc */
    svc     1                   /* exit(0) */
.Lbad:
    lghi    %r2, 1
    svc     1

    /* The executed instructions (run only by the execute instructions above). */
.Laghi:
    aghi    %r3, 2
.Lagh1:
    aghi    %r3, 1
.Lmvc:
    mvc     0(1,%r4), 0(%r5)
.Lj:
    j       .Lback
.Ljne:
    jne     .Lnext

    .data
src:
    .ascii  "abc"
dst:
    .space  8
