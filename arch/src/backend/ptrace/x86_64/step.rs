//! A single step (or block step): whether the pending instruction was a taken branch, a
//! system call or a signal delivery, and the record that says so.

use super::engine::*;
use crate::isa::x86_64::{RESTART_CODES, X86};
use crate::Arch;
use itrace_decoders::Flow;
use itrace_format::{branch_flags, now_ns, Branch, BranchKind};
use nix::sys::ptrace;
use nix::unistd::Pid;

/// si_code of a step report from the kernel rather than the debug trap.
const TRAP_BRKPT: i32 = 1;

impl Session<'_> {
    /// The core: a thread stopped after a step. Classify what ran, write records, decode what runs next.
    pub(super) fn on_step(&mut self, tid: i32, regs: &libc::user_regs_struct, inject: &mut i32) {
        let rip = regs.rip;
        if self.opts.step.block_step {
            let t = &self.threads[&tid];
            let report = t.arch.single_step_now || t.skip_report_at == Some(rip) || t.injected.is_some();
            if !report && !self.fast_forward(tid, rip, true) {
                self.update_pending_after(tid, rip, regs, false);
                return;
            }
        }
        let t = self.threads.get_mut(&tid).expect("stepping thread exists");
        let (cpu, pid) = (t.cpu, t.pid);
        let mut out: [Option<Branch>; 2] = [None, None];
        let mut syscall_done: Option<u64> = None;
        if let Some(p) = t.pending {
            let next = p.pc.wrapping_add(p.insn.len as u64);
            let injected = t.injected.take();
            let handler_entry = injected.is_some() && !(p.insn.flow == Flow::Syscall && rip == next) && {
                // A signal was delivered: the kernel reports the handler's first instruction, before
                // it runs, with ptrace_notify(SIGTRAP) (si_code SIGTRAP); older kernels used
                // TRAP_BRKPT. A real step after an ignored signal says TRAP_TRACE.
                ptrace::getsiginfo(Pid::from_raw(tid))
                    .map(|si| si.si_code == libc::SIGTRAP || si.si_code == TRAP_BRKPT)
                    .unwrap_or(false)
            };
            if t.skip_report_at == Some(rip) {
                t.skip_report_at = None;
            } else if handler_entry {
                let signo = injected.unwrap_or(0) as u16;
                let now = now_ns();
                if t.syscall_interrupted && p.insn.flow == Flow::Syscall {
                    // The system call ran and was interrupted by this signal.
                    t.syscall_interrupted = false;
                    out[0] = Some(branch(t, true, p.pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, regs.orig_rax));
                    t.syscall_ts = now;
                } else {
                    out[0] = Some(branch(t, false, p.pc, 0, BranchKind::Intrpt, branch_flags::SIGNAL, signo as u64));
                }
                t.syscall_ts = now;
                out[1] = Some(branch(t, false, 0, rip, BranchKind::Iret, branch_flags::SIGNAL, signo as u64));
                out[1].as_mut().expect("set").kernel = true;
            } else {
                t.skip_report_at = None;
                match p.insn.flow {
                    Flow::Syscall => {
                        if RESTART_CODES.contains(&(regs.rax as i64)) && rip == next {
                            // Interrupted; the kernel will run it again (or deliver a signal first).
                            t.syscall_interrupted = true;
                            self.update_pending_after(tid, rip, regs, true);
                            return;
                        }
                        t.syscall_interrupted = false;
                        if t.arch.isa.sends_signal(regs.orig_rax) {
                            // A SIGTRAP the program sent itself merges with the kernel's step report
                            // (one pending SIGTRAP): tell them apart by who sent it, and deliver it.
                            let own = ptrace::getsiginfo(Pid::from_raw(tid)).map(|si| si.si_code <= 0).unwrap_or(false);
                            if own {
                                *inject = libc::SIGTRAP;
                            }
                        }
                        // rt_sigreturn sets orig_rax to -1 (no restart). (i386's old sigreturn, 119, also
                        // does; it is told apart only when single-stepping saw eax at the call.)
                        let nr = match regs.orig_rax as i64 {
                            -1 if p.syscall_nr == 119 && t.arch.isa.compat && !self.opts.step.block_step => 119,
                            -1 => t.arch.isa.rt_sigreturn_nr(),
                            _ => regs.orig_rax,
                        };
                        out[0] = Some(branch(t, true, p.pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, nr));
                        t.syscall_ts = now_ns();
                        let mut k = branch(t, false, 0, rip, BranchKind::Iret, branch_flags::SYSCALL, nr);
                        k.kernel = true;
                        out[1] = Some(k);
                        syscall_done = Some(nr);
                    }
                    Flow::RepString if rip == p.pc => {} // one more iteration of the same instruction
                    Flow::Interrupt => {
                        // int3 and friends: the program's own SIGTRAP (or other signal); deliver it.
                        t.icount += 1;
                        out[0] = Some(branch(
                            t,
                            false,
                            p.pc,
                            0,
                            BranchKind::Intrpt,
                            branch_flags::SIGNAL,
                            libc::SIGTRAP as u64,
                        ));
                        *inject = libc::SIGTRAP;
                    }
                    flow => {
                        t.icount += 1;
                        if flow.always_branches() || rip != next {
                            let kind = if flow == Flow::Next || flow == Flow::RepString {
                                BranchKind::Other
                            } else {
                                flow.branch_kind()
                            };
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
            let arch = self.threads[&tid].arch.isa;
            if arch.changes_mappings(nr) {
                self.refresh_maps(pid, now_ns());
            }
            if arch.may_rename(nr) {
                self.name_thread(pid, tid, now_ns());
            }
        }
        self.update_pending_after(tid, rip, regs, false);
    }

    /// Block mode: what the block starting at `pc` holds (cached per address).
    pub(super) fn block_info(&mut self, tid: i32, pc: u64) -> super::block::BlockInfo {
        let t = &self.threads[&tid];
        let (pid, arch) = (t.pid, t.arch.isa);
        if let Some(&a) = self.procs.get(&pid).and_then(|p| p.arch.ambiguous.get(&pc)) {
            return a;
        }
        let a = super::block::block_info(|a| self.decode(pid, arch, a), pc, 4096);
        if let Some(p) = self.procs.get_mut(&pid) {
            p.arch.ambiguous.insert(pc, a);
        }
        a
    }

    /// Block-step emulation: would a branch trap have stopped here? (After a taken branch, a
    /// system call or interrupt, and for the kernel's own reports.)
    pub(super) fn emulated_block_ended(&mut self, tid: i32, regs: &libc::user_regs_struct) -> bool {
        let t = &self.threads[&tid];
        if t.arch.single_step_now || t.injected.is_some() || t.skip_report_at == Some(regs.rip) || t.arch.emu_prev == 0
        {
            return true;
        }
        let (pid, arch, prev) = (t.pid, t.arch.isa, t.arch.emu_prev);
        let insn = self.decode(pid, arch, prev);
        let ended = match insn.flow {
            Flow::Syscall | Flow::Interrupt | Flow::Invalid => true,
            Flow::CondJump => regs.rip != prev.wrapping_add(insn.len as u64),
            f => f.always_branches(),
        };
        if !ended {
            self.threads.get_mut(&tid).expect("thread exists").arch.emu_prev = regs.rip;
        }
        ended
    }

    /// Block stepping: account for the instructions from `pending` up to the one that ended the
    /// block (which becomes `pending`, to be classified like a single step), or up to `rip` when
    /// the thread was stopped mid-block. Returns whether a block-ending instruction was found.
    pub(super) fn fast_forward(&mut self, tid: i32, rip: u64, branch_stop: bool) -> bool {
        let Some(t) = self.threads.get(&tid) else { return false };
        let Some(p) = t.pending else { return false };
        let (pid, arch) = (t.pid, t.arch.isa);
        let w = super::block::walk_block(|pc| self.decode(pid, arch, pc), p.pc, rip, branch_stop, 1 << 24);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.icount += w.before;
        match w.end {
            super::block::WalkEnd::Branch { pc, insn } => {
                t.pending = Some(Pending { pc, insn, syscall_nr: p.syscall_nr });
                true
            }
            super::block::WalkEnd::Reached | super::block::WalkEnd::Lost => {
                let insn = self.decode(pid, arch, rip);
                let t = self.threads.get_mut(&tid).expect("thread exists");
                t.pending = Some(Pending { pc: rip, insn, syscall_nr: p.syscall_nr });
                false
            }
        }
    }

    /// Decode the thread's next instruction (unless it is an interrupted system call that runs again).
    pub(super) fn update_pending_after(&mut self, tid: i32, rip: u64, regs: &libc::user_regs_struct, keep: bool) {
        if keep {
            return;
        }
        let t = &self.threads[&tid];
        let (pid, mut arch) = (t.pid, t.arch.isa);
        if regs.cs != 0 {
            arch = X86::from_cs(regs.cs);
        }
        let insn = self.decode(pid, arch, rip);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.isa = arch;
        t.pending = Some(Pending { pc: rip, insn, syscall_nr: regs.rax });
        if insn.flow == Flow::Syscall {
            t.syscall_ts = now_ns();
        }
    }
}
