//! s390x (z/Architecture, big-endian): system call numbers and GDB register
//! names. Decoding is in `itrace_decoders::s390x`. qemu-user's stub steps
//! `svc` correctly (unlike PowerPC `sc`).

use super::{Arch, MappingCalls, RemoteInfo};
use itrace_decoders::{s390x, Insn};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct S390x;

/// System call numbers (arch/s390/kernel/syscalls/syscall.tbl, 64-bit column).
mod nr {
    pub const EXIT: u64 = 1;
    pub const MMAP: u64 = 90;
    pub const MUNMAP: u64 = 91;
    pub const IPC: u64 = 117;
    pub const MPROTECT: u64 = 125;
    pub const MREMAP: u64 = 163;
    pub const PRCTL: u64 = 172;
    pub const RT_SIGRETURN: u64 = 173;
    pub const EXIT_GROUP: u64 = 248;
    pub const PKEY_MPROTECT: u64 = 384;
    pub const SHMAT: u64 = 397;
    pub const SHMDT: u64 = 398;
}

impl Arch for S390x {
    fn trace_arch(&self) -> itrace_format::Arch {
        itrace_format::Arch::S390x
    }

    fn max_insn_len(&self) -> usize {
        s390x::MAX_INSN_LEN
    }

    fn decode(&self, pc: u64, bytes: &[u8]) -> Insn {
        s390x::decode(pc, bytes)
    }

    fn is_exit_syscall(&self, n: u64) -> bool {
        n == nr::EXIT || n == nr::EXIT_GROUP
    }

    fn changes_mappings(&self, n: u64) -> bool {
        use nr::*;
        matches!(n, MMAP | MUNMAP | MPROTECT | MREMAP | IPC | SHMAT | SHMDT | PKEY_MPROTECT)
    }

    fn may_rename(&self, n: u64) -> bool {
        n == nr::PRCTL
    }

    fn rt_sigreturn_nr(&self) -> u64 {
        nr::RT_SIGRETURN
    }

    fn remote(&self) -> RemoteInfo {
        RemoteInfo {
            // The PSW's address half.
            pc_reg: "pswa",
            // `svc 0` takes the number from r1; `svc N` encodes it.
            syscall_nr_reg: "r1",
            syscall_arg_regs: ["r2", "r3", "r4", "r5", "r6", "r7"],
            syscall_ret_reg: "r2",
            mapping_calls: MappingCalls {
                open: 5,
                openat: 288,
                close: 6,
                mmap: nr::MMAP,
                mmap_offset_unit: 1,
                mmap_args_in_memory: true,
            },
            sigaction_nrs: &[174],
            function_descriptors: false,
            big_endian: true,
            breakpoint_kind: 2,
            step_runs_past_syscall: false,
        }
    }

    fn syscall_nr_in_insn(&self, bytes: &[u8]) -> Option<u64> {
        s390x::svc_immediate(bytes).filter(|&n| n != 0).map(u64::from)
    }
}
