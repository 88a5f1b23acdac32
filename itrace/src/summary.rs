//! The end of a recording as the user sees it: one summary line on stderr, a line on how the
//! program ended, and itrace's exit status (the program's, as `time`, `strace` and `perf
//! record` give it). Every backend fills a [`RecordSummary`]; this is its only printer.

use crate::size::human_size;
use itrace_format::{Arch, Mode, StopReason};
use std::path::PathBuf;
use std::process::ExitCode;

/// How the traced program ended, as far as itrace saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramEnd {
    /// It exited with this status.
    Exited(i32),
    /// This signal killed it.
    Signaled(i32),
    /// itrace detached and left it running, or did not wait for it (an attached process).
    Running,
}

impl ProgramEnd {
    /// From a recorder's exit status: the code, or minus the signal (`None`: not waited for).
    pub fn from_status(status: Option<i32>) -> Self {
        match status {
            Some(code) if code < 0 => ProgramEnd::Signaled(-code),
            Some(code) => ProgramEnd::Exited(code),
            None => ProgramEnd::Running,
        }
    }

    /// itrace's exit status for it: the program's code, 128+N for signal N, 0 when it runs on.
    pub fn exit_code(self) -> ExitCode {
        match self {
            ProgramEnd::Exited(code) => ExitCode::from((code & 0xff) as u8),
            ProgramEnd::Signaled(sig) => ExitCode::from((128 + sig).clamp(0, 255) as u8),
            ProgramEnd::Running => ExitCode::SUCCESS,
        }
    }
}

/// What one recording did.
#[derive(Clone, Debug)]
pub struct RecordSummary {
    pub records: u64,
    pub instructions: u64,
    pub branches: u64,
    pub lost: u64,
    pub mode: Mode,
    /// How it stepped (`ptrace-singlestep`, `emulated (qemu plugin)`, ...).
    pub step: String,
    /// Said only where it is not the machine's own (foreign programs).
    pub arch: Option<Arch>,
    /// The trace file's size.
    pub bytes: u64,
    /// The trace file; `None` for a temporary file the user never sees.
    pub output: Option<PathBuf>,
    /// Why tracing ended, in words.
    pub why: String,
    pub program: ProgramEnd,
}

/// Why tracing ended, in words, for the summary line.
pub fn why(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Exited | StopReason::Signaled | StopReason::RegionEnd => "the program ended",
        StopReason::Detached => "detached",
        StopReason::BufferFull => "a buffer filled (normal mode); the program ran on untraced",
        StopReason::WriteError => "the trace file could not be written",
        StopReason::Vanished | StopReason::TracerError => "tracer error",
    }
}

impl RecordSummary {
    /// The summary line, and how the program ended when that is news.
    pub fn print(&self) {
        eprintln!("itrace: {}", self.line());
        if let Some(end) = self.program_line() {
            eprintln!("itrace: {end}");
        }
    }

    fn line(&self) -> String {
        let arch = self.arch.map(|a| format!(", {a}")).unwrap_or_default();
        let file = match &self.output {
            Some(p) => format!("{} in {}", human_size(self.bytes), p.display()),
            None => format!("{} of trace", human_size(self.bytes)),
        };
        format!(
            "{} records ({} instructions, {} taken branches), {} lost, mode {}, {}{arch}, {file}; tracing ended: {}",
            self.records, self.instructions, self.branches, self.lost, self.mode, self.step, self.why
        )
    }

    fn program_line(&self) -> Option<String> {
        match self.program {
            ProgramEnd::Exited(0) | ProgramEnd::Running => None,
            ProgramEnd::Exited(code) => Some(format!("the program exited with status {code}")),
            ProgramEnd::Signaled(sig) => Some(format!("the program was killed by signal {}", signal_name(sig))),
        }
    }
}

/// `SIGSEGV (11)`, or the number alone for one Linux does not name.
pub fn signal_name(sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => format!("{} ({sig})", s.as_str()),
        Err(_) => sig.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use itrace_format::StepMethod;

    fn summary(program: ProgramEnd) -> RecordSummary {
        RecordSummary {
            records: 12,
            instructions: 345,
            branches: 10,
            lost: 0,
            mode: Mode::Continuous,
            step: StepMethod::PtraceSingleStep.to_string(),
            arch: None,
            bytes: 1_021_852_956,
            output: Some("t.itr".into()),
            why: why(StopReason::Exited).into(),
            program,
        }
    }

    #[test]
    fn summary_line_uses_readable_sizes() {
        let s = summary(ProgramEnd::Exited(0));
        assert_eq!(
            s.line(),
            "12 records (345 instructions, 10 taken branches), 0 lost, mode continuous, ptrace-singlestep, \
             974.5 MiB in t.itr; tracing ended: the program ended"
        );
        let hidden = RecordSummary { output: None, ..s };
        assert!(hidden.line().contains("974.5 MiB of trace;"), "{}", hidden.line());
    }

    #[test]
    fn exit_status_is_the_programs() {
        assert_eq!(ProgramEnd::from_status(Some(3)), ProgramEnd::Exited(3));
        assert_eq!(ProgramEnd::from_status(Some(-11)), ProgramEnd::Signaled(11));
        assert_eq!(ProgramEnd::from_status(None), ProgramEnd::Running);
        assert_eq!(ProgramEnd::Signaled(11).exit_code(), ExitCode::from(139));
        assert_eq!(ProgramEnd::Exited(256 + 7).exit_code(), ExitCode::from(7));
        assert_eq!(
            summary(ProgramEnd::Signaled(11)).program_line().unwrap(),
            "the program was killed by signal SIGSEGV (11)"
        );
        assert_eq!(summary(ProgramEnd::Exited(0)).program_line(), None);
    }
}
