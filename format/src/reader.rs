//! Reading a trace: the file is mapped, its chunks indexed (one small entry
//! per chunk), and records decoded lazily, stream by stream or merged in
//! time order. A file cut short is read up to its last whole record; damage
//! anywhere else is an error naming the offset.

use crate::compact::{DecodeError, Decoder};
use crate::record::{record_len, Summary};
use crate::writer::{
    CHUNK_FLAG_COMPRESSED, CHUNK_FLAG_WRAPPED, CHUNK_HEADER_CRC_AT, CHUNK_HEADER_LEN, CHUNK_MAGIC, STREAM_END,
    STREAM_MTE,
};
use crate::{FileHeader, FormatError, Record, HEADER_LEN, RECORD_HEADER_LEN};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A stream: a CPU number, or [`STREAM_MTE`].
pub type StreamId = u16;

/// Where one chunk lies in the file.
#[derive(Clone, Debug)]
pub struct ChunkInfo {
    /// Offset of the chunk header.
    pub offset: u64,
    pub stream: StreamId,
    pub flags: u16,
    /// Payload bytes present in the file.
    pub len: usize,
    /// The file ends inside this chunk's payload.
    pub truncated: bool,
}

/// An open trace file.
pub struct TraceFile {
    path: PathBuf,
    data: Data,
    header: FileHeader,
    chunks: Vec<ChunkInfo>,
    truncated_at: Option<u64>,
    summary: Option<Summary>,
}

enum Data {
    /// The file mapped, and the bytes read from it since its pages were last let go.
    Map(memmap2::Mmap, AtomicU64),
    Empty,
}

/// Read this many bytes of a mapped trace, and its pages are let go: the resident memory of
/// a reader stays bounded, not growing with the trace's length (a mapped file's pages that
/// were read count in the process's resident set until it unmaps them or lets them go).
const RELEASE_EVERY: u64 = 8 << 20;

impl Data {
    fn bytes(&self) -> &[u8] {
        match self {
            Data::Map(m, _) => m,
            Data::Empty => &[],
        }
    }

    /// `n` more bytes of the map were read: every [`RELEASE_EVERY`] bytes, drop the map's
    /// pages from this process (the next read of a page maps it again from the page cache).
    fn note_read(&self, n: usize) {
        let Data::Map(m, read) = self else { return };
        if read.fetch_add(n as u64, Ordering::Relaxed) + n as u64 >= RELEASE_EVERY {
            read.store(0, Ordering::Relaxed);
            // SAFETY: the map is private and read-only, so this process never wrote to it and
            // holds no changed copy of a page that DONTNEED would throw away: the pages it
            // drops read back with the file's same bytes, and slices into the map stay valid.
            // (Failure only means the pages stay: memory, not correctness.)
            let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }
}

impl TraceFile {
    /// Open, validate the header and index the chunks.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let open_err = |err| FormatError::Open { path: path.into(), err };
        // Non-blocking, so that a FIFO is refused below instead of waiting for a writer.
        let file =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        let ft = meta.file_type();
        let kind = if ft.is_dir() {
            Some("a directory")
        } else if ft.is_fifo() {
            Some("a pipe or FIFO")
        } else if ft.is_char_device() {
            Some("a character device")
        } else if ft.is_block_device() {
            Some("a block device")
        } else if ft.is_socket() {
            Some("a socket")
        } else {
            None
        };
        if let Some(kind) = kind {
            return Err(FormatError::NotAFile { path: path.into(), kind });
        }
        let data = if meta.len() == 0 {
            // A regular file of size 0 may still have content (/proc, /sys): say what it starts with.
            let mut first = [0u8; 4];
            let n = std::io::Read::read(&mut &file, &mut first).unwrap_or(0);
            if n > 0 {
                return Err(FormatError::NotATrace { path: path.into(), found: first[..n].to_vec() });
            }
            Data::Empty
        } else {
            // SAFETY: the map is read-only and private to this process; itrace
            // never writes a trace while reading it. A file truncated by another
            // process while mapped could fault, as with any mapped reader.
            Data::Map(unsafe { memmap2::Mmap::map(&file) }.map_err(open_err)?, AtomicU64::new(0))
        };
        let header = FileHeader::decode(path, data.bytes())?;
        let mut t =
            TraceFile { path: path.into(), data, header, chunks: Vec::new(), truncated_at: None, summary: None };
        t.index()?;
        Ok(t)
    }

    /// Index the chunks, checking each header (magic, its CRC, sequence, stream, flags, length)
    /// before using it and each whole payload against its CRC. Only the last chunk may be cut
    /// short by the file's end: its header checks out, so its length is as written and the file
    /// really ends inside it. Its records before the cut are used unverified (there is no CRC of
    /// a part), each still bounds-checked as it is decoded.
    fn index(&mut self) -> Result<(), FormatError> {
        let b = self.data.bytes();
        let e = self.header.endian;
        let ncpu = self.header.ncpu;
        if self.header.version_major == 1 {
            return self.index_1_0();
        }
        let mut off = HEADER_LEN;
        let mut seq = 0u32;
        let mut end_chunk = None;
        while off < b.len() {
            let Some(h) = chunk_header(b, off, CHUNK_HEADER_LEN, end_chunk.is_some())? else {
                self.truncated_at = Some(off as u64);
                break;
            };
            if crate::writer::crc32(&h[..CHUNK_HEADER_CRC_AT]) != e.u32(&h[CHUNK_HEADER_CRC_AT..]) {
                return Err(corrupt(off, "the chunk header is damaged (its checksum does not match)".into()));
            }
            let stream = e.u16(&h[4..]);
            let flags = e.u16(&h[6..]);
            let want = e.u32(&h[8..]) as usize;
            let payload_crc = e.u32(&h[12..]);
            let n = e.u32(&h[16..]);
            if n != seq {
                return Err(corrupt(
                    off,
                    format!("chunk number {n} where chunk {seq} belongs: chunks are missing or repeated"),
                ));
            }
            if stream >= ncpu && stream != STREAM_MTE && stream != STREAM_END {
                return Err(corrupt(off + 4, format!("chunk for stream {stream}, but the trace has {ncpu} CPUs")));
            }
            // Format 3.0 added compressed chunks, and compact CPU chunks of any length.
            let v3 = self.header.version_major >= 3;
            let known = if v3 { CHUNK_FLAG_WRAPPED | CHUNK_FLAG_COMPRESSED } else { CHUNK_FLAG_WRAPPED };
            if !crate::header::later_minor(self.header.version_minor) && flags & !known != 0 {
                return Err(corrupt(off + 6, format!("unknown chunk flag bits {:#x}", flags & !known)));
            }
            let any_length = v3 && (stream < ncpu || flags & CHUNK_FLAG_COMPRESSED != 0);
            if want == 0 {
                return Err(corrupt(off + 8, "chunk payload length 0".into()));
            }
            if !any_length && want % 4 != 0 {
                return Err(corrupt(off + 8, format!("chunk payload length {want} is not a positive multiple of 4")));
            }
            let start = off + CHUNK_HEADER_LEN;
            let have = want.min(b.len() - start);
            let truncated = have < want;
            if !truncated && crate::writer::crc32(&b[start..start + want]) != payload_crc {
                return Err(corrupt(off, format!("checksum mismatch in the {want}-byte chunk of stream {stream}")));
            }
            self.data.note_read(have);
            let info = ChunkInfo { offset: off as u64, stream, flags, len: have, truncated };
            if stream == STREAM_END {
                end_chunk = Some(info.clone());
            }
            self.chunks.push(info);
            if truncated {
                self.truncated_at = Some(b.len() as u64);
                break;
            }
            seq = seq.wrapping_add(1);
            off = start + want;
        }
        if let Some(c) = end_chunk {
            self.summary = self.read_summary(c)?;
        }
        Ok(())
    }

    /// Format 1.0's chunks: a 16-byte header (magic, stream, flags, length, and a CRC over those
    /// three fields and the payload), no sequence numbers. Without a CRC of its own, a chunk
    /// header's length cannot be told from damage when it runs past the file's end: that reads
    /// as a file cut short, as 1.0 readers read it.
    fn index_1_0(&mut self) -> Result<(), FormatError> {
        let b = self.data.bytes();
        let e = self.header.endian;
        let ncpu = self.header.ncpu;
        let mut off = HEADER_LEN;
        let mut end_chunk = None;
        while off < b.len() {
            let Some(h) = chunk_header(b, off, CHUNK_HEADER_LEN_1_0, end_chunk.is_some())? else {
                self.truncated_at = Some(off as u64);
                break;
            };
            let stream = e.u16(&h[4..]);
            let flags = e.u16(&h[6..]);
            let want = e.u32(&h[8..]) as usize;
            if stream >= ncpu && stream != STREAM_MTE && stream != STREAM_END {
                return Err(corrupt(off + 4, format!("chunk for stream {stream}, but the trace has {ncpu} CPUs")));
            }
            if flags & !CHUNK_FLAG_WRAPPED != 0 {
                return Err(corrupt(off + 6, format!("unknown chunk flag bits {:#x}", flags & !CHUNK_FLAG_WRAPPED)));
            }
            if want == 0 || want % 4 != 0 {
                return Err(corrupt(off + 8, format!("chunk payload length {want} is not a positive multiple of 4")));
            }
            let start = off + CHUNK_HEADER_LEN_1_0;
            let have = want.min(b.len() - start);
            let truncated = have < want;
            if !truncated {
                let mut crc = crc32fast::Hasher::new();
                crc.update(&h[4..12]);
                crc.update(&b[start..start + want]);
                if crc.finalize() != e.u32(&h[12..]) {
                    return Err(corrupt(off, format!("checksum mismatch in the {want}-byte chunk of stream {stream}")));
                }
            }
            self.data.note_read(have);
            let info = ChunkInfo { offset: off as u64, stream, flags, len: have, truncated };
            if stream == STREAM_END {
                end_chunk = Some(info.clone());
            }
            self.chunks.push(info);
            if truncated {
                self.truncated_at = Some(b.len() as u64);
                break;
            }
            off = start + want;
        }
        if let Some(c) = end_chunk {
            self.summary = self.read_summary(c)?;
        }
        Ok(())
    }

    /// Bytes of a chunk header in this file's version.
    fn chunk_header_len(&self) -> usize {
        if self.header.version_major == 1 {
            CHUNK_HEADER_LEN_1_0
        } else {
            CHUNK_HEADER_LEN
        }
    }

    /// The end chunk holds one summary record, for the header's CPUs; `None` when it was cut.
    fn read_summary(&self, c: ChunkInfo) -> Result<Option<Summary>, FormatError> {
        let truncated = c.truncated;
        let mut records = StreamRecords::new(self, vec![c.clone()]);
        let found = match records.next().transpose()? {
            Some((_, Record::Summary(s))) => s,
            Some((at, _)) => {
                return Err(corrupt(at as usize, "the end chunk holds a record that is not the summary".into()))
            }
            None if truncated => return Ok(None),
            None => return Err(corrupt(c.offset as usize, "the end chunk has no summary record".into())),
        };
        if let Some(r) = records.next() {
            let at = r.map(|(at, _)| at as usize)?;
            return Err(corrupt(at, "a record after the summary in the end chunk".into()));
        }
        let ncpu = self.header.ncpu as usize;
        if found.records.len() != ncpu {
            let at = c.offset as usize + self.chunk_header_len();
            return Err(corrupt(
                at,
                format!("the summary counts {} CPUs, the file header {ncpu}", found.records.len()),
            ));
        }
        Ok(Some(found))
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file header.
    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    /// All chunks, in file order.
    pub fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }

    /// Where the file ends early, if it does: records up to there are readable.
    pub fn truncated_at(&self) -> Option<u64> {
        self.truncated_at
    }

    /// The end summary; `None` when the recording did not finish writing (crash of itrace, full disk, truncation).
    pub fn summary(&self) -> Option<&Summary> {
        self.summary.as_ref()
    }

    /// Payload bytes of all CPU streams (for progress reporting).
    pub fn trace_bytes(&self) -> u64 {
        self.chunks.iter().filter(|c| c.stream < self.header.ncpu).map(|c| c.len as u64).sum()
    }

    /// The records of one stream, in order.
    pub fn stream(&self, id: StreamId) -> StreamRecords<'_> {
        StreamRecords::new(self, self.chunks.iter().filter(|c| c.stream == id).cloned().collect())
    }

    /// The records of every CPU stream and the MTE stream, merged in timestamp
    /// order (MTE first on equal timestamps, then by CPU).
    pub fn merged(&self) -> MergedRecords<'_> {
        // Only the streams that have chunks, grouped in one pass: a header may claim 65533
        // CPUs that a cut file never wrote (a fuzzing finding: a read per claimed CPU made
        // a 60 KB file take seconds).
        let mut by_stream: std::collections::BTreeMap<(bool, StreamId), Vec<ChunkInfo>> = Default::default();
        for c in self.chunks.iter().filter(|c| c.stream == STREAM_MTE || c.stream < self.header.ncpu) {
            by_stream.entry((c.stream != STREAM_MTE, c.stream)).or_default().push(c.clone());
        }
        let streams: Vec<(StreamId, StreamRecords<'_>)> =
            by_stream.into_iter().map(|((_, id), chunks)| (id, StreamRecords::new(self, chunks))).collect();
        let n = streams.len();
        let heads = (0..n).map(|_| (0, Record::Unknown { ts: 0, major: 0, minor: 0 })).collect();
        MergedRecords { streams, heads, order: BinaryHeap::new(), served: None, started: false, error: None }
    }
}

/// What one kind of item costs in a stream (see [`TraceFile::stream_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KindStats {
    /// Records of this kind.
    pub records: u64,
    /// Payload bytes they take (before compression).
    pub bytes: u64,
}

/// The size breakdown of one stream.
#[derive(Clone, Debug, Default)]
pub struct StreamStats {
    pub chunks: u64,
    pub compressed_chunks: u64,
    /// Chunk headers and payloads as stored in the file.
    pub file_bytes: u64,
    /// Payload bytes before compression.
    pub payload_bytes: u64,
    pub records: u64,
    pub branches: u64,
    pub first_ts: Option<u64>,
    pub last_ts: Option<u64>,
    /// The file ends inside one of its chunks.
    pub truncated: bool,
    /// By kind of item: "table hit", "table hit, time moved", "second-table hit", "new edge",
    /// "run", "whole record"
    /// (format 3.0 CPU chunks); "40-byte branch", "whole record" otherwise.
    pub kinds: std::collections::BTreeMap<&'static str, KindStats>,
}

impl TraceFile {
    /// Decode stream `id` whole and say what its records cost, by kind of item.
    pub fn stream_stats(&self, id: StreamId) -> Result<StreamStats, FormatError> {
        use crate::compact::tag;
        let mut st = StreamStats::default();
        let chunks: Vec<ChunkInfo> = self.chunks.iter().filter(|c| c.stream == id).cloned().collect();
        for c in chunks {
            st.chunks += 1;
            if c.truncated {
                st.truncated = true;
            }
            st.file_bytes += (self.chunk_header_len() + c.len) as u64;
            // Only this chunk: the reader has no next one to go on to.
            let mut r = StreamRecords::new(self, Vec::new());
            r.open_chunk(c)?;
            let cur = r.cur.as_ref().expect("an open chunk");
            if cur.owned.is_some() {
                st.compressed_chunks += 1;
            }
            st.payload_bytes += cur.len as u64;
            let compact = cur.compact;
            let mut before = 0;
            while let Some(item) = r.next() {
                let (_, rec) = item?;
                let cur = r.cur.as_ref().expect("an open chunk");
                let payload: &[u8] = match &cur.owned {
                    Some(v) => v,
                    None => &self.data.bytes()[cur.base..cur.base + cur.len],
                };
                let after = cur.pos;
                let kind = if !compact {
                    if matches!(rec, Record::Branch(_)) {
                        "40-byte branch"
                    } else {
                        "whole record"
                    }
                } else {
                    // A timestamp reset belongs to the item after it.
                    let mut at = before;
                    while payload.get(at) == Some(&tag::TS_SET) {
                        at += 1;
                        while payload.get(at).is_some_and(|b| b & 0x80 != 0) {
                            at += 1;
                        }
                        at += 1;
                    }
                    match payload.get(at).copied().unwrap_or(0) {
                        0x00..=0x3F => "table hit",
                        0x40..=0x7F => "table hit, time moved",
                        0x80..=0x83 => "new edge",
                        0x84..=0x8B => "second-table hit",
                        tag::REPEAT => "run",
                        _ => "whole record",
                    }
                };
                let k = st.kinds.entry(kind).or_default();
                k.records += 1;
                k.bytes += (after - before) as u64;
                before = after;
                st.records += 1;
                if matches!(rec, Record::Branch(_)) {
                    st.branches += 1;
                }
                let ts = rec.ts();
                st.first_ts = Some(st.first_ts.map_or(ts, |f| f.min(ts)));
                st.last_ts = Some(st.last_ts.map_or(ts, |l| l.max(ts)));
            }
        }
        Ok(st)
    }
}

/// The `len`-byte chunk header at `off`: its magic checked, nothing after the end chunk
/// (`after_end`); `None` when the file ends inside it (a cut file: the bytes present start as
/// the magic does).
fn chunk_header(b: &[u8], off: usize, len: usize, after_end: bool) -> Result<Option<&[u8]>, FormatError> {
    let rest = &b[off..];
    if after_end {
        return Err(corrupt(off, format!("{} bytes after the end chunk", rest.len())));
    }
    let magic = &rest[..rest.len().min(4)];
    if magic != &CHUNK_MAGIC[..magic.len()] {
        return Err(corrupt(off, format!("expected a chunk header (\"CHNK\"), found bytes {magic:02x?}")));
    }
    Ok(rest.get(..len))
}

/// Format 1.0's chunk header: magic, stream, flags, length, CRC.
const CHUNK_HEADER_LEN_1_0: usize = 16;

fn corrupt(offset: usize, what: String) -> FormatError {
    FormatError::Corrupt { offset: offset as u64, what }
}

/// The records of one stream, each with its file offset.
pub struct StreamRecords<'a> {
    file: &'a TraceFile,
    chunks: std::vec::IntoIter<ChunkInfo>,
    cur: Option<Cursor>,
    /// Format 3.0's compact CPU chunks: the decoder's state, reset at each chunk.
    dec: Option<Decoder>,
    failed: bool,
}

/// Where the read of a chunk is.
struct Cursor {
    /// File offset of the payload's first byte.
    base: usize,
    /// Read position within the payload.
    pos: usize,
    /// Payload bytes present.
    len: usize,
    truncated: bool,
    /// The payload is compact-encoded (a CPU chunk of format 3.0).
    compact: bool,
    /// A compressed payload, decompressed; its records' offsets are the chunk's.
    owned: Option<Vec<u8>>,
    chunk_offset: usize,
}

impl<'a> StreamRecords<'a> {
    fn new(file: &'a TraceFile, chunks: Vec<ChunkInfo>) -> Self {
        StreamRecords { file, chunks: chunks.into_iter(), cur: None, dec: None, failed: false }
    }

    fn fail<T>(&mut self, offset: usize, what: String) -> Option<Result<T, FormatError>> {
        self.failed = true;
        Some(Err(corrupt(offset, what)))
    }

    /// Start reading chunk `c`.
    fn open_chunk(&mut self, c: ChunkInfo) -> Result<(), FormatError> {
        let h = &self.file.header;
        let compact = h.version_major >= 3 && c.stream < h.ncpu;
        let base = c.offset as usize + self.file.chunk_header_len();
        self.file.data.note_read(c.len);
        let mut cur = Cursor {
            base,
            pos: 0,
            len: c.len,
            truncated: c.truncated,
            compact,
            owned: None,
            chunk_offset: c.offset as usize,
        };
        if c.flags & CHUNK_FLAG_COMPRESSED != 0 {
            // A cut compressed chunk has no records that can be trusted to be whole.
            let data = if c.truncated {
                Vec::new()
            } else {
                crate::writer::decompress(h.endian, &self.file.data.bytes()[base..base + c.len])
                    .map_err(|what| corrupt(c.offset as usize, what))?
            };
            cur.len = data.len();
            cur.owned = Some(data);
        }
        if compact {
            self.dec.get_or_insert_with(Decoder::new).reset();
        }
        self.cur = Some(cur);
        Ok(())
    }
}

impl Iterator for StreamRecords<'_> {
    type Item = Result<(u64, Record), FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut r = Record::Unknown { ts: 0, major: 0, minor: 0 };
        Some(self.read_into(&mut r)?.map(|offset| (offset, r)))
    }
}

impl StreamRecords<'_> {
    /// The next record into `out` (left as it was at the end of the stream or on an error),
    /// and its file offset: [`Iterator::next`] without moving the record.
    fn read_into(&mut self, out: &mut Record) -> Option<Result<u64, FormatError>> {
        if self.failed {
            return None;
        }
        let file = self.file;
        let b = file.data.bytes();
        let e = file.header.endian;
        loop {
            let Some(cur) = self.cur.as_mut().filter(|c| c.pos < c.len) else {
                let c = self.chunks.next()?;
                if let Err(err) = self.open_chunk(c) {
                    self.failed = true;
                    return Some(Err(err));
                }
                continue;
            };
            let payload: &[u8] = match &cur.owned {
                Some(v) => v,
                None => &b[cur.base..cur.base + cur.len],
            };
            let at = cur.pos;
            let offset = if cur.owned.is_some() { cur.chunk_offset } else { cur.base + at };
            if cur.compact {
                let dec = self.dec.as_mut().expect("a compact chunk has its decoder");
                match dec.next_into(e, payload, &mut cur.pos, out) {
                    Ok(true) => return Some(Ok(offset as u64)),
                    Ok(false) => {
                        cur.pos = cur.len;
                        continue;
                    }
                    Err(DecodeError::Short) if cur.truncated => {
                        // The file was cut inside this item: the stream ends at the last whole one.
                        cur.pos = cur.len;
                        continue;
                    }
                    Err(DecodeError::Short) => {
                        return self.fail(offset, "an item runs past the end of its chunk".into());
                    }
                    Err(DecodeError::Bad(what)) => return self.fail(offset, what),
                }
            }
            let rest = &payload[at..];
            let len = record_len(e, rest).unwrap_or(0);
            if rest.len() < RECORD_HEADER_LEN || len > rest.len() {
                if cur.truncated {
                    // The file was cut inside this record: the stream ends at the last whole one.
                    cur.pos = cur.len;
                    continue;
                }
                return self.fail(offset, format!("record length {len} runs past the end of its chunk"));
            }
            if len < RECORD_HEADER_LEN {
                return self.fail(offset, format!("record length {len} is shorter than a record header"));
            }
            cur.pos += len;
            return Some(match Record::decode(e, &rest[..len], offset as u64) {
                Ok(r) => {
                    *out = r;
                    Ok(offset as u64)
                }
                Err(err) => {
                    self.failed = true;
                    Err(err)
                }
            });
        }
    }
}

/// One record of a merged read.
#[derive(Clone, Debug)]
pub struct Event {
    /// The stream it came from: its CPU, or [`STREAM_MTE`].
    pub stream: StreamId,
    /// File offset of the record.
    pub offset: u64,
    pub record: Record,
}

/// One record of a merged read, borrowed from the reader ([`MergedRecords::next_ref`]).
#[derive(Clone, Copy, Debug)]
pub struct EventRef<'r> {
    /// The stream it came from: its CPU, or [`STREAM_MTE`].
    pub stream: StreamId,
    /// File offset of the record.
    pub offset: u64,
    pub record: &'r Record,
}

/// Records of all streams in time order: a heap of each stream's next record, so a read
/// costs O(records x log streams).
pub struct MergedRecords<'a> {
    streams: Vec<(StreamId, StreamRecords<'a>)>,
    /// Each stream's next record (offset, record), read ahead in place; valid while the stream
    /// is in `order` or is `served`.
    heads: Vec<(u64, Record)>,
    /// (timestamp, stream index) of every stream with a head; the index breaks ties, MTE first.
    order: BinaryHeap<Reverse<(u64, usize)>>,
    /// The stream whose head was handed out last: it reads ahead at the next call.
    served: Option<usize>,
    started: bool,
    /// An error met reading ahead, returned after the record before it.
    error: Option<FormatError>,
}

impl MergedRecords<'_> {
    /// Read stream `i`'s next record into its head; false on an error (kept for later).
    fn read_ahead(&mut self, i: usize) -> bool {
        let head = &mut self.heads[i];
        match self.streams[i].1.read_into(&mut head.1) {
            None => true,
            Some(Err(e)) => {
                self.error = Some(e);
                false
            }
            Some(Ok(offset)) => {
                head.0 = offset;
                self.order.push(Reverse((head.1.ts(), i)));
                true
            }
        }
    }

    /// The index of the stream whose head is the next record, after reading ahead the one
    /// handed out before; None at the end or when an error is waiting (see `take_error`).
    /// Not a `Result`: that made every record's index pass through a copy that stalled.
    fn advance(&mut self) -> Option<usize> {
        if !self.started {
            self.started = true;
            for i in 0..self.streams.len() {
                if !self.read_ahead(i) {
                    break;
                }
            }
        }
        if let Some(i) = self.served.take() {
            self.read_ahead(i);
        }
        if self.error.is_some() {
            return None;
        }
        let Reverse((_, i)) = self.order.pop()?;
        self.served = Some(i);
        Some(i)
    }

    /// The error met reading ahead, if any: nothing comes after it, as the stream it came
    /// from cannot go on in order.
    fn take_error(&mut self) -> Option<FormatError> {
        let e = self.error.take()?;
        self.streams.clear();
        self.order.clear();
        Some(e)
    }

    /// The next record, borrowed until the next call: [`Iterator::next`] without moving
    /// records (for readers of millions of them).
    pub fn next_ref(&mut self) -> Option<Result<EventRef<'_>, FormatError>> {
        match self.advance() {
            Some(i) => {
                Some(Ok(EventRef { stream: self.streams[i].0, offset: self.heads[i].0, record: &self.heads[i].1 }))
            }
            None => self.take_error().map(Err),
        }
    }
}

impl Iterator for MergedRecords<'_> {
    type Item = Result<Event, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        let Some(i) = self.advance() else { return self.take_error().map(Err) };
        let (offset, record) =
            std::mem::replace(&mut self.heads[i], (0, Record::Unknown { ts: 0, major: 0, minor: 0 }));
        Some(Ok(Event { stream: self.streams[i].0, offset, record }))
    }
}
