//! x86 and x86_64 (iced-x86, whose `flow_control` is reliable in both modes).

use crate::{Flow, Insn};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, MemorySize, Mnemonic, OpKind, Register};

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

/// The general registers in the order of their encoding: rax, rcx, rdx, rbx, rsp, rbp, rsi,
/// rdi, r8 to r15 (numbers 0 to 15).
const GPRS: [Register; 16] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RBX,
    Register::RSP,
    Register::RBP,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// The number (0 to 15, [`GPRS`]) of a general register of the mode's width.
fn gpr_number(r: Register, bitness: u32) -> Option<u8> {
    let wide = match bitness {
        64 => r.is_gpr64(),
        _ => r.is_gpr32(),
    };
    if !wide {
        return None;
    }
    GPRS.iter().position(|&g| g == r.full_register()).map(|n| n as u8)
}

/// The segment whose base an address adds (the others have base 0 in Linux user space).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentBase {
    None,
    Fs,
    Gs,
}

/// Where a near indirect `jmp` or `call` takes its target from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndirectSource {
    /// A general register, by number (rax 0 ... r15 15).
    Register(u8),
    /// Memory of the mode's width at segment base + base + index * scale + displacement; a
    /// RIP-relative operand has its address in the displacement, and no base.
    Memory { segment: SegmentBase, base: Option<u8>, index: Option<u8>, scale: u8, displacement: u64 },
}

/// A near indirect `jmp` or `call` whose target can be computed from registers and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indirect {
    pub call: bool,
    pub source: IndirectSource,
    /// 64 or 32: the width of registers, addresses and the target.
    pub bitness: u32,
}

impl Indirect {
    /// The target, given the general registers by number, the FS and GS bases, and a reader of
    /// memory (`bytes` little-endian bytes at an address); `None` where memory cannot be read.
    pub fn target(
        &self,
        reg: impl Fn(u8) -> u64,
        segment_base: impl Fn(SegmentBase) -> u64,
        mut read: impl FnMut(u64, usize) -> Option<u64>,
    ) -> Option<u64> {
        let mask = if self.bitness == 64 { u64::MAX } else { 0xffff_ffff };
        match self.source {
            IndirectSource::Register(n) => Some(reg(n) & mask),
            IndirectSource::Memory { segment, base, index, scale, displacement } => {
                let mut addr = displacement;
                if let Some(b) = base {
                    addr = addr.wrapping_add(reg(b));
                }
                if let Some(i) = index {
                    addr = addr.wrapping_add(reg(i).wrapping_mul(scale as u64));
                }
                let addr = (addr & mask).wrapping_add(segment_base(segment));
                read(addr & mask, (self.bitness / 8) as usize).map(|v| v & mask)
            }
        }
    }
}

/// What an indirect near `jmp`/`call` at `ip` (in `bytes`) reads its target from; `None` for
/// any other instruction, for far or 16-bit forms, and for an operand this does not model.
pub fn indirect(bitness: u32, ip: u64, bytes: &[u8]) -> Option<Indirect> {
    let mut d = Decoder::with_ip(bitness, bytes, ip, DecoderOptions::NONE);
    let mut i = Instruction::default();
    d.decode_out(&mut i);
    let call = match (i.flow_control(), i.mnemonic()) {
        (FlowControl::IndirectBranch, Mnemonic::Jmp) => false,
        (FlowControl::IndirectCall, Mnemonic::Call) => true,
        _ => return None,
    };
    // Operand- and address-size prefixes: 16-bit targets (which Intel and AMD CPUs treat
    // differently in 64-bit mode) and 16- or 32-bit addresses are left to a step.
    let prefixes = &bytes[..bytes.iter().position(|&b| b == 0xff).unwrap_or(0)];
    if i.op_count() != 1 || prefixes.iter().any(|&b| b == 0x66 || b == 0x67) {
        return None;
    }
    let source = match i.op0_kind() {
        OpKind::Register => IndirectSource::Register(gpr_number(i.op0_register(), bitness)?),
        OpKind::Memory => {
            let width = if bitness == 64 { MemorySize::QwordOffset } else { MemorySize::DwordOffset };
            if i.memory_size() != width {
                return None; // far (m16:32, m16:64) or 16-bit
            }
            let segment = match i.memory_segment() {
                Register::FS => SegmentBase::Fs,
                Register::GS => SegmentBase::Gs,
                _ => SegmentBase::None,
            };
            let rip_relative = i.is_ip_rel_memory_operand();
            let base = match i.memory_base() {
                Register::None => None,
                _ if rip_relative => None,
                r => Some(gpr_number(r, bitness)?),
            };
            let index = match i.memory_index() {
                Register::None => None,
                r => Some(gpr_number(r, bitness)?),
            };
            let displacement = if rip_relative { i.ip_rel_memory_address() } else { i.memory_displacement64() };
            IndirectSource::Memory { segment, base, index, scale: i.memory_index_scale() as u8, displacement }
        }
        _ => return None,
    };
    Some(Indirect { call, source, bitness })
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

    /// Encodings checked with `objdump -d` (binutils) on the bytes.
    #[test]
    fn indirect_operands() {
        let regs = |n: u8| 0x1000 * (n as u64 + 1); // rax 0x1000, rcx 0x2000, ..., rsp 0x5000
        let mem = |addr: u64, size: usize| Some(addr.wrapping_mul(3) & if size == 8 { u64::MAX } else { 0xffff_ffff });
        let fs = |s: SegmentBase| if s == SegmentBase::Fs { 0x7000_0000 } else { 0 };
        let t = |bits: u32, bytes: &[u8]| indirect(bits, 0x40_0000, bytes).and_then(|i| i.target(regs, fs, mem));
        // ff e0: jmp *%rax
        assert_eq!(indirect(64, 0, &[0xff, 0xe0]).map(|i| i.call), Some(false));
        assert_eq!(t(64, &[0xff, 0xe0]), Some(0x1000));
        // 41 ff d3: call *%r11
        assert_eq!(indirect(64, 0, &[0x41, 0xff, 0xd3]).map(|i| i.call), Some(true));
        assert_eq!(t(64, &[0x41, 0xff, 0xd3]), Some(0xc000));
        // f2 ff 25 fa 2f 00 00: bnd jmp *0x2ffa(%rip) (a PLT entry): at 0x400000+7+0x2ffa
        assert_eq!(t(64, &[0xf2, 0xff, 0x25, 0xfa, 0x2f, 0, 0]), Some((0x40_0007 + 0x2ffa) * 3));
        // ff 54 c3 08: call *0x8(%rbx,%rax,8)
        assert_eq!(t(64, &[0xff, 0x54, 0xc3, 0x08]), Some((0x4000 + 0x1000 * 8 + 8) * 3));
        // 64 ff 24 25 10 00 00 00: jmp *%fs:0x10
        assert_eq!(t(64, &[0x64, 0xff, 0x24, 0x25, 0x10, 0, 0, 0]), Some((0x7000_0010u64) * 3));
        // 32-bit: ff 24 85 00 10 00 00: jmp *0x1000(,%eax,4)
        assert_eq!(t(32, &[0xff, 0x24, 0x85, 0, 0x10, 0, 0]), Some(((0x1000 + 0x4000) * 3) & 0xffff_ffff));
        // Not modelled: far jmp *(%rax) (48 ff 28: ljmp m16:64), 16-bit jmp *%ax, ret, direct call.
        assert_eq!(indirect(64, 0, &[0x48, 0xff, 0x28]), None);
        assert_eq!(indirect(64, 0, &[0x66, 0xff, 0xe0]), None);
        assert_eq!(indirect(64, 0, &[0xc3]), None);
        assert_eq!(indirect(64, 0, &[0xe8, 0, 0, 0, 0]), None);
    }
}
