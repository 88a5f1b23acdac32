//! The code the threads of a traced process run besides their translated units: the ring
//! encoder of `itrace-translate-inproc`, built by this crate's build script as a static
//! position-independent executable (`blob.elf`), and laid out here as the bytes of one
//! region, relocated for the address it is to be mapped at.

use goblin::elf::program_header::PT_LOAD;
use goblin::elf::reloc::R_X86_64_RELATIVE;
use goblin::elf::Elf;

/// The executable the build script made.
const BLOB_ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/blob/blob.elf"));

/// Why the blob could not be laid out (a build that made something else than expected).
#[derive(Debug, thiserror::Error)]
pub(super) enum BlobError {
    #[error("the in-process encoder's executable does not parse: {0}")]
    Parse(#[from] goblin::error::Error),
    #[error("the in-process encoder's executable has a relocation of type {0}, not a relative one")]
    Relocation(u32),
    #[error("the in-process encoder's executable has a segment or relocation outside its image")]
    Outside,
}

/// The blob's bytes as mapped at some address.
pub(super) struct BlobImage {
    /// Its memory from its lowest address on, a whole number of pages.
    pub(super) bytes: Vec<u8>,
    /// The entry points, as offsets in `bytes`: `itrace_self_encode` (a thread's call at its
    /// full ring) and `itrace_encode_ring` (a ring and its room given apart: the test's).
    pub(super) self_encode: u64,
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) encode_ring: u64,
}

const PAGE: u64 = 4096;

/// The blob laid out for `base`: each loadable segment at its offset, what it does not fill
/// zero, and its relative relocations applied (the executable has no other kind: no symbol is
/// looked up, no C library is loaded).
pub(super) fn image_at(base: u64) -> Result<BlobImage, BlobError> {
    let elf = Elf::parse(BLOB_ELF)?;
    let end = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .map(|p| p.p_vaddr.saturating_add(p.p_memsz))
        .max()
        .unwrap_or(0);
    let mut bytes = vec![0u8; end.div_ceil(PAGE) as usize * PAGE as usize];
    for p in elf.program_headers.iter().filter(|p| p.p_type == PT_LOAD) {
        let (from, to) = (p.p_offset as usize, p.p_vaddr as usize);
        let n = p.p_filesz as usize;
        let src = BLOB_ELF.get(from..from.saturating_add(n)).ok_or(BlobError::Outside)?;
        bytes.get_mut(to..to.saturating_add(n)).ok_or(BlobError::Outside)?.copy_from_slice(src);
    }
    for r in elf.dynrelas.iter() {
        if r.r_type != R_X86_64_RELATIVE {
            return Err(BlobError::Relocation(r.r_type));
        }
        let at = r.r_offset as usize;
        let value = base.wrapping_add(r.r_addend.unwrap_or(0) as u64);
        bytes.get_mut(at..at.saturating_add(8)).ok_or(BlobError::Outside)?.copy_from_slice(&value.to_le_bytes());
    }
    let symbol = |name: &str| {
        elf.syms
            .iter()
            .find(|s| elf.strtab.get_at(s.st_name) == Some(name))
            .map(|s| s.st_value)
            .filter(|&at| at < bytes.len() as u64)
            .ok_or(BlobError::Outside)
    };
    let (self_encode, encode_ring) = (symbol("itrace_self_encode")?, symbol("itrace_encode_ring")?);
    Ok(BlobImage { bytes, self_encode, encode_ring })
}

#[cfg(test)]
mod tests {
    use super::*;
    use itrace_format::compact::{Decoder, Encoder};
    use itrace_format::{BatchStamp, Branch, BranchKind, Endian, Hop, Record};
    use itrace_translate_inproc::{encode_ring_at, RingArgs, RingExit};

    /// The blob mapped into this process (read and execute), and its entry point.
    struct Mapped {
        at: *mut libc::c_void,
        len: usize,
        entry: unsafe extern "C" fn(*mut RingArgs) -> u64,
    }

    impl Mapped {
        fn new() -> Mapped {
            let len = image_at(0).expect("the blob lays out").bytes.len();
            // SAFETY: a fresh anonymous private mapping, owned by the returned value.
            let at = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(at, libc::MAP_FAILED);
            let image = image_at(at as u64).expect("the blob lays out");
            // SAFETY: the mapping is `len` bytes, writable, and ours alone; then it becomes
            // read and execute only, and `itrace_encode_ring` is the function it says
            // (the build script's entry, of that signature).
            unsafe {
                std::ptr::copy_nonoverlapping(image.bytes.as_ptr(), at.cast::<u8>(), len);
                assert_eq!(libc::mprotect(at, len, libc::PROT_READ | libc::PROT_EXEC), 0);
                let entry = std::mem::transmute::<*mut u8, unsafe extern "C" fn(*mut RingArgs) -> u64>(
                    at.cast::<u8>().add(image.encode_ring as usize),
                );
                Mapped { at, len, entry }
            }
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, not used after.
            unsafe { libc::munmap(self.at, self.len) };
        }
    }

    /// A ring of `n` records of random exits (of `exits`), and the branches it stands for,
    /// worked out from the exits one by one: a count carried through exits of no branch, an
    /// indirect exit's target from its record.
    fn ring(exits: &[RingExit], n: usize, seed: u64, carry: u32, tid: u32, ts: u64) -> (Vec<u8>, Vec<Branch>, u32) {
        let mut x = seed;
        let (mut raw, mut want, mut icount) = (Vec::new(), Vec::new(), carry);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = (x >> 8) % exits.len() as u64;
            let e = exits[id as usize];
            let target = 0x7000_0000 + (x >> 40) % 64 * 16;
            raw.extend_from_slice(&id.to_le_bytes());
            raw.extend_from_slice(&target.to_le_bytes());
            icount += e.hop.icount;
            if e.branch {
                let to = if e.indirect { target } else { e.hop.to };
                want.push(Branch { icount, ..Branch::user(ts, tid, e.hop.from, to, e.hop.kind(), 0, 0) });
                icount = 0;
            }
        }
        (raw, want, icount)
    }

    fn exits() -> Vec<RingExit> {
        let kinds = [BranchKind::Jump, BranchKind::CondJump, BranchKind::Call, BranchKind::Return];
        (0..300u64)
            .map(|i| {
                let kind = kinds[i as usize % 4];
                let hop = Hop::new(0x40_1000 + i * 8, 0x40_2000 + i * 24, 1 + (i % 13) as u32, kind, 1 + i as u32);
                RingExit { hop, branch: i % 17 != 5, indirect: kind == BranchKind::Return }
            })
            .collect()
    }

    fn decoded(payload: &[u8]) -> Vec<Branch> {
        let mut dec = Decoder::new();
        let (mut at, mut out) = (0, Vec::new());
        while let Some(r) = dec.next(Endian::Little, payload, &mut at).expect("the payload decodes") {
            match r {
                Record::Branch(b) => out.push(b),
                r => panic!("a record that is not a branch: {r:?}"),
            }
        }
        out
    }

    /// The blob, run in this process as a traced thread runs it, encodes a ring into the
    /// branches worked out from the exits by hand, and into the bytes itrace's own build of the
    /// same code makes; an output too small says so.
    #[test]
    fn the_blob_encodes_a_ring_as_itrace_does() {
        let blob = Mapped::new();
        let exits = exits();
        for (n, carry, seed) in [(1usize, 0u32, 1u64), (5_000, 7, 2), (65_536, 0, 3)] {
            let (raw, want, left) = ring(&exits, n, seed, carry, 42, 1_000);
            let mut results = Vec::new();
            for run_in_blob in [false, true] {
                // The encoder's room, uninitialised: the call sets it up (`init`).
                let mut encoder = Box::<std::mem::MaybeUninit<itrace_compact::Encoder>>::new_uninit();
                let mut hops = vec![Hop::default(); 4096];
                let mut out = vec![0u8; 64 * n + 64];
                let mut args = RingArgs {
                    encoder: encoder.as_mut_ptr().cast(),
                    init: 1,
                    hops: hops.as_mut_ptr(),
                    hops_len: hops.len(),
                    exits: exits.as_ptr(),
                    exits_len: exits.len(),
                    ring: raw.as_ptr(),
                    ring_len: raw.len(),
                    out: out.as_mut_ptr(),
                    out_cap: out.len(),
                    tid: 42,
                    stamp_first: 1_000,
                    stamp_first_n: u64::MAX,
                    stamp_rest: 2_000,
                    carry: carry as u64,
                    out_len: 0,
                    branches: 0,
                    instructions: 0,
                    no_exit: 0,
                };
                let fitted = if run_in_blob {
                    // SAFETY: every pointer of `args` is valid for its length and used by nothing
                    // else during the call; the blob's entry takes them so.
                    unsafe { (blob.entry)(&mut args) }
                } else {
                    // SAFETY: as above.
                    unsafe { encode_ring_at(&mut args) }
                };
                assert_eq!(fitted, 1);
                out.truncate(args.out_len as usize);
                assert_eq!(decoded(&out), want, "{n} records, in the blob: {run_in_blob}");
                assert_eq!(args.branches, want.len() as u64);
                assert_eq!(args.instructions, want.iter().map(|b| b.icount as u64).sum::<u64>());
                assert_eq!((args.carry, args.no_exit), (left as u64, u64::MAX));
                results.push(out);

                // The same ring into too small an output: not fitted.
                args.init = 0;
                args.out_cap = args.out_len as usize / 2;
                args.carry = carry as u64;
                // SAFETY: as above (the encoder set up by the first call).
                let fitted = unsafe {
                    if run_in_blob {
                        (blob.entry)(&mut args)
                    } else {
                        encode_ring_at(&mut args)
                    }
                };
                assert_eq!(fitted, 0, "{n} records into half the room");
            }
            assert_eq!(results[0], results[1], "the blob's bytes are itrace's");
            // And the encoder of the writer thread (the trace file crate's) makes them too.
            let mut enc = Encoder::new();
            let mut by_writer = Vec::new();
            let hops: Vec<Hop> = want.iter().map(|b| Hop::new(b.from, b.to, b.icount, b.kind, 0)).collect();
            enc.hops(&mut by_writer, &hops, 42, BatchStamp { first: 1_000, first_n: usize::MAX, rest: 2_000 }, 0);
            enc.finish(&mut by_writer);
            assert_eq!(decoded(&by_writer), want);
        }
    }
}
