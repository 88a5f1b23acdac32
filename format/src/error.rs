use std::path::PathBuf;

/// What can go wrong writing or reading a trace file.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    // `err`, not `source`: the message says it, so it is not also a cause to print again.
    #[error("cannot open trace file {path}: {err}")]
    Open { path: PathBuf, err: std::io::Error },
    #[error("cannot write trace file: {0}")]
    Write(std::io::Error),
    #[error("{path} is {kind}, not a trace file (a trace is a regular file)")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("{path} is empty: not a trace file")]
    Empty { path: PathBuf },
    #[error("{path} is not an itrace trace file (its first bytes are {}, not \"ITRC\")", hex_bytes(found))]
    NotATrace { path: PathBuf, found: Vec<u8> },
    #[error(
        "{path} ends after {len} bytes, inside its {}-byte file header: nothing of the trace is left",
        crate::HEADER_LEN
    )]
    HeaderCut { path: PathBuf, len: u64 },
    #[error("{path}: the file header is damaged: {what}")]
    HeaderDamaged { path: PathBuf, what: String },
    #[error("{path}: the file header is invalid: {what}")]
    HeaderInvalid { path: PathBuf, what: String },
    #[error(
        "{path}: trace format version {major}.{minor} is not supported (this itrace reads {}.x to {}.x)",
        crate::header::OLDEST_MAJOR,
        crate::VERSION_MAJOR
    )]
    UnsupportedVersion { path: PathBuf, major: u16, minor: u16 },
    #[error("corrupt trace at offset {offset:#x}: {what}")]
    Corrupt { offset: u64, what: String },
    #[error(
        "cannot reserve {} of trace buffer per CPU for {ncpu} CPUs: more memory than this machine gives \
         (use a smaller --buffer-size or --segment-size)",
        crate::human_size(*per_cpu)
    )]
    NoMemory { per_cpu: u64, ncpu: usize },
    #[error("record of {len} bytes is too large for the trace format (limit 65532)")]
    RecordTooLarge { len: usize },
}

/// `0x72 0x6f 0x6f 0x74`: bytes as people read them in a message.
fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:#04x}")).collect::<Vec<_>>().join(" ")
}
