//! The x86_64 translating recorder's work on a thread's ring of records, written once for two
//! places: itrace links it (the drain and the writer thread make hops from the rings they copy
//! out of the program), and the same source, built apart as a position-independent blob
//! (`blob/entry.rs`, built by `itrace-arch`'s build script), is mapped into the traced process,
//! where a thread can encode its own full ring into a chunk instead of stopping for itrace
//! (docs/translate.md, "Threads that encode their own rings").
//!
//! `no_std`, no allocation, no system call: in the program it runs on a thread's stack of its
//! own inside the cache, with nothing but the memory it is given.

#![no_std]

use itrace_compact::{BatchStamp, Encoder, Hop, Out, SliceOut};

/// A ring record's bytes: `[exit id: u64][target: u64]` (the target only for indirect exits).
pub const RECORD_BYTES: usize = 16;

/// An exit as a ring's record of it makes a hop: the hop ready, with its key, so that the loop
/// over a ring's records copies it (with an indirect exit's target from the record) instead of
/// putting it together field by field. In C's layout: itrace writes the table that the
/// program's copy of this code reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct RingExit {
    /// The exit's branch with nothing carried into it (`icount`: the exit's count); an indirect
    /// exit's target is the record's. For an exit of no branch only `icount` means something.
    pub hop: Hop,
    /// The exit takes a branch (not the size limit, whose count carries on to the next record).
    pub branch: bool,
    /// The target is in the record.
    pub indirect: bool,
}

/// Where a ring's reading stands: the next record's offset, and the instructions of records not
/// yet in a branch (exits of no branch: the size limit), starting with the thread's count
/// carried in from before the ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCursor {
    pub at: usize,
    pub icount: u32,
}

/// What one call of [`fill_hops`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filled {
    /// Hops made.
    pub made: usize,
    /// Records are left to read.
    pub more: bool,
    /// The id of a record with no exit, if one was met: the rest of the ring is dropped.
    pub no_exit: Option<u64>,
}

/// Make hops from the records of `raw` from `cursor` on, into `hops` (one at most a record).
#[inline]
pub fn fill_hops(exits: &[RingExit], raw: &[u8], cursor: &mut RingCursor, hops: &mut [Hop]) -> Filled {
    let mut icount = cursor.icount;
    let start = cursor.at.min(raw.len());
    let records = (raw.len() - start) / RECORD_BYTES;
    let take = records.min(hops.len());
    let mut made = 0;
    // Records read: all taken, unless one has no exit (the rest of the ring is dropped).
    let mut read = take;
    let mut no_exit = None;
    for (i, r) in raw[start..start + take * RECORD_BYTES].chunks_exact(RECORD_BYTES).enumerate() {
        prefetch_ahead(raw, start + i * RECORD_BYTES);
        let id = u64::from_le_bytes([r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]]);
        let Some(e) = exits.get(id as usize) else {
            no_exit = Some(id);
            read = records;
            break;
        };
        icount = icount.wrapping_add(e.hop.icount);
        if e.branch {
            let mut hop = e.hop;
            if e.indirect {
                hop.to = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
            }
            if icount != hop.icount {
                hop = hop.carried(icount);
            }
            // `made` < `take` <= `hops.len()`: a record makes one hop at most.
            if let Some(slot) = hops.get_mut(made) {
                *slot = hop;
            }
            made += 1;
            icount = 0;
        }
    }
    cursor.icount = icount;
    cursor.at = start + read * RECORD_BYTES;
    let more = cursor.at + RECORD_BYTES <= raw.len();
    Filled { made, more, no_exit }
}

/// Bytes ahead of the record being read that are asked for ahead of time.
const PREFETCH_AHEAD: usize = 2048;

/// Ask for the cache line `PREFETCH_AHEAD` bytes past the record at `at` of a ring, once a
/// line. A ring's copy is written by the kernel (or on the other CPU): read in order as it is,
/// each line's load waited for it (most of the samples of the loops that read it).
#[inline(always)]
pub fn prefetch_ahead(raw: &[u8], at: usize) {
    if at % 64 == 0 {
        if let Some(ahead) = raw.get(at + PREFETCH_AHEAD) {
            // SAFETY: a prefetch is a hint that never faults nor changes memory, and SSE (which
            // has it) is part of every x86_64 CPU; the address is inside `raw` anyway.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>((ahead as *const u8).cast())
            };
        }
    }
}

/// What [`encode_ring`] made of a ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    /// Branches encoded.
    pub branches: u64,
    /// Their instructions.
    pub instructions: u64,
    /// Bytes of the payload (more than the output holds if it did not fit).
    pub len: usize,
    /// The id of a record with no exit, if one was met (the rest of the ring was dropped).
    pub no_exit: Option<u64>,
}

/// Encode thread `tid`'s ring `raw` (read from `cursor`), stamped by `stamp`, as one chunk's
/// payload into `out`: the encoder starts from a chunk's empty state, and its items are
/// finished. `hops` is the room the hops are made in, a piece at a time, so that they stay in
/// the cache until encoded.
#[allow(clippy::too_many_arguments)]
pub fn encode_ring<O: Out>(
    enc: &mut Encoder,
    out: &mut O,
    hops: &mut [Hop],
    exits: &[RingExit],
    raw: &[u8],
    cursor: &mut RingCursor,
    tid: u32,
    stamp: BatchStamp,
) -> Encoded {
    let mut done = Encoded::default();
    enc.reset();
    if hops.is_empty() {
        return done;
    }
    loop {
        let f = fill_hops(exits, raw, cursor, hops);
        done.instructions += enc.hops(out, &hops[..f.made], tid, stamp, done.branches as usize);
        done.branches += f.made as u64;
        if f.no_exit.is_some() {
            done.no_exit = f.no_exit;
        }
        if !f.more {
            break;
        }
    }
    enc.finish(out);
    done.len = out.len();
    done
}

/// The arguments of [`encode_ring_at`]: what a thread's call of the blob passes, in C's layout
/// (the blob and itrace are built apart).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct RingArgs {
    /// The encoder's room: `size_of::<Encoder>()` bytes, 8-aligned. Set up there when `init`.
    pub encoder: *mut Encoder,
    pub init: u64,
    pub hops: *mut Hop,
    pub hops_len: usize,
    pub exits: *const RingExit,
    pub exits_len: usize,
    pub ring: *const u8,
    pub ring_len: usize,
    pub out: *mut u8,
    pub out_cap: usize,
    pub tid: u64,
    pub stamp_first: u64,
    pub stamp_first_n: u64,
    pub stamp_rest: u64,
    /// In: the instructions carried in from before the ring; out: those left to the next.
    pub carry: u64,
    /// Out: the payload's bytes, the branches and their instructions, and the id of a record
    /// with no exit (`u64::MAX` if none).
    pub out_len: u64,
    pub branches: u64,
    pub instructions: u64,
    pub no_exit: u64,
}

/// [`encode_ring`] from raw arguments: the blob's entry. Returns 1 if the payload fitted in
/// `out`, 0 if not (nothing of it is to be used then).
///
/// # Safety
/// Every pointer of `args` is valid for its length (`encoder` for an `Encoder`, set up unless
/// `init`), the regions do not overlap, and nothing else uses them during the call.
pub unsafe fn encode_ring_at(args: &mut RingArgs) -> u64 {
    let a = *args;
    if a.init != 0 {
        // SAFETY: the caller gives room for an Encoder; writing a fresh one there needs no
        // value there before.
        unsafe { a.encoder.write(Encoder::new()) };
        args.init = 0;
    }
    // SAFETY: the caller's contract: each region is valid for its length and used by no one
    // else during the call.
    let (enc, hops, exits, raw, out) = unsafe {
        (
            &mut *a.encoder,
            core::slice::from_raw_parts_mut(a.hops, a.hops_len),
            core::slice::from_raw_parts(a.exits, a.exits_len),
            core::slice::from_raw_parts(a.ring, a.ring_len),
            core::slice::from_raw_parts_mut(a.out, a.out_cap),
        )
    };
    let mut out = SliceOut::new(out);
    let mut cursor = RingCursor { at: 0, icount: a.carry as u32 };
    let stamp = BatchStamp { first: a.stamp_first, first_n: a.stamp_first_n as usize, rest: a.stamp_rest };
    let done = encode_ring(enc, &mut out, hops, exits, raw, &mut cursor, a.tid as u32, stamp);
    args.carry = cursor.icount as u64;
    args.out_len = done.len as u64;
    args.branches = done.branches;
    args.instructions = done.instructions;
    args.no_exit = done.no_exit.unwrap_or(u64::MAX);
    out.fitted() as u64
}
