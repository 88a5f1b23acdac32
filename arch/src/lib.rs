//! Per-architecture recording backends for itrace.
//!
//! Each architecture's knowledge (instruction decoding, system call
//! numbers, register layout) sits in its own module behind the small
//! [`Arch`] trait; the Linux ptrace stepping engine in [`ptrace`] is written
//! once against that trait.

pub mod ptrace;
pub mod x86_64;

use itrace_decoders::Insn;

/// What a recorder needs to know about one instruction-set architecture.
pub trait Arch {
    /// The architecture code written in the trace header.
    fn trace_arch(&self) -> itrace_format::Arch;
    /// Bytes to read at a pc to decode any instruction there.
    fn max_insn_len(&self) -> usize;
    /// Decode and classify the instruction at `pc`.
    fn decode(&self, pc: u64, bytes: &[u8]) -> Insn;
    /// System calls after which a thread never returns to user space (exit, exit_group).
    fn is_exit_syscall(&self, nr: u64) -> bool;
    /// System calls that can add, remove or change executable mappings.
    fn changes_mappings(&self, nr: u64) -> bool;
    /// System calls that may change a thread's name (prctl).
    fn may_rename(&self, nr: u64) -> bool;
    /// System calls that send a signal (kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo):
    /// a SIGTRAP sent that way must be told from a step trap. Backends that cannot mix them
    /// up (no single-step SIGTRAP) keep the default.
    fn sends_signal(&self, _nr: u64) -> bool {
        false
    }
    /// The number of rt_sigreturn, which the kernel hides (it clears the saved number so the
    /// interrupted call is not restarted).
    fn rt_sigreturn_nr(&self) -> u64;
}
