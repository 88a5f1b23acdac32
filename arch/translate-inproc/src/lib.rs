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

impl RingExit {
    /// Its bytes as the program's copy of the table holds them (C's layout, 32 bytes: the hop's
    /// from, to, count and kind-and-key, the two flags, zeros).
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&self.hop.from.to_le_bytes());
        b[8..16].copy_from_slice(&self.hop.to.to_le_bytes());
        b[16..20].copy_from_slice(&self.hop.icount.to_le_bytes());
        b[20..24].copy_from_slice(&(self.hop.key() << 8 | self.hop.kind_code() as u32).to_le_bytes());
        b[24] = self.branch as u8;
        b[25] = self.indirect as u8;
        b
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use itrace_compact::BranchKind;

    /// The bytes itrace writes are the struct the program's copy of the code reads.
    #[test]
    fn a_ring_exits_bytes_are_its_layout() {
        assert_eq!(core::mem::size_of::<RingExit>(), 32);
        for (branch, indirect) in [(true, false), (false, true)] {
            let e = RingExit {
                hop: Hop::new(0x1122_3344, 0x5566_7788_99aa, 77, BranchKind::Return, 0x12_3456),
                branch,
                indirect,
            };
            let b = e.to_bytes();
            // SAFETY: 32 bytes, read unaligned into a RingExit: each field's bytes are a valid
            // value of it (the flags 0 or 1).
            let back: RingExit = unsafe { b.as_ptr().cast::<RingExit>().read_unaligned() };
            assert_eq!(back, e);
        }
    }
}

/// The thread state block's layout (a thread in the cache reaches it through its gs base;
/// itrace's `layout.rs` uses these): what the blob reads and writes when the thread encodes its
/// own ring. Offsets in bytes from the block's start.
pub mod block {
    /// The ring's fill: minus the bytes still free (0 when full).
    pub const RING_OFF: i64 = 0x20;
    /// The ring's records of exits of no branch.
    pub const NO_BRANCH: i64 = 0x48;
    /// In and out of the blob: the instructions carried from the records before the ring.
    pub const XL_CARRY: i64 = 0x50;
    /// (Free.)
    pub const XL_SPARE: i64 = 0x58;
    /// Bytes of encoded chunks in the output area (itrace takes them and sets it to 0).
    pub const XL_OUT_LEN: i64 = 0x60;
    /// Where the ring-full path goes on: after the record (encoded), or to its trap (not).
    pub const XL_BACK: i64 = 0x68;
    pub const XL_TRAP: i64 = 0x70;
    /// The application's rsp while the thread runs on the block's stack.
    pub const XL_APP_RSP: i64 = 0x78;
    /// The routine that calls the blob (saves, stack, call, restores), the blob's entry, the
    /// block's own address, and the top of its stack.
    pub const XL_ROUTINE: i64 = 0x80;
    pub const XL_ENTRY: i64 = 0x88;
    pub const XL_SELF: i64 = 0x90;
    pub const XL_STACK_TOP: i64 = 0x98;
    /// The process's exit table: a count (u64), then at `EXITS_FIRST` the `RingExit`s.
    pub const XL_EXITS: i64 = 0xA0;
    /// The thread's id, for the chunk's branches.
    pub const XL_TID: i64 = 0xA8;
    /// Scratch of the routine: the address it goes on at.
    pub const XL_GO: i64 = 0xB0;
    /// Non-zero once the encoder in `ENCODER` is set up.
    pub const XL_ENCODER_SET: i64 = 0xB8;

    /// The ring of records.
    pub const RING: i64 = 0x1000;
    pub const RECORD_BYTES: i64 = 16;
    pub const RING_RECORDS: i64 = 1 << 16;
    pub const RING_BYTES: i64 = RING_RECORDS * RECORD_BYTES;
    pub const RING_END: i64 = RING + RING_BYTES;
    /// The indirect-branch lookup table.
    pub const TABLE: i64 = RING_END;
    pub const TABLE_ENTRIES: u64 = 1 << 16;
    pub const TABLE_ENTRY_BYTES: u64 = 16;
    pub const TABLE_END: i64 = TABLE + (TABLE_ENTRIES * TABLE_ENTRY_BYTES) as i64;
    /// The encoder's room.
    pub const ENCODER: i64 = TABLE_END;
    pub const ENCODER_BYTES: i64 = 0x2_0000;
    /// The hops made a piece at a time.
    pub const HOPS: i64 = ENCODER + ENCODER_BYTES;
    pub const HOPS_LEN: usize = 4096;
    pub const HOPS_BYTES: i64 = 0x1_8000;
    /// The stack the blob runs on.
    pub const STACK: i64 = HOPS + HOPS_BYTES;
    pub const STACK_BYTES: i64 = 0x4_0000;
    pub const STACK_TOP: i64 = STACK + STACK_BYTES;
    /// Encoded chunks, each a `ChunkHead` and its payload (padded to 8 bytes).
    pub const OUT: i64 = STACK_TOP;
    pub const OUT_BYTES: i64 = 0x20_0000;
    /// The whole block.
    pub const STATE_BYTES: u64 = (OUT + OUT_BYTES) as u64;

    /// Where the exit table's entries start (after its count).
    pub const EXITS_FIRST: u64 = 64;
}

/// The head of a chunk a thread encoded, in the block's output area.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ChunkHead {
    /// The payload's bytes (it follows the head, padded to 8 bytes).
    pub len: u64,
    pub branches: u64,
    pub instructions: u64,
    /// The timestamp every branch of it has (0: given when itrace takes the chunk).
    pub stamp: u64,
    /// The encoder's counts (`itrace_compact::Counted`): records and bytes per kind of item.
    pub records: [u64; 6],
    pub bytes: [u64; 6],
    pub first_ts: u64,
    pub last_ts: u64,
}

/// Bytes of a [`ChunkHead`].
pub const CHUNK_HEAD_BYTES: usize = core::mem::size_of::<ChunkHead>();

/// The blob's work at a full ring, on the thread's own state block `block`: encode the ring as
/// a chunk appended to the output area, and empty the ring. Returns 1 if done, 0 if not (the
/// output area is full, or a record has no exit): nothing changed then, and the thread traps
/// to itrace, which drains the ring as before.
///
/// # Safety
/// `block` is a thread state block laid out as [`block`] says, used by no one else during the
/// call; its exit table's count says how many entries are valid.
pub unsafe fn self_encode(block: *mut u8) -> u64 {
    use block::*;
    // SAFETY: all of the reads and writes below are at offsets inside the block, as laid out,
    // and in the exit table itrace wrote before the code whose records these are could run.
    unsafe {
        let slot = |off: i64| block.add(off as usize).cast::<u64>();
        let ring_off = slot(RING_OFF).read() as i64;
        let used = (ring_off + RING_BYTES).clamp(0, RING_BYTES) as usize;
        let out_len = slot(XL_OUT_LEN).read() as usize;
        let room = (OUT_BYTES as usize).saturating_sub(out_len + CHUNK_HEAD_BYTES);
        let exits_at = slot(XL_EXITS).read() as *const u8;
        if exits_at.is_null() || room < 1024 {
            return 0;
        }
        let exits_len = exits_at.cast::<u64>().read() as usize;
        let exits = core::slice::from_raw_parts(exits_at.add(EXITS_FIRST as usize).cast::<RingExit>(), exits_len);
        let enc = block.add(ENCODER as usize).cast::<Encoder>();
        if slot(XL_ENCODER_SET).read() == 0 {
            enc.write(Encoder::new());
            slot(XL_ENCODER_SET).write(1);
        }
        let hops = core::slice::from_raw_parts_mut(block.add(HOPS as usize).cast::<Hop>(), HOPS_LEN);
        let raw = core::slice::from_raw_parts(block.add(RING as usize), used);
        let head_at = block.add(OUT as usize + out_len);
        let out = core::slice::from_raw_parts_mut(head_at.add(CHUNK_HEAD_BYTES), room);
        let mut out = SliceOut::new(out);
        // Its timestamps are given at collection (`restamp_chunk` in the trace file crate): no
        // clock reading here, and a chunk made long before itrace takes it still falls in time
        // order among the records stored meanwhile.
        let stamp = 0;
        let mut cursor = RingCursor { at: 0, icount: slot(XL_CARRY).read() as u32 };
        let batch = BatchStamp { first: stamp, first_n: usize::MAX, rest: stamp };
        let tid = slot(XL_TID).read() as u32;
        let done = encode_ring(&mut *enc, &mut out, hops, exits, raw, &mut cursor, tid, batch);
        if !out.fitted() || done.no_exit.is_some() {
            return 0;
        }
        let c = (*enc).counted();
        let head = ChunkHead {
            len: done.len as u64,
            branches: done.branches,
            instructions: done.instructions,
            stamp,
            records: c.records,
            bytes: c.bytes,
            first_ts: c.first_ts,
            last_ts: c.last_ts,
        };
        head_at.cast::<ChunkHead>().write_unaligned(head);
        slot(XL_OUT_LEN).write((out_len + CHUNK_HEAD_BYTES + done.len.div_ceil(8) * 8) as u64);
        slot(XL_CARRY).write(cursor.icount as u64);
        slot(NO_BRANCH).write(0);
        slot(RING_OFF).write(-RING_BYTES as u64);
        1
    }
}
