//! The Linux ptrace recorder: launches or attaches to a program, steps every thread
//! instruction by instruction (or block by block where the CPU allows it), and writes
//! taken-branch records into per-CPU buffers, in the trace format of every backend.
//!
//! One engine for every architecture, and one module per architecture behind it:
//! - shared (this directory): the thread and process tables, the wait loop, ptrace events
//!   (fork, vfork, clone, exec, exit, group stops, interrupts, signals on their way to the
//!   program), launching and attaching, CPU pinning, detaching, the trace-off records, the
//!   module table (mappings, names, JIT maps), the decoded-instruction cache and region tracing
//!   by software breakpoints (`engine.rs`, `events.rs`, `launch.rs`, `cpus.rs`, `tables.rs`,
//!   `region.rs`, `breakpoints.rs`);
//! - per architecture (`x86_64/`, `ppc64/`, `s390x/`, one of them compiled, chosen below by
//!   `cfg(target_arch)`): registers and the pc, how a thread is resumed (single step, block
//!   step, debug-register runs on x86_64; syscall stops and atomic load-reserve/store-conditional
//!   sequences run to temporary traps on ppc64), what the instruction just executed or the
//!   system call was, the few region-tracing specifics (the breakpoint instruction, the pc after
//!   it, returning for a function), and the recorder's choice of step method. The engine calls it through `engine::PtraceArch` and keeps its state in
//!   `Thread::arch`, `Process::arch`, `Session::arch` and `RecordOptions::step`.
//!
//! CPU numbers: each traced thread is pinned to one CPU of its allowed set
//! (round robin) while traced, so every record carries the CPU the
//! instructions really ran on without a system call per step; the original
//! affinity is restored at detach. The pinning is visible to the program
//! (`sched_getaffinity`) while it is traced. A thread itrace must wait for (a detach's
//! interrupt, a nested wait of the translating recorder) gets its own CPUs back until it
//! stops: pinned, the scheduler starved such threads for seconds (`cpus.rs`).

#[cfg(target_arch = "x86_64")]
#[path = "x86_64/mod.rs"]
mod arch;
#[cfg(all(target_arch = "powerpc64", target_endian = "little"))]
#[path = "ppc64/mod.rs"]
mod arch;
#[cfg(target_arch = "s390x")]
#[path = "s390x/mod.rs"]
mod arch;
// The block-stepping, syscall-stopping half the ppc64 and s390x recorders share.
#[cfg(any(target_arch = "powerpc64", target_arch = "s390x"))]
mod blockstep;
mod breakpoints;
mod cpus;
mod engine;
mod events;
mod launch;
mod probe_child;
mod region;
mod tables;

pub use engine::{record, RecordError, RecordOptions, Target, Trigger, TriggerKind};

use super::{output, BackendError, RecordSettings, Recorded, TriggerResolver};
use crate::procfs::Mapping;
use itrace_format::{Arch, LiveCounts, StepMethod};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// `itrace record` by ptrace (`Recorder` is implemented by the architecture's module).
pub struct PtraceRecorder {
    settings: RecordSettings,
    target: Target,
    arch: Arch,
    /// Where region triggers are.
    resolver: Arc<dyn TriggerResolver + Send + Sync>,
}

impl PtraceRecorder {
    /// Record with step method `step`, the architecture's `step_options` for it.
    fn record_with(
        &self,
        live: Arc<LiveCounts>,
        stop: &AtomicBool,
        step: StepMethod,
        step_options: arch::StepOptions,
    ) -> Result<Recorded, BackendError> {
        let s = &self.settings;
        let no_aslr = matches!(self.target, Target::Launch { aslr: false, .. });
        let buffers = output::open(s, self.arch, step, output::ncpu(), no_aslr, live)?;
        let wanted = region::wanted_triggers(s);
        let resolver = self.resolver.as_ref();
        let resolve = |pid: i32, maps: &[Mapping]| region::resolve_triggers(resolver, pid, maps, &wanted, s.region);
        let opts = RecordOptions {
            target: self.target.clone(),
            follow_forks: s.follow_forks,
            follow_threads: s.follow_threads,
            stop,
            step: step_options,
            triggers: if wanted.is_empty() { None } else { Some(&resolve) },
        };
        output::record_into(s, buffers, self.arch, step.to_string(), |b| Ok(record(&opts, b)?))
    }

    pub fn new(native: super::Native, resolver: Arc<dyn TriggerResolver + Send + Sync>) -> Self {
        let super::Native { settings, program, arch } = native;
        let target = match (&settings.target, program) {
            (super::Target::Launch { command, aslr }, Some(program)) => {
                Target::Launch { program, args: command.clone(), aslr: *aslr, env: settings.env.clone() }
            }
            (super::Target::Attach { pid }, _) => Target::Attach { pid: *pid },
            _ => unreachable!("choose() gives ptrace a launched program or a pid"),
        };
        PtraceRecorder { settings, target, arch, resolver }
    }
}
