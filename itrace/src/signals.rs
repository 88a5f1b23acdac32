//! Signals to itrace itself: Ctrl-C, SIGTERM, SIGHUP and the --duration
//! timer ask the recorder to detach and finish; they interrupt its wait
//! (no SA_RESTART) so a target blocked in a system call does not delay that.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set when tracing should stop.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Install the handlers, ignore SIGPIPE and SIGXFSZ (so writes fail with an
/// error instead of killing itrace), and arm the duration timer.
pub fn install(duration: Option<f64>) -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGALRM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe;
        // sa is fully initialised before use.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    for sig in [libc::SIGPIPE, libc::SIGXFSZ] {
        // SAFETY: setting a disposition to SIG_IGN has no preconditions.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    if let Some(secs) = duration {
        let whole = secs.trunc() as libc::time_t;
        let micros = ((secs.fract()) * 1e6) as libc::suseconds_t;
        let t = libc::itimerval {
            it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
            it_value: libc::timeval { tv_sec: whole, tv_usec: micros.max(if whole == 0 { 1 } else { 0 }) },
        };
        // SAFETY: t is a valid itimerval; the old value is not wanted.
        if unsafe { libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
