//! The Linux ptrace recorder: launches or attaches to a program, steps every
//! thread instruction by instruction (or block by block where the CPU's
//! branch trap works), and writes taken-branch records into per-CPU buffers.
//!
//! CPU numbers: each traced thread is pinned to one CPU of its allowed set
//! (round robin) while traced, so every record carries the CPU the
//! instructions really ran on without a system call per step; the original
//! affinity is restored at detach. The pinning is visible to the program
//! (`sched_getaffinity`) while it is traced.

mod block;
pub mod breakpoints;
mod cpus;
mod engine;
mod events;
mod hwstep;
mod launch;
mod probe;
mod region;
mod step;
mod tables;

pub use engine::{record, RecordError, RecordOptions, Target};
pub use hwstep::{probe_hw_breakpoints, HwBreak};
pub use probe::{probe_singleblock, BlockStep};

use super::{output, BackendError, RecordSettings, Recorded, Recorder, StepChoice, TriggerResolver};
use crate::procfs::Mapping;
use breakpoints::{Trigger, TriggerKind};
use itrace_format::{Arch, LiveCounts, StepMethod};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// `itrace record` by ptrace.
pub struct PtraceRecorder {
    settings: RecordSettings,
    target: Target,
    arch: Arch,
    resolver: Arc<dyn TriggerResolver + Send + Sync>,
}

impl PtraceRecorder {
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

impl Recorder for PtraceRecorder {
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<Recorded, BackendError> {
        let s = &self.settings;
        let (mut hw_step, mut hw_rf_auto) = (false, false);
        // Each way is used only where its probe saw it work; the trace is the same either way.
        let block_step = match s.step {
            // The test hook of the branch-trap decoder keeps its own way.
            StepChoice::Auto if s.emulate_block_step => true,
            // Debug-register breakpoints, else the CPU's branch trap, else single steps.
            StepChoice::Auto => match probe_hw_breakpoints() {
                HwBreak::Works { rf_auto } => {
                    (hw_step, hw_rf_auto) = (true, rf_auto);
                    false
                }
                HwBreak::Unavailable(_) => probe_singleblock() == BlockStep::Works,
            },
            StepChoice::Instruction => s.emulate_block_step,
            StepChoice::Block => {
                match probe_hw_breakpoints() {
                    HwBreak::Works { rf_auto } => (hw_step, hw_rf_auto) = (true, rf_auto),
                    HwBreak::Unavailable(why) => {
                        return Err(BackendError::Settings(format!(
                            "--step block: debug-register breakpoints do not work here ({why}); use --step auto"
                        )))
                    }
                }
                false
            }
        };
        let step = if hw_step {
            StepMethod::PtraceHwBreak
        } else if block_step && !s.emulate_block_step {
            StepMethod::PtraceSingleBlock
        } else {
            StepMethod::PtraceSingleStep
        };
        let no_aslr = matches!(self.target, Target::Launch { aslr: false, .. });
        let buffers = output::open(s, self.arch, step, output::ncpu(), no_aslr, live)?;
        let mut wanted: Vec<(String, TriggerKind)> = Vec::new();
        if s.region {
            wanted.push(("ITraceOn".into(), TriggerKind::RegionOn));
            wanted.push(("ITraceOff".into(), TriggerKind::RegionOff));
            wanted.push(("ITraceEnabled".into(), TriggerKind::RegionEnabled));
        }
        wanted.extend(s.start.iter().map(|n| (n.clone(), TriggerKind::Start)));
        wanted.extend(s.stop.iter().map(|n| (n.clone(), TriggerKind::Stop)));
        let resolver = self.resolver.as_ref();
        let resolve = |pid: i32, maps: &[Mapping]| resolve_triggers(resolver, pid, maps, &wanted, s.region);
        let opts = RecordOptions {
            target: self.target.clone(),
            follow_forks: s.follow_forks,
            follow_threads: s.follow_threads,
            stop,
            block_step,
            // (a test hook of the branch-trap mode, which --step block does not use)
            emulate_block_step: s.emulate_block_step && !hw_step,
            hw_step,
            hw_rf_auto,
            hw_emulate_stack: hw_step && !hwstep::cpu_has_user_shadow_stack(),
            triggers: if wanted.is_empty() { None } else { Some(&resolve) },
        };
        output::record_into(s, buffers, self.arch, step.to_string(), |b| Ok(record(&opts, b)?))
    }
}

/// Where the wanted functions are in process `pid`, given its executable mappings.
fn resolve_triggers(
    resolver: &dyn TriggerResolver,
    pid: i32,
    maps: &[Mapping],
    wanted: &[(String, TriggerKind)],
    region: bool,
) -> Result<Vec<Trigger>, String> {
    let mut found: Vec<Trigger> = Vec::new();
    let mut resolved = vec![false; wanted.len()];
    for m in maps.iter().filter(|m| !m.path.is_empty() && !m.path.starts_with('[')) {
        for (i, (name, kind)) in wanted.iter().enumerate() {
            if let Some(addr) = resolver.address(m, name) {
                resolved[i] = true;
                if !found.iter().any(|t| t.addr == addr) {
                    found.push(Trigger { addr, kind: *kind });
                }
            }
        }
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
    if region && !found.iter().any(|t| t.kind == TriggerKind::RegionOn) {
        return Err(super::choose::not_using_libitrace(std::path::Path::new(&exe)).to_string());
    }
    if let Some(((name, _), _)) = wanted
        .iter()
        .zip(&resolved)
        .find(|((_, k), r)| !**r && *k != TriggerKind::RegionEnabled && *k != TriggerKind::RegionOff)
    {
        return Err(format!("no function named {name} in {exe} or its libraries"));
    }
    Ok(found)
}
