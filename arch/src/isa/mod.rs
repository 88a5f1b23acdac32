//! Instruction-set architectures: what a recorder needs to know about one ISA (decoding,
//! system call numbers, registers of a GDB stub) behind the small [`Arch`] trait, one module
//! per ISA.

pub mod ppc64;
pub mod s390x;
pub mod x86_64;

use itrace_decoders::Insn;

/// The implementation of the trace file's architecture `arch`.
pub fn for_arch(arch: itrace_format::Arch) -> Box<dyn Arch + Send + Sync> {
    use itrace_format::Arch as A;
    match arch {
        A::X86_64 => Box::new(x86_64::X86 { compat: false }),
        A::I386 => Box::new(x86_64::X86 { compat: true }),
        A::Ppc64le => Box::new(ppc64::Ppc64 { big_endian: false }),
        A::Ppc64 => Box::new(ppc64::Ppc64 { big_endian: true }),
        A::S390x => Box::new(s390x::S390x),
    }
}

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
    /// A system call that returns from a signal handler to the interrupted code.
    fn is_sigreturn(&self, nr: u64) -> bool {
        nr == self.rt_sigreturn_nr()
    }
    /// Register names, byte order and stepping quirks for a GDB remote stub.
    fn remote(&self) -> RemoteInfo;
    /// A system call number encoded in the instruction itself (s390x `svc N` with N > 0),
    /// rather than in [`RemoteInfo::syscall_nr_reg`].
    fn syscall_nr_in_insn(&self, _bytes: &[u8]) -> Option<u64> {
        None
    }
    /// Whether the instruction starts or ends a load-reserve/store-conditional sequence
    /// (PowerPC), which single-stepping never completes.
    fn reservation(&self, _bytes: &[u8]) -> Reservation {
        Reservation::None
    }
}

/// What a GDB remote-protocol recorder needs to know about an architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteInfo {
    /// The program counter's name in the stub's target description.
    pub pc_reg: &'static str,
    /// The register holding the system call number at the system call instruction.
    pub syscall_nr_reg: &'static str,
    /// The registers of a system call's six arguments, and of its result.
    pub syscall_arg_regs: [&'static str; 6],
    pub syscall_ret_reg: &'static str,
    /// The calls that open and map files: followed to learn the mappings a stub cannot list.
    pub mapping_calls: MappingCalls,
    /// System calls that set a signal's handler from a `struct sigaction` whose first word is
    /// the handler (`rt_sigaction`, and i386's old `sigaction`): a signal is delivered by a
    /// continue to a breakpoint on its handler.
    pub sigaction_nrs: &'static [u64],
    /// Function pointers point to descriptors whose first word is the code address (ELFv1).
    pub function_descriptors: bool,
    /// Registers and code are big-endian.
    pub big_endian: bool,
    /// The `kind` of a software breakpoint (`Z0,addr,kind`): its instruction length.
    pub breakpoint_kind: u8,
    /// Single-stepping the system call instruction also runs the one after it (qemu-user's stub
    /// on PowerPC `sc` and i386 `int $0x80`): step over it with a breakpoint instead.
    pub step_runs_past_syscall: bool,
}

/// System call numbers of one architecture that open, close and map files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappingCalls {
    pub open: u64,
    pub openat: u64,
    pub close: u64,
    /// `mmap`, or i386's `mmap2` (offset in 4096-byte units: `mmap_offset_unit`).
    pub mmap: u64,
    pub mmap_offset_unit: u64,
    /// The six arguments are in memory at the first argument (s390x's `mmap`).
    pub mmap_args_in_memory: bool,
}

/// Role of an instruction in an atomic load-reserve/store-conditional sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    None,
    /// `lwarx`, `ldarx`, ...: starts a sequence.
    Load,
    /// `stwcx.`, `stdcx.`, ...: ends it.
    Store,
}
