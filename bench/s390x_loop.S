/* Freestanding s390x benchmark loop (bench/s390x.sh, s390x-guest/): ITERATIONS iterations of a
 * call, a few arithmetic instructions and a data-dependent conditional branch, then exit(0).
 * With any argument it loops until killed (the attach test). */
    .set ITERATIONS, 5000
    .text
    .globl _start
    .type _start,@function
_start:
    lg      %r5, 0(%r15)        /* argc */
    lgfi    %r2, ITERATIONS
    cghi    %r5, 1
    je      .Lgo
    llilh   %r2, 0x7fff         /* "forever" */
.Lgo:
    lghi    %r4, 0
.Lloop:
    brasl   %r14, step
    brctg   %r2, .Lloop
    lghi    %r2, 0              /* exit(0) */
    svc     1

/* r4 = r4 * 5 + 1, plus 7 when the result is odd. */
    .type   step,@function
step:
    mghi    %r4, 5
    aghi    %r4, 1
    tmll    %r4, 1
    je      .Leven
    aghi    %r4, 7
.Leven:
    br      %r14
