//! libc's own definitions of the functions [`crate::interpose`] replaces: found with
//! `dlsym(RTLD_NEXT)` (the next definition after this library's, libc's) at their first use,
//! and kept.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `sigaction(2)`.
pub(crate) type SigactionFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;
/// `signal(3)`.
pub(crate) type SignalFn = unsafe extern "C" fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
/// `sigprocmask(2)` and `pthread_sigmask(3)`.
pub(crate) type SigmaskFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;

// SAFETY: each type above is the C prototype of the libc function named.
pub(crate) static SIGACTION: Next<SigactionFn> = unsafe { Next::new(c"sigaction") };
// SAFETY: as above.
pub(crate) static SIGNAL: Next<SignalFn> = unsafe { Next::new(c"signal") };
// SAFETY: as above.
pub(crate) static SIGPROCMASK: Next<SigmaskFn> = unsafe { Next::new(c"sigprocmask") };
// SAFETY: as above.
pub(crate) static PTHREAD_SIGMASK: Next<SigmaskFn> = unsafe { Next::new(c"pthread_sigmask") };

/// The next definition of the C function `name`, as a function pointer of type `F`.
pub(crate) struct Next<F> {
    name: &'static CStr,
    /// Its address once found (0: not yet, or not there).
    addr: AtomicUsize,
    _type: PhantomData<F>,
}

impl<F: Copy> Next<F> {
    /// # Safety
    /// `F` must be an `unsafe extern "C" fn` pointer type with the C prototype of `name`.
    pub(crate) const unsafe fn new(name: &'static CStr) -> Self {
        Next { name, addr: AtomicUsize::new(0), _type: PhantomData }
    }

    /// The function, or `None` when the dynamic linker finds none (looked up again next time).
    pub(crate) fn get(&self) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
        let mut f = self.addr.load(Ordering::Acquire);
        if f == 0 {
            // SAFETY: dlsym with a valid NUL-terminated name; RTLD_NEXT finds the next definition
            // after this library (libc's).
            f = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
            self.addr.store(f, Ordering::Release);
        }
        // SAFETY: `f` is the non-null address of the function `name`, and `F` is a function
        // pointer type of its prototype (the contract of `new`), the size of an address (checked
        // above).
        (f != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&f) })
    }
}

/// libc's `sigaction` for `sig`, bypassing the recorder (to restore a default disposition);
/// whether it succeeded.
pub(crate) fn sigaction(sig: libc::c_int, act: &libc::sigaction) -> bool {
    let Some(f) = SIGACTION.get() else { return false };
    // SAFETY: libc's sigaction with a valid action and no old-action pointer.
    unsafe { f(sig, act, std::ptr::null_mut()) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_functions_and_calls_them() {
        let f = PTHREAD_SIGMASK.get().expect("libc has pthread_sigmask");
        // SAFETY: an all-zero sigset_t is a valid (empty) set.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: libc's pthread_sigmask, reading the mask only.
        assert_eq!(unsafe { f(libc::SIG_BLOCK, std::ptr::null(), &mut old) }, 0);
        assert!(SIGACTION.get().is_some() && SIGNAL.get().is_some() && SIGPROCMASK.get().is_some());
    }

    #[test]
    fn a_missing_function_is_none() {
        // SAFETY: never called.
        let missing: Next<SignalFn> = unsafe { Next::new(c"itrace_no_such_function") };
        assert!(missing.get().is_none());
    }
}
