/*
 * xl_ahead.S - freestanding program whose translation stops are counted by hand
 * (tests/tests/translate.rs, translation ahead). Its code, one read-only mapping:
 *
 *   _start: getpid            the thread first enters the cache here; it leaves
 *                             before the syscall (a leave), stepped
 *   U0  call f1               entered again after the syscall, with its state block
 *   U1  call f2               (.Lr1, where f1 returns)
 *   U2  jmp .Lexit            (.Lr2, where f2 returns)
 *   U3  mov, xor | syscall    exit(0): a leave before its syscall
 *   U4  f1: ret
 *   U5  f2: call f1
 *   U6      ret               (where f1 returns into f2)
 *
 * Units: Ua (_start: mov, then a leave) and U0..U6: 8.
 * Stops with nothing translated ahead: links f1, f2, .Lexit (3); indirect misses
 * at the returns to .Lr1, f2+5 (U6), .Lr2 (3; f2's call to f1 is linked when U5 is
 * made, f1 being there); leaves 2.
 * With translation ahead: U0, made at the second entry, brings U4 (its call's
 * target) and U1 (its return site, put in the thread's lookup table), U1 brings U5
 * and U2 (a return site), U5 brings U6 (a return site; f1 is there), U2 brings U3:
 * 6 units ahead, 3 return addresses in the table, and no link stop nor indirect
 * miss; leaves 2. (Ua's own translation has nothing ahead: it ends in a leave.)
 * Exits 0.
 */
    .text
    .globl _start
    .type _start, @function
_start:
    mov $39, %eax               /* getpid */
    syscall
    call f1
.Lr1:
    call f2
.Lr2:
    jmp .Lexit
    ud2
.Lexit:
    mov $60, %eax               /* exit(0) */
    xor %edi, %edi
    syscall
    ud2

    .type f1, @function
f1:
    ret

    .type f2, @function
f2:
    call f1
    ret
