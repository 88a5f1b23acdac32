//! The PowerPC64 little-endian (ELFv2) half of the ptrace recorder (the engine it plugs into
//! is `super`), itrace running on the traced machine; the trace's header says `ppc64le`, so
//! `itrace arc` and `report` on any machine read it.
//!
//! PowerPC specifics:
//! - registers through `PTRACE_GETREGS` (`struct pt_regs`: nip, gpr, link, ctr, ccr, ...:
//!   `regs.rs`);
//! - a load-reserve/store-conditional sequence cannot be single-stepped: the reservation is
//!   lost at every trap and the `stwcx.` fails forever (real POWER and Linux do the same). It
//!   runs to temporary trap breakpoints after its `stwcx.` and at its exits, as gdb does
//!   (`step.rs`);
//! - `sc` (and `scv`) with the number in r0, run from its syscall-entry stop to its syscall-exit
//!   stop (`step.rs`); `rt_sigreturn` through the vDSO's trampoline;
//! - region tracing (`--region`, `--start`, `--stop`) by the engine's `region.rs`, with `trap`
//!   as the breakpoint (SIGTRAP with the pc on it), returns for `ITraceOn`/`ITraceOff` through
//!   the link register (result in r3), and a function's breakpoint on its ELFv2 local entry
//!   point (after the TOC set-up of its global entry), which calls from its own module
//!   (`bl func+8`) and from others (PLT stubs, r12 set) both pass; a region started there
//!   begins at the local entry;
//! - block stepping (`PTRACE_SINGLEBLOCK`, MSR[BE]: a stop after every branch, taken or not)
//!   where the start-up probe sees it work, the straight runs between branches counted from the
//!   decoded code (`block.rs`); single steps otherwise, or with `--step instruction`. The
//!   in-process backend is not offered: user space cannot set MSR[SE] or MSR[BE].

mod block;
mod regs;
mod step;

// The shared engine, under the names the files of this module use (`super::engine`, ...).
use super::{blockstep, engine, probe_child, tables};

use super::PtraceRecorder;
use crate::backend::{BackendError, Recorded, Recorder};
use crate::isa::ppc64::Ppc64;
use crate::procfs;
use crate::{Arch as _, Reservation};
use engine::{IntMap, Pending, PtraceArch, Session, ThreadState};
use itrace_format::{LiveCounts, StepMethod};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use regs::{getregs, poke_insn, read_nip, setregs, TRAP};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The traced machine's instruction set and byte order.
pub(super) const PPC64LE: Ppc64 = Ppc64 { big_endian: false };

/// The instruction set a thread runs.
pub(super) type Isa = Ppc64;

/// Bytes read to decode one instruction: the 4-byte word the recorder steps by.
pub(super) const INSN_READ_LEN: usize = 4;

/// Syscall stops are asked for (PTRACE_O_TRACESYSGOOD from the start): `sc` runs between syscall stops.
pub(super) const SYSCALL_STOPS: bool = true;

impl StepOptions {
    /// Syscall stops are told from step stops (PTRACE_O_TRACESYSGOOD).
    pub(super) fn syscall_stops(&self) -> bool {
        SYSCALL_STOPS
    }
}

/// Region tracing: the breakpoint instruction (`trap`, little-endian).
pub(super) const BREAKPOINT: &[u8] = &TRAP.to_le_bytes();

/// Region tracing: the breakpoint a thread stopped by SIGTRAP with `pc` hit (a `trap` leaves
/// the pc on it).
pub(super) fn breakpoint_hit(pc: u64) -> u64 {
    pc
}

/// The TOC set-up an ELFv2 global entry point begins with (masks and values of its two words):
/// `addis r2,r12,HI` + `addi r2,r2,LO` (position-independent), `lis r2,HI` + `addi r2,r2,LO`
/// (static, not PIE), or `ld r2,-8(r12)` + `add r2,r2,r12` (large code model).
const GLOBAL_ENTRY_PROLOGUES: [[(u32, u32); 2]; 3] = [
    [(0xffff_0000, 0x3c4c_0000), (0xffff_0000, 0x3842_0000)],
    [(0xffff_0000, 0x3c40_0000), (0xffff_0000, 0x3842_0000)],
    [(0xffff_ffff, 0xe84c_fff8), (0xffff_ffff, 0x7c42_6214)],
];

/// Region tracing: where the breakpoint of the function at `addr` (its symbol: the global entry
/// point) goes: after its TOC set-up, on the local entry point, which calls from the function's
/// own module enter at (`bl func+8`) and calls through PLT stubs reach too.
pub(super) fn breakpoint_address(tid: i32, addr: u64) -> u64 {
    let Ok(word) = ptrace::read(Pid::from_raw(tid), addr as ptrace::AddressType) else { return addr };
    let word = word as u64;
    let insns = [word as u32, (word >> 32) as u32];
    let toc_setup =
        GLOBAL_ENTRY_PROLOGUES.iter().any(|p| p.iter().zip(insns).all(|(&(mask, value), i)| i & mask == value));
    if toc_setup {
        addr + 8
    } else {
        addr
    }
}

pub(super) fn pc_of(tid: i32) -> Result<u64, Errno> {
    read_nip(tid)
}

pub(super) fn set_pc(tid: i32, pc: u64) -> Result<(), Errno> {
    let mut regs = getregs(tid)?;
    regs.nip = pc;
    setregs(tid, &regs)
}

/// Return from the function the thread just entered, as its `blr` would (pc from the link
/// register), with `value` in r3 if given; the pc returned to.
pub(super) fn return_to_caller(tid: i32, value: Option<u64>) -> Option<u64> {
    let mut regs = getregs(tid).ok()?;
    regs.nip = regs.link;
    if let Some(v) = value {
        regs.gpr[3] = v;
    }
    setregs(tid, &regs).ok()?;
    Some(regs.nip)
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

/// A thread's PowerPC64 state.
#[derive(Default)]
pub(super) struct ThreadArch {
    /// Running through an atomic sequence.
    atomic: Option<step::AtomicRun>,
    /// Between the syscall-entry and syscall-exit stops of the pending system call.
    pub(super) in_syscall: bool,
    /// The pending system call was interrupted: resume with PTRACE_SYSCALL (with the signal,
    /// unless it has a handler) so that a restart of it stops again.
    pub(super) restart_via_syscall: bool,
    /// Block stepping: the block this resume runs, until its stop.
    block: Option<block::BlockRun>,
}

impl ThreadArch {
    /// The instruction set the thread runs.
    pub(super) fn isa(&self) -> Ppc64 {
        PPC64LE
    }
}

/// A process's PowerPC64 state.
#[derive(Default)]
pub(super) struct ProcessArch {
    /// Beside the decoded code: whether the instruction at an address is a load-reserve (asked
    /// before every step, so never read again from read-only code).
    load_reserve: IntMap<u64, bool>,
    /// Temporary traps of atomic runs in this process's memory: address, replaced instruction.
    traps: IntMap<u64, u32>,
}

impl ProcessArch {
    /// The state of a forked child. Another thread's atomic run may have traps in the memory the
    /// child copied: they come out of the child's copy at its first stop (`first_pending`).
    pub(super) fn copy_for_child(&self, _shares_memory: bool) -> Self {
        ProcessArch { traps: self.traps.clone(), ..ProcessArch::default() }
    }

    /// Whether a mapping is itrace's own, not the program's (none here).
    pub(super) fn hides(&self, _start: u64) -> bool {
        false
    }

    /// Code in `start..end` changed: forget what was learnt of it.
    pub(super) fn forget(&mut self, start: u64, end: u64, _unmapped: bool) {
        self.load_reserve.retain(|a, _| *a < start || *a >= end);
    }

    /// The bytes read at `pc` as the program has them (a trap of ours taken out).
    pub(super) fn unpatch(&self, pc: u64, bytes: &mut [u8]) {
        if let Some(old) = self.traps.get(&pc) {
            let n = bytes.len().min(4);
            bytes[..n].copy_from_slice(&old.to_le_bytes()[..n]);
        }
    }

    /// The instruction at `pc` (`bytes`) was cached as read-only code.
    pub(super) fn cached(&mut self, pc: u64, bytes: &[u8]) {
        self.load_reserve.insert(pc, PPC64LE.reservation(bytes) == Reservation::Load);
    }
}

/// The session's PowerPC64 state.
#[derive(Default)]
pub(super) struct SessionArch {
    /// Block stepping: stops off the planned block (counts may be off; warned at the end).
    block_lost: u64,
}

impl PtraceArch for Session<'_> {
    /// Resume a thread: one more step, block or atomic sequence's run while tracing, or detach
    /// it once tracing is ending.
    fn resume(&mut self, tid: i32, sig: i32) {
        if let Some(run) = self.threads.get_mut(&tid).and_then(|t| t.arch.block.take()) {
            // The block ended at a stop the engine handled without asking us (none is known to):
            // count what ran up to where the thread is.
            if let Ok(pc) = read_nip(tid) {
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
        let between = t.arch.atomic.is_none() && !t.arch.in_syscall;
        if sig == 0 && between && self.opts.triggers.is_some() {
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
        let at_syscall = t.pending.is_some_and(|p| p.insn.flow == itrace_decoders::Flow::Syscall);
        // An interrupted system call: a signal without a handler restarts it at once.
        let restart = std::mem::take(&mut t.arch.restart_via_syscall) && (sig == 0 || !regs::handled(tid, sig));
        let syscall_next = at_syscall && (sig == 0 || !regs::handled(tid, sig));
        let r = if stepping && (t.arch.in_syscall || restart || syscall_next) {
            t.injected = None;
            ptrace::syscall(pid, sig_opt)
        } else if sig == 0 && stepping && self.start_atomic(tid) {
            ptrace::cont(pid, None)
        } else if sig == 0 && stepping && self.opts.step.block {
            match self.plan_block(tid) {
                // Straight to the system call: its entry stop ends the block.
                Some(run) if run.to_syscall() => ptrace::syscall(pid, None),
                Some(_) => block::singleblock(tid),
                None => ptrace::step(pid, None),
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
        if sig == libc::SIGTRAP && self.threads[&tid].arch.atomic.is_none() {
            // A plain step: the instruction tells where it ended (no registers to read), or
            // the pc alone does (one word by PTRACE_PEEKUSER, not the 48 of PTRACE_GETREGS).
            let pc = match self.predicted_stop(tid) {
                Some(pc) => pc,
                None => match read_nip(tid) {
                    Ok(pc) => pc,
                    Err(_) => {
                        self.resume(tid, 0);
                        return;
                    }
                },
            };
            let mut inject = 0;
            self.on_step(tid, pc, &mut inject);
            self.resume(tid, inject);
            return;
        }
        if self.threads[&tid].arch.atomic.is_some() {
            let Ok(regs) = getregs(tid) else {
                self.resume(tid, 0);
                return;
            };
            if self.atomic_done(tid, &regs, sig) {
                self.resume(tid, 0);
            } else {
                // A signal in the middle of the sequence: deliver it with a step.
                self.resume(tid, if sig == libc::SIGTRAP { 0 } else { sig });
            }
            return;
        }
        // The program gets a signal: deliver it on the next step; the stop after shows the
        // handler.
        self.resume(tid, sig);
    }

    fn at_event(&mut self, _tid: i32) {}

    fn at_interrupt(&mut self, tid: i32) {
        self.stopped_in_atomic(tid);
        if let Some(run) = self.threads.get_mut(&tid).and_then(|t| t.arch.block.take()) {
            if let Ok(pc) = read_nip(tid) {
                self.block_stopped_at(tid, &run, pc);
            }
        }
    }

    fn at_exec(&mut self, _tid: i32) {}

    fn region_isa(&mut self, _tid: i32) -> Ppc64 {
        PPC64LE
    }

    fn region_ended(&mut self, _tid: i32) {}

    fn first_pending(&mut self, tid: i32, pid: i32, at_exec: bool) -> Option<Pending> {
        if !at_exec {
            self.remove_copied_traps(tid, pid);
        }
        let regs = getregs(tid).ok()?;
        let mut pc = regs.nip;
        if !at_exec && regs.trap & 0xfff0 == 0xc00 && regs.restarting() {
            // Stopped inside a system call that will be restarted: the kernel moves the pc back
            // onto the system call instruction when it resumes, so that is what runs next.
            pc -= 4;
        }
        let insn = self.decode(pid, PPC64LE, pc);
        Some(Pending { pc, insn, syscall_nr: regs.syscall_nr() })
    }

    fn exit_syscall_nr(&mut self, tid: i32, _signaled: bool) -> u64 {
        // Known before the call ran (r0 or its syscall-entry stop).
        self.threads.get(&tid).and_then(|t| t.pending).map_or(u64::MAX, |p| p.syscall_nr)
    }

    /// A child process we do not follow: take out the traps of atomic runs (of other threads of
    /// its parent) and the region breakpoints its memory copied, and let it go.
    fn release_unfollowed(&mut self, tid: i32, pid: i32) {
        let parent = procfs::ppid(tid).unwrap_or(0);
        let traps: Vec<(u64, u32)> =
            self.procs.get(&parent).map(|p| p.arch.traps.iter().map(|(&a, &w)| (a, w)).collect()).unwrap_or_default();
        for (addr, old) in traps {
            let _ = poke_insn(tid, addr, old);
        }
        self.release_child(tid, pid);
    }

    fn take_out_traps(&mut self, tid: i32) {
        self.end_atomic(tid);
        self.remove_breakpoints_via(tid);
    }

    fn warn_at_end(&self) {
        if self.arch.block_lost > 0 {
            eprintln!(
                "itrace: warning: {} stops off the decoded path in block mode; instruction counts may be off",
                self.arch.block_lost
            );
        }
    }
}

impl Session<'_> {
    /// A new process's first stop: the traps its memory copied from its parent come out (the
    /// parent's runs take out their own).
    fn remove_copied_traps(&mut self, tid: i32, pid: i32) {
        let copied = self.procs.get_mut(&pid).map(|p| std::mem::take(&mut p.arch.traps)).unwrap_or_default();
        let running_here = self.threads.values().any(|t| t.pid == pid && t.arch.atomic.is_some());
        if running_here {
            // Traps of this process's own runs (not a copy): leave them.
            if let Some(p) = self.procs.get_mut(&pid) {
                p.arch.traps = copied;
            }
            return;
        }
        for (addr, old) in copied {
            let _ = poke_insn(tid, addr, old);
        }
    }
}

impl Recorder for PtraceRecorder {
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<Recorded, BackendError> {
        // Block steps only where the probe saw them work.
        let step = blockstep::choose_step(&self.settings, block::probe_singleblock)?;
        self.record_with(live, stop, step, StepOptions { block: step == StepMethod::PtraceSingleBlock })
    }
}
