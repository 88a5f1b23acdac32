//! The itrace trace file: record layout, per-CPU buffers with their collection
//! modes, the file writer, and a streaming reader that tolerates truncation.
//!
//! Every backend (ptrace stepping, in-process, kernel shim, GDB remote,
//! emulation) writes this format, and every post-processor reads it. The
//! layout is documented in `docs/trace-format.md`.

mod buffers;
mod error;
mod header;
pub mod kmod;
mod reader;
mod record;
pub mod shm;
mod writer;

pub use buffers::{BufferConfig, Buffers, Push};
pub use error::FormatError;
pub use header::{Arch, Endian, FileHeader, Mode, StepMethod, HEADER_LEN, MAGIC, VERSION_MAJOR, VERSION_MINOR};
pub use header::{FLAG_ICOUNT, FLAG_NO_ASLR};
pub use reader::{ChunkInfo, Event, MergedRecords, StreamId, StreamRecords, TraceFile};
pub use record::{
    branch_flags, major, mte_minor, prot, Branch, BranchKind, Lost, Mte, Record, StopReason, Summary, TraceOff,
    TraceOn, TraceOnReason, BRANCH_RECORD_LEN, RECORD_HEADER_LEN,
};
pub use writer::{TraceWriter, CHUNK_FLAG_WRAPPED, CHUNK_HEADER_LEN, CHUNK_MAGIC, STREAM_END, STREAM_MTE};
