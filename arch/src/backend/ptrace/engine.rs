//! The stepping loop. One tracer thread waits for every traced thread and
//! turns each stop into records.
//!
//! At each stop the thread's next instruction is decoded (from a cache for
//! read-only code) and kept as `pending`; at the following stop, the new pc
//! tells whether `pending` was a taken branch. Kernel transitions are
//! recognised from the instruction itself (a system call) or from the stop
//! (signal delivery), so no syscall-stops are needed.

use super::breakpoints::{Breakpoints, Trigger};
use super::cpus::*;
use crate::backend::sink::{Sink, Stored};
use crate::backend::RecordOutcome;
use crate::isa::x86_64::X86;
use crate::procfs::Mapping;
use itrace_decoders::Insn;
use itrace_format::{Branch, Buffers, FormatError, Mte, Record, StopReason, TraceOff};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// si_code of a step report from the kernel rather than the debug trap.
pub(super) const TRAP_BRKPT: i32 = 1;

/// What to trace.
#[derive(Clone, Debug)]
pub enum Target {
    /// Start `program` with `args` (argv[0] included), our environment plus `env`, and trace
    /// it from its first instruction.
    Launch { program: PathBuf, args: Vec<OsString>, aslr: bool, env: Vec<(OsString, OsString)> },
    /// Attach to every thread of a running process.
    Attach { pid: i32 },
}

/// Finds the region triggers of process `pid` among its executable mappings.
pub type TriggerResolver<'a> = dyn Fn(i32, &[Mapping]) -> Result<Vec<Trigger>, String> + 'a;

/// How to record.
pub struct RecordOptions<'a> {
    pub target: Target,
    /// Trace child processes (fork, vfork, clone without CLONE_THREAD).
    pub follow_forks: bool,
    /// Trace threads created after the start.
    pub follow_threads: bool,
    /// Set (by a signal handler or timer) to stop tracing, detach and finish.
    pub stop: &'a AtomicBool,
    /// Step by taken branch (PTRACE_SINGLEBLOCK) instead of by instruction: only where
    /// [`super::probe_singleblock`] found that it works.
    pub block_step: bool,
    /// Test hook: single-step, but hand only the stops that follow a taken branch or a system
    /// call to the block-step logic, as a working branch trap would. With `block_step` set, this
    /// exercises block decoding on machines whose hypervisor ignores BTF.
    pub emulate_block_step: bool,
    /// Run to the next instruction the decoder cannot tell with a debug-register breakpoint,
    /// single-step that one (`--step block`, see `hwstep.rs`).
    pub hw_step: bool,
    /// With `hw_step`: the kernel sets the resume flag after a breakpoint hit (the probe's finding).
    pub hw_rf_auto: bool,
    /// With `hw_step`: returns and indirect calls may be carried out by itrace (the CPU has no
    /// user shadow stack).
    pub hw_emulate_stack: bool,
    /// Region tracing: threads run untraced until a trigger starts them. Called with a process's
    /// executable mappings (once its program and libraries are loaded, or at attach), it returns
    /// the trigger addresses. `None` traces everything.
    /// An error (say, the library is not in the program) stops tracing and is reported.
    pub triggers: Option<&'a TriggerResolver<'a>>,
}

/// Errors that stop a recording before it starts.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot execute {program}: {source}")]
    Exec { program: String, source: std::io::Error },
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),
    #[error(
        "not permitted to trace pid {pid} ({errno}): it may be traced already (gdb, strace), belong to another user, \
         or be protected by Yama (see /proc/sys/kernel/yama/ptrace_scope; run as root or set it to 0)"
    )]
    NotPermitted { pid: i32, errno: Errno },
    #[error("ptrace {what} failed: {errno}")]
    Ptrace { what: &'static str, errno: Errno },
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// Maps keyed by addresses and thread ids: Fx hashing, as SipHash costs more than the lookups.
pub(super) type IntMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// The instruction a stopped thread will execute next.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    pub(super) pc: u64,
    pub(super) insn: Insn,
    /// For a system call: its number at entry (rax), for calls that never return.
    pub(super) entry_nr: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ThreadState {
    /// Seized (or auto-attached) but not yet stopped for the first time.
    New,
    /// Launched program waiting for its exec.
    Launching,
    Stepping,
    /// Region tracing: traced by ptrace but running at full speed until a trigger.
    Running,
    /// Tracing ended for it (trace-off written); waiting for it to go.
    Finished,
}

pub(super) struct Thread {
    pub(super) tid: i32,
    pub(super) pid: i32,
    pub(super) cpu: usize,
    pub(super) state: ThreadState,
    pub(super) pending: Option<Pending>,
    /// Instructions since this thread's last record.
    pub(super) icount: u32,
    pub(super) arch: X86,
    /// Signal passed on the last resume; the next stop may be a handler entry.
    pub(super) injected: Option<i32>,
    /// The pending system call returned a restart code: it will run again.
    pub(super) syscall_interrupted: bool,
    /// Time the pending system call was entered.
    pub(super) syscall_ts: u64,
    /// Skip counting at the next stop if it is at this pc (the report at the end of exec).
    pub(super) skip_report_at: Option<u64>,
    pub(super) original_affinity: Option<libc::cpu_set_t>,
    pub(super) name: String,
    /// Stopped and not yet resumed: detach it directly.
    pub(super) stopped: bool,
    /// Block-step emulation: pc of the instruction the last single step ran.
    pub(super) emu_prev: u64,
    /// Seized by `-p` (not created while traced).
    pub(super) attached: bool,
    /// Region tracing: nesting depth of ITraceOn calls.
    pub(super) region_depth: u32,
    /// Breakpoints were lifted for this thread's step: put them back at its next stop.
    pub(super) lifted_bps: bool,
    /// Running thread stepping once over a lifted breakpoint, then running on.
    pub(super) step_once: bool,
    /// That step was started: the SIGTRAP it ends with is ours.
    pub(super) in_step_once: bool,
    /// A vfork child we do not follow, sharing its parent's memory (and breakpoints): let it go
    /// once it has its own memory (exec).
    pub(super) release_at_exec: bool,
    /// Block mode: this resume single-steps (the block is ambiguous for the branch trap).
    pub(super) single_step_now: bool,
    /// Block mode: the system call that ends the running block and the instructions before it,
    /// known before it runs (an exec replaces the code a later walk would need).
    pub(super) planned_syscall: Option<(u64, Insn, u32)>,
    /// Debug-register mode: the run in progress.
    pub(super) hw_run: Option<super::hwstep::Run>,
    /// Debug-register mode: this thread's DR0, DR1 and DR7 as last written.
    pub(super) dr0: u64,
    pub(super) dr1: u64,
    pub(super) dr7: u64,
    /// Debug-register mode: the last resume was a single step.
    pub(super) hw_stepped: bool,
    /// Debug-register mode: the clock at the current stop (0: none), the timestamp of every
    /// record written at it: the branches of a run were not seen one by one, only at its end.
    pub(super) stop_ts: u64,
}

impl Thread {
    /// Debug-register mode: whether an enabled breakpoint of this thread is at `pc`.
    pub(super) fn armed(&self, pc: u64) -> bool {
        (self.dr7 & 1 != 0 && self.dr0 == pc) || (self.dr7 & 4 != 0 && self.dr1 == pc)
    }
}

pub(super) struct Process {
    /// Block mode: what is known of the block starting at an address.
    pub(super) ambiguous: IntMap<u64, super::block::BlockInfo>,
    pub(super) maps: Vec<Mapping>,
    pub(super) code: IntMap<u64, Insn>,
    pub(super) name: String,
    /// Region tracing: our breakpoints in this process.
    pub(super) bps: Breakpoints,
    /// Breakpoints taken out: a thread stopped by one just before must be moved back onto it.
    pub(super) retired: Vec<u64>,
    /// Whether the triggers have been resolved and inserted.
    pub(super) triggers_set: bool,
    /// Debug-register mode: what itrace can carry out itself of the instruction at an address.
    pub(super) emul: IntMap<u64, Option<super::hwstep::Emul>>,
}

impl Process {
    pub(super) fn new(maps: Vec<Mapping>, code: IntMap<u64, Insn>, name: String) -> Self {
        Process {
            ambiguous: IntMap::default(),
            maps,
            code,
            name,
            bps: Breakpoints::default(),
            retired: Vec::new(),
            triggers_set: false,
            emul: IntMap::default(),
        }
    }
}

pub(super) struct Session<'a> {
    pub(super) opts: &'a RecordOptions<'a>,
    pub(super) sink: Sink<'a>,
    pub(super) threads: IntMap<i32, Thread>,
    pub(super) procs: IntMap<i32, Process>,
    pub(super) cpus: Vec<usize>,
    pub(super) next_cpu: usize,
    pub(super) out: RecordOutcome,
    pub(super) detaching: Option<StopReason>,
    pub(super) launched: Option<i32>,
    /// Every process traced, for the JIT symbol maps read at the end.
    pub(super) seen_pids: Vec<i32>,
    /// Debug-register mode: stops that were not on the planned path (counts unreliable).
    pub(super) hw_lost: u64,
}

use itrace_format::now_ns;

/// Record `opts.target` into `buffers` until it exits, `opts.stop` is set, or a buffer fills (normal mode).
pub fn record(opts: &RecordOptions, buffers: &mut Buffers) -> Result<RecordOutcome, RecordError> {
    let mut s = Session {
        opts,
        sink: Sink::new(buffers),
        threads: IntMap::default(),
        procs: IntMap::default(),
        cpus: allowed_cpus(0),
        next_cpu: 0,
        out: RecordOutcome::default(),
        detaching: None,
        launched: None,
        seen_pids: Vec::new(),
        hw_lost: 0,
    };
    match &opts.target {
        Target::Launch { program, args, aslr, env } => s.launch(program, args, *aslr, env)?,
        Target::Attach { pid } => s.attach(*pid)?,
    }
    s.run();
    if s.hw_lost > 0 {
        eprintln!(
            "itrace: warning: {} stops off the decoded path in block mode; instruction counts may be off",
            s.hw_lost
        );
    }
    s.save_jit_maps();
    s.out.stop_reason.get_or_insert(StopReason::Exited);
    // out counts the partial blocks of trace-off records; the sink, the branches stored.
    s.out.branches += s.sink.branches;
    s.out.instructions += s.sink.instructions;
    s.out.write_error = s.sink.write_error();
    Ok(s.out)
}

pub(super) fn getregs(tid: i32) -> Result<libc::user_regs_struct, Errno> {
    ptrace::getregs(Pid::from_raw(tid))
}

impl Session<'_> {
    pub(super) fn new_thread(&self, tid: i32, pid: i32, cpu: usize) -> Thread {
        Thread {
            tid,
            pid,
            cpu,
            state: ThreadState::New,
            pending: None,
            icount: 0,
            arch: X86 { compat: false },
            injected: None,
            syscall_interrupted: false,
            syscall_ts: 0,
            skip_report_at: None,
            original_affinity: None,
            name: String::new(),
            stopped: false,
            emu_prev: 0,
            attached: false,
            region_depth: 0,
            lifted_bps: false,
            step_once: false,
            in_step_once: false,
            release_at_exec: false,
            single_step_now: false,
            planned_syscall: None,
            hw_run: None,
            dr0: 0,
            dr1: 0,
            dr7: 0,
            hw_stepped: false,
            stop_ts: 0,
        }
    }

    pub(super) fn emit_mte(&mut self, m: Mte) {
        let stored = self.sink.mte(m);
        self.after_store(stored);
    }

    /// A full buffer or a failed write stops tracing everything.
    pub(super) fn after_store(&mut self, stored: Stored) {
        match stored {
            Stored::Yes => {}
            Stored::Full => self.begin_detach(StopReason::BufferFull),
            Stored::Failed => self.begin_detach(StopReason::WriteError),
        }
    }

    pub(super) fn push_branch(&mut self, cpu: usize, b: Branch) {
        let stored = self.sink.branch(cpu, b);
        if stored == Stored::Full {
            // Not stored: its instructions go to the trace-off record's partial block.
            if let Some(t) = self.threads.get_mut(&(b.tid as i32)) {
                t.icount += b.icount;
            }
        }
        self.after_store(stored);
    }

    pub(super) fn push_control(&mut self, cpu: usize, r: Record) {
        let stored = self.sink.control(cpu, &r);
        self.after_store(stored);
    }

    /// Stop tracing everything: threads are detached as they stop.
    pub(super) fn begin_detach(&mut self, reason: StopReason) {
        if self.detaching.is_some() {
            return;
        }
        self.detaching = Some(reason);
        self.out.stop_reason = Some(reason);
        for t in self.threads.values() {
            if !t.stopped && t.state != ThreadState::Finished {
                let _ = ptrace::interrupt(Pid::from_raw(t.tid));
            }
        }
    }

    pub(super) fn run(&mut self) {
        // Stops between two looks at the flush clock; the stores look too, every so many records.
        const TICK_EVERY: u32 = 256;
        let mut until_tick = TICK_EVERY;
        while !self.threads.is_empty() {
            if self.detaching.is_none() && self.opts.stop.load(Ordering::Relaxed) {
                self.begin_detach(StopReason::Detached);
            }
            until_tick -= 1;
            if until_tick == 0 {
                until_tick = TICK_EVERY;
                let st = self.sink.tick();
                self.after_store(st);
            }
            let status = match waitpid(None, Some(WaitPidFlag::__WALL)) {
                Ok(s) => s,
                Err(Errno::EINTR) => {
                    // itrace's periodic signal: the traced threads may all be blocked, so
                    // write what has waited too long now.
                    let st = self.sink.tick();
                    self.after_store(st);
                    continue;
                }
                Err(_) => break, // ECHILD: nothing left
            };
            match status {
                WaitStatus::Exited(pid, code) => self.gone(pid.as_raw(), StopReason::Exited, code),
                WaitStatus::Signaled(pid, sig, _) => self.gone(pid.as_raw(), StopReason::Signaled, sig as i32),
                WaitStatus::Stopped(pid, sig) => self.on_signal_stop(pid.as_raw(), sig as i32),
                WaitStatus::PtraceEvent(pid, sig, ev) => self.on_event(pid.as_raw(), sig as i32, ev),
                WaitStatus::PtraceSyscall(pid) => self.resume(pid.as_raw(), 0),
                WaitStatus::Continued(_) | WaitStatus::StillAlive => {}
            }
        }
    }

    /// Resume a thread: one more step while tracing, or detach it once tracing is ending.
    pub(super) fn resume(&mut self, tid: i32, sig: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = false;
        t.stop_ts = 0;
        let pid = Pid::from_raw(tid);
        let sig_opt = Signal::try_from(sig).ok();
        if self.detaching.is_some() || t.state == ThreadState::Finished {
            self.detach_thread(tid, sig);
            return;
        }
        if t.state == ThreadState::Running {
            let once = std::mem::take(&mut t.step_once);
            t.in_step_once = once;
            t.injected = None;
            let r = if once { ptrace::step(pid, sig_opt) } else { ptrace::cont(pid, sig_opt) };
            if let Err(e) = r {
                if e != Errno::ESRCH {
                    self.finish_thread(tid, StopReason::TracerError, e as i32);
                }
            }
            return;
        }
        t.injected = (sig != 0).then_some(sig);
        if self.opts.hw_step {
            if sig == 0 && self.opts.triggers.is_some() {
                // A run may end on a trigger (ITraceOff, --stop): handle it before going on (a
                // second call for the same stop finds nothing to do).
                self.before_step(tid);
                if !matches!(self.threads.get(&tid), Some(t) if t.state == ThreadState::Stepping) {
                    return self.resume(tid, 0);
                }
            }
            if sig == 0 && self.hw_run(tid) {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.hw_stepped = false;
                }
                return;
            }
            self.hw_before_step(tid);
            if let Some(t) = self.threads.get_mut(&tid) {
                t.hw_stepped = true;
            }
        }
        if self.opts.triggers.is_some() {
            // Our breakpoint where the thread steps next: take it out for this one step.
            self.lift_breakpoint_at_pending(tid);
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if self.opts.block_step {
            let info = match t.pending {
                Some(p) => self.block_info(tid, p.pc),
                None => super::block::BlockInfo { ambiguous: true, syscall: None },
            };
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.single_step_now = info.ambiguous;
            t.planned_syscall = info.syscall;
        }
        let t = &self.threads[&tid];
        let r = if self.opts.block_step && !self.opts.emulate_block_step && !t.single_step_now {
            // SAFETY: plain ptrace request on our stopped tracee; the data argument is a signal number.
            let r = unsafe { libc::ptrace(super::probe::PTRACE_SINGLEBLOCK, tid, 0, sig as libc::c_long) };
            if r == 0 {
                Ok(())
            } else {
                Err(Errno::last())
            }
        } else {
            ptrace::step(pid, sig_opt)
        };
        if let Err(e) = r {
            if e != Errno::ESRCH {
                self.finish_thread(tid, StopReason::TracerError, e as i32);
            }
        }
    }

    pub(super) fn detach_thread(&mut self, tid: i32, sig: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if t.state != ThreadState::Finished {
            let reason = self.detaching.unwrap_or(StopReason::Detached);
            self.finish_thread(tid, reason, 0);
        }
        // Never leave an int3 of ours behind in a process we let go, nor a debug register.
        self.remove_breakpoints_via(tid);
        self.hw_clear(tid);
        let Some(t) = self.threads.get(&tid) else { return };
        if let Some(set) = t.original_affinity {
            set_affinity(tid, &set);
        }
        let _ = ptrace::detach(Pid::from_raw(tid), Signal::try_from(sig).ok());
        self.threads.remove(&tid);
    }

    /// Write the thread's trace-off record (once).
    pub(super) fn finish_thread(&mut self, tid: i32, reason: StopReason, value: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if t.state == ThreadState::Finished {
            return;
        }
        let was_tracing = t.state == ThreadState::Stepping;
        t.state = ThreadState::Finished;
        if !was_tracing {
            return;
        }
        let (cpu, pid, icount) = (t.cpu, t.pid, t.icount);
        let pc = t.pending.map(|p| p.pc).unwrap_or(0);
        t.icount = 0;
        self.out.instructions += icount as u64;
        let ts = now_ns();
        let r = TraceOff { ts, reason, pid: pid as u32, tid: tid as u32, pc, icount, value };
        self.push_control(cpu, Record::TraceOff(r));
    }

    /// A thread is gone (wait reported its exit).
    pub(super) fn gone(&mut self, tid: i32, reason: StopReason, value: i32) {
        if Some(tid) == self.launched {
            self.out.exit_status = Some(if reason == StopReason::Signaled { -value } else { value });
        }
        if let Some(t) = self.threads.get(&tid) {
            if t.state == ThreadState::Stepping {
                // No exit event was seen (killed by exec of another thread, or SIGKILL).
                let r = if reason == StopReason::Exited { StopReason::Vanished } else { reason };
                self.finish_thread(tid, r, value);
            }
        }
        self.threads.remove(&tid);
    }
}
