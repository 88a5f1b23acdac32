//! Instructions as text, for listings (`itrace annotate --asm`): iced-x86's Intel syntax on
//! x86, capstone's on PowerPC64 and s390x.

use crate::Flow;
use capstone::arch::{BuildsCapstone, BuildsCapstoneEndian};
use capstone::Capstone;
use iced_x86::{Decoder, DecoderOptions, FlowControl, Formatter, IntelFormatter};
use itrace_format::Arch;

/// One instruction as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Length in bytes.
    pub len: usize,
    /// The instruction, as objdump prints it (Intel syntax on x86).
    pub text: String,
    /// The target of a direct branch or call, when the text ends with it.
    pub target: Option<u64>,
    /// A conditional branch, call or return.
    pub conditional: bool,
}

/// Decodes instructions of one architecture into text.
pub struct Disassembler {
    arch: Arch,
    /// capstone's handle for PowerPC64 and s390x (None on x86, or when capstone cannot be set up).
    capstone: Option<Capstone>,
    intel: IntelFormatter,
}

impl Disassembler {
    pub fn new(arch: Arch) -> Self {
        use capstone::arch::{ppc, sysz};
        let capstone = match arch {
            Arch::Ppc64le | Arch::Ppc64 => {
                let endian = if arch == Arch::Ppc64 { capstone::Endian::Big } else { capstone::Endian::Little };
                Capstone::new().ppc().mode(ppc::ArchMode::Mode64).endian(endian).build().ok()
            }
            Arch::S390x => Capstone::new().sysz().mode(sysz::ArchMode::Default).build().ok(),
            Arch::X86_64 | Arch::I386 => None,
        };
        let mut intel = IntelFormatter::new();
        // As objdump and perf print them: `jl 0x401150`, `lea rdi, [rdi-1]`.
        let o = intel.options_mut();
        o.set_hex_prefix("0x");
        o.set_hex_suffix("");
        o.set_uppercase_hex(false);
        o.set_leading_zeros(false);
        o.set_branch_leading_zeros(false);
        o.set_space_after_operand_separator(true);
        o.set_show_branch_size(false);
        Disassembler { arch, capstone, intel }
    }

    /// The instruction at the start of `bytes` (at address `pc`): its length and its text;
    /// None when it does not decode.
    pub fn disassemble(&mut self, pc: u64, bytes: &[u8]) -> Option<(usize, String)> {
        self.list(pc, bytes).map(|l| (l.len, l.text))
    }

    /// The instruction at the start of `bytes` (at address `pc`), with its branch target;
    /// None when it does not decode.
    pub fn list(&mut self, pc: u64, bytes: &[u8]) -> Option<Listed> {
        match self.arch {
            Arch::X86_64 | Arch::I386 => {
                let bitness = if self.arch == Arch::I386 { 32 } else { 64 };
                let mut decoder = Decoder::with_ip(bitness, bytes, pc, DecoderOptions::NONE);
                let insn = decoder.decode();
                if insn.is_invalid() {
                    return None;
                }
                let mut text = String::new();
                self.intel.format(&insn, &mut text);
                let flow = insn.flow_control();
                // An indirect branch has no near target (0); `loop`, `jrcxz` and `xbegin` have one.
                let target = Some(insn.near_branch_target()).filter(|&t| t != 0 && text.ends_with(&format!("0x{t:x}")));
                Some(Listed { len: insn.len(), text, target, conditional: flow == FlowControl::ConditionalBranch })
            }
            _ => {
                let cs = self.capstone.as_ref()?;
                let insns = cs.disasm_count(bytes, pc, 1).ok()?;
                let insn = insns.iter().next()?;
                let text = match (insn.mnemonic(), insn.op_str()) {
                    (Some(m), Some(ops)) if !ops.is_empty() => format!("{m} {ops}"),
                    (Some(m), _) => m.to_string(),
                    (None, _) => return None,
                };
                // Branches as the recorders classify them (capstone's groups do not say).
                let class = match self.arch {
                    Arch::S390x => crate::s390x::decode(pc, bytes),
                    _ => crate::ppc::decode(self.arch == Arch::Ppc64, pc, bytes),
                };
                let conditional = matches!(class.flow, Flow::CondJump | Flow::CondCall | Flow::CondReturn);
                let target = class.target.filter(|&t| text.ends_with(&format!("0x{t:x}")));
                Some(Listed { len: insn.len(), text, target, conditional })
            }
        }
    }
}
