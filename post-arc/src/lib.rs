//! Post-processing of itrace traces: replays the module-table records to
//! resolve addresses to symbols, modules and source lines, rebuilds each
//! thread's call stack, and turns the branch records into PI-style arc files,
//! reports, flame graphs, callgrind profiles, timelines (Chrome, Firefox) and Parquet tables.
//! Everything streams: memory grows with the program's code and threads, not the trace's length
//! (the Firefox Profiler's format apart: its crate builds the profile whole).

pub mod annotate;
pub mod arc;
pub mod archive;
pub mod callflow;
pub mod callgrind;
pub mod diff;
pub mod flame;
pub mod funcname;
pub mod names;
mod notes;
pub mod origin;
pub mod parquet;
pub mod progress;
pub mod range;
pub mod replay;
pub mod report;
pub mod resolve;
pub mod stacks;
pub mod summary;
pub mod symbols;
mod syscall_table;
mod threads;
pub mod timeline;
pub mod views;

pub use threads::Names;

use std::path::Path;

/// An open trace (the format crate's reader) and the part of it the views read.
pub struct Trace {
    file: itrace_format::TraceFile,
    range: range::Range,
}

impl Trace {
    /// The same trace, read over `range` only by every view.
    pub fn with_range(mut self, range: range::Range) -> Self {
        self.range = range;
        self
    }

    /// The part of the trace the views read.
    pub fn range(&self) -> &range::Range {
        &self.range
    }
}

impl std::ops::Deref for Trace {
    type Target = itrace_format::TraceFile;

    fn deref(&self) -> &itrace_format::TraceFile {
        &self.file
    }
}

/// What can stop post-processing.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error(transparent)]
    Format(#[from] itrace_format::FormatError),
    #[error("write failed: {0}")]
    Write(#[from] std::io::Error),
    #[error("no function named {0} ran in the trace (names as `itrace report` shows them)")]
    NoSuchFunction(String),
    #[error(
        "no function named {function} in the trace: {why} (`itrace archive` keeps a copy of the files a trace ran)"
    )]
    NamesGone { function: String, why: String },
    /// A name typed that names several functions.
    #[error(transparent)]
    Name(crate::funcname::NameError),
    #[error("no thread {0} in the trace (`itrace report` lists the threads)")]
    NoSuchThread(u32),
    #[error("cannot read the code of {function} from {path}: {why} (`itrace archive` keeps a copy of the files a trace ran)")]
    CodeUnreadable { function: String, path: String, why: String },
}

/// Open a trace for post-processing; damaged chunks are skipped (`Trace::damage` lists them).
pub fn open(path: &Path) -> Result<Trace, PostError> {
    Ok(Trace { file: itrace_format::TraceFile::open(path)?, range: range::Range::default() })
}

/// [`open`], but a damaged chunk is an error (`--strict`).
pub fn open_strict(path: &Path) -> Result<Trace, PostError> {
    Ok(Trace { file: itrace_format::TraceFile::open_strict(path)?, range: range::Range::default() })
}

/// How often (in records) progress callbacks run.
const PROGRESS_EVERY: u64 = 1 << 16;

/// Records lost on all CPUs by the end summary; a count past u64::MAX (only a damaged file
/// says so) stays at u64::MAX instead of overflowing.
fn summary_lost(s: &itrace_format::Summary) -> u64 {
    s.lost.iter().fold(0u64, |sum, &n| sum.saturating_add(n))
}

/// The error for a function asked for by name that is not in the trace: when a file the
/// trace ran is gone or changed (its functions have no names then), say so.
fn no_such_function(function: &str, notes: &[String]) -> PostError {
    match notes.iter().find_map(|n| n.strip_prefix("warning: ")) {
        Some(why) => PostError::NamesGone { function: function.to_string(), why: why.to_string() },
        None => PostError::NoSuchFunction(function.to_string()),
    }
}
