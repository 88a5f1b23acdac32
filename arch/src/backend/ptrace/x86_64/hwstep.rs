//! Block stepping with debug-register breakpoints (`--step block`; x86_64 and i386 processes).
//!
//! Single-stepping traps once per instruction. Here a traced thread runs at full speed to the
//! next instruction whose outcome the decoder cannot tell, stopped there by an execute
//! breakpoint in DR0, and the instructions in between are counted by decoding. The records
//! are the ones single-stepping writes (`tests/tests/step_block.rs` compares them).
//!
//! # The rules
//!
//! At a stop, with the thread's next instruction at `P`:
//!
//! 1. **Plan.** Decode forward from `P`. Instructions that fall through (`Flow::Next`, a `rep`
//!    string instruction, which is one instruction however many times it repeats) and direct
//!    jumps and calls (their target is in the instruction) are *known*: the walk goes on
//!    through them, following direct jumps and calls. The first instruction that is not known
//!    is the stop point `Z`: a conditional jump, a return, an indirect jump or call, a system
//!    call, `int`/`int3`, `iret`, an undecodable instruction.
//! 2. **Single-step instead** when `P` itself is not known and rule 7 does not apply (so the
//!    record of a system call, K records included, or of an indirect branch comes from the
//!    single-step code unchanged), when a signal is being delivered (the handler's entry is
//!    told from the step that follows), when any instruction on the path is in a writable
//!    mapping (JIT or self-modifying code: only code that cannot change unseen is decoded
//!    ahead, the rule of the decode cache), and when the walk finds no stop point within
//!    [`PLAN_LIMIT`] instructions (a loop of direct jumps).
//! 3. **Run.** DR0 = `Z`, DR7 enables it as a one-byte execute breakpoint (each written only
//!    when it changes), `PTRACE_CONT`. The breakpoint stops the thread before `Z` executes.
//! 4. **Account.** At the next stop, at pc `R`, walk the same path from `P` to `R`: each
//!    instruction adds one to the count, each direct jump or call on it writes its branch
//!    record as single-stepping would (from, to, kind, count). `R == Z` with SIGTRAP is the
//!    breakpoint. Anything else stopped the thread mid-path and `R` says where: a signal from
//!    another process or a timer, a fault (SIGSEGV, SIGFPE) on the faulting instruction, a
//!    ptrace event or our interrupt. The signal is then delivered by a single step, as in
//!    single-step mode. A SIGTRAP away from `Z` is not ours (the breakpoint is only at `Z`)
//!    and is passed on; one that surfaces after our interrupt with no run or step under way
//!    is a breakpoint hit already counted, and is dropped. A path visits no pc twice (it
//!    would be an endless loop with no stop point), so the first `R` on it is the one. An `R`
//!    not on the path is counted as lost and warned about at the end (never seen in tests).
//! 5. **Getting past the breakpoint.** A thread stepped from `Z` has DR0 = `Z`. Where the
//!    kernel does not set the resume flag itself ([`HwBreak::Works`]`{ rf_auto }`), DR7 is
//!    cleared before single-stepping an instruction DR0 points at. Where it does, the flag is
//!    still lost now and then (about once in 100,000): a step that stops on `Z` again with a
//!    breakpoint si_code (`TRAP_HWBKPT`) did not run it, and is repeated with DR7 cleared.
//! 6. **Per thread.** Debug registers are per thread: a new thread or process starts without
//!    them, exec clears them (the kernel flushes ptrace breakpoints there), detach clears DR7.
//! 7. **Conditional jumps and returns are carried out by itrace.** Stopped on a plain `Jcc`
//!    (not LOOP/JRCXZ, no operand-size prefix) or a near `ret`/`ret imm16` in read-only code
//!    (a return pops 8 bytes, 4 in a 32-bit process), itrace reads the flags or the return
//!    address at the stack pointer, writes the record a step would, and sets the registers
//!    (`PTRACE_SETREGS`, far cheaper than a trap) before planning the next run; so a run that
//!    ends on one of them costs one trap. Returns are stepped instead where the CPU offers
//!    user shadow stacks (`user_shstk` in /proc/cpuinfo), which a return done by itrace would
//!    leave unbalanced, and when the return address cannot be read (the ret faults, by a
//!    step). A Jcc to itself is stepped.
//!
//!    Near indirect `jmp` and `call` (a PLT entry's `jmp *GOT(%rip)`, a call through a function
//!    pointer, a switch's jump table) are carried out the same way: the target is computed
//!    from the decoded operand (a register, or memory at base + index * scale + displacement,
//!    RIP-relative and `%fs:`/`%gs:` included) and read with the thread's registers; a call
//!    writes its return address below the stack pointer (process_vm_writev, which honours
//!    page protections). Left to a step: far and 16-bit forms, operand- or address-size
//!    prefixes, a segment base in a 32-bit process, an operand that cannot be read (the
//!    instruction faults), a stack that cannot be written (a guard page to grow into), and
//!    calls where the CPU offers user shadow stacks.
//! 8. **Through a conditional jump.** When the stop point `Z` of a plan is a conditional jump
//!    with a target, plan on from both its target and its next instruction. If both give a
//!    stop point, the two differ and neither is `Z`, the run does not stop at `Z`: DR0 waits
//!    at the stop point after the taken jump, DR1 at the one after the fall-through, and the
//!    one that stops the thread tells which way it went (the record is written as a step would
//!    have). The paths to `Z`, and from it both ways, share no pc (a shared pc would lead to
//!    one stop point), so a stop anywhere on them is placed exactly.
//! 9. **Region tracing** (`--region`, `--start`, `--stop`). The int3s of the triggers are
//!    stop points: a plan ends at any address that holds one (inserted or lifted), and a
//!    thread on one is single-stepped, so the trigger is handled by the single-step code
//!    (`region.rs`), which lifts the int3 for that step. Before every resume of a stepping
//!    thread, the trigger where it stands is handled first (an `ITraceOff` ends the region
//!    there). A thread whose region ends runs on untraced with its debug registers cleared, so
//!    no breakpoint of a finished run can stop it. The instructions itrace carries out (rule 7)
//!    are never at a trigger.
//!
//! Not handled (yet): a restartable sequence (rseq) aborted by the kernel moves the pc off the
//! path without a signal, and the thread would run on untraced past `Z`; `mov ss`/`pop ss`
//! hold back a breakpoint on the next instruction; another thread making code writable and
//! changing it during a run is not seen. System calls and interrupts are single-stepped: two
//! traps (breakpoint, step) each.

use super::engine::*;
use super::getregs;
use super::probe::{probe_start, probe_target};
use super::probe_child::{wait_no_eintr, ProbeChild};
use itrace_decoders::{x86, Flow, Insn};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

/// The longest path decoded ahead of one run.
pub const PLAN_LIMIT: u32 = 4096;

/// What debug-register breakpoints do under ptrace on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HwBreak {
    /// An execute breakpoint in DR0 stops the thread at its address. `rf_auto`: a step from
    /// that stop executes the instruction (the kernel sets the resume flag after the hit);
    /// otherwise the breakpoint must be disabled or moved first.
    Works { rf_auto: bool },
    /// Not usable here (the reason says why).
    Unavailable(String),
}

/// `offsetof(struct user, u_debugreg[n])`.
fn dr_offset(n: usize) -> usize {
    std::mem::offset_of!(libc::user, u_debugreg) + n * 8
}

/// si_code of a SIGTRAP from a hardware breakpoint.
pub(super) const TRAP_HWBKPT: i32 = 4;

/// DR7 with DR0 enabled (local) as a one-byte execute breakpoint (R/W0 = 00, LEN0 = 00).
pub const DR7_DR0_EXEC: u64 = 1;
/// The same for DR1 (L1; R/W1 and LEN1 = 00).
pub const DR7_DR1_EXEC: u64 = 1 << 2;

/// Write debug register `n` of stopped thread `tid`.
pub fn set_dr(tid: i32, n: usize, value: u64) -> Result<(), Errno> {
    // SAFETY: PTRACE_POKEUSER on a stopped tracee; the address is an offset into struct user.
    let r = unsafe { libc::ptrace(libc::PTRACE_POKEUSER, tid, dr_offset(n), value as libc::c_long) };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Probe execute breakpoints with a forked child running the probe code of `probe.rs`: a
/// breakpoint on `itrace_probe_target` must stop a `PTRACE_CONT` there, a step from that stop
/// must execute it (with RF set by us if the kernel does not), and moving DR0 away must let
/// the child run on to its exit.
pub fn probe_hw_breakpoints() -> HwBreak {
    let child = match ProbeChild::start(probe_start(), probe_target()) {
        Ok(c) => c,
        Err(why) => return HwBreak::Unavailable(why),
    };
    let (pid, start, target) = (child.pid, child.start, child.target);
    let tid = pid.as_raw();
    let stopped_at = |what: &str| -> Result<u64, String> {
        match wait_no_eintr(pid) {
            Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => {}
            other => return Err(format!("{what}: unexpected stop {other:?}")),
        }
        ptrace::getregs(pid).map(|r| r.rip).map_err(|e| format!("{what}: PTRACE_GETREGS failed: {e}"))
    };
    let result = (|| -> Result<HwBreak, String> {
        set_dr(tid, 0, target).map_err(|e| format!("writing DR0 failed: {e}"))?;
        set_dr(tid, 7, DR7_DR0_EXEC).map_err(|e| format!("writing DR7 failed: {e}"))?;
        ptrace::cont(pid, None).map_err(|e| format!("PTRACE_CONT failed: {e}"))?;
        let at = stopped_at("run to the breakpoint")?;
        if at != target {
            return Err(format!("the breakpoint at {target:#x} stopped the thread at {at:#x}"));
        }
        // From the breakpoint: does a step execute the instruction (one byte, a nop)?
        ptrace::step(pid, None).map_err(|e| format!("PTRACE_SINGLESTEP failed: {e}"))?;
        let rf_auto = match stopped_at("step from the breakpoint")? {
            a if a == target + 1 => true,
            a if a == target => {
                // Hit again: the resume flag is ours to set.
                let mut regs = ptrace::getregs(pid).map_err(|e| format!("PTRACE_GETREGS failed: {e}"))?;
                regs.eflags |= 1 << 16;
                ptrace::setregs(pid, regs).map_err(|e| format!("PTRACE_SETREGS failed: {e}"))?;
                ptrace::step(pid, None).map_err(|e| format!("PTRACE_SINGLESTEP failed: {e}"))?;
                let a = stopped_at("step with RF set")?;
                if a != target + 1 {
                    return Err(format!("a step with RF set stopped at {a:#x}, not {:#x}", target + 1));
                }
                false
            }
            a => return Err(format!("a step from the breakpoint stopped at {a:#x}")),
        };
        // Moved elsewhere, the breakpoint lets the child run on to its exit(0).
        set_dr(tid, 0, start).map_err(|e| format!("moving DR0 failed: {e}"))?;
        ptrace::cont(pid, None).map_err(|e| format!("PTRACE_CONT failed: {e}"))?;
        match wait_no_eintr(pid) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(HwBreak::Works { rf_auto }),
            other => Err(format!("after moving DR0 the child did not exit: {other:?}")),
        }
    })();
    drop(child);
    result.unwrap_or_else(HwBreak::Unavailable)
}

/// An instruction itrace carries out itself (rule 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emul {
    /// A plain `Jcc rel8/rel32` with this condition code (the low nibble of the opcode).
    Jcc(u8),
    /// A near `ret` (`ret imm16`: the bytes it also pops).
    Ret(u16),
    /// A near indirect `jmp` or `call` whose target comes from registers and memory.
    Indirect(x86::Indirect),
}

/// What of [`Emul`] the instruction in `bytes` is; `None` for anything else (LOOP, JRCXZ,
/// far returns, an operand-size or REX prefix).
pub fn emulable(bytes: &[u8]) -> Option<Emul> {
    let mut i = 0;
    // Branch hints (CS, DS) and BND/REP, which change nothing here.
    while i < bytes.len() && matches!(bytes[i], 0x2e | 0x3e | 0xf2 | 0xf3) {
        i += 1;
    }
    match bytes.get(i..)? {
        [op @ 0x70..=0x7f, ..] => Some(Emul::Jcc(op & 0xf)),
        [0x0f, op @ 0x80..=0x8f, ..] => Some(Emul::Jcc(op & 0xf)),
        [0xc3, ..] => Some(Emul::Ret(0)),
        [0xc2, lo, hi, ..] => Some(Emul::Ret(u16::from_le_bytes([*lo, *hi]))),
        _ => None,
    }
}

/// Whether this CPU can give user space a shadow stack (then a return carried out by itrace
/// would leave it behind, and returns are stepped).
pub fn cpu_has_user_shadow_stack() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.lines().filter(|l| l.starts_with("flags")).any(|l| l.split_whitespace().any(|f| f == "user_shstk")))
        .unwrap_or(true)
}

/// Where the indirect jump or call `ind` of a thread with registers `regs` goes; `None` where
/// its memory operand cannot be read (the instruction faults: let it, by a step) or it uses a
/// segment base a 32-bit process keeps in its descriptor tables.
fn indirect_target(ind: &x86::Indirect, regs: &libc::user_regs_struct, compat: bool, pid: i32) -> Option<u64> {
    let gprs = [
        regs.rax, regs.rcx, regs.rdx, regs.rbx, regs.rsp, regs.rbp, regs.rsi, regs.rdi, regs.r8, regs.r9, regs.r10,
        regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
    ];
    if compat && matches!(ind.source, x86::IndirectSource::Memory { segment, .. } if segment != x86::SegmentBase::None)
    {
        return None;
    }
    let segment_base = |s: x86::SegmentBase| match s {
        x86::SegmentBase::None => 0,
        x86::SegmentBase::Fs => regs.fs_base,
        x86::SegmentBase::Gs => regs.gs_base,
    };
    let read = |addr: u64, size: usize| {
        let mut buf = [0u8; 8];
        (super::tables::read_mem(pid, addr, &mut buf[..size]) == size).then(|| u64::from_le_bytes(buf))
    };
    ind.target(|n| gprs[n as usize], segment_base, read)
}

/// Whether a Jcc with condition code `cc` is taken with these flags.
pub fn jcc_taken(cc: u8, eflags: u64) -> bool {
    let f = |bit: u32| eflags >> bit & 1 != 0;
    let (cf, pf, zf, sf, of) = (f(0), f(2), f(6), f(7), f(11));
    let base = match cc >> 1 {
        0 => of,
        1 => cf,
        2 => zf,
        3 => cf || zf,
        4 => sf,
        5 => pf,
        6 => sf != of,
        _ => zf || sf != of,
    };
    base != (cc & 1 != 0)
}

/// Whether the decoder knows where `insn` goes: it falls through, or it is a direct jump or call.
pub fn known(insn: &Insn) -> bool {
    match insn.flow {
        Flow::Next | Flow::RepString => true,
        Flow::Jump | Flow::Call => insn.target.is_some(),
        _ => false,
    }
}

/// The stop point of the path from `start` (rule 1): the first instruction not [`known`].
/// `decode` gives `None` for code that may change unseen. `None`: no plan (rule 2).
pub fn plan(mut decode: impl FnMut(u64) -> Option<Insn>, start: u64, limit: u32) -> Option<u64> {
    let mut pc = start;
    for _ in 0..limit {
        let insn = decode(pc)?;
        if !known(&insn) {
            return Some(pc);
        }
        pc = match insn.flow {
            Flow::Jump | Flow::Call => insn.target.expect("known"),
            _ => pc.wrapping_add(insn.len as u64),
        };
    }
    None
}

/// A taken direct branch on a path: `icount` instructions since the previous one (or the
/// path's start), this one included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathBranch {
    pub icount: u32,
    pub from: u64,
    pub to: u64,
    pub flow: Flow,
}

/// Walk the path from `start` up to (not including) `until` (rule 4), calling `on_branch` for
/// each direct jump or call. Returns the instructions after the last branch, or `None` when
/// `until` is not on the path (then nothing is known of what ran).
pub fn follow(
    mut decode: impl FnMut(u64) -> Insn,
    start: u64,
    until: u64,
    limit: u32,
    mut on_branch: impl FnMut(PathBranch),
) -> Option<u32> {
    let mut pc = start;
    let mut n = 0u32;
    for _ in 0..=limit {
        if pc == until {
            return Some(n);
        }
        let insn = decode(pc);
        if !known(&insn) {
            return None;
        }
        n += 1;
        match insn.flow {
            Flow::Jump | Flow::Call => {
                let to = insn.target.expect("known");
                on_branch(PathBranch { icount: n, from: pc, to, flow: insn.flow });
                n = 0;
                pc = to;
            }
            _ => pc = pc.wrapping_add(insn.len as u64),
        }
    }
    None
}

/// What the plan sees at a region trigger's address: an instruction it does not know, so the
/// run stops there (rule 9).
const STOP_HERE: Insn = Insn { len: 1, flow: Flow::Interrupt, target: None };

/// A run in progress: from `start` to the breakpoint at `stop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) start: u64,
    pub(super) stop: u64,
    /// Rule 8: `stop` is a conditional jump that runs too; breakpoints wait at the stop points
    /// after it, (taken, not taken).
    pub(super) cond: Option<Cond>,
    /// Translate mode: the run is an rseq critical section's, run at its own address
    /// (`translate/rseq.rs`); DR1 waits at its abort handler.
    pub(super) rseq: Option<super::translate::NativeRun>,
}

/// Rule 8: the conditional jump a run goes through, and its two ways on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cond {
    /// Where it goes when taken, and the stop point from there.
    pub(super) target: u64,
    pub(super) taken_stop: u64,
    /// The next instruction, and the stop point from there.
    pub(super) next: u64,
    pub(super) fall_stop: u64,
}

impl Session<'_> {
    /// Resume `tid` (stepping, no signal to deliver) with a run to its next stop point if the
    /// rules allow one. False: single-step it (after [`Self::hw_before_step`]).
    pub(super) fn hw_run(&mut self, tid: i32) -> bool {
        let t = &self.threads[&tid];
        let Some(p) = t.pending else { return false };
        if !known(&p.insn) {
            return false;
        }
        let (pid, arch) = (t.pid, t.arch.isa);
        // Rule 9: an int3 of region tracing is a stop point; on one, single-step (it is lifted).
        let trigger_at = |s: &Self, pc: u64| s.procs.get(&pid).is_some_and(|p| p.region.bps.kind_at(pc).is_some());
        if trigger_at(self, p.pc) {
            return false;
        }
        let stable = |s: &mut Self, pc: u64| {
            if trigger_at(s, pc) {
                return Some(STOP_HERE);
            }
            let insn = s.decode(pid, arch, pc);
            // Cached means stable (read-only code); anything else may change unseen.
            s.procs.get(&pid).is_some_and(|p| p.code.contains_key(&pc)).then_some(insn)
        };
        let Some(stop) = plan(|pc| stable(self, pc), p.pc, PLAN_LIMIT) else { return false };
        // Rule 8: through a conditional jump to the stop points after it.
        let mut cond = None;
        let z = stable(self, stop);
        if let Some(Insn { flow: Flow::CondJump, target: Some(target), len }) = z {
            let next = stop.wrapping_add(len as u64);
            let taken_stop = plan(|pc| stable(self, pc), target, PLAN_LIMIT);
            let fall_stop = plan(|pc| stable(self, pc), next, PLAN_LIMIT);
            if let (Some(a), Some(b)) = (taken_stop, fall_stop) {
                if a != b && a != stop && b != stop && target != next {
                    cond = Some(Cond { target, taken_stop: a, next, fall_stop: b });
                }
            }
        }
        let (want0, want1, want7) = match cond {
            Some(c) => (c.taken_stop, Some(c.fall_stop), DR7_DR0_EXEC | DR7_DR1_EXEC),
            None => (stop, None, DR7_DR0_EXEC),
        };
        let t = self.threads.get_mut(&tid).expect("thread exists");
        let (dr0, dr1) = (t.arch.dr0, t.arch.dr1);
        let writes = [(0, want0, dr0 != want0), (1, want1.unwrap_or(dr1), want1.is_some_and(|w| w != dr1))];
        for (n, value, needed) in writes {
            if needed {
                if let Err(e) = set_dr(tid, n, value) {
                    self.hw_failed(tid, e);
                    return true;
                }
                let t = self.threads.get_mut(&tid).expect("thread exists");
                if n == 0 {
                    t.arch.dr0 = value;
                } else {
                    t.arch.dr1 = value;
                }
            }
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        if t.arch.dr7 != want7 {
            if let Err(e) = set_dr(tid, 7, want7) {
                self.hw_failed(tid, e);
                return true;
            }
            self.threads.get_mut(&tid).expect("thread exists").arch.dr7 = want7;
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.hw_run = Some(Run { start: p.pc, stop, cond, rseq: None });
        t.injected = None;
        if let Err(e) = ptrace::cont(Pid::from_raw(tid), None) {
            t.arch.hw_run = None;
            self.hw_failed(tid, e);
        }
        true
    }

    fn hw_failed(&mut self, tid: i32, e: Errno) {
        self.after_resume(tid, Err(e));
    }

    /// Before single-stepping `tid` (rule 5): a breakpoint on the instruction it is on would
    /// stop the step before it executes, unless the kernel set the resume flag.
    pub(super) fn hw_before_step(&mut self, tid: i32) {
        let rf_auto = self.opts.step.hw_rf_auto;
        let Some(t) = self.threads.get_mut(&tid) else { return };
        let on_it = t.pending.is_some_and(|p| t.arch.armed(p.pc));
        if on_it && !rf_auto && set_dr(tid, 7, 0).is_ok() {
            t.arch.dr7 = 0;
        }
    }

    /// A step from the breakpoint stopped on it again, before the instruction ran: the resume
    /// flag the kernel sets after a hit was lost (seen about once in 100,000 steps on a VM whose
    /// probe found `rf_auto`). DR7 is cleared so the next step executes the instruction.
    pub(super) fn hw_rehit(&mut self, tid: i32, regs: &libc::user_regs_struct) -> bool {
        let Some(t) = self.threads.get(&tid) else { return false };
        let suspect = t.arch.hw_stepped && t.arch.armed(regs.rip) && t.pending.is_some_and(|p| p.pc == regs.rip);
        // A conditional jump to itself lands here too, by a real step (TRAP_TRACE).
        if !suspect || ptrace::getsiginfo(Pid::from_raw(tid)).map(|si| si.si_code != TRAP_HWBKPT).unwrap_or(true) {
            return false;
        }
        if set_dr(tid, 7, 0).is_ok() {
            self.threads.get_mut(&tid).expect("thread exists").arch.dr7 = 0;
        }
        true
    }

    /// A thread with a run in progress stopped (rule 4): count the path up to where it is and
    /// decode what it runs next. Returns whether the stop is the run's breakpoint.
    pub(super) fn hw_stopped(&mut self, tid: i32, sig: i32) -> bool {
        let Some(t) = self.threads.get_mut(&tid) else { return false };
        let Some(run) = t.arch.hw_run.take() else { return false };
        let Ok(regs) = getregs(tid) else { return false };
        // One clock read for what this stop writes (the run's branches and what itrace carries
        // out next); `hw_run` or a step ends it.
        self.threads.get_mut(&tid).expect("thread exists").stop_ts = itrace_format::now_ns();
        let rip = regs.rip;
        let mut hit = sig == libc::SIGTRAP && rip == run.stop;
        let first = self.hw_path(tid, run.start, rip);
        match (first, run.cond) {
            (Some(path), _) => self.hw_account(tid, path),
            (None, _) if run.rseq.is_some_and(|r| rip == r.abort_ip) => {
                // The kernel aborted the section: the code up to its start ran, and the thread
                // went on at its abort handler; where in the section it was is not told.
                let r = run.rseq.expect("checked");
                let t = self.threads.get_mut(&tid).expect("thread exists");
                t.icount += r.before_start;
                let cpu = t.cpu;
                let b = branch(t, false, r.last_before_start, r.abort_ip, itrace_format::BranchKind::Other, 0, 0);
                self.push_branch(cpu, b);
                hit = sig == libc::SIGTRAP;
            }
            (None, Some(c)) => {
                // Past the conditional jump: the way it went is the path `rip` is on (the two
                // are disjoint: a shared pc would lead both to one stop point).
                let to_jcc = self.hw_path(tid, run.start, run.stop);
                let taken = self.hw_path(tid, c.target, rip);
                let went_taken = taken.is_some();
                let fall = if went_taken { None } else { self.hw_path(tid, c.next, rip) };
                match (to_jcc, taken, fall) {
                    (Some(before), Some(after), _) | (Some(before), None, Some(after)) => {
                        self.hw_account(tid, before);
                        let t = self.threads.get_mut(&tid).expect("thread exists");
                        t.icount += 1;
                        if went_taken {
                            let cpu = t.cpu;
                            let b = branch(t, false, run.stop, c.target, itrace_format::BranchKind::CondJump, 0, 0);
                            self.push_branch(cpu, b);
                        }
                        self.hw_account(tid, after);
                        hit = sig == libc::SIGTRAP && (rip == c.taken_stop || rip == c.fall_stop);
                    }
                    _ => self.arch.hw_lost += 1,
                }
            }
            (None, None) => self.arch.hw_lost += 1,
        }
        if run.rseq.is_some() {
            self.end_native_run(tid);
        }
        self.update_pending_after(tid, rip, &regs, false);
        if hit {
            self.hw_emulate(tid, &regs);
        }
        hit
    }

    /// The path from `start` to `until` (rule 4), without recording anything: its direct
    /// branches and the instructions after the last one. `None`: `until` is not on it.
    fn hw_path(&mut self, tid: i32, start: u64, until: u64) -> Option<(Vec<PathBranch>, u32)> {
        let t = &self.threads[&tid];
        let (pid, arch) = (t.pid, t.arch.isa);
        let mut branches = Vec::new();
        let tail = follow(|pc| self.decode(pid, arch, pc), start, until, PLAN_LIMIT, |b| branches.push(b))?;
        Some((branches, tail))
    }

    /// Count a path walked by [`Self::hw_path`] and write its branch records.
    fn hw_account(&mut self, tid: i32, (branches, tail): (Vec<PathBranch>, u32)) {
        let cpu = self.threads[&tid].cpu;
        for b in branches {
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.icount += b.icount - 1;
            let rec = branch(t, true, b.from, b.to, b.flow.branch_kind(), 0, 0);
            self.push_branch(cpu, rec);
        }
        self.threads.get_mut(&tid).expect("thread exists").icount += tail;
    }

    /// Rule 7: the thread is stopped on a plain conditional jump or a near return (`regs` are
    /// its registers): carry it out here instead of stepping it. The record is written as a
    /// step would write it. Repeats while the next instruction is one of those too.
    pub(super) fn hw_emulate(&mut self, tid: i32, regs: &libc::user_regs_struct) {
        let mut regs = *regs;
        let mut moved = false;
        for _ in 0..16 {
            let t = &self.threads[&tid];
            let Some(p) = t.pending else { break };
            let indirect = matches!(p.insn.flow, Flow::Jump | Flow::Call) && p.insn.target.is_none();
            if !(matches!(p.insn.flow, Flow::CondJump | Flow::Return) || indirect)
                || t.injected.is_some()
                || regs.rip != p.pc
            {
                break;
            }
            let (pid, cpu, compat) = (t.pid, t.cpu, t.arch.isa.compat);
            let next = p.pc.wrapping_add(p.insn.len as u64);
            let (to, kind) = match self.emul_at(pid, p.pc, compat) {
                Some(Emul::Jcc(cc)) => {
                    let Some(target) = p.insn.target else { break };
                    (if jcc_taken(cc, regs.eflags) { target } else { next }, itrace_format::BranchKind::CondJump)
                }
                Some(Emul::Ret(imm)) if self.opts.step.hw_emulate_stack => {
                    // 32-bit code pops 4 bytes (esp wraps at 4 GiB).
                    let width = if compat { 4 } else { 8 };
                    let mut buf = [0u8; 8];
                    if super::tables::read_mem(pid, regs.rsp, &mut buf[..width]) != width {
                        break; // the ret faults: let it, by a step
                    }
                    let sp = regs.rsp.wrapping_add(width as u64 + imm as u64);
                    regs.rsp = if compat { sp & 0xffff_ffff } else { sp };
                    (u64::from_le_bytes(buf), itrace_format::BranchKind::Return)
                }
                Some(Emul::Indirect(ind)) if !ind.call || self.opts.step.hw_emulate_stack => {
                    let Some(to) = indirect_target(&ind, &regs, compat, pid) else { break };
                    if ind.call {
                        // Push the return address as the call would; where the stack cannot be
                        // written (a guard page to grow into), the call is left to a step.
                        let width = if compat { 4 } else { 8 };
                        let sp = regs.rsp.wrapping_sub(width as u64) & if compat { 0xffff_ffff } else { u64::MAX };
                        if write_mem(pid, sp, &next.to_le_bytes()[..width]) != width {
                            break;
                        }
                        regs.rsp = sp;
                    }
                    (to, p.insn.flow.branch_kind())
                }
                _ => break,
            };
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.icount += 1;
            if to != next || p.insn.flow != Flow::CondJump {
                let b = branch(t, false, p.pc, to, kind, 0, 0);
                self.push_branch(cpu, b);
            }
            regs.rip = to;
            moved = true;
            self.update_pending_after(tid, to, &regs, false);
        }
        if moved {
            if let Err(e) = ptrace::setregs(Pid::from_raw(tid), regs) {
                self.hw_failed(tid, e);
            }
        }
    }

    /// What itrace can carry out of the instruction at `pc` (read-only code only), cached.
    fn emul_at(&mut self, pid: i32, pc: u64, compat: bool) -> Option<Emul> {
        let p = self.procs.get(&pid)?;
        if p.region.bps.kind_at(pc).is_some() {
            return None; // holds our int3 (rule 9), maybe inserted after the entry below was made
        }
        if let Some(&e) = p.arch.emul.get(&pc) {
            return e;
        }
        if !p.code.contains_key(&pc) {
            return None; // may change unseen
        }
        let mut buf = [0u8; x86::MAX_INSN_LEN];
        let n = super::tables::read_mem(pid, pc, &mut buf);
        let bitness = if compat { 32 } else { 64 };
        let e = emulable(&buf[..n]).or_else(|| x86::indirect(bitness, pc, &buf[..n]).map(Emul::Indirect));
        self.procs.get_mut(&pid)?.arch.emul.insert(pc, e);
        e
    }

    /// Detach: leave no breakpoint behind (rule 6).
    pub(super) fn hw_clear(&mut self, tid: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            if t.arch.dr7 != 0 && set_dr(tid, 7, 0).is_ok() {
                t.arch.dr7 = 0;
            }
        }
    }
}

/// Write `bytes` into `pid`'s memory at `addr` (memory it may write itself: process_vm_writev
/// honours page protections); returns how many were written.
fn write_mem(pid: i32, addr: u64, bytes: &[u8]) -> usize {
    let local = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: `local` points into `bytes` for its length and is only read by the kernel; the
    // remote range is checked by the kernel against the tracee's mappings.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    n.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    // 0x1000: mov $3,%ecx; 0x1005: dec %ecx; 0x1007: jnz 0x1005; 0x1009: call 0x1010;
    // 0x100e: nop; nop; 0x1010: rep movsb; 0x1012: jmp 0x100e
    const CODE: [u8; 20] = [
        0xb9, 3, 0, 0, 0, // mov $3,%ecx
        0xff, 0xc9, // dec %ecx
        0x75, 0xfc, // jnz 0x1005
        0xe8, 0x02, 0, 0, 0, // call 0x1010
        0x90, 0x90, // 0x100e: nop; nop
        0xf3, 0xa4, // 0x1010: rep movsb
        0xeb, 0xfa, // 0x1012: jmp 0x100e
    ];

    fn dec(pc: u64) -> Insn {
        x86::decode(64, pc, &CODE[(pc - 0x1000) as usize..])
    }

    #[test]
    fn plans_stop_at_the_first_unknown_instruction() {
        assert_eq!(plan(|pc| Some(dec(pc)), 0x1000, 100), Some(0x1007)); // the jnz
        assert_eq!(plan(|pc| Some(dec(pc)), 0x1007, 100), Some(0x1007)); // on it: single-step
                                                                         // call, rep movsb, jmp, nop, nop, rep movsb, ...: a loop with no stop point
        assert_eq!(plan(|pc| Some(dec(pc)), 0x1009, 100), None);
        // Code that may change: no plan.
        assert_eq!(plan(|pc| (pc < 0x1005).then(|| dec(pc)), 0x1000, 100), None);
    }

    #[test]
    fn paths_count_like_single_steps() {
        let mut seen = Vec::new();
        // mov, dec, stopped at the jnz.
        assert_eq!(follow(dec, 0x1000, 0x1007, 100, |b| seen.push(b)), Some(2));
        assert!(seen.is_empty());
        // call (a branch record of 1 instruction), rep movsb, jmp (2), nop: stopped at the second nop.
        assert_eq!(follow(dec, 0x1009, 0x100f, 100, |b| seen.push(b)), Some(1));
        assert_eq!(
            seen,
            [
                PathBranch { icount: 1, from: 0x1009, to: 0x1010, flow: Flow::Call },
                PathBranch { icount: 2, from: 0x1012, to: 0x100e, flow: Flow::Jump },
            ]
        );
        // Stopped before anything ran.
        assert_eq!(follow(dec, 0x1000, 0x1000, 100, |_| {}), Some(0));
        // A pc off the path.
        assert_eq!(follow(dec, 0x1000, 0x1009, 100, |_| {}), None);
    }

    #[test]
    fn conditions() {
        assert_eq!(emulable(&[0x75, 0xfc]), Some(Emul::Jcc(5)));
        assert_eq!(emulable(&[0x3e, 0x0f, 0x84, 0, 0, 0, 0]), Some(Emul::Jcc(4)));
        assert_eq!(emulable(&[0xe2, 0xfc]), None); // loop
        assert_eq!(emulable(&[0x66, 0x75, 0xfc]), None);
        assert_eq!(emulable(&[0xf3, 0xc3]), Some(Emul::Ret(0)));
        assert_eq!(emulable(&[0xc2, 0x10, 0x00]), Some(Emul::Ret(16)));
        assert_eq!(emulable(&[0xcb]), None); // far ret
        assert_eq!(emulable(&[0x66, 0xc3]), None);
        let zf = 1 << 6;
        assert!(jcc_taken(4, zf) && !jcc_taken(5, zf) && jcc_taken(5, 0));
        let (sf, of, cf) = (1 << 7, 1 << 11, 1);
        assert!(jcc_taken(0xc, sf) && !jcc_taken(0xc, sf | of) && jcc_taken(0xe, zf) && jcc_taken(0xf, sf | of));
        assert!(jcc_taken(6, cf) && jcc_taken(7, 0) && !jcc_taken(7, zf));
    }

    #[test]
    fn probe_runs() {
        // Whatever this machine does, the probe answers without hanging or killing us.
        let r = probe_hw_breakpoints();
        eprintln!("debug-register breakpoints: {r:?}");
    }
}
