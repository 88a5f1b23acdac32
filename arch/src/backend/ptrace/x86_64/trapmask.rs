//! The program's own SIGTRAP handler survives being stepped.
//!
//! A single-step trap, a branch trap and a debug-register hit reach the tracee as a *forced*
//! SIGTRAP (`send_sigtrap` → `force_sig_fault`). When the thread blocks SIGTRAP at that moment
//! (inside its own SIGTRAP handler, where the kernel blocks the signal being handled, or with
//! every signal blocked), the kernel resets SIGTRAP's disposition to `SIG_DFL` and unblocks it:
//! the program's handler is gone, and its next SIGTRAP (a `raise`, an `int3`) kills it (exit
//! 133), which it never does untraced.
//!
//! So a thread whose mask blocks SIGTRAP is resumed with SIGTRAP unblocked
//! (`PTRACE_SETSIGMASK`), and its own mask is put back at its next stop, before anything
//! looks at the stop. A system call that sets the mask (`rt_sigprocmask`, a `sigreturn`) keeps
//! what it set. A SIGTRAP sent to the thread meanwhile (by `kill`, `raise`, `tgkill`), which
//! the program blocks, is kept by itrace and delivered, with its own siginfo, at the first
//! stop where the program's mask lets it through, as the kernel would deliver a pending one.
//!
//! The mask is read (`PTRACE_GETSIGMASK`) only after what may change it: a system call, a
//! signal delivery, an exec, a thread's first stop; the steps between cost nothing more unless
//! SIGTRAP is blocked, and then two mask writes a stop.

use super::engine::*;
use itrace_decoders::Flow;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;

/// SIGTRAP's bit in a signal mask.
const SIGTRAP_BIT: u64 = 1 << (libc::SIGTRAP - 1);

/// System calls that set the thread's signal mask (x86_64 and i386 numbers): after one ran,
/// the mask is the program's, not ours to put back. (`rt_sigreturn` and i386's `sigreturn`
/// leave orig_rax at -1, which is tested apart.)
fn sets_mask(compat: bool, nr: u64) -> bool {
    if compat {
        matches!(nr, 126 | 175) // sigprocmask, rt_sigprocmask
    } else {
        nr == 14 // rt_sigprocmask
    }
}

/// A SIGTRAP the program sent (or was sent) and blocks, kept by itrace until it unblocks it.
#[derive(Clone, Copy)]
pub(super) struct KeptTrap(libc::siginfo_t);

impl std::fmt::Debug for KeptTrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeptTrap(si_code {})", self.0.si_code)
    }
}

/// A thread's signal mask, as far as SIGTRAP goes.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct TrapMask {
    /// The program's mask, when known (read again after whatever may change it).
    known: Option<u64>,
    /// Set while the thread runs with SIGTRAP unblocked by itrace: the program's own mask.
    held: Option<u64>,
    /// A SIGTRAP for the program that its mask blocks.
    kept: Option<KeptTrap>,
}

fn get_mask(tid: i32) -> Result<u64, Errno> {
    let mut mask: u64 = 0;
    // SAFETY: PTRACE_GETSIGMASK on our stopped tracee writes 8 bytes (the size passed in addr)
    // to `mask`, which lives for the call.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETSIGMASK, tid, std::mem::size_of::<u64>(), &mut mask as *mut u64) };
    if r == 0 {
        Ok(mask)
    } else {
        Err(Errno::last())
    }
}

fn set_mask(tid: i32, mask: u64) -> Result<(), Errno> {
    // SAFETY: PTRACE_SETSIGMASK on our stopped tracee reads 8 bytes (the size passed in addr)
    // from `mask`, which lives for the call.
    let r = unsafe { libc::ptrace(libc::PTRACE_SETSIGMASK, tid, std::mem::size_of::<u64>(), &mask as *const u64) };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

impl Session<'_> {
    /// Before resuming a stepping thread: `sig` is the signal delivered with the resume (0: none).
    /// With no signal, SIGTRAP is unblocked for the resume if the program blocks it; a signal
    /// delivery sets a new mask (its handler's), read at the next resume.
    pub(super) fn unblock_trap_for_resume(&mut self, tid: i32, sig: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if sig != 0 {
            // The frame saves the program's own mask (put back at the stop); the handler's is new.
            t.arch.trap_mask.known = None;
            return;
        }
        if t.arch.trap_mask.held.is_some() {
            return;
        }
        let mask = match t.arch.trap_mask.known {
            Some(m) => m,
            None => match get_mask(tid) {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.trap_mask.known = Some(mask);
        if mask & SIGTRAP_BIT != 0 && set_mask(tid, mask & !SIGTRAP_BIT).is_ok() {
            t.arch.trap_mask.held = Some(mask);
        }
    }

    /// At any stop of a thread: put the program's own mask back if itrace unblocked SIGTRAP for
    /// the resume, unless the resume ran a system call that set a mask of its own.
    pub(super) fn restore_trap_mask(&mut self, tid: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        let Some(held) = t.arch.trap_mask.held.take() else { return };
        let pending = t.pending;
        let planned = t.arch.planned_syscall;
        let compat = t.arch.isa().compat;
        let Ok(regs) = super::getregs(tid) else {
            let _ = set_mask(tid, held);
            return;
        };
        // Did the resume run a system call (a single step, or the system call ending a block)?
        // It returns after itself, or anywhere when it is a sigreturn (orig_rax -1), never to
        // itself (a signal stopped the thread before it ran).
        let sigreturn = regs.orig_rax as i64 == -1;
        let ran = |pc: u64, len: u8| regs.rip == pc.wrapping_add(len as u64) || (sigreturn && regs.rip != pc);
        let ran_syscall = pending.is_some_and(|p| p.insn.flow == Flow::Syscall && ran(p.pc, p.insn.len))
            || planned.is_some_and(|(pc, insn, _)| ran(pc, insn.len));
        let t = self.threads.get_mut(&tid).expect("thread exists");
        if ran_syscall && (sigreturn || sets_mask(compat, regs.orig_rax)) {
            t.arch.trap_mask.known = None;
            return;
        }
        t.arch.trap_mask.known = Some(held);
        let _ = set_mask(tid, held);
    }

    /// A SIGTRAP for the program is about to be delivered (`inject`): if its mask blocks it, keep
    /// it (with its siginfo) instead, as the kernel would keep it pending. Otherwise, at a stop
    /// where nothing is delivered, deliver a kept one if the mask lets it through now.
    pub(super) fn keep_or_release_trap(&mut self, tid: i32, inject: &mut i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        let kept = t.arch.trap_mask.kept;
        if *inject != libc::SIGTRAP && (*inject != 0 || kept.is_none()) {
            return;
        }
        let mask = match t.arch.trap_mask.known {
            Some(m) => m,
            None => match get_mask(tid) {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.trap_mask.known = Some(mask);
        let blocked = mask & SIGTRAP_BIT != 0;
        if *inject == libc::SIGTRAP {
            // Only what was sent is kept; a trap the program's own instruction raised (int3, SI_KERNEL)
            // is delivered as the kernel would force it.
            if blocked {
                if let Ok(si) = ptrace::getsiginfo(Pid::from_raw(tid)) {
                    if si.si_code <= 0 {
                        t.arch.trap_mask.kept.get_or_insert(KeptTrap(si));
                        *inject = 0;
                    }
                }
            }
        } else if let (false, Some(KeptTrap(si))) = (blocked, kept) {
            if ptrace::setsiginfo(Pid::from_raw(tid), &si).is_ok() {
                t.arch.trap_mask.kept = None;
                *inject = libc::SIGTRAP;
            }
        }
    }

    /// Before any resume: a mask still held (a stop that was not handled as a step) is put back as it was.
    pub(super) fn put_back_trap_mask(&mut self, tid: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if let Some(held) = t.arch.trap_mask.held.take() {
            let _ = set_mask(tid, held);
        }
    }

    /// The thread's mask may have changed in a way no stop showed (an exec, a new thread).
    pub(super) fn forget_trap_mask(&mut self, tid: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.arch.trap_mask.known = None;
        }
    }
}
