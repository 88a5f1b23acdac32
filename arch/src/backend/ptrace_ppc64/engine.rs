//! The stepping loop on PowerPC64. One tracer thread waits for every traced thread and turns
//! each stop into records.
//!
//! At each stop the thread's next instruction is decoded (from a cache for read-only code)
//! and kept as `pending`; at the following stop, the new pc tells whether `pending` was a taken
//! branch. System calls are recognised from the instruction, signal deliveries from the stop.

use super::regs::Regs;
use crate::backend::sink::{Sink, Stored};
use crate::backend::RecordOutcome;
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

/// What to trace.
#[derive(Clone, Debug)]
pub enum Target {
    /// Start `program` with `args` (argv[0] included), our environment plus `env`, and trace
    /// it from its first instruction.
    Launch { program: PathBuf, args: Vec<OsString>, aslr: bool, env: Vec<(OsString, OsString)> },
    /// Attach to every thread of a running process.
    Attach { pid: i32 },
}

/// Finds the region triggers of process `pid` among its executable mappings (none on
/// PowerPC64 yet: see the module's documentation).
pub type TriggerResolver<'a> = dyn Fn(i32, &[Mapping]) -> Result<Vec<u64>, String> + 'a;

/// How to record.
pub struct RecordOptions<'a> {
    pub target: Target,
    /// Trace child processes (fork, vfork, clone without CLONE_THREAD).
    pub follow_forks: bool,
    /// Trace threads created after the start.
    pub follow_threads: bool,
    /// Set (by a signal handler or timer) to stop tracing, detach and finish.
    pub stop: &'a AtomicBool,
    /// Region tracing (`None`: everything is traced; the only choice here for now).
    pub triggers: Option<&'a TriggerResolver<'a>>,
}

/// Errors that stop a recording before it starts (the same words as on x86_64).
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
    /// For a system call: its number (r0) before it runs.
    pub(super) nr: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ThreadState {
    /// Seized (or auto-attached) but not yet stopped for the first time.
    New,
    /// Launched program waiting for its exec.
    Launching,
    Stepping,
    /// Tracing ended for it (trace-off written); waiting for it to go.
    Finished,
}

/// An atomic sequence running to its temporary breakpoints.
#[derive(Clone, Debug)]
pub(super) struct AtomicRun {
    /// The load-reserve and the store-conditional.
    pub(super) start: u64,
    pub(super) end: u64,
    /// Branches leaving the sequence: (from, to, flow).
    pub(super) exits: Vec<(u64, u64, itrace_decoders::Flow)>,
    /// Where the traps are, and the instructions they replaced.
    pub(super) traps: Vec<(u64, u32)>,
}

pub(super) struct Thread {
    pub(super) tid: i32,
    pub(super) pid: i32,
    pub(super) cpu: usize,
    pub(super) state: ThreadState,
    pub(super) pending: Option<Pending>,
    /// Instructions since this thread's last record.
    pub(super) icount: u32,
    /// Signal passed on the last resume; the next stop may be a handler entry.
    pub(super) injected: Option<i32>,
    /// The pending system call ran and a signal stopped it on its way out.
    pub(super) syscall_interrupted: bool,
    /// Time the pending system call was entered.
    pub(super) syscall_ts: u64,
    /// Skip counting at the next stop if it is at this pc (the report at the end of exec).
    pub(super) skip_report_at: Option<u64>,
    pub(super) original_affinity: Option<libc::cpu_set_t>,
    pub(super) name: String,
    /// Stopped and not yet resumed: detach it directly.
    pub(super) stopped: bool,
    /// Seized by `-p` (not created while traced).
    pub(super) attached: bool,
    /// Running through an atomic sequence.
    pub(super) atomic: Option<AtomicRun>,
    /// Between the syscall-entry and syscall-exit stops of the pending system call.
    pub(super) in_syscall: bool,
    /// The pending system call was interrupted: resume with PTRACE_SYSCALL (with the signal,
    /// unless it has a handler) so that a restart of it stops again.
    pub(super) restart_via_syscall: bool,
}

pub(super) struct Process {
    pub(super) maps: Vec<Mapping>,
    pub(super) code: IntMap<u64, Insn>,
    /// Beside `code`: whether the instruction at an address is a load-reserve (asked before
    /// every step, so never read again from read-only code).
    pub(super) load_reserve: IntMap<u64, bool>,
    pub(super) name: String,
    /// Temporary traps of atomic runs in this process's memory: address, replaced instruction.
    pub(super) traps: IntMap<u64, u32>,
}

impl Process {
    pub(super) fn new(maps: Vec<Mapping>, code: IntMap<u64, Insn>, name: String) -> Self {
        Process { maps, code, name, load_reserve: IntMap::default(), traps: IntMap::default() }
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
}

use itrace_format::now_ns;

/// Record `opts.target` into `buffers` until it exits, `opts.stop` is set, or a buffer fills.
pub fn record(opts: &RecordOptions, buffers: &mut Buffers) -> Result<RecordOutcome, RecordError> {
    let mut s = Session {
        opts,
        sink: Sink::new(buffers),
        threads: IntMap::default(),
        procs: IntMap::default(),
        cpus: super::cpus::allowed_cpus(0),
        next_cpu: 0,
        out: RecordOutcome::default(),
        detaching: None,
        launched: None,
        seen_pids: Vec::new(),
    };
    match &opts.target {
        Target::Launch { program, args, aslr, env } => s.launch(program, args, *aslr, env)?,
        Target::Attach { pid } => s.attach(*pid)?,
    }
    s.run();
    s.save_jit_maps();
    s.out.stop_reason.get_or_insert(StopReason::Exited);
    // out counts the partial blocks of trace-off records; the sink, the branches stored.
    s.out.branches += s.sink.branches;
    s.out.instructions += s.sink.instructions;
    s.out.write_error = s.sink.write_error();
    Ok(s.out)
}

pub(super) fn getregs(tid: i32) -> Result<Regs, Errno> {
    super::regs::getregs(tid)
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
            injected: None,
            syscall_interrupted: false,
            syscall_ts: 0,
            skip_report_at: None,
            original_affinity: None,
            name: String::new(),
            stopped: false,
            attached: false,
            atomic: None,
            in_syscall: false,
            restart_via_syscall: false,
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
                WaitStatus::PtraceSyscall(pid) => self.on_syscall_stop(pid.as_raw()),
                WaitStatus::Continued(_) | WaitStatus::StillAlive => {}
            }
        }
    }

    /// Resume a thread: one more step (or an atomic sequence's run) while tracing, or detach
    /// it once tracing is ending.
    pub(super) fn resume(&mut self, tid: i32, sig: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = false;
        let pid = Pid::from_raw(tid);
        let sig_opt = Signal::try_from(sig).ok();
        if self.detaching.is_some() || t.state == ThreadState::Finished {
            self.detach_thread(tid, sig);
            return;
        }
        t.injected = (sig != 0).then_some(sig);
        let stepping = t.state == ThreadState::Stepping;
        let at_syscall = t.pending.is_some_and(|p| p.insn.flow == itrace_decoders::Flow::Syscall);
        // An interrupted system call: a signal without a handler restarts it at once.
        let restart = std::mem::take(&mut t.restart_via_syscall) && (sig == 0 || !super::regs::handled(tid, sig));
        let syscall_next = at_syscall && (sig == 0 || !super::regs::handled(tid, sig));
        let r = if stepping && (t.in_syscall || restart || syscall_next) {
            t.injected = None;
            ptrace::syscall(pid, sig_opt)
        } else if sig == 0 && stepping && self.start_atomic(tid) {
            ptrace::cont(pid, None)
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
        // Never leave a trap of ours behind in a process we let go.
        self.end_atomic(tid);
        let Some(t) = self.threads.get(&tid) else { return };
        if let Some(set) = t.original_affinity {
            super::cpus::set_affinity(tid, &set);
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
