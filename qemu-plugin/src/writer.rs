//! The writer thread: vCPU threads hand it full segments of encoded records;
//! it owns the per-stream [`Buffers`] (the three collection modes) and the
//! trace file, so no vCPU ever waits on the disk unless the channel is full.

use crate::config::Config;
use itrace_format::{
    major, Branch, BranchKind, BufferConfig, Buffers, Endian, FileHeader, Push, Record, StepMethod, StopReason,
    Summary, TraceOff, TraceWriter, BRANCH_RECORD_LEN, FLAG_ICOUNT,
};
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;

/// Segments in flight between the vCPUs and the writer: bounds memory when the disk is slower.
const CHANNEL_DEPTH: usize = 32;
/// Longest the writer sleeps without looking at its buffers' flush clock (continuous mode
/// writes a segment whose oldest record is half a second old).
const TICK: std::time::Duration = std::time::Duration::from_millis(200);

/// Work for the writer.
pub enum Msg {
    /// Encoded records of one stream, in order (branch, trace-on and trace-off records), with
    /// the instructions and branch records among them: in continuous mode one whole chunk of
    /// format 3.0's compact items, else records of the 16-byte-header layout.
    Records { stream: u16, data: Vec<u8>, records: u64, instructions: u64, branches: u64 },
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
    let buffers = Buffers::new(bcfg, writer).map_err(|e| e.to_string())?;
    let continuous = cfg.mode == itrace_format::Mode::Continuous;
    let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_DEPTH);
    let h = std::thread::Builder::new()
        .name("itrace-writer".into())
        .spawn(move || run(buffers, rx, continuous))
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
    /// Continuous mode: nothing is refused, records are copied in runs.
    buffers_continuous: bool,
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

fn run(buffers: Buffers, rx: Receiver<Msg>, continuous: bool) -> Totals {
    let n = buffers.records().len();
    let mut w =
        Writer { buffers, t: Totals::default(), full: vec![false; n], stopped: false, buffers_continuous: continuous };
    let mut end_ts = 0;
    loop {
        let m = match rx.recv_timeout(TICK) {
            Ok(m) => m,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                w.tick();
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match m {
            Msg::Records { stream, data, records, instructions, branches } => {
                if w.buffers_continuous {
                    w.bulk(stream as usize, &data, records, instructions, branches);
                } else {
                    w.records(stream as usize, &data);
                }
                recycle(data);
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
    let Writer { buffers, mut t, .. } = w;
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
        t.unwritten = live.unwritten_records.load(Relaxed);
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
        if let Err(err) = self.buffers.flush_if_due() {
            self.failed(err.to_string());
        }
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

    fn failed(&mut self, e: String) {
        self.stopped = true;
        self.t.stop = Some(StopReason::WriteError);
        self.t.error.get_or_insert(e);
    }
}
