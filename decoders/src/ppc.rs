//! PowerPC64 (big- and little-endian): capstone checks that an instruction
//! decodes; the branch class comes from the encoding itself, because
//! capstone 5 calls every PowerPC branch a "jump".
//!
//! Rules (Power ISA 3.1, book I, 2.4): `b` (opcode 18) and `bc` (16) with
//! the LK bit are calls, without it jumps; `bclr` (19/16) without LK is a
//! return (`blr`, `beqlr`), with LK a call (`blrl`); `bcctr` (19/528) is an
//! indirect jump (`bctr`) or call (`bctrl`). A `bc*` whose BO field does not
//! say "branch always" is conditional. `sc` and `scv` are system calls,
//! `rfid`/`hrfid`/`rfscv` interrupt returns. Prefixed instructions (opcode
//! 1, Power10) are 8 bytes and never branch.

use crate::{Flow, Insn};
use capstone::arch::ppc::ArchMode;
use capstone::arch::{BuildsCapstone, BuildsCapstoneEndian};
use capstone::{Capstone, Endian};
use std::cell::RefCell;

/// Every PowerPC instruction is 4 bytes, except Power10's 8-byte prefixed ones.
pub const MAX_INSN_LEN: usize = 8;

thread_local! {
    /// capstone handles per byte order (built lazily; a handle is not shareable between threads).
    static CAPSTONE: RefCell<[Option<Capstone>; 2]> = const { RefCell::new([None, None]) };
}

/// The instruction word at the start of `bytes` in the target's byte order.
pub fn word(big_endian: bool, bytes: &[u8]) -> Option<u32> {
    let b: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
    Some(if big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) })
}

/// Whether capstone accepts the 4 bytes as an instruction (None: capstone could not be set up).
fn capstone_decodes(big_endian: bool, pc: u64, bytes: &[u8]) -> Option<bool> {
    CAPSTONE.with(|c| {
        let mut c = c.borrow_mut();
        let slot = &mut c[big_endian as usize];
        if slot.is_none() {
            let endian = if big_endian { Endian::Big } else { Endian::Little };
            *slot = Capstone::new().ppc().mode(ArchMode::Mode64).endian(endian).build().ok();
        }
        let cs = slot.as_ref()?;
        Some(cs.disasm_count(bytes, pc, 1).map(|i| i.len() == 1).unwrap_or(false))
    })
}

/// Sign-extend the low `bits` bits of `v`.
fn sext(v: u32, bits: u32) -> i64 {
    let shift = 64 - bits;
    ((v as u64) << shift) as i64 >> shift
}

/// BO field "branch always" (BO = 1z1zz): neither the CR bit nor CTR is tested.
fn branch_always(w: u32) -> bool {
    let bo = (w >> 21) & 0x1f;
    bo & 0x14 == 0x14
}

/// Classify a branch-conditional given whether it links.
fn conditional(w: u32, always: Flow, cond: Flow) -> Flow {
    if branch_always(w) {
        always
    } else {
        cond
    }
}

/// Decode and classify the instruction at `pc` (`bytes` in target order, 4 or more bytes).
pub fn decode(big_endian: bool, pc: u64, bytes: &[u8]) -> Insn {
    let invalid = Insn { len: 4, flow: Flow::Invalid, target: None };
    let Some(w) = word(big_endian, bytes) else {
        return invalid;
    };
    let opcode = w >> 26;
    let link = w & 1 != 0;
    let absolute = w & 2 != 0;
    let (flow, target) = match opcode {
        // Prefixed instruction: 8 bytes, loads, stores and arithmetic only.
        1 => return Insn { len: 8, flow: if bytes.len() >= 8 { Flow::Next } else { Flow::Invalid }, target: None },
        18 => {
            let offset = sext(w & 0x03ff_fffc, 26);
            let target = if absolute { offset as u64 } else { pc.wrapping_add(offset as u64) };
            (if link { Flow::Call } else { Flow::Jump }, Some(target))
        }
        16 => {
            let offset = sext(w & 0xfffc, 16);
            let target = if absolute { offset as u64 } else { pc.wrapping_add(offset as u64) };
            let flow = if link {
                conditional(w, Flow::Call, Flow::CondCall)
            } else {
                conditional(w, Flow::Jump, Flow::CondJump)
            };
            (flow, Some(target))
        }
        17 => (Flow::Syscall, None), // sc, scv
        19 => match (w >> 1) & 0x3ff {
            16 if link => (conditional(w, Flow::Call, Flow::CondCall), None), // blrl
            16 => (conditional(w, Flow::Return, Flow::CondReturn), None),     // blr, beqlr
            528 if link => (conditional(w, Flow::Call, Flow::CondCall), None), // bctrl
            528 => (conditional(w, Flow::Jump, Flow::CondJump), None),        // bctr
            560 if link => (conditional(w, Flow::Call, Flow::CondCall), None), // btarl
            560 => (conditional(w, Flow::Jump, Flow::CondJump), None),        // btar
            18 | 274 | 82 => (Flow::Iret, None),                              // rfid, hrfid, rfscv
            _ => (Flow::Next, None),
        },
        _ => (Flow::Next, None),
    };
    if flow == Flow::Next && capstone_decodes(big_endian, pc, &bytes[..4]) == Some(false) {
        return invalid;
    }
    Insn { len: 4, flow, target }
}

/// Load-and-reserve (`lbarx`, `lharx`, `lwarx`, `ldarx`, `lqarx`): starts an atomic sequence
/// that single-stepping never completes.
pub fn is_load_reserve(w: u32) -> bool {
    w >> 26 == 31 && matches!((w >> 1) & 0x3ff, 52 | 116 | 20 | 84 | 276)
}

/// Store-conditional (`stbcx.`, `sthcx.`, `stwcx.`, `stdcx.`, `stqcx.`): ends an atomic sequence.
pub fn is_store_conditional(w: u32) -> bool {
    w >> 26 == 31 && w & 1 == 1 && matches!((w >> 1) & 0x3ff, 694 | 726 | 150 | 214 | 182)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pc, instruction bytes, objdump's text, expected class, expected target.
    type Case = (u64, [u8; 4], &'static str, Flow, Option<u64>);

    /// Little-endian bytes from `powerpc64le-linux-gnu-objdump -d` of the test programs
    /// (tests/programs/cross: ppc64le-libc and ppc64le-asm), with objdump's mnemonic.
    const LE_CASES: &[Case] = &[
        (0x100006f4, [0xd5, 0xbc, 0x01, 0x48], "bl 1001c3c8", Flow::Call, Some(0x1001c3c8)),
        (0x100003f0, [0x20, 0x00, 0x80, 0x4e], "blr", Flow::Return, None),
        (0x100009ac, [0x20, 0x00, 0x82, 0x4d], "beqlr", Flow::CondReturn, None),
        (0x10000a74, [0x20, 0x00, 0x82, 0x4c], "bnelr", Flow::CondReturn, None),
        (0x100009d4, [0x21, 0x04, 0x80, 0x4e], "bctrl", Flow::Call, None),
        (0x1000040c, [0x20, 0x04, 0x80, 0x4e], "bctr", Flow::Jump, None),
        (0x10000768, [0x02, 0x00, 0x00, 0x44], "sc", Flow::Syscall, None),
        (0x10000760, [0x01, 0x00, 0x00, 0x44], "scv 0", Flow::Syscall, None),
        (0x100006d0, [0x29, 0xf8, 0x00, 0x7d], "lwarx r8,0,r31,1", Flow::Next, None),
        (0x100006dc, [0x2d, 0xf9, 0x40, 0x7d], "stwcx. r10,0,r31", Flow::Next, None),
        (0x10000cb0, [0xf4, 0xff, 0x00, 0x42], "bdnz 10000ca4", Flow::CondJump, Some(0x10000ca4)),
        (0x100006e0, [0xf0, 0xff, 0xc2, 0x40], "bne- 100006d0", Flow::CondJump, Some(0x100006d0)),
        (0x10000764, [0x0c, 0x00, 0x00, 0x48], "b 10000770", Flow::Jump, Some(0x10000770)),
        (0x100006c0, [0x44, 0x00, 0x82, 0x41], "beq 10000704", Flow::CondJump, Some(0x10000704)),
        (0x10000110, [0x05, 0x00, 0x60, 0x38], "li r3,5", Flow::Next, None),
        (0x10000130, [0xa6, 0x03, 0x29, 0x7d], "mtctr r9", Flow::Next, None),
    ];

    #[test]
    fn classifies_little_endian() {
        for &(pc, bytes, text, flow, target) in LE_CASES {
            let i = decode(false, pc, &bytes);
            assert_eq!((i.len, i.flow, i.target), (4, flow, target), "{text}");
            // The same instruction in big-endian byte order classifies the same way.
            let mut be = bytes;
            be.reverse();
            assert_eq!(decode(true, pc, &be).flow, flow, "{text} (big-endian)");
        }
    }

    #[test]
    fn classifies_big_endian() {
        // From `powerpc64-linux-gnu-objdump -d` of ppc64-asm and ppc64-libc.
        let cases: &[Case] = &[
            (0x10000154, [0x48, 0x00, 0x00, 0x4d], "bl 100001a0 <add_two>", Flow::Call, Some(0x100001a0)),
            (0x1000015c, [0x40, 0x82, 0xff, 0xf4], "bne 10000150", Flow::CondJump, Some(0x10000150)),
            (0x100001a4, [0x4e, 0x80, 0x00, 0x20], "blr", Flow::Return, None),
            (0x10000190, [0x44, 0x00, 0x00, 0x02], "sc", Flow::Syscall, None),
        ];
        for &(pc, bytes, text, flow, target) in cases {
            let i = decode(true, pc, &bytes);
            assert_eq!((i.len, i.flow, i.target), (4, flow, target), "{text}");
        }
    }

    #[test]
    fn atomic_sequences() {
        let w = |b: [u8; 4]| word(false, &b).unwrap();
        assert!(is_load_reserve(w([0x29, 0xf8, 0x00, 0x7d]))); // lwarx r8,0,r31,1
        assert!(is_load_reserve(w([0xa9, 0x48, 0x60, 0x7c]))); // ldarx r3,0,r9,1
        assert!(is_store_conditional(w([0x2d, 0xf9, 0x40, 0x7d]))); // stwcx. r10,0,r31
        assert!(is_store_conditional(w([0xad, 0x49, 0xe0, 0x7f]))); // stdcx. r31,0,r9
        assert!(!is_load_reserve(w([0x2d, 0xf9, 0x40, 0x7d])));
        assert!(!is_store_conditional(w([0x29, 0xf8, 0x00, 0x7d])));
    }

    #[test]
    fn short_or_garbage_input_is_invalid_not_a_panic() {
        assert_eq!(decode(false, 0, &[0x20, 0x00]).flow, Flow::Invalid);
        assert_eq!(decode(false, 0, &[]).flow, Flow::Invalid);
        assert_eq!(decode(false, 0, &[0, 0, 0, 0]).flow, Flow::Invalid); // opcode 0 is illegal
        assert_eq!(decode(false, 0, &[0, 0, 0, 4]).flow, Flow::Invalid); // a prefix without its suffix
    }
}
