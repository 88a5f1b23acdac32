//! Per-CPU trace buffers and the MTE buffer, with PI's three collection modes.
//!
//! - normal: each CPU buffer holds `buffer_size` bytes; when a branch record
//!   does not fit, [`Push::Full`] tells the recorder to stop tracing. Control
//!   records (trace on/off) are always stored, so the trace says why it ended.
//! - wrap: each CPU buffer is a ring; a new record evicts the oldest whole
//!   records, which are counted as lost. MTE records are streamed to the
//!   file in segments and never overwritten.
//! - continuous: each CPU (and the MTE stream) fills a segment of
//!   `segment_size` bytes, written to the file as a chunk when full; memory
//!   stays constant and nothing is lost unless the write fails. Segments are also written
//!   when their oldest record is [`FLUSH_AFTER_NS`] old (checked every [`CHECK_EVERY`] pushes
//!   and by [`Buffers::flush_if_due`], which recording loops call when they wake), so a
//!   recorder killed with SIGKILL leaves a valid file that lacks at most its last second.

use crate::record::{major, raw_records, record_len, Lost, Record, Summary, TraceOn, TraceOnReason};
use crate::writer::{TraceWriter, CHUNK_FLAG_WRAPPED, STREAM_END, STREAM_MTE};
use crate::{Endian, FormatError, Mode};
use std::collections::VecDeque;
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

enum Store {
    Linear(Vec<u8>),
    Ring(VecDeque<u8>),
    Segment(Vec<u8>),
}

/// All buffers of one recording, and the file they end up in.
pub struct Buffers {
    cfg: BufferConfig,
    writer: TraceWriter,
    cpus: Vec<Store>,
    mte: Store,
    records: Vec<u64>,
    lost: Vec<u64>,
    mte_records: u64,
    scratch: Vec<u8>,
    /// Wrap mode, per CPU: where each thread's next block starts, as of the newest evicted record,
    /// so the oldest surviving block of each thread still has a known start.
    evicted_start: Vec<std::collections::HashMap<u32, u64>>,
    live: Arc<LiveCounts>,
    branches: u64,
    instructions: u64,
    /// Continuous mode: when the oldest record not yet in the file was stored (`u64::MAX`:
    /// nothing waits), and pushes left before the clock is read again.
    oldest: u64,
    until_check: u32,
}

impl Buffers {
    /// Buffers writing into `writer` (whose header is already written). Their memory is
    /// reserved here, all of it, so sizes the machine cannot give are an error now rather than
    /// an abort later.
    pub fn new(cfg: BufferConfig, writer: TraceWriter) -> Result<Self, FormatError> {
        let too_big = |per_cpu: usize| FormatError::NoMemory { per_cpu: per_cpu as u64, ncpu: cfg.ncpu };
        let vec = |n: usize| -> Result<Vec<u8>, FormatError> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| too_big(n))?;
            Ok(v)
        };
        let cpu_store = || -> Result<Store, FormatError> {
            Ok(match cfg.mode {
                Mode::Normal => Store::Linear(vec(cfg.buffer_size)?),
                Mode::Wrap => {
                    let mut ring = VecDeque::new();
                    ring.try_reserve_exact(cfg.buffer_size).map_err(|_| too_big(cfg.buffer_size))?;
                    Store::Ring(ring)
                }
                Mode::Continuous => Store::Segment(vec(cfg.segment_size)?),
            })
        };
        let cpus = (0..cfg.ncpu).map(|_| cpu_store()).collect::<Result<_, _>>()?;
        let cfg_ncpu = cfg.ncpu;
        let mte = match cfg.mode {
            Mode::Normal => Store::Linear(Vec::new()),
            Mode::Wrap | Mode::Continuous => Store::Segment(vec(cfg.segment_size)?),
        };
        Ok(Buffers {
            records: vec![0; cfg.ncpu],
            lost: vec![0; cfg.ncpu],
            cfg,
            writer,
            cpus,
            mte,
            mte_records: 0,
            scratch: Vec::with_capacity(256),
            evicted_start: vec![Default::default(); cfg_ncpu],
            live: Arc::default(),
            branches: 0,
            instructions: 0,
            oldest: u64::MAX,
            until_check: CHECK_EVERY,
        })
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

    /// Count the branch records among `data` (whole records) in the live totals.
    fn count_live(&mut self, data: &[u8]) {
        let e = Endian::native();
        for rec in raw_records(e, data).map_while(Result::ok) {
            if (rec.major == major::BRANCH_USER || rec.major == major::BRANCH_KERNEL) && rec.bytes.len() >= 40 {
                self.branches += 1;
                self.instructions += e.u32(&rec.bytes[36..]) as u64;
            }
        }
        self.live.branches.store(self.branches, Ordering::Relaxed);
        self.live.instructions.store(self.instructions, Ordering::Relaxed);
    }

    /// Store a branch record for `cpu`. In normal mode a full buffer refuses it.
    #[inline]
    pub fn push_trace(&mut self, cpu: usize, rec: &[u8]) -> Result<Push, FormatError> {
        self.push_cpu(cpu, rec, false)
    }

    /// Continuous mode: store `data`, whole encoded records of `cpu` (`n` of them), copying
    /// runs of records at once instead of one by one; a segment is still written as a chunk
    /// when the next record would not fit. Other modes store them one at a time (control
    /// records included, never refused) and return [`Push::Full`] at the first branch record
    /// a normal-mode buffer refuses, dropping it and the rest.
    pub fn push_records(&mut self, cpu: usize, data: &[u8], n: u64) -> Result<Push, FormatError> {
        let e = Endian::native();
        let seg = self.cfg.segment_size;
        if let Store::Segment(v) = &mut self.cpus[cpu] {
            if v.len() + data.len() <= seg {
                v.extend_from_slice(data);
                self.records[cpu] += n;
                self.count_live(data);
                return self.stored_segment().map(|_| Push::Stored);
            }
        }
        let mut at = 0;
        while at < data.len() {
            if let Store::Segment(v) = &mut self.cpus[cpu] {
                // The longest run of whole records that fits in the segment.
                let room = seg.saturating_sub(v.len());
                let (mut end, mut n) = (at, 0u64);
                while end < data.len() {
                    let len = record_len(e, &data[end..]).unwrap_or(0);
                    if len == 0 || end + len > data.len() {
                        return Err(FormatError::Corrupt { offset: end as u64, what: "partial record".into() });
                    }
                    if end + len - at > room {
                        break;
                    }
                    end += len;
                    n += 1;
                }
                if n > 0 {
                    v.extend_from_slice(&data[at..end]);
                    self.records[cpu] += n;
                    self.count_live(&data[at..end]);
                    self.stored_segment()?;
                    at = end;
                    continue;
                }
            }
            // A record that does not fit (continuous: written after a flush), or another mode.
            let len = record_len(e, &data[at..]).unwrap_or(0);
            if len < 4 || at + len > data.len() {
                return Err(FormatError::Corrupt { offset: at as u64, what: "partial record".into() });
            }
            let rec = &data[at..at + len];
            let maj = e.u16(&rec[2..]);
            let control = maj != major::BRANCH_USER && maj != major::BRANCH_KERNEL;
            if self.push_cpu(cpu, rec, control)? == Push::Full {
                return Ok(Push::Full);
            }
            at += len;
        }
        Ok(Push::Stored)
    }

    /// Store a control record (trace on/off, lost) for `cpu`; never refused for lack of space.
    pub fn push_control(&mut self, cpu: usize, rec: &Record) -> Result<(), FormatError> {
        let mut s = std::mem::take(&mut self.scratch);
        s.clear();
        rec.encode(&mut s)?;
        let r = self.push_cpu(cpu, &s, true);
        self.scratch = s;
        r.map(|_| ())
    }

    /// Store an MTE record. In normal mode, [`Push::Full`] means the MTE buffer
    /// is now over its size (the record was kept) and tracing must stop.
    pub fn push_mte(&mut self, rec: &Record) -> Result<Push, FormatError> {
        let mut s = std::mem::take(&mut self.scratch);
        s.clear();
        rec.encode(&mut s)?;
        self.mte_records += 1;
        let seg = self.cfg.segment_size;
        let r = match &mut self.mte {
            Store::Linear(v) => {
                v.extend_from_slice(&s);
                Ok(if v.len() > self.cfg.mte_size { Push::Full } else { Push::Stored })
            }
            Store::Segment(v) => {
                let r = if v.len() + s.len() > seg {
                    flush(&mut self.writer, &self.live, STREAM_MTE, 0, v)
                } else {
                    Ok(())
                };
                v.extend_from_slice(&s);
                r.and_then(|_| self.stored_segment()).map(|_| Push::Stored)
            }
            Store::Ring(_) => unreachable!("the MTE stream never wraps"),
        };
        self.scratch = s;
        r
    }

    fn push_cpu(&mut self, cpu: usize, rec: &[u8], control: bool) -> Result<Push, FormatError> {
        let store = &mut self.cpus[cpu];
        match store {
            Store::Linear(v) => {
                if !control && v.len() + rec.len() > self.cfg.buffer_size {
                    return Ok(Push::Full);
                }
                v.extend_from_slice(rec);
            }
            Store::Ring(ring) => {
                let cap = self.cfg.buffer_size;
                while !ring.is_empty() && ring.len() + rec.len() > cap {
                    let n = if ring.len() >= 2 {
                        record_len(Endian::native(), &[ring[0], ring[1]]).unwrap_or(0)
                    } else {
                        0
                    };
                    if n == 0 || n > ring.len() {
                        ring.clear();
                        break;
                    }
                    let head: Vec<u8> = ring.range(..n.min(40)).copied().collect();
                    note_evicted(&mut self.evicted_start[cpu], &head);
                    ring.drain(..n);
                    self.lost[cpu] += 1;
                    self.records[cpu] -= 1;
                }
                ring.extend(rec);
            }
            Store::Segment(v) => {
                if v.len() + rec.len() > self.cfg.segment_size {
                    // MTE records first, so any trace chunk on disk can be symbolised even if
                    // the recording never finishes.
                    if let Store::Segment(m) = &mut self.mte {
                        flush(&mut self.writer, &self.live, STREAM_MTE, 0, m)?;
                    }
                    flush(&mut self.writer, &self.live, cpu as u16, 0, v)?;
                }
                v.extend_from_slice(rec);
                self.records[cpu] += 1;
                if !control {
                    self.count_live(rec);
                }
                self.stored_segment()?;
                return Ok(Push::Stored);
            }
        }
        self.records[cpu] += 1;
        if !control {
            self.count_live(rec);
        }
        Ok(Push::Stored)
    }

    /// A record went into a segment: note when, if nothing else waits, and now and then see
    /// whether the oldest waiting record is due.
    #[inline]
    fn stored_segment(&mut self) -> Result<(), FormatError> {
        if self.cfg.mode != Mode::Continuous {
            return Ok(()); // wrap mode's MTE segments go with the rings, at the end
        }
        if self.oldest == u64::MAX {
            self.oldest = crate::now_ns();
        }
        self.until_check -= 1;
        if self.until_check == 0 {
            self.until_check = CHECK_EVERY;
            return self.flush_if_due();
        }
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
        if let Store::Segment(m) = &mut self.mte {
            flush(&mut self.writer, &self.live, STREAM_MTE, 0, m)?;
        }
        for (cpu, store) in self.cpus.iter_mut().enumerate() {
            if let Store::Segment(v) = store {
                flush(&mut self.writer, &self.live, cpu as u16, 0, v)?;
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
        match std::mem::replace(&mut self.mte, Store::Linear(Vec::new())) {
            Store::Linear(mut v) | Store::Segment(mut v) => {
                keep(flush(&mut self.writer, &self.live, STREAM_MTE, 0, &mut v))
            }
            Store::Ring(_) => unreachable!(),
        }
        for cpu in 0..self.cpus.len() {
            match std::mem::replace(&mut self.cpus[cpu], Store::Linear(Vec::new())) {
                Store::Linear(mut v) | Store::Segment(mut v) => {
                    keep(flush(&mut self.writer, &self.live, cpu as u16, 0, &mut v))
                }
                Store::Ring(mut ring) => {
                    let lost = self.lost[cpu];
                    let data = ring.make_contiguous();
                    let mut out = Vec::with_capacity(data.len() + 32);
                    if lost > 0 && data.len() >= 16 {
                        // Tell readers, in stream order, where the gap is, and where each thread's
                        // first surviving block starts (pid 0: known from the MTE stream).
                        let ts = Endian::native().u64(&data[8..16]);
                        Record::Lost(Lost { ts, count: lost }).encode(&mut out)?;
                        let mut starts: Vec<_> = self.evicted_start[cpu].iter().collect();
                        starts.sort();
                        for (&tid, &pc) in starts {
                            let on = TraceOn { ts, reason: TraceOnReason::Resume, pid: 0, tid, pc };
                            Record::TraceOn(on).encode(&mut out)?;
                        }
                    }
                    out.extend_from_slice(data);
                    let flags = if lost > 0 { CHUNK_FLAG_WRAPPED } else { 0 };
                    keep(flush(&mut self.writer, &self.live, cpu as u16, flags, &mut out));
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let mut end = Vec::new();
        Record::Summary(summary).encode(&mut end)?;
        flush(&mut self.writer, &self.live, STREAM_END, 0, &mut end)?;
        self.writer.sync()?;
        Ok(self.writer.len())
    }
}

/// Remember what an evicted record says about where its thread's next block starts.
fn note_evicted(starts: &mut std::collections::HashMap<u32, u64>, r: &[u8]) {
    let e = Endian::native();
    if r.len() < 32 {
        return;
    }
    match e.u16(&r[2..]) {
        major::BRANCH_USER | major::BRANCH_KERNEL if r.len() >= 40 => {
            let (to, tid) = (e.u64(&r[24..]), e.u32(&r[32..]));
            if to != 0 {
                starts.insert(tid, to);
            } else {
                starts.remove(&tid);
            }
        }
        major::TRACE_ON => {
            starts.insert(e.u32(&r[20..]), e.u64(&r[24..]));
        }
        major::TRACE_OFF => {
            starts.remove(&e.u32(&r[20..]));
        }
        _ => {}
    }
}

fn flush(w: &mut TraceWriter, live: &LiveCounts, stream: u16, flags: u16, v: &mut Vec<u8>) -> Result<(), FormatError> {
    let r = w.write_chunk_atomic(stream, flags, v);
    if stream != STREAM_MTE && stream != STREAM_END {
        count_flushed(live, v, r.is_ok());
    }
    v.clear();
    live.bytes.store(w.len(), Ordering::Relaxed);
    r
}

/// Count a CPU chunk's records as written or not: the summary of a recording whose writes
/// failed says what reached the file. One walk over the chunk, as it leaves memory.
fn count_flushed(live: &LiveCounts, data: &[u8], written: bool) {
    let e = Endian::native();
    let (mut records, mut branches, mut instructions) = (0u64, 0u64, 0u64);
    for rec in raw_records(e, data).map_while(Result::ok) {
        match rec.major {
            // The Lost and resume records wrap mode puts before a ring are not the program's.
            major::LOST => continue,
            major::TRACE_ON if e.u32(&rec.bytes[4..]) == TraceOnReason::Resume as u32 => continue,
            major::BRANCH_USER | major::BRANCH_KERNEL if rec.bytes.len() >= 40 => {
                branches += 1;
                instructions += e.u32(&rec.bytes[36..]) as u64;
            }
            major::TRACE_OFF if rec.bytes.len() >= 36 => instructions += e.u32(&rec.bytes[32..]) as u64,
            _ => {}
        }
        records += 1;
    }
    if written {
        live.written_records.fetch_add(records, Ordering::Relaxed);
        live.written_branches.fetch_add(branches, Ordering::Relaxed);
        live.written_instructions.fetch_add(instructions, Ordering::Relaxed);
    } else {
        live.unwritten_records.fetch_add(records, Ordering::Relaxed);
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
