//! While the in-process recorder owns SIGTRAP, the program's own SIGTRAP
//! handling must not take it away: these definitions of `sigaction`,
//! `signal`, `sigprocmask` and `pthread_sigmask` take precedence over
//! libc's for the program (it links libitrace, or preloads it) and
//! - keep the recorder's handler installed, recording the program's handler
//!   as the one SIGTRAPs that are not steps are passed to;
//! - keep SIGTRAP unblocked (a blocked synchronous SIGTRAP would kill the
//!   thread), remembering nothing: the program simply never has it blocked
//!   while a region can run.
//!
//! Before the recorder is installed (no region yet, or not under itrace),
//! every call goes straight to libc's function (found with
//! `dlsym(RTLD_NEXT)`). Programs that make the system calls directly are
//! not covered.

use crate::inproc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// libc's definition of `name`, cached in `slot`.
fn real(slot: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let f = slot.load(Ordering::Acquire);
    if f != 0 {
        return f;
    }
    // SAFETY: dlsym with a valid NUL-terminated name; RTLD_NEXT finds the next definition
    // after this library (libc's).
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    slot.store(f, Ordering::Release);
    f
}

/// `sigaction(2)`: SIGTRAP goes to the recorder's chain while it is installed.
///
/// # Safety
/// As libc's `sigaction`: `act` and `old` are null or valid.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    if sig == libc::SIGTRAP {
        if let Some(prev) = inproc::chained_sigtrap() {
            // SAFETY: `prev` is the recorder's saved disposition; act/old are the caller's.
            unsafe {
                if !old.is_null() {
                    *old = *prev;
                }
                if !act.is_null() {
                    *prev = *act;
                }
            }
            return 0;
        }
    }
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let f = real(&REAL, c"sigaction");
    if f == 0 {
        // SAFETY: setting errno for our caller.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: libc's sigaction, with the caller's arguments.
    let f: unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int =
        unsafe { std::mem::transmute(f) };
    unsafe { f(sig, act, old) }
}

/// libc's own `sigaction`, bypassing the recorder (to restore a default disposition).
pub(crate) fn real_sigaction(sig: libc::c_int, act: &libc::sigaction) -> bool {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let f = real(&REAL, c"sigaction");
    if f == 0 {
        return false;
    }
    // SAFETY: libc's sigaction with a valid action and no old-action pointer.
    let f: unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int =
        unsafe { std::mem::transmute(f) };
    unsafe { f(sig, act, std::ptr::null_mut()) == 0 }
}

/// `signal(3)`: as `sigaction` for SIGTRAP while the recorder is installed.
///
/// # Safety
/// As libc's `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if sig == libc::SIGTRAP {
        if let Some(prev) = inproc::chained_sigtrap() {
            // SAFETY: `prev` is the recorder's saved disposition.
            let old = unsafe { (*prev).sa_sigaction };
            unsafe {
                (*prev).sa_sigaction = handler;
                (*prev).sa_flags = libc::SA_RESTART;
            }
            return old;
        }
    }
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let f = real(&REAL, c"signal");
    if f == 0 {
        return libc::SIG_ERR;
    }
    // SAFETY: libc's signal, with the caller's arguments.
    let f: unsafe extern "C" fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t =
        unsafe { std::mem::transmute(f) };
    unsafe { f(sig, handler) }
}

/// A copy of `set` without SIGTRAP when the recorder is installed and `how` would block it.
unsafe fn without_sigtrap(
    how: libc::c_int,
    set: *const libc::sigset_t,
    copy: &mut libc::sigset_t,
) -> *const libc::sigset_t {
    if set.is_null() || how == libc::SIG_UNBLOCK || inproc::chained_sigtrap().is_none() {
        return set;
    }
    // SAFETY: `set` is the caller's valid set; `copy` is ours.
    unsafe {
        *copy = *set;
        libc::sigdelset(copy, libc::SIGTRAP);
    }
    copy
}

/// Call libc's mask function `name` (sigprocmask or pthread_sigmask, same signature) with the
/// caller's arguments, SIGTRAP taken out of `set`; `missing` is returned if libc lacks it.
unsafe fn forward_mask(
    slot: &AtomicUsize,
    name: &std::ffi::CStr,
    missing: libc::c_int,
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    let mut copy: libc::sigset_t = unsafe { std::mem::zeroed() };
    let set = unsafe { without_sigtrap(how, set, &mut copy) };
    let f = real(slot, name);
    if f == 0 {
        return missing;
    }
    // SAFETY: libc's function of this signature, with the caller's (possibly filtered) arguments.
    let f: unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int =
        unsafe { std::mem::transmute(f) };
    unsafe { f(how, set, old) }
}

/// `sigprocmask(2)`: never blocks SIGTRAP while the recorder is installed.
///
/// # Safety
/// As libc's `sigprocmask`.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: the caller's arguments, as for libc's sigprocmask.
    unsafe { forward_mask(&REAL, c"sigprocmask", -1, how, set, old) }
}

/// `pthread_sigmask(3)`: never blocks SIGTRAP while the recorder is installed.
///
/// # Safety
/// As libc's `pthread_sigmask`.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: the caller's arguments, as for libc's pthread_sigmask.
    unsafe { forward_mask(&REAL, c"pthread_sigmask", libc::ENOSYS, how, set, old) }
}
