//! Writing the file: the header, then chunks of records, each a slice of one
//! stream (a CPU's trace records, the MTE records, or the end summary).

use crate::{FileHeader, FormatError};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// First four bytes of every chunk.
pub const CHUNK_MAGIC: [u8; 4] = *b"CHNK";
/// Size of a chunk header: magic, stream, flags, payload length, payload CRC, sequence number,
/// and a CRC of those, so that a reader trusts a length before it uses it.
pub const CHUNK_HEADER_LEN: usize = 24;
/// Stream id of the module-table stream.
pub const STREAM_MTE: u16 = 0xFFFE;
/// Stream id of the end chunk, which holds the summary record.
pub const STREAM_END: u16 = 0xFFFF;
/// Chunk flag: records of this stream before this chunk were overwritten (wrap mode).
pub const CHUNK_FLAG_WRAPPED: u16 = 1;
/// Chunk flag (format 3.0): the payload is compressed: its decompressed length (4 bytes), then
/// one zstd frame. The payload CRC covers the stored bytes.
pub const CHUNK_FLAG_COMPRESSED: u16 = 2;
/// The zstd level of `itrace record --compress`.
pub const COMPRESS_LEVEL: i32 = 1;
/// The most bytes a compressed chunk may hold decompressed: writers compress no larger
/// payload, so a reader never allocates more for one chunk.
pub const MAX_DECOMPRESSED: usize = 64 << 20;

/// Appends chunks to a trace file. After a failed write it truncates the file
/// back to its last whole chunk and refuses further writes, so whatever was
/// written stays a valid (if short) trace.
pub struct TraceWriter {
    file: File,
    path: PathBuf,
    good_len: u64,
    failed: bool,
    /// Sequence number of the next chunk: a reader sees a chunk lost or repeated.
    next_seq: u32,
    /// zstd level chunks are compressed with (`--compress`), if any.
    compress: Option<i32>,
    packed: Vec<u8>,
    /// What the CPU chunks written so far hold, by CPU (the summary's stream totals).
    totals: Vec<crate::reader::StreamTotals>,
}

impl TraceWriter {
    /// Create (or truncate) `path` and write the header.
    pub fn create(path: &Path, header: &FileHeader) -> Result<Self, FormatError> {
        let file = File::create(path).map_err(|err| FormatError::Open { path: path.into(), err })?;
        let mut w = TraceWriter {
            file,
            path: path.into(),
            good_len: 0,
            failed: false,
            next_seq: 0,
            compress: None,
            packed: Vec::new(),
            totals: Vec::new(),
        };
        w.write_all(&header.encode())?;
        Ok(w)
    }

    /// Compress every chunk but the end chunk with zstd at `level` (format 3.0's compressed
    /// chunks), where that makes it smaller.
    pub fn compress(&mut self, level: i32) {
        self.compress = Some(level);
    }

    /// Path of the file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written so far (whole chunks only).
    pub fn len(&self) -> u64 {
        self.good_len
    }

    /// Whether nothing but the header has been written.
    pub fn is_empty(&self) -> bool {
        self.good_len <= crate::HEADER_LEN as u64
    }

    /// Append one chunk of `stream` holding `payload` (whole records).
    pub fn write_chunk(&mut self, stream: u16, flags: u16, payload: &[u8]) -> Result<(), FormatError> {
        self.write_chunk_counted(stream, flags, payload, None)
    }

    /// [`TraceWriter::write_chunk`] of a CPU chunk whose encoder `counted` what it holds
    /// (`Encoder::totals`); `None`: the payload is walked to count it.
    pub(crate) fn write_chunk_counted(
        &mut self,
        stream: u16,
        mut flags: u16,
        payload: &[u8],
        counted: Option<&crate::reader::StreamTotals>,
    ) -> Result<(), FormatError> {
        if payload.is_empty() {
            return Ok(());
        }
        let mut packed = std::mem::take(&mut self.packed);
        let raw = payload;
        let payload = match self.compress {
            Some(level) if stream != STREAM_END && payload.len() <= MAX_DECOMPRESSED => {
                packed.clear();
                packed.extend_from_slice(&(payload.len() as u32).to_ne_bytes());
                let r = zstd::stream::copy_encode(payload, &mut packed, level);
                if r.is_ok() && packed.len() < payload.len() {
                    flags |= CHUNK_FLAG_COMPRESSED;
                    &packed[..]
                } else {
                    payload
                }
            }
            _ => payload,
        };
        let r = self.write_framed(stream, flags, payload);
        self.packed = packed;
        if r.is_ok() && stream < STREAM_MTE {
            // Counted as written, so that `itrace info` need not decode the file (a decode of
            // what was just encoded: a small part of recording's cost).
            let i = stream as usize;
            if self.totals.len() <= i {
                self.totals.resize(i + 1, Default::default());
            }
            match counted {
                Some(t) => self.totals[i].merge(t),
                None => self.totals[i].add_chunk(crate::Endian::native(), raw),
            }
        }
        r
    }

    /// What the CPU chunks written so far hold, for CPUs `0..ncpu`.
    pub fn stream_totals(&self, ncpu: usize) -> Vec<crate::reader::StreamTotals> {
        let mut t = self.totals.clone();
        t.resize(ncpu, Default::default());
        t
    }

    fn write_framed(&mut self, stream: u16, flags: u16, payload: &[u8]) -> Result<(), FormatError> {
        let len = u32::try_from(payload.len()).map_err(|_| {
            FormatError::Write(std::io::Error::other("a chunk of 4 GiB or more does not fit the format"))
        })?;
        let mut h = [0u8; CHUNK_HEADER_LEN];
        h[0..4].copy_from_slice(&CHUNK_MAGIC);
        h[4..6].copy_from_slice(&stream.to_ne_bytes());
        h[6..8].copy_from_slice(&flags.to_ne_bytes());
        h[8..12].copy_from_slice(&len.to_ne_bytes());
        h[12..16].copy_from_slice(&crc32(payload).to_ne_bytes());
        h[16..20].copy_from_slice(&self.next_seq.to_ne_bytes());
        let hcrc = crc32(&h[..CHUNK_HEADER_CRC_AT]);
        h[CHUNK_HEADER_CRC_AT..].copy_from_slice(&hcrc.to_ne_bytes());
        self.write_all(&h)?;
        self.write_all(payload)?;
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(())
    }

    fn write_all(&mut self, b: &[u8]) -> Result<(), FormatError> {
        if self.failed {
            return Err(FormatError::Write(std::io::Error::other("an earlier write to the trace file failed")));
        }
        match self.file.write_all(b) {
            Ok(()) => {
                // A chunk header alone is not "good": only count it once its payload follows.
                self.good_len += b.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.failed = true;
                Err(FormatError::Write(e))
            }
        }
    }

    /// After a failed write: cut the file back to `len` bytes, the end of the last whole chunk.
    fn rollback(&mut self, len: u64) {
        let _ = self.file.set_len(len);
        self.good_len = len;
    }

    /// After a write that failed for want of space (and was rolled back): go on writing at the
    /// end of the last whole chunk, for a smaller chunk that may still fit. False (and writes
    /// stay refused) when the file cannot be put back there.
    pub fn resume_after_rollback(&mut self) -> bool {
        use std::io::{Seek, SeekFrom};
        // A short write moved the file offset past the end the rollback cut back to: a later
        // write there would leave a hole of zeros before it.
        let at_end = self.file.metadata().is_ok_and(|m| m.len() == self.good_len)
            && self.file.seek(SeekFrom::Start(self.good_len)).is_ok();
        if at_end {
            self.failed = false;
        }
        at_end
    }

    /// Refuse every later write, as after a failed one: what follows a gap must not be written.
    pub fn refuse_writes(&mut self) {
        self.failed = true;
    }

    /// Append one chunk, rolling the file back to its previous end if any part fails.
    pub fn write_chunk_atomic(&mut self, stream: u16, flags: u16, payload: &[u8]) -> Result<(), FormatError> {
        self.write_chunk_atomic_counted(stream, flags, payload, None)
    }

    /// [`TraceWriter::write_chunk_atomic`] with what the chunk holds, as its encoder counted it.
    pub(crate) fn write_chunk_atomic_counted(
        &mut self,
        stream: u16,
        flags: u16,
        payload: &[u8],
        counted: Option<&crate::reader::StreamTotals>,
    ) -> Result<(), FormatError> {
        let before = self.good_len;
        let r = self.write_chunk_counted(stream, flags, payload, counted);
        if r.is_err() {
            self.rollback(before);
        }
        r
    }

    /// Flush to the disk.
    pub fn sync(&mut self) -> Result<(), FormatError> {
        self.file.flush().map_err(FormatError::Write)
    }
}

/// The CRC of every check in the file: CRC-32/ISO-HDLC (zlib's; polynomial 0x04C11DB7,
/// reflected, initial value and final XOR 0xFFFFFFFF), as crc32fast computes it.
pub(crate) fn crc32(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

/// The payload of a compressed chunk, decompressed; the error says what is wrong with it.
pub(crate) fn decompress(e: crate::Endian, payload: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    if payload.len() < 4 {
        return Err(format!("a compressed chunk of {} bytes has no length", payload.len()));
    }
    let want = e.u32(payload) as usize;
    if want == 0 || want > MAX_DECOMPRESSED {
        return Err(format!("a compressed chunk says it holds {want} bytes (1 to {MAX_DECOMPRESSED} allowed)"));
    }
    let mut out = Vec::new();
    let dec = zstd::stream::read::Decoder::new(&payload[4..]).map_err(|e| format!("a compressed chunk: {e}"))?;
    // One byte more than said: a frame that holds more is damage too, found without
    // decompressing all of it.
    dec.take(want as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("a compressed chunk does not decompress: {e}"))?;
    if out.len() != want {
        return Err(format!("a compressed chunk holds {} bytes, not the {want} it says", out.len()));
    }
    Ok(out)
}

/// Where a chunk header's own CRC lies: it covers the bytes before it.
pub(crate) const CHUNK_HEADER_CRC_AT: usize = 20;
