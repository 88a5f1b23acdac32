//! The recording backends behind one interface.
//!
//! A command builds plain [`RecordSettings`] once; [`choose`] picks the backend that can
//! record them (and says why); the [`Recorder`] it returns records into a trace file and
//! answers with a [`Recorded`]. No backend sees the command line.
//!
//! | backend | how it stops at each instruction or branch |
//! |---|---|
//! | [`ptrace`] | ptrace single-steps (or block-steps) every thread from a tracer thread |
//! | [`gdb`] | a GDB remote stub (qemu-user's, gdbserver) single-steps it |
//! | [`inproc`] | the traced thread steps itself in its SIGTRAP handler (libitrace regions) |
//! | [`kmod`] | the kernel shim's debug-trap handler, read through /dev/itrace |
//! | [`qemu`] | qemu-user with itrace's TCG plugin, which writes the trace itself |

/// Return a [`BackendError::Failed`] made like `format!`.
macro_rules! fail {
    ($($t:tt)*) => {
        return Err($crate::backend::BackendError::Failed(format!($($t)*)))
    };
}

pub mod gdb;
pub mod inproc;
pub mod kmod;
// The native ptrace recorder of the architecture itrace runs on (see `choose::NATIVE_ARCHES`);
// its architecture's half is chosen inside it.
#[cfg(any(target_arch = "x86_64", all(target_arch = "powerpc64", target_endian = "little"), target_arch = "s390x"))]
pub mod ptrace;
#[cfg(not(any(
    target_arch = "x86_64",
    all(target_arch = "powerpc64", target_endian = "little"),
    target_arch = "s390x"
)))]
#[path = "ptrace_none.rs"]
pub mod ptrace;
pub mod qemu;

mod choose;
mod error;
pub mod output;
mod settings;
pub mod sink;

pub use choose::{choose, Chosen, WHY_DEFAULT};
pub use error::BackendError;
pub use settings::{find_program, Backend, RecordSettings, StepChoice, Target, TriggerResolver};

use itrace_format::{Arch, LiveCounts, StopReason};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What a backend's recording loop reports.
#[derive(Clone, Debug, Default)]
pub struct RecordOutcome {
    pub instructions: u64,
    pub branches: u64,
    /// Why tracing ended (a [`StopReason`]).
    pub stop_reason: Option<StopReason>,
    /// Exit code of a launched program, or the signal that killed it (negative).
    pub exit_status: Option<i32>,
    pub threads: u64,
    pub processes: u64,
    /// The trace file could not be written; tracing stopped there.
    pub write_error: Option<String>,
    /// Region triggers could not be placed; tracing stopped.
    pub trigger_error: Option<String>,
}

/// A finished recording, as the summary shows it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub records: u64,
    pub instructions: u64,
    pub branches: u64,
    pub lost: u64,
    /// The trace file's size.
    pub bytes: u64,
    /// The traced program's architecture.
    pub arch: Arch,
    /// How it stepped, in words (`ptrace-singlestep`, `emulated (qemu plugin)`, ...).
    pub step: String,
    pub stop_reason: StopReason,
    /// Why tracing ended, when the backend says it better than the stop reason.
    pub why: Option<&'static str>,
    /// Exit code of a launched program, or minus the signal that killed it; `None` when it
    /// runs on (detached) or was not waited for.
    pub exit_status: Option<i32>,
}

/// A program on this machine, as [`choose`] found it: the settings, the launched program's
/// path (`None` when attaching) and its architecture. The native backends start from it.
#[derive(Clone, Debug)]
pub struct Native {
    pub settings: RecordSettings,
    pub program: Option<std::path::PathBuf>,
    pub arch: Arch,
}

/// One way of recording. Built by [`choose`]; [`Recorder::record`] runs once.
pub trait Recorder {
    /// Record into the settings' trace file until the program ends or `stop` is set; keep
    /// `live` up to date for a status line.
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<Recorded, BackendError>;
}

/// Why a launched program's trace ended, and the trace-off value (exit code or signal): a
/// detach or a full buffer first, then how the program ended (`None`: it was not waited for).
pub fn stop_reason(status: Option<std::process::ExitStatus>, detached: bool, full: bool) -> (StopReason, i32) {
    use std::os::unix::process::ExitStatusExt;
    match status {
        _ if detached => (StopReason::Detached, 0),
        _ if full => (StopReason::BufferFull, 0),
        Some(st) => match (st.signal(), st.code()) {
            (Some(sig), _) => (StopReason::Signaled, sig),
            (None, code) => (StopReason::Exited, code.unwrap_or(0)),
        },
        None => (StopReason::Detached, 0),
    }
}

/// The summary's exit status: the code, or minus the signal that killed the program.
pub fn exit_status(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (st.signal(), st.code()) {
        (Some(sig), _) => -sig,
        (None, code) => code.unwrap_or(0),
    }
}
