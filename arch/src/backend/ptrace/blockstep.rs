//! What the ppc64 and s390x recorders share: they step by blocks where the start-up probe
//! (each architecture's code sequence, on a page of its own) sees `PTRACE_SINGLEBLOCK` work,
//! single steps otherwise, and run system calls between their syscall-entry and syscall-exit
//! stops (neither `sc` nor `svc` can be stepped over: `thread.arch.in_syscall`,
//! `thread.arch.restart_via_syscall`). Each architecture's `set_pending` decodes what runs next.

use super::engine::*;
use super::probe_child::BlockStep;
use crate::backend::{BackendError, RecordSettings, StepChoice};
use crate::Arch as _;
use itrace_decoders::Flow;
use itrace_format::{branch_flags, now_ns, BranchKind, StepMethod};

/// The step method: block steps where `probe` (the architecture's) saw them work, as `--step`
/// asks; `PtraceSingleBlock` or `PtraceSingleStep`.
pub(super) fn choose_step(s: &RecordSettings, probe: fn() -> BlockStep) -> Result<StepMethod, BackendError> {
    if s.emulate_block_step {
        return Err(BackendError::Settings("block-step emulation is an x86_64 test hook".into()));
    }
    let block = match s.step {
        StepChoice::Instruction => false,
        StepChoice::Auto => probe() == BlockStep::Works,
        StepChoice::Block => match probe() {
            BlockStep::Works => true,
            BlockStep::StepsEachInstruction => {
                return Err(BackendError::Settings(
                    "--step block: PTRACE_SINGLEBLOCK stops after every instruction here; use --step auto".into(),
                ))
            }
            BlockStep::Unavailable(why) => {
                return Err(BackendError::Settings(format!(
                    "--step block: PTRACE_SINGLEBLOCK does not work here ({why}); use --step auto"
                )))
            }
        },
    };
    Ok(if block { StepMethod::PtraceSingleBlock } else { StepMethod::PtraceSingleStep })
}

/// A page of this process, mapped read and execute, for the probe child's code (written into
/// the child's copy by ptrace, as breakpoints are: never writable and executable here).
pub(super) struct ProbePage(*mut libc::c_void);

impl ProbePage {
    pub(super) fn map() -> Result<ProbePage, String> {
        // SAFETY: a fresh anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mapping the probe page failed: {}", std::io::Error::last_os_error()));
        }
        Ok(ProbePage(p))
    }

    /// Its address (the same in a child forked after the mapping).
    pub(super) fn addr(&self) -> u64 {
        self.0 as u64
    }
}

impl Drop for ProbePage {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference into it exists here.
        unsafe { libc::munmap(self.0, 4096) };
    }
}

impl Session<'_> {
    /// The syscall-exit stop of thread `tid`'s pending system call: the pc is `pc_after`, where
    /// it returns (for rt_sigreturn, the interrupted code); `restarting`: its result says the
    /// kernel will restart it (or a signal interrupted it). Writes its records and goes on.
    pub(super) fn syscall_exit(&mut self, tid: i32, pc_after: u64, restarting: bool) {
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.in_syscall = false;
        let (cpu, pid) = (t.cpu, t.pid);
        let Some(p) = t.pending.filter(|p| p.insn.flow == Flow::Syscall) else {
            self.set_pending(tid, pc_after);
            self.resume(tid, 0);
            return;
        };
        if restarting {
            // Interrupted: a signal is delivered next (its handler runs, and the call maybe again
            // after it), or the call restarts at once (the kernel moves the pc back onto the
            // system call instruction, or runs the call again).
            t.syscall_interrupted = true;
            t.arch.restart_via_syscall = true;
            self.resume(tid, 0);
            return;
        }
        t.syscall_interrupted = false;
        let out = branch(t, true, p.pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, p.syscall_nr);
        let mut k = branch(t, false, 0, pc_after, BranchKind::Iret, branch_flags::SYSCALL, p.syscall_nr);
        k.kernel = true;
        self.push_branch(cpu, out);
        self.push_branch(cpu, k);
        self.after_syscall(tid, pid, p.syscall_nr);
        self.set_pending(tid, pc_after);
        self.resume(tid, 0);
    }

    /// The module table and names after system call `nr` of thread `tid` returned.
    pub(super) fn after_syscall(&mut self, tid: i32, pid: i32, nr: u64) {
        let Some(isa) = self.threads.get(&tid).map(|t| t.arch.isa()) else { return };
        if isa.changes_mappings(nr) {
            self.refresh_maps(pid, now_ns());
        }
        if isa.may_rename(nr) {
            self.name_thread(pid, tid, now_ns());
        }
    }
}
