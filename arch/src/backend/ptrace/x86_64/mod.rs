//! The x86_64 half of the ptrace recorder (the engine it plugs into is `super`): registers
//! through `PTRACE_GETREGS` (`user_regs_struct`, 32-bit code told by `cs`); single steps, block
//! steps (`PTRACE_SINGLEBLOCK`, the CPU's branch trap, and its emulation as a test hook) and
//! debug-register runs (`hwstep.rs`); what a step ran (`step.rs`: branches, `syscall` and
//! `int 0x80` with restart codes in rax, signal deliveries); region tracing's `int3`
//! breakpoints and returns (the engine's `region.rs` does the rest); the choice of step method from what the probes
//! (`probe.rs`, `hwstep.rs`) saw work.

mod block;
mod hwstep;
mod probe;
mod step;
mod translate;
mod trapmask;

// The shared engine, under the names the files of this module use (`super::engine`, ...).
use super::{engine, probe_child, tables};

use super::PtraceRecorder;
use crate::backend::{BackendError, Recorded, Recorder, StepChoice};
use crate::isa::x86_64::{RESTART_CODES, X86};
use crate::procfs;
use crate::Arch as _;
use engine::{Pending, PtraceArch, Session, ThreadState};
use hwstep::{probe_hw_breakpoints, HwBreak};
use itrace_decoders::{Flow, Insn};
use itrace_format::{LiveCounts, StepMethod};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use probe::probe_singleblock;
use probe_child::BlockStep;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The instruction set a thread runs (64-bit, or 32-bit compat code).
pub(super) type Isa = X86;

/// Bytes read to decode one instruction.
pub(super) const INSN_READ_LEN: usize = itrace_decoders::x86::MAX_INSN_LEN;

/// Syscall stops are asked for (PTRACE_O_TRACESYSGOOD from the start): system calls are stepped over like other instructions.
pub(super) const SYSCALL_STOPS: bool = false;

impl StepOptions {
    /// Syscall stops are told from step stops (PTRACE_O_TRACESYSGOOD): the translating
    /// recorder's traps are syscall stops (`translate/`).
    pub(super) fn syscall_stops(&self) -> bool {
        SYSCALL_STOPS || self.translate
    }
}

/// How threads are stepped.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StepOptions {
    /// Step by taken branch (PTRACE_SINGLEBLOCK) instead of by instruction: only where
    /// [`probe_singleblock`] found that it works.
    pub(super) block_step: bool,
    /// Test hook: single-step, but hand only the stops that follow a taken branch or a system
    /// call to the block-step logic, as a working branch trap would. With `block_step` set, this
    /// exercises block decoding on machines whose hypervisor ignores BTF.
    pub(super) emulate_block_step: bool,
    /// Run to the next instruction the decoder cannot tell with a debug-register breakpoint,
    /// single-step that one (`--step block`, see `hwstep.rs`).
    pub(super) hw_step: bool,
    /// With `hw_step`: the kernel sets the resume flag after a breakpoint hit (the probe's finding).
    pub(super) hw_rf_auto: bool,
    /// With `hw_step`: returns and indirect calls may be carried out by itrace (the CPU has no
    /// user shadow stack).
    pub(super) hw_emulate_stack: bool,
    /// Run the program from a code cache of translated units (`--backend translate`,
    /// `translate/`); the other ways are off.
    pub(super) translate: bool,
}

impl StepOptions {
    /// The tracer's own settings for the session, once the program it launches is forked (it
    /// would inherit them: its nice value), or before it attaches; `writer` is the buffers'
    /// writer thread, if they have one.
    pub(super) fn tracer_settings(&self, writer: Option<i32>) {
        if self.translate {
            translate::raise_tracer_priority(writer);
        }
    }

    /// The buffers get a writer thread of their own (`Sink::threaded`): the code cache's
    /// threads record faster than one thread encodes their records.
    pub(super) fn buffers_on_their_own_thread(&self) -> bool {
        self.translate
    }

    /// The tracer pins itself to the CPU of the thread it steps (`cpus.rs`), to make each step's
    /// ping-pong a same-CPU wake-up. Not when translating: it serves every thread from their
    /// occasional stops, and pinned it could not be run by another CPU when the scheduler
    /// starves it on its own (see `cpus.rs`).
    pub(super) fn tracer_follows_threads(&self) -> bool {
        !self.translate
    }
}

/// A thread's x86_64 state.
#[derive(Debug)]
pub(super) struct ThreadArch {
    isa: X86,
    /// Block-step emulation: pc of the instruction the last single step ran.
    emu_prev: u64,
    /// Block mode: this resume single-steps (the block is ambiguous for the branch trap).
    single_step_now: bool,
    /// Block mode: the system call that ends the running block and the instructions before it,
    /// known before it runs (an exec replaces the code a later walk would need).
    planned_syscall: Option<(u64, Insn, u32)>,
    /// Debug-register mode: the run in progress.
    hw_run: Option<hwstep::Run>,
    /// Debug-register mode: this thread's DR0, DR1 and DR7 as last written.
    dr0: u64,
    dr1: u64,
    dr7: u64,
    /// Debug-register mode: the last resume was a single step.
    hw_stepped: bool,
    /// The program's signal mask as far as SIGTRAP goes (`trapmask.rs`).
    trap_mask: trapmask::TrapMask,
    /// Translate mode: the thread's place in the code cache.
    xl: translate::ThreadCache,
}

impl Default for ThreadArch {
    fn default() -> Self {
        ThreadArch {
            isa: X86 { compat: false },
            emu_prev: 0,
            single_step_now: false,
            planned_syscall: None,
            hw_run: None,
            dr0: 0,
            dr1: 0,
            dr7: 0,
            hw_stepped: false,
            trap_mask: trapmask::TrapMask::default(),
            xl: translate::ThreadCache::default(),
        }
    }
}

impl ThreadArch {
    /// The instruction set the thread runs now.
    pub(super) fn isa(&self) -> X86 {
        self.isa
    }

    /// Debug-register mode: whether an enabled breakpoint of this thread is at `pc`.
    pub(super) fn armed(&self, pc: u64) -> bool {
        (self.dr7 & 1 != 0 && self.dr0 == pc) || (self.dr7 & 4 != 0 && self.dr1 == pc)
    }
}

/// A process's x86_64 state.
#[derive(Default)]
pub(super) struct ProcessArch {
    /// Block mode: what is known of the block starting at an address.
    ambiguous: engine::IntMap<u64, block::BlockInfo>,
    /// Debug-register mode: what itrace can carry out itself of the instruction at an address.
    emul: engine::IntMap<u64, Option<hwstep::Emul>>,
    /// Translate mode: the process's code cache.
    cache: translate::Cache,
}

impl ProcessArch {
    /// The state of a forked child: nothing carried over (block and debug-register knowledge is
    /// relearnt) but the code cache, which the child's memory holds too; a vfork child shares
    /// its parent's memory, so it does not translate (it is stepped until its exec).
    pub(super) fn copy_for_child(&self, shares_memory: bool) -> Self {
        let mut cache = self.cache.copy_for_child();
        if shares_memory {
            cache.disabled = Some("a vfork child shares its parent's code cache".into());
        }
        ProcessArch { cache, ..ProcessArch::default() }
    }

    /// Code in `start..end` changed (`unmapped`: some was unmapped): forget what was learnt of it.
    pub(super) fn forget(&mut self, start: u64, end: u64, unmapped: bool) {
        self.emul.retain(|a, _| *a < start || *a >= end);
        if unmapped {
            self.ambiguous.clear();
        }
        self.cache.invalidate(start, end);
    }

    /// Whether a mapping is itrace's own (the code cache), not the program's.
    pub(super) fn hides(&self, start: u64) -> bool {
        self.cache.owns(start)
    }

    /// The bytes read at `pc` as the program has them (nothing of ours beyond the region's
    /// breakpoints, which the engine takes out).
    pub(super) fn unpatch(&self, _pc: u64, _bytes: &mut [u8]) {}

    /// The instruction at `pc` (`bytes`) was cached as read-only code.
    pub(super) fn cached(&mut self, _pc: u64, _bytes: &[u8]) {}
}

/// The session's x86_64 state.
#[derive(Default)]
pub(super) struct SessionArch {
    /// Debug-register mode: stops that were not on the planned path (counts unreliable).
    hw_lost: u64,
    /// Translate mode: what the threads stopped for (`ITRACE_STATS=1` prints it).
    xl_stats: translate::Stats,
    /// Translate mode: the buffers of the drains.
    xl_buffers: translate::Buffers,
}

/// At a system call's exit stop: if it failed with EINTR and no signal of the program's is
/// on its way (so the EINTR is our interrupt's), say ERESTARTNOHAND instead: on the way back to
/// user mode the kernel, which has our interrupt pending, restarts the call as it does for a
/// stop signal without handler.
fn restart_instead_of_eintr(tid: i32) {
    const EINTR: i64 = -(libc::EINTR as i64);
    const ERESTARTNOHAND: i64 = -514;
    let Ok(mut regs) = getregs(tid) else { return };
    if (regs.orig_rax as i64) < 0 || regs.rax as i64 != EINTR || procfs::unblocked_pending_signals(tid) != 0 {
        return;
    }
    regs.rax = ERESTARTNOHAND as u64;
    let _ = ptrace::setregs(Pid::from_raw(tid), regs);
}

/// At a system call's entry stop: skip the call (orig_rax -1) and put the thread back on its
/// `syscall` instruction with the call's number in rax, to run it again later.
fn undo_syscall_entry(tid: i32) {
    let Ok(mut regs) = getregs(tid) else { return };
    if (regs.orig_rax as i64) < 0 {
        return;
    }
    regs.rax = regs.orig_rax;
    regs.orig_rax = u64::MAX;
    regs.rip -= 2;
    let _ = ptrace::setregs(Pid::from_raw(tid), regs);
}

/// Whether a thread's syscall stop is the call's exit (PTRACE_GET_SYSCALL_INFO, Linux 5.3).
pub(super) fn syscall_stop_is_exit(tid: i32) -> bool {
    let mut info = [0u8; 128];
    // SAFETY: the kernel writes at most `info.len()` bytes (the size argument) into our buffer.
    let r =
        unsafe { libc::ptrace(libc::PTRACE_GET_SYSCALL_INFO, tid, info.len(), info.as_mut_ptr() as *mut libc::c_void) };
    r > 0 && info[0] == libc::PTRACE_SYSCALL_INFO_EXIT
}

pub(super) fn getregs(tid: i32) -> Result<libc::user_regs_struct, Errno> {
    ptrace::getregs(Pid::from_raw(tid))
}

/// Region tracing: the breakpoint instruction.
pub(super) const BREAKPOINT: &[u8] = &[0xcc];

/// Region tracing: the breakpoint a thread stopped by SIGTRAP with `pc` hit (`int3` runs).
pub(super) fn breakpoint_hit(pc: u64) -> u64 {
    pc.wrapping_sub(1)
}

/// Region tracing: where the breakpoint of the function at `addr` goes (its first byte).
pub(super) fn breakpoint_address(_tid: i32, addr: u64) -> u64 {
    addr
}

pub(super) fn pc_of(tid: i32) -> Result<u64, Errno> {
    getregs(tid).map(|r| r.rip)
}

pub(super) fn set_pc(tid: i32, pc: u64) -> Result<(), Errno> {
    let mut regs = getregs(tid)?;
    regs.rip = pc;
    ptrace::setregs(Pid::from_raw(tid), regs)
}

/// Return from the function the thread just entered, as its `ret` would (pc from the stack),
/// with `value` in rax if given; the pc returned to.
pub(super) fn return_to_caller(tid: i32, value: Option<u64>) -> Option<u64> {
    let mut regs = getregs(tid).ok()?;
    let ret = ptrace::read(Pid::from_raw(tid), regs.rsp as ptrace::AddressType).ok()? as u64;
    regs.rip = ret;
    regs.rsp += 8;
    if let Some(v) = value {
        regs.rax = v;
    }
    ptrace::setregs(Pid::from_raw(tid), regs).ok()?;
    Some(ret)
}

impl PtraceArch for Session<'_> {
    /// Resume a thread: one more step while tracing, or detach it once tracing is ending.
    fn resume(&mut self, tid: i32, sig: i32) {
        // A stop not seen as a step (the thread left stepping meanwhile): its own mask back.
        self.put_back_trap_mask(tid);
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = false;
        t.stop_ts = 0;
        let pid = Pid::from_raw(tid);
        let sig_opt = Signal::try_from(sig).ok();
        if self.detaching.is_some() || t.state == ThreadState::Finished {
            self.detach_thread(tid, sig);
            return;
        }
        if t.state == ThreadState::Running {
            return self.resume_running(tid, sig);
        }
        t.injected = (sig != 0).then_some(sig);
        if self.opts.step.translate {
            self.thread_follows_tracer(tid);
        }
        let Some(t) = self.threads.get(&tid) else { return };
        if self.opts.step.translate && sig == 0 {
            if t.arch.xl.in_cache {
                // Stopped only to have its ring drained: it goes on in the cache.
                return self.run_in_cache(tid);
            }
            if self.enter_cache(tid) || self.start_native_run(tid) {
                return;
            }
            // A thread stepped on from a native run's breakpoint address (rule 5 of `hwstep.rs`).
            if self.threads.get(&tid).is_some_and(|t| t.arch.dr7 != 0) {
                self.end_native_run(tid);
            }
        }
        if self.opts.step.hw_step {
            if sig == 0 && self.opts.triggers.is_some() {
                // A run may end on a trigger (ITraceOff, --stop): handle it before going on (a
                // second call for the same stop finds nothing to do).
                self.before_step(tid);
                if !matches!(self.threads.get(&tid), Some(t) if t.state == ThreadState::Stepping) {
                    return self.resume(tid, 0);
                }
            }
            self.unblock_trap_for_resume(tid, sig);
            if sig == 0 && self.hw_run(tid) {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.arch.hw_stepped = false;
                }
                return;
            }
            self.hw_before_step(tid);
            if let Some(t) = self.threads.get_mut(&tid) {
                t.arch.hw_stepped = true;
            }
        }
        if self.opts.triggers.is_some() {
            // Our breakpoint where the thread steps next: take it out for this one step.
            self.lift_breakpoint_at_pending(tid);
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if self.opts.step.block_step {
            let info = match t.pending {
                Some(p) => self.block_info(tid, p.pc),
                None => block::BlockInfo { ambiguous: true, syscall: None },
            };
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.arch.single_step_now = info.ambiguous;
            t.arch.planned_syscall = info.syscall;
        }
        self.unblock_trap_for_resume(tid, sig);
        let t = &self.threads[&tid];
        let r = if self.opts.step.block_step && !self.opts.step.emulate_block_step && !t.arch.single_step_now {
            // SAFETY: plain ptrace request on our stopped tracee; the data argument is a signal number.
            let r = unsafe { libc::ptrace(probe::PTRACE_SINGLEBLOCK, tid, 0, sig as libc::c_long) };
            if r == 0 {
                Ok(())
            } else {
                Err(Errno::last())
            }
        } else if self.opts.step.translate && sig == 0 && t.pending.is_some_and(|p| p.insn.flow == Flow::Syscall) {
            // A system call may block for long: stepped, its thread keeps the trap flag, and
            // if itrace dies meanwhile it dies of the SIGTRAP when the call returns. Between
            // syscall stops nothing is left set (the exit stop is the step's stop).
            ptrace::syscall(pid, None)
        } else {
            ptrace::step(pid, sig_opt)
        };
        self.after_resume(tid, r);
    }

    fn on_syscall_stop(&mut self, tid: i32) {
        if !self.threads.contains_key(&tid) {
            self.adopt(tid);
        }
        if let Some(t) = self.threads.get_mut(&tid) {
            t.stopped = true;
        }
        if self.threads[&tid].arch.xl.in_cache {
            // One of the code cache's traps (a thread in the cache runs under PTRACE_SYSEMU).
            return self.cache_syscall_stop(tid);
        }
        if syscall_stop_is_exit(tid) {
            // An interrupt of ours (a periodic drain sent while the thread was still in the
            // cache, or the detach) made the call fail with EINTR rather than restart
            // (epoll_wait...): make it restart as the others do, so that the program, which
            // would not have seen that EINTR untraced, does not.
            let ours = self.detaching.is_some() || self.threads[&tid].arch.xl.drain_only;
            if ours {
                restart_instead_of_eintr(tid);
            }
            // A system call run under PTRACE_SYSCALL instead of a step (translating recorder):
            // its exit stop is the step's stop, with the same registers.
            return self.on_signal_stop(tid, libc::SIGTRAP);
        }
        if self.detaching.is_some() {
            // Let go at a call's entry, the thread would run the call with the wake-up of the
            // detach still pending: epoll_wait (and the others that do not restart) would fail
            // with EINTR at once. The call is skipped and the thread put back on its `syscall`
            // instruction, which it runs afresh once untraced.
            undo_syscall_entry(tid);
            return self.resume(tid, 0);
        }
        // Its entry: on to the exit stop.
        let r = ptrace::syscall(Pid::from_raw(tid), None);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.stopped = false;
        }
        self.after_resume(tid, r);
    }

    fn on_stepping_stop(&mut self, tid: i32, sig: i32) {
        if self.threads[&tid].arch.xl.detach_step {
            return self.detach_step_stop(tid, sig);
        }
        if sig == libc::SIGTRAP && self.stale_native_run_hit(tid) {
            // The breakpoint at the end of an rseq section's native run, hit as a stop of ours
            // (a group stop, our interrupt) ended the run: already counted there.
            self.restore_trap_mask(tid);
            return if self.threads[&tid].arch.xl.in_cache { self.run_in_cache(tid) } else { self.resume(tid, 0) };
        }
        if self.threads[&tid].arch.xl.in_cache {
            return self.cache_stop(tid, sig);
        }
        self.restore_trap_mask(tid);
        // (Translate mode: an rseq critical section's native run, `translate/rseq.rs`.)
        if self.opts.step.hw_step || self.threads[&tid].arch.hw_run.is_some() {
            if self.threads[&tid].arch.hw_run.is_some() {
                if self.hw_stopped(tid, sig) {
                    // The breakpoint: the thread is on the stop point. A SIGTRAP sent to it at
                    // that moment is one with the hit (see below): deliver it.
                    let sent = ptrace::getsiginfo(Pid::from_raw(tid)).is_ok_and(|si| si.si_code <= 0);
                    let mut inject = if sent { libc::SIGTRAP } else { 0 };
                    self.keep_or_release_trap(tid, &mut inject);
                    self.resume(tid, inject);
                } else {
                    // Stopped mid-path by a signal (a SIGTRAP away from the breakpoint is not
                    // ours): deliver it with a step, as single-stepping does.
                    self.resume(tid, sig);
                }
                return;
            }
            if sig == libc::SIGTRAP && !self.threads[&tid].arch.hw_stepped {
                // A breakpoint hit queued behind our interrupt, already counted.
                self.resume(tid, 0);
                return;
            }
        }
        if sig != libc::SIGTRAP {
            // The program gets a signal: deliver it on the next step; the stop after shows the handler.
            if self.opts.step.block_step {
                if let Ok(regs) = getregs(tid) {
                    self.fast_forward(tid, regs.rip, false);
                }
            }
            self.resume(tid, sig);
            return;
        }
        let Ok(regs) = getregs(tid) else {
            self.resume(tid, 0);
            return;
        };
        // A SIGTRAP someone sent (kill, tgkill, raise: si_code <= 0) and the step's own trap are
        // one pending SIGTRAP, reported with the sender's siginfo: the program's, to deliver.
        let sent = ptrace::getsiginfo(Pid::from_raw(tid)).is_ok_and(|si| si.si_code <= 0);
        if sent {
            let t = &self.threads[&tid];
            if t.pending.is_some_and(|p| p.pc == regs.rip && p.insn.flow != Flow::RepString) {
                // Sent before the step ran anything: a signal like any other (the next stop shows
                // its handler).
                let mut inject = libc::SIGTRAP;
                self.keep_or_release_trap(tid, &mut inject);
                self.resume(tid, inject);
                return;
            }
        }
        let mut inject = 0;
        if self.opts.step.hw_step && self.hw_rehit(tid, &regs) {
            // The step stopped on the breakpoint again: step once more without it.
            self.resume(tid, 0);
            return;
        }
        if self.opts.step.emulate_block_step && !self.emulated_block_ended(tid, &regs) {
            if sent {
                inject = libc::SIGTRAP;
                self.keep_or_release_trap(tid, &mut inject);
            }
            self.resume(tid, inject);
            return;
        }
        self.on_step(tid, &regs, &mut inject);
        if sent && inject == 0 {
            inject = libc::SIGTRAP;
        }
        // A SIGTRAP for the program that it blocks waits with itrace; one waiting goes in when it may.
        self.keep_or_release_trap(tid, &mut inject);
        if self.opts.step.hw_step && inject == 0 {
            self.hw_emulate(tid, &regs);
        }
        if let Some(t) = self.threads.get_mut(&tid) {
            t.arch.emu_prev = regs.rip;
        }
        if self.opts.triggers.is_some() && inject == 0 {
            // A region trigger where the thread goes next (ITraceOff, --stop, ...)?
            self.before_step(tid);
        }
        self.resume(tid, inject);
    }

    fn at_event(&mut self, tid: i32) {
        let trap_queued = procfs::thread_pending_signals(tid) & (1 << (libc::SIGTRAP - 1)) != 0;
        if !(self.detaching.is_some() && trap_queued) {
            // (Detaching with a trap queued, the thread is let go on to take it as a signal stop,
            // which needs it unblocked: the mask is put back there.)
            self.restore_trap_mask(tid);
        }
        // In the code cache: its records, and out of the cache unless it only stops with its group.
        self.cache_event(tid);
        // Stopped mid-run (our interrupt, another thread's exit): count the path so far.
        self.hw_stopped(tid, 0);
    }

    fn at_interrupt(&mut self, _tid: i32) {}

    fn ready_to_let_go(&mut self, tid: i32, sig: i32) -> Option<i32> {
        self.cache_ready_to_let_go(tid, sig)
    }

    fn at_exec(&mut self, tid: i32) {
        self.forget_trap_mask(tid);
        // The code cache went with the old image.
        self.cache_thread_done(tid, true);
        if let Some(t) = self.threads.get_mut(&tid) {
            // exec flushes ptrace breakpoints.
            (t.arch.hw_run, t.arch.dr0, t.arch.dr1, t.arch.dr7) = (None, 0, 0, 0);
        }
        if self.opts.step.block_step {
            // The old image is gone: account for the block up to execve from the plan made before it ran.
            if let Some(t) = self.threads.get_mut(&tid) {
                if let (Some((pc, insn, before)), Some(p)) = (t.arch.planned_syscall.take(), t.pending) {
                    if p.pc != pc || !t.arch.single_step_now {
                        t.icount += before;
                    }
                    t.pending = Some(Pending { pc, insn, syscall_nr: p.syscall_nr });
                }
                // The next stop is the end of execve: classify it as one step of the system call.
                t.arch.single_step_now = true;
            }
        }
    }

    fn region_isa(&mut self, tid: i32) -> X86 {
        let isa = X86::from_cs(getregs(tid).map(|r| r.cs).unwrap_or(0x33));
        if let Some(t) = self.threads.get_mut(&tid) {
            t.arch.isa = isa;
        }
        isa
    }

    fn region_ended(&mut self, tid: i32) {
        // It runs on untraced: no debug-register breakpoint of block stepping may stop it.
        self.hw_clear(tid);
    }

    fn first_pending(&mut self, tid: i32, pid: i32, at_exec: bool) -> Option<Pending> {
        let regs = getregs(tid).ok()?;
        let isa = X86::from_cs(regs.cs);
        let (pc, syscall_nr) = if at_exec {
            (regs.rip, regs.rax)
        } else {
            // Stopped inside a system call that will be restarted: the kernel moves the pc back
            // onto the system call instruction when it resumes, so that is what runs next.
            let in_syscall = regs.orig_rax as i64 >= 0;
            let mut pc = regs.rip;
            if in_syscall && RESTART_CODES.contains(&(regs.rax as i64)) {
                pc -= 2;
            }
            (pc, regs.orig_rax)
        };
        let insn = self.decode(pid, isa, pc);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.isa = isa;
        t.arch.emu_prev = pc;
        Some(Pending { pc, insn, syscall_nr })
    }

    fn exit_syscall_nr(&mut self, tid: i32, signaled: bool) -> u64 {
        // Inside the exit system call orig_rax holds its number (in block mode nothing else does).
        let nr = getregs(tid).map(|r| r.orig_rax).unwrap_or(u64::MAX);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        if let Some(p) = t.pending {
            if self.opts.step.block_step && !signaled && t.arch.isa.is_exit_syscall(nr) {
                let (pid, isa) = (t.pid, t.arch.isa);
                // The block ran up to the system call instruction, which the walk finds.
                let rip = getregs(tid).map(|r| r.rip).unwrap_or(0);
                let w = block::walk_block(|pc| self.decode(pid, isa, pc), p.pc, rip, true, 1 << 24);
                let t = self.threads.get_mut(&tid).expect("thread exists");
                if let block::WalkEnd::Branch { pc, insn } = w.end {
                    t.icount += w.before;
                    t.pending = Some(Pending { pc, insn, syscall_nr: nr });
                }
            }
        }
        nr
    }

    fn release_unfollowed(&mut self, tid: i32, pid: i32) {
        self.release_child(tid, pid);
    }

    fn take_out_traps(&mut self, tid: i32) {
        // Out of the code cache, the application's pc and gs base back (and checked: the cache
        // is reused by a later session only if every thread left it).
        self.cache_leave_for_detach(tid);
        self.cache_check_let_go(tid);
        // No int3 of ours, nor a debug register.
        self.remove_breakpoints_via(tid);
        self.hw_clear(tid);
    }

    fn periodic(&mut self) {
        self.cache_periodic();
    }

    fn check_settings(&mut self) -> Result<(), String> {
        if self.opts.step.translate {
            translate::CacheLimits::set(translate::CacheLimits::from_env()?);
        }
        Ok(())
    }

    fn undo_stop_eintr(&mut self, tid: i32) {
        const EINTR: i64 = -(libc::EINTR as i64);
        let Ok(mut regs) = getregs(tid) else { return };
        // orig_rax holds the number of the system call the thread entered last; after a
        // signal handler's return it is -1, so an EINTR a handler already saw is left alone.
        if (regs.orig_rax as i64) < 0 || regs.rax as i64 != EINTR {
            return;
        }
        // A signal on its way (to a handler) is why it failed: untraced it would fail too.
        if procfs::unblocked_pending_signals(tid) != 0 {
            return;
        }
        // `syscall` (0f 05) or `int 0x80` (cd 80) just before the pc: it stopped at the
        // system call's return, not after an interrupt or a fault.
        let pid = self.threads.get(&tid).map(|t| t.pid).unwrap_or(tid);
        let mut insn = [0u8; 2];
        if tables::read_mem(pid, regs.rip.wrapping_sub(2), &mut insn) != 2
            || !matches!(insn, [0x0f, 0x05] | [0xcd, 0x80])
        {
            return;
        }
        regs.rip -= 2;
        regs.rax = regs.orig_rax;
        let _ = ptrace::setregs(Pid::from_raw(tid), regs);
    }

    fn at_end(&mut self) {
        self.leave_clean_records();
    }

    fn warn_at_end(&self) {
        self.say_what_the_cache_leaves();
        if self.opts.step.translate && std::env::var_os("ITRACE_STATS").is_some() {
            eprintln!("itrace: translate: {}", self.arch.xl_stats);
        }
        if self.arch.hw_lost > 0 {
            eprintln!(
                "itrace: warning: {} stops off the decoded path in block mode; instruction counts may be off",
                self.arch.hw_lost
            );
        }
    }
}

impl Recorder for PtraceRecorder {
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<Recorded, BackendError> {
        let s = &self.settings;
        let (mut hw_step, mut hw_rf_auto) = (false, false);
        let translate = s.backend == crate::backend::Backend::Translate;
        // Each way is used only where its probe saw it work; the trace is the same either way.
        let block_step = match s.step {
            // The code cache records; what it does not run is single-stepped.
            _ if translate => false,
            // The test hook of the branch-trap decoder keeps its own way.
            StepChoice::Auto if s.emulate_block_step => true,
            // Debug-register breakpoints, else the CPU's branch trap, else single steps.
            StepChoice::Auto => match probe_hw_breakpoints() {
                HwBreak::Works { rf_auto } => {
                    (hw_step, hw_rf_auto) = (true, rf_auto);
                    false
                }
                HwBreak::Unavailable(_) => probe_singleblock() == BlockStep::Works,
            },
            StepChoice::Instruction => s.emulate_block_step,
            StepChoice::Block => {
                match probe_hw_breakpoints() {
                    HwBreak::Works { rf_auto } => (hw_step, hw_rf_auto) = (true, rf_auto),
                    HwBreak::Unavailable(why) => {
                        return Err(BackendError::Settings(format!(
                            "--step block: debug-register breakpoints do not work here ({why}); use --step auto"
                        )))
                    }
                }
                false
            }
        };
        let step = if translate {
            StepMethod::Translated
        } else if hw_step {
            StepMethod::PtraceHwBreak
        } else if block_step && !s.emulate_block_step {
            StepMethod::PtraceSingleBlock
        } else {
            StepMethod::PtraceSingleStep
        };
        let options = StepOptions {
            block_step,
            // (a test hook of the branch-trap mode, which --step block does not use)
            emulate_block_step: s.emulate_block_step && !hw_step,
            hw_step,
            hw_rf_auto,
            hw_emulate_stack: hw_step && !hwstep::cpu_has_user_shadow_stack(),
            translate,
        };
        self.record_with(live, stop, step, options)
    }
}
