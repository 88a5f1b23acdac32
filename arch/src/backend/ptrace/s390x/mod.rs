//! The s390x (z/Architecture, big-endian) half of the ptrace recorder (the engine it plugs into
//! is `super`), itrace running on the traced machine; the trace's header says `s390x`, so
//! `itrace arc` and `report` on any machine read it.
//!
//! s390x specifics:
//! - registers through `PTRACE_GETREGSET` (`NT_PRSTATUS`: PSW mask and address, 16 general
//!   registers) and single words through `PTRACE_PEEKUSR` (`regs.rs`);
//! - instructions of 2, 4 or 6 bytes, decoded by `itrace_decoders::s390x`;
//! - block stepping (`PTRACE_SINGLEBLOCK`, the PER branch event: a stop after every *taken*
//!   branch, `si_addr` on the branch) where the start-up probe sees it work, the straight runs
//!   counted from the decoded code (`block.rs`); single steps with `--step instruction` (or
//!   where the probe fails). Under qemu's TCG (qemu-system-s390x 10) single steps miss the stop
//!   after conditional and some direct branches, so a single-stepped trace cannot be checked
//!   exactly there; block steps are exact;
//! - `svc` (the number in the instruction, or in r1 for `svc 0`), run from its syscall-entry
//!   stop to its syscall-exit stop (`step.rs`), the result in r2 (a restart as -ERESTART*);
//!   `rt_sigreturn` through the vDSO's trampoline;
//! - region tracing (`--region`, `--start`, `--stop`) by the engine's `region.rs`, with
//!   `0x0001` as the breakpoint (SIGTRAP, TRAP_BRKPT, the pc after it), returns for
//!   `ITraceOn`/`ITraceOff` through r14 (result in r2).
//!   The in-process backend is not offered: user space cannot set PER controls for itself.

mod block;
mod execute;
mod regs;
mod step;

// The shared engine, under the names the files of this module use (`super::engine`, ...).
use super::{blockstep, engine, probe_child, tables};

use super::PtraceRecorder;
use crate::backend::{BackendError, Recorded, Recorder};
use crate::isa::s390x::S390x;
use crate::procfs;
use block::{probe_singleblock, singleblock, BlockRun, Plan};
use engine::{IntMap, Pending, PtraceArch, Session, ThreadState};
use itrace_decoders::Flow;
use itrace_format::{LiveCounts, StepMethod};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use regs::{getregs, read_pc, setregs, write_pc};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The traced machine's instruction set.
pub(super) const S390X: S390x = S390x;

/// The instruction set a thread runs.
pub(super) type Isa = S390x;

/// Bytes read to decode one instruction: the longest s390x instruction.
pub(super) const INSN_READ_LEN: usize = itrace_decoders::s390x::MAX_INSN_LEN;

/// Syscall stops are asked for (PTRACE_O_TRACESYSGOOD from the start): `svc` runs between syscall stops.
pub(super) const SYSCALL_STOPS: bool = true;

impl StepOptions {
    /// Syscall stops are told from step stops (PTRACE_O_TRACESYSGOOD).
    pub(super) fn syscall_stops(&self) -> bool {
        SYSCALL_STOPS
    }
}

/// Region tracing: the breakpoint instruction (`0x0001`, which Linux turns into SIGTRAP for a
/// traced process).
pub(super) const BREAKPOINT: &[u8] = &[0x00, 0x01];

/// Region tracing: the breakpoint a thread stopped by SIGTRAP with `pc` hit (the pc is after
/// the 2-byte breakpoint).
pub(super) fn breakpoint_hit(pc: u64) -> u64 {
    pc.wrapping_sub(BREAKPOINT.len() as u64)
}

/// Region tracing: where the breakpoint of the function at `addr` goes (its first instruction).
pub(super) fn breakpoint_address(_tid: i32, addr: u64) -> u64 {
    addr
}

pub(super) fn pc_of(tid: i32) -> Result<u64, Errno> {
    read_pc(tid)
}

pub(super) fn set_pc(tid: i32, pc: u64) -> Result<(), Errno> {
    write_pc(tid, pc)
}

/// Return from the function the thread just entered, as its `br %r14` would, with `value` in r2
/// if given; the pc returned to.
pub(super) fn return_to_caller(tid: i32, value: Option<u64>) -> Option<u64> {
    let mut regs = getregs(tid).ok()?;
    regs.psw_addr = regs.gprs[14];
    if let Some(v) = value {
        regs.gprs[2] = v;
    }
    setregs(tid, &regs).ok()?;
    Some(regs.psw_addr)
}

/// How threads are stepped.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StepOptions {
    /// Block by block (`PTRACE_SINGLEBLOCK`), which the start-up probe saw work; else one
    /// instruction at a time.
    block: bool,
}

impl StepOptions {
    /// The tracer's own settings for the session: none here.
    pub(super) fn tracer_settings(&self, _writer: Option<i32>) {}

    /// The buffers get a writer thread of their own: not here (a stop per block is far
    /// slower than the encoding).
    pub(super) fn buffers_on_their_own_thread(&self) -> bool {
        false
    }

    /// The tracer pins itself to the CPU of the thread it steps (`cpus.rs`): always here.
    pub(super) fn tracer_follows_threads(&self) -> bool {
        true
    }
}

/// Conditional branches evaluated in a row by one resume before a block step is taken anyway
/// (a tight counting loop before a system call would otherwise recurse without bound).
const MAX_EMULATED_IN_ROW: u32 = 64;

/// A thread's s390x state.
#[derive(Default)]
pub(super) struct ThreadArch {
    /// Between the syscall-entry and syscall-exit stops of the pending system call.
    pub(super) in_syscall: bool,
    /// The pending system call was interrupted: resume with PTRACE_SYSCALL (with the signal,
    /// unless it has a handler) so that a restart of it stops again.
    pub(super) restart_via_syscall: bool,
    /// Block stepping: the block this resume runs, until its stop.
    block: Option<BlockRun>,
    /// Conditional branches evaluated by the current resume.
    emulated_in_row: u32,
}

impl ThreadArch {
    /// The instruction set the thread runs.
    pub(super) fn isa(&self) -> S390x {
        S390X
    }
}

/// A process's s390x state.
#[derive(Default)]
pub(super) struct ProcessArch {
    /// Block plans by start address, for read-only code (`block.rs`).
    plans: IntMap<u64, Plan>,
    /// The execute instructions (`ex`, `exrl`) of the decoded read-only code (`execute.rs`).
    executes: IntMap<u64, itrace_decoders::s390x::Execute>,
    /// The bytes of the decoded read-only code's branches, for evaluating them without reading
    /// the thread's memory again (`block.rs`).
    branch_bytes: IntMap<u64, [u8; 6]>,
}

impl ProcessArch {
    /// The state of a forked child: the same code, the same plans.
    pub(super) fn copy_for_child(&self, _shares_memory: bool) -> Self {
        ProcessArch {
            plans: self.plans.clone(),
            executes: self.executes.clone(),
            branch_bytes: self.branch_bytes.clone(),
        }
    }

    /// Whether a mapping is itrace's own, not the program's (none here).
    pub(super) fn hides(&self, _start: u64) -> bool {
        false
    }

    /// Code in `start..end` changed: forget the plans (a plan's path may run into it) and the
    /// execute instructions there.
    pub(super) fn forget(&mut self, start: u64, end: u64, _unmapped: bool) {
        self.plans.clear();
        self.executes.retain(|&pc, _| pc < start || pc >= end);
        self.branch_bytes.retain(|&pc, _| pc < start || pc >= end);
    }

    pub(super) fn unpatch(&self, _pc: u64, _bytes: &mut [u8]) {}

    /// An instruction entered the decoded-code cache: note it if it is an execute instruction.
    pub(super) fn cached(&mut self, pc: u64, bytes: &[u8]) {
        if let Some(ex) = itrace_decoders::s390x::execute(pc, bytes) {
            self.executes.insert(pc, ex);
        } else if itrace_decoders::s390x::decode(pc, bytes).flow != Flow::Next {
            let mut b = [0u8; 6];
            let n = bytes.len().min(6);
            b[..n].copy_from_slice(&bytes[..n]);
            self.branch_bytes.insert(pc, b);
        }
    }
}

/// The session's s390x state.
#[derive(Default)]
pub(super) struct SessionArch {
    /// Block stepping: stops off the decoded path (counts may be off; warned at the end).
    block_lost: u64,
    /// Block stepping: system calls a block ran through unseen (a conditional branch not
    /// evaluated here before them); their records are missing.
    unseen_syscalls: u64,
}

impl PtraceArch for Session<'_> {
    /// Resume a thread: one more step or block while tracing, or detach it once tracing is
    /// ending.
    fn resume(&mut self, tid: i32, sig: i32) {
        if let Some(run) = self.threads.get_mut(&tid).and_then(|t| t.arch.block.take()) {
            // The block ended at a stop the engine handled without asking us: count what ran up
            // to where the thread is.
            if let Ok(pc) = read_pc(tid) {
                self.block_stopped_at(tid, &run, pc);
            }
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = false;
        let pid = Pid::from_raw(tid);
        let sig_opt = Signal::try_from(sig).ok();
        if self.detaching.is_some() || t.state == ThreadState::Finished {
            self.detach_thread(tid, sig);
            return;
        }
        if t.state == ThreadState::Running {
            return self.resume_running(tid, sig);
        }
        if sig == 0 && !t.arch.in_syscall && self.opts.triggers.is_some() {
            // A region trigger where the thread goes next (ITraceOff, --stop, ...)? It may end
            // the region (a second call for the same stop finds nothing to do).
            self.before_step(tid);
            if !matches!(self.threads.get(&tid), Some(t) if t.state == ThreadState::Stepping) {
                return self.resume(tid, 0);
            }
            // Our breakpoint where the thread steps next: take it out for this one step.
            self.lift_breakpoint_at_pending(tid);
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.injected = (sig != 0).then_some(sig);
        let stepping = t.state == ThreadState::Stepping;
        let pending = t.pending;
        let at_syscall = pending.is_some_and(|p| p.insn.flow == Flow::Syscall);
        let handled = sig != 0 && procfs::signal_has_handler(tid, sig);
        // An interrupted system call: a signal without a handler restarts it at once.
        let restart = std::mem::take(&mut t.arch.restart_via_syscall) && !handled;
        let syscall_next = at_syscall && !handled;
        let r = if stepping && (t.arch.in_syscall || restart || syscall_next) {
            t.injected = None;
            t.arch.emulated_in_row = 0;
            ptrace::syscall(pid, sig_opt)
        } else if stepping && handled {
            // The kernel stops at the handler's entry (ptrace_notify) before anything runs.
            ptrace::step(pid, sig_opt)
        } else if stepping && self.opts.step.block {
            match pending {
                Some(p) => self.resume_block(tid, p, sig),
                None => ptrace::step(pid, sig_opt),
            }
        } else {
            ptrace::step(pid, sig_opt)
        };
        self.after_resume(tid, r);
    }

    fn on_syscall_stop(&mut self, tid: i32) {
        self.syscall_stop(tid);
    }

    fn on_stepping_stop(&mut self, tid: i32, sig: i32) {
        if let Some(run) = self.threads.get_mut(&tid).and_then(|t| t.arch.block.take()) {
            return self.block_stop(tid, sig, &run);
        }
        if sig == libc::SIGTRAP {
            // A plain step: the instruction tells where it ended (no registers to read), or
            // the pc alone does.
            let pc = match self.predicted_stop(tid) {
                Some(pc) => pc,
                None => match read_pc(tid) {
                    Ok(pc) => pc,
                    Err(_) => return self.resume(tid, 0),
                },
            };
            self.on_step(tid, pc);
            self.resume(tid, 0);
            return;
        }
        // The program gets a signal: deliver it on the next step; the stop after shows the
        // handler.
        self.resume(tid, sig);
    }

    fn at_event(&mut self, _tid: i32) {}

    fn at_interrupt(&mut self, tid: i32) {
        if let Some(run) = self.threads.get_mut(&tid).and_then(|t| t.arch.block.take()) {
            if let Ok(pc) = read_pc(tid) {
                self.block_stopped_at(tid, &run, pc);
            }
        }
    }

    fn at_exec(&mut self, tid: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.arch.block = None;
        }
    }

    fn region_isa(&mut self, _tid: i32) -> S390x {
        S390X
    }

    fn region_ended(&mut self, _tid: i32) {}

    fn first_pending(&mut self, tid: i32, pid: i32, at_exec: bool) -> Option<Pending> {
        let regs = getregs(tid).ok()?;
        let mut pc = regs.psw_addr;
        if !at_exec && regs.restarting() {
            // Stopped inside a system call that will be restarted: the kernel moves the pc back
            // onto the `svc` when it resumes, so that is what runs next.
            let before = self.decode(pid, S390X, pc.wrapping_sub(2));
            if before.flow == Flow::Syscall && before.len == 2 {
                pc -= 2;
            }
        }
        let insn = self.decode_resolved(tid, pid, pc);
        Some(Pending { pc, insn, syscall_nr: 0 })
    }

    fn exit_syscall_nr(&mut self, tid: i32, signaled: bool) -> u64 {
        if let Some(run) = self.threads.get_mut(&tid).and_then(|t| t.arch.block.take()) {
            // Exiting inside a block step (one not planned to its system call): count what ran,
            // to the exit's `svc` when the thread is just after one, else to where it stopped
            // (killed, or ended by another thread's exit_group).
            if let Ok(regs) = getregs(tid) {
                let pid = self.threads[&tid].pid;
                let svc = regs.psw_addr.wrapping_sub(2);
                let after_svc = !signaled && self.decode(pid, S390X, svc).flow == Flow::Syscall;
                self.block_stopped_at(tid, &run, if after_svc { svc } else { regs.psw_addr });
                if after_svc {
                    let nr = self.syscall_nr(pid, svc, &regs);
                    if let Some(p) = self.threads.get_mut(&tid).and_then(|t| t.pending.as_mut()) {
                        p.syscall_nr = nr;
                    }
                }
            }
        }
        // Known at its syscall-entry stop.
        self.threads.get(&tid).and_then(|t| t.pending).map_or(u64::MAX, |p| p.syscall_nr)
    }

    fn release_unfollowed(&mut self, tid: i32, pid: i32) {
        self.release_child(tid, pid);
    }

    fn take_out_traps(&mut self, tid: i32) {
        self.remove_breakpoints_via(tid);
    }

    fn warn_at_end(&self) {
        if self.arch.block_lost > 0 {
            eprintln!(
                "itrace: warning: {} stops off the decoded path in block mode; instruction counts may be off",
                self.arch.block_lost
            );
        }
        if self.arch.unseen_syscalls > 0 {
            eprintln!(
                "itrace: warning: {} system calls ran inside block steps unseen; their records are missing",
                self.arch.unseen_syscalls
            );
        }
    }
}

impl Session<'_> {
    /// Block stepping: resume thread `tid` (pending instruction `p`, delivering `sig` if not 0,
    /// a signal without a handler) by its plan.
    fn resume_block(&mut self, tid: i32, p: Pending, sig: i32) -> Result<(), Errno> {
        let pid = Pid::from_raw(tid);
        let sig_opt = Signal::try_from(sig).ok();
        let plan = if sig == 0 { self.plan(tid, p.pc) } else { Plan::Block(None) };
        // An execute instruction is never single-stepped: under qemu 10's TCG a single step of
        // one panicked the guest's kernel ("Corrupt kernel stack"); it is block-stepped, or
        // evaluated when it runs a conditional branch.
        let executes = plan == Plan::One && self.is_execute(self.threads[&tid].pid, p.pc);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        match plan {
            Plan::Block(sole_end) => {
                t.arch.emulated_in_row = 0;
                t.arch.block = Some(BlockRun { start: p.pc, syscall: None, sole_end });
                singleblock(tid, sig)
            }
            Plan::ToSyscall(svc) => {
                t.arch.emulated_in_row = 0;
                t.arch.block = Some(BlockRun { start: p.pc, syscall: Some(svc), sole_end: None });
                ptrace::syscall(pid, sig_opt)
            }
            Plan::One => match p.insn.flow {
                Flow::Next if !executes => ptrace::step(pid, None),
                Flow::CondJump | Flow::CondCall | Flow::CondReturn if t.arch.emulated_in_row < MAX_EMULATED_IN_ROW => {
                    t.arch.emulated_in_row += 1;
                    match self.emulate_branch(tid, p.pc, p.insn) {
                        Some(to) => {
                            self.on_step(tid, to);
                            self.resume(tid, 0);
                            Ok(())
                        }
                        None => {
                            let t = self.threads.get_mut(&tid).expect("thread exists");
                            t.arch.block = Some(BlockRun { start: p.pc, syscall: None, sole_end: None });
                            singleblock(tid, 0)
                        }
                    }
                }
                // A branch: a block step stops right after it (a single step may not, under
                // qemu's TCG). An execute instruction running a plain one: a block step too (a
                // system call after a later conditional branch may then run unseen: counted and
                // warned about at the end).
                _ => {
                    t.arch.emulated_in_row = 0;
                    t.arch.block = Some(BlockRun { start: p.pc, syscall: None, sole_end: None });
                    singleblock(tid, 0)
                }
            },
        }
    }
}

impl Recorder for PtraceRecorder {
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<Recorded, BackendError> {
        // Block steps only where the probe saw them work.
        let step = blockstep::choose_step(&self.settings, probe_singleblock)?;
        self.record_with(live, stop, step, StepOptions { block: step == StepMethod::PtraceSingleBlock })
    }
}
