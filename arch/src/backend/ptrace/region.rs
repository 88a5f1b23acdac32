//! Region tracing on the ptrace backend, for every architecture: threads run at full speed
//! under ptrace and are stepped only inside regions, started and ended by breakpoints
//! (`breakpoints.rs`): the library's `ITraceOn`/`ITraceOff`/`ITraceEnabled` (carried out by
//! the tracer, which returns for them: none of the library's code is stepped or recorded) or
//! `--start`/`--stop` symbols.
//!
//! What differs per architecture is small and lives in `super::arch`: the breakpoint
//! instruction (`BREAKPOINT`), where the pc is after one was hit (`breakpoint_hit`), reading and
//! setting the pc, returning from a function for it (`return_to_caller`: x86 pops the return
//! address, PowerPC branches to the link register), where a function's breakpoint goes
//! (`breakpoint_address`: PowerPC's ELFv2 local entry point) and, through `PtraceArch`, the
//! instruction set a thread starts stepping in and what to undo when a region ends.
//!
//! Breakpoints are lifted for the one step of a thread over their
//! instruction; another thread running through that address during that
//! step is not stopped (a window of one step).

use super::arch::{breakpoint_address, breakpoint_hit, pc_of, return_to_caller, set_pc};
use super::breakpoints::Breakpoints;
use super::engine::{Pending, PtraceArch, Session, ThreadState, Trigger, TriggerKind};
use crate::backend::{RecordSettings, TriggerResolver};
use crate::procfs;
use crate::procfs::Mapping;
use itrace_format::now_ns;
use itrace_format::{Record, StopReason, TraceOff, TraceOn, TraceOnReason};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// A thread's region-tracing state.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RegionThread {
    /// Nesting depth of ITraceOn calls.
    depth: u32,
    /// Breakpoints were lifted for this thread's step: put them back at its next stop (other
    /// threads could pass them while they are out, so that step is kept short).
    pub(super) lifted_bps: bool,
    /// Running thread stepping once over a lifted breakpoint, then running on.
    step_once: bool,
    /// That step was started: the SIGTRAP it ends with is ours.
    in_step_once: bool,
    /// A vfork child we do not follow, sharing its parent's memory (and breakpoints): let it go
    /// once it has its own memory (exec).
    release_at_exec: bool,
}

/// A process's region-tracing state (a forked child's is a clone: its memory is a copy, our
/// breakpoints included).
#[derive(Clone, Debug, Default)]
pub(super) struct RegionProcess {
    /// Our breakpoints in this process.
    pub(super) bps: Breakpoints,
    /// Breakpoints taken out: a thread stopped by one just before must be moved back onto it.
    retired: Vec<u64>,
    /// Whether the triggers have been resolved and inserted.
    triggers_set: bool,
}

/// The functions to put breakpoints on for `s` (`--region`, `--start`, `--stop`).
pub(super) fn wanted_triggers(s: &RecordSettings) -> Vec<(String, TriggerKind)> {
    let mut wanted: Vec<(String, TriggerKind)> = Vec::new();
    if s.region {
        wanted.push(("ITraceOn".into(), TriggerKind::RegionOn));
        wanted.push(("ITraceOff".into(), TriggerKind::RegionOff));
        wanted.push(("ITraceEnabled".into(), TriggerKind::RegionEnabled));
    }
    wanted.extend(s.start.iter().map(|n| (n.clone(), TriggerKind::Start)));
    wanted.extend(s.stop.iter().map(|n| (n.clone(), TriggerKind::Stop)));
    wanted
}

/// The program entry point (AT_ENTRY) from /proc/PID/auxv.
fn entry_point(pid: i32) -> Option<u64> {
    let bytes = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    bytes.chunks_exact(16).find_map(|kv| {
        let key = u64::from_ne_bytes(kv[..8].try_into().ok()?);
        (key == libc::AT_ENTRY).then(|| u64::from_ne_bytes(kv[8..].try_into().expect("8 bytes")))
    })
}

/// Whether two processes share their memory (a vfork child and its parent).
fn share_memory(a: i32, b: i32) -> bool {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp only compares kernel objects of two pids; no memory is passed.
    unsafe { libc::syscall(libc::SYS_kcmp, a as libc::c_long, b as libc::c_long, KCMP_VM, 0, 0) == 0 }
}

impl Session<'_> {
    /// A thread starts under region tracing: make sure the triggers of its process are in, then run it.
    pub(super) fn start_running(&mut self, tid: i32, pid: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.state = ThreadState::Running;
        }
        let set = self.procs.get(&pid).is_some_and(|p| p.region.triggers_set);
        if !set {
            self.resolve_triggers(tid, pid);
        }
        self.resume(tid, 0);
    }

    /// Ask the caller where the triggers are in `pid` now, and insert them through stopped `tid`.
    fn resolve_triggers(&mut self, tid: i32, pid: i32) {
        let Some(resolve) = self.opts.triggers else { return };
        let maps = procfs::exec_mappings(pid).unwrap_or_default();
        let triggers = match resolve(pid, &maps) {
            Ok(t) => t,
            Err(e) => {
                self.out.trigger_error.get_or_insert(e);
                self.begin_detach(StopReason::Detached);
                return;
            }
        };
        if let Some(p) = self.procs.get_mut(&pid) {
            p.region.triggers_set = true;
            for t in triggers {
                let addr = breakpoint_address(tid, t.addr);
                let _ = p.region.bps.insert(tid, Trigger { addr, ..t });
            }
        }
    }

    /// exec under region tracing: the old breakpoints went with the old image. Put one on the
    /// new program's entry, where its libraries are loaded and the triggers can be resolved.
    pub(super) fn exec_in_region_mode(&mut self, tid: i32, pid: i32, launching: bool) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if t.region.release_at_exec {
            // An unfollowed vfork child now has memory of its own: let it go.
            t.state = ThreadState::Finished;
            return;
        }
        if t.state == ThreadState::Stepping {
            // A region ends at exec: the execve instruction ran.
            let off = TraceOff {
                ts: now_ns(),
                reason: StopReason::RegionEnd,
                pid: pid as u32,
                tid: tid as u32,
                pc: pc_of(tid).unwrap_or(0),
                icount: t.icount + 1,
                value: 0,
            };
            t.icount = 0;
            let cpu = t.cpu;
            self.out.instructions += off.icount as u64;
            self.push_control(cpu, Record::TraceOff(off));
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.state = ThreadState::Running;
        t.region.depth = 0;
        t.pending = None;
        if launching {
            self.pin_thread(tid);
            self.pin_tracer(tid);
        }
        if let (Some(entry), Some(p)) = (entry_point(pid), self.procs.get_mut(&pid)) {
            let _ = p.region.bps.insert(tid, Trigger { addr: entry, kind: TriggerKind::Entry });
        }
    }

    /// Detach a thread of a process we do not follow, with the priority it had before a detach
    /// raised its parent's.
    fn let_go_unfollowed(&mut self, tid: i32) {
        if let Some(nice) = self.threads.remove(&tid).and_then(|t| t.nice_before_detach) {
            super::cpus::set_nice(tid, nice);
        }
        let _ = ptrace::detach(Pid::from_raw(tid), None);
    }

    /// A child process we do not follow: take our breakpoints out of its memory copy and let it
    /// go; a vfork child shares its parent's memory, so it runs under us until it execs.
    pub(super) fn release_child(&mut self, tid: i32, pid: i32) {
        let parent = procfs::ppid(pid).unwrap_or(0);
        let parent_bps = self.procs.get(&parent).map(|p| p.region.bps.clone());
        match parent_bps {
            Some(bps) if !bps.is_empty() && share_memory(parent, pid) => {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.state = ThreadState::Running;
                    t.region.release_at_exec = true;
                    t.pid = parent;
                }
                self.resume(tid, 0);
            }
            Some(mut bps) => {
                let _ = bps.remove_all(tid);
                self.let_go_unfollowed(tid);
            }
            None => self.let_go_unfollowed(tid),
        }
    }

    /// Take every breakpoint out of the process of stopped thread `tid` (before letting it go).
    pub(super) fn remove_breakpoints_via(&mut self, tid: i32) {
        let Some(pid) = self.threads.get(&tid).map(|t| t.pid) else { return };
        if let Some(p) = self.procs.get_mut(&pid) {
            if !p.region.bps.is_empty() {
                let addrs: Vec<u64> = p.region.bps.addresses();
                if p.region.bps.remove_all(tid).is_ok() {
                    p.region.retired.extend(addrs);
                }
            }
        }
    }

    /// Before a step: lift our breakpoint at the instruction the thread runs next.
    pub(super) fn lift_breakpoint_at_pending(&mut self, tid: i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        let (pid, pc) = (t.pid, t.pending.map(|p| p.pc));
        let Some(pc) = pc else { return };
        if let Some(p) = self.procs.get_mut(&pid) {
            if p.region.bps.is_inserted(pc) && p.region.bps.lift(tid, pc).is_ok() {
                self.threads.get_mut(&tid).expect("thread exists").region.lifted_bps = true;
            }
        }
    }

    /// At any stop: put back what was lifted for this thread's last step.
    pub(super) fn put_back_lifted(&mut self, tid: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if !std::mem::take(&mut t.region.lifted_bps) {
            return;
        }
        let pid = t.pid;
        if let Some(p) = self.procs.get_mut(&pid) {
            let _ = p.region.bps.reinsert_lifted(tid);
        }
    }

    /// A running (untraced) thread stopped: our breakpoint, or a signal for the program.
    pub(super) fn running_stop(&mut self, tid: i32, sig: i32) {
        if sig != libc::SIGTRAP {
            self.resume(tid, sig);
            return;
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if std::mem::take(&mut t.region.in_step_once) {
            // The end of our step over a lifted breakpoint: run on.
            self.resume(tid, 0);
            return;
        }
        let pid = t.pid;
        let Ok(pc) = pc_of(tid) else {
            self.resume(tid, 0);
            return;
        };
        let addr = breakpoint_hit(pc);
        let (kind, retired) = match self.procs.get(&pid) {
            Some(p) => (
                p.region.bps.kind_at(addr).filter(|_| p.region.bps.is_inserted(addr)),
                p.region.retired.contains(&addr),
            ),
            None => (None, false),
        };
        let Some(kind) = kind else {
            if retired {
                // Stopped by a breakpoint taken out meanwhile: run the original instruction.
                let _ = set_pc(tid, addr);
                self.resume(tid, 0);
            } else {
                // The program's own SIGTRAP.
                self.resume(tid, libc::SIGTRAP);
            }
            return;
        };
        // Back onto the breakpoint's instruction.
        if addr != pc {
            let _ = set_pc(tid, addr);
        }
        match kind {
            TriggerKind::Entry => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    let _ = p.region.bps.remove(tid, addr);
                }
                self.resolve_triggers(tid, pid);
                self.resume(tid, 0);
            }
            TriggerKind::RegionOn => {
                let depth = {
                    let t = self.threads.get_mut(&tid).expect("thread exists");
                    t.region.depth += 1;
                    t.region.depth
                };
                match return_to_caller(tid, Some(0)) {
                    Some(ret) if depth == 1 => self.begin_stepping(tid, ret, TraceOnReason::Start),
                    _ => self.resume(tid, 0),
                }
            }
            TriggerKind::RegionOff => {
                let t = self.threads.get_mut(&tid).expect("thread exists");
                t.region.depth = t.region.depth.saturating_sub(1);
                return_to_caller(tid, None);
                self.resume(tid, 0);
            }
            TriggerKind::RegionEnabled => {
                return_to_caller(tid, Some(0));
                self.resume(tid, 0);
            }
            TriggerKind::Start => self.begin_stepping(tid, addr, TraceOnReason::Start),
            TriggerKind::Stop => self.step_over_and_run(tid, addr),
        }
    }

    /// Start stepping a thread at `pc`.
    fn begin_stepping(&mut self, tid: i32, pc: u64, reason: TraceOnReason) {
        let Some(t) = self.threads.get(&tid) else { return };
        let pid = t.pid;
        // Libraries may have been mapped while the process ran untraced.
        self.refresh_maps(pid, now_ns());
        let isa = self.region_isa(tid);
        let insn = self.decode(pid, isa, pc);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.state = ThreadState::Stepping;
        t.pending = Some(Pending { pc, insn, syscall_nr: u64::MAX });
        t.icount = 0;
        let cpu = t.cpu;
        if self.out.threads == 0 {
            self.pin_tracer(tid);
        }
        self.out.threads += 1;
        let on = TraceOn { ts: now_ns(), reason, pid: pid as u32, tid: tid as u32, pc };
        self.push_control(cpu, Record::TraceOn(on));
        self.resume(tid, 0);
    }

    /// A running thread at one of our breakpoints that does not start anything: run its
    /// instruction with the breakpoint lifted, then run on.
    fn step_over_and_run(&mut self, tid: i32, addr: u64) {
        let Some(t) = self.threads.get(&tid) else { return };
        let pid = t.pid;
        if let Some(p) = self.procs.get_mut(&pid) {
            let _ = p.region.bps.lift(tid, addr);
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.region.lifted_bps = true;
        t.region.step_once = true;
        self.resume(tid, 0);
    }

    /// A stepping thread is about to run `pending`: is it a trigger that ends or changes the region?
    pub(super) fn before_step(&mut self, tid: i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        if t.state != ThreadState::Stepping {
            return;
        }
        let (pid, Some(p)) = (t.pid, t.pending) else { return };
        let Some(kind) = self.procs.get(&pid).and_then(|pr| pr.region.bps.kind_at(p.pc)) else { return };
        match kind {
            TriggerKind::RegionOn | TriggerKind::RegionEnabled => {
                // Nested ITraceOn, or ITraceEnabled inside a region: the tracer answers and returns.
                let t = self.threads.get_mut(&tid).expect("thread exists");
                let result = if kind == TriggerKind::RegionOn {
                    t.region.depth += 1;
                    0
                } else {
                    1
                };
                if let Some(ret) = return_to_caller(tid, Some(result)) {
                    self.continue_at(tid, pid, ret);
                }
            }
            TriggerKind::RegionOff => {
                let t = self.threads.get_mut(&tid).expect("thread exists");
                t.region.depth = t.region.depth.saturating_sub(1);
                if t.region.depth > 0 {
                    if let Some(ret) = return_to_caller(tid, None) {
                        self.continue_at(tid, pid, ret);
                    }
                } else {
                    self.end_region(tid, p.pc);
                    return_to_caller(tid, None);
                }
            }
            TriggerKind::Stop => {
                self.end_region(tid, p.pc);
                self.step_over_and_run_later(tid, p.pc);
            }
            TriggerKind::Start | TriggerKind::Entry => {}
        }
    }

    /// The thread goes on at `pc` without a branch to get there (the tracer returned for it).
    fn continue_at(&mut self, tid: i32, pid: i32, pc: u64) {
        let isa = self.threads[&tid].arch.isa();
        let insn = self.decode(pid, isa, pc);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.pending = Some(Pending { pc, insn, syscall_nr: u64::MAX });
        let cpu = t.cpu;
        let on = TraceOn { ts: now_ns(), reason: TraceOnReason::Resume, pid: pid as u32, tid: tid as u32, pc };
        self.push_control(cpu, Record::TraceOn(on));
    }

    /// The region of a stepping thread ends at `pc`: it runs on untraced.
    fn end_region(&mut self, tid: i32, pc: u64) {
        let t = self.threads.get_mut(&tid).expect("thread exists");
        let off = TraceOff {
            ts: now_ns(),
            reason: StopReason::RegionEnd,
            pid: t.pid as u32,
            tid: tid as u32,
            pc,
            icount: t.icount,
            value: 0,
        };
        t.icount = 0;
        t.state = ThreadState::Running;
        t.region.depth = 0;
        t.pending = None;
        let cpu = t.cpu;
        self.out.instructions += off.icount as u64;
        self.push_control(cpu, Record::TraceOff(off));
        self.region_ended(tid);
    }

    /// After `end_region` at a `--stop` breakpoint: the next resume steps over it once.
    fn step_over_and_run_later(&mut self, tid: i32, addr: u64) {
        let Some(t) = self.threads.get(&tid) else { return };
        let pid = t.pid;
        if let Some(p) = self.procs.get_mut(&pid) {
            if p.region.bps.is_inserted(addr) {
                let _ = p.region.bps.lift(tid, addr);
                let t = self.threads.get_mut(&tid).expect("thread exists");
                t.region.lifted_bps = true;
                t.region.step_once = true;
            }
        }
    }
}

impl Session<'_> {
    /// Region tracing takes over the exec (the thread runs untraced until a trigger): whether it did.
    pub(super) fn region_exec(&mut self, tid: i32, pid: i32, launching: bool) -> bool {
        if self.opts.triggers.is_none() {
            return false;
        }
        self.exec_in_region_mode(tid, pid, launching);
        true
    }

    /// Region tracing takes over a thread's first stop: whether it did.
    pub(super) fn region_start(&mut self, tid: i32, pid: i32) -> bool {
        if self.opts.triggers.is_none() {
            return false;
        }
        // Region tracing: run at full speed until a trigger.
        self.start_running(tid, pid);
        true
    }

    /// Resume a thread running untraced (`ThreadState::Running`): on at full speed, or one step
    /// over a lifted breakpoint first.
    pub(super) fn resume_running(&mut self, tid: i32, sig: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        let once = std::mem::take(&mut t.region.step_once);
        t.region.in_step_once = once;
        t.injected = None;
        let (pid, sig) = (Pid::from_raw(tid), Signal::try_from(sig).ok());
        let r = if once { ptrace::step(pid, sig) } else { ptrace::cont(pid, sig) };
        self.after_resume(tid, r);
    }
}

/// Where the wanted functions are in process `pid`, given its executable mappings.
pub(super) fn resolve_triggers(
    resolver: &dyn TriggerResolver,
    pid: i32,
    maps: &[Mapping],
    wanted: &[(String, TriggerKind)],
    region: bool,
) -> Result<Vec<Trigger>, String> {
    let mut found: Vec<Trigger> = Vec::new();
    let mut resolved = vec![false; wanted.len()];
    let files: Vec<Mapping> = maps.iter().filter(|m| !m.path.is_empty() && !m.path.starts_with('[')).cloned().collect();
    for (i, (name, kind)) in wanted.iter().enumerate() {
        for addr in resolver.addresses(&files, name)? {
            resolved[i] = true;
            if !found.iter().any(|t| t.addr == addr) {
                found.push(Trigger { addr, kind: *kind });
            }
        }
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
    if region && !found.iter().any(|t| t.kind == TriggerKind::RegionOn) {
        return Err(crate::backend::choose::not_using_libitrace(std::path::Path::new(&exe)).to_string());
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
