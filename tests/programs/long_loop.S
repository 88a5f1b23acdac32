/*
 * long_loop.S - freestanding program with about 200,000 taken branches, for
 * the buffer-mode tests (normal / wrap / continuous).
 *
 * for (ebx = 1000; ebx != 0; ebx--) inner(196 + (ebx & 7));
 * write(1, "long_loop: done\n", 16); exit(0);
 *
 * inner(k) runs a two-instruction loop k times.  The varying k makes the
 * blocks differ from one outer iteration to the next, so a wrapped trace
 * can be placed unambiguously at the end of the full sequence.
 *
 * Hand count:
 *   sum over ebx = 1..1000 of (ebx & 7) = 125 * (0+1+...+7) = 3500
 *   K = sum of k = 196 * 1000 + 3500 = 199500 inner iterations
 *   per outer iteration: call + (mov, and, add) + 2k + ret + dec + jnz
 *                      = 7 + 2k
 *   total = 1 (mov $1000) + 7 * 1000 + 2K + 5 (write) + 3 (exit)
 *         = 1 + 7000 + 399000 + 8 = 406009 instructions
 *   taken branches: 1000 calls + (K - 1000) inner jnz + 1000 rets
 *                   + 999 outer jnz = 201499, plus 2 syscalls = 201501 blocks
 */
    .text
    .globl _start
    .type _start, @function
_start:
    mov $1000, %ebx             /* 1 */
.Louter:
    call inner                  /* 1000 */
    dec %ebx                    /* 1000 */
    jnz .Louter                 /* 1000, taken 999 times */
    mov $1, %eax                /* SYS_write */
    mov $1, %edi                /* stdout */
    lea msg(%rip), %rsi
    mov $16, %edx
    syscall
    mov $60, %eax               /* SYS_exit */
    xor %edi, %edi
    syscall
    .size _start, .-_start

    .globl inner
    .type inner, @function
inner:                          /* loops 196 + (ebx & 7) times */
    mov %ebx, %ecx
    and $7, %ecx
    add $196, %ecx
.Linner:
    dec %ecx
    jnz .Linner
    ret
    .size inner, .-inner

    .section .rodata
msg:
    .ascii "long_loop: done\n"

    /* a writable segment: valgrind 3.19 reads the symbols of a static
     * executable only when it has one */
    .data
    .balign 8
scratch:
    .quad 0

    .section .note.GNU-stack,"",@progbits
