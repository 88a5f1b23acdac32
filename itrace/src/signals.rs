//! Signals to itrace itself: Ctrl-C, SIGTERM, SIGHUP and the --duration
//! timer ask the recorder to detach and finish (unless the signal was ignored
//! when itrace started: `nohup`); they interrupt its wait
//! (no SA_RESTART) so a target blocked in a system call does not delay that.
//! A periodic tick interrupts the recorder's waits too, so a recorder that
//! waits on a quiet program still flushes what it holds (at most a second
//! of trace is lost if itrace dies).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Set when tracing should stop.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// The signals that ask itrace to detach and finish. SIGQUIT (Ctrl-\\) too: by default it
/// would kill the recorder, and with it an attached program (see `supervise`).
pub const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// What the parent's death does to the recording process (see `supervise`): set by
/// [`on_stop_signal`] once the user asked to stop, so dying parent then means "finish", not "kill".
static PDEATH_ON_STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
    let pdeath = PDEATH_ON_STOP.load(Ordering::Relaxed);
    if pdeath != 0 {
        // SAFETY: prctl(PR_SET_PDEATHSIG) is a plain system call with integer arguments; it
        // is as safe in a signal handler as anywhere.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, pdeath as libc::c_ulong, 0, 0, 0) };
    }
}

extern "C" fn on_tick(_: libc::c_int) {
    // Nothing to do: the signal's only job is to interrupt a blocked wait with EINTR.
}

/// Once a stop was asked for, the parent's death should deliver `sig` (a stop signal)
/// instead of what was set before (SIGKILL for a launched program).
pub fn finish_on_parent_death_after_stop(sig: libc::c_int) {
    PDEATH_ON_STOP.store(sig, Ordering::Relaxed);
}

/// The signal of the periodic tick: a real-time signal, so it never collides with what the
/// user sends.
pub fn tick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

fn handle(sig: libc::c_int, handler: extern "C" fn(libc::c_int)) -> std::io::Result<()> {
    // SAFETY: the handlers only store to atomics and make one system call, which is
    // async-signal-safe; sa is fully initialised before use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether itrace takes `sig` as a request to stop: always, but for a SIGHUP that was ignored
/// when itrace started (`nohup itrace record`: the hangup nohup protects from ends neither the
/// program nor its recording). SIGINT, SIGQUIT and SIGTERM always stop it, even when the shell
/// started itrace with them ignored (a script's background job): `kill -INT` is how scripts
/// stop a background recording, as with perf.
pub fn stops_on(sig: libc::c_int) -> bool {
    !(sig == libc::SIGHUP && itrace_arch::inherit::was_ignored(sig))
}

/// Install the stop handlers (and the tick's), and ignore SIGPIPE and SIGXFSZ (so writes fail
/// with an error instead of killing itrace). A stop signal ignored when itrace started stays
/// ignored (see [`stops_on`]).
pub fn install_handlers() -> std::io::Result<()> {
    for sig in STOP_SIGNALS.into_iter().filter(|&s| stops_on(s)).chain([libc::SIGALRM]) {
        handle(sig, on_stop_signal)?;
    }
    handle(tick_signal(), on_tick)?;
    for sig in [libc::SIGPIPE, libc::SIGXFSZ] {
        // SAFETY: setting a disposition to SIG_IGN has no preconditions.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    Ok(())
}

/// Install the handlers, arm the duration timer, and start the tick (every `tick_ms`) aimed
/// at the calling thread, the one that records.
pub fn install(duration: Option<f64>) -> std::io::Result<()> {
    install_handlers()?;
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
    start_tick(500)
}

/// A timer that sends [`tick_signal`] to the calling thread every `ms` milliseconds (once per
/// process: calibration records several times).
fn start_tick(ms: u64) -> std::io::Result<()> {
    static TICKING: AtomicBool = AtomicBool::new(false);
    if TICKING.swap(true, Ordering::Relaxed) {
        return Ok(());
    }
    // SAFETY: sev is zeroed then filled field by field; SIGEV_THREAD_ID names this thread
    // (gettid), which lives as long as the process records. The timer is never deleted: it
    // dies with the process.
    unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = tick_signal();
        sev.sigev_notify_thread_id = libc::gettid();
        let mut timer: libc::timer_t = std::mem::zeroed();
        if libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut timer) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let period = libc::timespec { tv_sec: (ms / 1000) as libc::time_t, tv_nsec: ((ms % 1000) * 1_000_000) as _ };
        let spec = libc::itimerspec { it_interval: period, it_value: period };
        if libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Block (`true`) or unblock the stop signals, the duration timer's and the tick's in the
/// calling thread; helper threads block them so every one reaches the recording thread.
pub fn block_in_this_thread(block: bool) {
    // SAFETY: set is initialised by sigemptyset before sigaddset; pthread_sigmask only
    // changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in STOP_SIGNALS.into_iter().chain([libc::SIGALRM, tick_signal()]) {
            libc::sigaddset(&mut set, sig);
        }
        let how = if block { libc::SIG_BLOCK } else { libc::SIG_UNBLOCK };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}
