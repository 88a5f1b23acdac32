//! Does PTRACE_SINGLEBLOCK stop only at taken branches here? Many
//! hypervisors ignore the branch-trap flag (DEBUGCTL.BTF) and the request
//! then steps single instructions: find out by stepping a known sequence.

use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

/// What PTRACE_SINGLEBLOCK does on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockStep {
    /// It stops at the target of the next taken branch: block stepping works.
    Works,
    /// It stops after every instruction, like PTRACE_SINGLESTEP.
    StepsEachInstruction,
    /// The probe could not run (the reason says why); single-step.
    Unavailable(String),
}

// A straight run of three instructions, then a jump over one: with a working
// branch trap, one block step from the start lands on `itrace_probe_target`.
std::arch::global_asm!(
    ".pushsection .text.itrace_probe,\"ax\",@progbits",
    ".globl itrace_probe_start",
    ".globl itrace_probe_target",
    "itrace_probe_start:",
    "nop",
    "nop",
    "nop",
    "jmp itrace_probe_target",
    "nop",
    "itrace_probe_target:",
    "nop",
    "mov eax, 60",
    "xor edi, edi",
    "syscall",
    ".popsection",
);

extern "C" {
    fn itrace_probe_start();
    fn itrace_probe_target();
}

/// The request number (arch/x86/include/uapi/asm/ptrace-abi.h); the libc crate lacks it.
pub const PTRACE_SINGLEBLOCK: libc::c_uint = 33;

/// A forked child stopped under ptrace with its pc at `itrace_probe_start`, for the start-up
/// probes (PTRACE_SINGLEBLOCK here, debug registers in `hwstep`); killed and reaped on drop.
pub(super) struct ProbeChild {
    pub pid: Pid,
    /// The addresses of `itrace_probe_start` and `itrace_probe_target`.
    pub start: u64,
    pub target: u64,
}

impl ProbeChild {
    pub(super) fn start() -> Result<ProbeChild, String> {
        let start = itrace_probe_start as *const () as usize as u64;
        let target = itrace_probe_target as *const () as usize as u64;
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the child only calls async-signal-safe functions before it is stopped and
        // moved onto the probe code, which exits with a raw system call.
        let pid = match unsafe { libc::fork() } {
            -1 => return Err("fork failed".into()),
            // SAFETY: in the child: prctl, getppid, PTRACE_TRACEME, raise and _exit are
            // async-signal-safe system calls.
            0 => unsafe {
                // Never left stopped and traced by nobody if itrace dies during the probe.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
                libc::raise(libc::SIGSTOP);
                libc::_exit(0);
            },
            pid => Pid::from_raw(pid),
        };
        let child = ProbeChild { pid, start, target };
        match wait_no_eintr(pid) {
            Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => {}
            other => return Err(format!("probe child did not stop: {other:?}")),
        }
        let mut regs = ptrace::getregs(pid).map_err(|e| format!("PTRACE_GETREGS failed: {e}"))?;
        regs.rip = start;
        ptrace::setregs(pid, regs).map_err(|e| format!("PTRACE_SETREGS failed: {e}"))?;
        Ok(child)
    }
}

impl Drop for ProbeChild {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        let _ = wait_no_eintr(self.pid);
    }
}

/// Probe PTRACE_SINGLEBLOCK with a forked child.
pub fn probe_singleblock() -> BlockStep {
    let child = match ProbeChild::start() {
        Ok(c) => c,
        Err(why) => return BlockStep::Unavailable(why),
    };
    let (pid, start, target) = (child.pid, child.start, child.target);
    // SAFETY: plain ptrace request on our stopped child; no pointers are passed.
    let r = unsafe { libc::ptrace(PTRACE_SINGLEBLOCK, pid.as_raw(), 0, 0) };
    if r != 0 {
        return BlockStep::Unavailable(format!("PTRACE_SINGLEBLOCK refused: {}", std::io::Error::last_os_error()));
    }
    match wait_no_eintr(pid) {
        Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => {}
        other => return BlockStep::Unavailable(format!("unexpected stop after a block step: {other:?}")),
    }
    match ptrace::getregs(pid) {
        Ok(r) if r.rip == target => BlockStep::Works,
        Ok(r) if r.rip == start + 1 => BlockStep::StepsEachInstruction,
        Ok(r) => BlockStep::Unavailable(format!("block step stopped at an unexpected pc {:#x}", r.rip)),
        Err(e) => BlockStep::Unavailable(format!("PTRACE_GETREGS failed: {e}")),
    }
}

/// waitpid, through the signals (Ctrl-C, the tick) that interrupt it.
pub(super) fn wait_no_eintr(pid: Pid) -> nix::Result<WaitStatus> {
    loop {
        match waitpid(pid, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r,
        }
    }
}
