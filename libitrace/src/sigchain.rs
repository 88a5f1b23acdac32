//! The SIGTRAP chain: once the in-process recorder ([`crate::inproc`]) owns SIGTRAP, the
//! program's own SIGTRAP disposition lives here, not in the kernel.
//!
//! - The recorder installs its handler with [`take_over`], which keeps the disposition the
//!   program had, and passes every SIGTRAP that is not one of its steps on with [`forward`].
//! - The interposed libc functions ([`crate::interpose`]) read and change that disposition
//!   instead of the kernel's ([`with_program_disposition`]), and keep SIGTRAP unblocked while
//!   the recorder owns it ([`owned`]).
//!
//! Before [`take_over`] (no region yet, or not under itrace) nothing is kept here, and the
//! interposed functions go straight to libc.

use std::sync::atomic::{AtomicPtr, Ordering};

/// The program's own SIGTRAP disposition since the recorder took SIGTRAP over (null before).
/// Leaked on purpose: the recorder's handler may forward to it for the life of the process.
static PROGRAM: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

/// An `SA_SIGINFO` signal handler.
pub(crate) type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Install `handler` for SIGTRAP, keeping the program's disposition to forward to; whether it
/// was installed.
pub(crate) fn take_over(handler: Handler) -> bool {
    // SAFETY: a zeroed sigaction is a valid value (SIG_DFL, no flags, empty mask).
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: `sa_mask` is a valid sigset to initialise.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    // SAFETY: as above, a valid place for sigaction to write the old disposition to.
    let old = Box::into_raw(Box::new(unsafe { std::mem::zeroed::<libc::sigaction>() }));
    // SAFETY: a fully initialised action and a valid old-action pointer. Not owned yet, so this
    // goes through `interpose::sigaction` to libc's.
    if unsafe { libc::sigaction(libc::SIGTRAP, &sa, old) } != 0 {
        return false;
    }
    PROGRAM.store(old, Ordering::Release);
    true
}

/// Whether the recorder owns SIGTRAP (its handler is installed; the program's is kept here).
pub(crate) fn owned() -> bool {
    !PROGRAM.load(Ordering::Acquire).is_null()
}

/// `f` on the program's SIGTRAP disposition (to read or change it) once the recorder owns
/// SIGTRAP; `None` before.
///
/// The program's own `sigaction`/`signal` calls for SIGTRAP come here; like libc's, they are
/// not meant to race with each other.
pub(crate) fn with_program_disposition<R>(f: impl FnOnce(&mut libc::sigaction) -> R) -> Option<R> {
    let p = PROGRAM.load(Ordering::Acquire);
    // SAFETY: non-null, `p` is the leaked box of `take_over`, never freed or moved. The recorder's
    // handler only reads it for a SIGTRAP that is not a step, which cannot arrive inside `f`.
    (!p.is_null()).then(|| f(unsafe { &mut *p }))
}

/// Pass a SIGTRAP that is not a step of the recorder's to the disposition the program has.
pub(crate) fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = PROGRAM.load(Ordering::Acquire);
    if prev.is_null() {
        return;
    }
    // SAFETY: the leaked box of `take_over`, never freed.
    let prev = unsafe { &*prev };
    match prev.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // Say why, so a SIGTRAP the recorder did not take for a step can be told from the
            // program's own (write(2) is async-signal-safe; nothing here allocates).
            // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
            let code = if info.is_null() { 0 } else { unsafe { (*info).si_code } };
            let mut line = [0u8; 96];
            let mut len = 0;
            let mut put = |bytes: &[u8]| {
                line[len..len + bytes.len()].copy_from_slice(bytes);
                len += bytes.len();
            };
            put(b"libitrace: a SIGTRAP that is not a step (si_code ");
            if code < 0 {
                put(b"-");
            }
            let (mut digits, mut at, mut n) = ([0u8; 10], 10, code.unsigned_abs());
            loop {
                at -= 1;
                digits[at] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            put(&digits[at..]);
            put(b"): the program's default action\n");
            // SAFETY: writing our own buffer, its length, to stderr.
            unsafe { libc::write(2, line.as_ptr().cast(), len) };
            // Default action: die of SIGTRAP as the program would have (libc's sigaction: ours
            // would only record the request).
            // SAFETY: a zeroed sigaction is SIG_DFL with no flags and an empty mask.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            crate::real::sigaction(sig, &dfl);
            // SAFETY: raise has no preconditions.
            unsafe { libc::raise(sig) };
        }
        h if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the program installed this handler with SA_SIGINFO, for these arguments.
            let f: Handler = unsafe { std::mem::transmute::<usize, Handler>(h) };
            f(sig, info, ctx);
        }
        h => {
            // SAFETY: a plain handler, taking the signal number.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(h) };
            f(sig);
        }
    }
}
