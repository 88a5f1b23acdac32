//! Block stepping (`PTRACE_SINGLEBLOCK`, the PER successful-branching event): the thread runs
//! until it takes a branch and stops on the branch's target; the SIGTRAP's `si_addr` is the
//! branch's own address (the PER address). The straight instructions from the block's start to
//! that branch, not-taken branches included, are counted from the decoded code along the
//! fall-through path, so the trace is the one single-stepping writes.
//!
//! What a block step would not see: a system call (`svc` is no branch, so no PER event; its
//! records and its effects on the module table would be lost) and our region breakpoints. A
//! block whose straight path reaches an `svc` therefore runs to it with `PTRACE_SYSCALL` when
//! no conditional branch comes before it (its syscall-entry stop ends the block); otherwise the
//! thread goes one instruction at a time until the path to the `svc` is straight: plain
//! instructions by single steps, conditional branches evaluated here from the condition code
//! and registers (`emulate_branch`, `take_branch`), because qemu's TCG does not stop after a
//! single-stepped conditional branch.
//!
//! Which branch a block step stopped after: the only one on the path that goes to the pc when
//! taken, told from the registers (`taken_branch_from_regs`), else `si_addr`. Execute
//! instructions (`execute.rs`) count two and act as the instruction they run.

use super::blockstep::ProbePage;
use super::engine::*;
use super::probe_child::{wait_no_eintr, BlockStep, ProbeChild};
use super::regs::{getregs, read_pc, setregs, Regs};
use super::tables::read_mem;
use super::S390X;
use itrace_decoders::{Flow, Insn};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

/// The request number (arch/s390/include/uapi/asm/ptrace.h); the libc crate lacks it.
const PTRACE_SINGLEBLOCK: libc::c_uint = 12;

/// si_code of a breakpoint's SIGTRAP (`0x0001`: TRAP_BRKPT; a PER event says TRAP_HWBKPT), and of
/// the stop the kernel reports at a signal handler's entry (`ptrace_notify(SIGTRAP)`).
pub(super) const TRAP_BRKPT: i32 = 1;
pub(super) const SI_HANDLER_ENTRY: i32 = libc::SIGTRAP;

/// The longest straight path a plan or a count follows.
const MAX_BLOCK: u32 = 1 << 16;

/// The block a thread runs with its current resume.
#[derive(Clone, Copy, Debug)]
pub(super) struct BlockRun {
    /// Its first instruction (the pending one when it was planned).
    pub(super) start: u64,
    /// The system call it runs to by `PTRACE_SYSCALL` (none: a block step to a taken branch).
    pub(super) syscall: Option<u64>,
    /// The one branch that can end it, when known before it runs.
    pub(super) sole_end: Option<SoleEnd>,
}

/// A block's only possible end: its straight path holds no conditional branch before an
/// always-taken one, so its stop needs no `si_addr` (and, for a relative branch, no pc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SoleEnd {
    pub(super) branch: u64,
    pub(super) insn: Insn,
    /// Instructions before the branch.
    pub(super) before: u32,
}

/// How a thread goes on from its pending instruction (sig 0, stepping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// A block step: no system call nor breakpoint of ours on its straight path.
    Block(Option<SoleEnd>),
    /// A straight run (no branch) to the system call at this address: `PTRACE_SYSCALL`.
    ToSyscall(u64),
    /// One instruction at a time (a conditional branch comes before a system call, or one of
    /// our breakpoints is on the path).
    One,
}

/// The end of a straight path walked by [`Session::walk`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Walked {
    /// Instructions before the end.
    pub(super) before: u32,
    /// System calls passed on the way (which the count includes; their records are lost).
    pub(super) syscalls: u32,
}

impl Session<'_> {
    /// The plan for thread `tid`'s pending instruction at `start`; kept per process for
    /// read-only code while the process has no breakpoint of ours.
    pub(super) fn plan(&mut self, tid: i32, start: u64) -> Plan {
        let Some(t) = self.threads.get(&tid) else { return Plan::One };
        if t.skip_report_at.is_some() || t.region.lifted_bps {
            return Plan::One;
        }
        let pid = t.pid;
        let Some(p) = self.procs.get(&pid) else { return Plan::One };
        let no_bps = p.region.bps.is_empty();
        if let Some(&plan) = p.arch.plans.get(&start).filter(|_| no_bps) {
            return plan;
        }
        let mut pc = start;
        let mut before = 0;
        let mut conditional = false;
        let mut cacheable = no_bps;
        let plan = loop {
            if before >= MAX_BLOCK {
                break Plan::Block(None);
            }
            if !no_bps && pc != start && self.procs.get(&pid).is_some_and(|p| p.region.bps.is_inserted(pc)) {
                break Plan::One;
            }
            let mut insn = self.decode(pid, S390X, pc);
            cacheable = cacheable && self.procs.get(&pid).is_some_and(|p| p.code.contains_key(&pc));
            if let Some(ex) = self.execute_at(pid, pc, insn) {
                // An execute instruction: what it runs decides (with the thread's registers at
                // the start, else only when its bytes alone tell).
                let regs = if pc == start { getregs(tid).ok() } else { None };
                cacheable = cacheable && !ex.needs_registers();
                match self.executed_insn(pid, insn.len, ex, regs.as_ref()) {
                    Some(run) if run.flow == Flow::Next => {
                        before += 2;
                        pc = pc.wrapping_add(insn.len as u64);
                        continue;
                    }
                    Some(run)
                        if matches!(
                            run.flow,
                            Flow::Jump | Flow::Call | Flow::Return | Flow::CondJump | Flow::CondCall | Flow::CondReturn
                        ) =>
                    {
                        insn = run
                    }
                    // Unknown, or a system call or trap run by it: it may leave the path.
                    _ if pc == start => break Plan::One,
                    _ => {
                        conditional = true;
                        before += 2;
                        pc = pc.wrapping_add(insn.len as u64);
                        continue;
                    }
                }
            }
            match insn.flow {
                Flow::Syscall if conditional => break Plan::One,
                Flow::Syscall => break Plan::ToSyscall(pc),
                Flow::Interrupt | Flow::Invalid if pc == start => break Plan::One,
                Flow::Interrupt | Flow::Invalid => break Plan::Block(None),
                f if f.always_branches() => {
                    let sole = (!conditional).then_some(SoleEnd { branch: pc, insn, before });
                    break Plan::Block(sole);
                }
                Flow::CondJump | Flow::CondCall | Flow::CondReturn => conditional = true,
                _ => {}
            }
            before += 1;
            pc = pc.wrapping_add(insn.len as u64);
        };
        if cacheable {
            if let Some(p) = self.procs.get_mut(&pid) {
                p.arch.plans.insert(start, plan);
            }
        }
        plan
    }

    /// Walk the fall-through path of `pid`'s code from `start` to `end`: the instructions
    /// before `end`, or `None` when the path leaves (an always-taken branch) or runs too long.
    pub(super) fn walk(&mut self, pid: i32, start: u64, end: u64) -> Option<Walked> {
        let mut w = Walked { before: 0, syscalls: 0 };
        let mut pc = start;
        while w.before < MAX_BLOCK {
            if pc == end {
                return Some(w);
            }
            let insn = self.decode(pid, S390X, pc);
            if self.execute_at(pid, pc, insn).is_some() {
                // Passed: the execute and the instruction it ran, which took no branch.
                w.before += 2;
                pc = pc.wrapping_add(insn.len as u64);
                continue;
            }
            match insn.flow {
                Flow::Syscall => w.syscalls += 1,
                Flow::Interrupt | Flow::Invalid => return None,
                f if f.always_branches() => return None,
                _ => {}
            }
            w.before += 1;
            pc = pc.wrapping_add(insn.len as u64);
        }
        None
    }

    /// Count what thread `tid` ran of block `run` before `end` (where it stopped, or the branch
    /// that ended it); `false` (counted as lost) when `end` is off the block's straight path.
    pub(super) fn count_block(&mut self, tid: i32, run: &BlockRun, end: u64) -> bool {
        let pid = self.threads[&tid].pid;
        match self.walk(pid, run.start, end) {
            Some(w) => {
                self.threads.get_mut(&tid).expect("thread exists").icount += w.before;
                self.arch.unseen_syscalls += w.syscalls as u64;
                true
            }
            None => {
                self.arch.block_lost += 1;
                false
            }
        }
    }

    /// The thread stopped at `pc` inside its block (a signal, an interrupt, a breakpoint): count
    /// what ran before `pc`, which becomes pending.
    pub(super) fn block_stopped_at(&mut self, tid: i32, run: &BlockRun, pc: u64) {
        self.count_block(tid, run, pc);
        self.set_pending(tid, pc);
    }

    /// A signal-delivery stop of a thread that ran block `run`.
    pub(super) fn block_stop(&mut self, tid: i32, sig: i32, run: &BlockRun) {
        if sig != libc::SIGTRAP || run.syscall.is_some() {
            // A signal stopped the block on its way: count what ran, deliver it.
            if let Ok(pc) = read_pc(tid) {
                self.block_stopped_at(tid, run, pc);
            }
            return self.resume(tid, sig);
        }
        let injected = self.threads[&tid].injected.is_some();
        if let (Some(end), false) = (run.sole_end, injected) {
            // The block's only branch was taken: no siginfo to read, and no pc for a relative one.
            let pc = match end.insn.target {
                Some(to) => to,
                None => match read_pc(tid) {
                    Ok(pc) => pc,
                    Err(_) => return self.resume(tid, 0),
                },
            };
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.icount += end.before;
            t.pending = Some(Pending { pc: end.branch, insn: end.insn, syscall_nr: 0 });
            self.on_step(tid, pc);
            return self.resume(tid, 0);
        }
        if !injected {
            // Which branch ended the block, from the registers when the path tells: one read,
            // where the siginfo and (after an indirect branch) the pc would be two.
            let Ok(regs) = getregs(tid) else { return self.resume(tid, 0) };
            if let Some((branch, insn)) = self.taken_branch_from_regs(tid, run, &regs) {
                if self.count_block(tid, run, branch) {
                    let t = self.threads.get_mut(&tid).expect("thread exists");
                    t.pending = Some(Pending { pc: branch, insn, syscall_nr: 0 });
                    self.on_step(tid, regs.psw_addr);
                    return self.resume(tid, 0);
                }
            }
        }
        let Ok(si) = ptrace::getsiginfo(Pid::from_raw(tid)) else { return self.resume(tid, 0) };
        if si.si_code == TRAP_BRKPT {
            // One of our region breakpoints (`0x0001`, the pc after it) on the block's path:
            // back onto it, for the region code to act on at the next resume.
            let Ok(pc) = read_pc(tid) else { return self.resume(tid, 0) };
            let at = super::breakpoint_hit(pc);
            let pid = self.threads[&tid].pid;
            if self.procs.get(&pid).is_some_and(|p| p.region.bps.is_inserted(at)) {
                let _ = super::set_pc(tid, at);
                self.block_stopped_at(tid, run, at);
                return self.resume(tid, 0);
            }
            // The program's own breakpoint instruction: its SIGTRAP.
            self.block_stopped_at(tid, run, pc);
            return self.resume(tid, libc::SIGTRAP);
        }
        if injected && si.si_code == SI_HANDLER_ENTRY {
            // A signal handler's entry (the block was resumed with a signal): the pending
            // instruction did not run; the step logic records the delivery.
            let Ok(pc) = read_pc(tid) else { return self.resume(tid, 0) };
            self.on_step(tid, pc);
            return self.resume(tid, 0);
        }
        // The PER branch event (TRAP_HWBKPT): `si_addr` is the taken branch.
        // SAFETY: a SIGTRAP's siginfo holds the fault address (si_addr) for its si_code.
        let branch = unsafe { si.si_addr() } as u64;
        let pid = self.threads[&tid].pid;
        // (An execute instruction's address when the branch ran out of line.)
        let insn = self.decode_resolved(tid, pid, branch);
        // A taken relative branch went to its target; others need the pc.
        let pc = match insn.target {
            Some(to) => to,
            None => match read_pc(tid) {
                Ok(pc) => pc,
                Err(_) => return self.resume(tid, 0),
            },
        };
        if self.count_block(tid, run, branch) {
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.pending = Some(Pending { pc: branch, insn, syscall_nr: 0 });
            self.on_step(tid, pc);
        } else {
            self.set_pending(tid, pc);
        }
        self.resume(tid, 0)
    }

    /// Execute the conditional branch pending in thread `tid` here (`insn` at `pc`, or run there by
    /// an execute instruction), from its condition code and registers, as the CPU would
    /// (`take_branch`): moves the pc and updates the count or index register. Returns where the
    /// thread goes, or `None` for a branch not handled here.
    pub(super) fn emulate_branch(&mut self, tid: i32, pc: u64, insn: Insn) -> Option<u64> {
        let pid = self.threads[&tid].pid;
        let mut regs = getregs(tid).ok()?;
        if regs.psw_addr != pc {
            return None;
        }
        let next = pc.wrapping_add(insn.len as u64);
        let plain = self.decode(pid, S390X, pc);
        let (at, bytes) = match self.execute_at(pid, pc, plain) {
            // Run out of line by an execute instruction: the executed instruction's bytes.
            Some(ex) => self.executed_bytes(pid, ex, Some(&regs))?,
            None => (pc, self.branch_bytes(pid, pc, insn)?),
        };
        let cc = regs.condition_code();
        let to = itrace_decoders::s390x::take_branch(at, next, &bytes, cc, &mut regs.gprs)?;
        regs.psw_addr = to;
        setregs(tid, &regs).ok()?;
        Some(to)
    }

    /// The bytes of branch `insn` at `pc` of process `pid`: kept when the code was decoded
    /// (read-only code), else read.
    fn branch_bytes(&self, pid: i32, pc: u64, insn: Insn) -> Option<[u8; 6]> {
        if let Some(b) = self.procs.get(&pid).and_then(|p| p.arch.branch_bytes.get(&pc)) {
            return Some(*b);
        }
        let mut bytes = [0u8; 6];
        (read_mem(pid, pc, &mut bytes) >= insn.len as usize).then_some(bytes)
    }

    /// The branch that ended block `run` of thread `tid` (stopped by its block step's SIGTRAP,
    /// with registers `regs`), told without the siginfo: the one branch on the block's straight
    /// path that goes to the pc when taken. The taken branch is always among them (nothing ran
    /// after it, so the register it went through still holds its target); when another one
    /// could have gone there too, or the path holds a branch whose target cannot be told
    /// afterwards (through memory, or a register it changes), `None`: the siginfo tells.
    pub(super) fn taken_branch_from_regs(&mut self, tid: i32, run: &BlockRun, regs: &Regs) -> Option<(u64, Insn)> {
        let pid = self.threads[&tid].pid;
        let pc = regs.psw_addr;
        let mut at = run.start;
        let mut found = None;
        for _ in 0..MAX_BLOCK {
            let insn = self.decode(pid, S390X, at);
            match insn.flow {
                Flow::Next if self.execute_at(pid, at, insn).is_some() => return None,
                Flow::Next => {}
                Flow::Syscall | Flow::Interrupt | Flow::Invalid | Flow::Iret => return None,
                flow => {
                    let to = match insn.target {
                        Some(to) => to,
                        None => {
                            let b = self.branch_bytes(pid, at, insn)?;
                            let (r1, r2) = (b[1] >> 4, b[1] & 15);
                            match b[0] {
                                // bcr M,R2 (br, b<cond>r): R2 unchanged by it.
                                0x07 => regs.gprs[r2 as usize],
                                // basr/balr R1,R2: R1 takes the return address.
                                0x05 | 0x0d if r1 != r2 => regs.gprs[r2 as usize],
                                _ => return None,
                            }
                        }
                    };
                    if to == pc {
                        if found.is_some() {
                            return None;
                        }
                        found = Some((at, insn));
                    }
                    if flow.always_branches() {
                        return found;
                    }
                }
            }
            at = at.wrapping_add(insn.len as u64);
        }
        None
    }
}

/// Start a block step of stopped thread `tid`, delivering `sig` (0: none).
pub(super) fn singleblock(tid: i32, sig: i32) -> Result<(), Errno> {
    // SAFETY: plain ptrace request on our stopped tracee; no pointers are passed.
    let r = unsafe { libc::ptrace(PTRACE_SINGLEBLOCK, tid, 0, sig as libc::c_long) };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// The probe (big-endian bytes): a jump taken, then a conditional branch not taken, then a jump.
/// Working block steps stop on the first jump's target (12), then on the second's (26), with
/// `si_addr` on the jumps (4, 18); steps of single instructions stop on 4.
const PROBE: [u8; 32] = [
    0xa7, 0x08, 0x00, 0x00, //  0: lhi %r0,0
    0xa7, 0xf4, 0x00, 0x04, //  4: j 12
    0xa7, 0x08, 0x00, 0x01, //  8: lhi %r0,1
    0x12, 0x00, //             12: ltr %r0,%r0 (cc 0)
    0xa7, 0x74, 0x00, 0x04, // 14: jne 22 (not taken)
    0xa7, 0xf4, 0x00, 0x04, // 18: j 26
    0x07, 0x07, 0x07, 0x07, // 22: nopr; nopr
    0xa7, 0x29, 0x00, 0x00, // 26: lghi %r2,0
    0x0a, 0x01, //             30: svc 1 (exit)
];

/// Does PTRACE_SINGLEBLOCK stop after taken branches only, with the branch in `si_addr`?
/// Stepped on a known sequence in a forked child.
pub(super) fn probe_singleblock() -> BlockStep {
    let page = match ProbePage::map() {
        Ok(p) => p,
        Err(why) => return BlockStep::Unavailable(why),
    };
    let start = page.addr();
    let child = match ProbeChild::start(start, start + 12) {
        Ok(c) => c,
        Err(why) => return BlockStep::Unavailable(why),
    };
    let pid = child.pid;
    for (i, chunk) in PROBE.chunks(8).enumerate() {
        let word = u64::from_be_bytes(chunk.try_into().expect("8-byte chunks"));
        if let Err(e) = ptrace::write(pid, (start + 8 * i as u64) as ptrace::AddressType, word as i64) {
            return BlockStep::Unavailable(format!("writing the probe code failed: {e}"));
        }
    }
    let step = || -> Result<(u64, u64), String> {
        singleblock(pid.as_raw(), 0).map_err(|e| format!("PTRACE_SINGLEBLOCK refused: {e}"))?;
        match wait_no_eintr(pid) {
            Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => {}
            other => return Err(format!("unexpected stop after a block step: {other:?}")),
        }
        let pc = read_pc(pid.as_raw()).map_err(|e| format!("reading the pc failed: {e}"))?;
        let si = ptrace::getsiginfo(pid).map_err(|e| format!("reading the siginfo failed: {e}"))?;
        // SAFETY: a SIGTRAP's siginfo holds the fault address (si_addr).
        Ok((pc, unsafe { si.si_addr() } as u64))
    };
    match step() {
        Ok((pc, from)) if pc == child.target && from == start + 4 => {}
        Ok((pc, _)) if pc == child.start + 4 => return BlockStep::StepsEachInstruction,
        Ok((pc, from)) => {
            return BlockStep::Unavailable(format!(
                "a block step stopped at byte {} of the probe (si_addr byte {})",
                pc.wrapping_sub(start),
                from.wrapping_sub(start)
            ))
        }
        Err(why) => return BlockStep::Unavailable(why),
    }
    match step() {
        Ok((pc, from)) if pc == start + 26 && from == start + 18 => BlockStep::Works,
        Ok((pc, from)) => BlockStep::Unavailable(format!(
            "a block step over a branch not taken stopped at byte {} of the probe (si_addr byte {})",
            pc.wrapping_sub(start),
            from.wrapping_sub(start)
        )),
        Err(why) => BlockStep::Unavailable(why),
    }
}
