//! The itrace trace file: record layout, per-CPU buffers with their collection
//! modes, the file writer, and a streaming reader that tolerates truncation and reads around
//! damaged chunks.
//!
//! Every backend (ptrace stepping, in-process, kernel shim, GDB remote,
//! emulation) writes this format, and every post-processor reads it. The
//! layout is documented in `docs/trace-format.md`.

mod ahead;
mod buffers;
pub mod compact;
mod error;
mod header;
pub mod kmod;
mod reader;
mod record;
pub mod shm;
mod writer;

pub use ahead::{decode_ahead_default, Ahead, Merged};
pub use buffers::{BufferConfig, Buffers, LiveCounts, Push};

/// The trace's clock: CLOCK_MONOTONIC in nanoseconds (a vDSO call, no system call; safe in a
/// signal handler). Every recorder stamps its records with it.
pub fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: t is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A byte count for people: `512 bytes`, `64.0 KiB`, `974.5 MiB`, `2.3 GiB`.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

pub use error::FormatError;
pub use header::{Arch, Endian, FileHeader, Mode, StepMethod, HEADER_LEN, MAGIC, VERSION_MAJOR, VERSION_MINOR};
pub use header::{FLAG_ICOUNT, FLAG_NO_ASLR};
pub use reader::{
    ChunkInfo, Damage, DamageLoss, Event, EventRef, KindStats, MergedRecords, StreamId, StreamRecords, StreamStats,
    StreamTotals, TraceFile, RECORD_KINDS,
};
pub use record::{
    branch_flags, file_mtime_ns, major, mte_minor, prot, raw_records, BatchStamp, Branch, BranchKind, Hop, Lost, Mte,
    RawRecord, RawRecords, Record, StopReason, Summary, TraceOff, TraceOn, TraceOnReason, BRANCH_RECORD_LEN,
    RECORD_HEADER_LEN,
};
pub use writer::{
    TraceWriter, CHUNK_FLAG_COMPRESSED, CHUNK_FLAG_WRAPPED, CHUNK_HEADER_LEN, CHUNK_MAGIC, COMPRESS_LEVEL,
    MAX_DECOMPRESSED, STREAM_END, STREAM_MTE,
};
