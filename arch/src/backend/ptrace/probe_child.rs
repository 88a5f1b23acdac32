//! The start-up probes' child: a forked process stopped under ptrace with its pc moved onto a
//! probe sequence, to see what a ptrace request really does on this machine (block stepping,
//! debug registers) before recording relies on it. Each architecture brings its sequence.

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

/// What PTRACE_SINGLEBLOCK does on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockStep {
    /// It stops after branches, as the architecture's probe expects: block stepping works.
    Works,
    /// It stops after every instruction, like PTRACE_SINGLESTEP.
    StepsEachInstruction,
    /// The probe could not run, or the stops were not the expected ones (the reason says why);
    /// single-step.
    Unavailable(String),
}

/// A forked child stopped under ptrace with its pc at `start`; killed and reaped on drop.
pub struct ProbeChild {
    pub pid: Pid,
    /// Where its probe sequence begins, and the stop the probe expects of it.
    pub start: u64,
    pub target: u64,
}

impl ProbeChild {
    /// Fork the child, wait for its stop and move its pc to `start` (code mapped in this
    /// process before the fork, so the child has it at the same address).
    pub fn start(start: u64, target: u64) -> Result<ProbeChild, String> {
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
        super::arch::set_pc(pid.as_raw(), start).map_err(|e| format!("setting the probe child's pc failed: {e}"))?;
        Ok(child)
    }
}

impl Drop for ProbeChild {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        let _ = wait_no_eintr(self.pid);
    }
}

/// waitpid, through the signals (Ctrl-C, the tick) that interrupt it.
pub fn wait_no_eintr(pid: Pid) -> nix::Result<WaitStatus> {
    loop {
        match waitpid(pid, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r,
        }
    }
}
