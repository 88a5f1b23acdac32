//! Does PTRACE_SINGLEBLOCK stop only at taken branches here? Many
//! hypervisors ignore the branch-trap flag (DEBUGCTL.BTF) and the request
//! then steps single instructions: find out by stepping a known sequence.

use super::probe_child::{wait_no_eintr, BlockStep, ProbeChild};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;

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

/// Where the probe sequence begins (`itrace_probe_start`).
pub(super) fn probe_start() -> u64 {
    itrace_probe_start as *const () as usize as u64
}

/// The instruction a working branch trap stops the first block step on (`itrace_probe_target`).
pub(super) fn probe_target() -> u64 {
    itrace_probe_target as *const () as usize as u64
}

/// Probe PTRACE_SINGLEBLOCK with a forked child.
pub fn probe_singleblock() -> BlockStep {
    let child = match ProbeChild::start(probe_start(), probe_target()) {
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
