//! Format 3.0's compact encoding of a CPU stream's records within one chunk
//! (docs/trace-format.md, "CPU chunks: the compact encoding").
//!
//! A chunk's payload is a sequence of items, each starting with a tag byte. The encoder and
//! the decoder keep the same small state, reset at every chunk so that each chunk decodes on
//! its own: the last timestamp, thread, `from` and `to`, the last branch (for runs), and a
//! table of 64 recent edges (2-way set associative, 32 sets chosen by a hash of the edge).
//! A branch whose edge (from, to, kind, flags, thread, instruction count) is in the table is
//! one byte, plus its timestamp delta when that is not 0; the same branch again with the same
//! timestamp is counted in a run. Other records (trace on/off, lost) are carried whole.

use crate::record::{record_len, BatchStamp, Branch, BranchKind, Hop, Record};
use crate::Endian;

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
pub(crate) mod meta {
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
struct Edge {
    from: u64,
    to: u64,
    /// tid << 32 | icount.
    ids: u64,
    /// 1 << 40 (a filled slot) | kernel << 32 | aux << 16 | flags << 8 | kind.
    meta: u64,
}

const EDGE_VALID: u64 = 1 << 40;

impl Edge {
    #[inline]
    fn of(b: &Branch) -> Edge {
        Edge {
            from: b.from,
            to: b.to,
            ids: (b.tid as u64) << 32 | b.icount as u64,
            meta: EDGE_VALID | (b.kernel as u64) << 32 | (b.aux as u64) << 16 | (b.flags as u64) << 8 | b.kind as u64,
        }
    }

    /// Equality as one test of the four words' differences (no branch per field).
    #[inline(always)]
    fn same(&self, o: &Edge) -> bool {
        (self.from ^ o.from) | (self.to ^ o.to) | (self.ids ^ o.ids) | (self.meta ^ o.meta) == 0
    }

    #[inline]
    fn valid(&self) -> bool {
        self.meta & EDGE_VALID != 0
    }

    #[inline]
    fn branch(&self, ts: u64) -> Option<Branch> {
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
    fn hash(&self) -> u64 {
        let (tid, icount, kind) = (self.ids >> 32, self.ids & 0xFFFF_FFFF, self.meta & 0xFF);
        let h = self.from ^ self.to.rotate_left(23) ^ icount << 40 ^ tid << 13 ^ kind << 56;
        h.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// The set of the first table (top 5 bits of the hash) and the slot of the second (the 10
/// bits below the top 24).
#[inline]
fn places(h: u64) -> (usize, usize) {
    ((h >> 59) as usize, (h >> 30) as usize & (FAR_SLOTS - 1))
}

/// The state both sides keep, reset at every chunk.
#[derive(Clone)]
struct State {
    table: [Edge; SLOTS],
    far: Box<[Edge; FAR_SLOTS]>,
    /// Per set, the slot (0 or 1) used last: a new edge replaces the other one.
    mru: [u8; SETS],
    ts: u64,
    tid: u32,
    from: u64,
    to: u64,
    last: Option<Branch>,
}

impl State {
    fn new() -> Self {
        State {
            table: [Edge::default(); SLOTS],
            far: Box::new([Edge::default(); FAR_SLOTS]),
            mru: [0; SETS],
            ts: 0,
            tid: 0,
            from: 0,
            to: 0,
            last: None,
        }
    }

    /// Back to the state of a chunk's start, in place.
    fn clear(&mut self) {
        self.table = [Edge::default(); SLOTS];
        self.far.fill(Edge::default());
        self.mru = [0; SETS];
        (self.ts, self.tid, self.from, self.to, self.last) = (0, 0, 0, 0, None);
    }

    /// Put a new edge in the first table (the slot of its set not used last) and the second.
    #[inline]
    fn insert(&mut self, e: Edge, set: usize, far: usize) -> usize {
        let slot = 2 * set + (1 - self.mru[set] as usize);
        self.table[slot] = e;
        self.mru[set] = (slot & 1) as u8;
        self.far[far] = e;
        slot
    }

    /// Where a NEW item's `from` is counted from: the last block's end, else the last branch.
    #[inline]
    fn base_of_from(&self) -> u64 {
        if self.to != 0 {
            self.to
        } else {
            self.from
        }
    }

    /// Where its `to` is counted from: its own `from`, or for a kernel source the last `from`
    /// (a system call's return lands just after it).
    #[inline]
    fn base_of_to(&self, from: u64) -> u64 {
        if from != 0 {
            from
        } else {
            self.from
        }
    }

    #[inline]
    fn after_branch(&mut self, b: &Branch) {
        self.ts = b.ts;
        self.tid = b.tid;
        self.from = b.from;
        self.to = b.to;
        self.last = Some(*b);
    }

    /// A whole record moves the timestamp base, and a trace-on the thread and the pc.
    fn after_record(&mut self, r: &Record) {
        self.ts = r.ts();
        self.last = None;
        match r {
            Record::TraceOn(on) => {
                self.tid = on.tid;
                self.to = on.pc;
            }
            Record::TraceOff(off) => self.tid = off.tid,
            _ => {}
        }
    }
}

#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Encodes one stream's records into chunk payloads.
#[derive(Clone)]
pub struct Encoder {
    s: State,
    /// Times the last branch was repeated and not yet written.
    run: u64,
    /// The last branch as an edge and its timestamp (the decoder's `last`, kept in the form
    /// the run check compares fastest): no valid edge when there is no last branch.
    last_edge: Edge,
    last_ts: u64,
    /// What the items written since the last reset hold, as `StreamTotals::add_chunk` would
    /// count them walking the payload: counted here, the writer need not walk each chunk again
    /// (the walk was a fifth of the translating recorder's writer thread).
    counted: Counted,
    /// Per bucket of edge hashes, which slot of its set the edge last seen there was in: the
    /// slot compared first. A hint only (the compare decides), it spares the mispredicted
    /// branch between a set's two slots.
    guess: Box<[u8; GUESSES]>,
    /// The first-table slot that holds the last branch's edge (when there is one).
    last_slot: usize,
    /// Per first-table slot, the tag (`Hop::key` << 32 | thread) of a keyed hop whose edge it
    /// holds, 0 if none is known: an edge is in the first table at most once, so a slot whose
    /// tag is a hop's, and whose `to` is the hop's, holds the hop's edge.
    owner: [u64; SLOTS],
    /// Per key (its low bits), the first-table slot its edge was last in: checked by `owner`.
    memo: Box<[u8; MEMOS]>,
}

/// Buckets of `Encoder::memo`.
const MEMOS: usize = 1 << 16;

/// Buckets of `Encoder::guess` (the hash's top bits).
const GUESS_BITS: u32 = 12;
const GUESSES: usize = 1 << GUESS_BITS;

/// Records and bytes per kind of item (the order of `RECORD_KINDS`), and the time span.
#[derive(Clone, Copy)]
struct Counted {
    records: [u64; 6],
    bytes: [u64; 6],
    first_ts: u64,
    last_ts: u64,
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

/// The kinds of item, as `RECORD_KINDS` lists them.
mod kind {
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
            guess: Box::new([0; GUESSES]),
            last_slot: 0,
            owner: [0; SLOTS],
            memo: Box::new([0; MEMOS]),
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
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.run > 0 {
            out.push(tag::REPEAT);
            out.push(self.run as u8);
            self.counted.add(kind::RUN, self.run, 2, self.last_ts);
            self.run = 0;
        }
    }

    /// What the items written since the last reset hold (call after [`Encoder::finish`]): the
    /// totals a walk of the payload (`StreamTotals::add_chunk`) finds.
    pub fn totals(&self) -> crate::reader::StreamTotals {
        let c = &self.counted;
        let mut t = crate::reader::StreamTotals::default();
        for k in 0..c.records.len() {
            t.kinds[k].records = c.records[k];
            t.kinds[k].bytes = c.bytes[k];
        }
        t.branches = c.records[..kind::RECORD].iter().sum();
        if c.records.iter().any(|&n| n > 0) {
            (t.first_ts, t.last_ts) = (Some(c.first_ts), Some(c.last_ts));
        }
        t
    }

    /// Append a branch (inlined into the recorders' loops: a call per branch was a measurable
    /// part of the qemu plugin's writer).
    #[inline(always)]
    pub fn branch(&mut self, out: &mut Vec<u8>, b: &Branch) {
        self.edge(out, Edge::of(b), b.ts);
    }

    /// Append thread `tid`'s branches `hops`, the record `i` at `stamp.ts(first + i)`: the bytes
    /// [`Encoder::branch`] writes for each [`Hop::branch`], and their instruction counts' sum.
    /// The batch is at most two stretches of one timestamp each ([`Encoder::hops_at`]).
    pub fn hops(&mut self, out: &mut Vec<u8>, hops: &[Hop], tid: u32, stamp: BatchStamp, first: usize) -> u64 {
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
    fn hops_at(&mut self, out: &mut Vec<u8>, hops: &[Hop], tid: u32, ts: u64) -> u64 {
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
    fn edge_apart(&mut self, out: &mut Vec<u8>, e: Edge, ts: u64) {
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
    fn edge(&mut self, out: &mut Vec<u8>, e: Edge, ts: u64) {
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

    /// Append a record carried whole: `bytes` is its 16-byte-header encoding, `r` the record.
    pub fn record(&mut self, out: &mut Vec<u8>, bytes: &[u8], r: &Record) {
        self.finish(out);
        out.push(tag::RECORD);
        out.extend_from_slice(bytes);
        self.counted.add(kind::RECORD, 1, 1 + bytes.len(), r.ts());
        self.s.after_record(r);
        self.last_edge = Edge::default();
    }
}

/// The payload of one CPU chunk holding `records` (for tools and tests that write chunks with
/// [`crate::TraceWriter::write_chunk`] themselves; recorders go through [`crate::Buffers`]).
pub fn encode_chunk(records: &[Record]) -> Result<Vec<u8>, crate::FormatError> {
    encode_chunk_counted(records).map(|(payload, _)| payload)
}

/// [`encode_chunk`], and the totals its encoder counted.
pub(crate) fn encode_chunk_counted(
    records: &[Record],
) -> Result<(Vec<u8>, crate::reader::StreamTotals), crate::FormatError> {
    let mut enc = Encoder::new();
    let (mut out, mut rec) = (Vec::new(), Vec::new());
    for r in records {
        match r {
            Record::Branch(b) => enc.branch(&mut out, b),
            r => {
                rec.clear();
                r.encode(&mut rec)?;
                enc.record(&mut out, &rec, r);
            }
        }
    }
    enc.finish(&mut out);
    Ok((out, enc.totals()))
}

/// Why an item could not be decoded.
#[derive(Debug)]
pub enum DecodeError {
    /// The item runs past the end of the bytes (a chunk cut by the file's end, or damage).
    Short,
    /// The bytes are not an item.
    Bad(String),
}

/// Decodes the items of one chunk payload.
pub struct Decoder {
    s: Box<State>,
    run: u64,
    /// Where the item after a run being yielded starts.
    run_end: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads varints and bytes from an item, failing with [`DecodeError::Short`] at the end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    #[inline]
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let x = *self.b.get(self.at).ok_or(DecodeError::Short)?;
        self.at += 1;
        Ok(x)
    }

    #[inline]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let x = self.byte()?;
            if i == 9 && x > 1 {
                return Err(DecodeError::Bad("a number longer than 64 bits".into()));
            }
            v |= ((x & 0x7f) as u64) << (7 * i);
            if x < 0x80 {
                return Ok(v);
            }
        }
        Err(DecodeError::Bad("a number longer than 64 bits".into()))
    }
}

impl Decoder {
    pub fn new() -> Self {
        Decoder { s: Box::new(State::new()), run: 0, run_end: 0 }
    }

    /// Start a new chunk.
    pub fn reset(&mut self) {
        self.s.clear();
        self.run = 0;
    }

    /// Decode the item at `*at` of `b` and move `*at` past it. `Ok(None)` at the end of `b`.
    /// A run yields its branch once per call, `*at` staying at the run's item until the last.
    pub fn next(&mut self, e: Endian, b: &[u8], at: &mut usize) -> Result<Option<Record>, DecodeError> {
        let mut r = Record::Unknown { ts: 0, major: 0, minor: 0 };
        Ok(self.next_into(e, b, at, &mut r)?.then_some(r))
    }

    /// [`Self::next`] into `out`, which is left as it was at the end of `b` (`Ok(false)`) or
    /// on an error: the merged read decodes in place, as moving records between the
    /// iterators' return values cost a third of a report's time.
    pub fn next_into(&mut self, e: Endian, b: &[u8], at: &mut usize, out: &mut Record) -> Result<bool, DecodeError> {
        if self.run > 0 {
            self.run -= 1;
            let last = self.s.last.expect("a run follows a branch");
            if self.run == 0 {
                *at = self.run_end;
            }
            *out = Record::Branch(last);
            return Ok(true);
        }
        if *at >= b.len() {
            return Ok(false);
        }
        let mut c = Cursor { b, at: *at };
        let mut t = c.byte()?;
        // A timestamp reset applies to the item after it (a loop, not a recursion: resets may
        // follow each other in a damaged payload).
        while t == tag::TS_SET {
            let ts = c.varint()?;
            if ts >= self.s.ts {
                return Err(DecodeError::Bad("a timestamp reset that does not go back".into()));
            }
            self.s.ts = ts;
            self.s.last = None;
            t = c.byte()?;
        }
        // Branches (nearly every item) are built as a `Branch` and written into `out` once.
        let br = match t {
            0x00..=0x7F => {
                let slot = (t & 0x3F) as usize;
                let dts = if t >= tag::HIT_TS { c.varint()? } else { 0 };
                let e = self.s.table[slot];
                if !e.valid() {
                    return Err(DecodeError::Bad(format!("item {t:#04x} names table slot {slot}, which is empty")));
                }
                self.s.mru[slot / 2] = (slot & 1) as u8;
                let ts = self.s.ts.checked_add(dts).ok_or_else(|| DecodeError::Bad("timestamp overflows".into()))?;
                let br = e.branch(ts).expect("a valid slot holds a known kind");
                self.s.after_branch(&br);
                br
            }
            0x80..=0x83 => {
                let dts = if t & 1 != 0 { c.varint()? } else { 0 };
                let tid = if t & 2 != 0 {
                    let d = c.varint()?;
                    if d > u32::MAX as u64 {
                        return Err(DecodeError::Bad("thread id delta out of range".into()));
                    }
                    self.s.tid.wrapping_add(unzigzag(d) as u32)
                } else {
                    self.s.tid
                };
                let m = c.byte()?;
                let kind = BranchKind::from_code(m & 0x0F)
                    .ok_or_else(|| DecodeError::Bad(format!("unknown branch kind {}", m & 0x0F)))?;
                let (flags, aux) = if m & meta::FLAGS != 0 {
                    let f = c.byte()?;
                    let a = c.varint()?;
                    if a > u16::MAX as u64 {
                        return Err(DecodeError::Bad(format!("system call or signal number {a} out of range")));
                    }
                    (f, a as u16)
                } else {
                    (0, 0)
                };
                let from = if m & meta::FROM_ZERO != 0 {
                    0
                } else {
                    self.s.base_of_from().wrapping_add(unzigzag(c.varint()?) as u64)
                };
                let to = if m & meta::TO_ZERO != 0 {
                    0
                } else {
                    self.s.base_of_to(from).wrapping_add(unzigzag(c.varint()?) as u64)
                };
                let icount = c.varint()?;
                if icount > u32::MAX as u64 {
                    return Err(DecodeError::Bad(format!("instruction count {icount} out of range")));
                }
                let ts = self.s.ts.checked_add(dts).ok_or_else(|| DecodeError::Bad("timestamp overflows".into()))?;
                let br = Branch {
                    ts,
                    kernel: m & meta::KERNEL != 0,
                    kind,
                    flags,
                    aux,
                    from,
                    to,
                    tid,
                    icount: icount as u32,
                };
                let e = Edge::of(&br);
                let (set, far) = places(e.hash());
                self.s.insert(e, set, far);
                self.s.after_branch(&br);
                br
            }
            0x84..=0x8B => {
                let v = t - tag::FAR;
                let far = (v as usize >> 1) << 8 | c.byte()? as usize;
                let dts = if v & 1 != 0 { c.varint()? } else { 0 };
                let e = self.s.far[far];
                if !e.valid() {
                    return Err(DecodeError::Bad(format!(
                        "item {t:#04x} names second-table slot {far}, which is empty"
                    )));
                }
                let (set, _) = places(e.hash());
                self.s.insert(e, set, far);
                let ts = self.s.ts.checked_add(dts).ok_or_else(|| DecodeError::Bad("timestamp overflows".into()))?;
                let br = e.branch(ts).expect("a valid slot holds a known kind");
                self.s.after_branch(&br);
                br
            }
            tag::REPEAT => {
                let n = c.byte()? as u64;
                let Some(last) = self.s.last else {
                    return Err(DecodeError::Bad("a run that follows no branch".into()));
                };
                if n == 0 {
                    return Err(DecodeError::Bad("a run of 0 branches".into()));
                }
                self.run = n - 1;
                if self.run > 0 {
                    self.run_end = c.at;
                    *out = Record::Branch(last);
                    return Ok(true);
                }
                last
            }
            tag::RECORD => {
                let rest = &b[c.at..];
                let len = record_len(e, rest).ok_or(DecodeError::Short)?;
                if len < crate::RECORD_HEADER_LEN {
                    return Err(DecodeError::Bad(format!("record length {len} is shorter than a record header")));
                }
                if len > rest.len() {
                    return Err(DecodeError::Short);
                }
                let r = Record::decode(e, &rest[..len], 0).map_err(|err| match err {
                    crate::FormatError::Corrupt { what, .. } => DecodeError::Bad(what),
                    other => DecodeError::Bad(other.to_string()),
                })?;
                match r {
                    Record::TraceOn(_) | Record::TraceOff(_) | Record::Lost(_) | Record::Unknown { .. } => {}
                    _ => return Err(DecodeError::Bad("a module or summary record in a CPU stream".into())),
                }
                c.at += len;
                self.s.after_record(&r);
                *at = c.at;
                *out = r;
                return Ok(true);
            }
            _ => return Err(DecodeError::Bad(format!("unknown item tag {t:#04x}"))),
        };
        *at = c.at;
        *out = Record::Branch(br);
        Ok(true)
    }
}
