//! Running ahead instead of stepping: in read-only code whose instructions are known, a
//! straight run of instructions ends at a breakpoint (or two, for a conditional branch), and
//! the counts are the decoded run's, exact as if every instruction had been stepped.

use super::engine::*;
use super::protocol::{GdbError, StopReply};
use crate::Reservation;
use itrace_decoders::Flow;
use itrace_format::{now_ns, StopReason};

impl Session<'_> {
    pub(super) fn min_run(&self) -> u32 {
        if self.opts.stub_steps_over_breakpoints {
            MIN_RUN
        } else {
            MIN_RUN_LIFTING
        }
    }

    pub(super) fn in_read_only(&self, pc: u64) -> bool {
        self.read_only.iter().any(|&(s, e)| pc >= s && pc < e)
    }

    /// The instruction ends a straight run: it may branch, or needs stepping with care.
    pub(super) fn ends_run(&self, c: &Code) -> bool {
        !matches!(c.insn.flow, Flow::Next | Flow::RepString)
            || self.opts.arch.reservation(c.bytes()) != Reservation::None
    }

    /// The straight run starting at `pc`, when it lies in read-only code.
    pub(super) fn run_from(&mut self, pc: u64) -> Result<Option<Run>, GdbError> {
        if let Some(r) = self.runs.get(&pc) {
            return Ok(*r);
        }
        let mut a = pc;
        let mut run = None;
        for len in 0..MAX_RUN {
            if !self.in_read_only(a) {
                break;
            }
            let c = self.fetch(a)?;
            if self.ends_run(&c) {
                run = Some(Run { end: a, len });
                break;
            }
            a = a.wrapping_add(c.insn.len as u64);
        }
        self.runs.insert(pc, run);
        Ok(run)
    }

    /// Instructions from `start` up to (not including) `pc`, when `pc` is on the run from `start`.
    pub(super) fn run_count_to(&mut self, start: u64, run: Run, pc: u64) -> Result<Option<u32>, GdbError> {
        let mut a = start;
        for n in 0..=run.len {
            if a == pc {
                return Ok(Some(n));
            }
            a = a.wrapping_add(self.fetch(a)?.insn.len as u64);
        }
        Ok(None)
    }

    pub(super) fn insert_breakpoint(&mut self, addr: u64) -> Result<(), GdbError> {
        if self.breakpoints.insert(addr) {
            let kind = self.info.breakpoint_kind;
            self.conn.request_ok(format!("Z0,{addr:x},{kind}").as_bytes())?;
        }
        Ok(())
    }

    /// A continue from a breakpoint's own address stops there at once: take out the one at the
    /// pc (a run end that is a system call or load-reserve; it goes back in when next needed).
    pub(super) fn lift_breakpoint_here(&mut self) -> Result<(), GdbError> {
        if self.breakpoints.remove(&self.pc) {
            let kind = self.info.breakpoint_kind;
            self.conn.request_ok(format!("z0,{:x},{kind}", self.pc).as_bytes())?;
        }
        Ok(())
    }

    /// Breakpoints for one continue, where none stays already; returns those placed.
    pub(super) fn insert_temporary_breakpoints(&mut self, addrs: &[u64]) -> Result<Vec<u64>, GdbError> {
        let kind = self.info.breakpoint_kind;
        let mut placed = Vec::new();
        for &addr in addrs {
            if !self.breakpoints.contains(&addr) && !placed.contains(&addr) {
                self.conn.request_ok(format!("Z0,{addr:x},{kind}").as_bytes())?;
                placed.push(addr);
            }
        }
        Ok(placed)
    }

    pub(super) fn remove_temporary_breakpoints(&mut self, placed: &[u64]) -> Result<(), GdbError> {
        let kind = self.info.breakpoint_kind;
        for addr in placed {
            self.conn.request_ok(format!("z0,{addr:x},{kind}").as_bytes())?;
        }
        Ok(())
    }

    /// Execute the straight run at `self.pc` with one continue to the breakpoint at its end.
    pub(super) fn continue_run(&mut self, run: Run) -> Result<(), GdbError> {
        let start = self.pc;
        self.insert_breakpoint(run.end)?;
        self.conn.send(b"c")?;
        match self.wait_stop()? {
            StopReply::Signal { sig: 5, .. } => {
                // The only breakpoint on the run is at its end.
                self.icount += run.len;
                self.pc = run.end;
            }
            StopReply::Signal { sig, .. } => {
                // A signal (or our ^C) stopped it on the way: count up to where it is.
                let pc = self.read_reg(self.pc_reg)?;
                let Some(n) = self.run_count_to(start, run, pc)? else {
                    return Err(GdbError::Malformed(format!(
                        "the run from {start:#x} to {:#x} stopped at {pc:#x}, outside it",
                        run.end
                    )));
                };
                self.icount += n;
                self.stopped_by_signal(pc, sig)?;
            }
            StopReply::Exited(code) => self.finish(StopReason::Exited, code as i32),
            StopReply::Killed(sig) => self.finish(StopReason::Signaled, sig as i32),
        }
        Ok(())
    }

    /// After stepping the conditional branch at `from` (counted): when its two successors start
    /// runs that end at different branches, run on with one continue to whichever end comes and
    /// tell the way it went from where it stopped. `false` when the runs cannot tell (the caller
    /// reads the pc).
    pub(super) fn resolve_conditional(
        &mut self,
        from: u64,
        flow: Flow,
        target: u64,
        next: u64,
    ) -> Result<bool, GdbError> {
        // Where breakpoints come out before a step, the breakpoint at a run end is out half the
        // time: plain reads of the pc and the main loop's runs do as well.
        if !self.opts.stub_steps_over_breakpoints {
            return Ok(false);
        }
        let (Some(taken), Some(fall)) = (self.run_from(target)?, self.run_from(next)?) else { return Ok(false) };
        // A run of length 0 would stop at once on a breakpoint where it starts.
        if taken.end == fall.end || taken.len == 0 || fall.len == 0 || target == next {
            return Ok(false);
        }
        self.insert_breakpoint(taken.end)?;
        self.insert_breakpoint(fall.end)?;
        self.conn.send(b"c")?;
        let stop = self.wait_stop()?;
        let sig = match stop {
            StopReply::Signal { sig, .. } => sig,
            StopReply::Exited(code) => {
                self.finish(StopReason::Exited, code as i32);
                return Ok(true);
            }
            StopReply::Killed(s) => {
                self.finish(StopReason::Signaled, s as i32);
                return Ok(true);
            }
        };
        let pc = self.read_reg(self.pc_reg)?;
        // The two runs are disjoint (runs that meet end at the same branch), so `pc` is on one.
        let (went_to_target, n) = if sig == 5 && pc == taken.end {
            (true, taken.len)
        } else if sig == 5 && pc == fall.end {
            (false, fall.len)
        } else if let Some(n) = self.run_count_to(target, taken, pc)? {
            (true, n)
        } else if let Some(n) = self.run_count_to(next, fall, pc)? {
            (false, n)
        } else {
            return Err(GdbError::Malformed(format!(
                "after the branch at {from:#x} the target stopped at {pc:#x}, on neither way"
            )));
        };
        if went_to_target {
            self.branch(now_ns(), from, target, flow.branch_kind(), 0, 0);
        }
        self.icount += n;
        self.stopped_by_signal(pc, sig)?;
        Ok(true)
    }
}
