//! PowerPC64, little-endian (ELFv2) and big-endian (ELFv1, function
//! descriptors in `.opd`): system call numbers, GDB register names and the
//! stepping quirks of qemu-user's stub. Decoding is in
//! `itrace_decoders::ppc`.

use super::{Arch, MappingCalls, RemoteInfo, Reservation};
use itrace_decoders::{ppc, Insn};

/// PowerPC64 in one byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ppc64 {
    pub big_endian: bool,
}

/// System call numbers (arch/powerpc/include/uapi/asm/unistd.h, the same for both byte orders).
mod nr {
    pub const EXIT: u64 = 1;
    pub const MMAP: u64 = 90;
    pub const MUNMAP: u64 = 91;
    pub const IPC: u64 = 117;
    pub const MPROTECT: u64 = 125;
    pub const MREMAP: u64 = 163;
    pub const PRCTL: u64 = 171;
    pub const RT_SIGRETURN: u64 = 172;
    pub const EXIT_GROUP: u64 = 234;
    pub const PKEY_MPROTECT: u64 = 386;
    pub const SHMAT: u64 = 397;
    pub const SHMDT: u64 = 398;
}

impl Arch for Ppc64 {
    fn trace_arch(&self) -> itrace_format::Arch {
        if self.big_endian {
            itrace_format::Arch::Ppc64
        } else {
            itrace_format::Arch::Ppc64le
        }
    }

    fn max_insn_len(&self) -> usize {
        ppc::MAX_INSN_LEN
    }

    fn decode(&self, pc: u64, bytes: &[u8]) -> Insn {
        ppc::decode(self.big_endian, pc, bytes)
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
            pc_reg: "pc",
            // The ELF ABI passes the system call number in r0.
            syscall_nr_reg: "r0",
            syscall_arg_regs: ["r3", "r4", "r5", "r6", "r7", "r8"],
            syscall_ret_reg: "r3",
            mapping_calls: MappingCalls {
                open: 5,
                openat: 286,
                close: 6,
                mmap: nr::MMAP,
                mmap_offset_unit: 1,
                mmap_args_in_memory: false,
            },
            sigaction_nrs: &[173],
            // Big-endian PowerPC64 is ELFv1 here (Debian's powerpc64-linux-gnu).
            function_descriptors: self.big_endian,
            big_endian: self.big_endian,
            breakpoint_kind: 4,
            step_runs_past_syscall: true,
        }
    }

    fn reservation(&self, bytes: &[u8]) -> Reservation {
        match ppc::word(self.big_endian, bytes) {
            Some(w) if ppc::is_load_reserve(w) => Reservation::Load,
            Some(w) if ppc::is_store_conditional(w) => Reservation::Store,
            _ => Reservation::None,
        }
    }
}
