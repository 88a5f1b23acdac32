//! The stepping loop over the GDB remote protocol: one thread, stepped
//! instruction by instruction, each step turned into records exactly like
//! the ptrace recorder does (taken branches with instruction counts, system
//! calls as a `U` INTRPT record and a `K` IRET record).
//!
//! Why about 660 lines: the session state and the step loop (single steps, system calls,
//! signals, atomic sequences) share every field; running ahead ([`super::runahead`]) and the
//! file and mapping calls ([`super::files`]) are in their own files.
//!
//! Round trips are the cost (about 8,000 per second on loopback), so the
//! recorder avoids them where the code tells the answer:
//! - in read-only code (decoded once), a straight run of instructions that
//!   cannot branch is not stepped: a breakpoint on the run's last
//!   instruction (the branch; breakpoints stay in place) and one continue
//!   execute it, and the run's length is its instruction count;
//! - after stepping a direct jump or call the pc is its target, and after
//!   a conditional branch whose two successors end their runs at different
//!   branches, the continue is sent at once with breakpoints on both ends:
//!   where it stops tells the way the branch went, with one pc read for
//!   both;
//! - a step of an instruction that cannot branch does not read the pc back.
//!
//! Returns, indirect branches, system calls and signals read it.
//!
//! Stepping quirks handled here (qemu-user 7.2's stub):
//! - stepping a system call instruction on PowerPC (`sc`) and i386
//!   (`int $0x80`) also runs the next instruction: a breakpoint after it and
//!   a continue instead;
//! - a PowerPC `lwarx` ... `stwcx.` sequence never completes when stepped
//!   (the reservation is lost at every stop): breakpoints after the
//!   store-conditional and on the targets of branches leaving the sequence,
//!   one continue, and the count of the path taken, told by where it stopped.

use super::protocol::{parse_stop_reply, Connection, GdbError, StopReply};
use super::registers::{self, Register, RegisterMap};
use crate::backend::sink::{Sink, Stored};
use crate::backend::RecordOutcome;
use crate::elf::Program;
use crate::{Arch, RemoteInfo, Reservation};
use itrace_decoders::{Flow, Insn};
use itrace_format::{
    branch_flags, Branch, BranchKind, Buffers, Mte, Record, StopReason, TraceOff, TraceOn, TraceOnReason,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Longest load-reserve/store-conditional sequence stepped over (as gdb and SystemTap do).
pub(super) const MAX_ATOMIC_SEQUENCE: u64 = 16;
/// Depth of signal handlers within handlers followed for their sigreturn.
pub(super) const MAX_NESTED_SIGNALS: usize = 64;
/// Longest straight run decoded ahead; a longer one is run in pieces by stepping.
pub(super) const MAX_RUN: u32 = 4096;
/// Shortest run worth a continue (a breakpoint the first time, then one round trip) over steps.
pub(super) const MIN_RUN: u32 = 2;
/// The same where a breakpoint must come out before stepping from its address and go back in
/// the next time (two more round trips per run).
pub(super) const MIN_RUN_LIFTING: u32 = 4;
/// The CPU number written in records: the stub does not say where the target runs.
pub(super) const CPU: usize = 0;
/// Linux auxiliary vector keys (elf.h).
pub(super) const AT_PHDR: u64 = 3;
pub(super) const AT_BASE: u64 = 7;
pub(super) const AT_ENTRY: u64 = 9;

/// How to record through a stub.
pub struct RemoteOptions<'a> {
    pub arch: &'a dyn Arch,
    /// The traced program's ELF file (module segments, read-only code), when known.
    pub program: Option<Program>,
    /// Where to find the dynamic loader named by PT_INTERP (qemu's `-L` prefix).
    pub sysroot: Option<PathBuf>,
    /// Name for the process in the module table.
    pub process_name: String,
    /// Process id to use when the stub does not name the thread.
    pub pid_hint: u32,
    /// The stub started the program (qemu-user `-g`): the first stop is its first instruction.
    pub launched: bool,
    /// A step from a breakpoint's own address runs the instruction there (qemu-user's stub, which
    /// itrace started itself); otherwise breakpoints are taken out before such a step.
    pub stub_steps_over_breakpoints: bool,
    /// Set by a signal handler or timer: stop tracing and detach.
    pub stop: &'a AtomicBool,
}

/// What happened; `error` is set when the stub failed mid-trace (the records up to there are kept).
#[derive(Debug)]
pub struct RemoteOutcome {
    pub outcome: RecordOutcome,
    pub error: Option<GdbError>,
}

use itrace_format::now_ns;

/// A decoded instruction and its bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Code {
    pub(super) insn: Insn,
    pub(super) bytes: [u8; 8],
    pub(super) nbytes: u8,
}

impl Code {
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes[..self.nbytes as usize]
    }
}

/// A system call about files, noted before it runs and completed when it returns.
#[derive(Debug)]
pub(super) enum MappingCall {
    Open(String),
    Close(u64),
    Mmap { len: u64, prot: u64, fd: u64, offset: u64 },
}

/// A straight run of read-only code: `len` instructions that cannot branch, then the
/// instruction at `end` that can (or that needs care: a system call, a load-reserve).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) end: u64,
    pub(super) len: u32,
}

pub(super) struct Session<'a> {
    pub(super) conn: &'a mut Connection,
    pub(super) opts: &'a RemoteOptions<'a>,
    pub(super) info: RemoteInfo,
    pub(super) sink: Sink<'a>,
    pub(super) regs: RegisterMap,
    pub(super) pc_reg: Register,
    pub(super) nr_reg: Register,
    pub(super) arg_regs: [Register; 6],
    pub(super) ret_reg: Register,
    /// Files the program opened, by descriptor (guest paths), for the mappings of its mmap calls.
    pub(super) fds: HashMap<u64, String>,
    /// Handlers the program installed, by signal (from its sigaction calls).
    pub(super) handlers: HashMap<u64, u64>,
    /// The stub answers `p` with nothing: registers come from `g`.
    pub(super) g_only: bool,
    /// Decoded instructions of read-only code.
    pub(super) code: HashMap<u64, Code>,
    /// Address ranges of read-only code (program and loader segments, biased).
    pub(super) read_only: Vec<(u64, u64)>,
    /// Straight runs by start address (`None`: not read-only code, or too long).
    pub(super) runs: HashMap<u64, Option<Run>>,
    /// Breakpoints left in place at run ends.
    pub(super) breakpoints: HashSet<u64>,
    /// Where handled signals interrupted the program, innermost last (where each sigreturn goes).
    pub(super) interrupted: Vec<u64>,
    pub(super) pid: u32,
    pub(super) tid: u32,
    /// Instructions since the last record.
    pub(super) icount: u32,
    /// The instruction the target executes next.
    pub(super) pc: u64,
    /// The pc as the last stop reply gave it (stubs that send registers with stops).
    pub(super) stop_pc: Option<u64>,
    pub(super) out: RecordOutcome,

    pub(super) finished: bool,
}

/// Connect the recorder to a stopped stub and trace until the program exits, `opts.stop` is set,
/// a buffer fills (normal mode) or the stub fails. Errors before tracing starts are returned as
/// `Err`; later ones end the trace cleanly and come back in [`RemoteOutcome::error`].
pub fn record(conn: &mut Connection, opts: &RemoteOptions, buffers: &mut Buffers) -> Result<RemoteOutcome, GdbError> {
    let info = opts.arch.remote();
    // No QStartNoAckMode even where offered: gdbserver 13 in that mode runs a step after a
    // removed breakpoint to the program's end.
    let _ = conn.request(b"qSupported:xmlRegisters=i386,ppc,s390x;swbreak+")?;
    // gdbserver describes the target only once a thread is selected; qemu 7.2 needs the
    // description read before any register access.
    let _ = conn.request(b"Hg0")?;
    let regs = RegisterMap::fetch(conn)?;
    let pc_reg = regs.get(info.pc_reg)?;
    let nr_reg = regs.get(info.syscall_nr_reg)?;
    let mut arg_regs = [pc_reg; 6];
    for (r, name) in arg_regs.iter_mut().zip(info.syscall_arg_regs) {
        *r = regs.get(name)?;
    }
    let ret_reg = regs.get(info.syscall_ret_reg)?;
    let first = parse_stop_reply(&conn.request(b"?")?)?;
    let (pid, tid) = match &first {
        &StopReply::Signal { thread: Some((pid, tid)), .. } => (pid.unwrap_or(tid), tid),
        StopReply::Signal { thread: None, .. } => (opts.pid_hint, opts.pid_hint),
        StopReply::Exited(_) | StopReply::Killed(_) => {
            return Err(GdbError::Malformed("the target has already exited".into()))
        }
    };
    let mut s = Session {
        conn,
        opts,
        info,
        sink: Sink::new(buffers),
        regs,
        pc_reg,
        nr_reg,
        arg_regs,
        ret_reg,
        fds: HashMap::new(),
        handlers: HashMap::new(),
        g_only: false,
        code: HashMap::new(),
        read_only: Vec::new(),
        runs: HashMap::new(),
        breakpoints: HashSet::new(),
        interrupted: Vec::new(),
        pid,
        tid,
        icount: 0,
        pc: 0,
        stop_pc: None,
        out: RecordOutcome::default(),
        finished: false,
    };
    s.note_stop(first);
    s.pc = s.read_reg(s.pc_reg)?;
    s.module_table()?;
    let ts = now_ns();
    let reason = if opts.launched { TraceOnReason::Start } else { TraceOnReason::Attach };
    s.out.threads = 1;
    s.out.processes = 1;
    s.push_control(Record::TraceOn(TraceOn { ts, reason, pid, tid, pc: s.pc }));
    let error = s.run().err();
    if error.is_some() {
        // Keep what was recorded; say where tracing stopped.
        s.finish(StopReason::TracerError, 0);
        s.out.stop_reason = Some(StopReason::TracerError);
    }
    s.out.stop_reason.get_or_insert(StopReason::Exited);
    // out counts the partial block of the trace-off record; the sink, the branches stored.
    s.out.branches += s.sink.branches;
    s.out.instructions += s.sink.instructions;
    s.out.write_error = s.sink.write_error();
    Ok(RemoteOutcome { outcome: s.out, error })
}

impl Session<'_> {
    /// Keep the pc a stop reply carries, so that reading it costs no round trip.
    pub(super) fn note_stop(&mut self, stop: StopReply) -> StopReply {
        self.stop_pc = match &stop {
            StopReply::Signal { registers, .. } => registers
                .iter()
                .find(|(n, _)| *n == self.pc_reg.number)
                .and_then(|(_, v)| registers::value(&v[..v.len().min(8)], self.info.big_endian).ok()),
            _ => None,
        };
        stop
    }

    /// Wait for the stop after a continue (however long), with ^C when asked to stop.
    pub(super) fn wait_stop(&mut self) -> Result<StopReply, GdbError> {
        // Nothing wakes this loop while the stub runs the program: write what is due first. A
        // write that fails here (a full disk) ends tracing once the program is stopped again,
        // in the main loop: taking breakpoints out and detaching now would talk to a stub that
        // is running the program, and leave it a breakpoint to die of.
        let _ = self.sink.tick();
        let stop = self.conn.recv_stop_waiting(self.opts.stop)?;
        Ok(self.note_stop(stop))
    }

    /// The stop reply to a step or signal delivery.
    pub(super) fn recv_stop(&mut self) -> Result<StopReply, GdbError> {
        let stop = parse_stop_reply(&self.conn.recv()?)?;
        Ok(self.note_stop(stop))
    }

    pub(super) fn read_reg(&mut self, r: Register) -> Result<u64, GdbError> {
        if r.number == self.pc_reg.number {
            if let Some(pc) = self.stop_pc {
                return Ok(pc);
            }
        }
        let malformed = |reply: &[u8]| {
            GdbError::Malformed(format!("register {} read as {:?}", r.number, String::from_utf8_lossy(reply)))
        };
        let mut reply = Vec::new();
        if !self.g_only {
            reply = self.conn.request(format!("p{:x}", r.number).as_bytes())?;
            // gdbserver on x86 has no `p`: all registers at once with `g`.
            self.g_only = reply.is_empty();
        }
        let bytes = if self.g_only {
            let all = self.conn.request(b"g")?;
            let all = super::protocol::from_hex(&all).map_err(|_| malformed(&all))?;
            let at = self.regs.g_offset(r);
            all.get(at..at + r.bits as usize / 8).ok_or_else(|| malformed(&reply))?.to_vec()
        } else {
            super::protocol::from_hex(&reply).map_err(|_| malformed(&reply))?
        };
        // A 64-bit register of a 32-bit target description is not expected; keep what fits.
        let bytes = &bytes[..bytes.len().min(8)];
        registers::value(bytes, self.info.big_endian)
    }

    /// The instruction at `pc`, from the cache for read-only code.
    pub(super) fn fetch(&mut self, pc: u64) -> Result<Code, GdbError> {
        if let Some(c) = self.code.get(&pc) {
            return Ok(*c);
        }
        let want = self.opts.arch.max_insn_len();
        let mut bytes = self.conn.read_memory(pc, want)?;
        if bytes.len() < want {
            // Near the end of a mapping: the shortest instruction may still be there.
            bytes = self.conn.read_memory(pc, 2.min(want))?;
            if let Ok(more) = self.conn.read_memory(pc, 4.min(want)) {
                if more.len() > bytes.len() {
                    bytes = more;
                }
            }
        }
        let insn = self.opts.arch.decode(pc, &bytes);
        let mut c = Code { insn, bytes: [0; 8], nbytes: bytes.len().min(8) as u8 };
        c.bytes[..c.nbytes as usize].copy_from_slice(&bytes[..c.nbytes as usize]);
        if self.in_read_only(pc) {
            self.code.insert(pc, c);
        }
        Ok(c)
    }

    pub(super) fn run(&mut self) -> Result<(), GdbError> {
        while !self.finished {
            if self.opts.stop.load(Ordering::Relaxed) {
                self.detach()?;
                break;
            }
            if self.sink.failed() {
                // A write failed while the program ran (see wait_stop).
                self.stop_tracing(StopReason::WriteError);
                break;
            }
            if let Some(run) = self.run_from(self.pc)? {
                if run.len >= self.min_run() {
                    self.continue_run(run)?;
                    if self.finished || self.opts.stop.load(Ordering::Relaxed) {
                        continue;
                    }
                }
            }
            let current = self.fetch(self.pc)?;
            if current.insn.flow == Flow::Syscall {
                // The call may block in the stub for long: write what is due before it.
                let st = self.sink.tick();
                self.after_store(st);
                self.step_syscall(current)?;
            } else if self.opts.arch.reservation(current.bytes()) == Reservation::Load {
                self.step_atomic(current)?;
            } else {
                self.step_one(current)?;
            }
        }
        Ok(())
    }

    /// Stop tracing and let the program run on.
    pub(super) fn detach(&mut self) -> Result<(), GdbError> {
        self.finish(StopReason::Detached, 0);
        self.out.stop_reason = Some(StopReason::Detached);
        self.remove_breakpoints()?;
        let _ = self.conn.request(b"D")?;
        self.conn.flush_ack()
    }

    /// Take out the breakpoints left at run ends (a stub need not do it on detach).
    pub(super) fn remove_breakpoints(&mut self) -> Result<(), GdbError> {
        let kind = self.info.breakpoint_kind;
        for addr in std::mem::take(&mut self.breakpoints) {
            self.conn.request_ok(format!("z0,{addr:x},{kind}").as_bytes())?;
        }
        Ok(())
    }

    /// Step the instruction at `self.pc`. From a breakpoint's own address, qemu-user's stub runs
    /// the instruction, while gdbserver executes its trap instead and reports the breakpoint again
    /// (and misbehaves after that): with stubs not known to step over, the breakpoint comes out
    /// first (it goes back in when a run ends there again).
    pub(super) fn step(&mut self) -> Result<StopReply, GdbError> {
        if !self.opts.stub_steps_over_breakpoints {
            self.lift_breakpoint_here()?;
        }
        self.conn.send(b"s")?;
        self.recv_stop()
    }

    /// Step one ordinary instruction (or branch).
    pub(super) fn step_one(&mut self, c: Code) -> Result<(), GdbError> {
        let pc = self.pc;
        let next = pc.wrapping_add(c.insn.len as u64);
        match self.step()? {
            StopReply::Signal { sig: 5, .. } => {
                if c.insn.flow == Flow::RepString {
                    // Another iteration of one instruction, or done.
                    let new_pc = self.read_reg(self.pc_reg)?;
                    if new_pc != pc {
                        self.icount += 1;
                        if new_pc != next {
                            self.branch(now_ns(), pc, new_pc, BranchKind::Other, 0, 0);
                        }
                    }
                    self.pc = new_pc;
                    return Ok(());
                }
                self.icount += 1;
                let new_pc = match (c.insn.flow, c.insn.target) {
                    // A non-branch completed: the pc is the next instruction; no need to ask.
                    (Flow::Next, _) => next,
                    (Flow::Jump | Flow::Call, Some(target)) => target,
                    (Flow::CondJump | Flow::CondCall, Some(target)) => {
                        if self.resolve_conditional(pc, c.insn.flow, target, next)? {
                            return Ok(());
                        }
                        self.read_reg(self.pc_reg)?
                    }
                    _ => self.read_reg(self.pc_reg)?,
                };
                if c.insn.flow.always_branches() || new_pc != next {
                    let kind = if c.insn.flow == Flow::Next { BranchKind::Other } else { c.insn.flow.branch_kind() };
                    self.branch(now_ns(), pc, new_pc, kind, 0, 0);
                }
                self.pc = new_pc;
            }
            StopReply::Signal { sig, .. } => self.signal(sig)?,
            StopReply::Exited(code) => self.finish(StopReason::Exited, code as i32),
            StopReply::Killed(sig) => self.finish(StopReason::Signaled, sig as i32),
        }
        Ok(())
    }

    /// The program received signal `sig` at `self.pc` (the instruction there did not complete):
    /// deliver it, and record the transition to wherever execution went. To a handler the
    /// program installed: a continue to a breakpoint on it (qemu's step with a signal runs the
    /// handler's first instruction too on some targets); otherwise a step with the signal.
    pub(super) fn signal(&mut self, sig: u8) -> Result<(), GdbError> {
        let pc = self.pc;
        // Records and handlers go by Linux's numbers, the stub by GDB's.
        let linux = super::protocol::linux_signal(sig);
        self.branch(now_ns(), pc, 0, BranchKind::Intrpt, branch_flags::SIGNAL, linux.unwrap_or(0));
        let handler = linux.and_then(|n| self.handlers.get(&n)).copied().filter(|&h| h > 1);
        let stop = match handler {
            Some(h) => {
                self.lift_breakpoint_here()?;
                let placed = self.insert_temporary_breakpoints(&[h])?;
                self.conn.send(format!("vCont;C{sig:02x}").as_bytes())?;
                let stop = self.wait_stop()?;
                if matches!(stop, StopReply::Signal { .. }) {
                    self.remove_temporary_breakpoints(&placed)?;
                }
                stop
            }
            None => {
                self.conn.send(format!("vCont;S{sig:02x}").as_bytes())?;
                self.recv_stop()?
            }
        };
        match stop {
            StopReply::Signal { .. } => {
                let to = self.read_reg(self.pc_reg)?;
                self.kernel_return(to, branch_flags::SIGNAL, linux.unwrap_or(0));
                if to != pc && self.interrupted.len() < MAX_NESTED_SIGNALS {
                    // A handler runs: its sigreturn comes back to `pc`.
                    self.interrupted.push(pc);
                }
                self.pc = to;
            }
            StopReply::Exited(code) => self.finish(StopReason::Exited, code as i32),
            StopReply::Killed(s) => self.finish(StopReason::Signaled, s as i32),
        }
        Ok(())
    }

    /// Run a system call instruction; a `U` INTRPT record, then a `K` IRET record to where it returned.
    pub(super) fn step_syscall(&mut self, c: Code) -> Result<(), GdbError> {
        let pc = self.pc;
        let next = pc.wrapping_add(c.insn.len as u64);
        let nr = match self.opts.arch.syscall_nr_in_insn(c.bytes()) {
            Some(n) => n,
            None => self.read_reg(self.nr_reg)?,
        };
        if self.info.sigaction_nrs.contains(&nr) {
            self.note_sigaction()?;
        }
        let mapping_call = self.mapping_call(nr)?;
        let ts = now_ns();
        // A sigreturn goes back to where the latest handled signal interrupted the program.
        let resume = match self.opts.arch.is_sigreturn(nr) {
            true => self.interrupted.pop().unwrap_or(next),
            false => next,
        };
        let stop = if self.info.step_runs_past_syscall {
            self.lift_breakpoint_here()?;
            let placed = self.insert_temporary_breakpoints(&[resume])?;
            self.conn.send(b"c")?;
            let stop = self.wait_stop()?;
            if matches!(stop, StopReply::Signal { .. }) {
                self.remove_temporary_breakpoints(&placed)?;
            }
            stop
        } else {
            if !self.opts.stub_steps_over_breakpoints {
                self.lift_breakpoint_here()?;
            }
            // The system call may block: wait as long as it takes (^C on a stop request).
            self.conn.send(b"s")?;
            self.wait_stop()?
        };
        self.icount += 1;
        self.branch(ts, pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, nr);
        match stop {
            StopReply::Signal { sig, .. } => {
                let to = self.read_reg(self.pc_reg)?;
                if let Some(call) = mapping_call {
                    self.mapping_call_returned(call)?;
                }
                self.kernel_return(to, branch_flags::SYSCALL, nr);
                self.pc = to;
                if sig != 5 && !(sig == 2 && self.opts.stop.load(Ordering::Relaxed)) {
                    self.signal(sig)?;
                }
            }
            StopReply::Exited(code) => {
                self.pc = next;
                self.finish(StopReason::Exited, code as i32)
            }
            StopReply::Killed(sig) => {
                self.pc = next;
                self.finish(StopReason::Signaled, sig as i32)
            }
        }
        Ok(())
    }

    /// Step over a PowerPC load-reserve ... store-conditional sequence starting at `self.pc`.
    pub(super) fn step_atomic(&mut self, first: Code) -> Result<(), GdbError> {
        let start = self.pc;
        // Find the store-conditional and the branches that leave the sequence.
        let mut exits: Vec<(u64, u64, Flow)> = Vec::new();
        let mut end = None;
        let mut a = start;
        for _ in 0..MAX_ATOMIC_SEQUENCE {
            let c = if a == start { first } else { self.fetch(a)? };
            if a != start && self.opts.arch.reservation(c.bytes()) == Reservation::Store {
                end = Some(a);
                break;
            }
            match (c.insn.flow, c.insn.target) {
                (Flow::Next, _) => {}
                (Flow::CondJump | Flow::Jump, Some(t)) => exits.push((a, t, c.insn.flow)),
                // A call, return, system call or indirect branch inside: not a sequence we can
                // step over safely; step it and hope the reservation holds.
                _ => return self.step_one(first),
            }
            a = a.wrapping_add(c.insn.len as u64);
        }
        let Some(end) = end else { return self.step_one(first) };
        // Branches inside the sequence (start..=end) do not leave it: the straight-path count covers them.
        exits.retain(|&(_, t, _)| t < start || t > end);
        let after = end + 4;
        let mut stops = vec![after];
        for &(_, t, _) in &exits {
            if !stops.contains(&t) {
                stops.push(t);
            }
        }
        self.lift_breakpoint_here()?;
        let placed = self.insert_temporary_breakpoints(&stops)?;
        self.conn.send(b"c")?;
        let stop = self.wait_stop()?;
        if matches!(stop, StopReply::Signal { .. }) {
            self.remove_temporary_breakpoints(&placed)?;
        }
        match stop {
            StopReply::Signal { sig: 5, .. } => {
                let pc = self.read_reg(self.pc_reg)?;
                // The sequence has no internal loops: where it stopped tells the path taken.
                if pc == after {
                    self.icount += ((end - start) / 4 + 1) as u32;
                } else if let Some(&(from, to, flow)) = exits.iter().find(|&&(_, t, _)| t == pc) {
                    self.icount += ((from - start) / 4 + 1) as u32;
                    self.branch(now_ns(), from, to, flow.branch_kind(), 0, 0);
                } else {
                    return Err(GdbError::Malformed(format!(
                        "the atomic sequence at {start:#x} stopped at {pc:#x}, outside its exits"
                    )));
                }
                self.pc = pc;
            }
            StopReply::Signal { sig, .. } => {
                // Interrupted (^C) or a signal inside the sequence: account from where it is now.
                let pc = self.read_reg(self.pc_reg)?;
                if pc >= start && pc <= end {
                    self.icount += ((pc - start) / 4) as u32;
                }
                self.stopped_by_signal(pc, sig)?;
            }
            StopReply::Exited(code) => self.finish(StopReason::Exited, code as i32),
            StopReply::Killed(sig) => self.finish(StopReason::Signaled, sig as i32),
        }
        Ok(())
    }

    /// The target stopped at `pc` for signal `sig` in the middle of a run or a sequence: pass
    /// the signal on, unless it is a trap of ours (SIGTRAP) or our own ^C for a stop request.
    pub(super) fn stopped_by_signal(&mut self, pc: u64, sig: u8) -> Result<(), GdbError> {
        self.pc = pc;
        if sig != 5 && (sig != 2 || !self.opts.stop.load(Ordering::Relaxed)) {
            self.signal(sig)?;
        }
        Ok(())
    }

    /// A user-space record ending the current block (its instructions are `self.icount`).
    pub(super) fn branch(&mut self, ts: u64, from: u64, to: u64, kind: BranchKind, flags: u8, aux: u64) {
        let icount = std::mem::take(&mut self.icount);
        self.push_branch(Branch { icount, ..Branch::user(ts, self.tid, from, to, kind, flags, aux as u16) });
    }

    /// The kernel's return to user space at `to` after a system call or signal delivery.
    pub(super) fn kernel_return(&mut self, to: u64, flags: u8, aux: u64) {
        let b = Branch::kernel_return(now_ns(), self.tid, to, flags, aux as u16);
        self.push_branch(b);
    }

    pub(super) fn push_branch(&mut self, b: Branch) {
        let stored = self.sink.branch(CPU, b);
        if stored == Stored::Full {
            // Not stored: its instructions go to the trace-off record's partial block.
            self.icount += b.icount;
        }
        self.after_store(stored);
    }

    pub(super) fn push_control(&mut self, r: Record) {
        let stored = self.sink.control(CPU, &r);
        self.after_store(stored);
    }

    pub(super) fn emit_mte(&mut self, m: Mte) {
        let stored = self.sink.mte(m);
        self.after_store(stored);
    }

    /// A full buffer or a failed write ends tracing; the program runs on.
    pub(super) fn after_store(&mut self, stored: Stored) {
        match stored {
            Stored::Yes => {}
            Stored::Full => self.stop_tracing(StopReason::BufferFull),
            Stored::Failed => self.stop_tracing(StopReason::WriteError),
        }
    }

    /// End tracing for a recorder reason (buffer full, write error): the program runs on untraced.
    pub(super) fn stop_tracing(&mut self, reason: StopReason) {
        if self.finished {
            return;
        }
        self.finish(reason, 0);
        self.out.stop_reason = Some(reason);
        if self.remove_breakpoints().is_ok() && self.conn.request(b"D").is_ok() {
            let _ = self.conn.flush_ack();
        }
    }

    /// Write the trace-off record (once).
    pub(super) fn finish(&mut self, reason: StopReason, value: i32) {
        if self.finished {
            return;
        }
        self.finished = true;
        if matches!(reason, StopReason::Exited | StopReason::Signaled) {
            self.out.exit_status = Some(if reason == StopReason::Signaled { -value } else { value });
        }
        let icount = std::mem::take(&mut self.icount);
        self.out.instructions += icount as u64;
        let r = TraceOff {
            ts: now_ns().max(self.sink.last_ts(CPU)),
            reason,
            pid: self.pid,
            tid: self.tid,
            pc: self.pc,
            icount,
            value,
        };
        self.push_control(Record::TraceOff(r));
    }
}
