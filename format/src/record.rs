//! Records: a 16-byte common header (PI's NRM2 layout: type/length, major,
//! minor, timestamp) followed by a payload whose layout the major and minor
//! codes fix. All fields are in the file's byte order; records are a multiple
//! of 4 bytes long.
//!
//! Why about 720 lines: every record kind's encoding and decoding sit side by side, so a
//! change to one layout is read against the others and against docs/trace-format.md.

use crate::header::Endian;
use crate::FormatError;

/// Size of the common record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// Size of a branch record (header included).
pub const BRANCH_RECORD_LEN: usize = 40;
const MAX_RECORD_LEN: usize = 0xFFFC;

/// Major codes (PI's where PI had one).
pub mod major {
    /// Module table entry: processes, threads, mappings, symbols.
    pub const MTE: u16 = 0x19;
    /// Taken branch whose source is in the kernel (return to user space).
    pub const BRANCH_KERNEL: u16 = 0x20;
    /// Taken branch whose source is in user space.
    pub const BRANCH_USER: u16 = 0x21;
    /// Tracing of a thread starts.
    pub const TRACE_ON: u16 = 0x2e;
    /// Tracing of a thread ends.
    pub const TRACE_OFF: u16 = 0x2f;
    /// Records were lost (overwritten in wrap mode, or could not be written).
    pub const LOST: u16 = 0x31;
    /// End-of-trace summary (only in the end chunk).
    pub const SUMMARY: u16 = 0x3f;
}

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

/// Flag bits of a branch record (bits 8-15 of its minor code).
pub mod branch_flags {
    /// A system call: `aux` is the system call number.
    pub const SYSCALL: u8 = 1;
    /// A signal delivery: `aux` is the signal number.
    pub const SIGNAL: u8 = 2;
}

/// Protection bits of a mapping.
pub mod prot {
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const EXEC: u32 = 4;
}

/// Type of the instruction that ends a block. Codes 0-7 are PI's arc codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BranchKind {
    /// Interrupt, system call or signal into the kernel.
    Intrpt = 0,
    Call = 1,
    Return = 2,
    /// Unconditional jump (direct or indirect).
    Jump = 3,
    /// Return from the kernel to user space.
    Iret = 4,
    Other = 5,
    Undefd = 6,
    Alloc = 7,
    /// Conditional jump, taken. PI's arc shows it as JUMP.
    CondJump = 8,
}

impl BranchKind {
    /// Decode a stored kind code.
    pub fn from_code(c: u8) -> Option<Self> {
        use BranchKind::*;
        Some(match c {
            0 => Intrpt,
            1 => Call,
            2 => Return,
            3 => Jump,
            4 => Iret,
            5 => Other,
            6 => Undefd,
            7 => Alloc,
            8 => CondJump,
            _ => return None,
        })
    }
    /// PI's arc type code (field 3).
    pub fn arc_code(self) -> u8 {
        match self {
            BranchKind::CondJump => 3,
            k => k as u8,
        }
    }
    /// PI's arc type string (field 9).
    pub fn arc_name(self) -> &'static str {
        match self {
            BranchKind::Intrpt => "INTRPT",
            BranchKind::Call => "CALL",
            BranchKind::Return => "RETURN",
            BranchKind::Jump | BranchKind::CondJump => "JUMP",
            BranchKind::Iret => "IRET",
            BranchKind::Other => "OTHER",
            BranchKind::Undefd => "UNDEFD",
            BranchKind::Alloc => "ALLOC",
        }
    }
}

/// One taken branch: the block of `icount` instructions that ended with the
/// instruction at `from` went to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Branch {
    pub ts: u64,
    /// Source is in the kernel (a return to user space).
    pub kernel: bool,
    pub kind: BranchKind,
    /// [`branch_flags`] bits.
    pub flags: u8,
    /// System call or signal number, per `flags`.
    pub aux: u16,
    pub from: u64,
    pub to: u64,
    pub tid: u32,
    /// Instructions executed since the previous record of this thread, this one included.
    pub icount: u32,
}

impl Branch {
    /// A taken branch in user space from `from` to `to` by thread `tid`; `flags` and `aux` as
    /// in [`Branch`]. Its instruction count is set by the caller (0 here).
    pub fn user(ts: u64, tid: u32, from: u64, to: u64, kind: BranchKind, flags: u8, aux: u16) -> Branch {
        Branch { ts, kernel: false, kind, flags, aux, from, to, tid, icount: 0 }
    }

    /// The kernel's return to user space at `to` after a system call or signal delivery
    /// (`flags` says which, `aux` its number): a `K` IRET record with no instructions.
    pub fn kernel_return(ts: u64, tid: u32, to: u64, flags: u8, aux: u16) -> Branch {
        Branch { ts, kernel: true, kind: BranchKind::Iret, flags, aux, from: 0, to, tid, icount: 0 }
    }
}

/// A taken user-mode branch of a batch of one thread's branches
/// ([`crate::Buffers::push_hops`]): a [`Branch`] without what the batch shares (its thread and,
/// through a [`BatchStamp`], its timestamps), no flags, no aux, and with a key. 24 bytes against
/// a `Branch`'s 40: the translating recorder's drain writes a ring's worth of these on one CPU
/// and the writer thread reads them on the other, and that traffic was as much of each side's
/// time per record as their work (32 bytes, with the key a field of its own, cost 10 % of a
/// recording's time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hop {
    pub from: u64,
    pub to: u64,
    /// As [`Branch::icount`].
    pub icount: u32,
    /// The kind's code (bits 0-7) and the key (bits 8-31).
    kind_key: u32,
}

impl Hop {
    /// The largest key ([`Hop::key`]).
    pub const MAX_KEY: u32 = (1 << 24) - 1;

    /// The hop of a branch of `kind` from `from` to `to`, `icount` instructions. `key`: 0, or
    /// a key that stands for `from`, `icount` and `kind` (in the translating recorder, the exit
    /// that made the hop): hops with one key have those three the same, so the encoder finds a
    /// keyed hop's edge without hashing it. A key over [`Hop::MAX_KEY`] is taken as 0.
    #[inline(always)]
    pub fn new(from: u64, to: u64, icount: u32, kind: BranchKind, key: u32) -> Hop {
        let key = if key > Self::MAX_KEY { 0 } else { key };
        Hop { from, to, icount, kind_key: key << 8 | kind as u32 }
    }

    #[inline(always)]
    pub fn kind(&self) -> BranchKind {
        BranchKind::from_code(self.kind_key as u8).expect("made from a BranchKind")
    }

    /// The kind's code ([`BranchKind`] as a number).
    #[inline(always)]
    pub(crate) fn kind_code(&self) -> u8 {
        self.kind_key as u8
    }

    /// Its key, 0 for none.
    #[inline(always)]
    pub fn key(&self) -> u32 {
        self.kind_key >> 8
    }

    /// The same branch with `icount` instructions (a count carried into it from before), its key
    /// dropped: a key stands for the count it was given with.
    #[inline(always)]
    pub fn carried(self, icount: u32) -> Hop {
        Hop { icount, kind_key: self.kind_key & 0xff, ..self }
    }

    /// The branch record it stands for, of thread `tid` at `ts`.
    #[inline]
    pub fn branch(&self, ts: u64, tid: u32) -> Branch {
        Branch { icount: self.icount, ..Branch::user(ts, tid, self.from, self.to, self.kind(), 0, 0) }
    }
}

/// The timestamps of a batch of one thread's records read at one clock reading: the first
/// `first_n` take `first` (the thread's earlier reading, as far as it is shared), the rest
/// `rest`. A recorder works it out before it makes the batch (`Sink::batch_stamp` in the
/// recorders), so that no pass over the batch sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchStamp {
    pub first: u64,
    pub first_n: usize,
    pub rest: u64,
}

impl BatchStamp {
    /// The timestamp of the batch's record `i`.
    #[inline(always)]
    pub fn ts(&self, i: usize) -> u64 {
        if i < self.first_n {
            self.first
        } else {
            self.rest
        }
    }

    /// The stamp of the batch's records from record `i` on (a piece of it stored apart).
    #[inline]
    pub fn from(&self, i: usize) -> BatchStamp {
        BatchStamp { first_n: self.first_n.saturating_sub(i), ..*self }
    }
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

impl Branch {
    /// Encode into a fixed-size array (the recorder's hot path).
    #[inline]
    pub fn encode_into(&self, a: &mut [u8; BRANCH_RECORD_LEN]) {
        let maj = if self.kernel { major::BRANCH_KERNEL } else { major::BRANCH_USER };
        let minor = self.kind as u32 | (self.flags as u32) << 8 | (self.aux as u32) << 16;
        a[0..2].copy_from_slice(&(BRANCH_RECORD_LEN as u16).to_ne_bytes());
        a[2..4].copy_from_slice(&maj.to_ne_bytes());
        a[4..8].copy_from_slice(&minor.to_ne_bytes());
        a[8..16].copy_from_slice(&self.ts.to_ne_bytes());
        a[16..24].copy_from_slice(&self.from.to_ne_bytes());
        a[24..32].copy_from_slice(&self.to.to_ne_bytes());
        a[32..36].copy_from_slice(&self.tid.to_ne_bytes());
        a[36..40].copy_from_slice(&self.icount.to_ne_bytes());
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
