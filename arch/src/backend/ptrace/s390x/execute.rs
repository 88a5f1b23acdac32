//! Execute instructions (`ex`, `exrl`): the instruction they run out of line, at the execute's
//! place (`itrace_decoders::s390x::Execute`). An execute counts as two instructions, itself and
//! the one it runs (qemu logs both, at the execute's address); a branch it runs is a branch at
//! the execute's address (the PER event's `si_addr`), relative targets counted from the executed
//! instruction's own address.

use super::engine::*;
use super::regs::{getregs, Regs};
use super::tables::read_mem;
use itrace_decoders::s390x::{decode_executed, execute, Execute};
use itrace_decoders::{Flow, Insn};

impl Session<'_> {
    /// The execute instruction at `pc` of process `pid` (`insn`: its plain decoding), if it is
    /// one. Known from the decoded-code cache for read-only code, else read.
    pub(super) fn execute_at(&self, pid: i32, pc: u64, insn: Insn) -> Option<Execute> {
        if insn.flow != Flow::Next || insn.len == 2 {
            return None;
        }
        let p = self.procs.get(&pid)?;
        if p.code.contains_key(&pc) {
            return p.arch.executes.get(&pc).copied();
        }
        let mut bytes = [0u8; 6];
        let n = read_mem(pid, pc, &mut bytes);
        execute(pc, &bytes[..n])
    }

    /// The address and bytes (R1's byte ORed in) of what execute instruction `ex` runs, with
    /// `regs` where it needs them (`None` then: not known).
    pub(super) fn executed_bytes(&self, pid: i32, ex: Execute, regs: Option<&Regs>) -> Option<(u64, [u8; 6])> {
        let regs = match (ex.needs_registers(), regs) {
            (true, None) => return None,
            (_, r) => r,
        };
        let zero = [0u64; 16];
        let gprs = regs.map_or(&zero, |r| &r.gprs);
        let at = ex.address.resolve(gprs);
        let mut bytes = [0u8; 6];
        if read_mem(pid, at, &mut bytes) < 2 {
            return None;
        }
        if ex.r1 != 0 {
            bytes[1] |= gprs[ex.r1 as usize] as u8;
        }
        Some((at, bytes))
    }

    /// What the execute instruction `ex` (`len` bytes) runs, as it acts at the execute's place.
    pub(super) fn executed_insn(&self, pid: i32, len: u8, ex: Execute, regs: Option<&Regs>) -> Option<Insn> {
        let (at, bytes) = self.executed_bytes(pid, ex, regs)?;
        Some(decode_executed(len, at, &bytes))
    }

    /// The instruction at `pc` as thread `tid` (stopped there, or just past it) runs it: an
    /// execute instruction resolved to what it runs.
    pub(super) fn decode_resolved(&mut self, tid: i32, pid: i32, pc: u64) -> Insn {
        let insn = self.decode(pid, super::S390X, pc);
        let Some(ex) = self.execute_at(pid, pc, insn) else { return insn };
        let regs = if ex.needs_registers() { getregs(tid).ok() } else { None };
        self.executed_insn(pid, insn.len, ex, regs.as_ref()).unwrap_or(insn)
    }

    /// Is the pending instruction of a thread of `pid` at `pc` an execute instruction (two
    /// instructions run)?
    pub(super) fn is_execute(&mut self, pid: i32, pc: u64) -> bool {
        let insn = self.decode(pid, super::S390X, pc);
        self.execute_at(pid, pc, insn).is_some()
    }
}
