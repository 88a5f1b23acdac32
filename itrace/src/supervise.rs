//! A recording runs in a child process of the `itrace` the user started, so that no way of
//! killing that process harms the traced program.
//!
//! Linux does not clear the trap flag of a tracee whose tracer dies, nor take out the
//! tracer's breakpoints or restore the affinity it set: `kill -9` of a ptrace stepper leaves
//! its target to die of SIGTRAP. So the process the user sees (the supervisor) only forwards
//! the stop signals and waits; the recording process is its child and has
//! `PR_SET_PDEATHSIG`: when the supervisor dies, even of SIGKILL, the recorder gets a stop
//! signal, detaches the way Ctrl-C does and finishes the trace. A launched program is killed
//! with itrace, as before (the recorder gets SIGKILL and ptrace's EXITKILL ends the program),
//! unless a stop was already asked for, in which case the detach the user asked for finishes.
//!
//! The stop signals are blocked from before the fork until each side has its handlers, so a
//! signal in the first milliseconds is never lost and never kills a half-started itrace.

use crate::signals;
use anyhow::{Context, Result};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};

/// What the recording process does when the supervisor dies before a stop was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSupervisorDeath {
    /// Detach and finish the trace (an attached program, a remote target).
    Detach,
    /// Die, and take the launched program along (ptrace's EXITKILL).
    Kill,
}

/// Which side of the fork this is.
pub enum Side {
    /// The recording process: go on and record.
    Recorder,
    /// The supervisor, after the recorder ended: exit with this.
    Supervisor(ExitCode),
}

/// The recorder's pid, for the forwarding handler.
static RECORDER: AtomicI32 = AtomicI32::new(0);

/// The name the recording process shows in `ps` and `/proc/PID/comm`.
const RECORDER_NAME: &[u8] = b"itrace-record\0";

extern "C" fn forward(sig: libc::c_int) {
    let pid = RECORDER.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; pid is our own child, not yet reaped (the
        // supervisor reaps it only after it stops forwarding).
        unsafe { libc::kill(pid, sig) };
    }
}

/// Fork the recording process. In the supervisor this returns only when the recorder has
/// ended, with its exit status; in the recorder it returns at once. `output` is the trace
/// file the recorder writes, if the user is to hear what it holds should the recorder be killed.
pub fn split(on_death: OnSupervisorDeath, output: Option<&Path>) -> Result<Side> {
    let before = output.and_then(FileState::of);
    let stop_set = stop_signal_set();
    let mut old: libc::sigset_t = empty_set();
    // SAFETY: both sets are initialised; sigprocmask only changes this thread's mask (the
    // process has one thread here: nothing has been started yet).
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &stop_set, &mut old) };
    // SAFETY: getpid has no preconditions.
    let supervisor = unsafe { libc::getpid() };
    // SAFETY: the process is single-threaded here (record and calib fork before they start
    // any thread), so the child may go on running ordinary Rust code.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => {
            let e = std::io::Error::last_os_error();
            restore_mask(&old);
            Err(e).context("cannot start the recording process")
        }
        0 => {
            recorder_side(supervisor, on_death, &old)?;
            Ok(Side::Recorder)
        }
        child => Ok(Side::Supervisor(supervise(child, &old, output, before))),
    }
}

fn recorder_side(supervisor: i32, on_death: OnSupervisorDeath, old: &libc::sigset_t) -> Result<()> {
    let death_signal = match on_death {
        OnSupervisorDeath::Detach => libc::SIGTERM,
        OnSupervisorDeath::Kill => libc::SIGKILL,
    };
    if on_death == OnSupervisorDeath::Detach {
        leave_the_process_group();
    }
    signals::install_handlers().context("cannot install signal handlers")?;
    signals::finish_on_parent_death_after_stop(libc::SIGTERM);
    // SAFETY: prctl with integer arguments; RECORDER_NAME is NUL-terminated and within the
    // 16 bytes PR_SET_NAME reads.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, death_signal as libc::c_ulong, 0, 0, 0);
        libc::prctl(libc::PR_SET_NAME, RECORDER_NAME.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
    // The supervisor may have died before the prctl: then nothing would tell us.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != supervisor {
        // SAFETY: _exit ends this process at once; nothing has been started that needs undoing.
        unsafe { libc::_exit(128 + libc::SIGKILL) };
    }
    restore_mask(old);
    Ok(())
}

/// An attaching recorder goes into a process group of its own, before it attaches to anything.
///
/// `kill -9 -- -PGID` of the itrace the user started (a script's cleanup, a job control kill)
/// used to reach the recorder too; then nothing detaches, and Linux leaves the trap flag and
/// the debug registers of the attached program set: it died of SIGTRAP at its next step or
/// breakpoint (nearly every time, in a loop of attach + group kill of spinner.c at 0-300 ms).
/// In a group of its own, the recorder is not killed with the supervisor's group: it gets
/// the supervisor's death signal and detaches, as when only the supervisor is killed. (A
/// kill before this point still reaches it, when it has attached to nothing.) The terminal's
/// Ctrl-C and Ctrl-\ reach the supervisor, which forwards them. Out of the terminal's
/// foreground group, the recorder ignores SIGTTOU, so its last message is written, not stopped
/// on by a terminal with `tostop` (a recorder stopped there would leave its program stopped
/// under ptrace, state `t`, until someone sent it SIGCONT). A launched program stays in the
/// user's group (it is the terminal's job, and it dies with itrace anyway).
fn leave_the_process_group() {
    // SAFETY: setpgid(0, 0) and signal() with SIG_IGN are plain system calls on this process.
    unsafe {
        libc::setpgid(0, 0);
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::signal(libc::SIGTTIN, libc::SIG_IGN);
    }
}

/// The supervisor's nice value where it may raise it (root, CAP_SYS_NICE): the recorder's, so
/// that a stop signal is forwarded, and the recorder's end seen, without waiting behind the
/// program's busy threads.
const SUPERVISOR_NICE: i32 = -10;

/// This process's nice value before [`raise_at_start`], to go back to when it does not attach.
#[must_use]
pub struct RaisedAtStart(Option<i32>);

/// Raise this process to the recorder's nice value (where allowed: root, CAP_SYS_NICE) first
/// thing, before the command line is read: `itrace record -p` keeps it (see [`RaisedAtStart`]),
/// every other command goes back at once. An attach otherwise started at the program's
/// priority, behind its busy threads: with 8 of them on 2 cores, reading the command line,
/// forking the recorder and making the buffers took up to 17 ms each, more than the takeover
/// itself (8 to 13 ms); raised, the first block came after 22-42 ms (median 33) instead of
/// 32-54 (median 37), 12 attaches each, alternating. Nothing inherits the raised value: no
/// program is launched on attach (and a launch goes back before the recorder is forked).
pub fn raise_at_start() -> RaisedAtStart {
    // SAFETY: errno is this thread's; getpriority and setpriority read and change this process
    // alone, and a refusal (EPERM, EACCES) leaves it as it was.
    unsafe {
        *libc::__errno_location() = 0;
        let before = libc::getpriority(libc::PRIO_PROCESS, 0);
        if before == -1 && *libc::__errno_location() != 0 {
            return RaisedAtStart(None);
        }
        let raised = before > SUPERVISOR_NICE && libc::setpriority(libc::PRIO_PROCESS, 0, SUPERVISOR_NICE) == 0;
        RaisedAtStart(raised.then_some(before))
    }
}

impl RaisedAtStart {
    /// Keep the raised value: this process attaches to a running program.
    pub fn keep(self) {}

    /// Go back to the nice value the process was started with.
    pub fn undo(self) {
        if let Some(before) = self.0 {
            // SAFETY: setpriority on this process alone; lowering is always allowed.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, before) };
        }
    }
}

/// Forward the stop signals to the recorder and wait for it to end.
fn supervise(child: i32, old: &libc::sigset_t, output: Option<&Path>, before: Option<FileState>) -> ExitCode {
    RECORDER.store(child, Ordering::Relaxed);
    // Both ends of a detach pass through this process: the stop signal it forwards, and the
    // recorder's exit it reaps. At the program's priority (the same session: the 8 busy threads
    // of bench/attach.py's target, let go by then) each waited for a CPU: 1 to 25 ms of a 40 to
    // 70 ms detach. It only sleeps otherwise. (After the fork: the recorder, and a program it
    // launches, keep the priority itrace was started with.)
    // SAFETY: setpriority on this process alone; a refusal (EPERM, EACCES) leaves it as it was.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, SUPERVISOR_NICE) };
    for sig in signals::STOP_SIGNALS.into_iter().filter(|&s| signals::stops_on(s)) {
        // SAFETY: the handler only loads an atomic and calls kill, both async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    restore_mask(old);
    let mut status = 0;
    loop {
        // SAFETY: status is a valid int for waitpid to fill; child is our child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child {
            break;
        }
        if r == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            eprintln!("itrace: lost the recording process {child}: {}", std::io::Error::last_os_error());
            return ExitCode::FAILURE;
        }
    }
    RECORDER.store(0, Ordering::Relaxed);
    if libc::WIFEXITED(status) {
        return ExitCode::from(libc::WEXITSTATUS(status) as u8);
    }
    let sig = libc::WTERMSIG(status);
    eprintln!(
        "itrace: the recording process {child} was killed by {}; {}",
        signal_name(sig),
        left_behind(output, before)
    );
    ExitCode::from((128 + sig).clamp(0, 255) as u8)
}

/// A file as it was: the same inode, modification time and size after the recording means
/// the recorder never wrote it (the kernel's coarse clock makes a time alone no proof).
#[derive(PartialEq, Eq)]
struct FileState(u64, i64, i64, u64);

impl FileState {
    fn of(path: &Path) -> Option<FileState> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileState(m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
    }
}

/// What a recorder killed mid-way left in its trace file, said only as far as it is true: it
/// may have died before it created the file (a file there is then an earlier one) or wrote
/// any record.
fn left_behind(output: Option<&Path>, before: Option<FileState>) -> String {
    let Some(path) = output else { return "the trace holds what it wrote until then".into() };
    match std::fs::metadata(path) {
        Err(_) => format!("no trace was written ({} does not exist)", path.display()),
        Ok(_) if before.is_some() && FileState::of(path) == before => {
            format!("no trace was written ({} is from before this run)", path.display())
        }
        Ok(m) if m.len() <= itrace_format::HEADER_LEN as u64 => {
            format!("no trace was written ({} holds no records)", path.display())
        }
        Ok(_) => format!("{} holds what it wrote until then, without its end", path.display()),
    }
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| format!("signal {sig}"))
}

fn empty_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        set
    }
}

fn stop_signal_set() -> libc::sigset_t {
    let mut set = empty_set();
    for sig in signals::STOP_SIGNALS {
        // SAFETY: set is initialised; sig is a valid signal number.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    set
}

fn restore_mask(old: &libc::sigset_t) {
    // SAFETY: old is the initialised mask sigprocmask returned.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}
