//! The in-process recorder: a traced thread sets the trap flag on itself
//! and records each step in its own SIGTRAP handler, into memory shared
//! with `itrace` (see `ring`); no context switch to a tracer per
//! instruction.
//!
//! The entry points (`entry`) clear the trap flag first thing and
//! set it again just before returning to the caller, so none of the
//! library's own work is stepped or recorded. Classification follows the
//! ptrace recorder's rules (a taken branch wherever the next pc is not the
//! fall-through, or the instruction always transfers control; a `rep`
//! string instruction counts once); one x86 fact differs: when a thread
//! steps itself, the trap after `syscall` comes one instruction later, so
//! the instruction after a system call is accounted at the same trap.
//!
//! Not traced, by design: signal handlers (the kernel clears the trap flag
//! for them; the interrupted code goes on being traced after), threads and
//! processes created inside a region (their inherited trap flag is cleared
//! at their first step), code after an exec.

use crate::ring::{self, emit};
use crate::sigchain;
use itrace_decoders::{x86, Flow, Insn};
use itrace_format::shm;
use itrace_format::{branch_flags, BranchKind, StopReason, TraceOnReason};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, Ordering};

/// Trap flag in RFLAGS.
const TF: i64 = 0x100;
const STATE_UNKNOWN: u8 = 0;
const STATE_OFF: u8 = 1;
const STATE_ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(STATE_UNKNOWN);

const CACHE: usize = 1024;

struct ThreadState {
    active: bool,
    depth: u32,
    started: bool,
    tid: u32,
    pid: u32,
    pending: Option<(u64, Insn)>,
    syscall_nr: u64,
    syscall_arg0: u64,
    icount: u32,
    /// Instructions of this thread counted since its outermost ITraceOn (the virtual counter).
    total: u64,
    cache: *mut [(u64, Insn); CACHE],
}

thread_local! {
    // Const-initialised and without a destructor: a plain TLS slot, safe to reach from the
    // signal handler.
    static TS: UnsafeCell<ThreadState> = const {
        UnsafeCell::new(ThreadState {
            active: false,
            depth: 0,
            started: false,
            tid: 0,
            pid: 0,
            pending: None,
            syscall_nr: 0,
            syscall_arg0: 0,
            icount: 0,
            total: 0,
            cache: std::ptr::null_mut(),
        })
    };
}

/// Map the shared memory named by $ITRACE_SHM and install the handler; once per process.
pub(crate) fn ensure_init() -> bool {
    match STATE.load(Ordering::Acquire) {
        STATE_ON => return true,
        STATE_OFF => return false,
        _ => {}
    }
    let on = ring::map() && sigchain::take_over(on_trap);
    STATE.store(if on { STATE_ON } else { STATE_OFF }, Ordering::Release);
    on
}

/// Whether the in-process recorder runs in this process (set up by an earlier ITraceOn).
pub(crate) fn running() -> bool {
    STATE.load(Ordering::Acquire) == STATE_ON
}

/// Decode the instruction at `pc` of this process (through the thread's small cache).
fn decode(ts: &mut ThreadState, pc: u64) -> Insn {
    let line = (pc as usize ^ (pc as usize >> 10)) % CACHE;
    if !ts.cache.is_null() {
        // SAFETY: not null, so allocated for this thread by `on` (never freed), and `line` < CACHE.
        let e = unsafe { &(*ts.cache)[line] };
        if e.0 == pc {
            return e.1;
        }
    }
    let mut buf = [0u8; 16];
    let n = if (pc & 0xfff) <= 0x1000 - 16 {
        // SAFETY: the thread is about to execute at pc, so its page is mapped; 16 bytes stay in it.
        unsafe { std::ptr::copy_nonoverlapping(pc as *const u8, buf.as_mut_ptr(), 16) };
        16
    } else {
        // Near a page end the next page may be unmapped: let the kernel read what it can.
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: 16 };
        let remote = libc::iovec { iov_base: pc as *mut libc::c_void, iov_len: 16 };
        // SAFETY: reading our own memory through the kernel, into a local buffer.
        let r = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if r <= 0 {
            let first = (0x1000 - (pc & 0xfff)) as usize;
            // SAFETY: as above, within the page of pc.
            unsafe { std::ptr::copy_nonoverlapping(pc as *const u8, buf.as_mut_ptr(), first) };
            first
        } else {
            r as usize
        }
    };
    let insn = x86::decode(64, pc, &buf[..n]);
    if !ts.cache.is_null() {
        // SAFETY: as for the read above; only this thread uses its cache.
        unsafe { (*ts.cache)[line] = (pc, insn) };
    }
    insn
}

// The system calls the recorder looks at (numbers as in rax).
const NR_MMAP: u64 = libc::SYS_mmap as u64;
const NR_MPROTECT: u64 = libc::SYS_mprotect as u64;
const NR_MUNMAP: u64 = libc::SYS_munmap as u64;
const NR_MREMAP: u64 = libc::SYS_mremap as u64;
const NR_CLONE: u64 = libc::SYS_clone as u64;
const NR_FORK: u64 = libc::SYS_fork as u64;
const NR_VFORK: u64 = libc::SYS_vfork as u64;
const NR_EXIT: u64 = libc::SYS_exit as u64;
const NR_EXIT_GROUP: u64 = libc::SYS_exit_group as u64;
const NR_CLONE3: u64 = libc::SYS_clone3 as u64;
const NR_RT_SIGPROCMASK: u64 = libc::SYS_rt_sigprocmask as u64;
const CLONE_VM: u64 = libc::CLONE_VM as u64;

/// Whether the rt_sigprocmask about to run (arguments in `gregs`) blocks SIGTRAP.
fn blocks_sigtrap(gregs: &[i64; 23]) -> bool {
    let (how, set) = (gregs[libc::REG_RDI as usize], gregs[libc::REG_RSI as usize] as u64);
    if set == 0 || !(how == libc::SIG_BLOCK as i64 || how == libc::SIG_SETMASK as i64) {
        return false;
    }
    // SAFETY: the thread passes `set` to the kernel next, as a set of at least 8 bytes (the
    // kernel's sigset size on x86_64); glibc's calls (the case this is for) pass a valid one. A
    // program passing a bad pointer would get EFAULT from the kernel, and a SIGSEGV here instead.
    let bits = unsafe { std::ptr::read_unaligned(set as *const u64) };
    bits & (1 << (libc::SIGTRAP - 1)) != 0
}

/// A branch slot's code: the trace file's minor code (kind | flags << 8), low 16 bits.
fn branch_code(kind: BranchKind, flags: u8) -> u16 {
    kind as u16 | u16::from(flags) << 8
}

fn branch(kind: u16, code: u16, aux: u32, from: u64, to: u64, ts: &mut ThreadState) {
    emit(kind, code, aux, from, to, ts.tid, ts.icount);
    ts.icount = 0;
}

/// Classify what ran since the last step of `ts`, now at `rip`; returns false to stop stepping.
fn step(ts: &mut ThreadState, rip: u64, rax: u64) -> bool {
    let had_pending = ts.pending.is_some();
    if let Some((pc, insn)) = ts.pending.take() {
        let next = pc.wrapping_add(insn.len as u64);
        let mut cur = (pc, insn);
        if insn.flow == Flow::Syscall {
            let nr = ts.syscall_nr;
            let child = rax == 0 && matches!(nr, NR_FORK | NR_VFORK | NR_CLONE | NR_CLONE3);
            if child {
                // A new process: nothing of it is traced. A vfork child shares our memory (and
                // this state), so only its trap flag is cleared.
                let shares = nr == NR_VFORK || (nr == NR_CLONE && ts.syscall_arg0 & CLONE_VM != 0);
                if !shares {
                    ts.active = false;
                }
                return false;
            }
            ts.icount += 1;
            ts.total += 1;
            branch(shm::SLOT_BRANCH_USER, branch_code(BranchKind::Intrpt, branch_flags::SYSCALL), nr as u32, pc, 0, ts);
            branch(
                shm::SLOT_BRANCH_KERNEL,
                branch_code(BranchKind::Iret, branch_flags::SYSCALL),
                nr as u32,
                0,
                next,
                ts,
            );
            if matches!(nr, NR_MMAP | NR_MPROTECT | NR_MUNMAP | NR_MREMAP) {
                emit(shm::SLOT_MAPS_CHANGED, 0, ts.pid, 0, 0, ts.tid, 0);
            }
            // The trap after a system call comes one instruction late: that one ran too.
            cur = (next, decode(ts, next));
        }
        let (pc, insn) = cur;
        let next = pc.wrapping_add(insn.len as u64);
        match insn.flow {
            Flow::RepString if rip == pc => {
                ts.pending = Some((pc, insn));
                return true;
            }
            flow => {
                ts.icount += 1;
                ts.total += 1;
                if flow.always_branches() || rip != next {
                    // Next and RepString (landing elsewhere) are Other.
                    branch(shm::SLOT_BRANCH_USER, branch_code(flow.branch_kind(), 0), 0, pc, rip, ts);
                }
            }
        }
    }
    if crate::entry::in_stubs(rip) {
        // Library code: not recorded; the caller's code resumes at its return.
        return true;
    }
    if !ts.started || !had_pending {
        let reason = if ts.started { TraceOnReason::Resume } else { TraceOnReason::Start };
        emit(shm::SLOT_TRACE_ON, reason as u16, ts.pid, 0, rip, ts.tid, 0);
        ts.started = true;
    }
    let insn = decode(ts, rip);
    ts.pending = Some((rip, insn));
    true
}

extern "C" fn on_trap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes valid siginfo and ucontext pointers to an SA_SIGINFO handler.
    let (code, uc) = unsafe { ((*info).si_code, &mut *(ctx as *mut libc::ucontext_t)) };
    // A step trap is TRAP_TRACE. Under load in a VM the debug status can come back empty, and
    // the kernel then reports the step as TRAP_BRKPT (as for an `int1` instruction): with the
    // trap flag set it is ours all the same (measured: 7 calib runs in 40 killed by a forwarded
    // "foreign" SIGTRAP before this). An `int3` is SI_KERNEL and raise/kill are SI_USER or
    // SI_TKILL: those stay the program's.
    let trap_flag = uc.uc_mcontext.gregs[libc::REG_EFL as usize] & TF != 0;
    if code != libc::TRAP_TRACE && !(code == libc::TRAP_BRKPT && trap_flag) {
        sigchain::forward(sig, info, ctx);
        return;
    }
    let gregs = &mut uc.uc_mcontext.gregs;
    with_state(|ts| {
        if !ts.active || ring::stopped() != Some(false) {
            if ts.active {
                // itrace asked to stop, or normal mode filled a buffer.
                let reason = if ring::full() { StopReason::BufferFull } else { StopReason::Detached };
                let pc = gregs[libc::REG_RIP as usize] as u64;
                emit(shm::SLOT_TRACE_OFF, reason as u16, ts.pid, pc, 0, ts.tid, ts.icount);
                ts.active = false;
            }
            // A trap flag we did not set for this thread (inherited by a new thread or child): off.
            gregs[libc::REG_EFL as usize] &= !TF;
            return;
        }
        let rip = gregs[libc::REG_RIP as usize] as u64;
        let rax = gregs[libc::REG_RAX as usize] as u64;
        if !step(ts, rip, rax) {
            gregs[libc::REG_EFL as usize] &= !TF;
            return;
        }
        if let Some((pc, insn)) = ts.pending {
            if insn.flow == Flow::Syscall {
                ts.syscall_nr = rax;
                ts.syscall_arg0 = gregs[libc::REG_RDI as usize] as u64;
                if rax == NR_RT_SIGPROCMASK && blocks_sigtrap(gregs) {
                    // A raw system call is about to block SIGTRAP (glibc does it as a thread exits,
                    // unseen by the interposed functions); a step trap while it is blocked would
                    // kill the process. The region ends here.
                    emit(shm::SLOT_TRACE_OFF, StopReason::RegionEnd as u16, ts.pid, pc, 0, ts.tid, ts.icount);
                    ts.icount = 0;
                    ts.pending = None;
                    ts.active = false;
                    gregs[libc::REG_EFL as usize] &= !TF;
                    return;
                }
                if matches!(rax, NR_EXIT | NR_EXIT_GROUP) {
                    // It never returns: account for it now.
                    ts.icount += 1;
                    ts.total += 1;
                    branch(
                        shm::SLOT_BRANCH_USER,
                        branch_code(BranchKind::Intrpt, branch_flags::SYSCALL),
                        rax as u32,
                        pc,
                        0,
                        ts,
                    );
                    let status = gregs[libc::REG_RDI as usize] as u64;
                    emit(
                        shm::SLOT_TRACE_OFF,
                        StopReason::Exited as u16,
                        ts.pid,
                        pc + insn.len as u64,
                        status,
                        ts.tid,
                        0,
                    );
                    ts.pending = None;
                    ts.active = false;
                }
            }
        }
    });
}

/// `f` on the calling thread's state, from the entry bodies or the SIGTRAP handler.
fn with_state<R>(f: impl FnOnce(&mut ThreadState) -> R) -> R {
    // SAFETY: the thread's own state, and no other reference to it is live: the entry bodies
    // run with the trap flag off (no step trap comes in), the handler touches the state only for
    // a step trap, and it does not nest (SIGTRAP is blocked while it runs).
    TS.with(|c| f(unsafe { &mut *c.get() }))
}

/// ITraceOn: start (or nest) the calling thread's region; whether to step on after the return.
pub(crate) fn on() -> u32 {
    if !ensure_init() {
        return 0;
    }
    let stopped = ring::stopped() == Some(true);
    with_state(|ts| {
        ts.depth += 1;
        if ts.depth == 1 && !stopped {
            if ts.cache.is_null() {
                ts.cache = Box::into_raw(Box::new([(u64::MAX, x86::decode(64, 0, &[0x90])); CACHE]));
            }
            // SAFETY: gettid has no preconditions.
            ts.tid = unsafe { libc::gettid() } as u32;
            // SAFETY: getpid has no preconditions.
            ts.pid = unsafe { libc::getpid() } as u32;
            ring::wait_for_maps(ts.pid);
            ts.active = true;
            ts.started = false;
            ts.pending = None;
            ts.icount = 0;
            ts.total = 0;
        }
        ts.active as u32
    })
}

/// ITraceOff: end (or unnest) the region; whether to step on after the return.
pub(crate) fn off() -> u32 {
    with_state(|ts| {
        ts.depth = ts.depth.saturating_sub(1);
        if ts.depth == 0 && ts.active {
            // A ring that filled since the thread's last step stopped tracing everywhere: its
            // region ends for that, not at this call (its next step would have said so).
            let reason = if ring::full() { StopReason::BufferFull } else { StopReason::RegionEnd };
            emit(
                shm::SLOT_TRACE_OFF,
                reason as u16,
                ts.pid,
                crate::entry::ITraceOff as *const () as u64,
                0,
                ts.tid,
                ts.icount,
            );
            ts.active = false;
            ts.pending = None;
            ts.icount = 0;
        }
        ts.active as u32
    })
}

/// ITraceEnabled: whether the thread is traced (and so steps on after the return).
pub(crate) fn enabled() -> u32 {
    with_state(|ts| ts.active as u32)
}

/// (count, whether to step on after the return) for the counter stubs.
#[repr(C)]
pub(crate) struct CountRet {
    pub(crate) count: u64,
    pub(crate) step: u64,
}

/// The virtual counter; the thread steps on after the return unless `pause`.
pub(crate) fn count_now(pause: bool) -> CountRet {
    with_state(|ts| {
        let step = ts.active && !pause;
        CountRet { count: if ts.active { ts.total } else { 0 }, step: step as u64 }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_codes_are_the_trace_file_minor_codes() {
        assert_eq!(branch_code(BranchKind::Intrpt, branch_flags::SYSCALL), 0x100);
        assert_eq!(branch_code(BranchKind::Iret, branch_flags::SYSCALL), 0x104);
        assert_eq!(branch_code(Flow::Next.branch_kind(), 0), 5);
        assert_eq!(branch_code(Flow::RepString.branch_kind(), 0), 5);
        assert_eq!(branch_code(Flow::CondJump.branch_kind(), 0), 8);
    }
}
