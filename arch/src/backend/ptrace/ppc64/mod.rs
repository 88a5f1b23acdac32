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
//! - no block stepping (PowerPC's branch trace is not offered by Linux's ptrace), and no
//!   region tracing yet (`--region`, `--start`, `--stop`: refused with a clear error).

mod regs;
mod step;

// The shared engine, under the names the files of this module use (`super::engine`, ...).
use super::{engine, launch, tables};

use super::PtraceRecorder;
use crate::backend::{output, BackendError, Recorded, Recorder, StepChoice};
use crate::isa::ppc64::Ppc64;
use crate::procfs;
use crate::{Arch as _, Reservation};
use engine::{record, IntMap, Pending, PtraceArch, RecordOptions, Session, Target, ThreadState};
use itrace_format::{LiveCounts, StepMethod};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use regs::{getregs, poke_insn};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The traced machine's instruction set and byte order.
pub(super) const PPC64LE: Ppc64 = Ppc64 { big_endian: false };

/// The instruction set a thread runs.
pub(super) type Isa = Ppc64;

/// Bytes read to decode one instruction: the 4-byte word the recorder steps by.
pub(super) const INSN_READ_LEN: usize = 4;

/// How threads are stepped: one instruction at a time, nothing to choose.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StepOptions;

/// A thread's PowerPC64 state.
#[derive(Default)]
pub(super) struct ThreadArch {
    /// Running through an atomic sequence.
    atomic: Option<step::AtomicRun>,
    /// Between the syscall-entry and syscall-exit stops of the pending system call.
    in_syscall: bool,
    /// The pending system call was interrupted: resume with PTRACE_SYSCALL (with the signal,
    /// unless it has a handler) so that a restart of it stops again.
    restart_via_syscall: bool,
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
    pub(super) fn copy_for_child(&self) -> Self {
        ProcessArch { traps: self.traps.clone(), ..ProcessArch::default() }
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

/// The session's PowerPC64 state: none.
#[derive(Default)]
pub(super) struct SessionArch;

impl PtraceArch for Session<'_> {
    /// Resume a thread: one more step (or an atomic sequence's run) while tracing, or detach
    /// it once tracing is ending.
    fn resume(&mut self, tid: i32, sig: i32) {
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
        let restart = std::mem::take(&mut t.arch.restart_via_syscall) && (sig == 0 || !regs::handled(tid, sig));
        let syscall_next = at_syscall && (sig == 0 || !regs::handled(tid, sig));
        let r = if stepping && (t.arch.in_syscall || restart || syscall_next) {
            t.injected = None;
            ptrace::syscall(pid, sig_opt)
        } else if sig == 0 && stepping && self.start_atomic(tid) {
            ptrace::cont(pid, None)
        } else {
            ptrace::step(pid, sig_opt)
        };
        self.after_resume(tid, r);
    }

    fn on_syscall_stop(&mut self, tid: i32) {
        self.syscall_stop(tid);
    }

    fn on_stepping_stop(&mut self, tid: i32, sig: i32) {
        if sig == libc::SIGTRAP && self.threads[&tid].arch.atomic.is_none() {
            if let Some(rip) = self.predicted_stop(tid) {
                // A step whose end the instruction tells: no registers to read.
                let mut inject = 0;
                self.on_step(tid, rip, &mut inject);
                self.resume(tid, inject);
                return;
            }
        }
        let Ok(regs) = getregs(tid) else {
            self.resume(tid, 0);
            return;
        };
        if self.threads[&tid].arch.atomic.is_some() {
            if self.atomic_done(tid, &regs, sig) {
                self.resume(tid, 0);
            } else {
                // A signal in the middle of the sequence: deliver it with a step.
                self.resume(tid, if sig == libc::SIGTRAP { 0 } else { sig });
            }
            return;
        }
        if sig != libc::SIGTRAP {
            // The program gets a signal: deliver it on the next step; the stop after shows the
            // handler.
            self.resume(tid, sig);
            return;
        }
        let mut inject = 0;
        self.on_step(tid, regs.nip, &mut inject);
        self.resume(tid, inject);
    }

    fn on_running_stop(&mut self, tid: i32, sig: i32) {
        // No region tracing here: no thread runs untraced. Pass the signal on.
        self.resume(tid, sig);
    }

    fn at_stop(&mut self, _tid: i32) {}

    fn at_event(&mut self, _tid: i32) {}

    fn at_interrupt(&mut self, tid: i32) {
        self.stopped_in_atomic(tid);
    }

    fn at_exec(&mut self, _tid: i32) {}

    fn region_exec(&mut self, _tid: i32, _pid: i32, _launching: bool) -> bool {
        false
    }

    fn region_start(&mut self, _tid: i32, _pid: i32) -> bool {
        false
    }

    fn first_pending(&mut self, tid: i32, pid: i32, at_exec: bool) -> Option<Pending> {
        self.report_syscalls(tid);
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
    /// its parent) its memory copied, and let it go.
    fn release_unfollowed(&mut self, tid: i32, _pid: i32) {
        let parent = procfs::ppid(tid).unwrap_or(0);
        let traps: Vec<(u64, u32)> =
            self.procs.get(&parent).map(|p| p.arch.traps.iter().map(|(&a, &w)| (a, w)).collect()).unwrap_or_default();
        for (addr, old) in traps {
            let _ = poke_insn(tid, addr, old);
        }
        self.threads.remove(&tid);
        let _ = ptrace::detach(Pid::from_raw(tid), None);
    }

    fn take_out_traps(&mut self, tid: i32) {
        self.end_atomic(tid);
    }

    fn warn_at_end(&self) {}
}

impl Session<'_> {
    /// Syscall stops say so (PTRACE_O_TRACESYSGOOD), beside the options tracing began with;
    /// threads and children created later inherit them.
    fn report_syscalls(&mut self, tid: i32) {
        let opts = launch::ptrace_options(self.opts) | ptrace::Options::PTRACE_O_TRACESYSGOOD;
        let _ = ptrace::setoptions(Pid::from_raw(tid), opts);
    }

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
            step: StepOptions,
            triggers: None,
        };
        output::record_into(s, buffers, self.arch, step.to_string(), |b| Ok(record(&opts, b)?))
    }
}
