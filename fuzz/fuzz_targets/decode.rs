//! The instruction decoders and branch classifiers every recorder uses (`itrace_decoders`:
//! x86_64, i386, PowerPC64 big- and little-endian, s390x) on arbitrary bytes at an arbitrary
//! address must never panic, and their answers must hold together:
//!
//! - the length is at least 1 and at most the ISA's longest instruction (s390x: the length
//!   its first byte gives; PowerPC: 4, or 8 for a prefixed instruction);
//! - an instruction that decodes fits in the bytes given, and decodes the same from exactly
//!   its own bytes (a recorder near the end of a mapping reads fewer);
//! - only jumps, conditional jumps and calls have a target;
//! - PowerPC decodes the same from either byte order once the words are swapped;
//! - the helpers beside the decoders (`svc` immediates, load-reserve/store-conditional) answer.
//!
//! One target for all ISAs: the first byte picks the ISA, so a single corpus and a single run
//! cover the five decoders, and bytes that matter to one ISA seed the others.
//!
//! Input: ISA selector (byte 0 modulo 5), address (8 bytes, little-endian), instruction bytes.

#![no_main]

use itrace_decoders::{ppc, s390x, x86, Flow, Insn};
use libfuzzer_sys::fuzz_target;

fn check_common(what: &str, insn: Insn, bytes: &[u8], max: usize) {
    assert!(insn.len >= 1 && insn.len as usize <= max, "{what} {bytes:02x?}: length {} out of range", insn.len);
    if insn.flow != Flow::Invalid {
        assert!(insn.len as usize <= bytes.len(), "{what} {bytes:02x?}: {insn:?} longer than the bytes given");
    }
    if insn.target.is_some() {
        assert!(
            matches!(insn.flow, Flow::Jump | Flow::CondJump | Flow::Call | Flow::CondCall),
            "{what} {bytes:02x?}: {insn:?} has a target"
        );
    }
}

/// The same answer from exactly the instruction's own bytes.
fn check_own_bytes(what: &str, insn: Insn, bytes: &[u8], decode: impl Fn(&[u8]) -> Insn) {
    if insn.flow != Flow::Invalid {
        let again = decode(&bytes[..insn.len as usize]);
        assert_eq!(again, insn, "{what} {bytes:02x?}: decoding its own {} bytes differs", insn.len);
    }
}

fn swap_words(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    for w in v.chunks_exact_mut(4) {
        w.reverse();
    }
    v
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let isa = data[0] % 5;
    let pc = u64::from_le_bytes(data[1..9].try_into().expect("8 bytes"));
    let bytes = &data[9..];
    match isa {
        0 | 1 => {
            let (what, bitness) = if isa == 0 { ("x86_64", 64) } else { ("i386", 32) };
            let bytes = &bytes[..bytes.len().min(x86::MAX_INSN_LEN)];
            let insn = x86::decode(bitness, pc, bytes);
            check_common(what, insn, bytes, x86::MAX_INSN_LEN);
            check_own_bytes(what, insn, bytes, |b| x86::decode(bitness, pc, b));
        }
        2 | 3 => {
            let (what, big) = if isa == 2 { ("ppc64", true) } else { ("ppc64le", false) };
            let bytes = &bytes[..bytes.len().min(ppc::MAX_INSN_LEN)];
            let insn = ppc::decode(big, pc, bytes);
            check_common(what, insn, bytes, ppc::MAX_INSN_LEN);
            assert!(insn.len == 4 || insn.len == 8, "{what} {bytes:02x?}: length {}", insn.len);
            check_own_bytes(what, insn, bytes, |b| ppc::decode(big, pc, b));
            let other = ppc::decode(!big, pc, &swap_words(bytes));
            assert_eq!(other, insn, "{what} {bytes:02x?}: the other byte order decodes the swapped words differently");
            if let Some(w) = ppc::word(big, bytes) {
                let _ = (ppc::is_load_reserve(w), ppc::is_store_conditional(w));
            }
        }
        _ => {
            let bytes = &bytes[..bytes.len().min(s390x::MAX_INSN_LEN)];
            let insn = s390x::decode(pc, bytes);
            check_common("s390x", insn, bytes, s390x::MAX_INSN_LEN);
            if let Some(&b0) = bytes.first() {
                assert_eq!(insn.len, s390x::insn_len(b0), "s390x {bytes:02x?}: length not from the first byte");
            }
            check_own_bytes("s390x", insn, bytes, |b| s390x::decode(pc, b));
            let _ = s390x::svc_immediate(bytes);
        }
    }
});
