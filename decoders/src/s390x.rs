//! s390x (z/Architecture, big-endian): the length comes from the first two
//! bits of the opcode (00: 2 bytes, 01/10: 4, 11: 6), capstone checks that
//! the instruction decodes, and the branch class comes from the opcode,
//! because capstone 5 gives `brasl`, `bras`, `basr` and `svc` no group and
//! calls `nopr` a jump.
//!
//! Rules (z/Architecture Principles of Operation, ch. 7): `bras`, `brasl`,
//! `basr`, `bas`, `balr`, `bal` are calls (`basr`/`balr` with R2 = 0 do not
//! branch); `bcr 15,%r14` (`br %r14`) is a return **by convention** (the
//! ABI's return address register; the hardware has no return instruction);
//! `bc`/`bcr`/`brc`/`brcl` are jumps, conditional unless the mask is 15,
//! never branches with mask 0 (`nop`, `nopr`); branch-on-count,
//! branch-on-index and compare-and-branch are conditional jumps; `svc` is a
//! system call.

use crate::{Flow, Insn};
use capstone::arch::sysz::ArchMode;
use capstone::arch::BuildsCapstone;
use capstone::Capstone;
use std::cell::RefCell;

/// Longest s390x instruction.
pub const MAX_INSN_LEN: usize = 6;

/// The register that holds the return address by the s390x ELF ABI.
const RETURN_ADDRESS_REG: u8 = 14;

thread_local! {
    /// A capstone handle (built lazily; not shareable between threads).
    static CAPSTONE: RefCell<Option<Capstone>> = const { RefCell::new(None) };
}

/// Instruction length from the first opcode byte.
pub fn insn_len(first: u8) -> u8 {
    match first >> 6 {
        0 => 2,
        1 | 2 => 4,
        _ => 6,
    }
}

fn capstone_decodes(pc: u64, bytes: &[u8]) -> Option<bool> {
    CAPSTONE.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Capstone::new().sysz().mode(ArchMode::Default).build().ok();
        }
        let cs = c.as_ref()?;
        Some(cs.disasm_count(bytes, pc, 1).map(|i| i.len() == 1).unwrap_or(false))
    })
}

/// A mask-controlled branch: never (mask 0), always (15) or conditional.
fn by_mask(mask: u8, always: Flow, cond: Flow) -> Flow {
    match mask {
        0 => Flow::Next,
        15 => always,
        _ => cond,
    }
}

/// Decode and classify the instruction at `pc`.
pub fn decode(pc: u64, bytes: &[u8]) -> Insn {
    let Some(&b0) = bytes.first() else {
        return Insn { len: 2, flow: Flow::Invalid, target: None };
    };
    let len = insn_len(b0);
    if bytes.len() < len as usize {
        return Insn { len, flow: Flow::Invalid, target: None };
    }
    let b1 = bytes[1];
    let (r1, r2) = (b1 >> 4, b1 & 15);
    // Relative offsets count halfwords.
    let rel16 = || pc.wrapping_add((i16::from_be_bytes([bytes[2], bytes[3]]) as i64 * 2) as u64);
    let rel32 = || pc.wrapping_add((i32::from_be_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]) as i64 * 2) as u64);
    let (flow, target) = match b0 {
        0x07 if r2 == 0 => (Flow::Next, None), // bcr M,0: serialization, no branch
        0x07 if r2 == RETURN_ADDRESS_REG => (by_mask(r1, Flow::Return, Flow::CondReturn), None),
        0x07 => (by_mask(r1, Flow::Jump, Flow::CondJump), None), // br %rN, bcr
        0x47 => (by_mask(r1, Flow::Jump, Flow::CondJump), None), // b D(X,B), bc
        0x05 | 0x0d if r2 == 0 => (Flow::Next, None),            // balr/basr R1,0: load the pc
        0x05 | 0x0d => (Flow::Call, None),                       // balr, basr
        0x45 | 0x4d => (Flow::Call, None),                       // bal, bas
        0x06 if r2 == 0 => (Flow::Next, None),                   // bctr R1,0: decrement only
        0x06 | 0x46 | 0x86 | 0x87 => (Flow::CondJump, None),     // bctr, bct, bxh, bxle
        0x0a => (Flow::Syscall, None),                           // svc
        0xa7 => match r2 {
            0x4 => (by_mask(r1, Flow::Jump, Flow::CondJump), Some(rel16())), // brc, j, je
            0x5 => (Flow::Call, Some(rel16())),                              // bras
            0x6 | 0x7 => (Flow::CondJump, Some(rel16())),                    // brct, brctg
            _ => (Flow::Next, None),
        },
        0xc0 => match r2 {
            0x4 => (by_mask(r1, Flow::Jump, Flow::CondJump), Some(rel32())), // brcl, jg
            0x5 => (Flow::Call, Some(rel32())),                              // brasl
            _ => (Flow::Next, None),
        },
        0x84 | 0x85 => (Flow::CondJump, Some(rel16())), // brxh, brxle
        0xcc if r2 == 0x6 => (Flow::CondJump, Some(rel32())), // brcth
        0xec => match bytes[5] {
            // brxhg, brxlg; compare and branch relative (crj, cgrj, clrj, clgrj, cij, cgij, clij, clgij)
            0x44 | 0x45 | 0x76 | 0x64 | 0x77 | 0x65 | 0x7e | 0x7c | 0x7f | 0x7d => (Flow::CondJump, Some(rel16())),
            // compare and branch to an address (crb, cgrb, clrb, clgrb, cib, cgib, clib, clgib)
            0xf6 | 0xe4 | 0xf7 | 0xe5 | 0xfe | 0xfc | 0xff | 0xfd => (Flow::CondJump, None),
            _ => (Flow::Next, None),
        },
        0xeb if matches!(bytes[5], 0x44 | 0x45) => (Flow::CondJump, None), // bxhg, bxleg
        0xe3 if bytes[5] == 0x46 => (Flow::CondJump, None),                // bctg
        0xe3 if bytes[5] == 0x47 => (by_mask(r1, Flow::Jump, Flow::CondJump), None), // bic
        0xb2 if b1 == 0xb2 => (Flow::Iret, None),                          // lpswe
        _ => (Flow::Next, None),
    };
    // Branch encodings above are decoded by their fixed fields; everything else must be a real
    // instruction for capstone, or it is reported invalid (it would raise SIGILL).
    if flow == Flow::Next && capstone_decodes(pc, &bytes[..len as usize]) == Some(false) {
        return Insn { len, flow: Flow::Invalid, target: None };
    }
    // A relative branch with mask 0 (`jnop`, `jgnop`) never branches: no target either.
    let target = if flow == Flow::Next { None } else { target };
    Insn { len, flow, target }
}

/// The immediate of an `svc` instruction (the system call number when non-zero; `svc 0` takes it from %r1).
pub fn svc_immediate(bytes: &[u8]) -> Option<u8> {
    match bytes {
        [0x0a, imm, ..] => Some(*imm),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pc, instruction bytes, objdump's text, expected class, expected target.
    type Case = (u64, &'static [u8], &'static str, Flow, Option<u64>);

    /// Bytes from `s390x-linux-gnu-objdump -d` of the test programs (tests/programs/cross:
    /// s390x-libc, s390x-asm), with objdump's text.
    #[test]
    fn classifies_real_instructions() {
        let cases: &[Case] = &[
            (0x10014cc, &[0x47, 0xf1, 0x20, 0x00], "b 0(%r1,%r2)", Flow::Jump, None),
            (0x10003c4, &[0x07, 0xf4], "br %r4", Flow::Jump, None),
            (0x10003b6, &[0x0d, 0xe1], "basr %r14,%r1", Flow::Call, None),
            (0x10003d6, &[0x0d, 0x10], "basr %r1,%r0", Flow::Next, None),
            (0x10008a0, &[0x07, 0x8e], "ber %r14", Flow::CondReturn, None),
            (0x101060c, &[0x07, 0x7e], "bner %r14", Flow::CondReturn, None),
            (0x1000a74, &[0xa7, 0x76, 0xff, 0xf1], "brct %r7,1000a56", Flow::CondJump, Some(0x1000a56)),
            (0x1000a9e, &[0xa7, 0x17, 0xff, 0xfc], "brctg %r1,1000a96", Flow::CondJump, Some(0x1000a96)),
            (0x1034caa, &[0x84, 0x12, 0x00, 0x0c], "brxh %r1,%r2,1034cc2", Flow::CondJump, Some(0x1034cc2)),
            (0x10362a6, &[0x85, 0x12, 0xf5, 0x67], "brxle %r1,%r2,1034d74", Flow::CondJump, Some(0x1034d74)),
            (
                0x100ea08,
                &[0xec, 0x38, 0x00, 0x07, 0x00, 0x44],
                "brxhg %r3,%r8,100ea16",
                Flow::CondJump,
                Some(0x100ea16),
            ),
            (0x1051e00, &[0xec, 0x15, 0x00, 0x09, 0x80, 0x76], "crje %r1,%r5,1051e12", Flow::CondJump, Some(0x1051e12)),
            (0x1043322, &[0xec, 0x16, 0x00, 0x0f, 0x00, 0x7c], "cgijne %r1,0,1043340", Flow::CondJump, Some(0x1043340)),
            (0x10003de, &[0xc0, 0xf4, 0xff, 0xff, 0xff, 0xf5], "jg 10003c8", Flow::Jump, Some(0x10003c8)),
            (0x101fbca, &[0xc0, 0xb4, 0x00, 0x00, 0x00, 0x04], "jgnl 101fbd2", Flow::CondJump, Some(0x101fbd2)),
            (0x1000782, &[0xa7, 0xf4, 0x00, 0x06], "j 100078e", Flow::Jump, Some(0x100078e)),
            (0x10013a2, &[0xa7, 0x14, 0xff, 0xfe], "jo 100139e", Flow::CondJump, Some(0x100139e)),
            (0x10003b2, &[0xa7, 0x84, 0x00, 0x03], "je 10003b8", Flow::CondJump, Some(0x10003b8)),
            (0x100061c, &[0xc0, 0xe5, 0x00, 0x00, 0x00, 0x06], "brasl %r14,1000628", Flow::Call, Some(0x1000628)),
            (0x10006c8, &[0x0a, 0xaf], "svc 175", Flow::Syscall, None),
            (0x101f406, &[0x0a, 0x00], "svc 0", Flow::Syscall, None),
            (0x10003c6, &[0x07, 0x07], "nopr %r7", Flow::Next, None),
            // Found by fuzz/ (decode): mask 0 never branches, so no target (it had one).
            (0, &[0xa7, 0x04, 0x00, 0x03], "jnop 6", Flow::Next, None),
            (4, &[0xc0, 0x04, 0x00, 0x00, 0x00, 0x04], "jgnop c", Flow::Next, None),
        ];
        for &(pc, bytes, text, flow, target) in cases {
            let i = decode(pc, bytes);
            assert_eq!((i.len as usize, i.flow, i.target), (bytes.len(), flow, target), "{text}");
        }
        assert_eq!(svc_immediate(&[0x0a, 0xaf]), Some(175));
        assert_eq!(svc_immediate(&[0x07, 0xfe]), None);
    }

    #[test]
    fn return_is_br_r14() {
        assert_eq!(decode(0, &[0x07, 0xfe]).flow, Flow::Return); // br %r14
    }

    #[test]
    fn short_or_garbage_input_is_invalid_not_a_panic() {
        assert_eq!(decode(0, &[]).flow, Flow::Invalid);
        assert_eq!(decode(0, &[0xc0, 0xe5, 0]).flow, Flow::Invalid); // brasl cut short
        assert_eq!(decode(0, &[0x00, 0x00]).flow, Flow::Invalid); // opcode 0 is illegal
    }
}
