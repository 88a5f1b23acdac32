//! `--backend translate`: the x86_64 recorder that runs the program's code from a cache of
//! translated units inside the traced process, so that nothing traps per block.
//!
//! itrace stays the program's tracer, and is its translator: it decodes and encodes units
//! (`unit.rs`), keeps the cache's tables (`cache.rs`), and writes the code into the process
//! (`/proc/PID/mem`). The translated code records every taken branch itself into a ring in
//! the thread's state block (`layout.rs`, reached through the gs base), and stops for itrace
//! (a trap) only to translate a unit it has not got, to have its ring drained, or to leave
//! the cache before an instruction the cache does not run (a system call, an interrupt, code
//! using gs): the shared engine single-steps that one exactly as `--step instruction` does,
//! then the thread goes back into the cache. Signals stop the thread as for any tracee; the
//! thread leaves the cache first, at the application instruction its state is at, so the
//! engine delivers the signal with the application's pc in its frame and records it as the
//! stepping recorder does. The trace is therefore the one `--step instruction` records.
//!
//! A trap is a system call (`unit.rs`): a thread in the cache runs under `PTRACE_SYSEMU`, so
//! each trap is a syscall-entry stop whose call never runs. Should itrace die, by any signal,
//! the kernel lets the thread go from such a stop without a signal, the call runs, and the
//! code after it takes the thread out of the cache to the application's code, where it runs on
//! natively: no thread of the program is ever left stopped at a trap it would die of.
//!
//! Design notes, costs and limits: docs/translate.md.

mod blob;
mod cache;
mod drain;
mod layout;
mod reuse;
mod rseq;
mod unit;

pub(super) use cache::{Cache, CacheLimits};
pub(super) use drain::Buffers;
pub(super) use rseq::NativeRun;

use super::engine::*;
use super::getregs;
use cache::Loc;
use itrace_decoders::Flow;
use itrace_format::now_ns;
use layout::*;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use unit::{TranslateError, Trap};

/// The length of `syscall` (0f 05): a syscall stop's pc is this far past it.
const SYSCALL_LEN: u64 = 2;

/// A thread in the cache keeps its records until its ring fills; older than this, itrace
/// interrupts it to collect them (continuous mode writes them, a kill loses no more).
const DRAIN_EVERY_NS: u64 = 250_000_000;

/// At most this many single steps to bring a thread stopped inside a stub to an application
/// instruction (the longest stub is about thirty instructions).
const MAX_SETTLE_STEPS: u32 = 256;

/// Nice value of the thread that serves the cache (where allowed: root or CAP_SYS_NICE).
const TRACER_NICE: i32 = -10;

/// Give the calling thread, the tracer, and the buffers' `writer` thread a larger share of the
/// CPUs than the program's threads. Every record passes through both; with more busy threads
/// than cores the tracer got its fair share only (8 busy threads on 2 cores: about a quarter of
/// a core), and every thread waited in its full-ring stop for it: 8 threads recorded less than
/// one. The writer at the program's priority kept a detach waiting for what it had queued
/// (every thread let go is busy again): 20 ms of a 60 ms detach. Nothing of the program changes.
pub(super) fn raise_tracer_priority(writer: Option<i32>) {
    // SAFETY: gettid has no arguments.
    let tracer = unsafe { libc::gettid() };
    for tid in std::iter::once(tracer).chain(writer) {
        // SAFETY: setpriority on one of our own thread ids changes only that thread's nice
        // value, and a refusal (EPERM, EACCES) leaves it as it was.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, TRACER_NICE) };
    }
}

/// What threads in the cache stopped for, and what was translated.
#[derive(Debug, Default)]
pub(super) struct Stats {
    units: u64,
    /// Units translated from code that may change unseen: they check their bytes at entry.
    checked: u64,
    /// Units translated ahead (`Session::translate_ahead`), no thread at their address yet.
    ahead: u64,
    /// Return addresses put in a thread's lookup table before its return reached them.
    returns_ahead: u64,
    links: u64,
    indirect_misses: u64,
    ring_full: u64,
    leaves: u64,
    signals: u64,
    drains_by_interrupt: u64,
    native_runs: u64,
    flushes: u64,
    /// Other threads in the cache when a flush was asked for (they had to leave it first).
    flush_evictions: u64,
    /// Units whose check found their code rewritten in place (translated again).
    rewritten: u64,
    /// At the detach: threads that left the cache from a trap, at its way out's address.
    detach_way_outs: u64,
    /// At the detach: threads stopped inside a stub, let run to their unit's next trap.
    detach_runs: u64,
    /// At the detach: single steps of threads out of stubs (interrupted inside one).
    detach_steps: u64,
    /// Rings whose end did not add up with their stubs' count of records of no branch, so read
    /// whole to count their branches (`drain::branches_of`).
    rings_counted_whole: u64,
    /// Rings the threads encoded themselves (`unit::self_encode`).
    rings_encoded_by_threads: u64,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} units translated ({} ahead of their first run, {} return addresses put in a lookup table ahead; {} from writable code, checking their bytes at entry); stops: {} links, {} indirect misses, {} full rings, {} leaves (then stepped, a system call run to its exit stop), {} signals, {} periodic drains; {} rseq critical sections run natively; {} flushes of the full cache ({} other threads brought out of it); {} units found their code rewritten in place; at the detach, {} threads left from a trap, {} runs to one from inside a stub, {} single steps out of stubs; {} rings counted whole; {} rings encoded by their threads",
            self.units,
            self.ahead,
            self.returns_ahead,
            self.checked,
            self.links,
            self.indirect_misses,
            self.ring_full,
            self.leaves,
            self.signals,
            self.drains_by_interrupt,
            self.native_runs,
            self.flushes,
            self.flush_evictions,
            self.rewritten,
            self.detach_way_outs,
            self.detach_runs,
            self.detach_steps,
            self.rings_counted_whole,
            self.rings_encoded_by_threads
        )
    }
}

/// A thread's place in the cache.
#[derive(Clone, Debug, Default)]
pub(super) struct ThreadCache {
    /// Its state block in the process (0: none yet).
    pub(super) state: u64,
    /// It runs from the cache (its gs base is `state`).
    pub(super) in_cache: bool,
    /// Threads encode their own rings (`unit::self_encode`): its count of instructions not yet
    /// in a branch is in its block (`XL_CARRY`), not in the engine's `icount` (which is 0 then).
    pub(super) carry_in_block: bool,
    /// Its block's exit table is set: the thread encodes its full rings itself (else the
    /// blob declines, and the ring's trap has itrace drain it).
    pub(super) encodes_itself: bool,
    /// The application's own gs base, put back whenever it leaves the cache.
    pub(super) app_gs: u64,
    /// When its ring was last drained.
    pub(super) drained_ns: u64,
    /// It is interrupted only to have its ring drained: it stays in the cache.
    pub(super) drain_only: bool,
    /// Tracing ends: it is single-stepped out of a stub, from the main wait loop
    /// (`cache_ready_to_let_go`); its next stop is that step's.
    pub(in super::super) detach_step: bool,
    /// The signal to let it go with, kept while it is stepped out of a stub.
    detach_signal: i32,
    /// Signals of the program's that stopped it while it was stepped out of a stub: the kernel
    /// gets them again when it is out.
    detach_requeue: Vec<i32>,
    /// Its priority was raised and its pin lifted for those steps.
    detach_boosted: bool,
}

/// A unit just translated (`Session::translate_unit`).
struct Translated {
    /// Its entry in the cache.
    entry: u64,
    /// Where its last instruction goes, if it is a direct jump or call (`Unit::goes_on_to`).
    goes_on_to: Option<u64>,
    /// Where a return from the call that ends it goes.
    returns_to: Option<u64>,
}

/// What a cache trap leads to.
enum Next {
    /// Run on in the cache from this address.
    Run(u64),
    /// Leave the cache before application instruction `pc`, with `count` instructions of the
    /// unit done.
    Leave { pc: u64, count: u32 },
}

impl Session<'_> {
    fn cache_of(&mut self, pid: i32) -> Option<&mut Cache> {
        self.procs.get_mut(&pid).map(|p| &mut p.arch.cache)
    }

    /// Resume a stepping thread in the cache instead of stepping it, when its next instruction
    /// can run there. False: step it.
    pub(in super::super) fn enter_cache(&mut self, tid: i32) -> bool {
        let Some(t) = self.threads.get(&tid) else { return false };
        if t.state != ThreadState::Stepping || t.arch.isa().compat || t.skip_report_at.is_some() {
            return false;
        }
        let Some(p) = t.pending else { return false };
        if matches!(p.insn.flow, Flow::Syscall | Flow::Interrupt | Flow::Iret | Flow::Invalid) {
            return false;
        }
        let pid = t.pid;
        // A thread's first entry (at the start, after an attach) may be from inside an rseq
        // critical section not found yet: stepped on there, the kernel aborts it instead.
        if t.arch.xl.state == 0 && rseq::in_critical_section(tid, pid, p.pc) {
            return false;
        }
        if !self.try_flush(pid) {
            // Its cache waits for the threads still in it to leave before it is flushed.
            return false;
        }
        // The unit first: the process's first region brings the cache's own gadget for the
        // system calls itrace makes there (the state block's mmap is one), so that only that
        // first mmap runs at the vDSO's `syscall` (see `remote_syscall`).
        let Some(entry) = self.unit_entry(tid, pid, p.pc) else { return false };
        let Some(state) = self.thread_state(tid, pid) else { return false };
        let Ok(mut regs) = getregs(tid) else { return false };
        // The way out of the cache puts the application's gs base back if itrace is gone.
        if self
            .cache_of(pid)
            .and_then(|c| c.write(pid, state + APP_GS as u64, &regs.gs_base.to_le_bytes()).ok())
            .is_none()
        {
            return false;
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.xl.app_gs = regs.gs_base;
        regs.gs_base = state;
        regs.rip = entry;
        if ptrace::setregs(Pid::from_raw(tid), regs).is_err() {
            return false;
        }
        t.arch.xl.in_cache = true;
        self.run_in_cache(tid);
        true
    }

    pub(in super::super) fn run_in_cache(&mut self, tid: i32) {
        if self.detaching.is_some() {
            // Tracing ends: the engine lets it go, once out of the cache
            // (`cache_ready_to_let_go`).
            self.resume(tid, 0);
            return;
        }
        self.xl_carry_in(tid);
        self.unblock_trap_for_resume(tid, 0);
        self.thread_follows_tracer(tid);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.stopped = false;
        }
        // Each trap is a syscall-entry stop, its call skipped (no exit stop).
        let r = ptrace::sysemu(Pid::from_raw(tid), None);
        self.after_resume(tid, r);
    }

    /// Before a thread goes on in the cache, when threads encode their own rings: its exits in
    /// the process's table, and its count of instructions not yet in a branch moved into its
    /// block, where its next encoded ring starts from it (`xl_carry_out` takes it back).
    fn xl_carry_in(&mut self, tid: i32) {
        if !unit::self_encode() {
            return;
        }
        let Some(t) = self.threads.get(&tid) else { return };
        let (pid, state, carry, moved) = (t.pid, t.arch.xl.state, t.icount, t.arch.xl.carry_in_block);
        if state == 0 {
            return;
        }
        let on = self.sink.takes_chunks()
            && match unit::self_encode_mode() {
                unit::SelfEncode::Always => true,
                _ => self.threads.values().filter(|o| o.pid == pid && o.arch.xl.in_cache).nth(1).is_some(),
            };
        let was = self.threads.get(&tid).is_some_and(|t| t.arch.xl.encodes_itself);
        let Some(c) = self.cache_of(pid) else { return };
        let _ = c.sync_exits(pid);
        if on != was {
            let table = if on { c.xl_blob.map_or(0, |x| x.exits) } else { 0 };
            if c.write(pid, state + XL_EXITS as u64, &table.to_le_bytes()).is_err() {
                return;
            }
            if let Some(t) = self.threads.get_mut(&tid) {
                t.arch.xl.encodes_itself = on;
            }
        }
        let Some(c) = self.cache_of(pid) else { return };
        if moved || c.write(pid, state + XL_CARRY as u64, &(carry as u64).to_le_bytes()).is_err() {
            return;
        }
        if let Some(t) = self.threads.get_mut(&tid) {
            t.icount = 0;
            t.arch.xl.carry_in_block = true;
        }
    }

    /// The count a thread's block holds back in the engine's `icount` (at a stop, before
    /// anything counts on it).
    pub(super) fn xl_carry_out(&mut self, tid: i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        if !t.arch.xl.carry_in_block {
            return;
        }
        let (pid, state) = (t.pid, t.arch.xl.state);
        let Some(carry) = self.cache_of(pid).and_then(|c| c.read_u64(pid, state + XL_CARRY as u64).ok()) else {
            return;
        };
        if let Some(t) = self.threads.get_mut(&tid) {
            t.icount = t.icount.wrapping_add(carry as u32);
            t.arch.xl.carry_in_block = false;
        }
    }

    /// A thread stopped while it encodes its ring (`Loc::Encoding`: thousands of instructions
    /// from their end, too many to step): its routine told to go on to the full ring's trap,
    /// not back to the stub, and the thread run there (its next stop, a trap under
    /// `PTRACE_SYSEMU`). Signals meanwhile are kept for the kernel to send again.
    fn xl_run_to_full_trap(&mut self, tid: i32, pid: i32, requeue: &mut Vec<Signal>) -> bool {
        let Some(state) = self.threads.get(&tid).map(|t| t.arch.xl.state) else { return false };
        let Some(c) = self.cache_of(pid) else { return false };
        let Ok(trap) = c.read_u64(pid, state + XL_TRAP as u64) else { return false };
        if c.write(pid, state + XL_BACK as u64, &trap.to_le_bytes()).is_err() {
            return false;
        }
        self.xl_carry_in(tid);
        self.unblock_trap_for_resume(tid, 0);
        let done = self.run_to_syscall_stop_by(tid, requeue, |p| ptrace::sysemu(p, None));
        if done {
            self.restore_trap_mask(tid);
        }
        done
    }

    /// A syscall stop of a thread in the cache: one of the cache's traps (under
    /// `PTRACE_SYSEMU`, the call is not run).
    pub(in super::super) fn cache_syscall_stop(&mut self, tid: i32) {
        let pid = self.threads[&tid].pid;
        let trap =
            getregs(tid).ok().and_then(|r| self.cache_of(pid).and_then(|c| c.trap_at(r.rip.wrapping_sub(SYSCALL_LEN))));
        let Some(trap) = trap else {
            // Not a trap of the cache (it cannot be): out of the cache where it is.
            eprintln!("itrace: warning: thread {tid} made a system call in the code cache; it leaves the cache");
            self.settle(tid, false, true);
            self.leave_syscall_stop(tid);
            return self.step_on(tid, 0);
        };
        // What the trap spilled; its registers stay as they are until the thread goes on (a
        // released thread then takes the way out after the `syscall`).
        let Some(mut spilled) = self.trap_spills(tid, pid) else {
            return self.resume(tid, 0);
        };
        // At a trap the stub before it is done with the ring.
        self.drain(tid);
        match self.on_trap(tid, pid, trap, &mut spilled) {
            Next::Run(at) => {
                self.out_of_trap(tid, spilled, at);
                self.run_in_cache(tid);
            }
            Next::Leave { pc, count } => {
                self.leave_cache(tid, pc, count, Some(spilled));
                if self.detaching.is_some() {
                    // Let go from this stop: the trap's call is skipped, and nothing is stepped.
                    return self.resume(tid, 0);
                }
                // A native run goes from this stop: PTRACE_CONT from a PTRACE_SYSEMU entry stop
                // skips the call with no exit stop and no step report (that stop is taken first
                // only for a step, below).
                let trigger = self.procs.get(&pid).is_some_and(|p| p.region.bps.kind_at(pc).is_some());
                if !trigger && self.start_native_run(tid) {
                    return;
                }
                if self.leave_syscall_stop(tid) {
                    self.step_on(tid, 0);
                }
            }
        }
    }

    /// What a trap spilled: the application's rax, rcx and r11 before it.
    fn trap_spills(&mut self, tid: i32, pid: i32) -> Option<[u64; 3]> {
        let state = self.threads.get(&tid).map(|t| t.arch.xl.state)?;
        let c = self.cache_of(pid)?;
        let mut raw = [0u8; 24];
        c.read(pid, state + TRAP_RAX as u64, &mut raw).ok()?;
        let word = |n: usize| u64::from_le_bytes(raw[n * 8..n * 8 + 8].try_into().expect("8 bytes"));
        Some([word(0), word(1), word(2)])
    }

    /// The thread goes on at `rip` with what its trap spilled put back, in one write of its
    /// registers: every state it is left in between is one it survives should itrace die (a
    /// trap's `syscall` with the application's rax would make whatever call rax names). No
    /// system call is in progress for the kernel (a stop's `-ENOSYS` and number are not a call
    /// to restart).
    fn out_of_trap(&mut self, tid: i32, spilled: [u64; 3], rip: u64) {
        if let Ok(mut regs) = getregs(tid) {
            (regs.rax, regs.rcx, regs.r11) = (spilled[0], spilled[1], spilled[2]);
            regs.orig_rax = u64::MAX;
            regs.rip = rip;
            let _ = ptrace::setregs(Pid::from_raw(tid), regs);
        }
    }

    /// A thread at a trap's syscall-entry stop is to be stepped (or run to its next system
    /// call) from its pc: the first resume from such a stop ends at the skipped call's exit,
    /// before any instruction (a step is reported there). Take that stop first, as a syscall
    /// stop: a SIGTRAP stop there would kill the program if itrace died in it. False: the
    /// thread is gone.
    fn leave_syscall_stop(&mut self, tid: i32) -> bool {
        let mut requeue = Vec::new();
        let ok = self.run_to_syscall_stop(tid, &mut requeue);
        let pid = self.threads.get(&tid).map(|t| t.pid).unwrap_or(tid);
        for sig in requeue {
            // SAFETY: tgkill with plain integers.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig as i32) };
        }
        ok
    }

    /// Run the thread to its next syscall stop (PTRACE_SYSCALL); signals that arrive meanwhile
    /// are kept in `requeue` for the kernel to send again. False: the thread is gone.
    fn run_to_syscall_stop(&mut self, tid: i32, requeue: &mut Vec<Signal>) -> bool {
        self.run_to_syscall_stop_by(tid, requeue, |p| ptrace::syscall(p, None))
    }

    /// [`Self::run_to_syscall_stop`], resuming the thread with `resume` (`PTRACE_SYSEMU` for a
    /// thread in the cache, whose next syscall stop is a trap).
    fn run_to_syscall_stop_by(
        &mut self,
        tid: i32,
        requeue: &mut Vec<Signal>,
        resume: impl Fn(Pid) -> nix::Result<()>,
    ) -> bool {
        let p = Pid::from_raw(tid);
        if resume(p).is_err() {
            return false;
        }
        let mut unpinned = false;
        loop {
            match waitpid(p, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::PtraceSyscall(_)) => {
                    self.nested_wait_done(tid, unpinned);
                    return true;
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    requeue.push(sig);
                    if resume(p).is_err() {
                        return false;
                    }
                }
                Ok(WaitStatus::Exited(_, code)) => {
                    self.gone(tid, itrace_format::StopReason::Exited, code);
                    return false;
                }
                Ok(WaitStatus::Signaled(_, sig, _)) => {
                    self.gone(tid, itrace_format::StopReason::Signaled, sig as i32);
                    return false;
                }
                Ok(_) => {
                    if resume(p).is_err() {
                        return false;
                    }
                }
                Err(Errno::EINTR) => self.nested_wait_interrupted(tid, &mut unpinned),
                Err(_) => return false,
            }
        }
    }

    /// A nested wait for `tid` (`run_to_syscall_stop`, `step_in_stub`) was interrupted by
    /// itrace's tick (every 500 ms) or a stop signal. The wait goes on: it cannot be given up,
    /// as the thread is either single-stepped inside a stub (let go with the trap flag set, it
    /// would die of the SIGTRAP) or running a system call itrace made with its registers
    /// replaced (the first mmap, at the vDSO's `syscall`, has no way back to them). A stop asked
    /// for is taken by the wait loop once this thread's stop is handled, not here: started from
    /// inside a dispatch, with other threads' stops taken and not yet dispatched, the detach
    /// interrupts threads already stopped (`begin_detach` sees them as running), and once
    /// `attach_stress` found the signals program's threads zombies after such a detach. The
    /// thread, not stopped yet, may run on any CPU it may untraced (`unpin_thread`: pinned, the
    /// scheduler left such a thread runnable and unrun for seconds).
    fn nested_wait_interrupted(&mut self, tid: i32, unpinned: &mut bool) {
        if !*unpinned {
            self.unpin_thread(tid);
            *unpinned = true;
        }
    }

    /// The thread a nested wait unpinned stopped: pinned again, unless it is being let go, to
    /// the CPU it ran on meanwhile. Pinned back to the one it was starved on, each following
    /// nested wait (a remote system call is three) waited again for the tick: runs of 1.6 s
    /// for 0.3 s. Its records from here on are that CPU's (what its ring holds now too).
    fn nested_wait_done(&mut self, tid: i32, unpinned: bool) {
        if !unpinned || self.detaching.is_some() {
            return;
        }
        match crate::procfs::last_cpu(tid).filter(|c| self.cpus.contains(c)) {
            Some(cpu) => self.move_thread(tid, cpu),
            None => self.pin_thread(tid),
        }
    }

    /// A signal-delivery stop of a thread in the cache: a signal for the program.
    pub(in super::super) fn cache_stop(&mut self, tid: i32, sig: i32) {
        self.restore_trap_mask(tid);
        let si = ptrace::getsiginfo(Pid::from_raw(tid)).ok();
        self.arch.xl_stats.signals += 1;
        // A signal for the program: from the application instruction its state is at, the
        // engine delivers it with a step (the stop after shows the handler).
        let fault = si.is_some_and(|si| {
            si.si_code > 0
                && matches!(si.si_signo, libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP)
        });
        if fault || self.detaching.is_none() {
            // (Detaching, a thread inside a stub is stepped out of it before it is let go,
            // with the signal: `cache_ready_to_let_go`.)
            self.settle(tid, fault, true);
        }
        let mut inject = sig;
        if sig == libc::SIGTRAP {
            self.keep_or_release_trap(tid, &mut inject);
        }
        self.step_on(tid, inject);
    }

    /// What the stepping engine does after a step stop: region triggers, then resume.
    fn step_on(&mut self, tid: i32, inject: i32) {
        if self.opts.triggers.is_some() && inject == 0 {
            self.before_step(tid);
        }
        self.resume(tid, inject);
    }

    /// A ptrace event stop (exit, interrupt, group stop) of a thread in the cache: its records
    /// are drained; it leaves the cache unless it only stops with its group.
    pub(in super::super) fn cache_event(&mut self, tid: i32) {
        if !self.opts.step.translate {
            return;
        }
        let si = ptrace::getsiginfo(Pid::from_raw(tid)).ok();
        let event = si.map(|si| si.si_code >> 8).unwrap_or(0);
        let signo = si.map(|si| si.si_signo).unwrap_or(0);
        let drain_only = self.threads.get_mut(&tid).map(|t| std::mem::take(&mut t.arch.xl.drain_only)).unwrap_or(false);
        if self.threads.get(&tid).is_some_and(|t| t.arch.xl.in_cache) {
            let group_stop = event == libc::PTRACE_EVENT_STOP
                && matches!(signo, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU);
            if group_stop && self.detaching.is_none() {
                // It may be inside a stub: its ring waits for a safe point.
                return;
            }
            if event == libc::PTRACE_EVENT_EXIT {
                // Dying: what the ring holds is all there is.
                self.drain(tid);
                self.settle(tid, false, false);
            } else if drain_only
                && event == libc::PTRACE_EVENT_STOP
                && self.detaching.is_none()
                && !self.flush_waits(self.threads[&tid].pid)
            {
                // Only for its records: drained where the ring is not being written, it goes on
                // in the cache. Not stepped out of a stub to get there: a thread stepped is
                // stopped with a SIGTRAP it dies of if itrace is killed meanwhile. One
                // interrupted inside a stub is drained at its next trap or interrupt.
                let rip = getregs(tid).map(|r| r.rip).unwrap_or(0);
                let pid = self.threads[&tid].pid;
                let loc = self.cache_of(pid).map(|c| c.locate(rip)).unwrap_or(Loc::Outside);
                if matches!(loc, Loc::Boundary { .. } | Loc::Trap(_)) {
                    self.arch.xl_stats.drains_by_interrupt += 1;
                    self.drain(tid);
                }
                return;
            } else if self.detaching.is_none() {
                // (Detaching: out of the cache before it is let go, `cache_ready_to_let_go`.)
                self.settle(tid, false, true);
            }
        }
        if event == libc::PTRACE_EVENT_EXIT {
            self.cache_thread_done(tid, false);
        }
    }

    /// Interrupt the threads in the cache whose records have waited too long (their stop
    /// drains them; they go on in the cache, or leave it when their cache waits to be flushed).
    /// A flush that waited for threads that have all left is done.
    pub(in super::super) fn cache_periodic(&mut self) {
        if !self.opts.step.translate || self.detaching.is_some() {
            return;
        }
        let waiting: Vec<i32> =
            self.procs.iter().filter(|(_, p)| p.arch.cache.flush_pending).map(|(&pid, _)| pid).collect();
        for pid in waiting {
            self.try_flush(pid);
        }
        let now = now_ns();
        for t in self.threads.values_mut() {
            let xl = &mut t.arch.xl;
            if xl.in_cache && !t.stopped && !xl.drain_only && now.saturating_sub(xl.drained_ns) > DRAIN_EVERY_NS {
                xl.drain_only = true;
                let _ = ptrace::interrupt(Pid::from_raw(t.tid));
            }
        }
    }

    /// Whether process `pid`'s cache is full and waits for its threads to leave it.
    fn flush_waits(&self, pid: i32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.arch.cache.flush_pending)
    }

    /// The cache of process `pid` is full: nothing more is translated, and every thread in it is
    /// interrupted to leave it (at its interrupt stop, `cache_event`; a thread at a trap that
    /// needs a unit leaves there). The last one out lets the flush happen (`try_flush`).
    fn begin_flush(&mut self, tid: i32, pid: i32) {
        let Some(c) = self.cache_of(pid) else { return };
        if c.flush_pending {
            return;
        }
        c.flush_pending = true;
        for t in self.threads.values_mut() {
            let xl = &mut t.arch.xl;
            if t.pid == pid && xl.in_cache && t.tid != tid {
                self.arch.xl_stats.flush_evictions += 1;
            }
            // `drain_only` says the interrupt is ours (for an EINTR it causes); at the stop, the
            // pending flush makes the thread leave instead of going on in the cache. Set: one
            // is on its way already.
            if t.pid == pid && xl.in_cache && !t.stopped && !xl.drain_only {
                xl.drain_only = true;
                let _ = ptrace::interrupt(Pid::from_raw(t.tid));
            }
        }
    }

    /// Flush process `pid`'s cache if it waits for that and no thread of it is in the cache any
    /// more: every thread's ring is drained first (the exits its records name go with the
    /// flush). True: the cache may be entered (flushed, or no flush waited).
    fn try_flush(&mut self, pid: i32) -> bool {
        if !self.flush_waits(pid) {
            return true;
        }
        let threads: Vec<i32> = self.threads.values().filter(|t| t.pid == pid).map(|t| t.tid).collect();
        if threads.iter().any(|tid| self.threads[tid].arch.xl.in_cache) {
            return false;
        }
        for tid in threads {
            self.drain(tid);
        }
        let Some(c) = self.cache_of(pid) else { return false };
        if let Err(e) = c.flush(pid) {
            let why = format!("cannot write the code cache of process {pid}: {e}");
            eprintln!("itrace: warning: {why}; its code is stepped from here on");
            c.disabled = Some(why);
            return false;
        }
        self.arch.xl_stats.flushes += 1;
        true
    }

    /// Tracing ends and the stopped thread is about to be let go with `sig`: out of the cache
    /// first, at an application instruction boundary. One stopped inside a stub (our interrupt
    /// catches busy threads mostly there) is set going towards one from the main wait loop, not
    /// in a nested wait, so that every such thread is under way at once and their waits for a
    /// CPU overlap instead of adding up, thread after thread:
    /// - with no signal to deliver, it runs on in the cache to the next trap of its unit
    ///   (`run_to_a_trap`), where it leaves at the trap's way out: one round trip through the
    ///   scheduler instead of up to 30 single steps (milliseconds each on a loaded machine);
    /// - holding a signal to deliver at the detach, it is single-stepped through the stub
    ///   (`start_detach_step`): run on, an application instruction could fault before the
    ///   signal is delivered.
    ///
    /// `None`: it is under way (its next stop calls the detach again), `sig` kept.
    pub(in super::super) fn cache_ready_to_let_go(&mut self, tid: i32, sig: i32) -> Option<i32> {
        let t = self.threads.get_mut(&tid)?;
        t.arch.xl.detach_step = false;
        if sig != 0 {
            if t.arch.xl.detach_signal == 0 {
                t.arch.xl.detach_signal = sig;
            } else {
                t.arch.xl.detach_requeue.push(sig);
            }
        }
        let (pid, in_cache, holding) = (t.pid, t.arch.xl.in_cache, t.arch.xl.detach_signal != 0);
        if in_cache {
            let rip = getregs(tid).map(|r| r.rip).unwrap_or(0);
            let loc = self.cache_of(pid).map(|c| c.locate(rip));
            if matches!(loc, Some(Loc::Inside { .. } | Loc::Check { .. }))
                && ((!holding && self.run_to_a_trap(tid, pid, rip)) || self.start_detach_step(tid))
            {
                return None;
            }
            // At a boundary or a trap (or the step could not start: stepped here, nested).
            self.settle(tid, false, true);
        }
        let t = self.threads.get_mut(&tid)?;
        let sig = std::mem::take(&mut t.arch.xl.detach_signal);
        for requeued in std::mem::take(&mut t.arch.xl.detach_requeue) {
            // SAFETY: tgkill with plain integers.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, requeued) };
        }
        Some(sig)
    }

    /// A thread stopped inside a stub (or an expansion, or a unit's check) at a detach runs on in
    /// the cache until the next trap of its unit, answered in the main wait loop. Every way out
    /// of a unit is a trap or an exit through a link slot or the thread's lookup table; the
    /// unit's slots go back to their miss traps and the entries of the thread's table are
    /// emptied, so that it stops at whichever exit it takes (at most a unit's instructions, 256,
    /// and its stubs), or earlier at a full ring or a `Leave`. Other threads that take those
    /// exits meanwhile stop there too (and leave as well): the tracing ends. False: nothing was
    /// changed, or the thread could not be resumed.
    fn run_to_a_trap(&mut self, tid: i32, pid: i32, rip: u64) -> bool {
        let Some(state) = self.threads.get(&tid).map(|t| t.arch.xl.state) else { return false };
        let Some(c) = self.cache_of(pid) else { return false };
        if !matches!(c.unlink_unit_at(pid, rip), Ok(true)) || c.forget_table(pid, state).is_err() {
            return false;
        }
        self.boost_for_detach(tid);
        self.xl_carry_in(tid);
        self.unblock_trap_for_resume(tid, 0);
        if ptrace::sysemu(Pid::from_raw(tid), None).is_err() {
            return false;
        }
        self.arch.xl_stats.detach_runs += 1;
        if let Some(t) = self.threads.get_mut(&tid) {
            t.stopped = false;
        }
        true
    }

    /// A thread set going at a detach (`run_to_a_trap`, `start_detach_step`) runs on any CPU
    /// it may untraced, at the raised priority of the detach's interrupt (`begin_detach`: a
    /// thread stopped then had neither).
    fn boost_for_detach(&mut self, tid: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if !std::mem::replace(&mut t.arch.xl.detach_boosted, true) {
            if t.nice_before_detach.is_none() {
                t.nice_before_detach = super::super::cpus::boost_to_stop(tid);
            }
            self.unpin_thread(tid);
        }
    }

    /// One single step of a thread inside a stub, at a detach, answered in the main wait loop.
    /// False: it could not be stepped (it is gone).
    fn start_detach_step(&mut self, tid: i32) -> bool {
        self.boost_for_detach(tid);
        self.unblock_trap_for_resume(tid, 0);
        if ptrace::step(Pid::from_raw(tid), None).is_err() {
            return false;
        }
        self.arch.xl_stats.detach_steps += 1;
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.stopped = false;
        t.arch.xl.detach_step = true;
        true
    }

    /// The stop after a detach's step out of a stub (`start_detach_step`): its SIGTRAP, or a
    /// signal of the program's that came first (sent again once the thread is out). The
    /// detach goes on from where the thread is now.
    pub(in super::super) fn detach_step_stop(&mut self, tid: i32, sig: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.arch.xl.detach_step = false;
        if sig != libc::SIGTRAP {
            t.arch.xl.detach_requeue.push(sig);
        }
        self.restore_trap_mask(tid);
        self.resume(tid, 0);
    }

    /// Before a thread is let go: out of the cache.
    pub(in super::super) fn cache_leave_for_detach(&mut self, tid: i32) {
        if self.threads.get(&tid).is_some_and(|t| t.arch.xl.in_cache) {
            self.settle(tid, false, true);
        }
    }

    /// The thread exits or its program is replaced: its state block is free.
    pub(in super::super) fn cache_thread_done(&mut self, tid: i32, exec: bool) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        let (pid, state) = (t.pid, t.arch.xl.state);
        t.arch.xl = ThreadCache::default();
        if state != 0 && !exec {
            if let Some(c) = self.cache_of(pid) {
                c.free_states.push(state);
            }
        }
    }

    /// What a trap of the cache asks for (the ring was drained). `spilled` is what the trap
    /// spilled (rax, rcx, r11), to be put back when the thread goes on or leaves.
    fn on_trap(&mut self, tid: i32, pid: i32, trap: Trap, spilled: &mut [u64; 3]) -> Next {
        let st = &mut self.arch.xl_stats;
        match trap {
            Trap::Leave { .. } => st.leaves += 1,
            Trap::RingFull { .. } => st.ring_full += 1,
            Trap::Link { .. } => st.links += 1,
            Trap::IndirectMiss => st.indirect_misses += 1,
            Trap::Rewritten { .. } => st.rewritten += 1,
        }
        if self.detaching.is_some() {
            if let Some(pc) = self.way_out_at_detach(tid, pid, trap, spilled) {
                self.arch.xl_stats.detach_way_outs += 1;
                return Next::Leave { pc, count: 0 };
            }
        }
        match trap {
            Trap::Leave { pc, count } => Next::Leave { pc, count },
            Trap::RingFull { resume, .. } => Next::Run(resume),
            Trap::Link { exit, slot } => {
                let Some(target) = self.cache_of(pid).and_then(|c| c.exits.target(exit as usize)) else {
                    return Next::Leave { pc: 0, count: 0 };
                };
                match self.unit_entry(tid, pid, target) {
                    Some(entry) => {
                        if let Some(c) = self.cache_of(pid) {
                            let _ = c.link(pid, slot, entry);
                        }
                        Next::Run(entry)
                    }
                    None => Next::Leave { pc: target, count: 0 },
                }
            }
            Trap::IndirectMiss => {
                let state = self.threads[&tid].arch.xl.state;
                let Some(target) = self.cache_of(pid).and_then(|c| c.read_u64(pid, state + TARGET as u64).ok()) else {
                    return Next::Leave { pc: 0, count: 0 };
                };
                match self.unit_entry(tid, pid, target) {
                    Some(entry) => {
                        if let Some(c) = self.cache_of(pid) {
                            let _ = c.fill_table(pid, state, target, entry);
                        }
                        Next::Run(entry)
                    }
                    None => Next::Leave { pc: target, count: 0 },
                }
            }
            Trap::Rewritten { unit } => {
                let Some((pc, changed_end)) = self.cache_of(pid).and_then(|c| c.rewritten(pid, unit)) else {
                    return Next::Leave { pc: 0, count: 0 };
                };
                let Some(c) = self.cache_of(pid) else { return Next::Leave { pc, count: 0 } };
                // The units of the bytes up to the last one changed go (this one and any other
                // that holds them), and the code at `pc` is translated again, from its bytes as
                // they are now, with the thread stopped.
                c.invalidate(pc, changed_end);
                match self.unit_entry(tid, pid, pc) {
                    // Past the new unit's check: it was translated from the code as it is, so
                    // the thread goes on even if another thread keeps rewriting it.
                    Some(entry) => Next::Run(self.cache_of(pid).and_then(|c| c.first_instruction(pc)).unwrap_or(entry)),
                    None => Next::Leave { pc, count: 0 },
                }
            }
        }
    }

    /// Tracing ends and the thread is at a trap: it leaves the cache where the trap's way out
    /// would take it if itrace were gone (the trap stands for an application address with
    /// nothing of it run), instead of translating, linking, or being single-stepped out of a
    /// record stub from a full ring's resume point (three round trips through the scheduler
    /// each, with 8 busy threads on 2 CPUs most of a detach's time: they wait at full rings).
    /// Returns that address; the application's registers the stub spilled are put back in
    /// `spilled` (rcx) and in the thread (an indirect exit's rdx). `None` for a trap that
    /// leaves with a count of its own (`Trap::Leave`) or a state that cannot be read.
    fn way_out_at_detach(&mut self, tid: i32, pid: i32, trap: Trap, spilled: &mut [u64; 3]) -> Option<u64> {
        let state = self.threads.get(&tid)?.arch.xl.state;
        let c = self.cache_of(pid)?;
        match trap {
            Trap::Leave { .. } => None,
            // The record stub recorded the exit: the thread is at its target, with nothing of
            // the next unit run.
            Trap::Link { exit, .. } => c.exits.target(exit as usize),
            Trap::IndirectMiss => c.read_u64(pid, state + TARGET as u64).ok(),
            // Nothing of the unit ran: the mismatch put rcx and rdx back before its trap.
            Trap::Rewritten { unit } => c.rewritten(pid, unit).map(|(pc, _)| pc),
            Trap::RingFull { to, .. } => {
                // At a full ring's trap the record is written, and the stub holds the
                // application's rcx (and an indirect exit's rdx) in its spill slots.
                let mut raw = [0u8; 16];
                c.read(pid, state + SPILL_RCX as u64, &mut raw).ok()?;
                let word = |n: usize| u64::from_le_bytes(raw[n * 8..n * 8 + 8].try_into().expect("8 bytes"));
                let pc = match to {
                    Some(pc) => pc,
                    None => {
                        let target = c.read_u64(pid, state + TARGET as u64).ok()?;
                        let mut regs = getregs(tid).ok()?;
                        regs.rdx = word(1);
                        ptrace::setregs(Pid::from_raw(tid), regs).ok()?;
                        target
                    }
                };
                spilled[1] = word(0);
                Some(pc)
            }
        }
    }

    /// Bring a thread stopped in the cache out of it, at the application instruction its state
    /// is at, its records drained there first.
    fn settle(&mut self, tid: i32, fault: bool, can_step: bool) {
        if let Some((pc, count)) = self.safe_point(tid, fault, can_step) {
            self.drain(tid);
            self.leave_cache(tid, pc, count, None);
        }
    }

    /// Bring a thread stopped in the cache to a point where its ring may be drained and it may
    /// leave: a unit's instruction boundary, or for a fault (`fault`) the instruction whose copy
    /// or expansion raised it; returns that application instruction and the unit's count
    /// before it. A stub keeps the ring's fill in rcx between reading and writing it, so the
    /// ring is drained only at such a point (or at a trap). Inside a stub the thread is
    /// single-stepped (`can_step`; an exiting thread cannot be). `None`: it left the cache
    /// meanwhile (a trap said so) or is gone.
    fn safe_point(&mut self, tid: i32, fault: bool, can_step: bool) -> Option<(u64, u32)> {
        let pid = self.threads.get(&tid).filter(|t| t.arch.xl.in_cache).map(|t| t.pid)?;
        let mut requeue: Vec<Signal> = Vec::new();
        let mut found = None;
        for _ in 0..MAX_SETTLE_STEPS {
            let Ok(regs) = getregs(tid) else { break };
            let loc = self.cache_of(pid).map(|c| c.locate(regs.rip)).unwrap_or(Loc::Outside);
            match loc {
                Loc::Boundary { app_pc, count } => {
                    found = Some((app_pc, count));
                    break;
                }
                Loc::Inside { fault: Some((app_pc, count)) } if fault || !can_step => {
                    found = Some((app_pc, count));
                    break;
                }
                Loc::Check { app_pc } if fault || !can_step => {
                    // A load of the check faulted (the code is gone): the fault of the unit's
                    // first instruction, with the application's rcx and rdx back.
                    self.restore_check_spills(tid, pid);
                    found = Some((app_pc, 0));
                    break;
                }
                Loc::Trap(trap) => {
                    // On a trap's `syscall` the stub before it is done with the ring.
                    let Some(mut spilled) = self.trap_spills(tid, pid) else { break };
                    self.drain(tid);
                    match self.on_trap(tid, pid, trap, &mut spilled) {
                        Next::Run(at) => self.out_of_trap(tid, spilled, at),
                        Next::Leave { pc, count } => {
                            self.leave_cache(tid, pc, count, Some(spilled));
                            break;
                        }
                    }
                }
                // Not in the cache (it should not be possible): the pc is the application's.
                Loc::Outside => {
                    found = Some((regs.rip, 0));
                    break;
                }
                Loc::Inside { .. } if !can_step => {
                    found = Some((regs.rip, 0));
                    break;
                }
                Loc::Inside { .. } | Loc::Check { .. } => {
                    if !self.step_in_stub(tid, &mut requeue) {
                        return None;
                    }
                }
                Loc::Encoding => {
                    if !self.xl_run_to_full_trap(tid, pid, &mut requeue) {
                        return None;
                    }
                }
            }
        }
        let still_in = self.threads.get(&tid).is_some_and(|t| t.arch.xl.in_cache);
        if found.is_none() && still_in {
            eprintln!("itrace: warning: thread {tid} could not be brought out of the code cache; its count may be off");
            found = Some((getregs(tid).map(|r| r.rip).unwrap_or(0), 0));
        }
        for sig in requeue {
            // A signal that came while stepping the stub: the kernel gets it again.
            // SAFETY: tgkill with plain integers.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig as i32) };
        }
        found
    }

    /// The application's rcx and rdx back from the spill slots, for a thread stopped inside
    /// the check of a unit's source bytes.
    fn restore_check_spills(&mut self, tid: i32, pid: i32) {
        let Some(state) = self.threads.get(&tid).map(|t| t.arch.xl.state) else { return };
        let Some(c) = self.cache_of(pid) else { return };
        let mut raw = [0u8; 16];
        if c.read(pid, state + SPILL_RCX as u64, &mut raw).is_err() {
            return;
        }
        debug_assert_eq!(SPILL_RDX, SPILL_RCX + 8);
        if let Ok(mut regs) = getregs(tid) {
            regs.rcx = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
            regs.rdx = u64::from_le_bytes(raw[8..].try_into().expect("8 bytes"));
            let _ = ptrace::setregs(Pid::from_raw(tid), regs);
        }
    }

    /// One single step inside a stub; false if the thread is gone.
    fn step_in_stub(&mut self, tid: i32, requeue: &mut Vec<Signal>) -> bool {
        if self.detaching.is_some() {
            self.arch.xl_stats.detach_steps += 1;
        }
        let p = Pid::from_raw(tid);
        self.xl_carry_in(tid);
        self.unblock_trap_for_resume(tid, 0);
        if ptrace::step(p, None).is_err() {
            return false;
        }
        let mut unpinned = false;
        loop {
            match waitpid(p, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => {
                    self.nested_wait_done(tid, unpinned);
                    break;
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    requeue.push(sig);
                    if ptrace::step(p, None).is_err() {
                        return false;
                    }
                }
                Ok(WaitStatus::Exited(_, code)) => {
                    self.gone(tid, itrace_format::StopReason::Exited, code);
                    return false;
                }
                Ok(WaitStatus::Signaled(_, sig, _)) => {
                    self.gone(tid, itrace_format::StopReason::Signaled, sig as i32);
                    return false;
                }
                Ok(_) => {
                    if ptrace::step(p, None).is_err() {
                        return false;
                    }
                }
                Err(Errno::EINTR) => self.nested_wait_interrupted(tid, &mut unpinned),
                Err(_) => return false,
            }
        }
        self.restore_trap_mask(tid);
        true
    }

    /// The thread leaves the cache before application instruction `pc`, `count` instructions
    /// into its unit: its pc and gs base are the application's again, and the engine's pending
    /// instruction is `pc`. At a trap, what it spilled goes back in the same write of the
    /// registers (`out_of_trap`).
    fn leave_cache(&mut self, tid: i32, pc: u64, count: u32, spilled: Option<[u64; 3]>) {
        self.xl_carry_out(tid);
        let Ok(mut regs) = getregs(tid) else { return };
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.icount += count;
        t.arch.xl.in_cache = false;
        if let Some([rax, rcx, r11]) = spilled {
            (regs.rax, regs.rcx, regs.r11) = (rax, rcx, r11);
            regs.orig_rax = u64::MAX;
        }
        regs.rip = pc;
        regs.gs_base = t.arch.xl.app_gs;
        let _ = ptrace::setregs(Pid::from_raw(tid), regs);
        self.update_pending_after(tid, pc, &regs, false);
    }

    /// The cache entry of application address `pc`, translating it if needed (and the code it
    /// goes to directly, ahead: `translate_ahead`). `None`: the thread steps there.
    fn unit_entry(&mut self, tid: i32, pid: i32, pc: u64) -> Option<u64> {
        let p = self.procs.get_mut(&pid)?;
        if p.region.bps.kind_at(pc).is_some() {
            // A region trigger: the engine handles it where the thread steps.
            return None;
        }
        if let Some(e) = p.arch.cache.entry(pc) {
            return Some(e);
        }
        let translated = self.translate_unit(tid, pid, pc, false)?;
        self.translate_ahead(tid, pid, pc, &translated);
        Some(translated.entry)
    }

    /// Translate the unit at application address `pc` (it has none) and put it in the cache.
    /// `ahead`: no thread waits for it (`translate_ahead`), so it is made only where that costs
    /// no system call in the process (a region near it has room) and needs no check of its
    /// bytes at entry; `None` otherwise, as for code not translatable.
    fn translate_unit(&mut self, tid: i32, pid: i32, pc: u64, ahead: bool) -> Option<Translated> {
        let p = self.procs.get_mut(&pid)?;
        if p.region.bps.kind_at(pc).is_some() {
            return None;
        }
        let c = &mut p.arch.cache;
        if c.disabled.is_some() || c.flush_pending {
            return None;
        }
        // An rseq critical section runs at its own address (`rseq.rs`): never a unit there.
        if c.native_run_covering(pc).is_some() || self.find_native_run(pid, pc) {
            return None;
        }
        let region = match self.cache_of(pid)?.region_for(pc) {
            Some(r) => r,
            None if ahead => return None,
            None => self.new_region(tid, pid, pc)?,
        };
        let p = self.procs.get_mut(&pid)?;
        let at = p.arch.cache.next_at(region);
        let first_exit = p.arch.cache.exits.len() as u32;
        let bps = &p.region.bps;
        // The program's code, read-only pages once (`CodePages`); out of the cache's tables for
        // the translation (the closures below borrow the rest of them).
        let pages = std::cell::RefCell::new(std::mem::take(&mut p.arch.cache.code_pages));
        let maps = &p.maps;
        let unpatch = |a: u64, buf: &mut [u8]| bps.unpatch(a, buf);
        let fetch_code = |a: u64, buf: &mut [u8]| {
            let mut read = |a: u64, buf: &mut [u8]| super::super::tables::read_mem(pid, a, buf);
            pages.borrow_mut().fetch(maps, &mut read, &unpatch, a, buf)
        };
        let mut fetch = fetch_code;
        let runs = &p.arch.cache.native_runs;
        let branchy = &p.arch.cache.branchy_sections;
        // Sections found on the way (a unit ends before their `lea`).
        let found = std::cell::RefCell::new(Vec::new());
        let stop_before = |addr: u64, bytes: &[u8]| {
            if bps.kind_at(addr).is_some() || runs.range(..=addr).next_back().is_some_and(|(_, r)| r.covers(addr)) {
                return true;
            }
            if !rseq::may_be_lea_rip(bytes) {
                return false;
            }
            let mut fetch = fetch_code;
            match rseq::find_at(addr, &mut fetch) {
                rseq::Found::Nothing => false,
                rseq::Found::Branchy(start) => {
                    if !branchy.contains(&start) {
                        found.borrow_mut().push(Err(start));
                    }
                    false
                }
                rseq::Found::Run(r) => {
                    found.borrow_mut().push(Ok(r));
                    true
                }
            }
        };
        // Code in a writable mapping may be rewritten with no system call between the write and
        // its run: its units check their bytes at entry (`unit::Check`). The mappings are the
        // ones read at the last system call that may change them, where the units of a range
        // that changed were dropped.
        let may_change = |start: u64, end: u64| may_change_unseen(maps, start, end);
        let translated = unit::translate(pc, at, first_exit, &mut fetch, &stop_before, &may_change);
        let pages = pages.into_inner();
        if let Some(p) = self.procs.get_mut(&pid) {
            p.arch.cache.code_pages = pages;
        }
        for f in found.into_inner() {
            self.add_native_run(pid, f);
        }
        let p = self.procs.get_mut(&pid)?;
        let unit = match translated {
            Ok(u) => u,
            Err(TranslateError::NotTranslatable) => return None,
            Err(e) => {
                eprintln!("itrace: warning: cannot translate the code at {pc:#x} ({e}); it is stepped");
                return None;
            }
        };
        let checked = unit.check.is_some();
        if ahead && checked {
            // Code that may change unseen is translated when it runs, from its bytes then.
            return None;
        }
        let goes_on_to = unit.goes_on_to();
        let returns_to = unit.returns_to();
        match p.arch.cache.insert(pid, region, unit) {
            Ok(entry) => {
                self.arch.xl_stats.units += 1;
                self.arch.xl_stats.checked += checked as u64;
                self.arch.xl_stats.ahead += ahead as u64;
                Some(Translated { entry, goes_on_to, returns_to })
            }
            Err(e) => {
                let why = format!("cannot write the code cache of process {pid}: {e}");
                eprintln!("itrace: warning: {why}; its code is stepped from here on");
                p.arch.cache.disabled = Some(why);
                None
            }
        }
    }

    /// A unit was translated for a stop at `root`: translate ahead where a thread that runs it
    /// through goes next (the target of the direct jump or call that ends it, then that unit's,
    /// breadth first, at most `ahead_units` units), linked at once, so that the thread runs on
    /// without a link stop at each. The instruction after a call that ends a unit is translated
    /// too and put in the thread's lookup table (where no entry itrace filled is), so that the
    /// return finds it without a stop. The taken sides of conditional branches are left to
    /// their link stops: translated ahead too, they doubled the units made (the extra half
    /// never ran), and the time was more than with the last exits only (docs/translate.md,
    /// "Where the time goes").
    /// Only code of the read-only executable mapping that holds `root` (a program's or a
    /// library's code: nothing there changes without a system call that drops its units), only
    /// into regions with room (no region is mapped, nothing flushed for it), and only while the
    /// cache may still map another region: from there on only code that runs takes room.
    /// Whatever would not be translated for a stop there (a region trigger, an rseq section,
    /// code that does not decode) is not, and traps when reached as before. No record changes:
    /// the units are the ones the stops would have made.
    fn translate_ahead(&mut self, tid: i32, pid: i32, root: u64, first: &Translated) {
        let limits = cache::limits();
        if limits.ahead_units == 0 || self.detaching.is_some() {
            return;
        }
        let Some(p) = self.procs.get(&pid) else { return };
        if p.arch.cache.regions.len() >= limits.regions {
            return;
        }
        let maps = &p.maps;
        let Some(m) = maps.get(maps.partition_point(|m| m.end <= root)).filter(|m| m.start <= root && !m.writable())
        else {
            return;
        };
        let mapping = m.start..m.end;
        let state = self.threads.get(&tid).map_or(0, |t| t.arch.xl.state);
        // (address, a return goes there: fill the thread's table).
        let mut queue = std::collections::VecDeque::new();
        let next = |queue: &mut std::collections::VecDeque<(u64, bool)>, t: &Translated| {
            queue.extend(t.goes_on_to.map(|to| (to, false)));
            queue.extend(t.returns_to.map(|to| (to, true)));
        };
        next(&mut queue, first);
        let mut tried = rustc_hash::FxHashSet::default();
        let mut made = 0;
        while let Some((at, returned_to)) = queue.pop_front() {
            if !mapping.contains(&at) || !tried.insert((at, returned_to)) {
                continue;
            }
            let entry = match self.cache_of(pid).and_then(|c| c.entry(at)) {
                Some(entry) => entry,
                None if made >= limits.ahead_units => break,
                None => {
                    let Some(t) = self.translate_unit(tid, pid, at, true) else { continue };
                    made += 1;
                    next(&mut queue, &t);
                    t.entry
                }
            };
            if returned_to && state != 0 {
                let Some(c) = self.cache_of(pid) else { return };
                if c.table_free(state, at) && c.fill_table(pid, state, at, entry).is_ok() {
                    self.arch.xl_stats.returns_ahead += 1;
                }
            }
        }
    }

    /// Whether `pc` is the `lea` of an rseq critical section that runs natively (then it is
    /// known from here on).
    fn find_native_run(&mut self, pid: i32, pc: u64) -> bool {
        let Some(p) = self.procs.get_mut(&pid) else { return false };
        let (bps, maps, pages) = (&p.region.bps, &p.maps, &mut p.arch.cache.code_pages);
        let unpatch = |a: u64, buf: &mut [u8]| bps.unpatch(a, buf);
        let mut fetch = |a: u64, buf: &mut [u8]| {
            let mut read = |a: u64, buf: &mut [u8]| super::super::tables::read_mem(pid, a, buf);
            pages.fetch(maps, &mut read, &unpatch, a, buf)
        };
        let found = match rseq::find_at(pc, &mut fetch) {
            rseq::Found::Nothing => return false,
            rseq::Found::Branchy(start) => Err(start),
            rseq::Found::Run(r) => Ok(r),
        };
        let run = found.is_ok();
        self.add_native_run(pid, found);
        run
    }

    /// Keep a section found by the translator: one that runs natively (its code already
    /// translated, if any, is dropped), or one that cannot (said once).
    fn add_native_run(&mut self, pid: i32, found: Result<NativeRun, u64>) {
        let Some(c) = self.cache_of(pid) else { return };
        match found {
            Ok(r) => {
                if c.native_runs.insert(r.lea, r).is_none() {
                    c.invalidate(r.lea, r.end);
                    c.native_runs.insert(r.lea, r);
                }
            }
            Err(start) => {
                if c.branchy_sections.insert(start) {
                    eprintln!(
                        "itrace: warning: the rseq critical section at {start:#x} does not run straight through; it runs from the code cache, where the kernel cannot abort it"
                    );
                }
            }
        }
    }

    /// Map a new region of cache near `pc` (RIP-relative data must be in reach).
    fn new_region(&mut self, tid: i32, pid: i32, pc: u64) -> Option<usize> {
        let limits = cache::limits();
        if !self.cache_of(pid)?.looked_for_leftovers {
            // What a clean detach of an earlier session left is taken first.
            self.reuse_leftovers(pid);
            if let Some(r) = self.cache_of(pid)?.region_for(pc) {
                return Some(r);
            }
        }
        let c = self.cache_of(pid)?;
        if c.regions.len() >= limits.regions {
            // An empty region (after a flush) moves near the code; the first keeps the cache's
            // own `syscall` gadget, which the calls below run at.
            let first = c.first_region();
            let empty = c.regions.iter().position(|r| r.used == r.floor && Some(r.base) != first);
            match empty {
                Some(r) => {
                    let base = c.regions[r].base;
                    self.remote_syscall(tid, pid, libc::SYS_munmap as u64, [base, limits.region_bytes, 0, 0, 0, 0])
                        .ok()?;
                    self.cache_of(pid)?.regions.remove(r);
                }
                None if c.has_units() => {
                    self.begin_flush(tid, pid);
                    return None;
                }
                None => {
                    // Nothing to flush: the regions cannot move (a single one, with the gadget).
                    if !c.said_out_of_reach {
                        c.said_out_of_reach = true;
                        eprintln!(
                            "itrace: warning: the code cache of process {pid} has no region within reach of the code at {pc:#x} \
                             ({} regions at most): that code is stepped",
                            limits.regions
                        );
                    }
                    return None;
                }
            }
        }
        let maps = all_mappings(pid);
        let ours: Vec<u64> = self.cache_of(pid)?.regions.iter().map(|r| r.base).collect();
        let candidates = region_candidates(&maps, &ours, pc, limits.region_bytes);
        for base in candidates {
            let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
            let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
            match self.remote_syscall(
                tid,
                pid,
                libc::SYS_mmap as u64,
                [base, limits.region_bytes, prot, flags, u64::MAX, 0],
            ) {
                Ok(got) if got == base => {
                    let c = self.cache_of(pid)?;
                    let mut used = 0;
                    if c.remote_gadget.is_none() {
                        // From now on itrace's system calls in the process use the cache's own
                        // `syscall` (the vDSO's is followed by code that expects its caller).
                        // After it, room for the record a clean detach leaves (`reuse.rs`):
                        // zeros, not clean, until then.
                        if let Ok((bytes, syscall)) = unit::remote_call_gadget(base) {
                            if c.write(pid, base, &bytes).is_ok() {
                                c.remote_gadget = Some((base, syscall));
                                used = reuse::FIRST_FLOOR;
                            }
                        }
                    }
                    // The others start with their tag, by which a later session knows them.
                    if used == 0 && c.write(pid, base, &reuse::region_tag(base)).is_ok() {
                        used = reuse::REGION_TAG_BYTES;
                    }
                    c.regions.push(cache::Region { base, used, floor: used });
                    return Some(c.regions.len() - 1);
                }
                Ok(_) | Err(Errno::EEXIST) | Err(Errno::ENOMEM) => continue,
                Err(e) => {
                    eprintln!("itrace: warning: cannot map code cache in process {pid}: {e}");
                    return None;
                }
            }
        }
        None
    }

    /// Take what a clean detach of an earlier session left in process `pid` (`reuse.rs`), once,
    /// before its first region is mapped: the first region its record is in, the other
    /// regions and the state blocks it lists that are still there as they were mapped. The
    /// record is marked not clean before anything of it is used. The regions are empty (their
    /// old code is overwritten by the next units, as after a flush); the state blocks are
    /// reset when a thread takes one.
    fn reuse_leftovers(&mut self, pid: i32) {
        let limits = cache::limits();
        let Some(c) = self.cache_of(pid) else { return };
        c.looked_for_leftovers = true;
        if !c.regions.is_empty() || c.disabled.is_some() {
            return;
        }
        let maps = all_mappings(pid);
        for at in reuse::first_region_candidates(&maps, limits.region_bytes) {
            let Ok((gadget, syscall)) = unit::remote_call_gadget(at) else { return };
            let mut page = vec![0u8; reuse::FIRST_FLOOR as usize];
            if c.read(pid, at, &mut page).is_err() {
                continue;
            }
            let Some(left) = reuse::clean_record(&page, at, limits.region_bytes, &gadget) else { continue };
            // Not clean from now on: a kill during this session makes the next one map anew.
            if c.write(pid, at + reuse::RECORD_OFF + reuse::CLEAN_OFF, &0u64.to_le_bytes()).is_err() {
                return;
            }
            let tagged = |c: &mut Cache, addr: u64, tag: [u8; 16]| {
                let mut got = [0u8; 16];
                c.read(pid, addr, &mut got).is_ok() && got == tag
            };
            let mut regions = vec![cache::Region { base: at, used: reuse::FIRST_FLOOR, floor: reuse::FIRST_FLOOR }];
            // (Mapped first: the bases are read from the process, and a mapped range does not
            // wrap around.)
            for b in left.regions {
                let size = limits.region_bytes;
                if regions.len() < limits.regions
                    && reuse::mapped_as(&maps, b, size, b"r-xp")
                    && regions.iter().all(|r| b + size <= r.base || b >= r.base + size)
                    && tagged(c, b, reuse::region_tag(b))
                {
                    let floor = reuse::REGION_TAG_BYTES;
                    regions.push(cache::Region { base: b, used: floor, floor });
                }
            }
            let mut states: Vec<u64> = Vec::new();
            for s in left.states {
                if reuse::mapped_as(&maps, s, STATE_BYTES, b"rw-p")
                    && states.iter().all(|&o| s + STATE_BYTES <= o || s >= o + STATE_BYTES)
                    && tagged(c, s + reuse::STATE_TAG, reuse::state_tag(s))
                {
                    states.push(s);
                }
            }
            c.reused = Some((regions.len(), states.len()));
            c.regions = regions;
            c.remote_gadget = Some((at, syscall));
            // Taken from the end: the first-mapped block first.
            states.reverse();
            c.idle_states = states;
            return;
        }
    }

    /// The thread's state block, mapped and initialised on first use.
    fn thread_state(&mut self, tid: i32, pid: i32) -> Option<u64> {
        let t = self.threads.get(&tid)?;
        if t.arch.xl.state != 0 {
            return Some(t.arch.xl.state);
        }
        let c = self.cache_of(pid)?;
        if c.disabled.is_some() {
            return None;
        }
        let reset_table = |c: &mut Cache, s: u64| {
            let empty = vec![0xffu8; (TABLE_ENTRIES * TABLE_ENTRY_BYTES) as usize];
            c.write(pid, s + TABLE as u64, &empty)
        };
        let state = match c.free_states.pop() {
            Some(s) => {
                c.empty_ring(pid, s).ok()?;
                s
            }
            // One an earlier session left: its table holds that session's cache addresses.
            None if !c.idle_states.is_empty() => {
                let s = c.idle_states.pop()?;
                c.empty_ring(pid, s).ok()?;
                reset_table(c, s).ok()?;
                c.states.push(s);
                s
            }
            None => {
                // Far from where the program's own mappings go (below its executable, above
                // the first 64 GB), so that its addresses are the ones it has untraced.
                let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
                let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
                let maps = all_mappings(pid);
                let mut got = None;
                let free = (0..4096u64)
                    .map(|k| STATE_AREA + k * STATE_BYTES)
                    .filter(|&b| maps.iter().all(|m| b + STATE_BYTES <= m.start || b >= m.end));
                for base in free.take(4) {
                    match self.remote_syscall(
                        tid,
                        pid,
                        libc::SYS_mmap as u64,
                        [base, STATE_BYTES, prot, flags, u64::MAX, 0],
                    ) {
                        Ok(s) if s == base => {
                            got = Some(s);
                            break;
                        }
                        Ok(_) | Err(Errno::EEXIST) => continue,
                        Err(e) => {
                            eprintln!("itrace: warning: cannot map a thread state in process {pid}: {e}; thread {tid} is stepped");
                            return None;
                        }
                    }
                }
                let s = got?;
                let c = self.cache_of(pid)?;
                c.empty_ring(pid, s).ok()?;
                reset_table(c, s).ok()?;
                // Its tag, by which a later session knows it (`reuse.rs`).
                c.write(pid, s + reuse::STATE_TAG, &reuse::state_tag(s)).ok()?;
                c.states.push(s);
                s
            }
        };
        if unit::self_encode() {
            self.xl_setup(tid, pid, state)?;
        }
        let t = self.threads.get_mut(&tid)?;
        t.arch.xl.state = state;
        t.arch.xl.encodes_itself = false;
        Some(state)
    }

    /// Threads that encode their own rings (`unit::self_encode`): the blob and the exit table
    /// mapped in the process (once), and block `state`'s slots for the routine, the blob and
    /// thread `tid`. `None`: the thread is stepped.
    fn xl_setup(&mut self, tid: i32, pid: i32, state: u64) -> Option<()> {
        if self.cache_of(pid)?.xl_blob.is_none() {
            let image = blob::image_at(XL_BLOB_AREA).ok()?;
            let routine_at = XL_BLOB_AREA + image.bytes.len() as u64;
            let routine = unit::self_encode_routine(routine_at).ok()?;
            let len = image.bytes.len() as u64 + (routine.len() as u64).div_ceil(4096) * 4096;
            let fixed = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
            let rx = (libc::PROT_READ | libc::PROT_EXEC) as u64;
            // An earlier session's (a detach, a kill) is taken again: the same bytes at the
            // same place, rewritten; anything else there is the program's.
            let maps = all_mappings(pid);
            let ours = |start: u64, size: u64, perms: &[u8; 4]| {
                maps.iter().any(|m| m.start == start && m.end == start + size && m.anonymous && &m.perms == perms)
            };
            let table = (XL_EXITS_MAX * 32 + EXITS_FIRST).div_ceil(4096) * 4096;
            let reused = ours(XL_BLOB_AREA, len, b"r-xp") && ours(XL_EXITS_AREA, table, b"rw-p");
            let got = match reused {
                true => Ok(XL_BLOB_AREA),
                false => {
                    self.remote_syscall(tid, pid, libc::SYS_mmap as u64, [XL_BLOB_AREA, len, rx, fixed, u64::MAX, 0])
                }
            };
            if got != Ok(XL_BLOB_AREA) {
                eprintln!(
                    "itrace: warning: cannot map the ring encoder in process {pid}: {got:?}; thread {tid} is stepped"
                );
                return None;
            }
            let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
            let got = match reused {
                true => Ok(XL_EXITS_AREA),
                false => self.remote_syscall(
                    tid,
                    pid,
                    libc::SYS_mmap as u64,
                    [XL_EXITS_AREA, table, rw, fixed | libc::MAP_NORESERVE as u64, u64::MAX, 0],
                ),
            };
            if got != Ok(XL_EXITS_AREA) {
                eprintln!(
                    "itrace: warning: cannot map the exit table in process {pid}: {got:?}; thread {tid} is stepped"
                );
                return None;
            }
            let c = self.cache_of(pid)?;
            c.write(pid, XL_BLOB_AREA, &image.bytes).ok()?;
            c.write(pid, routine_at, &routine).ok()?;
            c.xl_blob = Some(cache::XlBlob {
                entry: XL_BLOB_AREA + image.self_encode,
                routine: routine_at,
                exits: XL_EXITS_AREA,
                start: XL_BLOB_AREA,
                end: XL_BLOB_AREA + len,
                synced: 0,
            });
        }
        let app_tid = self.threads.get(&tid)?.tid as u64;
        let c = self.cache_of(pid)?;
        let x = c.xl_blob?;
        // The exit table's slot stays 0 (the blob declines) until `xl_carry_in` says otherwise.
        let slots = [x.routine, x.entry, state, state + STATE_TOP_OF_STACK, 0, app_tid];
        let bytes: Vec<u8> = slots.iter().flat_map(|v| v.to_le_bytes()).collect();
        c.write(pid, state + XL_ROUTINE as u64, &bytes).ok()?;
        c.write(pid, state + XL_OUT_LEN as u64, &0u64.to_le_bytes()).ok()?;
        // The encoder is set up again by the thread's first call: a block another session left
        // holds an encoder of that build's layout.
        c.write(pid, state + XL_ENCODER_SET as u64, &0u64.to_le_bytes()).ok()?;
        c.sync_exits(pid).ok()
    }

    /// Run system call `nr` in the stopped thread (at a `syscall` instruction of its vDSO) and
    /// put its registers back. Signals that arrive meanwhile are sent again after. The thread
    /// goes from syscall stop to syscall stop (from a trap's entry stop: the skipped call's
    /// exit, then this call's entry and exit), never a step: no stop it could die of should
    /// itrace be killed meanwhile.
    fn remote_syscall(&mut self, tid: i32, pid: i32, nr: u64, args: [u64; 6]) -> Result<u64, Errno> {
        let gadget = match self.cache_of(pid).and_then(|c| c.gadget) {
            Some(g) => g,
            None => {
                let g = find_syscall_instruction(pid).ok_or(Errno::ENOEXEC)?;
                self.cache_of(pid).ok_or(Errno::ESRCH)?.gadget = Some(g);
                g
            }
        };
        let p = Pid::from_raw(tid);
        let saved = getregs(tid)?;
        // With the cache's own gadget, a thread let go during the call (itrace killed) comes
        // back to its own registers and pc from the save area.
        let own = self.cache_of(pid).and_then(|c| c.remote_gadget);
        let gadget = match own {
            Some((save, syscall)) => {
                let s = &saved;
                let mut area = Vec::with_capacity(unit::REMOTE_SAVE_BYTES as usize);
                for v in [s.rax, s.rdi, s.rsi, s.rdx, s.r10, s.r8, s.r9, s.rcx, s.r11, s.rip] {
                    area.extend_from_slice(&v.to_le_bytes());
                }
                let c = self.cache_of(pid).ok_or(Errno::ESRCH)?;
                if c.write(pid, save, &area).is_ok() {
                    syscall
                } else {
                    gadget
                }
            }
            None => gadget,
        };
        let mut r = saved;
        r.rip = gadget;
        r.rax = nr;
        r.orig_rax = u64::MAX;
        (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) = (args[0], args[1], args[2], args[3], args[4], args[5]);
        ptrace::setregs(p, r)?;
        let mut requeue = Vec::new();
        let mut result = Err(Errno::EIO);
        for _ in 0..8 {
            if !self.run_to_syscall_stop(tid, &mut requeue) {
                return Err(Errno::ESRCH);
            }
            let now = getregs(tid)?;
            if now.rip == gadget + SYSCALL_LEN && super::syscall_stop_is_exit(tid) {
                result = Ok(now.rax);
                break;
            }
            if now.rip != gadget && now.rip != gadget + SYSCALL_LEN {
                break;
            }
        }
        ptrace::setregs(p, saved)?;
        for sig in requeue {
            // SAFETY: tgkill with plain integers.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig as i32) };
        }
        let v = result?;
        if v > (-4096i64) as u64 {
            return Err(Errno::from_raw(-(v as i64) as i32));
        }
        Ok(v)
    }
}

impl Session<'_> {
    /// Before a thread is let go at a detach (it was brought out of the cache): check that it is
    /// out, its pc the application's and its gs base not a state block. One that is not makes
    /// the detach of its process not clean: its cache is not reused by a later session.
    pub(in super::super) fn cache_check_let_go(&mut self, tid: i32) {
        if !self.opts.step.translate {
            return;
        }
        let Some(t) = self.threads.get(&tid) else { return };
        let (pid, in_cache) = (t.pid, t.arch.xl.in_cache);
        // (A thread whose registers cannot be read is gone: it runs nothing.)
        let Ok(regs) = getregs(tid) else { return };
        let Some(c) = self.cache_of(pid) else { return };
        let on_state = |s: &u64| regs.gs_base >= *s && regs.gs_base < s + STATE_BYTES;
        if in_cache || c.owns(regs.rip) || c.states.iter().chain(&c.idle_states).any(on_state) {
            c.let_go_inside = true;
            eprintln!(
                "itrace: warning: thread {tid} is let go inside the code cache of process {pid} (pc {:#x}, gs base {:#x}); a later attach will not reuse that cache",
                regs.rip, regs.gs_base
            );
        }
    }

    /// After a detach: in each process that runs on with its cache idle, and whose threads were
    /// all let go out of it, the record that says a later session may reuse it (`reuse.rs`).
    pub(in super::super) fn leave_clean_records(&mut self) {
        if !self.opts.step.translate || self.detaching.is_none() {
            return;
        }
        let limits = cache::limits();
        for (&pid, p) in self.procs.iter_mut() {
            let c = &mut p.arch.cache;
            // (A vfork child's cache is its parent's, which says for itself.)
            if c.let_go_inside || c.disabled.is_some() {
                continue;
            }
            let Some(first) = c.first_region() else { continue };
            let others: Vec<u64> = c.regions.iter().map(|r| r.base).filter(|&b| b != first).collect();
            let states: Vec<u64> = c.states.iter().chain(&c.idle_states).copied().collect();
            let record = reuse::record(first, limits.region_bytes, &others, &states, true);
            // (It fails for a process gone meanwhile: nothing to reuse then.)
            c.left_reusable = c.write(pid, first + reuse::RECORD_OFF, &record).is_ok();
        }
    }

    /// After a detach: what the cache that stays mapped, idle, costs each process that runs on
    /// (one line each; its pages are the program's until it exits).
    pub(in super::super) fn say_what_the_cache_leaves(&self) {
        if !self.opts.step.translate || !matches!(self.opts.target, Target::Attach { .. }) {
            return;
        }
        for (pid, p) in &self.procs {
            let c = &p.arch.cache;
            let states = c.states.len() + c.idle_states.len();
            if c.regions.is_empty() && states == 0 {
                continue;
            }
            let ours = |start: u64| {
                c.regions.iter().any(|r| r.base == start) || c.states.contains(&start) || c.idle_states.contains(&start)
            };
            // Nothing mapped: the process is gone (a zombie's smaps is empty) or unmapped it all.
            let Some((size_kb, rss_kb)) = mapped_kb(*pid, ours).filter(|&(size, _)| size > 0) else { continue };
            let n = |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
            let reused = match c.reused {
                Some((r, s)) => {
                    format!("; {} and {} of it were an earlier attach's", n(r, "region"), n(s, "thread state"))
                }
                None => String::new(),
            };
            let next = if c.left_reusable { "; the next attach reuses it" } else { "" };
            eprintln!(
                "itrace: process {pid} keeps the code cache mapped, idle: {} MiB of address space ({}, {}), {} KiB of it resident{reused}{next}",
                size_kb / 1024,
                n(c.regions.len(), "region"),
                n(states, "thread state"),
                rss_kb
            );
        }
    }
}

/// The sizes (Size, Rss, in KiB) of the mappings of `pid` whose start `ours` accepts, from
/// /proc/PID/smaps; `None` when the process is gone.
fn mapped_kb(pid: i32, ours: impl Fn(u64) -> bool) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let (mut size, mut rss, mut counting) = (0u64, 0u64, false);
    for line in text.lines() {
        let first = line.split(' ').next().unwrap_or("");
        if let Some((start, _)) = first.split_once('-').filter(|(a, _)| a.bytes().all(|b| b.is_ascii_hexdigit())) {
            counting = u64::from_str_radix(start, 16).is_ok_and(&ours);
            continue;
        }
        if !counting {
            continue;
        }
        let kb = || line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        if line.starts_with("Size:") {
            size += kb();
        } else if line.starts_with("Rss:") {
            rss += kb();
        }
    }
    Some((size, rss))
}

/// Whether code in `start..end` may change without a system call itrace sees: some of it is in
/// a writable mapping, or in none of the executable mappings it knows (`maps`, in address
/// order).
fn may_change_unseen(maps: &[crate::procfs::Mapping], start: u64, end: u64) -> bool {
    let mut at = start;
    for m in &maps[maps.partition_point(|m| m.end <= start)..] {
        if m.start > at || m.writable() {
            return true;
        }
        at = m.end;
        if at >= end {
            return false;
        }
    }
    true
}

/// A `syscall` instruction (bytes 0f 05) in the process's vDSO.
fn find_syscall_instruction(pid: i32) -> Option<u64> {
    let maps = crate::procfs::exec_mappings(pid).ok()?;
    let vdso = maps.iter().find(|m| m.path == "[vdso]")?;
    let mut image = vec![0u8; (vdso.end - vdso.start) as usize];
    let n = super::super::tables::read_mem(pid, vdso.start, &mut image);
    image[..n].windows(2).position(|w| w == [0x0f, 0x05]).map(|o| vdso.start + o as u64)
}

/// Where thread-state blocks go: above the first 64 GB (a non-PIE program and its heap are
/// below), far below where a PIE program and the kernel's top-down mappings are.
const STATE_AREA: u64 = 0x10_0000_0000;
/// Below it, the blob threads encode their rings with, and the exit table it reads
/// (`unit::self_encode`), room for `XL_EXITS_MAX` exits.
const XL_BLOB_AREA: u64 = STATE_AREA - 0x1000_0000;
const XL_EXITS_AREA: u64 = STATE_AREA - 0x4000_0000;
const XL_EXITS_MAX: u64 = 1 << 24;
/// The block's stack top (the routine's rsp), as an offset.
const STATE_TOP_OF_STACK: u64 = STACK_TOP as u64;

/// One line of /proc/PID/maps.
struct MapRange {
    start: u64,
    end: u64,
    stack: bool,
    /// As the line has them: `r-xp`, `rw-p`...
    perms: [u8; 4],
    /// No file (and no name: not the stack, the heap, the vDSO).
    anonymous: bool,
}

/// Every mapping of a process, in address order.
fn all_mappings(pid: i32) -> Vec<MapRange> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return Vec::new() };
    text.lines()
        .filter_map(|l| {
            let mut fields = l.splitn(6, ' ');
            let (s, e) = fields.next()?.split_once('-')?;
            let perms = fields.next()?.as_bytes().try_into().ok()?;
            let inode = fields.nth(2)?;
            let path = fields.next().unwrap_or("").trim();
            Some(MapRange {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                stack: path == "[stack]",
                perms,
                anonymous: inode == "0" && path.is_empty(),
            })
        })
        .collect()
}

/// Where a region of `size` bytes of cache for code at `pc` may go, best first. It must be
/// within reach of the code's RIP-relative data (1 GB here), and should not be where the
/// program's own mappings would go, or they would move:
/// - the gap the kernel leaves below the stack for it to grow (at least 128 MB, of which the
///   stack may use its limit, 8 MB by default): next to the libraries and the dynamic loader
///   (its lower end is the program's highest mapping there, not a region of ours: so a second
///   region goes there too, not below the libraries where the kernel maps the program's next
///   ones, which would move);
/// - below the code (below a PIE program nothing is mapped);
/// - above it, past room for the heap (a non-PIE program at 4 MB).
fn region_candidates(maps: &[MapRange], ours: &[u64], pc: u64, size: u64) -> Vec<u64> {
    const REACH: u64 = 1 << 30;
    const MB: u64 = 1 << 20;
    let free = |base: u64| maps.iter().all(|m| base + size + MB <= m.start || base >= m.end + MB);
    let mut out = Vec::new();
    if let Some(stack) = maps.iter().find(|m| m.stack) {
        let below =
            maps.iter().filter(|m| m.end <= stack.start && !ours.contains(&m.start)).map(|m| m.end).max().unwrap_or(0);
        let lo = (below + 16 * MB + size - 1) & !(size - 1);
        // Room for the stack to grow to 64 MB, a guard gap, and more.
        let hi = stack.start.saturating_sub(96 * MB);
        let mut base = lo;
        while base + size <= hi {
            if base.abs_diff(pc) < REACH {
                out.push(base);
            }
            base += size;
        }
    }
    let home = pc & !(size - 1);
    // As far as 512 MB either way, whatever the region's size (a tiny test cache's too).
    let steps = (512 * MB / size).max(64);
    out.extend((1..steps).filter_map(|k| home.checked_sub(k * size)).filter(|&b| b >= 1 << 24));
    out.extend((0..steps).map(|k| home + 512 * MB + k * size));
    // Not above the 47-bit user address space (the kernel maps nothing there unasked).
    const USER_TOP: u64 = 0x7fff_ffff_f000;
    out.retain(|&b| free(b) && b.abs_diff(pc) < REACH && b + size <= USER_TOP);
    out.truncate(4);
    out
}

#[cfg(test)]
mod tests {
    use super::{region_candidates, MapRange};

    const MB: u64 = 1 << 20;
    const STACK: u64 = 0x7fff_fffd_e000;
    const LDSO_END: u64 = 0x7fff_f7ff_f000;

    fn map(start: u64, end: u64, stack: bool) -> MapRange {
        MapRange { start, end, stack, perms: *b"r-xp", anonymous: !stack }
    }

    /// The libraries and ld.so top-down below the stack's gap, a PIE executable far below.
    fn layout() -> Vec<MapRange> {
        vec![
            map(0x5555_5555_4000, 0x5555_5555_9000, false),
            map(0x7fff_f7c0_0000, 0x7fff_f7e0_0000, false),
            map(0x7fff_f7fc_3000, LDSO_END, false),
            map(STACK, STACK + 0x21000, true),
        ]
    }

    #[test]
    fn regions_go_in_the_gap_below_the_stack() {
        let size = 128 << 10;
        let first = region_candidates(&layout(), &[], 0x7fff_f7fe_4b70, size);
        assert!(first[0] > LDSO_END + 16 * MB && first[0] + size <= STACK - 96 * MB, "{first:x?}");
        // With the first region mapped there, a second one still goes in the gap (above the
        // first, clear of it), not below the libraries, where the kernel maps the next ones.
        let mut maps = layout();
        maps.insert(3, map(first[0], first[0] + size, false));
        let second = region_candidates(&maps, &[first[0]], 0x7fff_f7fe_5abf, size);
        assert!(!second.is_empty());
        for b in &second {
            assert!(*b > LDSO_END && *b + size <= STACK - 96 * MB, "{second:x?}");
            assert!(*b >= first[0] + size + MB || *b + size + MB <= first[0], "{second:x?}");
        }
    }

    #[test]
    fn small_regions_are_searched_as_far_as_large_ones_and_in_user_space() {
        // Code with everything near it taken: below it 8 MB of mappings.
        let pc = 0x7fff_f7d4_0470;
        let maps = vec![map(pc - 8 * MB, pc + MB, false)];
        for size in [128 << 10, 8 * MB] {
            let c = region_candidates(&maps, &[], pc, size);
            assert!(!c.is_empty(), "size {size}");
            for b in c {
                assert!(b + size < 0x7fff_ffff_f000, "size {size}: {b:#x} beyond user space");
                assert!(b.abs_diff(pc) < 1 << 30);
            }
        }
    }
}
