//! Format 3.0's compact encoding of branches (docs/trace-format.md, "CPU chunks: the compact
//! encoding"): the branch types, the encoder, and the tables it keeps in step with the decoder
//! (which lives in `itrace-format`, beside the records it makes).
//!
//! `no_std` and without dependencies, so that the same code runs in itrace and in a traced
//! process: the translating recorder maps it into the program, whose threads encode their own
//! rings (docs/translate.md). Its output goes to anything that is [`Out`]: a `Vec<u8>` (with
//! the `alloc` feature), or a fixed buffer that says when it is full ([`SliceOut`]).
//!
//! A chunk's payload is a sequence of items, each starting with a tag byte. The encoder and
//! the decoder keep the same small state, reset at every chunk so that each chunk decodes on
//! its own: the last timestamp, thread, `from` and `to`, the last branch (for runs), and a
//! table of 64 recent edges (2-way set associative, 32 sets chosen by a hash of the edge).
//! A branch whose edge (from, to, kind, flags, thread, instruction count) is in the table is
//! one byte, plus its timestamp delta when that is not 0; the same branch again with the same
//! timestamp is counted in a run. Other records (trace on/off, lost) are carried whole.

#![no_std]

#[cfg(feature = "alloc")]
extern crate alloc;

mod branch;

pub use branch::{branch_flags, major, BatchStamp, Branch, BranchKind, Hop, BRANCH_RECORD_LEN};

/// Where an encoder's bytes go.
pub trait Out {
    fn push(&mut self, b: u8);
    fn extend_from_slice(&mut self, b: &[u8]);
    /// Bytes written so far.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(feature = "alloc")]
impl Out for alloc::vec::Vec<u8> {
    #[inline(always)]
    fn push(&mut self, b: u8) {
        alloc::vec::Vec::push(self, b)
    }
    #[inline(always)]
    fn extend_from_slice(&mut self, b: &[u8]) {
        alloc::vec::Vec::extend_from_slice(self, b)
    }
    #[inline(always)]
    fn len(&self) -> usize {
        alloc::vec::Vec::len(self)
    }
}

/// A fixed buffer as an [`Out`]: bytes past its end are dropped and counted, so that a writer
/// with no allocator (a traced thread encoding its ring) finds out afterwards that its output
/// did not fit, and gives the work back instead.
pub struct SliceOut<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> SliceOut<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        SliceOut { buf, len: 0 }
    }

    /// Whether every byte written fitted.
    pub fn fitted(&self) -> bool {
        self.len <= self.buf.len()
    }
}

impl Out for SliceOut<'_> {
    #[inline(always)]
    fn push(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
        }
        self.len += 1;
    }
    #[inline(always)]
    fn extend_from_slice(&mut self, b: &[u8]) {
        if let Some(room) = self.buf.get_mut(self.len..self.len + b.len()) {
            room.copy_from_slice(b);
        }
        self.len += b.len();
    }
    /// Bytes written, those that did not fit included.
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }
}

/// What a record carried whole changes in the state both sides keep, besides the timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whole {
    /// A trace-on: the thread and the pc it starts at.
    TraceOn {
        tid: u32,
        pc: u64,
    },
    /// A trace-off: the thread.
    TraceOff {
        tid: u32,
    },
    Other,
}

/// Edges the table holds.
pub const SLOTS: usize = 64;
const SETS: usize = SLOTS / 2;
/// Edges the second table holds: every new edge, by its hash, so that an edge the first table
/// forgot costs 2 bytes instead of all its fields.
pub const FAR_SLOTS: usize = 1024;

/// Item tags.
pub mod tag {
    /// `0x00..=0x3F`: the branch of table slot `tag`, at the last timestamp.
    pub const HIT: u8 = 0x00;
    /// `0x40..=0x7F`: the branch of slot `tag - 0x40`, a timestamp delta (varint) follows.
    pub const HIT_TS: u8 = 0x40;
    /// `0x80..=0x83`: a branch not in the table, its fields follow. Bit 0: a timestamp delta
    /// follows; bit 1: a thread id delta follows.
    pub const NEW: u8 = 0x80;
    /// `0x84..=0x8B`: with `v = tag - 0x84`, the branch of slot `(v >> 1) << 8 | next byte` of
    /// the second table; `v & 1`: a timestamp delta follows (after that byte).
    pub const FAR: u8 = 0x84;
    /// The last branch again, a count byte (1 to 255) of times.
    pub const REPEAT: u8 = 0xF0;
    /// The timestamp base is set to the varint that follows (a record older than the last).
    pub const TS_SET: u8 = 0xFD;
    /// A record of the 16-byte-header layout follows whole (trace on, trace off, lost).
    pub const RECORD: u8 = 0xFE;
}

/// Meta byte of a NEW item: bits 0-3 the kind, then these flags.
pub mod meta {
    pub const KERNEL: u8 = 0x10;
    /// A flags byte and an aux varint follow.
    pub const FLAGS: u8 = 0x20;
    pub const FROM_ZERO: u8 = 0x40;
    pub const TO_ZERO: u8 = 0x80;
}

/// The longest item a branch can take, a pending run included.
pub const MAX_BRANCH_ITEM: usize = 1 + 10 + 5 + 1 + 1 + 3 + 10 + 10 + 5 + MAX_RUN_ITEM;
/// The longest run item.
const MAX_RUN_ITEM: usize = 2;
/// The most branches one run item repeats: a damaged payload cannot make a reader produce
/// more than 128 records a byte.
pub const MAX_RUN: u64 = 255;

/// One table entry: a branch without its timestamp, packed in four words so that a lookup
/// compares four words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Edge {
    pub from: u64,
    pub to: u64,
    /// tid << 32 | icount.
    pub ids: u64,
    /// 1 << 40 (a filled slot) | kernel << 32 | aux << 16 | flags << 8 | kind.
    pub meta: u64,
}

const EDGE_VALID: u64 = 1 << 40;

impl Edge {
    #[inline]
    pub fn of(b: &Branch) -> Edge {
        Edge {
            from: b.from,
            to: b.to,
            ids: (b.tid as u64) << 32 | b.icount as u64,
            meta: EDGE_VALID | (b.kernel as u64) << 32 | (b.aux as u64) << 16 | (b.flags as u64) << 8 | b.kind as u64,
        }
    }

    /// Equality as one test of the four words' differences (no branch per field).
    #[inline(always)]
    pub fn same(&self, o: &Edge) -> bool {
        (self.from ^ o.from) | (self.to ^ o.to) | (self.ids ^ o.ids) | (self.meta ^ o.meta) == 0
    }

    #[inline]
    pub fn valid(&self) -> bool {
        self.meta & EDGE_VALID != 0
    }

    #[inline]
    pub fn branch(&self, ts: u64) -> Option<Branch> {
        Some(Branch {
            ts,
            kernel: self.meta >> 32 & 1 != 0,
            kind: BranchKind::from_code(self.meta as u8)?,
            flags: (self.meta >> 8) as u8,
            aux: (self.meta >> 16) as u16,
            from: self.from,
            to: self.to,
            tid: (self.ids >> 32) as u32,
            icount: self.ids as u32,
        })
    }

    /// The hash both sides compute from the edge alone.
    #[inline]
    pub fn hash(&self) -> u64 {
        let (tid, icount, kind) = (self.ids >> 32, self.ids & 0xFFFF_FFFF, self.meta & 0xFF);
        let h = self.from ^ self.to.rotate_left(23) ^ icount << 40 ^ tid << 13 ^ kind << 56;
        h.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// The set of the first table (top 5 bits of the hash) and the slot of the second (the 10
/// bits below the top 24).
#[inline]
pub fn places(h: u64) -> (usize, usize) {
    ((h >> 59) as usize, (h >> 30) as usize & (FAR_SLOTS - 1))
}

/// The state both sides keep, reset at every chunk. In C's order: the fields every item uses
/// first, the second table (32 KB) last, so that the hot ones share a few cache lines.
#[derive(Clone)]
#[repr(C)]
pub struct State {
    pub ts: u64,
    pub tid: u32,
    pub from: u64,
    pub to: u64,
    /// The last branch (the decoder's, for runs).
    pub last: Option<Branch>,
    /// Per set, the slot (0 or 1) used last: a new edge replaces the other one.
    pub mru: [u8; SETS],
    pub table: [Edge; SLOTS],
    pub far: [Edge; FAR_SLOTS],
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    pub fn new() -> Self {
        State {
            table: [Edge::default(); SLOTS],
            far: [Edge::default(); FAR_SLOTS],
            mru: [0; SETS],
            ts: 0,
            tid: 0,
            from: 0,
            to: 0,
            last: None,
        }
    }

    /// Back to the state of a chunk's start, in place.
    pub fn clear(&mut self) {
        self.table = [Edge::default(); SLOTS];
        self.far.fill(Edge::default());
        self.mru = [0; SETS];
        (self.ts, self.tid, self.from, self.to, self.last) = (0, 0, 0, 0, None);
    }

    /// Put a new edge in the first table (the slot of its set not used last) and the second.
    #[inline]
    pub fn insert(&mut self, e: Edge, set: usize, far: usize) -> usize {
        let slot = 2 * set + (1 - self.mru[set] as usize);
        self.table[slot] = e;
        self.mru[set] = (slot & 1) as u8;
        self.far[far] = e;
        slot
    }

    /// Where a NEW item's `from` is counted from: the last block's end, else the last branch.
    #[inline]
    pub fn base_of_from(&self) -> u64 {
        if self.to != 0 {
            self.to
        } else {
            self.from
        }
    }

    /// Where its `to` is counted from: its own `from`, or for a kernel source the last `from`
    /// (a system call's return lands just after it).
    #[inline]
    pub fn base_of_to(&self, from: u64) -> u64 {
        if from != 0 {
            from
        } else {
            self.from
        }
    }

    #[inline]
    pub fn after_branch(&mut self, b: &Branch) {
        self.ts = b.ts;
        self.tid = b.tid;
        self.from = b.from;
        self.to = b.to;
        self.last = Some(*b);
    }

    /// A whole record moves the timestamp base, and a trace-on the thread and the pc.
    pub fn after_whole(&mut self, ts: u64, whole: Whole) {
        self.ts = ts;
        self.last = None;
        match whole {
            Whole::TraceOn { tid, pc } => {
                self.tid = tid;
                self.to = pc;
            }
            Whole::TraceOff { tid } => self.tid = tid,
            Whole::Other => {}
        }
    }
}

#[inline]
pub fn put_varint<O: Out>(out: &mut O, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
pub fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Encodes one stream's records into chunk payloads. In C's order: what every item uses
/// first, the tables of hints (68 KB) last.
#[derive(Clone)]
#[repr(C)]
pub struct Encoder {
    /// Times the last branch was repeated and not yet written.
    run: u64,
    /// The last branch as an edge and its timestamp (the decoder's `last`, kept in the form
    /// the run check compares fastest): no valid edge when there is no last branch.
    last_edge: Edge,
    last_ts: u64,
    /// The first-table slot that holds the last branch's edge (when there is one).
    last_slot: usize,
    /// What the items written since the last reset hold, as `StreamTotals::add_chunk` would
    /// count them walking the payload: counted here, the writer need not walk each chunk again
    /// (the walk was a fifth of the translating recorder's writer thread).
    counted: Counted,
    /// Per first-table slot, the tag (`Hop::key` << 32 | thread) of a keyed hop whose edge it
    /// holds, 0 if none is known: an edge is in the first table at most once, so a slot whose
    /// tag is a hop's, and whose `to` is the hop's, holds the hop's edge.
    owner: [u64; SLOTS],
    s: State,
    /// Per bucket of edge hashes, which slot of its set the edge last seen there was in: the
    /// slot compared first. A hint only (the compare decides), it spares the mispredicted
    /// branch between a set's two slots.
    guess: [u8; GUESSES],
    /// Per key (its low bits), the first-table slot its edge was last in: checked by `owner`.
    memo: [u8; MEMOS],
}

/// Buckets of `Encoder::memo`.
const MEMOS: usize = 1 << 16;

/// Buckets of `Encoder::guess` (the hash's top bits).
const GUESS_BITS: u32 = 12;
const GUESSES: usize = 1 << GUESS_BITS;

/// Records and bytes per kind of item (the order of `RECORD_KINDS`), and the time span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    pub records: [u64; 6],
    pub bytes: [u64; 6],
    /// The earliest and latest timestamps of the items (`u64::MAX` and 0 with none).
    pub first_ts: u64,
    pub last_ts: u64,
}

impl Counted {
    const EMPTY: Counted = Counted { records: [0; 6], bytes: [0; 6], first_ts: u64::MAX, last_ts: 0 };

    #[inline(always)]
    fn add(&mut self, kind: usize, records: u64, bytes: usize, ts: u64) {
        self.records[kind] += records;
        self.bytes[kind] += bytes as u64;
        self.first_ts = self.first_ts.min(ts);
        self.last_ts = self.last_ts.max(ts);
    }
}

/// The kinds of item, as `RECORD_KINDS` (in the trace file crate) lists them: the index of
/// each in [`Counted`]'s arrays.
pub mod kind {
    pub const HIT: usize = 0;
    pub const HIT_TS: usize = 1;
    pub const NEW: usize = 2;
    pub const FAR: usize = 3;
    pub const RUN: usize = 4;
    pub const RECORD: usize = 5;
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    pub fn new() -> Self {
        Encoder {
            s: State::new(),
            run: 0,
            last_edge: Edge::default(),
            last_ts: 0,
            counted: Counted::EMPTY,
            guess: [0; GUESSES],
            last_slot: 0,
            owner: [0; SLOTS],
            memo: [0; MEMOS],
        }
    }

    /// Start a new chunk: nothing before it is referred to.
    pub fn reset(&mut self) {
        self.s.clear();
        self.owner = [0; SLOTS];
        self.run = 0;
        self.last_edge = Edge::default();
        self.counted = Counted::EMPTY;
    }

    /// Bytes not yet in the output: a run being counted.
    pub fn pending(&self) -> usize {
        if self.run == 0 {
            0
        } else {
            MAX_RUN_ITEM
        }
    }

    /// Write what is pending (call before the payload leaves).
    #[inline]
    pub fn finish<O: Out>(&mut self, out: &mut O) {
        if self.run > 0 {
            out.push(tag::REPEAT);
            out.push(self.run as u8);
            self.counted.add(kind::RUN, self.run, 2, self.last_ts);
            self.run = 0;
        }
    }

    /// What the items written since the last reset hold (call after [`Encoder::finish`]): the
    /// totals a walk of the payload (`StreamTotals::add_chunk` in the trace file crate) finds.
    pub fn counted(&self) -> Counted {
        self.counted
    }

    /// Append a branch (inlined into the recorders' loops: a call per branch was a measurable
    /// part of the qemu plugin's writer).
    #[inline(always)]
    pub fn branch<O: Out>(&mut self, out: &mut O, b: &Branch) {
        self.edge(out, Edge::of(b), b.ts);
    }

    /// Append thread `tid`'s branches `hops`, the record `i` at `stamp.ts(first + i)`: the bytes
    /// [`Encoder::branch`] writes for each [`Hop::branch`], and their instruction counts' sum.
    /// The batch is at most two stretches of one timestamp each ([`Encoder::hops_at`]).
    pub fn hops<O: Out>(&mut self, out: &mut O, hops: &[Hop], tid: u32, stamp: BatchStamp, first: usize) -> u64 {
        let split = stamp.first_n.saturating_sub(first).min(hops.len());
        let (early, late) = hops.split_at(split);
        let mut instructions = 0;
        if !early.is_empty() {
            instructions += self.hops_at(out, early, tid, stamp.first);
        }
        if !late.is_empty() {
            instructions += self.hops_at(out, late, tid, stamp.rest);
        }
        instructions
    }

    /// [`Encoder::hops`] for branches all at timestamp `ts`. The first is made as one at a
    /// time (it may move the clock); after it, every item is at the last timestamp, and the
    /// common ones, a table hit, a second-table hit and a repeat of the last branch (a run), are
    /// made here with the encoder's state in registers (their counts and the decoder's
    /// `after_branch` settled when another kind of item comes, and at the end): through
    /// [`Encoder::branch`] each table hit took about 25 cycles.
    #[inline(always)]
    fn hops_at<O: Out>(&mut self, out: &mut O, hops: &[Hop], tid: u32, ts: u64) -> u64 {
        let ids = (tid as u64) << 32;
        let edge_of = |h: &Hop| Edge {
            from: h.from,
            to: h.to,
            ids: ids | h.icount as u64,
            meta: EDGE_VALID | h.kind_code() as u64,
        };
        let tag_of = |h: &Hop| (h.key() as u64) << 32 | tid as u64;
        let Some((h0, rest)) = hops.split_first() else { return 0 };
        let mut instructions = h0.icount as u64;
        self.edge_apart(out, edge_of(h0), ts);
        let mut last_slot = self.last_slot;
        if h0.key() != 0 {
            (self.owner[last_slot], self.memo[h0.key() as usize % MEMOS]) = (tag_of(h0), last_slot as u8);
        }
        // Every item from here on is at `ts`, which is now the last timestamp, and the last
        // branch's; the last branch's edge is in slot `last_slot`, whose owner is `last_tag`.
        debug_assert_eq!(self.s.ts, ts);
        let (mut last_tag, mut last_to) = (self.owner[last_slot], h0.to);
        // Table and second-table hits not yet counted; the run being counted.
        let (mut hits, mut fars) = (0u64, 0u64);
        let mut run = self.run;
        for h in rest {
            instructions += h.icount as u64;
            let tag = tag_of(h);
            if h.key() != 0 {
                // A keyed hop: its tag and `to` stand for its edge, and the slot its key was
                // last seen in holds that edge if the slot's owner is the tag.
                if tag == last_tag && h.to == last_to {
                    if run == MAX_RUN {
                        out.extend_from_slice(&[tag::REPEAT, MAX_RUN as u8]);
                        self.counted.add(kind::RUN, MAX_RUN, 2, ts);
                        run = 0;
                    }
                    run += 1;
                    continue;
                }
                let slot = self.memo[h.key() as usize % MEMOS] as usize;
                if self.owner[slot] == tag && self.s.table[slot].to == h.to {
                    if run > 0 {
                        out.extend_from_slice(&[tag::REPEAT, run as u8]);
                        self.counted.add(kind::RUN, run, 2, ts);
                        run = 0;
                    }
                    self.s.mru[slot / 2] = (slot & 1) as u8;
                    out.push(tag::HIT | slot as u8);
                    hits += 1;
                    (last_tag, last_to, last_slot) = (tag, h.to, slot);
                    continue;
                }
            }
            let e = edge_of(h);
            let slot = if self.s.table[last_slot].same(&e) {
                // The last branch again (a loop): counted in the run, as `Encoder::edge` does.
                if run == MAX_RUN {
                    out.extend_from_slice(&[tag::REPEAT, MAX_RUN as u8]);
                    self.counted.add(kind::RUN, MAX_RUN, 2, ts);
                    run = 0;
                }
                run += 1;
                last_slot
            } else {
                let hash = e.hash();
                let (set, far) = places(hash);
                let g = (hash >> (64 - GUESS_BITS)) as usize;
                let first = 2 * set + self.guess[g] as usize;
                let hit = if self.s.table[first].same(&e) {
                    Some(first)
                } else if self.s.table[first ^ 1].same(&e) {
                    self.guess[g] ^= 1;
                    Some(first ^ 1)
                } else {
                    None
                };
                if hit.is_some() || self.s.far[far].same(&e) {
                    if run > 0 {
                        out.extend_from_slice(&[tag::REPEAT, run as u8]);
                        self.counted.add(kind::RUN, run, 2, ts);
                        run = 0;
                    }
                    if let Some(slot) = hit {
                        self.s.mru[set] = (slot & 1) as u8;
                        out.push(tag::HIT | slot as u8);
                        hits += 1;
                        slot
                    } else {
                        let slot = self.insert(e, set, far);
                        self.guess[g] = self.s.mru[set];
                        out.extend_from_slice(&[tag::FAR + ((far >> 8) as u8) * 2, far as u8]);
                        fars += 1;
                        slot
                    }
                } else {
                    // Anything else: the state settled, and the item made as one at a time.
                    self.run = run;
                    self.settle_hits(hits, fars, last_slot, tid);
                    (hits, fars) = (0, 0);
                    self.edge_apart(out, e, ts);
                    run = self.run;
                    self.last_slot
                }
            };
            if h.key() != 0 {
                (self.owner[slot], self.memo[h.key() as usize % MEMOS]) = (tag, slot as u8);
            }
            (last_tag, last_to, last_slot) = (self.owner[slot], h.to, slot);
        }
        self.run = run;
        self.settle_hits(hits, fars, last_slot, tid);
        instructions
    }

    /// [`State::insert`], for the encoder: the slot is the last branch's, and holds no keyed
    /// hop's edge (until the caller says it does).
    #[inline(always)]
    fn insert(&mut self, e: Edge, set: usize, far: usize) -> usize {
        let slot = self.s.insert(e, set, far);
        self.owner[slot] = 0;
        self.last_slot = slot;
        slot
    }

    /// [`Encoder::edge`] as a call of its own: inlined into [`Encoder::hops`]'s loop, its
    /// registers pushed the loop's state onto the stack.
    #[inline(never)]
    fn edge_apart<O: Out>(&mut self, out: &mut O, e: Edge, ts: u64) {
        self.edge(out, e, ts);
    }

    /// After `hits` table hits and `fars` second-table hits at the last timestamp made by
    /// [`Encoder::hops`] (thread `tid`, the last of them in slot `last_slot`): their counts, and
    /// the state `edge` would have left.
    #[inline(always)]
    fn settle_hits(&mut self, hits: u64, fars: u64, last_slot: usize, tid: u32) {
        if hits + fars > 0 {
            let last = self.s.table[last_slot];
            self.counted.add(kind::HIT, hits, hits as usize, self.s.ts);
            self.counted.add(kind::FAR, fars, 2 * fars as usize, self.s.ts);
            (self.s.tid, self.s.from, self.s.to) = (tid, last.from, last.to);
            (self.last_edge, self.last_ts, self.last_slot) = (last, self.s.ts, last_slot);
        }
    }

    /// Append the branch of edge `e` at `ts`.
    #[inline(always)]
    fn edge<O: Out>(&mut self, out: &mut O, e: Edge, ts: u64) {
        if self.last_edge.same(&e) && self.last_ts == ts {
            if self.run == MAX_RUN {
                self.finish(out);
            }
            self.run += 1;
            return;
        }
        self.finish(out);
        // A timestamp reset counts with the item after it.
        let start = out.len();
        if ts < self.s.ts {
            out.push(tag::TS_SET);
            put_varint(out, ts);
            self.s.ts = ts;
        }
        let dts = ts - self.s.ts;
        let (set, far) = places(e.hash());
        let (a, c) = (2 * set, 2 * set + 1);
        let hit = if self.s.table[a] == e {
            Some(a)
        } else if self.s.table[c] == e {
            Some(c)
        } else {
            None
        };
        let (from, to, tid) = (e.from, e.to, (e.ids >> 32) as u32);
        let item = match hit {
            Some(slot) => {
                self.last_slot = slot;
                self.s.mru[set] = (slot & 1) as u8;
                if dts == 0 {
                    out.push(tag::HIT | slot as u8);
                    kind::HIT
                } else {
                    out.push(tag::HIT_TS | slot as u8);
                    put_varint(out, dts);
                    kind::HIT_TS
                }
            }
            None if self.s.far[far] == e => {
                self.insert(e, set, far);
                out.push(tag::FAR + ((dts != 0) as u8 | ((far >> 8) as u8) << 1));
                out.push(far as u8);
                if dts != 0 {
                    put_varint(out, dts);
                }
                kind::FAR
            }
            None => {
                self.insert(e, set, far);
                let dtid = tid.wrapping_sub(self.s.tid) as i32;
                out.push(tag::NEW | (dts != 0) as u8 | ((dtid != 0) as u8) << 1);
                if dts != 0 {
                    put_varint(out, dts);
                }
                if dtid != 0 {
                    put_varint(out, zigzag(dtid as i64));
                }
                // The edge's meta word: kind, kernel, flags and aux (`Edge::of`).
                let (flags, aux) = ((e.meta >> 8) as u8, (e.meta >> 16) as u16);
                let mut m = e.meta as u8;
                if e.meta >> 32 & 1 != 0 {
                    m |= meta::KERNEL;
                }
                let flagged = flags != 0 || aux != 0;
                if flagged {
                    m |= meta::FLAGS;
                }
                if from == 0 {
                    m |= meta::FROM_ZERO;
                }
                if to == 0 {
                    m |= meta::TO_ZERO;
                }
                out.push(m);
                if flagged {
                    out.push(flags);
                    put_varint(out, aux as u64);
                }
                if from != 0 {
                    put_varint(out, zigzag(from.wrapping_sub(self.s.base_of_from()) as i64));
                }
                if to != 0 {
                    put_varint(out, zigzag(to.wrapping_sub(self.s.base_of_to(from)) as i64));
                }
                put_varint(out, e.ids & 0xFFFF_FFFF);
                kind::NEW
            }
        };
        self.counted.add(item, 1, out.len() - start, ts);
        // The decoder's after_branch, with the last branch kept as its edge.
        (self.s.ts, self.s.tid, self.s.from, self.s.to) = (ts, tid, from, to);
        (self.last_edge, self.last_ts) = (e, ts);
    }

    /// Append a record carried whole: `bytes` is its 16-byte-header encoding, `ts` its
    /// timestamp, `whole` what it changes in the state both sides keep.
    pub fn whole_record<O: Out>(&mut self, out: &mut O, bytes: &[u8], ts: u64, whole: Whole) {
        self.finish(out);
        out.push(tag::RECORD);
        out.extend_from_slice(bytes);
        self.counted.add(kind::RECORD, 1, 1 + bytes.len(), ts);
        self.s.after_whole(ts, whole);
        self.last_edge = Edge::default();
    }
}
