//! Per-CPU trace buffers and the MTE buffer, with PI's three collection modes.
//!
//! A CPU stream's records are stored encoded (format 3.0's compact encoding, [`crate::compact`])
//! in blocks: each block decodes on its own and becomes one chunk of the file.
//!
//! - normal: each CPU's blocks together hold at most `buffer_size` bytes; when a branch does
//!   not fit, [`Push::Full`] tells the recorder to stop tracing. Control records (trace on/off)
//!   are always stored, so the trace says why it ended.
//! - wrap: each CPU's blocks form a ring of `buffer_size` bytes: when a new record does not
//!   fit, the oldest whole block is evicted, its records counted as lost. A block is a
//!   sixteenth of the buffer (at most a segment), so the ring keeps the most recent records
//!   in at least 15/16 of the buffer. MTE records are streamed to the file in segments and
//!   never overwritten.
//! - continuous: each CPU (and the MTE stream) fills a segment of `segment_size` bytes,
//!   written to the file as a chunk when full; memory stays constant and nothing is lost
//!   unless the write fails. Segments are also written when their oldest record is
//!   [`FLUSH_AFTER_NS`] old (checked every [`CHECK_EVERY`] pushes and by
//!   [`Buffers::flush_if_due`], which recording loops call when they wake), so a recorder
//!   killed with SIGKILL leaves a valid file that lacks at most its last second.

use crate::compact::{Decoder, Encoder, MAX_BRANCH_ITEM};
use crate::reader::StreamTotals;
use crate::record::{raw_records, BatchStamp, Branch, Hop, Lost, Record, Summary, TraceOn, TraceOnReason};
use crate::writer::{TraceWriter, CHUNK_FLAG_WRAPPED, STREAM_END, STREAM_MTE};
use crate::{Endian, FormatError, Mode};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a recording has stored so far, for a status line drawn by another thread. The
/// buffers' owner is the only writer; readers see each value as of a recent push.
#[derive(Debug, Default)]
pub struct LiveCounts {
    /// Branch records stored (wrap mode: including those overwritten since).
    pub branches: AtomicU64,
    /// Instructions those branch records count.
    pub instructions: AtomicU64,
    /// Bytes written to the trace file.
    pub bytes: AtomicU64,
    /// What reached the file: CPU-stream records (trace-on/off included), the taken branches
    /// among them and the instructions they count (partial blocks of trace-off records
    /// included). Differs from the totals above only when a write failed.
    pub written_records: AtomicU64,
    pub written_branches: AtomicU64,
    pub written_instructions: AtomicU64,
    /// CPU-stream records stored in memory whose chunk could not be written.
    pub unwritten_records: AtomicU64,
}

/// Continuous mode: a segment whose oldest record is this old is written as a chunk even if
/// it is not full. Half the promised second: a check can come up to ~0.5 s late (recording
/// loops wake at least every 500 ms), and the loss bound is the sum.
pub const FLUSH_AFTER_NS: u64 = 500_000_000;
/// Pushes between two readings of the clock for [`FLUSH_AFTER_NS`] (a clock reading costs
/// about as much as a push; this keeps it under 0.1% of them).
pub const CHECK_EVERY: u32 = 1024;
/// Smallest block of a normal or wrap buffer.
const MIN_BLOCK: usize = 256;

/// Sizes and mode of the buffers.
#[derive(Clone, Debug)]
pub struct BufferConfig {
    pub mode: Mode,
    pub ncpu: usize,
    /// Bytes per CPU (normal and wrap).
    pub buffer_size: usize,
    /// Bytes per segment (continuous; MTE in wrap mode).
    pub segment_size: usize,
    /// Bytes of MTE buffer (normal).
    pub mte_size: usize,
}

/// Outcome of storing a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Push {
    Stored,
    /// Normal mode: the buffer is full; the record was not stored (or, for MTE, stored in the reserve) and tracing must stop.
    Full,
}

/// What a block's records count for the totals of what reached the file.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// The program's records (not the Lost and resume records wrap mode adds).
    records: u64,
    branches: u64,
    instructions: u64,
}

impl Tally {
    /// What one record of a CPU stream adds: the Lost and resume records a wrapped ring
    /// adds are not the program's; a trace-off record counts the instructions before it.
    fn of(r: &Record) -> Tally {
        match r {
            Record::Branch(b) => Tally { records: 1, branches: 1, instructions: b.icount as u64 },
            Record::Lost(_) => Tally::default(),
            Record::TraceOn(on) if on.reason == TraceOnReason::Resume => Tally::default(),
            Record::TraceOff(off) => Tally { records: 1, branches: 0, instructions: off.icount as u64 },
            _ => Tally { records: 1, ..Tally::default() },
        }
    }

    fn add(&mut self, t: Tally) {
        self.records += t.records;
        self.branches += t.branches;
        self.instructions += t.instructions;
    }
}

/// Encoded records of one CPU stream that decode on their own: one chunk of the file.
struct Block {
    data: Vec<u8>,
    /// Records in it (what evicting it loses).
    records: u64,
    tally: Tally,
    first_ts: Option<u64>,
    /// What its items hold, as its encoder counted them, once the block is closed.
    counted: Option<StreamTotals>,
}

impl Block {
    fn new(data: Vec<u8>) -> Self {
        Block { data, records: 0, tally: Tally::default(), first_ts: None, counted: None }
    }
}

/// One CPU stream: the block being filled and, in normal and wrap modes, the closed ones.
struct CpuStream {
    cur: Block,
    enc: Encoder,
    /// Closed blocks, oldest first.
    done: VecDeque<Block>,
    done_bytes: usize,
    /// Buffers of evicted blocks, to fill again.
    spare: Vec<Vec<u8>>,
}

impl CpuStream {
    fn used(&self) -> usize {
        self.done_bytes + self.cur.data.len() + self.enc.pending()
    }

    /// Close the current block (its items complete) and start a new one with fresh state.
    fn close(&mut self, block_size: usize) {
        self.enc.finish(&mut self.cur.data);
        self.cur.counted = Some(self.enc.totals());
        self.enc.reset();
        let fresh = self.spare.pop().unwrap_or_else(|| Vec::with_capacity(block_size));
        let old = std::mem::replace(&mut self.cur, Block::new(fresh));
        if !old.data.is_empty() {
            self.done_bytes += old.data.len();
            self.done.push_back(old);
        } else {
            self.spare.push(old.data);
        }
    }
}

/// The MTE stream's store (records of the 16-byte-header layout).
enum MteStore {
    Linear(Vec<u8>),
    Segment(Vec<u8>),
}

/// All buffers of one recording, and the file they end up in.
pub struct Buffers {
    cfg: BufferConfig,
    writer: TraceWriter,
    cpus: Vec<CpuStream>,
    /// Bytes a CPU block holds at most (continuous: the segment size).
    block_size: usize,
    mte: MteStore,
    records: Vec<u64>,
    lost: Vec<u64>,
    mte_records: u64,
    scratch: Vec<u8>,
    /// Wrap mode, per CPU: where each thread's next block starts, as of the newest evicted record,
    /// so the oldest surviving block of each thread still has a known start.
    evicted_start: Vec<HashMap<u32, u64>>,
    live: Arc<LiveCounts>,
    branches: u64,
    instructions: u64,
    /// Continuous mode: when the oldest record not yet in the file was stored (`u64::MAX`:
    /// nothing waits), and pushes left before the clock is read again.
    oldest: u64,
    until_check: u32,
}

impl Buffers {
    /// Buffers writing into `writer` (whose header is already written). Sizes the machine cannot
    /// give are an error now rather than an abort later: each CPU's buffer is first reserved
    /// whole, in one piece (as the kernel would refuse it), then given back; its blocks are
    /// taken as they fill.
    pub fn new(cfg: BufferConfig, writer: TraceWriter) -> Result<Self, FormatError> {
        let too_big = |per_cpu: usize| FormatError::NoMemory { per_cpu: per_cpu as u64, ncpu: cfg.ncpu };
        let vec = |n: usize| -> Result<Vec<u8>, FormatError> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| too_big(n))?;
            Ok(v)
        };
        let block_size = match cfg.mode {
            Mode::Continuous => cfg.segment_size.max(MIN_BLOCK),
            Mode::Normal | Mode::Wrap => {
                (cfg.buffer_size / 16).clamp(MIN_BLOCK, cfg.segment_size.clamp(MIN_BLOCK, 16 << 20))
            }
        };
        // Room for what a block holds past its size: the item that closes it.
        let block_cap = block_size + 2 * MAX_BRANCH_ITEM;
        let cpu = || -> Result<CpuStream, FormatError> {
            if cfg.mode != Mode::Continuous {
                drop(vec(cfg.buffer_size)?);
            }
            let spare = Vec::new();
            Ok(CpuStream {
                cur: Block::new(vec(block_cap)?),
                enc: Encoder::new(),
                done: VecDeque::new(),
                done_bytes: 0,
                spare,
            })
        };
        let cpus = (0..cfg.ncpu).map(|_| cpu()).collect::<Result<_, _>>()?;
        let mte = match cfg.mode {
            Mode::Normal => MteStore::Linear(Vec::new()),
            Mode::Wrap | Mode::Continuous => MteStore::Segment(vec(cfg.segment_size)?),
        };
        Ok(Buffers {
            records: vec![0; cfg.ncpu],
            lost: vec![0; cfg.ncpu],
            evicted_start: vec![HashMap::new(); cfg.ncpu],
            cfg,
            writer,
            cpus,
            block_size,
            mte,
            mte_records: 0,
            scratch: Vec::with_capacity(256),
            live: Arc::default(),
            branches: 0,
            instructions: 0,
            oldest: u64::MAX,
            until_check: CHECK_EVERY,
        })
    }

    /// The collection mode.
    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }

    /// Keep the running totals in `live` (shared with a status line made before the buffers).
    pub fn with_live(mut self, live: Arc<LiveCounts>) -> Self {
        self.live = live;
        self
    }

    /// The running totals, shared with whoever shows progress.
    pub fn live(&self) -> Arc<LiveCounts> {
        Arc::clone(&self.live)
    }

    /// Store a branch record for `cpu`, given in the 40-byte layout of [`Branch::encode_into`].
    /// In normal mode a full buffer refuses it.
    #[inline]
    pub fn push_trace(&mut self, cpu: usize, rec: &[u8]) -> Result<Push, FormatError> {
        match Record::decode(Endian::native(), rec, 0)? {
            Record::Branch(b) => self.push_branch(cpu, &b),
            r => self.push_control(cpu, &r).map(|_| Push::Stored),
        }
    }

    /// Store whole encoded records of `cpu` (`n` of them, in the 16-byte-header layout), one by
    /// one; control records are never refused. Returns [`Push::Full`] at the first branch
    /// record a normal-mode buffer refuses, dropping it and the rest.
    pub fn push_records(&mut self, cpu: usize, data: &[u8], n: u64) -> Result<Push, FormatError> {
        let e = Endian::native();
        let mut seen = 0;
        for rec in raw_records(e, data) {
            let rec = rec.map_err(|at| FormatError::Corrupt { offset: at as u64, what: "partial record".into() })?;
            seen += 1;
            match Record::decode(e, rec.bytes, rec.offset as u64)? {
                Record::Branch(b) => {
                    if self.push_branch(cpu, &b)? == Push::Full {
                        return Ok(Push::Full);
                    }
                }
                r => self.push_control(cpu, &r)?,
            }
        }
        if seen != n {
            return Err(FormatError::Corrupt { offset: 0, what: format!("{seen} whole records where {n} were said") });
        }
        Ok(Push::Stored)
    }

    /// Continuous mode: write `data` as one chunk of `cpu`'s stream: whole items that an
    /// [`Encoder`] made from a fresh state and finished ([`Encoder::finish`]), holding `records`
    /// records, `branches` of them taken branches counting `instructions`. What waits in the MTE
    /// segment and in this stream's own segment is written first, so the file keeps its order.
    /// Recorders that encode on their own threads (the qemu plugin's vCPUs) hand chunks here.
    pub fn push_encoded(
        &mut self,
        cpu: usize,
        data: &[u8],
        records: u64,
        branches: u64,
        instructions: u64,
    ) -> Result<(), FormatError> {
        self.push_encoded_counted(cpu, data, records, branches, instructions, None)
    }

    /// [`Buffers::push_encoded`] with what the chunk's items hold, as its encoder counted them
    /// ([`Encoder::totals`]): the writer need not walk the chunk for the file's totals.
    pub fn push_encoded_counted(
        &mut self,
        cpu: usize,
        data: &[u8],
        records: u64,
        branches: u64,
        instructions: u64,
        counted: Option<&StreamTotals>,
    ) -> Result<(), FormatError> {
        if self.cfg.mode != Mode::Continuous {
            return Err(FormatError::Write(std::io::Error::other("encoded chunks are for continuous mode only")));
        }
        if data.is_empty() {
            return Ok(());
        }
        if let MteStore::Segment(m) = &mut self.mte {
            flush_mte(&mut self.writer, &self.live, m)?;
        }
        if self.cpus[cpu].cur.records > 0 {
            self.flush_cpu(cpu)?;
        }
        let tally = Tally { records, branches, instructions };
        let r = flush_block(&mut self.writer, &self.live, cpu as u16, 0, data, tally, counted);
        self.records[cpu] += records;
        self.branches += branches;
        self.instructions += instructions;
        self.live.branches.store(self.branches, Ordering::Relaxed);
        self.live.instructions.store(self.instructions, Ordering::Relaxed);
        r
    }

    /// Make room for an item of `len` bytes on `cpu`'s stream, as the mode says; false when a
    /// normal-mode buffer refuses it (never for a control record).
    #[inline]
    fn room(&mut self, cpu: usize, len: usize, control: bool) -> Result<bool, FormatError> {
        let bs = self.block_size;
        match self.cfg.mode {
            Mode::Continuous => {
                let st = &self.cpus[cpu];
                if st.cur.data.len() + st.enc.pending() + len > bs && st.cur.records > 0 {
                    // MTE records first, so any trace chunk on disk can be symbolised even if
                    // the recording never finishes.
                    if let MteStore::Segment(m) = &mut self.mte {
                        flush_mte(&mut self.writer, &self.live, m)?;
                    }
                    self.flush_cpu(cpu)?;
                }
            }
            Mode::Normal => {
                let st = &mut self.cpus[cpu];
                if !control && st.used() + len > self.cfg.buffer_size {
                    return Ok(false);
                }
                if st.cur.data.len() + st.enc.pending() + len > bs && st.cur.records > 0 {
                    st.close(bs);
                }
            }
            Mode::Wrap => {
                let st = &mut self.cpus[cpu];
                if st.cur.data.len() + st.enc.pending() + len > bs && st.cur.records > 0 {
                    st.close(bs);
                }
                while st.used() + len > self.cfg.buffer_size {
                    let Some(old) = st.done.pop_front() else { break };
                    st.done_bytes -= old.data.len();
                    note_evicted(&mut self.evicted_start[cpu], &old.data);
                    self.lost[cpu] += old.records;
                    self.records[cpu] -= old.records;
                    let mut v = old.data;
                    v.clear();
                    st.spare.push(v);
                }
            }
        }
        Ok(true)
    }

    /// Store a taken branch for `cpu`. In normal mode a full buffer refuses it.
    #[inline]
    pub fn push_branch(&mut self, cpu: usize, b: &Branch) -> Result<Push, FormatError> {
        if !self.room(cpu, MAX_BRANCH_ITEM, false)? {
            return Ok(Push::Full);
        }
        let st = &mut self.cpus[cpu];
        st.enc.branch(&mut st.cur.data, b);
        let blk = &mut st.cur;
        blk.records += 1;
        blk.first_ts.get_or_insert(b.ts);
        blk.tally.records += 1;
        blk.tally.branches += 1;
        blk.tally.instructions += b.icount as u64;
        self.records[cpu] += 1;
        self.branches += 1;
        self.instructions += b.icount as u64;
        self.live.branches.store(self.branches, Ordering::Relaxed);
        self.live.instructions.store(self.instructions, Ordering::Relaxed);
        self.stored_segment()?;
        Ok(Push::Stored)
    }

    /// Store taken branches for `cpu`, in order: what [`Buffers::push_branch`] does for each,
    /// with its bookkeeping (the room check, the tallies, the shared counts, the flush clock)
    /// paid once per stretch that fits the current block instead of once per branch. A
    /// recorder that turns a whole ring into records at once (the translating recorder's drain)
    /// spent more on that bookkeeping than on the encoding. Returns how many were stored:
    /// fewer than `bs.len()` only when a normal-mode buffer refused the next one (as
    /// `push_branch` would have refused it and all after it).
    pub fn push_branches(&mut self, cpu: usize, bs: &[Branch]) -> Result<usize, FormatError> {
        self.push_stretches(
            cpu,
            bs.len(),
            |i| bs[i].ts,
            |enc, out, range| {
                let mut instructions = 0;
                for b in &bs[range] {
                    enc.branch(out, b);
                    instructions += b.icount as u64;
                }
                instructions
            },
        )
    }

    /// Store thread `tid`'s user-mode branches `hops` for `cpu`, in order, the record `i`
    /// at `stamp.ts(i)`: what [`Buffers::push_branches`] stores of the branches they stand
    /// for ([`Hop::branch`]), without a batch of full records made first.
    pub fn push_hops(&mut self, cpu: usize, tid: u32, stamp: BatchStamp, hops: &[Hop]) -> Result<usize, FormatError> {
        self.push_stretches(
            cpu,
            hops.len(),
            |i| stamp.ts(i),
            |enc, out, range| enc.hops(out, &hops[range.clone()], tid, stamp, range.start),
        )
    }

    /// The stretches of [`Buffers::push_branches`] for `n` branches, the branch `i` at
    /// `ts_of(i)`, each stretch's branches appended by `encode(.., range)`, which returns their
    /// instruction counts' sum.
    #[inline(always)]
    fn push_stretches(
        &mut self,
        cpu: usize,
        n: usize,
        ts_of: impl Fn(usize) -> u64,
        mut encode: impl FnMut(&mut Encoder, &mut Vec<u8>, std::ops::Range<usize>) -> u64,
    ) -> Result<usize, FormatError> {
        let mut done = 0;
        while done < n {
            if !self.room(cpu, MAX_BRANCH_ITEM, false)? {
                break;
            }
            // A branch adds at most MAX_BRANCH_ITEM to the block's bytes and pending run
            // together, so `k` of them fit where `push_branch`'s own checks would have let
            // each one in: no block closes, no ring evicts, no buffer refuses inside the stretch.
            let st = &mut self.cpus[cpu];
            let mut space = self.block_size.saturating_sub(st.cur.data.len() + st.enc.pending());
            if self.cfg.mode != Mode::Continuous {
                space = space.min(self.cfg.buffer_size.saturating_sub(st.used()));
            }
            let k = (space / MAX_BRANCH_ITEM).clamp(1, n - done);
            let instructions = encode(&mut st.enc, &mut st.cur.data, done..done + k);
            let blk = &mut st.cur;
            blk.records += k as u64;
            blk.first_ts.get_or_insert(ts_of(done));
            blk.tally.records += k as u64;
            blk.tally.branches += k as u64;
            blk.tally.instructions += instructions;
            self.records[cpu] += k as u64;
            self.branches += k as u64;
            self.instructions += instructions;
            done += k;
            self.stored_in_segment(k as u32)?;
        }
        self.live.branches.store(self.branches, Ordering::Relaxed);
        self.live.instructions.store(self.instructions, Ordering::Relaxed);
        Ok(done)
    }

    /// Store a control record (trace on/off, lost) for `cpu`; never refused for lack of space.
    pub fn push_control(&mut self, cpu: usize, rec: &Record) -> Result<(), FormatError> {
        if let Record::Branch(b) = rec {
            return self.push_branch(cpu, b).map(|_| ());
        }
        let mut s = std::mem::take(&mut self.scratch);
        s.clear();
        let r = rec.encode(&mut s).and_then(|_| self.room(cpu, 1 + s.len(), true));
        if let Err(e) = r {
            self.scratch = s;
            return Err(e);
        }
        let st = &mut self.cpus[cpu];
        st.enc.record(&mut st.cur.data, &s, rec);
        self.scratch = s;
        let blk = &mut st.cur;
        blk.records += 1;
        blk.first_ts.get_or_insert(rec.ts());
        blk.tally.add(Tally::of(rec));
        self.records[cpu] += 1;
        self.stored_segment()
    }

    /// Store an MTE record. In normal mode, [`Push::Full`] means the MTE buffer
    /// is now over its size (the record was kept) and tracing must stop.
    pub fn push_mte(&mut self, rec: &Record) -> Result<Push, FormatError> {
        let mut s = std::mem::take(&mut self.scratch);
        s.clear();
        if let Err(e) = rec.encode(&mut s) {
            self.scratch = s;
            return Err(e);
        }
        self.mte_records += 1;
        let seg = self.cfg.segment_size;
        let r = match &mut self.mte {
            MteStore::Linear(v) => {
                v.extend_from_slice(&s);
                Ok(if v.len() > self.cfg.mte_size { Push::Full } else { Push::Stored })
            }
            MteStore::Segment(v) => {
                let r = if v.len() + s.len() > seg { flush_mte(&mut self.writer, &self.live, v) } else { Ok(()) };
                v.extend_from_slice(&s);
                r.and_then(|_| self.stored_segment()).map(|_| Push::Stored)
            }
        };
        self.scratch = s;
        r
    }

    /// Continuous mode: write `cpu`'s segment as a chunk and start the next.
    fn flush_cpu(&mut self, cpu: usize) -> Result<(), FormatError> {
        let st = &mut self.cpus[cpu];
        st.enc.finish(&mut st.cur.data);
        let counted = st.enc.totals();
        st.enc.reset();
        let r = flush_block(&mut self.writer, &self.live, cpu as u16, 0, &st.cur.data, st.cur.tally, Some(&counted));
        st.cur.data.clear();
        st.cur.records = 0;
        st.cur.tally = Tally::default();
        st.cur.first_ts = None;
        r
    }

    /// A record went into a segment: note when, if nothing else waits, and now and then see
    /// whether the oldest waiting record is due.
    #[inline]
    fn stored_segment(&mut self) -> Result<(), FormatError> {
        self.stored_in_segment(1)
    }

    /// `n` records went into a segment (see [`Buffers::stored_segment`]).
    #[inline]
    fn stored_in_segment(&mut self, n: u32) -> Result<(), FormatError> {
        if self.cfg.mode != Mode::Continuous {
            return Ok(()); // wrap mode's MTE segments go with the rings, at the end
        }
        if self.oldest == u64::MAX {
            self.oldest = crate::now_ns();
        }
        if self.until_check <= n {
            self.until_check = CHECK_EVERY;
            return self.flush_if_due();
        }
        self.until_check -= n;
        Ok(())
    }

    /// Continuous mode: write every segment that holds anything, as chunks (the MTE stream
    /// first), when the oldest record waiting is [`FLUSH_AFTER_NS`] old. Recording loops call
    /// this whenever they wake (a record, a timeout, EINTR); it reads the clock only when
    /// something waits. The other modes keep their buffers until [`Buffers::finish`].
    pub fn flush_if_due(&mut self) -> Result<(), FormatError> {
        if self.oldest == u64::MAX || crate::now_ns().saturating_sub(self.oldest) < FLUSH_AFTER_NS {
            return Ok(());
        }
        self.flush_now()
    }

    /// Continuous mode: write every segment that holds anything now, as chunks (the MTE stream
    /// first, so the modules any branch needs are in the file before it).
    pub fn flush_now(&mut self) -> Result<(), FormatError> {
        if self.cfg.mode != Mode::Continuous {
            return Ok(());
        }
        self.oldest = u64::MAX;
        if let MteStore::Segment(m) = &mut self.mte {
            flush_mte(&mut self.writer, &self.live, m)?;
        }
        for cpu in 0..self.cpus.len() {
            if self.cpus[cpu].cur.records > 0 {
                self.flush_cpu(cpu)?;
            }
        }
        Ok(())
    }

    /// Records stored per CPU (in wrap mode: those still in the ring).
    pub fn records(&self) -> &[u64] {
        &self.records
    }

    /// Count records lost before they reached these buffers (an in-process ring overwrote or
    /// dropped them); the summary reports them with the buffers' own losses.
    pub fn add_lost(&mut self, cpu: usize, n: u64) {
        self.lost[cpu] += n;
    }

    /// Records lost per CPU.
    pub fn lost(&self) -> &[u64] {
        &self.lost
    }

    /// Bytes written to the file so far.
    pub fn file_len(&self) -> u64 {
        self.writer.len()
    }

    /// Write everything still buffered and the end summary; returns the file size.
    pub fn finish(mut self, mut summary: Summary) -> Result<u64, FormatError> {
        summary.records = self.records.clone();
        summary.lost = self.lost.clone();
        summary.mte_records = self.mte_records;
        // After a failed write every buffer is still counted (as unwritten) before the error
        // is returned, so the totals say what reached the file.
        let mut first_err = None;
        let mut keep = |r: Result<(), FormatError>| {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        };
        // MTE first: readers apply module changes before the branches that need them.
        match &mut self.mte {
            MteStore::Linear(v) | MteStore::Segment(v) => keep(flush_mte(&mut self.writer, &self.live, v)),
        }
        for cpu in 0..self.cpus.len() {
            let st = &mut self.cpus[cpu];
            st.enc.finish(&mut st.cur.data);
            st.cur.counted = Some(st.enc.totals());
            let cur = std::mem::replace(&mut st.cur, Block::new(Vec::new()));
            if !cur.data.is_empty() {
                st.done.push_back(cur);
            }
            let lost = self.lost[cpu];
            if self.cfg.mode == Mode::Wrap && lost > 0 {
                // Tell readers, in stream order, where the gap is, and where each thread's
                // first surviving block starts (pid 0: known from the MTE stream): a chunk of
                // its own before the ring's blocks.
                if let Some(ts) = st.done.front().and_then(|b| b.first_ts) {
                    let mut enc = Encoder::new();
                    let mut out = Vec::new();
                    let mut rec = Vec::new();
                    let mut push = |r: Record, out: &mut Vec<u8>| -> Result<(), FormatError> {
                        rec.clear();
                        r.encode(&mut rec)?;
                        enc.record(out, &rec, &r);
                        Ok(())
                    };
                    push(Record::Lost(Lost { ts, count: lost }), &mut out)?;
                    let mut starts: Vec<_> = self.evicted_start[cpu].iter().collect();
                    starts.sort();
                    for (&tid, &pc) in starts {
                        push(
                            Record::TraceOn(TraceOn { ts, reason: TraceOnReason::Resume, pid: 0, tid, pc }),
                            &mut out,
                        )?;
                    }
                    let none = Tally::default();
                    keep(flush_block(&mut self.writer, &self.live, cpu as u16, CHUNK_FLAG_WRAPPED, &out, none, None));
                }
            }
            for blk in std::mem::take(&mut st.done) {
                keep(flush_block(
                    &mut self.writer,
                    &self.live,
                    cpu as u16,
                    0,
                    &blk.data,
                    blk.tally,
                    blk.counted.as_ref(),
                ));
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        summary.totals = Some(self.writer.stream_totals(self.cpus.len()));
        let mut end = Vec::new();
        Record::Summary(summary).encode(&mut end)?;
        self.writer.write_chunk_atomic(STREAM_END, 0, &end)?;
        self.live.bytes.store(self.writer.len(), Ordering::Relaxed);
        self.writer.sync()?;
        Ok(self.writer.len())
    }
}

/// Remember what the records of an evicted block say about where each thread's next block
/// starts.
fn note_evicted(starts: &mut HashMap<u32, u64>, data: &[u8]) {
    let e = Endian::native();
    let mut dec = Decoder::new();
    let mut at = 0;
    // The block was encoded here: it decodes; should it not, what was noted stands.
    while let Ok(Some(r)) = dec.next(e, data, &mut at) {
        match r {
            Record::Branch(b) => {
                if b.to != 0 {
                    starts.insert(b.tid, b.to);
                } else {
                    starts.remove(&b.tid);
                }
            }
            Record::TraceOn(on) => {
                starts.insert(on.tid, on.pc);
            }
            Record::TraceOff(off) => {
                starts.remove(&off.tid);
            }
            _ => {}
        }
    }
}

fn flush_mte(w: &mut TraceWriter, live: &LiveCounts, v: &mut Vec<u8>) -> Result<(), FormatError> {
    let r = w.write_chunk_atomic(STREAM_MTE, 0, v);
    v.clear();
    live.bytes.store(w.len(), Ordering::Relaxed);
    r
}

/// Write a CPU block as a chunk, and count its records as written or not: the summary of a
/// recording whose writes failed says what reached the file. When the block does not fit
/// (a full disk, a file size limit), as many of its records as fit are written in smaller
/// chunks first, so the file keeps everything up to the last whole chunk that could be
/// written; the error is returned all the same, and the writer refuses what comes after.
fn flush_block(
    w: &mut TraceWriter,
    live: &LiveCounts,
    stream: u16,
    flags: u16,
    data: &[u8],
    t: Tally,
    counted: Option<&StreamTotals>,
) -> Result<(), FormatError> {
    let mut r = w.write_chunk_atomic_counted(stream, flags, data, counted);
    let written = match &r {
        Ok(()) => t,
        Err(e) if out_of_space(e) => match write_what_fits(w, stream, flags, data) {
            // Room came back meanwhile: every record is in the file.
            (all, true) => {
                r = Ok(());
                all
            }
            (some, false) => {
                w.refuse_writes();
                some
            }
        },
        Err(_) => Tally::default(),
    };
    live.written_records.fetch_add(written.records, Ordering::Relaxed);
    live.written_branches.fetch_add(written.branches, Ordering::Relaxed);
    live.written_instructions.fetch_add(written.instructions, Ordering::Relaxed);
    live.unwritten_records.fetch_add(t.records.saturating_sub(written.records), Ordering::Relaxed);
    live.bytes.store(w.len(), Ordering::Relaxed);
    r
}

/// Whether a write failed for want of room: the file system is full, the user's quota or
/// the file size limit is reached. A smaller chunk may still fit.
fn out_of_space(e: &FormatError) -> bool {
    let FormatError::Write(io) = e else { return false };
    matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG))
}

/// Most records in a chunk [`write_what_fits`] writes: bounds the records it holds decoded
/// (a run of repeated branches decodes into up to 255 records per 2 bytes).
const FIT_RECORDS_MAX: usize = 1 << 16;

/// After the block `data` of `stream` did not fit (its write rolled back): write its records
/// in smaller chunks, in order, each from a fresh encoder state (a chunk decodes on its own),
/// halving the size tried at every chunk that does not fit, until not even one record fits.
/// Returns what reached the file, and whether that is every record of the block.
fn write_what_fits(w: &mut TraceWriter, stream: u16, mut flags: u16, data: &[u8]) -> (Tally, bool) {
    let e = Endian::native();
    let mut dec = Decoder::new();
    let (mut at, mut decoded_all) = (0, false);
    // Decoded and not yet written, oldest first.
    let mut waiting: VecDeque<Record> = VecDeque::new();
    let mut target = (data.len() / 2).max(1);
    let mut written = Tally::default();
    let (mut out, mut rec) = (Vec::new(), Vec::new());
    loop {
        let mut enc = Encoder::new();
        out.clear();
        let mut n = 0;
        while out.len() + enc.pending() < target && n < FIT_RECORDS_MAX {
            if n == waiting.len() {
                // The block was encoded by this process: it decodes; should it not, what
                // decoded so far is what can be kept.
                match dec.next(e, data, &mut at) {
                    Ok(Some(r)) => waiting.push_back(r),
                    Ok(None) => {
                        decoded_all = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            match &waiting[n] {
                Record::Branch(b) => enc.branch(&mut out, b),
                r => {
                    rec.clear();
                    if r.encode(&mut rec).is_err() {
                        break;
                    }
                    enc.record(&mut out, &rec, r);
                }
            }
            n += 1;
        }
        enc.finish(&mut out);
        if n == 0 {
            return (written, decoded_all && waiting.is_empty());
        }
        if !w.resume_after_rollback() {
            return (written, false);
        }
        match w.write_chunk_atomic(stream, flags, &out) {
            Ok(()) => {
                for r in waiting.drain(..n) {
                    written.add(Tally::of(&r));
                }
                flags = 0; // the wrapped-ring mark belongs to the first chunk only
            }
            Err(e) if n > 1 && out_of_space(&e) => target = out.len() / 2,
            Err(_) => return (written, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, Branch, BranchKind, FileHeader, Mte, StepMethod, TraceFile, BRANCH_RECORD_LEN};

    fn continuous(path: &std::path::Path, ncpu: usize) -> Buffers {
        let header =
            FileHeader::starting_now(Arch::X86_64, Mode::Continuous, StepMethod::PtraceSingleStep, 2, 0, 0, 1 << 20);
        let w = TraceWriter::create(path, &header).unwrap();
        let cfg = BufferConfig { mode: Mode::Continuous, ncpu, buffer_size: 0, segment_size: 1 << 20, mte_size: 0 };
        Buffers::new(cfg, w).unwrap()
    }

    fn push_branch(b: &mut Buffers, cpu: usize, i: u64) {
        let br = Branch { icount: 3, ..Branch::user(1000 + i, 7, 0x1000 + i, 0x2000 + i, BranchKind::Jump, 0, 0) };
        let mut a = [0u8; BRANCH_RECORD_LEN];
        br.encode_into(&mut a);
        b.push_trace(cpu, &a).unwrap();
    }

    /// A segment that waited long enough is in the file without `finish`, as chunks that read
    /// back like full ones, the MTE stream first; nothing is written before it is due.
    #[test]
    fn due_segments_reach_the_file_before_they_fill() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.itr");
        let mut b = continuous(&path, 2);
        b.push_mte(&Record::Mte(Mte::ProcessName { ts: 999, pid: 7, ppid: 1, name: "p".into() })).unwrap();
        for i in 0..10 {
            push_branch(&mut b, (i % 2) as usize, i);
        }
        b.flush_if_due().unwrap();
        assert_eq!(b.file_len(), crate::HEADER_LEN as u64, "written before it was due");
        b.oldest -= FLUSH_AFTER_NS; // as if half a second went by
        b.flush_if_due().unwrap();
        assert_eq!(b.oldest, u64::MAX);
        let t = TraceFile::open(&path).unwrap();
        let streams: Vec<u16> = t.chunks().iter().map(|c| c.stream).collect();
        assert_eq!(streams, vec![STREAM_MTE, 0, 1]);
        assert!(t.summary().is_none() && t.truncated_at().is_none());
        let tos: Vec<u64> = t
            .merged()
            .filter_map(|e| match e.unwrap().record {
                Record::Branch(br) => Some(br.to),
                _ => None,
            })
            .collect();
        assert_eq!(tos, (0..10).map(|i| 0x2000 + i).collect::<Vec<_>>());
        let live = b.live();
        assert_eq!(live.written_records.load(Ordering::Relaxed), 10);
        assert_eq!(live.written_instructions.load(Ordering::Relaxed), 30);
        // The next records go on in new chunks of the same streams; finish adds the rest.
        for i in 10..14 {
            push_branch(&mut b, 0, i);
        }
        b.finish(Summary::default()).unwrap();
        let t = TraceFile::open(&path).unwrap();
        let n = t.merged().filter(|e| matches!(e.as_ref().unwrap().record, Record::Branch(_))).count();
        assert_eq!(n, 14);
        assert!(t.summary().is_some());
    }

    /// The clock is read every CHECK_EVERY pushes: a busy recorder flushes without being asked.
    #[test]
    fn pushes_check_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.itr");
        let mut b = continuous(&path, 1);
        push_branch(&mut b, 0, 0);
        b.oldest -= FLUSH_AFTER_NS;
        for i in 1..CHECK_EVERY as u64 {
            push_branch(&mut b, 0, i);
        }
        assert!(b.file_len() > crate::HEADER_LEN as u64);
        assert_eq!(b.live().written_branches.load(Ordering::Relaxed), CHECK_EVERY as u64);
    }
}
