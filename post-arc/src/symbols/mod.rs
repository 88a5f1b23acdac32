//! Symbolization: function symbols, PLT stubs and source lines of ELF images
//! (files, saved vDSOs) and JIT perf maps.
//!
//! Addresses given to [`ModuleSymbols::lookup`] and [`ModuleSymbols::line`]
//! are the image's own virtual addresses (`st_value` terms); translate
//! runtime addresses with [`ModuleSymbols::file_vaddr`] first.

mod cache;
pub mod debuginfod;
pub(crate) mod demangle;
mod elf;
mod frames;
mod jit;
mod lines;
mod module;
mod plt;
mod table;

use std::path::PathBuf;

pub use cache::SymbolCache;
pub use jit::JitSymbols;
pub use module::{build_id_debug_files, ModuleSymbols, DEFAULT_DEBUG_DIR};
pub use plt::PltPart;

/// Run third-party parsing of untrusted data (DWARF, mangled names) so that
/// a bug there costs one answer (`None`) instead of the whole post-processing.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Option<T>) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(None)
}

/// A symbol found for an address: its demangled name, start address and the address's offset from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolHit<'a> {
    /// Demangled name without its symbol version; `printf@plt` for PLT stubs, `<plt>` for a
    /// PLT header or a stub whose target is not known.
    pub name: &'a str,
    /// Address of the symbol's (or PLT entry's) first byte.
    pub start: u64,
    /// The looked-up address minus `start`.
    pub offset: u64,
    /// Set when the address is in a PLT.
    pub plt: Option<PltPart>,
    /// Offset of the function's local entry point from `start` (64-bit PowerPC ELFv2: past
    /// the TOC set-up, where calls and tail calls within the module enter); 0 elsewhere.
    pub local_entry: u8,
}

/// Why an image could not be loaded.
#[derive(thiserror::Error, Debug)]
pub enum SymbolError {
    /// The file could not be opened, examined or mapped.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file or bytes are not an ELF image at all.
    #[error("{name} is not an ELF image: {reason}")]
    NotElf { name: String, reason: String },
    /// The image starts like ELF but its headers are inconsistent or truncated.
    #[error("{name} is a malformed ELF image: {reason}")]
    Malformed { name: String, reason: String },
}
