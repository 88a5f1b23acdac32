//! Records: a 16-byte common header (PI's NRM2 layout: type/length, major,
//! minor, timestamp) followed by a payload whose layout the major and minor
//! codes fix. All fields are in the file's byte order; records are a multiple
//! of 4 bytes long.
//!
//! Why about 720 lines: every record kind's encoding and decoding sit side by side, so a
//! change to one layout is read against the others and against docs/trace-format.md.

use crate::header::Endian;
use crate::FormatError;
pub use itrace_compact::{branch_flags, major, BatchStamp, Branch, BranchKind, Hop, BRANCH_RECORD_LEN};

/// Size of the common record header.
pub const RECORD_HEADER_LEN: usize = 16;
const MAX_RECORD_LEN: usize = 0xFFFC;

/// MTE minor codes.
pub mod mte_minor {
    pub const SEGMENT: u32 = 0x01;
    pub const UNMAP: u32 = 0x02;
    pub const PROCESS_NAME: u32 = 0x34;
    pub const THREAD_NAME: u32 = 0x35;
    pub const EXEC: u32 = 0x36;
    pub const JIT_SYMBOL: u32 = 0x41;
    pub const VDSO_IMAGE: u32 = 0x42;
    /// What the file of the segment record before it was when recorded: build-id, size, mtime.
    pub const MODULE_ID: u32 = 0x43;
    /// Where the trace came from: itrace's version and command line, the working directory,
    /// host, kernel and CPU model.
    pub const RECORDING: u32 = 0x44;
    pub const CLONE: u32 = 0x63;
}

/// Protection bits of a mapping.
pub mod prot {
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const EXEC: u32 = 4;
}

/// Why tracing of a thread starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceOnReason {
    /// A launched program's first instruction, or a new thread or process.
    Start = 0,
    /// A running thread was attached.
    Attach = 1,
    /// Tracing resumed after being off.
    Resume = 2,
}

/// Tracing of thread `tid` starts; `pc` is the next instruction it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceOn {
    pub ts: u64,
    pub reason: TraceOnReason,
    pub pid: u32,
    pub tid: u32,
    pub pc: u64,
}

/// Why tracing of a thread ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The thread exited; `value` is the exit status.
    Exited = 0,
    /// The thread was killed by signal `value` (a crash: `pc` is where).
    Signaled = 1,
    /// The tracer detached (duration, Ctrl-C, SIGTERM).
    Detached = 2,
    /// Normal mode: a trace or MTE buffer filled.
    BufferFull = 3,
    /// The trace file could not be written (disk full).
    WriteError = 4,
    /// The thread vanished when another thread of its process called exec.
    Vanished = 5,
    /// The tracer failed on this thread (a ptrace error); `value` is the errno.
    TracerError = 6,
    /// A traced region ended (ITraceOff, `--stop`); the thread runs on untraced.
    RegionEnd = 7,
}

impl StopReason {
    /// Decode a stored reason code.
    pub fn from_code(c: u32) -> Option<Self> {
        use StopReason::*;
        Some(match c {
            0 => Exited,
            1 => Signaled,
            2 => Detached,
            3 => BufferFull,
            4 => WriteError,
            5 => Vanished,
            6 => TracerError,
            7 => RegionEnd,
            _ => return None,
        })
    }
}

/// Tracing of thread `tid` ended. `icount` instructions ran since its last
/// branch record; `pc` is the next instruction it would run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceOff {
    pub ts: u64,
    pub reason: StopReason,
    pub pid: u32,
    pub tid: u32,
    pub pc: u64,
    pub icount: u32,
    pub value: i32,
}

/// `count` records were lost at this point of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lost {
    pub ts: u64,
    pub count: u64,
}

/// Module-table entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mte {
    /// An executable mapping `start..end` of `path` at file `offset`.
    Segment {
        ts: u64,
        pid: u32,
        prot: u32,
        start: u64,
        end: u64,
        offset: u64,
        path: String,
    },
    /// `start..end` is no longer mapped.
    Unmap {
        ts: u64,
        pid: u32,
        start: u64,
        end: u64,
    },
    ProcessName {
        ts: u64,
        pid: u32,
        ppid: u32,
        name: String,
    },
    ThreadName {
        ts: u64,
        pid: u32,
        tid: u32,
        name: String,
    },
    /// Process `pid` (thread `tid`) executed `path`: its old mappings are gone.
    Exec {
        ts: u64,
        pid: u32,
        tid: u32,
        path: String,
    },
    /// JIT code symbol (from a perf map file).
    JitSymbol {
        ts: u64,
        pid: u32,
        start: u64,
        size: u64,
        name: String,
    },
    /// The vDSO's bytes as mapped at `start`, so its symbols resolve later.
    VdsoImage {
        ts: u64,
        pid: u32,
        start: u64,
        image: Vec<u8>,
    },
    /// The file mapped at `start` (the segment record just before) as it was when recorded:
    /// its GNU build-id (empty when it has none), size in bytes and modification time, so that
    /// readers can tell when the file at `path` is no longer the one that ran.
    ModuleId {
        ts: u64,
        pid: u32,
        start: u64,
        size: u64,
        /// Nanoseconds since the epoch.
        mtime_ns: u64,
        build_id: Vec<u8>,
        path: String,
    },
    /// Where the trace came from, written first in the MTE stream (the date is the header's
    /// start time).
    Recording {
        ts: u64,
        /// itrace's version.
        version: String,
        /// itrace's own command line (`itrace record -o t.itr ./prog`).
        args: Vec<String>,
        /// The working directory of `itrace record`.
        cwd: String,
        /// The host name.
        host: String,
        /// The kernel: `uname -srvm`.
        kernel: String,
        /// The CPU model (`model name` of /proc/cpuinfo, or what the architecture calls it).
        cpu: String,
    },
    /// A new thread (`thread` true) or process.
    Clone {
        ts: u64,
        parent_pid: u32,
        parent_tid: u32,
        child_pid: u32,
        child_tid: u32,
        thread: bool,
    },
}

/// A file's modification time as a module-identity record holds it: ns since the epoch (0
/// before it).
pub fn file_mtime_ns(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    u64::try_from(meta.mtime()).unwrap_or(0).saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec() as u64)
}

/// `$e` of the `ts` field of MTE record `$m`, bound as `$ts`: the one list of the variants for
/// [`Mte::ts`] and [`Mte::ts_mut`] (every variant has one).
macro_rules! mte_ts {
    ($m:expr, $ts:ident => $e:expr) => {
        match $m {
            Mte::Segment { $ts, .. }
            | Mte::Unmap { $ts, .. }
            | Mte::ProcessName { $ts, .. }
            | Mte::ThreadName { $ts, .. }
            | Mte::Exec { $ts, .. }
            | Mte::JitSymbol { $ts, .. }
            | Mte::VdsoImage { $ts, .. }
            | Mte::ModuleId { $ts, .. }
            | Mte::Recording { $ts, .. }
            | Mte::Clone { $ts, .. } => $e,
        }
    };
}

impl Mte {
    /// Timestamp of the entry.
    pub fn ts(&self) -> u64 {
        mte_ts!(self, ts => *ts)
    }

    /// The record's timestamp, to set it.
    pub fn ts_mut(&mut self) -> &mut u64 {
        mte_ts!(self, ts => ts)
    }
}

/// End-of-trace totals, written last.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Summary {
    pub ts: u64,
    /// Why the whole trace ended (a [`StopReason`] code).
    pub stop_reason: u32,
    pub instructions: u64,
    /// Records per CPU stream.
    pub records: Vec<u64>,
    /// Lost records per CPU stream.
    pub lost: Vec<u64>,
    pub mte_records: u64,
    /// What each CPU stream's chunks hold, counted as they were written (3.0 files written since
    /// these totals were added; `None` in older ones): `itrace info` answers from them without
    /// decoding the records.
    pub totals: Option<Vec<crate::reader::StreamTotals>>,
}

/// As derived, but a summary without stream totals prints as before they were added (so
/// `itrace dump` of an older file reads as the itrace that wrote it dumped it).
impl std::fmt::Debug for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Summary");
        d.field("ts", &self.ts)
            .field("stop_reason", &self.stop_reason)
            .field("instructions", &self.instructions)
            .field("records", &self.records)
            .field("lost", &self.lost)
            .field("mte_records", &self.mte_records);
        if let Some(t) = &self.totals {
            d.field("totals", t);
        }
        d.finish()
    }
}

/// Any record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Branch(Branch),
    TraceOn(TraceOn),
    TraceOff(TraceOff),
    Lost(Lost),
    Mte(Mte),
    Summary(Summary),
    /// A record this reader does not know (from a newer minor version); skipped.
    Unknown {
        ts: u64,
        major: u16,
        minor: u32,
    },
}

impl Record {
    /// Timestamp of the record (ns, CLOCK_MONOTONIC of the recording machine).
    pub fn ts(&self) -> u64 {
        match self {
            Record::Branch(b) => b.ts,
            Record::TraceOn(r) => r.ts,
            Record::TraceOff(r) => r.ts,
            Record::Lost(r) => r.ts,
            Record::Mte(m) => m.ts(),
            Record::Summary(s) => s.ts,
            Record::Unknown { ts, .. } => *ts,
        }
    }

    /// Set the record's timestamp (a recorder keeping a stream's records in time order).
    pub fn set_ts(&mut self, to: u64) {
        match self {
            Record::Branch(b) => b.ts = to,
            Record::TraceOn(r) => r.ts = to,
            Record::TraceOff(r) => r.ts = to,
            Record::Lost(r) => r.ts = to,
            Record::Summary(s) => s.ts = to,
            Record::Unknown { ts, .. } => *ts = to,
            Record::Mte(m) => *m.ts_mut() = to,
        }
    }

    /// Append the encoded record (native byte order) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FormatError> {
        let start = out.len();
        let mut w = Enc { out, start };
        match self {
            Record::Branch(b) => {
                let mut a = [0u8; BRANCH_RECORD_LEN];
                b.encode_into(&mut a);
                w.out.extend_from_slice(&a);
                return Ok(());
            }
            Record::TraceOn(r) => {
                w.header(major::TRACE_ON, r.reason as u32, r.ts);
                w.u32(r.pid);
                w.u32(r.tid);
                w.u64(r.pc);
            }
            Record::TraceOff(r) => {
                w.header(major::TRACE_OFF, r.reason as u32, r.ts);
                w.u32(r.pid);
                w.u32(r.tid);
                w.u64(r.pc);
                w.u32(r.icount);
                w.u32(r.value as u32);
            }
            Record::Lost(r) => {
                w.header(major::LOST, 0, r.ts);
                w.u64(r.count);
            }
            Record::Mte(m) => match m {
                Mte::Segment { ts, pid, prot, start, end, offset, path } => {
                    w.header(major::MTE, mte_minor::SEGMENT, *ts);
                    w.u32(*pid);
                    w.u32(*prot);
                    w.u64(*start);
                    w.u64(*end);
                    w.u64(*offset);
                    w.str(path);
                }
                Mte::Unmap { ts, pid, start, end } => {
                    w.header(major::MTE, mte_minor::UNMAP, *ts);
                    w.u32(*pid);
                    w.u32(0);
                    w.u64(*start);
                    w.u64(*end);
                }
                Mte::ProcessName { ts, pid, ppid, name } => {
                    w.header(major::MTE, mte_minor::PROCESS_NAME, *ts);
                    w.u32(*pid);
                    w.u32(*ppid);
                    w.str(name);
                }
                Mte::ThreadName { ts, pid, tid, name } => {
                    w.header(major::MTE, mte_minor::THREAD_NAME, *ts);
                    w.u32(*pid);
                    w.u32(*tid);
                    w.str(name);
                }
                Mte::Exec { ts, pid, tid, path } => {
                    w.header(major::MTE, mte_minor::EXEC, *ts);
                    w.u32(*pid);
                    w.u32(*tid);
                    w.str(path);
                }
                Mte::JitSymbol { ts, pid, start, size, name } => {
                    w.header(major::MTE, mte_minor::JIT_SYMBOL, *ts);
                    w.u32(*pid);
                    w.u32(0);
                    w.u64(*start);
                    w.u64(*size);
                    w.str(name);
                }
                Mte::VdsoImage { ts, pid, start, image } => {
                    w.header(major::MTE, mte_minor::VDSO_IMAGE, *ts);
                    w.u32(*pid);
                    w.u32(image.len() as u32);
                    w.u64(*start);
                    w.out.extend_from_slice(image);
                }
                Mte::ModuleId { ts, pid, start, size, mtime_ns, build_id, path } => {
                    w.header(major::MTE, mte_minor::MODULE_ID, *ts);
                    w.u32(*pid);
                    // A GNU build-id is 20 bytes (SHA-1) or 16 (MD5, UUID); 255 is plenty.
                    let id = &build_id[..build_id.len().min(255)];
                    w.u32(id.len() as u32);
                    w.u64(*start);
                    w.u64(*size);
                    w.u64(*mtime_ns);
                    w.out.extend_from_slice(id);
                    w.str(path);
                }
                Mte::Recording { ts, version, args, cwd, host, kernel, cpu } => {
                    w.header(major::MTE, mte_minor::RECORDING, *ts);
                    w.u32(args.len() as u32);
                    for t in [version, cwd, host, kernel, cpu].into_iter().chain(args) {
                        w.str(t);
                    }
                }
                Mte::Clone { ts, parent_pid, parent_tid, child_pid, child_tid, thread } => {
                    w.header(major::MTE, mte_minor::CLONE, *ts);
                    w.u32(*parent_pid);
                    w.u32(*parent_tid);
                    w.u32(*child_pid);
                    w.u32(*child_tid);
                    w.u32(*thread as u32);
                }
            },
            Record::Summary(s) => {
                w.header(major::SUMMARY, 0, s.ts);
                w.u32(s.stop_reason);
                w.u32(s.records.len() as u32);
                w.u64(s.instructions);
                w.u64(s.mte_records);
                for (r, l) in s.records.iter().zip(&s.lost) {
                    w.u64(*r);
                    w.u64(*l);
                }
                // After the pairs, which older readers stop at: the stream totals, one per CPU,
                // when the record can hold them (else readers take the slow path).
                let kinds = crate::reader::RECORD_KINDS.len();
                let per_cpu = 24 + 16 * kinds;
                let fits =
                    RECORD_HEADER_LEN + 24 + 16 * s.records.len() + 8 + per_cpu * s.records.len() <= MAX_RECORD_LEN;
                match &s.totals {
                    Some(t) if t.len() == s.records.len() && fits => {
                        w.u32(kinds as u32);
                        w.u32(0);
                        for t in t {
                            w.u64(t.branches);
                            w.u64(t.first_ts.unwrap_or(u64::MAX));
                            w.u64(t.last_ts.unwrap_or(0));
                            for k in &t.kinds {
                                w.u64(k.records);
                                w.u64(k.bytes);
                            }
                        }
                    }
                    _ => {}
                }
            }
            Record::Unknown { .. } => {
                return Err(FormatError::Corrupt { offset: 0, what: "cannot encode an unknown record".into() })
            }
        }
        w.finish()
    }

    /// Decode one record from `b`, which holds exactly the record's bytes.
    /// `offset` is its position in the file, for error messages.
    pub fn decode(e: Endian, b: &[u8], offset: u64) -> Result<Record, FormatError> {
        let short = |need: usize| FormatError::Corrupt {
            offset,
            what: format!("record of {} bytes is too short for its kind (needs {need})", b.len()),
        };
        if b.len() < RECORD_HEADER_LEN {
            return Err(FormatError::Corrupt {
                offset,
                what: format!("record of {} bytes is shorter than a record header", b.len()),
            });
        }
        let maj = e.u16(&b[2..]);
        let minor = e.u32(&b[4..]);
        let ts = e.u64(&b[8..]);
        let p = &b[RECORD_HEADER_LEN..];
        let need = |n: usize| if p.len() < n { Err(short(RECORD_HEADER_LEN + n)) } else { Ok(()) };
        Ok(match maj {
            major::BRANCH_KERNEL | major::BRANCH_USER => {
                need(24)?;
                let code = (minor & 0xff) as u8;
                let kind = BranchKind::from_code(code)
                    .ok_or_else(|| FormatError::Corrupt { offset, what: format!("unknown branch kind {code}") })?;
                Record::Branch(Branch {
                    ts,
                    kernel: maj == major::BRANCH_KERNEL,
                    kind,
                    flags: (minor >> 8) as u8,
                    aux: (minor >> 16) as u16,
                    from: e.u64(&p[0..]),
                    to: e.u64(&p[8..]),
                    tid: e.u32(&p[16..]),
                    icount: e.u32(&p[20..]),
                })
            }
            major::TRACE_ON => {
                need(16)?;
                let reason = match minor {
                    0 => TraceOnReason::Start,
                    1 => TraceOnReason::Attach,
                    _ => TraceOnReason::Resume,
                };
                Record::TraceOn(TraceOn { ts, reason, pid: e.u32(p), tid: e.u32(&p[4..]), pc: e.u64(&p[8..]) })
            }
            major::TRACE_OFF => {
                need(24)?;
                let reason = StopReason::from_code(minor)
                    .ok_or_else(|| FormatError::Corrupt { offset, what: format!("unknown stop reason {minor}") })?;
                Record::TraceOff(TraceOff {
                    ts,
                    reason,
                    pid: e.u32(p),
                    tid: e.u32(&p[4..]),
                    pc: e.u64(&p[8..]),
                    icount: e.u32(&p[16..]),
                    value: e.u32(&p[20..]) as i32,
                })
            }
            major::LOST => {
                need(8)?;
                Record::Lost(Lost { ts, count: e.u64(p) })
            }
            major::SUMMARY => {
                need(24)?;
                let n = e.u32(&p[4..]) as usize;
                need(24 + 16 * n)?;
                let mut records = Vec::with_capacity(n);
                let mut lost = Vec::with_capacity(n);
                for i in 0..n {
                    records.push(e.u64(&p[24 + 16 * i..]));
                    lost.push(e.u64(&p[32 + 16 * i..]));
                }
                Record::Summary(Summary {
                    ts,
                    stop_reason: e.u32(p),
                    instructions: e.u64(&p[8..]),
                    mte_records: e.u64(&p[16..]),
                    totals: decode_totals(e, &p[24 + 16 * n..], n),
                    records,
                    lost,
                })
            }
            major::MTE => {
                let s = |at: usize| -> Result<String, FormatError> {
                    if p.len() < at + 2 {
                        return Err(short(RECORD_HEADER_LEN + at + 2));
                    }
                    let n = e.u16(&p[at..]) as usize;
                    let bytes = p.get(at + 2..at + 2 + n).ok_or_else(|| short(RECORD_HEADER_LEN + at + 2 + n))?;
                    Ok(String::from_utf8_lossy(bytes).into_owned())
                };
                Record::Mte(match minor {
                    mte_minor::SEGMENT => {
                        need(32)?;
                        Mte::Segment {
                            ts,
                            pid: e.u32(p),
                            prot: e.u32(&p[4..]),
                            start: e.u64(&p[8..]),
                            end: e.u64(&p[16..]),
                            offset: e.u64(&p[24..]),
                            path: s(32)?,
                        }
                    }
                    mte_minor::UNMAP => {
                        need(24)?;
                        Mte::Unmap { ts, pid: e.u32(p), start: e.u64(&p[8..]), end: e.u64(&p[16..]) }
                    }
                    mte_minor::PROCESS_NAME => {
                        need(8)?;
                        Mte::ProcessName { ts, pid: e.u32(p), ppid: e.u32(&p[4..]), name: s(8)? }
                    }
                    mte_minor::THREAD_NAME => {
                        need(8)?;
                        Mte::ThreadName { ts, pid: e.u32(p), tid: e.u32(&p[4..]), name: s(8)? }
                    }
                    mte_minor::EXEC => {
                        need(8)?;
                        Mte::Exec { ts, pid: e.u32(p), tid: e.u32(&p[4..]), path: s(8)? }
                    }
                    mte_minor::JIT_SYMBOL => {
                        need(24)?;
                        Mte::JitSymbol { ts, pid: e.u32(p), start: e.u64(&p[8..]), size: e.u64(&p[16..]), name: s(24)? }
                    }
                    mte_minor::VDSO_IMAGE => {
                        need(16)?;
                        let n = e.u32(&p[4..]) as usize;
                        need(16 + n)?;
                        Mte::VdsoImage { ts, pid: e.u32(p), start: e.u64(&p[8..]), image: p[16..16 + n].to_vec() }
                    }
                    mte_minor::MODULE_ID => {
                        need(32)?;
                        let n = (e.u32(&p[4..]) as usize).min(255);
                        need(32 + n)?;
                        Mte::ModuleId {
                            ts,
                            pid: e.u32(p),
                            start: e.u64(&p[8..]),
                            size: e.u64(&p[16..]),
                            mtime_ns: e.u64(&p[24..]),
                            build_id: p[32..32 + n].to_vec(),
                            path: s(32 + n)?,
                        }
                    }
                    mte_minor::RECORDING => {
                        need(4)?;
                        let argc = e.u32(p) as usize;
                        let mut at = 4;
                        let mut next = || -> Result<String, FormatError> {
                            let t = s(at)?;
                            at += 2 + e.u16(&p[at..]) as usize;
                            Ok(t)
                        };
                        let (version, cwd, host, kernel, cpu) = (next()?, next()?, next()?, next()?, next()?);
                        // Each string takes 2 bytes at least: a damaged count cannot allocate more.
                        let mut args = Vec::with_capacity(argc.min(p.len() / 2));
                        for _ in 0..argc {
                            args.push(next()?);
                        }
                        Mte::Recording { ts, version, args, cwd, host, kernel, cpu }
                    }
                    mte_minor::CLONE => {
                        need(20)?;
                        Mte::Clone {
                            ts,
                            parent_pid: e.u32(p),
                            parent_tid: e.u32(&p[4..]),
                            child_pid: e.u32(&p[8..]),
                            child_tid: e.u32(&p[12..]),
                            thread: e.u32(&p[16..]) != 0,
                        }
                    }
                    _ => return Ok(Record::Unknown { ts, major: maj, minor }),
                })
            }
            _ => Record::Unknown { ts, major: maj, minor },
        })
    }
}

struct Enc<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl Enc<'_> {
    fn header(&mut self, maj: u16, minor: u32, ts: u64) {
        self.out.extend_from_slice(&0u16.to_ne_bytes());
        self.out.extend_from_slice(&maj.to_ne_bytes());
        self.out.extend_from_slice(&minor.to_ne_bytes());
        self.out.extend_from_slice(&ts.to_ne_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_ne_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_ne_bytes());
    }
    fn str(&mut self, s: &str) {
        // Names longer than a record can hold are cut, at a char boundary.
        let mut n = s.len().min(4096);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.out.extend_from_slice(&(n as u16).to_ne_bytes());
        self.out.extend_from_slice(&s.as_bytes()[..n]);
    }
    fn finish(self) -> Result<(), FormatError> {
        while (self.out.len() - self.start) % 4 != 0 {
            self.out.push(0);
        }
        let len = self.out.len() - self.start;
        if len > MAX_RECORD_LEN {
            self.out.truncate(self.start);
            return Err(FormatError::RecordTooLarge { len });
        }
        self.out[self.start..self.start + 2].copy_from_slice(&(len as u16).to_ne_bytes());
        Ok(())
    }
}

/// The stream totals that may follow a summary's (kept, lost) pairs, for `n` CPUs; `None` when
/// absent (a file written before them), short, or listing kinds of record this reader does not
/// know (the slow path counts those then).
fn decode_totals(e: Endian, b: &[u8], n: usize) -> Option<Vec<crate::reader::StreamTotals>> {
    use crate::reader::{KindStats, StreamTotals, RECORD_KINDS};
    let kinds = RECORD_KINDS.len();
    if b.len() < 8 || e.u32(b) as usize != kinds {
        return None;
    }
    let per_cpu = 24 + 16 * kinds;
    let b = b.get(8..8 + per_cpu * n)?;
    Some(
        b.chunks_exact(per_cpu)
            .map(|c| {
                let first = e.u64(&c[8..]);
                let last = e.u64(&c[16..]);
                let any = c[24..].chunks_exact(16).any(|k| e.u64(k) > 0);
                let mut t = StreamTotals {
                    branches: e.u64(c),
                    first_ts: any.then_some(first),
                    last_ts: any.then_some(last),
                    kinds: Default::default(),
                };
                for (i, k) in c[24..].chunks_exact(16).enumerate() {
                    t.kinds[i] = KindStats { records: e.u64(k), bytes: e.u64(&k[8..]) };
                }
                t
            })
            .collect(),
    )
}

/// Length of the record starting at `b` (from its type/length field), if `b` holds a header.
pub(crate) fn record_len(e: Endian, b: &[u8]) -> Option<usize> {
    (b.len() >= 2).then(|| (e.u16(b) & 0xFFFC) as usize)
}

/// One encoded record found by [`raw_records`].
#[derive(Clone, Copy, Debug)]
pub struct RawRecord<'a> {
    /// Where it starts in the bytes walked.
    pub offset: usize,
    /// Its major code.
    pub major: u16,
    /// All of it, header included.
    pub bytes: &'a [u8],
}

/// Walk the encoded records laid end to end in `bytes` (a stream, a ring's contents) without
/// decoding them. A length field under 4 or running past the end yields `Err(offset)` once and
/// ends the walk; a tail shorter than a record header ends it quietly.
pub fn raw_records(e: Endian, bytes: &[u8]) -> RawRecords<'_> {
    RawRecords { e, bytes, at: 0, failed: false }
}

/// The iterator of [`raw_records`].
pub struct RawRecords<'a> {
    e: Endian,
    bytes: &'a [u8],
    at: usize,
    failed: bool,
}

impl RawRecords<'_> {
    /// Where the walk is: the end of the last whole record yielded.
    pub fn offset(&self) -> usize {
        self.at
    }
}

impl<'a> Iterator for RawRecords<'a> {
    type Item = Result<RawRecord<'a>, usize>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at + 4 > self.bytes.len() {
            return None;
        }
        let rest = &self.bytes[self.at..];
        let len = record_len(self.e, rest).unwrap_or(0);
        if len < 4 || len > rest.len() {
            self.failed = true;
            return Some(Err(self.at));
        }
        let rec = RawRecord { offset: self.at, major: self.e.u16(&rest[2..]), bytes: &rest[..len] };
        self.at += len;
        Some(Ok(rec))
    }
}
