/*
 * straight_line.S - freestanding program whose one taken branch comes after
 * more instructions than a branch of the qemu plugin's hand-over holds in
 * its 16 bits (65,535): the plugin must carry it whole, count exact.
 *
 * Hand count:
 *   70,000 nops, then jmp (taken)      70,001   (qemu cuts them into blocks
 *                                               of at most 512 that fall through)
 *   mov $60, xor, syscall (exit)            3
 *   total                              70,004 instructions
 *   taken branches: the jmp, plus the exit syscall (an INTRPT block) = 2 blocks
 */
    .text
    .globl _start
    .type _start, @function
_start:
    .rept 70000
    nop
    .endr
    jmp .Lexit                  /* 1, taken */
    ud2                         /* never runs */
.Lexit:
    mov $60, %eax               /* 1 */
    xor %edi, %edi              /* 1 */
    syscall                     /* 1 */
