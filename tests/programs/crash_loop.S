/*
 * crash_loop.S - freestanding: a counted loop, then a store through NULL
 * (SIGSEGV), for the test that a crashing program's trace ends at its crash.
 *
 * Hand count:
 *   mov $1000, %ecx           1
 *   loop: dec, jnz            2 * 1000, jnz taken 999 times
 *   xor %eax, %eax            1
 *   mov %eax, (%rax)          faults: not executed
 *   = 2002 instructions executed, 999 taken branches, then SIGSEGV.
 */
    .text
    .globl _start
    .type _start, @function
_start:
    mov $1000, %ecx
.Lloop:
    dec %ecx
    jnz .Lloop
    xor %eax, %eax
    mov %eax, (%rax)
    .size _start, .-_start

    .section .note.GNU-stack,"",@progbits
