//! x86 and x86_64 (iced-x86, whose `flow_control` is reliable in both modes).

use crate::{Flow, Insn};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};

/// Longest x86 instruction: read this many bytes to decode any of them.
pub const MAX_INSN_LEN: usize = 15;

/// Decode the instruction at `ip` from `bytes` (up to 15 bytes; fewer near the end of a mapping).
/// `bitness` is 64 for x86_64 and 32 for i386.
pub fn decode(bitness: u32, ip: u64, bytes: &[u8]) -> Insn {
    let mut d = Decoder::with_ip(bitness, bytes, ip, DecoderOptions::NONE);
    let mut i = Instruction::default();
    d.decode_out(&mut i);
    if i.is_invalid() {
        return Insn { len: i.len().max(1) as u8, flow: Flow::Invalid, target: None };
    }
    let flow = match i.flow_control() {
        FlowControl::Next | FlowControl::XbeginXabortXend => {
            if i.is_string_instruction() && (i.has_rep_prefix() || i.has_repne_prefix()) {
                Flow::RepString
            } else {
                Flow::Next
            }
        }
        FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => Flow::Jump,
        FlowControl::ConditionalBranch => Flow::CondJump,
        FlowControl::Return => match i.mnemonic() {
            Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq | Mnemonic::Uiret => Flow::Iret,
            Mnemonic::Sysret | Mnemonic::Sysretq | Mnemonic::Sysexit | Mnemonic::Sysexitq => Flow::Iret,
            _ => Flow::Return,
        },
        FlowControl::Call | FlowControl::IndirectCall => match i.mnemonic() {
            Mnemonic::Syscall | Mnemonic::Sysenter => Flow::Syscall,
            Mnemonic::Call => Flow::Call,
            // VMCALL and friends trap to a hypervisor: a transition, like a system call.
            _ => Flow::Syscall,
        },
        FlowControl::Interrupt => {
            if i.mnemonic() == Mnemonic::Int && i.immediate8() == 0x80 {
                Flow::Syscall
            } else {
                Flow::Interrupt
            }
        }
        FlowControl::Exception => Flow::Invalid,
    };
    let target = match i.op0_kind() {
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
            if matches!(flow, Flow::Jump | Flow::CondJump | Flow::Call) =>
        {
            Some(i.near_branch_target())
        }
        _ => None,
    };
    Insn { len: i.len() as u8, flow, target }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Encodings from the Intel SDM, checked with `objdump -d` on hand-assembled bytes.
    #[test]
    fn classifies_control_transfers() {
        let cases: &[(&[u8], u8, Flow)] = &[
            (&[0x90], 1, Flow::Next),                               // nop
            (&[0xf3, 0xa4], 2, Flow::RepString),                    // rep movsb
            (&[0xa4], 1, Flow::Next),                               // movsb without rep
            (&[0xf3, 0xc3], 2, Flow::Return),                       // rep ret: a return
            (&[0xc3], 1, Flow::Return),                             // ret
            (&[0xe8, 0, 0, 0, 0], 5, Flow::Call),                   // call next
            (&[0xff, 0xd0], 2, Flow::Call),                         // call *%rax
            (&[0xff, 0xe0], 2, Flow::Jump),                         // jmp *%rax
            (&[0xeb, 0xfe], 2, Flow::Jump),                         // jmp .
            (&[0x75, 0x02], 2, Flow::CondJump),                     // jne
            (&[0xe2, 0xfe], 2, Flow::CondJump),                     // loop
            (&[0x0f, 0x05], 2, Flow::Syscall),                      // syscall
            (&[0xcd, 0x80], 2, Flow::Syscall),                      // int $0x80
            (&[0xcc], 1, Flow::Interrupt),                          // int3
            (&[0x48, 0xcf], 2, Flow::Iret),                         // iretq
            (&[0x0f, 0x0b], 2, Flow::Invalid),                      // ud2
            (&[0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0], 8, Flow::Next), // mov 0x0,%rax
        ];
        for (bytes, len, flow) in cases {
            let i = decode(64, 0x1000, bytes);
            assert_eq!((i.len, i.flow), (*len, *flow), "{bytes:02x?}");
        }
        assert_eq!(decode(64, 0x1000, &[0x75, 0x02]).target, Some(0x1004));
        assert_eq!(decode(64, 0x1000, &[0xe8, 0, 0, 0, 0]).target, Some(0x1005));
        assert_eq!(decode(32, 0x1000, &[0xcd, 0x80]).flow, Flow::Syscall);
        assert_eq!(decode(32, 0x1000, &[0x0f, 0x34]).flow, Flow::Syscall); // sysenter
                                                                           // A truncated instruction is reported as invalid, never a panic.
        assert_eq!(decode(64, 0x1000, &[0x48]).flow, Flow::Invalid);
        assert_eq!(decode(64, 0x1000, &[]).flow, Flow::Invalid);
    }
}
