//! What a program itrace launches inherits: exactly what it would have inherited from the
//! shell that started itrace. itrace changes its own signal dispositions and mask (it catches
//! the stop signals, ignores SIGPIPE and SIGXFSZ, blocks signals around its start-up), and an
//! ignored disposition and the mask survive exec; so the launched program gets the ones itrace
//! itself was started with, taken by [`capture_signals`] before anything changed them, and the
//! environment in itrace's own order.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Whether [`capture_signals`] ran.
static CAPTURED: AtomicBool = AtomicBool::new(false);
/// Bit `n - 1` set: signal `n` was ignored when itrace started.
static IGNORED: AtomicU64 = AtomicU64::new(0);
/// Bit `n - 1` set: signal `n` was blocked when itrace started.
static BLOCKED: AtomicU64 = AtomicU64::new(0);

/// The highest signal number on Linux.
const LAST_SIGNAL: libc::c_int = 64;

/// The signals whose disposition a process can set: not SIGKILL or SIGSTOP (glibc also refuses
/// its own 32 and 33, which a program cannot have ignored through it either).
fn settable(sig: libc::c_int) -> bool {
    sig != libc::SIGKILL && sig != libc::SIGSTOP
}

/// Take note of the signal dispositions (ignored or not) and the signal mask the process was
/// started with. Call it before anything changes them: Rust's runtime ignores SIGPIPE before
/// `main`, so the itrace binary calls this from a constructor (`.init_array`) that runs first.
/// Async-signal-safe, allocates nothing.
pub fn capture_signals() {
    let mut ignored = 0u64;
    let mut blocked = 0u64;
    // SAFETY: sigaction with a null new action only reads the disposition into `old`;
    // sigprocmask with a null set only reads the mask; both are plain system calls on
    // initialised local memory.
    unsafe {
        for sig in 1..=LAST_SIGNAL {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                ignored |= 1 << (sig - 1);
            }
        }
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        if libc::sigprocmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) == 0 {
            for sig in 1..=LAST_SIGNAL {
                if libc::sigismember(&mask, sig) == 1 {
                    blocked |= 1 << (sig - 1);
                }
            }
        }
    }
    IGNORED.store(ignored, Ordering::Relaxed);
    BLOCKED.store(blocked, Ordering::Relaxed);
    CAPTURED.store(true, Ordering::Release);
}

/// Whether `sig` was ignored when the process started (false without [`capture_signals`]).
pub fn was_ignored(sig: libc::c_int) -> bool {
    CAPTURED.load(Ordering::Acquire)
        && (1..=LAST_SIGNAL).contains(&sig)
        && IGNORED.load(Ordering::Relaxed) & (1 << (sig - 1)) != 0
}

/// In a child between fork and exec of a program (or of the qemu that runs it): every signal
/// ignored when itrace started is ignored, every other one has its default disposition (a
/// handler the shell had would have become the default at exec too), and the mask is the one
/// itrace started with. Without [`capture_signals`] (itrace's library used by another
/// program), the signals itrace itself catches, ignores or blocks get the default disposition
/// and are unblocked. Only async-signal-safe calls.
pub fn restore_signals() {
    if !CAPTURED.load(Ordering::Acquire) {
        return restore_itrace_own_signals();
    }
    let (ignored, blocked) = (IGNORED.load(Ordering::Relaxed), BLOCKED.load(Ordering::Relaxed));
    // SAFETY: sigaction, sigemptyset, sigaddset and sigprocmask are async-signal-safe and
    // work on initialised local memory; sigprocmask only changes this (the only) thread's mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        libc::sigemptyset(&mut sa.sa_mask);
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        for sig in (1..=LAST_SIGNAL).filter(|&s| settable(s)) {
            let bit = 1u64 << (sig - 1);
            sa.sa_sigaction = if ignored & bit != 0 { libc::SIG_IGN } else { libc::SIG_DFL };
            // glibc refuses its own signals (32, 33): nothing to do for them.
            libc::sigaction(sig, &sa, std::ptr::null_mut());
            if blocked & bit != 0 {
                libc::sigaddset(&mut mask, sig);
            }
        }
        libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
    }
}

/// Without a snapshot: the default disposition for the signals itrace catches or ignores, and
/// the ones it blocks unblocked. Async-signal-safe.
fn restore_itrace_own_signals() {
    let tick = libc::SIGRTMIN() + 3;
    // SAFETY: signal, sigemptyset, sigaddset and sigprocmask are async-signal-safe and work on
    // initialised local memory; sigprocmask only changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in ITRACE_OWN.into_iter().chain([tick]) {
            libc::signal(sig, libc::SIG_DFL);
            libc::sigaddset(&mut set, sig);
        }
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// The signals itrace catches or ignores (its tick, `SIGRTMIN + 3`, besides).
const ITRACE_OWN: [libc::c_int; 7] =
    [libc::SIGPIPE, libc::SIGXFSZ, libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGALRM];

/// An environment for a launched program, made before the fork: `VAR=VALUE` strings and the
/// null-terminated array of pointers to them that execve takes.
pub struct Environment {
    _strings: Vec<CString>,
    pointers: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into the heap buffers of `_strings`, which the value owns and
// never changes or frees while it lives (moving a CString does not move its bytes); sharing
// or sending it only shares read-only memory.
unsafe impl Send for Environment {}
// SAFETY: as for Send: nothing is ever written through the pointers.
unsafe impl Sync for Environment {}

/// A `VAR=VALUE` string with a NUL in it.
#[derive(Debug, thiserror::Error)]
#[error("environment variable {0} holds a NUL byte")]
pub struct NulInEnvironment(pub String);

impl Environment {
    /// Exactly these `VAR=VALUE` strings, in this order.
    pub fn from_vars(vars: impl IntoIterator<Item = OsString>) -> Result<Self, NulInEnvironment> {
        let strings: Vec<CString> = vars
            .into_iter()
            .map(|kv| CString::new(kv.as_bytes()).map_err(|_| NulInEnvironment(kv.to_string_lossy().into_owned())))
            .collect::<Result<_, _>>()?;
        let mut pointers: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        pointers.push(std::ptr::null());
        Ok(Environment { _strings: strings, pointers })
    }

    /// itrace's own environment in its order, each of `set` replacing the variable of its name
    /// where it stands, or added at the end.
    pub fn inherited_with(set: &[(OsString, OsString)]) -> Result<Self, NulInEnvironment> {
        Self::from_vars(inherited_with(set))
    }

    /// The array execve takes.
    pub fn as_ptr(&self) -> *const *const libc::c_char {
        self.pointers.as_ptr()
    }

    /// In the child between fork and exec: make this the environment the exec passes on
    /// (`std::process::Command` execs with `environ` when it was given no variables to set).
    /// Async-signal-safe: one store to the child's own copy of `environ`.
    ///
    /// # Safety
    /// Only in a forked child about to exec: the parent's environment is not touched, but
    /// anything in the child that reads the environment from now on reads this value's memory.
    pub unsafe fn install_in_child(&self) {
        extern "C" {
            static mut environ: *const *const libc::c_char;
        }
        // SAFETY: the caller is a forked child with one thread; `self` outlives the exec.
        unsafe { environ = self.as_ptr() };
    }
}

/// itrace's environment as `VAR=VALUE` strings in its order, each of `set` replacing the
/// variable of its name where it stands (every one of that name), or added at the end.
pub fn inherited_with(set: &[(OsString, OsString)]) -> Vec<OsString> {
    let joined = |k: &OsString, v: &OsString| {
        let mut kv = k.clone();
        kv.push("=");
        kv.push(v);
        kv
    };
    let mut used = vec![false; set.len()];
    let mut vars: Vec<OsString> = Vec::new();
    for (k, v) in std::env::vars_os() {
        match set.iter().rposition(|(sk, _)| *sk == k) {
            Some(i) if !used[i] => {
                used[i] = true;
                vars.push(joined(&k, &set[i].1));
            }
            Some(_) => {}
            None => vars.push(joined(&k, &v)),
        }
    }
    for (i, (k, v)) in set.iter().enumerate() {
        if !used[i] && set.iter().rposition(|(sk, _)| sk == k) == Some(i) {
            vars.push(joined(k, v));
        }
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_set_replaces_the_inherited_one_in_place_and_a_new_one_comes_last() {
        let first = std::env::vars_os().next().expect("the test runs with some environment");
        let set = vec![(first.0.clone(), OsString::from("new")), ("ITRACE_TEST_NEW_VAR".into(), "1".into())];
        let vars = inherited_with(&set);
        let mut expected = OsString::from(&first.0);
        expected.push("=new");
        assert_eq!(vars[0], expected);
        assert_eq!(vars.last().unwrap(), "ITRACE_TEST_NEW_VAR=1");
        assert_eq!(vars.len(), std::env::vars_os().count() + 1);
    }
}
