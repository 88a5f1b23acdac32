//! A step: whether the pending instruction was a taken branch, a system call or a signal
//! delivery, and the record that says so; and the system calls, run from their syscall-entry
//! stop to their syscall-exit stop.

use super::engine::*;
use super::regs::{getregs, Regs};
use super::tables::read_mem;
use super::S390X;
use crate::Arch;
use itrace_decoders::Flow;
use itrace_format::{branch_flags, now_ns, Branch, BranchKind};
use nix::sys::ptrace;
use nix::unistd::Pid;

impl Session<'_> {
    /// The core: a thread stopped after its pending instruction ran (or a signal handler was
    /// entered) with the pc at `pc`. Classify what ran, write records, decode what runs next.
    pub(super) fn on_step(&mut self, tid: i32, pc: u64) {
        // An execute instruction ran two: itself and the instruction it ran.
        let (pid, pending) = (self.threads[&tid].pid, self.threads[&tid].pending);
        let ran = if pending.is_some_and(|p| self.is_execute(pid, p.pc)) { 2 } else { 1 };
        let t = self.threads.get_mut(&tid).expect("stepping thread exists");
        let cpu = t.cpu;
        let mut out: [Option<Branch>; 2] = [None, None];
        if let Some(p) = t.pending {
            let next = p.pc.wrapping_add(p.insn.len as u64);
            let injected = t.injected.take();
            // A signal was delivered: the kernel reports the handler's first instruction, before
            // it runs, with ptrace_notify(SIGTRAP) (si_code SIGTRAP).
            let handler_entry = injected.is_some()
                && ptrace::getsiginfo(Pid::from_raw(tid))
                    .map(|si| si.si_code == super::block::SI_HANDLER_ENTRY)
                    .unwrap_or(false);
            if t.skip_report_at == Some(pc) {
                t.skip_report_at = None;
            } else if handler_entry {
                let signo = injected.unwrap_or(0) as u64;
                if std::mem::take(&mut t.syscall_interrupted) && p.insn.flow == Flow::Syscall {
                    // The system call ran and was interrupted by this signal.
                    out[0] = Some(branch(t, true, p.pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, p.syscall_nr));
                } else {
                    out[0] = Some(branch(t, false, p.pc, 0, BranchKind::Intrpt, branch_flags::SIGNAL, signo));
                }
                t.syscall_ts = now_ns();
                let mut k = branch(t, false, 0, pc, BranchKind::Iret, branch_flags::SIGNAL, signo);
                k.kernel = true;
                out[1] = Some(k);
            } else {
                t.skip_report_at = None;
                match p.insn.flow {
                    // System calls run between syscall stops (`syscall_stop`); a step that
                    // reports one (delivering an unhandled signal) is left uncounted.
                    Flow::Syscall => t.syscall_interrupted = false,
                    flow => {
                        t.icount += ran;
                        if flow.always_branches() || pc != next {
                            let kind = if flow == Flow::Next { BranchKind::Other } else { flow.branch_kind() };
                            out[0] = Some(branch(t, false, p.pc, pc, kind, 0, 0));
                        }
                    }
                }
            }
        }
        for b in out.into_iter().flatten() {
            self.push_branch(cpu, b);
        }
        self.set_pending(tid, pc);
    }

    /// The number of the system call whose `svc` is at `svc_pc`: its immediate, or r1 for
    /// `svc 0`.
    pub(super) fn syscall_nr(&self, pid: i32, svc_pc: u64, regs: &Regs) -> u64 {
        let mut bytes = [0u8; 2];
        read_mem(pid, svc_pc, &mut bytes);
        S390X.syscall_nr_in_insn(&bytes).unwrap_or(regs.gprs[1])
    }

    /// A syscall stop. A system call runs from its syscall-entry stop to its syscall-exit stop
    /// (a block step does not stop at `svc`, which is no branch), where the pc is where it
    /// returns (for rt_sigreturn, the interrupted code).
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
            let svc = regs.psw_addr.wrapping_sub(2);
            self.block_stopped_at(tid, &run, svc);
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        let pid = t.pid;
        if !t.arch.in_syscall {
            t.arch.in_syscall = true;
            t.syscall_ts = now_ns();
            let svc = t.pending.map_or(regs.psw_addr.wrapping_sub(2), |p| p.pc);
            let nr = self.syscall_nr(pid, svc, &regs);
            if let Some(p) = self.threads.get_mut(&tid).and_then(|t| t.pending.as_mut()) {
                p.syscall_nr = nr;
            }
            self.resume(tid, 0);
            return;
        }
        let restarting = regs.restarting();
        self.syscall_exit(tid, regs.psw_addr, restarting);
    }

    /// Decode the thread's next instruction, at `pc` (where it is stopped, or the `svc` it is
    /// just past): an execute instruction as what it runs.
    pub(in super::super) fn set_pending(&mut self, tid: i32, pc: u64) {
        let pid = self.threads[&tid].pid;
        let insn = self.decode_resolved(tid, pid, pc);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.pending = Some(Pending { pc, insn, syscall_nr: 0 });
    }

    /// Where a thread's single step ends when that can be told without its registers: after an
    /// instruction that is not a branch, or a direct jump or call (no signal delivered).
    pub(super) fn predicted_stop(&self, tid: i32) -> Option<u64> {
        let t = self.threads.get(&tid)?;
        let p = t.pending?;
        if t.injected.is_some() || t.skip_report_at.is_some() {
            return None;
        }
        match (p.insn.flow, p.insn.target) {
            (Flow::Next, _) => Some(p.pc + p.insn.len as u64),
            (Flow::Jump | Flow::Call, Some(to)) => Some(to),
            _ => None,
        }
    }
}
