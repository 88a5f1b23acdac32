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
        0xb9 if b1 == 0x46 && bytes[3] & 15 == 0 => (Flow::Next, None),    // bctgr R1,0: decrement only
        0xb9 if b1 == 0x46 => (Flow::CondJump, None),                      // bctgr
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

/// Where an execute instruction finds the instruction it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecuteAddress {
    /// `exrl`: relative to the `exrl`, known from its bytes.
    Fixed(u64),
    /// `ex`: `D2(X2,B2)`, from registers when it runs (register 0 reads as 0).
    Based { x2: u8, b2: u8, d2: u16 },
}

impl ExecuteAddress {
    /// The address, with the registers the execute instruction runs with.
    pub fn resolve(self, gprs: &[u64; 16]) -> u64 {
        match self {
            ExecuteAddress::Fixed(a) => a,
            ExecuteAddress::Based { x2, b2, d2 } => {
                reg_or_0(gprs, x2).wrapping_add(reg_or_0(gprs, b2)).wrapping_add(d2 as u64)
            }
        }
    }
}

/// An execute instruction (`ex`, `exrl`): it runs the instruction at its address out of line,
/// bits 8-15 of it ORed with the low byte of R1 unless R1 is 0 (Principles of Operation,
/// "EXECUTE"). The executed instruction acts at the execute's place: the next sequential
/// instruction is the one after the execute, a relative branch is relative to the executed
/// instruction's own address, and a branch it takes is reported at the execute's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Execute {
    pub r1: u8,
    pub address: ExecuteAddress,
}

impl Execute {
    /// What it runs depends on registers: an `ex` address, or R1's byte ORed in.
    pub fn needs_registers(&self) -> bool {
        self.r1 != 0 || matches!(self.address, ExecuteAddress::Based { .. })
    }
}

/// The execute instruction at `pc`, if `bytes` holds one.
pub fn execute(pc: u64, bytes: &[u8]) -> Option<Execute> {
    match *bytes {
        [0x44, b1, b2, b3, ..] => Some(Execute {
            r1: b1 >> 4,
            address: ExecuteAddress::Based { x2: b1 & 15, b2: b2 >> 4, d2: u16::from_be_bytes([b2 & 15, b3]) },
        }),
        [0xc6, b1, i0, i1, i2, i3, ..] if b1 & 15 == 0 => Some(Execute {
            r1: b1 >> 4,
            address: ExecuteAddress::Fixed(pc.wrapping_add((i32::from_be_bytes([i0, i1, i2, i3]) as i64 * 2) as u64)),
        }),
        _ => None,
    }
}

/// The instruction an execute instruction of length `ex_len` runs, as it acts at the execute's
/// place: `bytes` are the executed instruction's (R1's byte already ORed in), found at `at`. Its
/// length is the execute's (where the path goes on); its flow and branch target are the executed
/// instruction's, a relative target counted from `at`. An execute of an execute is invalid (an
/// execute exception).
pub fn decode_executed(ex_len: u8, at: u64, bytes: &[u8]) -> Insn {
    if execute(at, bytes).is_some() {
        return Insn { len: ex_len, flow: Flow::Invalid, target: None };
    }
    let i = decode(at, bytes);
    Insn { len: ex_len, ..i }
}

fn reg_or_0(gprs: &[u64; 16], r: u8) -> u64 {
    if r == 0 {
        0
    } else {
        gprs[r as usize]
    }
}

/// Run the conditional branch `bytes` at `pc` as the CPU would, with condition code `cc` and
/// the general registers `gprs` (which the count and index branches update): where control
/// goes next, `next` when not taken (the next instruction: after the execute instruction for
/// one run by `ex`/`exrl`, `pc` then being the executed instruction's address). `None` for an instruction this does not evaluate (not a conditional branch, or
/// `bic`, whose target is in memory). The rules are the Principles of Operation's (ch. 7,
/// "Branch and ..." and "Compare and Branch"): a mask bit per condition code (8 for cc 0);
/// compare-and-branch sets no cc, its mask tests equal (8), low (4), high (2); count branches
/// decrement first and branch on a non-zero result; index branches add R3 to R1 and compare the
/// sum with the odd register of the R3 pair, the values taken before R1 changes; 32-bit forms
/// work on bits 32-63 (`brcth` on 0-31) and keep the other half.
pub fn take_branch(pc: u64, next: u64, bytes: &[u8], cc: u8, gprs: &mut [u64; 16]) -> Option<u64> {
    let b0 = *bytes.first()?;
    if bytes.len() < insn_len(b0) as usize {
        return None;
    }
    let b1 = bytes[1];
    let (r1, r2) = (b1 >> 4, b1 & 15);
    let rel16 = || pc.wrapping_add((i16::from_be_bytes([bytes[2], bytes[3]]) as i64 * 2) as u64);
    let rel32 = || pc.wrapping_add((i32::from_be_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]) as i64 * 2) as u64);
    let g = *gprs;
    // D(X,B) with a 12-bit displacement (bytes 2-3), and the 20-bit signed one of RXY/RSY forms.
    let d12 = || u16::from_be_bytes([bytes[2] & 15, bytes[3]]) as u64;
    let d20 = || (((bytes[4] as i8 as i64) << 12) | d12() as i64) as u64;
    let base = |b: u8, x: u8, d: u64| reg_or_0(&g, b).wrapping_add(reg_or_0(&g, x)).wrapping_add(d);
    let by_cc = |mask: u8| mask & (8 >> cc) != 0;
    let go = |taken: bool, to: u64| if taken { to } else { next };
    // Compare-and-branch: the mask against the comparison's outcome (0 equal, 1 low, 2 high).
    let cmp = |mask: u8, ord: std::cmp::Ordering| {
        let cc = match ord {
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Less => 1,
            std::cmp::Ordering::Greater => 2,
        };
        mask & (8 >> cc) != 0
    };
    let low = |v: u64| v as u32;
    let set_low = |v: u64, w: u32| (v & !0xffff_ffff) | w as u64;
    let to = match b0 {
        0xa7 if r2 == 0x4 => go(by_cc(r1), rel16()),           // brc
        0xc0 if r2 == 0x4 => go(by_cc(r1), rel32()),           // brcl
        0x07 if r2 != 0 => go(by_cc(r1), g[r2 as usize]),      // bcr
        0x47 => go(by_cc(r1), base(bytes[2] >> 4, r2, d12())), // bc
        0xa7 if r2 == 0x6 => {
            // brct
            let w = low(g[r1 as usize]).wrapping_sub(1);
            gprs[r1 as usize] = set_low(g[r1 as usize], w);
            go(w != 0, rel16())
        }
        0xa7 if r2 == 0x7 => {
            // brctg
            let v = g[r1 as usize].wrapping_sub(1);
            gprs[r1 as usize] = v;
            go(v != 0, rel16())
        }
        0xcc if r2 == 0x6 => {
            // brcth
            let hi = ((g[r1 as usize] >> 32) as u32).wrapping_sub(1);
            gprs[r1 as usize] = (g[r1 as usize] & 0xffff_ffff) | ((hi as u64) << 32);
            go(hi != 0, rel32())
        }
        0x06 | 0x46 => {
            // bctr (no branch with R2 0), bct
            let to = if b0 == 0x06 { (r2 != 0).then(|| g[r2 as usize]) } else { Some(base(bytes[2] >> 4, r2, d12())) };
            let w = low(g[r1 as usize]).wrapping_sub(1);
            gprs[r1 as usize] = set_low(g[r1 as usize], w);
            match to {
                Some(to) => go(w != 0, to),
                None => next,
            }
        }
        0xb9 if b1 == 0x46 => {
            // bctgr
            let (r1, r2) = (bytes[3] >> 4, bytes[3] & 15);
            let v = g[r1 as usize].wrapping_sub(1);
            gprs[r1 as usize] = v;
            if r2 == 0 {
                next
            } else {
                go(v != 0, g[r2 as usize])
            }
        }
        0xe3 if bytes[5] == 0x46 => {
            // bctg
            let to = base(bytes[2] >> 4, r2, d20());
            let v = g[r1 as usize].wrapping_sub(1);
            gprs[r1 as usize] = v;
            go(v != 0, to)
        }
        0x84..=0x87 => {
            // brxh, brxle, bxh, bxle (32-bit): R1 + R3, against R3|1
            let (inc, limit) = (low(g[r2 as usize]) as i32, low(g[(r2 | 1) as usize]) as i32);
            let sum = (low(g[r1 as usize]) as i32).wrapping_add(inc);
            gprs[r1 as usize] = set_low(g[r1 as usize], sum as u32);
            let to = if b0 < 0x86 { rel16() } else { base(bytes[2] >> 4, 0, d12()) };
            go(if b0 & 1 == 0 { sum > limit } else { sum <= limit }, to)
        }
        0xec | 0xeb if matches!(bytes[5], 0x44 | 0x45) => {
            // brxhg, brxlg (ec), bxhg, bxleg (eb)
            let (inc, limit) = (g[r2 as usize] as i64, g[(r2 | 1) as usize] as i64);
            let sum = (g[r1 as usize] as i64).wrapping_add(inc);
            gprs[r1 as usize] = sum as u64;
            let to = if b0 == 0xec { rel16() } else { base(bytes[2] >> 4, 0, d20()) };
            go(if bytes[5] == 0x44 { sum > limit } else { sum <= limit }, to)
        }
        0xec => {
            let op = bytes[5];
            // The operands: registers (crj, crb, ... 0x76/0x64/0x77/0x65, 0xf6/0xe4/0xf7/0xe5) or
            // an 8-bit immediate (cij, cib, ...), signed for c*, unsigned for cl*.
            let (second, mask) = match op {
                0x76 | 0x64 | 0x77 | 0x65 | 0xf6 | 0xe4 | 0xf7 | 0xe5 => (g[r2 as usize], bytes[4] >> 4),
                0x7e | 0x7c | 0xfe | 0xfc => (bytes[4] as i8 as i64 as u64, r2),
                0x7f | 0x7d | 0xff | 0xfd => (bytes[4] as u64, r2),
                _ => return None,
            };
            let first = g[r1 as usize];
            let ord = match op {
                0x76 | 0x7e | 0xf6 | 0xfe => (first as i32).cmp(&(second as i32)),
                0x64 | 0x7c | 0xe4 | 0xfc => (first as i64).cmp(&(second as i64)),
                0x77 | 0x7f | 0xf7 | 0xff => (first as u32).cmp(&(second as u32)),
                _ => first.cmp(&second),
            };
            let to = if matches!(op, 0x76 | 0x64 | 0x77 | 0x65 | 0x7e | 0x7c | 0x7f | 0x7d) {
                rel16()
            } else {
                base(bytes[2] >> 4, 0, d12())
            };
            go(cmp(mask, ord), to)
        }
        _ => return None,
    };
    Some(to)
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

    /// Every compare-and-branch, count and index branch, with the bytes and text of
    /// `s390x-linux-gnu-objdump -d` (binutils 2.40) of an assembled list of them (`gcc -march=z13`):
    /// conditional jumps, the relative ones to the target objdump prints, the others to an
    /// address only known from registers.
    #[test]
    fn classifies_compare_count_and_index_branches() {
        const T: Option<u64> = Some(0x1000184);
        let cases: &[Case] = &[
            (0x10000d4, &[0xec, 0x12, 0x00, 0x58, 0x80, 0x76], "crje %r1,%r2,1000184", Flow::CondJump, T),
            (0x10000da, &[0xec, 0x12, 0x00, 0x55, 0x40, 0x64], "cgrjl %r1,%r2,1000184", Flow::CondJump, T),
            (0x10000e0, &[0xec, 0x12, 0x00, 0x52, 0x20, 0x77], "clrjh %r1,%r2,1000184", Flow::CondJump, T),
            (0x10000e6, &[0xec, 0x12, 0x00, 0x4f, 0x60, 0x65], "clgrjne %r1,%r2,1000184", Flow::CondJump, T),
            (0x10000ec, &[0xec, 0x18, 0x00, 0x4c, 0xfb, 0x7e], "cije %r1,-5,1000184", Flow::CondJump, T),
            (0x10000f2, &[0xec, 0x1a, 0x00, 0x49, 0x07, 0x7c], "cgijnl %r1,7,1000184", Flow::CondJump, T),
            (0x10000f8, &[0xec, 0x14, 0x00, 0x46, 0xc8, 0x7f], "clijl %r1,200,1000184", Flow::CondJump, T),
            (0x10000fe, &[0xec, 0x1c, 0x00, 0x43, 0x03, 0x7d], "clgijnh %r1,3,1000184", Flow::CondJump, T),
            (0x1000104, &[0xa7, 0x36, 0x00, 0x40], "brct %r3,1000184", Flow::CondJump, T),
            (0x1000108, &[0xa7, 0x37, 0x00, 0x3e], "brctg %r3,1000184", Flow::CondJump, T),
            (0x100010c, &[0xcc, 0x36, 0x00, 0x00, 0x00, 0x3c], "brcth %r3,1000184", Flow::CondJump, T),
            (0x1000112, &[0x84, 0x46, 0x00, 0x39], "brxh %r4,%r6,1000184", Flow::CondJump, T),
            (0x1000116, &[0x85, 0x47, 0x00, 0x37], "brxle %r4,%r7,1000184", Flow::CondJump, T),
            (0x100011a, &[0xec, 0x46, 0x00, 0x35, 0x00, 0x44], "brxhg %r4,%r6,1000184", Flow::CondJump, T),
            (0x1000120, &[0xec, 0x46, 0x00, 0x32, 0x00, 0x45], "brxlg %r4,%r6,1000184", Flow::CondJump, T),
            (0x1000126, &[0x46, 0x35, 0x90, 0x08], "bct %r3,8(%r5,%r9)", Flow::CondJump, None),
            (0x100012a, &[0x06, 0x39], "bctr %r3,%r9", Flow::CondJump, None),
            (0x100012c, &[0xe3, 0x35, 0x9f, 0xf8, 0xff, 0x46], "bctg %r3,-8(%r5,%r9)", Flow::CondJump, None),
            (0x1000132, &[0xb9, 0x46, 0x00, 0x39], "bctgr %r3,%r9", Flow::CondJump, None),
            (0x1000136, &[0x86, 0x46, 0x90, 0x10], "bxh %r4,%r6,16(%r9)", Flow::CondJump, None),
            (0x100013a, &[0x87, 0x46, 0x90, 0x10], "bxle %r4,%r6,16(%r9)", Flow::CondJump, None),
            (0x100013e, &[0xeb, 0x46, 0x9f, 0xf0, 0xff, 0x44], "bxhg %r4,%r6,-16(%r9)", Flow::CondJump, None),
            (0x1000144, &[0xeb, 0x46, 0x90, 0x04, 0x00, 0x45], "bxleg %r4,%r6,4(%r9)", Flow::CondJump, None),
            (0x100014a, &[0xec, 0x12, 0x90, 0x0c, 0x80, 0xf6], "crbe %r1,%r2,12(%r9)", Flow::CondJump, None),
            (0x1000150, &[0xec, 0x12, 0x90, 0x0c, 0x80, 0xe4], "cgrbe %r1,%r2,12(%r9)", Flow::CondJump, None),
            (0x1000156, &[0xec, 0x12, 0x90, 0x0c, 0x80, 0xf7], "clrbe %r1,%r2,12(%r9)", Flow::CondJump, None),
            (0x100015c, &[0xec, 0x12, 0x90, 0x0c, 0x80, 0xe5], "clgrbe %r1,%r2,12(%r9)", Flow::CondJump, None),
            (0x1000162, &[0xec, 0x18, 0x90, 0x0c, 0x03, 0xfe], "cibe %r1,3,12(%r9)", Flow::CondJump, None),
            (0x1000168, &[0xec, 0x18, 0x90, 0x0c, 0x03, 0xfc], "cgibe %r1,3,12(%r9)", Flow::CondJump, None),
            (0x100016e, &[0xec, 0x18, 0x90, 0x0c, 0x03, 0xff], "clibe %r1,3,12(%r9)", Flow::CondJump, None),
            (0x1000174, &[0xec, 0x18, 0x90, 0x0c, 0x03, 0xfd], "clgibe %r1,3,12(%r9)", Flow::CondJump, None),
            // Decrement only: no branch with R2 = 0.
            (0, &[0xb9, 0x46, 0x00, 0x30], "bctgr %r3,%r0", Flow::Next, None),
            (0, &[0x06, 0x30], "bctr %r3,%r0", Flow::Next, None),
        ];
        for &(pc, bytes, text, flow, target) in cases {
            let i = decode(pc, bytes);
            assert_eq!((i.len as usize, i.flow, i.target), (bytes.len(), flow, target), "{text}");
        }
    }

    /// `exrl` and `ex` from objdump (`exrl %r0,1000184` at 0x100017a, `ex %r1,0(%r2,%r3)`), and
    /// what an `exrl` of `j` runs: qemu-s390x's log of tests/programs/cross/s390x-ex.S shows the
    /// `exrl` at 0x10000e2 of `j` at 0x1000106 (a7 f4 ff f2) going on at 0x10000ea, the jump's
    /// offset counted from the `j`, not from the `exrl`.
    #[test]
    fn execute_instructions() {
        let exrl = [0xc6, 0x00, 0x00, 0x00, 0x00, 0x05];
        assert_eq!(decode(0x100017a, &exrl).flow, Flow::Next);
        assert_eq!(execute(0x100017a, &exrl), Some(Execute { r1: 0, address: ExecuteAddress::Fixed(0x1000184) }));
        let ex = [0x44, 0x12, 0x30, 0x00];
        let e = execute(0x1000180, &ex).expect("ex");
        assert_eq!(e.r1, 1);
        let mut gprs = [0u64; 16];
        gprs[2] = 0x100;
        gprs[3] = 0x2000;
        assert_eq!(e.address.resolve(&gprs), 0x2100);
        // ex %r0,4(%r0,%r3): register 0 as base or index reads as 0.
        let e0 = execute(0, &[0x44, 0x00, 0x30, 0x04]).expect("ex");
        assert_eq!(e0.address.resolve(&gprs), 0x2004);
        assert_eq!(execute(0, &[0xc6, 0x02, 0, 0, 0, 1]), None, "lhrl, not exrl");
        let j = decode_executed(6, 0x1000106, &[0xa7, 0xf4, 0xff, 0xf2]);
        assert_eq!((j.len, j.flow, j.target), (6, Flow::Jump, Some(0x10000ea)));
        let je = decode_executed(6, 0x100010a, &[0xa7, 0x84, 0xff, 0xf9]);
        assert_eq!((je.len, je.flow, je.target), (6, Flow::CondJump, Some(0x10000fc)));
        let aghi = decode_executed(6, 0x1000102, &[0xa7, 0x3b, 0x00, 0x02]);
        assert_eq!((aghi.len, aghi.flow, aghi.target), (6, Flow::Next, None));
        assert_eq!(decode_executed(6, 0, &exrl).flow, Flow::Invalid, "an execute of an execute");
    }

    /// Conditional branches run by hand from the Principles of Operation's definitions (pc 0x1000,
    /// targets 0x1000 + 2 x offset, `bytes` from objdump's encodings above).
    #[test]
    fn takes_branches_as_the_cpu() {
        let pc = 0x1000;
        let take = |bytes: &[u8], cc: u8, set: &[(usize, u64)]| {
            let mut g = [0u64; 16];
            for &(r, v) in set {
                g[r] = v;
            }
            let next = pc + insn_len(bytes[0]) as u64;
            let to = take_branch(pc, next, bytes, cc, &mut g);
            (to, g)
        };
        let next6 = Some(pc + 6);
        // crje %r1,%r2,+0xb0: equal only (signed 32-bit compare of the low halves).
        let crje = [0xec, 0x12, 0x00, 0x58, 0x80, 0x76];
        assert_eq!(take(&crje, 0, &[(1, 5), (2, 5)]).0, Some(pc + 0xb0));
        assert_eq!(take(&crje, 0, &[(1, 5), (2, 6)]).0, next6);
        assert_eq!(take(&crje, 0, &[(1, 0x1_0000_0005), (2, 5)]).0, Some(pc + 0xb0), "32-bit: high half ignored");
        // cgrjl: signed 64-bit low.
        let cgrjl = [0xec, 0x12, 0x00, 0x55, 0x40, 0x64];
        assert_eq!(take(&cgrjl, 0, &[(1, u64::MAX), (2, 1)]).0, Some(pc + 0xaa), "-1 < 1");
        // clgrjne: unsigned, not equal (mask 6 = low or high).
        let clgrjne = [0xec, 0x12, 0x00, 0x4f, 0x60, 0x65];
        assert_eq!(take(&clgrjne, 0, &[(1, 3), (2, 3)]).0, next6);
        assert_eq!(take(&clgrjne, 0, &[(1, 3), (2, 4)]).0, Some(pc + 0x9e));
        // clrjh: unsigned 32-bit high: 0xffffffff > 1 unsigned.
        let clrjh = [0xec, 0x12, 0x00, 0x52, 0x20, 0x77];
        assert_eq!(take(&clrjh, 0, &[(1, 0xffff_ffff), (2, 1)]).0, Some(pc + 0xa4));
        // cije %r1,-5: the immediate sign-extended.
        let cije = [0xec, 0x18, 0x00, 0x4c, 0xfb, 0x7e];
        assert_eq!(take(&cije, 0, &[(1, (-5i32) as u32 as u64)]).0, Some(pc + 0x98));
        // clijl %r1,200: unsigned immediate; 199 < 200.
        let clijl = [0xec, 0x14, 0x00, 0x46, 0xc8, 0x7f];
        assert_eq!(take(&clijl, 0, &[(1, 199)]).0, Some(pc + 0x8c));
        assert_eq!(take(&clijl, 0, &[(1, 200)]).0, next6);
        // cgijnl %r1,7: not low (mask 10 = equal or high).
        let cgijnl = [0xec, 0x1a, 0x00, 0x49, 0x07, 0x7c];
        assert_eq!(take(&cgijnl, 0, &[(1, 7)]).0, Some(pc + 0x92));
        assert_eq!(take(&cgijnl, 0, &[(1, 6)]).0, next6);
        // brct: the low half counts down, the high half stays; no branch at 0.
        let brct = [0xa7, 0x36, 0x00, 0x40];
        let (to, g) = take(&brct, 0, &[(3, 0x7_0000_0001)]);
        assert_eq!((to, g[3]), (Some(pc + 4), 0x7_0000_0000));
        let (to, g) = take(&brct, 0, &[(3, 0)]);
        assert_eq!((to, g[3]), (Some(pc + 0x80), 0xffff_ffff));
        // brcth: the high half counts down.
        let brcth = [0xcc, 0x36, 0x00, 0x00, 0x00, 0x3c];
        let (to, g) = take(&brcth, 0, &[(3, 0x2_0000_0009)]);
        assert_eq!((to, g[3]), (Some(pc + 0x78), 0x1_0000_0009));
        // brxh %r4,%r6: r4 += r6, branch if above r7 (r6's odd partner).
        let brxh = [0x84, 0x46, 0x00, 0x39];
        let (to, g) = take(&brxh, 0, &[(4, 10), (6, 1), (7, 10)]);
        assert_eq!((to, g[4]), (Some(pc + 0x72), 11));
        assert_eq!(take(&brxh, 0, &[(4, 9), (6, 1), (7, 10)]).0, Some(pc + 4));
        // brxle %r4,%r7: R3 odd: increment and limit are both r7.
        let brxle = [0x85, 0x47, 0x00, 0x37];
        let (to, g) = take(&brxle, 0, &[(4, 2), (7, 3)]);
        assert_eq!((to, g[4]), (Some(pc + 4), 5), "2 + 3 <= 3 is false");
        assert_eq!(take(&brxle, 0, &[(4, (-3i32) as u32 as u64), (7, 3)]).0, Some(pc + 0x6e), "-3 + 3 <= 3");
        // brxlg %r4,%r6: 64-bit, branch if the sum is at most r7.
        let brxlg = [0xec, 0x46, 0x00, 0x32, 0x00, 0x45];
        assert_eq!(take(&brxlg, 0, &[(4, u64::MAX), (6, 1), (7, 0)]).0, Some(pc + 0x64), "-1 + 1 <= 0");
        // bctgr %r3,%r9 and bct %r3,8(%r5,%r9): to the register or the address.
        let bctgr = [0xb9, 0x46, 0x00, 0x39];
        assert_eq!(take(&bctgr, 0, &[(3, 2), (9, 0x5000)]).0, Some(0x5000));
        assert_eq!(take(&bctgr, 0, &[(3, 1), (9, 0x5000)]).0, Some(pc + 4));
        let bct = [0x46, 0x35, 0x90, 0x08];
        assert_eq!(take(&bct, 0, &[(3, 2), (5, 0x10), (9, 0x5000)]).0, Some(0x5018));
        // bctg %r3,-8(%r5,%r9): the 20-bit displacement is signed.
        let bctg = [0xe3, 0x35, 0x9f, 0xf8, 0xff, 0x46];
        assert_eq!(take(&bctg, 0, &[(3, 2), (5, 0x10), (9, 0x5000)]).0, Some(0x5008));
        // bxhg %r4,%r6,-16(%r9)
        let bxhg = [0xeb, 0x46, 0x9f, 0xf0, 0xff, 0x44];
        assert_eq!(take(&bxhg, 0, &[(4, 5), (6, 1), (7, 5), (9, 0x5000)]).0, Some(0x4ff0));
        // crbe / clibe to D(B).
        let crbe = [0xec, 0x12, 0x90, 0x0c, 0x80, 0xf6];
        assert_eq!(take(&crbe, 0, &[(9, 0x5000)]).0, Some(0x500c), "0 == 0");
        let clibe = [0xec, 0x18, 0x90, 0x0c, 0x03, 0xff];
        assert_eq!(take(&clibe, 0, &[(1, 4), (9, 0x5000)]).0, next6);
        // brc by the condition code: jne (mask 7) at cc 0 and cc 2; bcr 8,%r14 (ber) at cc 0.
        let jne = [0xa7, 0x74, 0x00, 0x04];
        assert_eq!(take(&jne, 0, &[]).0, Some(pc + 4));
        assert_eq!(take(&jne, 2, &[]).0, Some(pc + 8));
        assert_eq!(take(&[0x07, 0x8e], 0, &[(14, 0x7000)]).0, Some(0x7000));
        assert_eq!(take(&[0x07, 0x8e], 1, &[(14, 0x7000)]).0, Some(pc + 2));
        // Run by an execute instruction at 0x2000 (6 bytes): not taken goes on after the execute.
        let mut g = [0u64; 16];
        assert_eq!(take_branch(pc, 0x2006, &jne, 0, &mut g), Some(0x2006));
        assert_eq!(take_branch(pc, 0x2006, &jne, 1, &mut g), Some(pc + 8));
        // Not conditional branches: not evaluated.
        assert_eq!(take(&[0xa7, 0x3b, 0x00, 0x02], 0, &[]).0, None, "aghi");
        assert_eq!(take(&[0xe3, 0xf0, 0x10, 0x00, 0x00, 0x47], 0, &[]).0, None, "bic");
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
