/*
 * branches.S - freestanding program exercising every kind of user-space
 * control transfer once or a few times:
 *
 *   - direct call / ret
 *   - indirect call through a register and through memory
 *   - indirect jmp through a register
 *   - a jump table (jmp *table(,%rdi,8)) reached 5 times (4 cases + default)
 *   - conditional branches taken and not taken, forward and backward
 *   - jmp and call to the very next instruction (taken branches although
 *     the next pc is pc + length)
 *   - the `loop` instruction
 *   - `rep movsb` of 13 bytes (one instruction, 13 iterations) and a
 *     `rep movsb` with %rcx = 0 (one instruction, no iteration)
 *   - a `write` system call (returns to user space) and the `exit` call.
 *
 * Prints "branches: ok!\n" (copied with rep movsb) and exits 0; exits 1
 * if any check fails.
 *
 * Hand count (instructions executed, in order):
 *   call leaf, leaf (mov, ret)                                  1 + 2
 *   lea, call *%rax, leaf                                       2 + 2
 *   call *fptr, leaf                                            1 + 2
 *   lea, jmp *%rdx                                              2
 *   xor, xor                                                    2
 *   5 x (mov, call, add, inc, cmp, jb)                          30
 *   dispatch: 4 x (cmp, ja, mov, jmp*, mov, ret) + default 4   28
 *   cmp, jne | mov, cmp, je | jmp | call | pop, mov             2 + 3 + 1 + 1 + 2
 *   loop x 3                                                    3
 *   cld, lea, lea, mov, rep movsb | xor, rep movsb              5 + 2
 *   movb, mov, mov, lea, mov, syscall | cmp, jne                6 + 2
 *   mov, xor, syscall                                           3
 *   total                                                       102 instructions
 * Blocks: 7 (calls, rets, jmp *%rdx) + 19 (table loop: 5 calls,
 * 4 jmp* + 1 ja, 5 rets, 4 jb) + je + jmp + call + 2 loop + 2 syscalls
 * = 33 blocks (the write syscall also gets a K line).
 * qemu logs 114 lines: the 13-byte rep movsb appears 13 times.
 */
    .text
    .globl _start
    .type _start, @function
_start:
    /* direct call / ret */
    call leaf
    /* indirect call through a register */
    lea leaf(%rip), %rax
    call *%rax
    /* indirect call through memory */
    call *fptr(%rip)
    /* indirect jmp through a register */
    lea .Lafter_jmp(%rip), %rdx
    jmp *%rdx
    ud2
.Lafter_jmp:
    /* jump table: dispatch(0) .. dispatch(4); 4 is the default case */
    xor %ebx, %ebx
    xor %r12d, %r12d
.Ltable_loop:
    mov %ebx, %edi
    call dispatch
    add %eax, %r12d
    inc %ebx
    cmp $5, %ebx
    jb .Ltable_loop             /* taken 4 times, not taken once */
    cmp $(10 + 11 + 12 + 13 + 99), %r12d
    jne .Lbad                   /* not taken */
    /* conditional forward branch taken */
    mov $5, %eax
    cmp $5, %eax
    je .Lok1                    /* taken */
    jmp .Lbad
.Lok1:
    /* jmp to the next instruction (encoded eb 00) */
    jmp .Lnext
.Lnext:
    /* call to the next instruction */
    call .Lnext2
.Lnext2:
    pop %rax
    /* the loop instruction: taken twice, then falls through */
    mov $3, %ecx
.Lloopi:
    loop .Lloopi
    /* rep movsb of 13 bytes, then a rep movsb with nothing to do */
    cld
    lea msg(%rip), %rsi
    lea buf(%rip), %rdi
    mov $13, %ecx
    rep movsb
    xor %ecx, %ecx
    rep movsb
    /* write(1, buf, 14) */
    movb $'\n', buf+13(%rip)
    mov $1, %eax
    mov $1, %edi
    lea buf(%rip), %rsi
    mov $14, %edx
    syscall
    cmp $14, %rax
    jne .Lbad                   /* not taken */
    mov $60, %eax
    xor %edi, %edi
    syscall
.Lbad:
    mov $60, %eax
    mov $1, %edi
    syscall
    .size _start, .-_start

    .globl leaf
    .type leaf, @function
leaf:
    mov $1, %eax
    ret
    .size leaf, .-leaf

    .globl dispatch
    .type dispatch, @function
dispatch:                       /* %edi = case number; returns a value */
    cmp $3, %edi
    ja .Ldefault
    mov %edi, %edi
    jmp *.Ljump_table(,%rdi,8)
.Lcase0:
    mov $10, %eax
    ret
.Lcase1:
    mov $11, %eax
    ret
.Lcase2:
    mov $12, %eax
    ret
.Lcase3:
    mov $13, %eax
    ret
.Ldefault:
    mov $99, %eax
    ret
    .size dispatch, .-dispatch

    .section .rodata
    .balign 8
.Ljump_table:
    .quad .Lcase0, .Lcase1, .Lcase2, .Lcase3
msg:
    .ascii "branches: ok!"

    .data
    .balign 8
fptr:
    .quad leaf

    .bss
buf:
    .space 16

    .section .note.GNU-stack,"",@progbits
