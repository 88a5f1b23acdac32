//! The stepping loop, shared by every architecture. One tracer thread waits for every traced
//! thread and turns each stop into records.
//!
//! At each stop the thread's next instruction is decoded (from a cache for read-only code) and
//! kept as `pending`; at the following stop, the new pc tells whether `pending` was a taken
//! branch. Kernel transitions are recognised from the instruction itself (a system call) or
//! from the stop (signal delivery). What differs between architectures (registers, how a thread
//! is resumed, what a step stop means) is behind [`PtraceArch`], implemented once per
//! architecture in `super::arch`, which also owns the per-thread and per-process state of its
//! own (`Thread::arch`, `Process::arch`, `Session::arch`).

use super::arch::{Isa, ProcessArch, SessionArch, StepOptions, ThreadArch};
use super::cpus::*;
use super::region::{RegionProcess, RegionThread};
use crate::backend::sink::{Sink, Stored};
use crate::backend::RecordOutcome;
use crate::procfs::Mapping;
use itrace_decoders::Insn;
use itrace_format::{BatchStamp, Branch, Buffers, FormatError, Hop, Mte, Record, StopReason, TraceOff};
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

/// What reaching a region trigger means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TriggerKind {
    /// Start stepping the thread here (`--start SYMBOL`).
    Start,
    /// Stop stepping the thread here (`--stop SYMBOL`).
    Stop,
    /// The library's `ITraceOn`: start (or nest) a region and return to the caller.
    RegionOn,
    /// The library's `ITraceOff`: end (or unnest) a region and return to the caller.
    RegionOff,
    /// The library's `ITraceEnabled`: return whether the thread is traced.
    RegionEnabled,
    /// The program's entry point: its libraries are loaded, resolve the triggers now.
    Entry,
}

/// A trigger at a runtime address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trigger {
    pub addr: u64,
    pub kind: TriggerKind,
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
    /// How the architecture steps (block stepping and its variants on x86_64).
    // (ppc64 has one way only: nothing to read)
    #[allow(dead_code)]
    pub(super) step: StepOptions,
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
    #[error("pid {0} is a zombie: it has exited and waits for its parent to reap it; there is nothing to trace")]
    Zombie(i32),
    #[error("pid {pid} ({name}) is a kernel thread: it runs no user-space code to trace")]
    KernelThread { pid: i32, name: String },
    #[error("ptrace {what} failed: {errno}")]
    Ptrace { what: &'static str, errno: Errno },
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A setting of the environment the recorder cannot use (the message names it).
    #[error("{0}")]
    Setting(String),
}

/// Maps keyed by addresses and thread ids: Fx hashing, as SipHash costs more than the lookups.
pub(super) type IntMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// The instruction a stopped thread will execute next.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    pub(super) pc: u64,
    pub(super) insn: Insn,
    /// For a system call: its number before it runs (x86_64: rax at entry, for calls that never
    /// return; ppc64: r0, or the syscall-entry stop's).
    pub(super) syscall_nr: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ThreadState {
    /// Seized (or auto-attached) but not yet stopped for the first time.
    New,
    /// Launched program waiting for its exec.
    Launching,
    Stepping,
    /// Region tracing: traced by ptrace but running at full speed until a trigger (only where
    /// the architecture has region tracing: not on ppc64 yet).
    #[allow(dead_code)]
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
    /// Signal passed on the last resume; the next stop may be a handler entry.
    pub(super) injected: Option<i32>,
    /// The pending system call was interrupted (a restart code): it runs again, or a signal
    /// handler runs first.
    pub(super) syscall_interrupted: bool,
    /// Time the pending system call was entered.
    pub(super) syscall_ts: u64,
    /// Skip counting at the next stop if it is at this pc (the report at the end of exec).
    pub(super) skip_report_at: Option<u64>,
    pub(super) original_affinity: Option<libc::cpu_set_t>,
    /// The nice value the thread had before a detach raised its priority (`boost_to_stop`).
    pub(super) nice_before_detach: Option<i32>,
    pub(super) name: String,
    /// Stopped and not yet resumed: detach it directly.
    pub(super) stopped: bool,
    /// Seized by `-p` (not created while traced).
    pub(super) attached: bool,
    /// The clock at the current stop (0: none), the timestamp of every record written at it
    /// (x86_64's debug-register mode, where the branches of a run are seen only at its end).
    pub(super) stop_ts: u64,
    /// Normal mode, the buffer full: the instructions of the first branch record refused and
    /// before it, which end the trace. A stop that ran several blocks (block stepping) may
    /// refuse more; their instructions were never traced and are not counted.
    pub(super) icount_at_full: Option<u32>,
    /// Region tracing: where the thread is in its regions.
    pub(super) region: RegionThread,
    /// The architecture's own state of the thread.
    pub(super) arch: ThreadArch,
}

pub(super) struct Process {
    pub(super) maps: Vec<Mapping>,
    pub(super) code: IntMap<u64, Insn>,
    pub(super) name: String,
    /// Region tracing: our breakpoints in the process.
    pub(super) region: RegionProcess,
    /// The architecture's own state of the process.
    pub(super) arch: ProcessArch,
    /// The CPU affinity of its first thread we pinned, as it was: what a thread we never saw
    /// pinned gets back at a detach (it may have inherited a pin from its creator).
    pub(super) affinity: Option<libc::cpu_set_t>,
}

impl Process {
    pub(super) fn new(maps: Vec<Mapping>, code: IntMap<u64, Insn>, name: String) -> Self {
        Process { maps, code, name, region: RegionProcess::default(), arch: ProcessArch::default(), affinity: None }
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
    /// Processes traced, with their start times (for their JIT maps, read at the end).
    pub(super) seen_pids: Vec<(i32, Option<std::time::SystemTime>)>,
    /// The architecture's own state of the session (none on ppc64).
    #[allow(dead_code)]
    pub(super) arch: SessionArch,
}

use itrace_format::{branch_flags, now_ns, BranchKind};

/// Record `opts.target` into `buffers` until it exits, `opts.stop` is set, or a buffer fills (normal mode).
pub fn record(opts: &RecordOptions, buffers: &mut Buffers) -> Result<RecordOutcome, RecordError> {
    if opts.step.buffers_on_their_own_thread() {
        // Not in normal mode, where a full buffer stops tracing at the record it refused
        // (`Sink::threaded`).
        std::thread::scope(|scope| record_into(opts, Sink::threaded(scope, buffers)))
    } else {
        record_into(opts, Sink::new(buffers))
    }
}

fn record_into<'a>(opts: &'a RecordOptions<'a>, sink: Sink<'a>) -> Result<RecordOutcome, RecordError> {
    let mut s = Session {
        opts,
        // Sparse timestamps (docs/trace-format.md): one clock reading per 64 branch records of
        // a stream, as the qemu plugin does; a stop is 5-30 us, so 0.3-2 ms of resolution.
        sink: sink.share_clock(64),
        threads: IntMap::default(),
        procs: IntMap::default(),
        cpus: allowed_cpus(0),
        next_cpu: 0,
        out: RecordOutcome::default(),
        detaching: None,
        launched: None,
        seen_pids: Vec::new(),
        arch: SessionArch::default(),
    };
    s.check_settings().map_err(RecordError::Setting)?;
    match &opts.target {
        Target::Launch { program, args, aslr, env } => {
            s.launch(program, args, *aslr, env)?;
            // (after the fork: the program would inherit what the tracer sets for itself)
            opts.step.tracer_settings(s.sink.writer_tid());
        }
        Target::Attach { pid } => {
            opts.step.tracer_settings(s.sink.writer_tid());
            s.attach(*pid)?;
        }
    }
    s.run();
    s.at_end();
    s.warn_at_end();
    s.save_jit_maps();
    s.out.stop_reason.get_or_insert(StopReason::Exited);
    s.sink.finish();
    // out counts the partial blocks of trace-off records; the sink, the branches stored.
    s.out.branches += s.sink.branches;
    s.out.instructions += s.sink.instructions;
    s.out.write_error = s.sink.write_error();
    Ok(s.out)
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
            nice_before_detach: None,
            name: String::new(),
            stopped: false,
            attached: false,
            stop_ts: 0,
            icount_at_full: None,
            region: RegionThread::default(),
            arch: ThreadArch::default(),
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
            self.refused_at_full(&b);
        }
        self.after_store(stored);
    }

    /// [`Session::push_branch`] for each of thread `tid`'s user-mode branches `hops`, in one
    /// call to the buffers: a drained ring (only x86_64's translating recorder has rings),
    /// stamped by `stamp` (`Sink::stamped_branches`), `instructions` their counts' sum.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn push_stamped_branches(
        &mut self,
        cpu: usize,
        tid: u32,
        hops: &mut Vec<Hop>,
        stamp: BatchStamp,
        instructions: u64,
    ) {
        let (stored, outcome) = self.sink.stamped_branches(cpu, tid, hops, stamp, instructions);
        if outcome == Stored::Full {
            // Only the first one refused counts, as with `push_branch` one at a time.
            self.refused_at_full(&hops[stored].branch(stamp.ts(stored), tid));
        }
        self.after_store(outcome);
    }

    /// A full buffer refused `b`: its instructions go to the trace-off record's partial block.
    fn refused_at_full(&mut self, b: &Branch) {
        if let Some(t) = self.threads.get_mut(&(b.tid as i32)) {
            if t.icount_at_full.is_none() {
                t.icount += b.icount;
                t.icount_at_full = Some(t.icount);
            }
        }
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
        let mut waited_for = Vec::new();
        for t in self.threads.values_mut() {
            if !t.stopped && t.state != ThreadState::Finished {
                let _ = ptrace::interrupt(Pid::from_raw(t.tid));
                // A busy thread stops for the interrupt only when the scheduler gives it a CPU:
                // 8 busy threads on 2 CPUs (and the ones already let go) made a detach wait
                // 75 ms or more for the last of them. Raised now, each is picked at once; it
                // gets its own priority back before it is let go (`detach_thread`).
                t.nice_before_detach = boost_to_stop(t.tid);
                waited_for.push(t.tid);
            }
        }
        // Each may run on any CPU it may untraced to reach its stop (`unpin_thread`); the
        // instructions it runs until then are still recorded on its pinned CPU's stream.
        for tid in waited_for {
            self.unpin_thread(tid);
        }
    }

    pub(super) fn run(&mut self) {
        // Stops between two looks at the flush clock; the stores look too, every so many records.
        const TICK_EVERY: u32 = 256;
        let mut until_tick = TICK_EVERY;
        // Stops taken in one round (more wait for the next).
        const MAX_BATCH: usize = 256;
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while !self.threads.is_empty() {
            if self.detaching.is_none() && self.opts.stop.load(Ordering::Relaxed) {
                self.begin_detach(StopReason::Detached);
            }
            until_tick -= 1;
            if until_tick == 0 {
                until_tick = TICK_EVERY;
                let st = self.sink.tick();
                self.after_store(st);
                self.periodic();
            }
            let status = match waitpid(None, Some(WaitPidFlag::__WALL)) {
                Ok(s) => s,
                Err(Errno::EINTR) => {
                    // itrace's periodic signal: the traced threads may all be blocked, so
                    // write what has waited too long now.
                    let st = self.sink.tick();
                    self.after_store(st);
                    self.periodic();
                    continue;
                }
                Err(_) => break, // ECHILD: nothing left
            };
            // Every stop already there is taken before any thread is resumed: waitpid reports
            // the first stopped tracee of the kernel's list, so a thread that stops again as
            // soon as it is resumed (a full ring every millisecond in the code cache) would
            // otherwise be served alone, and the others would wait in their stops (8 threads
            // attached: 3 were ever traced).
            batch.push(status);
            while batch.len() < MAX_BATCH {
                match waitpid(None, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(s) => batch.push(s),
                }
            }
            for status in batch.drain(..) {
                self.dispatch(status);
            }
        }
    }

    fn dispatch(&mut self, status: WaitStatus) {
        match status {
            WaitStatus::Exited(pid, code) => self.gone(pid.as_raw(), StopReason::Exited, code),
            WaitStatus::Signaled(pid, sig, _) => self.gone(pid.as_raw(), StopReason::Signaled, sig as i32),
            WaitStatus::Stopped(pid, sig) => self.on_signal_stop(pid.as_raw(), sig as i32),
            WaitStatus::PtraceEvent(pid, sig, ev) => self.on_event(pid.as_raw(), sig as i32, ev),
            WaitStatus::PtraceSyscall(pid) => self.on_syscall_stop(pid.as_raw()),
            WaitStatus::Continued(_) | WaitStatus::StillAlive => {}
        }
    }

    /// A resume request failed (other than for a thread already gone): its trace ends there.
    pub(super) fn after_resume(&mut self, tid: i32, r: Result<(), Errno>) {
        if let Err(e) = r {
            if e != Errno::ESRCH {
                self.finish_thread(tid, StopReason::TracerError, e as i32);
            }
        }
    }

    pub(super) fn detach_thread(&mut self, tid: i32, sig: i32) {
        if !self.threads.contains_key(&tid) {
            return;
        }
        let sig = match self.detaching {
            Some(_) => match self.ready_to_let_go(tid, sig) {
                Some(sig) => sig,
                // On its way to where it may be let go: tried again at its next stop.
                None => return,
            },
            None => sig,
        };
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if t.state != ThreadState::Finished {
            let reason = self.detaching.unwrap_or(StopReason::Detached);
            self.finish_thread(tid, reason, 0);
        }
        // Never leave a breakpoint or trap of ours behind in a process we let go.
        self.take_out_traps(tid);
        self.undo_stop_eintr(tid);
        // A thread let go before we pinned it (made just before a detach) inherited its
        // creator's pin: it gets the process's own affinity.
        self.unpin_thread(tid);
        let Some(t) = self.threads.get(&tid) else { return };
        if let Some(nice) = t.nice_before_detach {
            set_nice(tid, nice);
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
        let (cpu, pid, icount) = (t.cpu, t.pid, t.icount_at_full.take().unwrap_or(t.icount));
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

/// A branch record for thread `t` ending its current block; resets its count.
/// `counts_insn`: the instruction at `from` executed and belongs to the block.
pub(super) fn branch(
    t: &mut Thread,
    counts_insn: bool,
    from: u64,
    to: u64,
    kind: BranchKind,
    flags: u8,
    aux: u64,
) -> Branch {
    if counts_insn {
        t.icount += 1;
    }
    let ts = if kind == BranchKind::Intrpt && flags == branch_flags::SYSCALL {
        t.syscall_ts
    } else if t.stop_ts != 0 {
        t.stop_ts
    } else {
        now_ns()
    };
    let icount = std::mem::take(&mut t.icount);
    Branch { icount, ..Branch::user(ts, t.tid as u32, from, to, kind, flags, aux as u16) }
}

/// The architecture's half of a session: what the shared engine (this file, `events.rs`,
/// `tables.rs`, `launch.rs`) calls where architectures differ. Implemented for [`Session`]
/// once, in `super::arch` (x86_64 or ppc64), chosen by `cfg(target_arch)` in `super`.
pub(super) trait PtraceArch {
    /// Resume a stopped thread: one more step (or block, or run) while tracing, or detach it
    /// once tracing is ending.
    fn resume(&mut self, tid: i32, sig: i32);
    /// A syscall stop (only where the architecture asks for them).
    fn on_syscall_stop(&mut self, tid: i32);
    /// A signal-delivery stop of a thread being stepped: a step trap, or a signal for the program.
    fn on_stepping_stop(&mut self, tid: i32, sig: i32);
    /// A ptrace event stop (clone, exec, exit, interrupt), after the thread is marked stopped.
    fn at_event(&mut self, tid: i32);
    /// An interrupt stop (PTRACE_EVENT_STOP) of a traced thread, before it is resumed or detached.
    fn at_interrupt(&mut self, tid: i32);
    /// Tracing ends and the stopped thread is about to be let go with `sig`: the signal to let
    /// it go with, or `None` when it is not yet where it may be let go and was set going to get
    /// there (x86_64's translating recorder steps a thread out of a stub); the detach is then
    /// tried again at its next stop.
    fn ready_to_let_go(&mut self, _tid: i32, sig: i32) -> Option<i32> {
        Some(sig)
    }
    /// An exec replaced the thread's program: forget what was planned in the old image.
    fn at_exec(&mut self, tid: i32);
    /// Region tracing: a thread starts stepping (at a trigger); the instruction set it runs,
    /// which the thread's state now holds.
    fn region_isa(&mut self, tid: i32) -> Isa;
    /// Region tracing: a thread's region ended, it runs on untraced.
    fn region_ended(&mut self, tid: i32);
    /// The instruction a thread runs first, from its registers, at the end of the launched
    /// program's exec (`at_exec`) or at its first stop (attached, new thread or child); sets
    /// the thread's own architecture state. `None`: its registers could not be read.
    fn first_pending(&mut self, tid: i32, pid: i32, at_exec: bool) -> Option<Pending>;
    /// The system call a thread that is exiting is in (an exit call, when it did not return).
    fn exit_syscall_nr(&mut self, tid: i32, signaled: bool) -> u64;
    /// A child process we do not follow: take what is ours out of its memory and let it go.
    fn release_unfollowed(&mut self, tid: i32, pid: i32);
    /// Before detaching a thread: take our breakpoints and traps out of its process.
    fn take_out_traps(&mut self, tid: i32);
    /// A thread our attach or detach stopped: a system call that the stop made fail with
    /// EINTR instead of restarting (epoll_wait, semop, sigtimedwait, socket calls with a
    /// timeout) is set to run again, as the kernel restarts the others; untraced, the program
    /// would not have seen that EINTR. No-op where the architecture does not do it.
    fn undo_stop_eintr(&mut self, _tid: i32) {}
    /// The recording ended, every thread let go or gone: leave in the processes that run on
    /// what the architecture leaves there for a later session.
    fn at_end(&mut self) {}
    /// The recording ended: warn about what made it less exact, if anything.
    fn warn_at_end(&self);
    /// Before anything is traced: the environment's settings for the architecture's recorder
    /// (an error names the setting and what it takes).
    fn check_settings(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Called now and then from the wait loop (at least at itrace's periodic signal): work
    /// that waits on time, such as collecting records threads keep themselves.
    fn periodic(&mut self) {}
}
