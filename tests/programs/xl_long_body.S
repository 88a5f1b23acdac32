/*
 * xl_long_body.S - freestanding loop whose body is longer than a translated unit may be
 * (unit::MAX_UNIT_INSNS, 256): each pass leaves two records of no branch (the size limit)
 * before its taken jnz, so the translating recorder's rings fill (65,536 records each) in the
 * middle of a pass, and a ring ends with records whose counts carry into the next ring
 * (tests/tests/translate.rs, records_of_no_branch_across_full_rings).
 *
 * for (ebx = 50000; ebx != 0; ebx--) { 600 nops }; exit(0)
 *
 * Hand count:
 *   mov $50000                                  1
 *   per pass: 600 nops, dec, jnz              602   (x 50,000 = 30,100,000)
 *   mov $60, xor, syscall (exit)                3
 *   total                               30,100,004 instructions
 *   taken branches: 49,999 jnz (the first after 603 instructions, the mov with
 *   its pass; each other after 602), then the exit syscall (an INTRPT block)
 *   after the last pass's 602 and the exit's 3: 605.
 *   Records: 3 a pass (the units of a pass: 256, 256 and 90 instructions),
 *   150,000 in all: more than two full rings.
 */
    .text
    .globl _start
    .type _start, @function
_start:
    mov $50000, %ebx            /* 1 */
.Lpass:
    .rept 600
    nop
    .endr                       /* 600 a pass */
    dec %ebx                    /* 1 a pass */
    jnz .Lpass                  /* 1 a pass, taken 49,999 times */
    mov $60, %eax               /* 1: SYS_exit */
    xor %edi, %edi              /* 1 */
    syscall                     /* 1 */
    .size _start, .-_start

    /* a writable segment: valgrind reads the symbols of a static executable only when it
     * has one */
    .data
    .long 0
