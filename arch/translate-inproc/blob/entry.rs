//! The blob itrace maps into a traced process (built by `itrace-arch`'s build script as a
//! static position-independent executable with no C library): its entry point encodes a ring.
//! See `src/lib.rs`.

#![no_std]
#![no_main]

/// The entry point (the ELF's): [`itrace_translate_inproc::encode_ring_at`].
///
/// # Safety
/// As there.
#[no_mangle]
pub unsafe extern "C" fn itrace_encode_ring(args: *mut itrace_translate_inproc::RingArgs) -> u64 {
    // SAFETY: the caller (the cache's ring-full path, or itrace's test) passes valid arguments.
    unsafe { itrace_translate_inproc::encode_ring_at(&mut *args) }
}

/// The ring-full path's call (`block`: the thread's state block):
/// [`itrace_translate_inproc::self_encode`].
///
/// # Safety
/// As there.
#[no_mangle]
pub unsafe extern "C" fn itrace_self_encode(block: *mut u8) -> u64 {
    // SAFETY: the routine passes the calling thread's own state block.
    unsafe { itrace_translate_inproc::self_encode(block) }
}

/// A panic (an exit table that is not one) stops the thread with SIGILL at a known place,
/// where itrace takes the ring back; it never returns into the program with a half-made chunk.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {
        // SAFETY: ud2 only raises #UD.
        unsafe { core::arch::asm!("ud2") };
    }
}

/// The compiler's calls for copies and fills (there is no C library to give them).
#[no_mangle]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the compiler calls it with valid, non-overlapping regions; `rep movsb` copies n
    // bytes forward.
    unsafe {
        core::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dest => _, inout("rsi") src => _, options(nostack, preserves_flags));
    }
    dest
}

#[no_mangle]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // SAFETY: dest does not start inside [src, src + n): a forward copy reads each byte
        // before it is written over.
        return unsafe { memcpy(dest, src, n) };
    }
    // SAFETY: backwards, with the direction flag set and cleared again, for overlapping regions
    // where dest is above src.
    unsafe {
        core::arch::asm!("std", "rep movsb", "cld", inout("rcx") n => _, inout("rdi") dest.add(n - 1) => _, inout("rsi") src.add(n - 1) => _, options(nostack));
    }
    dest
}

#[no_mangle]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the compiler calls it with a valid region of n bytes.
    unsafe {
        core::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dest => _, in("al") c as u8, options(nostack, preserves_flags));
    }
    dest
}

#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: the compiler calls it with two regions valid for n bytes. Volatile reads, so
        // that the loop is not made into a call of memcmp again.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return x as i32 - y as i32;
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: as memcmp.
    unsafe { memcmp(a, b, n) }
}

/// The prebuilt `core` is compiled to unwind and names this; nothing unwinds here (panics trap),
/// so it is never called.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}
