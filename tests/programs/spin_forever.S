/*
 * spin_forever.S - freestanding: a taken branch every two instructions,
 * forever (until killed), for the test that SIGKILL of itrace loses at most
 * about the last second of the trace.
 */
    .text
    .globl _start
    .type _start, @function
_start:
    xor %eax, %eax
.Lspin:
    inc %rax
    jmp .Lspin
    .size _start, .-_start

    .section .note.GNU-stack,"",@progbits
