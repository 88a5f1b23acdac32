//! A single step: whether the pending instruction was a taken branch, a system call or a
//! signal delivery, and the record that says so; and the atomic sequences that run to a
//! breakpoint instead of being stepped.

use super::engine::*;
use super::regs::{getregs, poke_insn, Regs, TRAP};
use super::tables::read_mem;
use super::PPC64LE;
use crate::{Arch, Reservation};
use itrace_decoders::Flow;
use itrace_format::{branch_flags, now_ns, Branch, BranchKind};
use nix::sys::ptrace;
use nix::unistd::Pid;

/// The longest load-reserve ... store-conditional sequence run to a breakpoint (gdb's limit).
const MAX_ATOMIC_SEQUENCE: usize = 16;

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

impl Session<'_> {
    /// The core: a thread stopped after a step at `rip`. Classify what ran, write records,
    /// decode what runs next.
    pub(super) fn on_step(&mut self, tid: i32, rip: u64, inject: &mut i32) {
        let t = self.threads.get_mut(&tid).expect("stepping thread exists");
        let (cpu, pid) = (t.cpu, t.pid);
        let mut out: [Option<Branch>; 2] = [None, None];
        let mut syscall_done: Option<u64> = None;
        if let Some(p) = t.pending {
            if rip == p.pc
                && t.injected.is_none()
                && self.procs.get(&pid).is_some_and(|pr| pr.arch.traps.contains_key(&rip))
            {
                // Another thread's atomic run has a trap here: wait (step again) until it is out.
                return;
            }
            let t = self.threads.get_mut(&tid).expect("stepping thread exists");
            let next = p.pc.wrapping_add(4);
            let injected = t.injected.take();
            // A signal was delivered: the kernel reports the handler's first instruction, before
            // it runs, with ptrace_notify(SIGTRAP) (si_code SIGTRAP). A real step after an
            // ignored signal says TRAP_TRACE.
            let handler_entry = injected.is_some()
                && ptrace::getsiginfo(Pid::from_raw(tid)).map(|si| si.si_code == libc::SIGTRAP).unwrap_or(false);
            if t.skip_report_at == Some(rip) {
                t.skip_report_at = None;
            } else if handler_entry {
                let signo = injected.unwrap_or(0) as u64;
                let now = now_ns();
                if std::mem::take(&mut t.syscall_interrupted) && p.insn.flow == Flow::Syscall {
                    // The system call ran and was interrupted by this signal.
                    out[0] = Some(branch(t, true, p.pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, p.syscall_nr));
                } else {
                    out[0] = Some(branch(t, false, p.pc, 0, BranchKind::Intrpt, branch_flags::SIGNAL, signo));
                }
                t.syscall_ts = now;
                let mut k = branch(t, false, 0, rip, BranchKind::Iret, branch_flags::SIGNAL, signo);
                k.kernel = true;
                out[1] = Some(k);
            } else {
                t.skip_report_at = None;
                match p.insn.flow {
                    Flow::Syscall if rip == p.pc => {
                        // Interrupted and restarted without a handler: it runs again.
                        t.syscall_interrupted = false;
                        return;
                    }
                    Flow::Syscall => {
                        // Stepped with a signal that was not handled (system calls otherwise run
                        // between syscall stops): the step ran past the next instruction too.
                        t.syscall_interrupted = false;
                        let nr = p.syscall_nr;
                        out[0] = Some(branch(t, true, p.pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, nr));
                        let mut k = branch(t, false, 0, rip, BranchKind::Iret, branch_flags::SYSCALL, nr);
                        k.kernel = true;
                        out[1] = Some(k);
                        syscall_done = Some(nr);
                    }
                    Flow::Interrupt if rip == p.pc => {
                        // A trap instruction that trapped: the program's own SIGTRAP; deliver it.
                        t.icount += 1;
                        let sig = libc::SIGTRAP as u64;
                        out[0] = Some(branch(t, false, p.pc, 0, BranchKind::Intrpt, branch_flags::SIGNAL, sig));
                        *inject = libc::SIGTRAP;
                    }
                    flow => {
                        t.icount += 1;
                        if flow.always_branches() || rip != next {
                            let kind = if flow == Flow::Next { BranchKind::Other } else { flow.branch_kind() };
                            out[0] = Some(branch(t, false, p.pc, rip, kind, 0, 0));
                        }
                    }
                }
            }
        }
        for b in out.into_iter().flatten() {
            self.push_branch(cpu, b);
        }
        if let Some(nr) = syscall_done {
            self.after_syscall(tid, pid, nr);
        }
        self.set_pending(tid, rip);
    }

    /// A syscall stop. A system call instruction is not single-stepped: the step would run the
    /// instruction after it too (PowerPC does not trace `sc`, and Linux reports no step at a
    /// system call's end there), so it runs from a syscall-entry stop to its syscall-exit stop,
    /// where the pc is where it returns (for rt_sigreturn, the interrupted code), and a single
    /// step goes on from there.
    pub(super) fn syscall_stop(&mut self, tid: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = true;
        if t.state != ThreadState::Stepping {
            self.resume(tid, 0);
            return;
        }
        let Ok(regs) = getregs(tid) else {
            self.resume(tid, 0);
            return;
        };
        if let Some(run) = self.threads.get_mut(&tid).and_then(|t| t.arch.block.take()) {
            // The system call that ends the block (the pc is after it): the block ran up to it.
            if run.to_syscall() && regs.nip == run.end.wrapping_add(4) {
                self.block_ended(tid, &run);
            } else {
                self.block_stopped_at(tid, &run, regs.nip.wrapping_sub(4));
            }
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        if !t.arch.in_syscall {
            t.arch.in_syscall = true;
            t.syscall_ts = now_ns();
            if let Some(p) = t.pending.as_mut() {
                p.syscall_nr = regs.syscall_nr();
            }
            self.resume(tid, 0);
            return;
        }
        let restarting = regs.restarting();
        self.syscall_exit(tid, regs.nip, restarting);
    }

    /// Decode the thread's next instruction, at `pc`.
    pub(in super::super) fn set_pending(&mut self, tid: i32, pc: u64) {
        let pid = self.threads[&tid].pid;
        let insn = self.decode(pid, PPC64LE, pc);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.pending = Some(Pending { pc, insn, syscall_nr: 0 });
    }

    /// Where a thread's single step ends when that can be told without its registers: after an
    /// instruction that is not a branch, or a direct jump or call (with no trap of ours in its
    /// process that it could have stopped at, and no signal delivered).
    pub(super) fn predicted_stop(&self, tid: i32) -> Option<u64> {
        let t = self.threads.get(&tid)?;
        let p = t.pending?;
        if t.injected.is_some() || t.skip_report_at.is_some() || !self.procs.get(&t.pid)?.arch.traps.is_empty() {
            return None;
        }
        match (p.insn.flow, p.insn.target) {
            (Flow::Next, _) => Some(p.pc + 4),
            (Flow::Jump | Flow::Call, Some(to)) => Some(to),
            _ => None,
        }
    }

    /// Before a resume: when the pending instruction starts a load-reserve ... store-conditional
    /// sequence that holds only straight code and branches, put traps after its
    /// store-conditional and at its exits, for a continue to run it whole. Returns whether it did.
    pub(super) fn start_atomic(&mut self, tid: i32) -> bool {
        let t = &self.threads[&tid];
        let (Some(p), pid) = (t.pending, t.pid) else { return false };
        if !self.is_load_reserve(pid, p.pc) {
            return false;
        }
        let start = p.pc;
        let mut exits = Vec::new();
        let mut end = None;
        let mut a = start;
        for _ in 0..MAX_ATOMIC_SEQUENCE {
            let insn = self.decode(pid, PPC64LE, a);
            if a != start && PPC64LE.reservation(&self.insn_bytes(pid, a)) == Reservation::Store {
                end = Some(a);
                break;
            }
            match (insn.flow, insn.target) {
                (Flow::Next, _) => {}
                (Flow::CondJump | Flow::Jump, Some(to)) => exits.push((a, to, insn.flow)),
                // A call, return, system call or indirect branch inside: step it and hope.
                _ => return false,
            }
            a = a.wrapping_add(4);
        }
        let Some(end) = end else { return false };
        // Branches inside the sequence do not leave it: the straight-path count covers them.
        exits.retain(|&(_, to, _)| to < start || to > end);
        let mut stops = vec![end + 4];
        for &(_, to, _) in &exits {
            if !stops.contains(&to) {
                stops.push(to);
            }
        }
        let Some(proc_) = self.procs.get(&pid) else { return false };
        if stops.iter().any(|s| proc_.arch.traps.contains_key(s)) {
            // Another thread's run is on the same path: step (it retries until that run ends).
            return false;
        }
        let mut traps = Vec::new();
        for &s in &stops {
            match poke_insn(tid, s, TRAP) {
                Ok(old) => traps.push((s, old)),
                Err(_) => {
                    for &(a, old) in &traps {
                        let _ = poke_insn(tid, a, old);
                    }
                    return false;
                }
            }
        }
        let proc_ = self.procs.get_mut(&pid).expect("process exists");
        proc_.arch.traps.extend(traps.iter().copied());
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.atomic = Some(AtomicRun { start, end, exits, traps });
        true
    }

    /// A stop while an atomic sequence runs. At one of its traps (`sig` SIGTRAP): the sequence
    /// is done; count it, and the branch that left it. Elsewhere (a signal, an interrupt):
    /// count what ran before the stop. Either way the traps come out and the pc is pending.
    /// Returns whether the sequence ended at its trap.
    pub(super) fn atomic_done(&mut self, tid: i32, regs: &Regs, sig: i32) -> bool {
        let Some(run) = self.end_atomic(tid) else { return false };
        let pc = regs.nip;
        let at_trap = sig == libc::SIGTRAP && run.traps.iter().any(|&(a, _)| a == pc);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        let mut record = None;
        if at_trap {
            // The sequence has no internal loops: where it stopped tells the path taken.
            if pc == run.end + 4 {
                t.icount += ((run.end - run.start) / 4 + 1) as u32;
            } else if let Some(&(from, to, flow)) = run.exits.iter().find(|&&(_, to, _)| to == pc) {
                t.icount += ((from - run.start) / 4) as u32;
                record = Some(branch(t, true, from, to, flow.branch_kind(), 0, 0));
            }
        } else if pc >= run.start && pc <= run.end {
            t.icount += ((pc - run.start) / 4) as u32;
        }
        let cpu = t.cpu;
        if let Some(b) = record {
            self.push_branch(cpu, b);
        }
        self.set_pending(tid, pc);
        at_trap
    }

    /// A thread interrupted (PTRACE_EVENT_STOP) in the middle of an atomic run: account for it.
    pub(super) fn stopped_in_atomic(&mut self, tid: i32) {
        if self.threads.get(&tid).is_some_and(|t| t.arch.atomic.is_some()) {
            if let Ok(regs) = getregs(tid) {
                self.atomic_done(tid, &regs, 0);
            } else {
                self.end_atomic(tid);
            }
        }
    }

    /// Take the traps of thread `tid`'s atomic run (if any) out of its process's memory.
    pub(super) fn end_atomic(&mut self, tid: i32) -> Option<AtomicRun> {
        let t = self.threads.get_mut(&tid)?;
        let run = t.arch.atomic.take()?;
        let pid = t.pid;
        for &(a, old) in &run.traps {
            let _ = poke_insn(tid, a, old);
            if let Some(p) = self.procs.get_mut(&pid) {
                p.arch.traps.remove(&a);
            }
        }
        Some(run)
    }

    /// Whether the instruction at `pc` starts a load-reserve/store-conditional sequence.
    pub(super) fn is_load_reserve(&self, pid: i32, pc: u64) -> bool {
        match self.procs.get(&pid).and_then(|p| p.arch.load_reserve.get(&pc)) {
            Some(&known) => known,
            None => PPC64LE.reservation(&self.insn_bytes(pid, pc)) == Reservation::Load,
        }
    }

    /// The 4 bytes at `pc` (our traps taken out), for the atomic-sequence check.
    pub(super) fn insn_bytes(&self, pid: i32, pc: u64) -> [u8; 4] {
        if let Some(old) = self.procs.get(&pid).and_then(|p| p.arch.traps.get(&pc)) {
            return old.to_le_bytes();
        }
        let mut buf = [0u8; 4];
        read_mem(pid, pc, &mut buf);
        buf
    }
}
