//! What can stop a backend.

use super::gdb::GdbError;
use super::ptrace::RecordError;
use crate::elf::ElfError;
use itrace_format::FormatError;

/// Why a recording could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Settings this backend (or this machine) cannot record, said in the user's words.
    #[error("{0}")]
    Settings(String),
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Recording failed on the way (the plugin's error, a trigger that cannot be placed).
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Ptrace(#[from] RecordError),
    #[error(transparent)]
    Gdb(#[from] GdbError),
    #[error(transparent)]
    Elf(#[from] ElfError),
}

impl BackendError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        BackendError::Io { what: what.into(), source }
    }
}
