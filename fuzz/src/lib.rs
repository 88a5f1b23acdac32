//! What the fuzz targets share: turning fuzzer bytes into a trace file the reader can open.
//!
//! Input of the trace targets (`trace_reader`, `arc`, `report`): one control byte, then the
//! bytes of a trace file.
//!
//! - bit 0 of the control byte: recompute every whole chunk's CRC-32 before writing the file
//!   (docs/trace-format.md, "Chunks"), so that mutated payloads get past the checksum and reach
//!   the record decoders; with the bit clear the bytes are written as they are and the checksum
//!   check itself is fuzzed.
//! - bits 1-7: left to each target (the report target takes its text layout from them).
//!
//! `TraceFile::open` takes a path (it maps the file), so the bytes go to a file in `/dev/shm`
//! (memory) when there is one, otherwise in the temporary directory; it is removed when the
//! [`TraceInput`] is dropped.

use std::path::{Path, PathBuf};

/// Control-byte bit: fix the checksums and chunk sequence numbers.
pub const FIX_CHECKSUMS: u8 = 1;

/// Size of the file header and of a chunk header (docs/trace-format.md, version 2.0).
const HEADER_LEN: usize = 64;
const CHUNK_HEADER_LEN: usize = 24;

/// A fuzz input written to a trace file.
pub struct TraceInput {
    path: PathBuf,
    /// Bits 1-7 of the control byte, shifted down.
    pub extra: u8,
}

impl TraceInput {
    /// Write `data` (control byte, file bytes) to this process's trace file; `None` for an empty input.
    pub fn new(target: &str, data: &[u8]) -> Option<TraceInput> {
        let (&control, file) = data.split_first()?;
        let mut bytes = file.to_vec();
        if control & FIX_CHECKSUMS != 0 {
            fix_checksums(&mut bytes);
        }
        let path = scratch_dir().join(format!("itrace-fuzz-{target}-{}.itr", std::process::id()));
        std::fs::write(&path, &bytes).expect("writing the fuzz input's trace file");
        Some(TraceInput { path, extra: control >> 1 })
    }

    /// The trace file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TraceInput {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Make the checksums of `b` right, in the byte order its header's byte 4 names
/// (docs/trace-format.md, version 2.0): the file header's CRC (its last 4 bytes), then for each
/// chunk laid end to end after it, up to the first bad magic or a cut chunk header: its sequence
/// number, its payload's CRC (when the payload is whole) and its header's CRC.
pub fn fix_checksums(b: &mut [u8]) {
    if b.len() < 8 {
        return;
    }
    let big = b[4] == 2;
    let get = |b: &[u8], at: usize| {
        let a: [u8; 4] = b[at..at + 4].try_into().expect("4 bytes");
        if big {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    };
    let put = |b: &mut [u8], at: usize, v: u32| {
        b[at..at + 4].copy_from_slice(&if big { v.to_be_bytes() } else { v.to_le_bytes() });
    };
    let header_len = match b[5] as usize {
        n if n >= HEADER_LEN && n % 4 == 0 => n,
        _ => HEADER_LEN,
    };
    if b.len() < header_len {
        return;
    }
    let crc = crc32fast::hash(&b[..header_len - 4]);
    put(b, header_len - 4, crc);
    let mut off = header_len;
    let mut seq = 0u32;
    while off + CHUNK_HEADER_LEN <= b.len() && &b[off..off + 4] == b"CHNK" {
        put(b, off + 16, seq);
        let start = off + CHUNK_HEADER_LEN;
        let end = start.checked_add(get(b, off + 8) as usize).filter(|&e| e <= b.len());
        if let Some(end) = end {
            let crc = crc32fast::hash(&b[start..end]);
            put(b, off + 12, crc);
        }
        let crc = crc32fast::hash(&b[off..off + 20]);
        put(b, off + 20, crc);
        let Some(end) = end else {
            break;
        };
        off = end;
        seq = seq.wrapping_add(1);
    }
}
