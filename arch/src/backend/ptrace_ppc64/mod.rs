//! The Linux ptrace recorder on PowerPC64 little-endian (ELFv2), itrace running on the traced
//! machine: launches or attaches to a program, single-steps every thread and writes
//! taken-branch records into per-CPU buffers, in the trace format of every backend (header
//! `ppc64le`), so `itrace arc` and `report` on any machine read it.
//!
//! PowerPC specifics (the x86_64 recorder is `backend/ptrace/`):
//! - registers through `PTRACE_GETREGS` (`struct pt_regs`: nip, gpr, link, ctr, ccr, ...);
//! - a load-reserve/store-conditional sequence cannot be single-stepped: the reservation is
//!   lost at every trap and the `stwcx.` fails forever (real POWER and Linux do the same). It
//!   runs to temporary trap breakpoints after its `stwcx.` and at its exits, as gdb does;
//! - `sc` (and `scv`) with the number in r0; `rt_sigreturn` through the vDSO's trampoline;
//! - no block stepping (PowerPC's branch trace is not offered by Linux's ptrace), and no
//!   region tracing yet (`--region`, `--start`, `--stop`: refused with a clear error).
//!
//! Launching, attaching and CPU pinning are the x86_64 recorder's files, compiled against
//! this module's session (`launch.rs`, `cpus.rs`).

#[path = "../ptrace/cpus.rs"]
mod cpus;
mod engine;
mod events;
#[path = "../ptrace/launch.rs"]
mod launch;
mod regs;
mod step;
mod tables;

pub use engine::{record, RecordError, RecordOptions, Target};

use super::{output, BackendError, RecordSettings, Recorded, Recorder, StepChoice, TriggerResolver};
use itrace_format::{Arch, LiveCounts, StepMethod};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// `itrace record` by ptrace on PowerPC64.
pub struct PtraceRecorder {
    settings: RecordSettings,
    target: Target,
    arch: Arch,
}

impl PtraceRecorder {
    pub fn new(native: super::Native, _resolver: Arc<dyn TriggerResolver + Send + Sync>) -> Self {
        let super::Native { settings, program, arch } = native;
        let target = match (&settings.target, program) {
            (super::Target::Launch { command, aslr }, Some(program)) => {
                Target::Launch { program, args: command.clone(), aslr: *aslr, env: settings.env.clone() }
            }
            (super::Target::Attach { pid }, _) => Target::Attach { pid: *pid },
            _ => unreachable!("choose() gives ptrace a launched program or a pid"),
        };
        PtraceRecorder { settings, target, arch }
    }
}

impl Recorder for PtraceRecorder {
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<Recorded, BackendError> {
        let s = &self.settings;
        if s.region || !s.start.is_empty() || !s.stop.is_empty() {
            return Err(BackendError::Settings(
                "--region, --start and --stop are not supported by the PowerPC64 ptrace recorder yet: trace the \
                 whole program"
                    .into(),
            ));
        }
        if s.step == StepChoice::Block || s.emulate_block_step {
            return Err(BackendError::Settings(
                "--step block: PowerPC64 steps by instruction only (use --step auto)".into(),
            ));
        }
        let step = StepMethod::PtraceSingleStep;
        let no_aslr = matches!(self.target, Target::Launch { aslr: false, .. });
        let buffers = output::open(s, self.arch, step, output::ncpu(), no_aslr, live)?;
        let opts = RecordOptions {
            target: self.target.clone(),
            follow_forks: s.follow_forks,
            follow_threads: s.follow_threads,
            stop,
            triggers: None,
        };
        output::record_into(s, buffers, self.arch, step.to_string(), |b| Ok(record(&opts, b)?))
    }
}
