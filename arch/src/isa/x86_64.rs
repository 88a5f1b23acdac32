//! x86_64 (and 32-bit x86 processes on an x86_64 kernel): registers as
//! ptrace shows them, system call numbers, and decoding with iced-x86.

use super::{Arch, MappingCalls, RemoteInfo};
use itrace_decoders::{x86, Insn};

/// The x86_64 architecture, or a 32-bit x86 process running on it (`compat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct X86 {
    /// A 32-bit process: iced decodes in 32-bit mode and system calls use i386 numbers.
    pub compat: bool,
}

/// Code segment selector of 32-bit user code on x86_64 Linux (`__USER32_CS`).
const USER32_CS: u64 = 0x23;

impl X86 {
    /// The flavour a thread runs in, from its code segment register.
    pub fn from_cs(cs: u64) -> Self {
        X86 { compat: cs == USER32_CS }
    }
}

/// Kernel return codes that mean "this system call will be restarted" (include/linux/errno.h).
pub const RESTART_CODES: [i64; 4] = [-512, -513, -514, -516];

mod nr64 {
    pub const MMAP: u64 = 9;
    pub const MPROTECT: u64 = 10;
    pub const MUNMAP: u64 = 11;
    pub const MREMAP: u64 = 25;
    pub const SHMAT: u64 = 30;
    pub const SHMDT: u64 = 67;
    pub const EXIT: u64 = 60;
    pub const PRCTL: u64 = 157;
    pub const EXIT_GROUP: u64 = 231;
    pub const PKEY_MPROTECT: u64 = 329;
}

mod nr32 {
    pub const EXIT: u64 = 1;
    pub const MUNMAP: u64 = 91;
    pub const MPROTECT: u64 = 125;
    pub const MREMAP: u64 = 163;
    pub const MMAP: u64 = 90;
    pub const MMAP2: u64 = 192;
    pub const PRCTL: u64 = 172;
    pub const EXIT_GROUP: u64 = 252;
    pub const IPC: u64 = 117;
    pub const SHMAT: u64 = 397;
    pub const SHMDT: u64 = 398;
    pub const PKEY_MPROTECT: u64 = 380;
}

impl Arch for X86 {
    fn trace_arch(&self) -> itrace_format::Arch {
        if self.compat {
            itrace_format::Arch::I386
        } else {
            itrace_format::Arch::X86_64
        }
    }

    fn max_insn_len(&self) -> usize {
        x86::MAX_INSN_LEN
    }

    fn decode(&self, pc: u64, bytes: &[u8]) -> Insn {
        x86::decode(if self.compat { 32 } else { 64 }, pc, bytes)
    }

    fn is_exit_syscall(&self, nr: u64) -> bool {
        if self.compat {
            nr == nr32::EXIT || nr == nr32::EXIT_GROUP
        } else {
            nr == nr64::EXIT || nr == nr64::EXIT_GROUP
        }
    }

    fn changes_mappings(&self, nr: u64) -> bool {
        if self.compat {
            use nr32::*;
            matches!(nr, MMAP | MMAP2 | MUNMAP | MPROTECT | MREMAP | IPC | SHMAT | SHMDT | PKEY_MPROTECT)
        } else {
            use nr64::*;
            matches!(nr, MMAP | MUNMAP | MPROTECT | MREMAP | SHMAT | SHMDT | PKEY_MPROTECT)
        }
    }

    fn sends_signal(&self, nr: u64) -> bool {
        if self.compat {
            matches!(nr, 37 | 238 | 270 | 178 | 335)
        } else {
            matches!(nr, 62 | 200 | 234 | 129 | 297)
        }
    }

    fn rt_sigreturn_nr(&self) -> u64 {
        if self.compat {
            173
        } else {
            15
        }
    }

    fn is_sigreturn(&self, nr: u64) -> bool {
        // i386 also has the old sigreturn (119), used by handlers installed without SA_SIGINFO.
        nr == self.rt_sigreturn_nr() || (self.compat && nr == 119)
    }

    fn may_rename(&self, nr: u64) -> bool {
        nr == if self.compat { nr32::PRCTL } else { nr64::PRCTL }
    }

    fn remote(&self) -> RemoteInfo {
        RemoteInfo {
            pc_reg: if self.compat { "eip" } else { "rip" },
            syscall_nr_reg: if self.compat { "eax" } else { "rax" },
            syscall_arg_regs: if self.compat {
                ["ebx", "ecx", "edx", "esi", "edi", "ebp"]
            } else {
                ["rdi", "rsi", "rdx", "r10", "r8", "r9"]
            },
            syscall_ret_reg: if self.compat { "eax" } else { "rax" },
            mapping_calls: if self.compat {
                MappingCalls {
                    open: 5,
                    openat: 295,
                    close: 6,
                    mmap: nr32::MMAP2,
                    mmap_offset_unit: 4096,
                    mmap_args_in_memory: false,
                }
            } else {
                MappingCalls {
                    open: 2,
                    openat: 257,
                    close: 3,
                    mmap: nr64::MMAP,
                    mmap_offset_unit: 1,
                    mmap_args_in_memory: false,
                }
            },
            sigaction_nrs: if self.compat { &[174, 67] } else { &[13] },
            function_descriptors: false,
            big_endian: false,
            breakpoint_kind: 1,
            // qemu-i386's stub runs the instruction after `int $0x80` too when stepping it.
            step_runs_past_syscall: self.compat,
        }
    }
}
