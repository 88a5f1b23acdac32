//! Instruction decoding and classification for itrace: how long an
//! instruction is and how it transfers control. x86 and x86_64 use iced-x86;
//! PowerPC64 and s390x use capstone to decode and their own rules to
//! classify (capstone's groups do not tell calls from returns there).

pub mod ppc;
pub mod s390x;
pub mod text;
pub mod x86;

use itrace_format::BranchKind;

/// How an instruction transfers control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    /// A `rep`-prefixed string instruction: the trap flag stops once per
    /// iteration at the same address, but it is one instruction.
    RepString,
    /// Unconditional jump, direct or indirect.
    Jump,
    /// Conditional jump (Jcc, LOOP, JRCXZ): a branch only when taken.
    CondJump,
    Call,
    Return,
    /// Conditional call (PowerPC `bcl` with a condition): a CALL only when taken.
    CondCall,
    /// Conditional return (PowerPC `beqlr`, s390x `ber %r14`): a RETURN only when taken.
    CondReturn,
    /// System call instruction (`syscall`, `sysenter`, `int $0x80`).
    Syscall,
    /// Other software interrupt (`int3`, `int n`, `into`).
    Interrupt,
    /// Return from interrupt (`iret`).
    Iret,
    /// Undecodable or always-faulting instruction (`ud2`).
    Invalid,
}

impl Flow {
    /// The record kind when this instruction ends a block.
    pub fn branch_kind(self) -> BranchKind {
        match self {
            Flow::Next | Flow::RepString => BranchKind::Other,
            Flow::Jump => BranchKind::Jump,
            Flow::CondJump => BranchKind::CondJump,
            Flow::Call | Flow::CondCall => BranchKind::Call,
            Flow::Return | Flow::CondReturn => BranchKind::Return,
            Flow::Syscall | Flow::Interrupt => BranchKind::Intrpt,
            Flow::Iret => BranchKind::Iret,
            Flow::Invalid => BranchKind::Undefd,
        }
    }

    /// Whether executing it always ends a block (a branch even when it lands on the next instruction).
    pub fn always_branches(self) -> bool {
        matches!(self, Flow::Jump | Flow::Call | Flow::Return | Flow::Syscall | Flow::Interrupt | Flow::Iret)
    }
}

/// One decoded instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    /// Length in bytes.
    pub len: u8,
    pub flow: Flow,
    /// Target of a direct jump, call or conditional jump.
    pub target: Option<u64>,
}
