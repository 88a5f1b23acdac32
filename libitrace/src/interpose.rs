//! While the in-process recorder owns SIGTRAP, the program's own SIGTRAP
//! handling must not take it away: these definitions of `sigaction`,
//! `signal`, `sigprocmask` and `pthread_sigmask` take precedence over
//! libc's for the program (it links libitrace, or preloads it) and
//! - keep the recorder's handler installed, recording the program's handler
//!   as the one SIGTRAPs that are not steps are passed to (in
//!   [`crate::sigchain`]);
//! - keep SIGTRAP unblocked (a blocked synchronous SIGTRAP would kill the
//!   thread), remembering nothing: the program simply never has it blocked
//!   while a region can run.
//!
//! Before the recorder is installed (no region yet, or not under itrace),
//! every call goes straight to libc's function ([`crate::real`]). Programs that make the system calls directly are
//! not covered.

use crate::{real, sigchain};

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
        let chained = sigchain::with_program_disposition(|prev| {
            if !old.is_null() {
                // SAFETY: the caller's `old`, not null, so valid for writes (this function's contract).
                unsafe { *old = *prev };
            }
            if !act.is_null() {
                // SAFETY: the caller's `act`, not null, so valid for reads (this function's contract).
                *prev = unsafe { *act };
            }
        });
        if chained.is_some() {
            return 0;
        }
    }
    let Some(f) = real::SIGACTION.get() else {
        // SAFETY: __errno_location points to this thread's errno; set for our caller.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    };
    // SAFETY: libc's sigaction, with the caller's arguments (valid by this function's contract).
    unsafe { f(sig, act, old) }
}

/// `signal(3)`: as `sigaction` for SIGTRAP while the recorder is installed.
///
/// # Safety
/// As libc's `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if sig == libc::SIGTRAP {
        let chained = sigchain::with_program_disposition(|prev| {
            let old = prev.sa_sigaction;
            prev.sa_sigaction = handler;
            prev.sa_flags = libc::SA_RESTART;
            old
        });
        if let Some(old) = chained {
            return old;
        }
    }
    let Some(f) = real::SIGNAL.get() else { return libc::SIG_ERR };
    // SAFETY: libc's signal, with the caller's arguments.
    unsafe { f(sig, handler) }
}

/// Call libc's mask function `real` (sigprocmask or pthread_sigmask) with the caller's
/// arguments, SIGTRAP taken out of `set` when the recorder is installed and `how` would block
/// it; `missing` is returned if libc lacks the function.
///
/// # Safety
/// As libc's `sigprocmask`: `set` and `old` are null or valid.
unsafe fn forward_mask(
    real: &real::Next<real::SigmaskFn>,
    missing: libc::c_int,
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    let mut copy: libc::sigset_t;
    let set = if set.is_null() || how == libc::SIG_UNBLOCK || !sigchain::owned() {
        set
    } else {
        // SAFETY: the caller's `set`, not null, so valid for reads (this function's contract).
        copy = unsafe { *set };
        // SAFETY: `copy` is a valid set of ours.
        unsafe { libc::sigdelset(&mut copy, libc::SIGTRAP) };
        &copy
    };
    let Some(f) = real.get() else { return missing };
    // SAFETY: libc's function of this prototype, with the caller's (possibly filtered) arguments.
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
    // SAFETY: the caller's arguments, valid as for libc's sigprocmask.
    unsafe { forward_mask(&real::SIGPROCMASK, -1, how, set, old) }
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
    // SAFETY: the caller's arguments, valid as for libc's pthread_sigmask.
    unsafe { forward_mask(&real::PTHREAD_SIGMASK, libc::ENOSYS, how, set, old) }
}
