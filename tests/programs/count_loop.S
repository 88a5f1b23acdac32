/*
 * count_loop.S - freestanding program with an instruction count worked out
 * by hand.  Built with: gcc -nostdlib -static -no-pie
 *
 * _start sums N, N-1, ..., 1 (N = 1000) in a loop, calls `check`, which
 * returns 0 when the sum is N*(N+1)/2 = 500500, and exits with that value.
 *
 * Instruction count (every instruction is marked with how often it runs):
 *
 *   _start:  mov, xor                          2
 *   loop:    add, dec, jnz                 3 * N  = 3000  (jnz taken N-1 times)
 *            mov, call                          2
 *   check:   xor, cmp, je (taken), ret          4         (mov $1 skipped)
 *            mov, mov, syscall                  3
 *                                          -----
 *   total  = 3N + 11                        = 3011 instructions
 *
 * Taken branches: N-1 (jnz) + call + je + ret = N+2 = 1002, plus the exit
 * syscall (a kernel transition, an INTRPT block) = 1003 blocks.
 *
 * Blocks (what `itrace arc` prints as U lines, in order):
 *   _start+0        5  JUMP      mov xor add dec jnz
 *   _start+0x7      3  JUMP      x 998 (iterations 2 .. N-1)
 *   _start+0x7      5  CALL      last iteration: add dec jnz(not taken) mov call
 *   check+0         3  JUMP      xor cmp je
 *   check+0xf       1  RETURN    ret
 *   _start+0x14     3  INTRPT    mov mov syscall   (exit: no return to user space)
 * (Offsets follow from the encodings: mov $imm32,%ecx is 5 bytes, xor 2,
 * add 2, dec 2, jnz 2, mov 2, call 5; cmp $imm32,%edi 6, je 2, mov 5.)
 */
    .text
    .globl _start
    .type _start, @function
_start:
    mov $1000, %ecx             /* 1 */
    xor %eax, %eax              /* 1 */
.Lloop:
    add %ecx, %eax              /* N */
    dec %ecx                    /* N */
    jnz .Lloop                  /* N, taken N-1 times */
    mov %eax, %edi              /* 1 */
    call check                  /* 1 */
    mov %eax, %edi              /* 1: exit status = check's result */
    mov $60, %eax               /* 1: SYS_exit */
    syscall                     /* 1 */
    .size _start, .-_start

    .globl check
    .type check, @function
check:                          /* %edi = sum; returns 0 when it is right */
    xor %eax, %eax              /* 1 */
    cmp $500500, %edi           /* 1 */
    je 1f                       /* 1, taken */
    mov $1, %eax                /* 0 */
1:  ret                         /* 1 */
    .size check, .-check

    /* a writable segment: valgrind 3.19 reads the symbols of a static
     * executable only when it has one */
    .data
    .balign 8
scratch:
    .quad 0

    .section .note.GNU-stack,"",@progbits
