/* Freestanding 32-bit x86 test program: a loop, a call and return, an
 * indirect branch, a conditional branch taken and not taken, a write system
 * call and exit, both through int $0x80.
 *
 * Hand count of executed instructions:
 *   _start prologue  mov, xor                                  2
 *   loop x5          inc, call, [add_two: add, ret], dec, jnz  6 x 5 = 30
 *                    (jnz taken 4 times, falls through once)
 *   indirect         mov, jmp *%eax                            2
 *   target           cmp, je (not taken)                       2
 *   write            mov, mov, mov, mov, int $0x80             5
 *   skip             mov, xor, int $0x80 (exit)                3
 *                                                      total  44
 * Taken branches (blocks): 5 call, 5 ret, 4 jnz, 1 jmp, 1 int write, 1 int exit = 17.
 */
    .text
    .globl  _start
    .type   _start,@function
_start:
    mov     $5, %ecx
    xor     %esi, %esi
.Lloop:
    inc     %esi
    call    add_two
    dec     %ecx
    jnz     .Lloop
    mov     $target, %eax
    jmp     *%eax
    nop                     /* never executed */
target:
    cmp     $100, %esi
    je      skip
    mov     $4, %eax        /* write(1, msg, 3) */
    mov     $1, %ebx
    mov     $msg, %ecx
    mov     $3, %edx
    int     $0x80
skip:
    mov     $1, %eax        /* exit(0) */
    xor     %ebx, %ebx
    int     $0x80

add_two:
    add     $2, %esi
    ret

    .data
msg:
    .ascii  "ok\n"
