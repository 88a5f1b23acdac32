//! Block stepping (`PTRACE_SINGLEBLOCK`, MSR[BE]): the thread runs to the end of its next
//! branch, taken or not, and stops there; the straight instructions before the branch are
//! counted from the decoded code, so the trace is the one single-stepping writes.
//!
//! PowerPC's branch trace stops after every branch instruction, whether it branched or not
//! (the start-up probe checks both), so the block a step runs is known before it runs: the
//! straight run from the pending instruction to the first branch. A block ending in a system
//! call runs to its syscall-entry stop instead (PowerPC does not trace `sc`); a block holding
//! a load-reserve, a trap instruction or one of our breakpoints is single-stepped.

use super::blockstep::ProbePage;
use super::engine::*;
use super::probe_child::{wait_no_eintr, BlockStep, ProbeChild};
use super::regs::{poke_insn, read_nip};
use super::PPC64LE;
use itrace_decoders::{Flow, Insn};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

/// The request number (arch/powerpc/include/uapi/asm/ptrace.h); the libc crate lacks it.
const PTRACE_SINGLEBLOCK: libc::c_uint = 0x100;

/// si_code of a trap instruction's SIGTRAP (a breakpoint), as opposed to TRAP_TRACE.
const TRAP_BRKPT: i32 = 1;

/// The longest straight run a block step is planned over; longer ones are single-stepped to
/// it.
const MAX_BLOCK: u32 = 4096;

/// The block a thread runs with its current resume.
#[derive(Clone, Copy, Debug)]
pub(super) struct BlockRun {
    /// Its first instruction (the pending one when it was planned).
    pub(super) start: u64,
    /// The branch or system call that ends it, and where.
    pub(super) end: u64,
    pub(super) insn: Insn,
}

impl BlockRun {
    /// Straight instructions before the end.
    fn before(&self) -> u32 {
        ((self.end - self.start) / 4) as u32
    }

    /// Runs to a syscall-entry stop (PTRACE_SYSCALL) rather than a branch trap.
    pub(super) fn to_syscall(&self) -> bool {
        self.insn.flow == Flow::Syscall
    }
}

impl Session<'_> {
    /// Before a resume without a signal: the block thread `tid` runs next, if it can run as one
    /// (kept in the thread until its stop).
    pub(super) fn plan_block(&mut self, tid: i32) -> Option<BlockRun> {
        let t = self.threads.get(&tid)?;
        if t.injected.is_some() || t.skip_report_at.is_some() || t.region.lifted_bps {
            return None;
        }
        let (start, pid) = (t.pending?.pc, t.pid);
        if !self.procs.get(&pid)?.arch.traps.is_empty() {
            // Another thread's atomic run: its traps may stop this one anywhere.
            return None;
        }
        let mut pc = start;
        for _ in 0..MAX_BLOCK {
            if self.is_load_reserve(pid, pc) || (pc != start && self.procs.get(&pid)?.region.bps.is_inserted(pc)) {
                return None;
            }
            let insn = self.decode(pid, PPC64LE, pc);
            match insn.flow {
                Flow::Next => pc = pc.wrapping_add(4),
                Flow::Interrupt | Flow::Invalid => return None,
                _ => {
                    let run = BlockRun { start, end: pc, insn };
                    self.threads.get_mut(&tid)?.arch.block = Some(run);
                    return Some(run);
                }
            }
        }
        None
    }

    /// The thread stopped at the system call ending its block: count the straight instructions
    /// before it, which becomes the pending instruction.
    pub(super) fn block_ended(&mut self, tid: i32, run: &BlockRun) {
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.icount += run.before();
        t.pending = Some(Pending { pc: run.end, insn: run.insn, syscall_nr: 0 });
    }

    /// The thread stopped at `pc` inside its block (a signal, an interrupt): count what ran
    /// before `pc`, which becomes pending. A pc off the block (`false`) is counted as lost.
    pub(super) fn block_stopped_at(&mut self, tid: i32, run: &BlockRun, pc: u64) -> bool {
        let inside = pc >= run.start && pc <= run.end && pc % 4 == run.start % 4;
        if inside {
            self.threads.get_mut(&tid).expect("thread exists").icount += ((pc - run.start) / 4) as u32;
        } else {
            self.arch.block_lost += 1;
        }
        self.set_pending(tid, pc);
        inside
    }

    /// A stop of a thread that ran block `run`: after its branch (a SIGTRAP of the branch
    /// trace), classified like a single step of the branch; or on its way (a signal, or a trap of
    /// another thread's atomic run that was put in the block while it ran).
    pub(super) fn block_stop(&mut self, tid: i32, sig: i32, run: &BlockRun) {
        if sig != libc::SIGTRAP || run.to_syscall() {
            // A signal stopped the block on its way: count what ran, deliver it with a step.
            if let Ok(pc) = read_nip(tid) {
                self.block_stopped_at(tid, run, pc);
            }
            return self.resume(tid, sig);
        }
        let pid = self.threads[&tid].pid;
        let no_traps = self.procs.get(&pid).is_some_and(|p| p.arch.traps.is_empty());
        // A direct jump or call tells where it went (unless a trap of ours may have stopped the
        // thread first); other branches need the pc.
        let pc = match (run.insn.flow, run.insn.target) {
            (Flow::Jump | Flow::Call, Some(to)) if no_traps => to,
            _ => match read_nip(tid) {
                Ok(pc) => pc,
                Err(_) => return self.resume(tid, 0),
            },
        };
        if !no_traps && self.trap_hit_in_block(tid, run, pc) {
            self.block_stopped_at(tid, run, pc);
            return self.resume(tid, 0);
        }
        let fits = match (run.insn.flow, run.insn.target) {
            (Flow::CondJump | Flow::CondCall, Some(to)) => pc == to || pc == run.end.wrapping_add(4),
            (Flow::Jump | Flow::Call, Some(to)) => pc == to,
            _ => true,
        };
        if !fits {
            self.arch.block_lost += 1;
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.icount += run.before();
        t.pending = Some(Pending { pc: run.end, insn: run.insn, syscall_nr: 0 });
        let mut inject = 0;
        self.on_step(tid, pc, &mut inject);
        self.resume(tid, inject);
    }

    /// Did the thread stop on a trap of another thread's atomic run inside its block (put there
    /// after the block began), rather than after the block's branch? The trap leaves the pc on
    /// it and says TRAP_BRKPT; the branch trace says TRAP_TRACE.
    fn trap_hit_in_block(&self, tid: i32, run: &BlockRun, pc: u64) -> bool {
        let pid = self.threads[&tid].pid;
        let on_trap = self.procs.get(&pid).is_some_and(|p| p.arch.traps.contains_key(&pc));
        on_trap
            && pc >= run.start
            && pc <= run.end
            && ptrace::getsiginfo(Pid::from_raw(tid)).is_ok_and(|si| si.si_code == TRAP_BRKPT)
    }
}

/// Start a block step of stopped thread `tid`.
pub(super) fn singleblock(tid: i32) -> Result<(), Errno> {
    // SAFETY: plain ptrace request on our stopped tracee; no pointers are passed.
    let r = unsafe { libc::ptrace(PTRACE_SINGLEBLOCK, tid, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// The probe: a jump taken, then a conditional branch not taken. Working block steps stop on
/// the jump's target (word 4), then after the conditional branch (word 7); steps of single
/// instructions stop on word 1.
const PROBE: [u32; 12] = [
    0x6000_0000, // nop
    0x6000_0000, // nop
    0x4800_0008, // b +8 (word 4)
    0x6000_0000, // nop
    0x38a0_0000, // li r5,0
    0x2c25_0000, // cmpdi r5,0
    0x4082_000c, // bne +12 (word 9): not taken
    0x6000_0000, // nop
    0x6000_0000, // nop
    0x3800_0001, // li r0,1 (exit)
    0x3860_0000, // li r3,0
    0x4400_0002, // sc
];

/// Does PTRACE_SINGLEBLOCK stop after every branch here, taken or not? Stepped on a known
/// sequence in a forked child.
pub(super) fn probe_singleblock() -> BlockStep {
    let page = match ProbePage::map() {
        Ok(p) => p,
        Err(why) => return BlockStep::Unavailable(why),
    };
    let start = page.addr();
    let child = match ProbeChild::start(start, start + 16) {
        Ok(c) => c,
        Err(why) => return BlockStep::Unavailable(why),
    };
    let tid = child.pid.as_raw();
    for (i, &w) in PROBE.iter().enumerate() {
        if let Err(e) = poke_insn(tid, start + 4 * i as u64, w) {
            return BlockStep::Unavailable(format!("writing the probe code failed: {e}"));
        }
    }
    let step = || -> Result<u64, String> {
        singleblock(tid).map_err(|e| format!("PTRACE_SINGLEBLOCK refused: {e}"))?;
        match wait_no_eintr(child.pid) {
            Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => {}
            other => return Err(format!("unexpected stop after a block step: {other:?}")),
        }
        read_nip(tid).map_err(|e| format!("reading the pc failed: {e}"))
    };
    match step() {
        Ok(pc) if pc == child.target => {}
        Ok(pc) if pc == child.start + 4 => return BlockStep::StepsEachInstruction,
        Ok(pc) => {
            return BlockStep::Unavailable(format!("a block step stopped at word {} of the probe", (pc - start) / 4))
        }
        Err(why) => return BlockStep::Unavailable(why),
    }
    match step() {
        Ok(pc) if pc == start + 28 => BlockStep::Works,
        Ok(pc) => BlockStep::Unavailable(format!(
            "a block step over a branch not taken stopped at word {} of the probe",
            pc.wrapping_sub(start) / 4
        )),
        Err(why) => BlockStep::Unavailable(why),
    }
}
