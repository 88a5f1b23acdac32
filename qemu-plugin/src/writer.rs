//! The writer thread: vCPU threads hand it their records, and it owns the
//! per-stream [`Buffers`] (the three collection modes) and the trace file, so
//! no vCPU ever waits on the disk unless the channel is full. In continuous
//! mode it also encodes (format 3.0's compact items): the vCPU threads only
//! find the taken branches, and the encoding, the larger half of the work,
//! runs on another core in parallel with the program.

use crate::blocks::Packed;
use crate::config::Config;
use itrace_format::{
    compact::{Encoder, MAX_BRANCH_ITEM},
    major, Branch, BranchKind, BufferConfig, Buffers, Endian, FileHeader, Push, Record, StepMethod, StopReason,
    Summary, TraceOff, TraceWriter, BRANCH_RECORD_LEN, FLAG_ICOUNT,
};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;

/// Segments in flight between the vCPUs and the writer: bounds memory when the disk is slower.
const CHANNEL_DEPTH: usize = 32;
/// Longest the writer sleeps without looking at its buffers' flush clock (continuous mode
/// writes a segment whose oldest record is half a second old).
const TICK: std::time::Duration = std::time::Duration::from_millis(200);

/// Records a vCPU hands over at a time in continuous mode: a batch large enough that handing
/// it over (a channel message) costs little per record, small enough to stay in the caches.
pub const BATCH: usize = 8192;
/// A continuous-mode chunk is ended when it cannot take one more item of this many bytes (a
/// branch, or a whole trace-on or trace-off record) within the segment size.
const MAX_ITEM: usize = if MAX_BRANCH_ITEM > 128 { MAX_BRANCH_ITEM } else { 128 };
/// The largest chunk of continuous mode (a smaller `--segment-size` makes them smaller).
const CHUNK_MAX: usize = 256 * 1024;
/// A chunk of continuous mode is written once its oldest record is this old, full or not
/// (looked at every [`TICK`]), so that a trace read while it is recorded is never far behind.
const CHUNK_MAX_AGE_NS: u64 = 250_000_000;

/// A vCPU's records in continuous mode, as handed to the writer: user-space taken branches
/// without flags in 16 bytes each ([`Packed`]: the block they leave, where they go and the
/// instructions before them), and, each before the packed branch of its index, the
/// rest: a clock reading or thread for the packed branches after it, a whole branch (with
/// flags, from the kernel, or whose target or count does not pack), a whole record.
pub struct Batch {
    packed: Vec<Packed>,
    events: Vec<(usize, Event)>,
    /// The last clock reading and thread in `events` are the vCPU's current ones: a packed
    /// branch may go in as it is. The vCPU unprimes it at every clock reading.
    pub primed: bool,
}

enum Event {
    Ts(u64),
    Tid(u32),
    Branch(Branch),
    Control(Box<Record>),
}

impl Batch {
    fn new() -> Batch {
        Batch { packed: Vec::with_capacity(BATCH), events: Vec::new(), primed: false }
    }

    pub fn is_empty(&self) -> bool {
        self.packed.is_empty() && self.events.is_empty()
    }

    #[inline]
    pub fn is_full(&self) -> bool {
        self.packed.len() >= BATCH || self.events.len() >= BATCH
    }

    /// A packed branch (the hot path's) of the primed clock reading and thread.
    #[inline(always)]
    pub fn push_packed(&mut self, b: Packed) {
        self.packed.push(b);
    }

    /// The clock reading and thread of the packed branches that follow.
    pub fn prime(&mut self, ts: u64, tid: u32) {
        let at = self.packed.len();
        self.events.push((at, Event::Ts(ts)));
        self.events.push((at, Event::Tid(tid)));
        self.primed = true;
    }

    /// A branch with all its fields.
    pub fn push_branch(&mut self, b: &Branch) {
        self.events.push((self.packed.len(), Event::Branch(*b)));
    }

    pub fn push_control(&mut self, r: Record) {
        self.events.push((self.packed.len(), Event::Control(Box::new(r))));
    }

    /// The records in it (clock readings and threads are none).
    fn records(&self) -> u64 {
        let whole = self.events.iter().filter(|(_, e)| matches!(e, Event::Branch(_) | Event::Control(_))).count();
        (self.packed.len() + whole) as u64
    }

    fn clear(&mut self) {
        self.packed.clear();
        self.events.clear();
        self.primed = false;
    }
}

/// Work for the writer.
pub enum Msg {
    /// Records of one stream of the 16-byte-header layout, in order (branch, trace-on and
    /// trace-off records): normal and wrap modes, whose buffers decide what to keep.
    Records { stream: u16, data: Vec<u8> },
    /// Records of one stream, in order, for the writer to encode (continuous mode).
    Batch { stream: u16, batch: Batch },
    /// A module-table record.
    Mte(Record),
    /// Write what is buffered and the summary, then stop; `stop` says why tracing ended when
    /// it is not the program's exit (a fatal signal).
    Finish { ts: u64, stop: Option<StopReason> },
}

/// What the recording came to, for the status file.
#[derive(Debug, Default)]
pub struct Totals {
    pub records: u64,
    pub lost: u64,
    pub instructions: u64,
    pub branches: u64,
    pub bytes: u64,
    /// Records that could not be written (a write failed).
    pub unwritten: u64,
    pub stop: Option<StopReason>,
    pub error: Option<String>,
}

pub use itrace_format::now_ns;

/// How often the writer rewrites itrace's `live=` file.
const LIVE_EVERY_NS: u64 = 200_000_000;

/// Create the trace file and start the writer thread.
pub fn spawn(cfg: &Config) -> Result<(SyncSender<Msg>, JoinHandle<Totals>), String> {
    let header = FileHeader::starting_now(
        cfg.arch,
        cfg.mode,
        StepMethod::Emulated,
        cfg.streams as u16,
        FLAG_ICOUNT,
        cfg.buffer_size as u64,
        cfg.segment_size as u64,
    );
    let mut writer = TraceWriter::create(&cfg.out, &header)
        // The error names the file already ("cannot open trace file PATH: why").
        .map_err(|e| e.to_string())?;
    if let Some(level) = cfg.compress {
        writer.compress(level);
    }
    let bcfg = BufferConfig {
        mode: cfg.mode,
        ncpu: cfg.streams,
        buffer_size: cfg.buffer_size,
        segment_size: cfg.segment_size,
        mte_size: cfg.mte_size,
    };
    let mut buffers = Buffers::new(bcfg, writer).map_err(|e| e.to_string())?;
    // Where the trace came from, as itrace encoded it; a trace without it is still a trace.
    let origin = cfg.origin.as_ref().and_then(|p| std::fs::read(p).ok());
    if let Some(r) = origin.and_then(|b| itrace_format::Record::decode(itrace_format::Endian::native(), &b, 0).ok()) {
        let _ = buffers.push_mte(&r);
    }
    // Chunks of at most 256 KiB: a chunk is the unit a reader decodes and a crash can lose.
    let chunk_size = cfg.segment_size.clamp(4096, CHUNK_MAX);
    let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_DEPTH);
    let h = std::thread::Builder::new()
        .name("itrace-writer".into())
        .spawn({
            let live = cfg
                .live
                .as_ref()
                .and_then(|p| std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(p).ok());
            move || run(buffers, rx, chunk_size, live)
        })
        .map_err(|e| format!("cannot start the writer thread: {e}"))?;
    Ok((tx, h))
}

struct Writer {
    buffers: Buffers,
    t: Totals,
    /// Normal mode: streams whose buffer filled (their later records are dropped).
    full: Vec<bool>,
    /// Tracing stopped for good (MTE buffer full, write error).
    stopped: bool,
    /// CPU-stream records that came after a write failed, or waited in a chunk then: never
    /// written.
    dropped: u64,
    /// CPU-stream records encoded into chunks so far (continuous mode).
    encoded: u64,
    /// Continuous mode: the chunk each stream is encoding.
    chunks: Vec<Chunk>,
    chunk_size: usize,
    scratch: Vec<u8>,
    /// itrace's `live=` file, and when it was last written (the writer's clock).
    live_file: Option<std::fs::File>,
    live_at: u64,
}

/// A stream's chunk being encoded (continuous mode).
struct Chunk {
    enc: Encoder,
    data: Vec<u8>,
    records: u64,
    branches: u64,
    instructions: u64,
    /// When its first record came (the clock of the writer).
    since: u64,
}

/// A branch record of the 40-byte layout the vCPUs write ([`Branch::encode_into`], native
/// byte order), read without going through [`Record::decode`] and its large result: the
/// normal and wrap modes' writer spent most of its time there.
#[inline]
fn branch_of(a: &[u8; BRANCH_RECORD_LEN]) -> Option<Branch> {
    let u32_at = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0; 8];
        b.copy_from_slice(&a[i..i + 8]);
        u64::from_ne_bytes(b)
    };
    let maj = u16::from_ne_bytes([a[2], a[3]]);
    let minor = u32_at(4);
    Some(Branch {
        ts: u64_at(8),
        kernel: maj == major::BRANCH_KERNEL,
        kind: BranchKind::from_code(minor as u8)?,
        flags: (minor >> 8) as u8,
        aux: (minor >> 16) as u16,
        from: u64_at(16),
        to: u64_at(24),
        tid: u32_at(32),
        icount: u32_at(36),
    })
}

/// Spare segment buffers, handed back to the vCPUs so that they do not fault in fresh pages.
static POOL: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
const POOL_MAX: usize = 64;

fn recycle(mut v: Vec<u8>) {
    v.clear();
    if let Ok(mut p) = POOL.lock() {
        if p.len() < POOL_MAX {
            p.push(v);
        }
    }
}

/// An empty buffer of `cap` bytes, from the pool when one is there.
pub fn segment_buffer(cap: usize) -> Vec<u8> {
    POOL.lock().ok().and_then(|mut p| p.pop()).unwrap_or_else(|| Vec::with_capacity(cap))
}

/// Spare batches, handed back to the vCPUs (as [`POOL`]).
static BATCH_POOL: std::sync::Mutex<Vec<Batch>> = std::sync::Mutex::new(Vec::new());

fn recycle_batch(mut b: Batch) {
    b.clear();
    if let Ok(mut p) = BATCH_POOL.lock() {
        if p.len() < POOL_MAX {
            p.push(b);
        }
    }
}

/// An empty batch, from the pool when one is there.
pub fn batch() -> Batch {
    BATCH_POOL.lock().ok().and_then(|mut p| p.pop()).unwrap_or_else(Batch::new)
}

fn run(buffers: Buffers, rx: Receiver<Msg>, chunk_size: usize, live_file: Option<std::fs::File>) -> Totals {
    let n = buffers.records().len();
    let mut w = Writer {
        buffers,
        t: Totals::default(),
        full: vec![false; n],
        stopped: false,
        dropped: 0,
        encoded: 0,
        chunks: Vec::new(),
        chunk_size,
        scratch: Vec::new(),
        live_file,
        live_at: 0,
    };
    let mut end_ts = 0;
    loop {
        let m = match rx.recv_timeout(TICK) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => {
                w.tick();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        match m {
            Msg::Records { stream, data } => {
                w.records(stream as usize, &data);
                recycle(data);
            }
            Msg::Batch { stream, batch } => {
                let encoded = w.encoded;
                w.batch(stream as usize, &batch);
                if w.stopped {
                    // What of it was not encoded (all of it, once stopped) goes nowhere.
                    w.dropped += batch.records().saturating_sub(w.encoded - encoded);
                }
                recycle_batch(batch);
            }
            Msg::Mte(r) => w.mte(&r),
            Msg::Finish { ts, stop } => {
                end_ts = ts;
                if let Some(r) = stop {
                    w.t.stop.get_or_insert(r);
                }
                break;
            }
        }
        w.tick();
    }
    for stream in 0..w.chunks.len() {
        if w.stopped {
            w.dropped += w.chunks[stream].records;
        }
        w.end_chunk(stream);
    }
    let Writer { buffers, mut t, dropped, .. } = w;
    t.records = buffers.records().iter().sum();
    t.lost = buffers.lost().iter().sum();
    let live = buffers.live();
    let stop = *t.stop.get_or_insert(StopReason::Exited);
    let summary = Summary {
        ts: end_ts.max(now_ns()),
        stop_reason: stop as u32,
        instructions: t.instructions,
        ..Default::default()
    };
    match buffers.finish(summary) {
        Ok(bytes) => t.bytes = bytes,
        Err(e) => {
            t.error.get_or_insert_with(|| e.to_string());
        }
    }
    if t.error.is_some() {
        // Report what reached the file, which is all a reader will find.
        use std::sync::atomic::Ordering::Relaxed;
        t.records = live.written_records.load(Relaxed);
        t.instructions = live.written_instructions.load(Relaxed);
        t.branches = live.written_branches.load(Relaxed);
        t.unwritten = live.unwritten_records.load(Relaxed) + dropped;
        t.bytes = live.bytes.load(Relaxed);
    }
    t
}

impl Writer {
    /// Write what has waited in memory long enough (continuous mode).
    fn tick(&mut self) {
        if self.stopped {
            return;
        }
        if !self.chunks.is_empty() {
            let now = now_ns();
            for stream in 0..self.chunks.len() {
                let c = &self.chunks[stream];
                if c.records > 0 && now.saturating_sub(c.since) >= CHUNK_MAX_AGE_NS {
                    self.end_chunk(stream);
                }
            }
        }
        if let Err(err) = self.buffers.flush_if_due() {
            self.failed(err.to_string());
        }
        self.tell_live();
    }

    /// Rewrite the `live=` file (at most every 200 ms) with the instructions and branches
    /// written so far: one line of two fixed-width numbers, so that a rewrite leaves no tail
    /// of a longer one; itrace reads it for its status line. A failure only leaves it as it was.
    fn tell_live(&mut self) {
        let Some(f) = &self.live_file else { return };
        let now = now_ns();
        if now.saturating_sub(self.live_at) < LIVE_EVERY_NS {
            return;
        }
        self.live_at = now;
        use std::os::unix::fs::FileExt;
        let line = format!("{:>20} {:>20}\n", self.t.instructions, self.t.branches);
        let _ = f.write_all_at(line.as_bytes(), 0);
    }

    /// Continuous mode: the vCPU encoded a chunk and counted its records; write it.
    fn bulk(&mut self, stream: usize, data: &[u8], records: u64, instructions: u64, branches: u64) {
        if self.stopped || stream >= self.full.len() {
            return;
        }
        match self.buffers.push_encoded(stream, data, records, branches, instructions) {
            Ok(_) => {
                self.t.instructions += instructions;
                self.t.branches += branches;
            }
            Err(err) => self.failed(err.to_string()),
        }
    }

    /// Continuous mode: encode a vCPU's batch into its stream's chunk, writing each chunk
    /// that fills.
    fn batch(&mut self, stream: usize, batch: &Batch) {
        if self.stopped || stream >= self.full.len() {
            return;
        }
        if self.chunks.len() <= stream {
            let n = self.full.len();
            self.chunks.resize_with(n, || Chunk {
                enc: Encoder::new(),
                data: Vec::new(),
                records: 0,
                branches: 0,
                instructions: 0,
                since: 0,
            });
        }
        let (mut ts, mut tid) = (0, 0);
        let mut done = 0;
        for (at, e) in &batch.events {
            self.encode_packed(stream, &batch.packed[done..*at], ts, tid);
            done = *at;
            match e {
                Event::Ts(t) => ts = *t,
                Event::Tid(t) => tid = *t,
                Event::Branch(b) => self.encode_branch(stream, b),
                Event::Control(r) => self.encode_control(stream, r),
            }
        }
        self.encode_packed(stream, &batch.packed[done..], ts, tid);
    }

    /// Packed branches of one thread and clock reading: the writer's hot loop, which holds
    /// the chunk and its counts for as long as it has room.
    fn encode_packed(&mut self, stream: usize, packed: &[Packed], ts: u64, tid: u32) {
        let mut rest = packed;
        let size = self.chunk_size;
        while !rest.is_empty() {
            let Some(c) = self.chunk_for(stream) else { return };
            // Items that surely fit before the chunk must end (at least one: chunk_for made
            // room): the chunk ends where a check before every item would end it.
            let room = (size - c.data.len() - c.enc.pending()) / MAX_ITEM;
            let (now, later) = rest.split_at(room.clamp(1, rest.len()));
            let mut instructions = 0;
            for p in now {
                let icount = p.icount();
                let b = Branch {
                    ts,
                    kernel: false,
                    kind: p.from.kind,
                    flags: 0,
                    aux: 0,
                    from: p.from.last,
                    to: p.to(),
                    tid,
                    icount,
                };
                c.enc.branch(&mut c.data, &b);
                instructions += icount as u64;
            }
            c.branches += now.len() as u64;
            c.records += now.len() as u64;
            c.instructions += instructions;
            self.encoded += now.len() as u64;
            rest = later;
        }
    }

    /// Make room for one more item in `stream`'s chunk (ending the chunk when it is full).
    #[inline]
    fn chunk_for(&mut self, stream: usize) -> Option<&mut Chunk> {
        let c = &self.chunks[stream];
        if c.data.len() + c.enc.pending() + MAX_ITEM > self.chunk_size {
            self.end_chunk(stream);
            if self.stopped {
                return None;
            }
        }
        let c = &mut self.chunks[stream];
        if c.records == 0 {
            c.since = now_ns();
            c.data.reserve(self.chunk_size);
        }
        Some(c)
    }

    #[inline]
    fn encode_branch(&mut self, stream: usize, b: &Branch) {
        let Some(c) = self.chunk_for(stream) else { return };
        c.enc.branch(&mut c.data, b);
        c.branches += 1;
        c.instructions += b.icount as u64;
        c.records += 1;
        self.encoded += 1;
    }

    fn encode_control(&mut self, stream: usize, r: &Record) {
        self.scratch.clear();
        if r.encode(&mut self.scratch).is_err() {
            return;
        }
        let scratch = std::mem::take(&mut self.scratch);
        if let Some(c) = self.chunk_for(stream) {
            c.enc.record(&mut c.data, &scratch, r);
            if let Record::TraceOff(off) = r {
                c.instructions += off.icount as u64;
            }
            c.records += 1;
            self.encoded += 1;
        }
        self.scratch = scratch;
    }

    /// Continuous mode: write `stream`'s chunk; the next starts from a fresh encoder state.
    fn end_chunk(&mut self, stream: usize) {
        let c = &mut self.chunks[stream];
        if c.records == 0 {
            return;
        }
        c.enc.finish(&mut c.data);
        c.enc.reset();
        let (records, branches, instructions) =
            (std::mem::take(&mut c.records), std::mem::take(&mut c.branches), std::mem::take(&mut c.instructions));
        let data = std::mem::take(&mut c.data);
        self.bulk(stream, &data, records, instructions, branches);
        let mut data = data;
        data.clear();
        self.chunks[stream].data = data;
    }

    fn records(&mut self, stream: usize, data: &[u8]) {
        if self.stopped || stream >= self.full.len() {
            return;
        }
        let e = Endian::native();
        let mut at = 0;
        while at + 16 <= data.len() {
            let len = (u16::from_ne_bytes([data[at], data[at + 1]]) & 0xFFFC) as usize;
            if len < 16 || at + len > data.len() {
                break; // cannot happen: the vCPU side encodes whole records
            }
            let rec = &data[at..at + len];
            at += len;
            let maj = u16::from_ne_bytes([rec[2], rec[3]]);
            if self.full[stream] {
                continue;
            }
            let branch = match rec.try_into() {
                Ok(a) if maj == major::BRANCH_USER || maj == major::BRANCH_KERNEL => branch_of(a),
                _ => None,
            };
            if let Some(b) = branch {
                match self.buffers.push_branch(stream, &b) {
                    Ok(Push::Stored) => {
                        self.t.instructions += b.icount as u64;
                        self.t.branches += 1;
                    }
                    Ok(Push::Full) => {
                        // Normal mode: this stream's buffer is full; its thread runs on untraced.
                        self.full[stream] = true;
                        self.t.stop = Some(StopReason::BufferFull);
                        let off = TraceOff {
                            ts: b.ts,
                            reason: StopReason::BufferFull,
                            pid: std::process::id(),
                            tid: b.tid,
                            pc: b.from,
                            icount: 0,
                            value: 0,
                        };
                        self.control(stream, &Record::TraceOff(off));
                    }
                    Err(err) => self.failed(err.to_string()),
                }
            } else if let Ok(r) = Record::decode(e, rec, 0) {
                if let Record::TraceOff(off) = &r {
                    self.t.instructions += off.icount as u64;
                }
                self.control(stream, &r);
            }
        }
    }

    fn control(&mut self, stream: usize, r: &Record) {
        if let Err(err) = self.buffers.push_control(stream, r) {
            self.failed(err.to_string());
        }
    }

    fn mte(&mut self, r: &Record) {
        if self.stopped {
            return;
        }
        match self.buffers.push_mte(r) {
            Ok(Push::Stored) => {}
            Ok(Push::Full) => {
                self.stopped = true;
                self.t.stop = Some(StopReason::BufferFull);
            }
            Err(err) => self.failed(err.to_string()),
        }
    }

    /// A write failed (a full disk): the file keeps what reached it, and tracing ends at the
    /// program's next block, as when itrace asks for the end; the program runs on untraced.
    fn failed(&mut self, e: String) {
        crate::stop_tracing();
        self.stopped = true;
        self.t.stop = Some(StopReason::WriteError);
        self.t.error.get_or_insert(e);
    }
}
