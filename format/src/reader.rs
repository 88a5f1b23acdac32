//! Reading a trace: the file is mapped, its chunks indexed (one small entry
//! per chunk), and records decoded lazily, stream by stream or merged in
//! time order. A file cut short is read up to its last whole record; a damaged
//! chunk is skipped and listed ([`TraceFile::damage`]; an error naming the offset for
//! [`TraceFile::open_strict`]); a damaged file header is an error.

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
    /// Records of this chunk's stream may have been lost just before it: a damaged chunk of
    /// the stream, or one whose stream is unknown (its header was damaged), was skipped.
    pub after_gap: bool,
}

/// A stretch of the file skipped as damaged (see [`TraceFile::damage`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// File offset of the first byte skipped: the damaged chunk's header.
    pub offset: u64,
    /// Bytes skipped (0: no bytes are damaged, but the sequence numbers say chunks are missing).
    pub len: u64,
    /// The stream of the skipped chunk, when its header checked out; `None` when the header
    /// was damaged (the chunk may have been of any stream).
    pub stream: Option<StreamId>,
    /// Chunks lost there, by the sequence numbers of the chunks around the stretch; `None`
    /// when no whole chunk header follows it.
    pub chunks: Option<u32>,
    /// What is wrong, in the words of the error a strict reader gives.
    pub what: String,
    /// The offset that error names.
    pub error_offset: u64,
}

impl Damage {
    fn at(offset: usize, len: usize, stream: Option<StreamId>, chunks: Option<u32>, what: String) -> Self {
        Damage { offset: offset as u64, len: len as u64, stream, chunks, what, error_offset: offset as u64 }
    }

    /// The error a strict reader ([`TraceFile::open_strict`]) gives for this damage.
    pub fn error(&self) -> FormatError {
        FormatError::Corrupt { offset: self.error_offset, what: self.what.clone() }
    }
}

/// What the damaged chunks of a trace held, as far as the end summary tells: its counts minus
/// what the undamaged chunks hold. `None`: not known (no end summary, or counts that do not add
/// up, e.g. records also lost in wrap mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DamageLoss {
    /// Records of the CPU streams.
    pub records: Option<u64>,
    /// Instructions those records counted.
    pub instructions: Option<u64>,
    /// Module-table records.
    pub mte_records: Option<u64>,
}

/// A chunk header that checked out.
struct CheckedHeader {
    stream: StreamId,
    flags: u16,
    len: usize,
    payload_crc: u32,
    seq: u32,
}

/// Which streams' next chunk follows a gap.
#[derive(Default)]
struct Gaps {
    /// Streams with a damaged chunk since their last good one.
    streams: std::collections::HashSet<StreamId>,
    /// Damaged stretches of unknown streams so far; and, per stream, how many its last good
    /// chunk followed.
    unknown: u64,
    seen: std::collections::HashMap<StreamId, u64>,
}

impl Gaps {
    fn stream(&mut self, s: StreamId) {
        self.streams.insert(s);
    }

    fn all(&mut self) {
        self.unknown += 1;
    }

    /// Whether a good chunk of stream `s` now follows a gap of its stream.
    fn take(&mut self, s: StreamId) -> bool {
        let before = self.seen.insert(s, self.unknown).unwrap_or(0);
        self.streams.remove(&s) | (before < self.unknown)
    }
}

/// An open trace file.
pub struct TraceFile {
    path: PathBuf,
    data: Data,
    header: FileHeader,
    chunks: Vec<ChunkInfo>,
    truncated_at: Option<u64>,
    summary: Option<Summary>,
    /// Stretches skipped as damaged, in file order.
    damage: Vec<Damage>,
    /// Refuse damage instead of skipping it ([`TraceFile::open_strict`]).
    strict: bool,
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
    /// Open, validate the header and index the chunks. Damaged chunks are skipped (see
    /// [`Self::damage`]); a damaged file header is an error.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        Self::open_with(path, false)
    }

    /// [`Self::open`], but the first damaged chunk is an error, as are records that do not
    /// decode in a chunk cut short by the file's end.
    pub fn open_strict(path: &Path) -> Result<Self, FormatError> {
        Self::open_with(path, true)
    }

    fn open_with(path: &Path, strict: bool) -> Result<Self, FormatError> {
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
        let mut t = TraceFile {
            path: path.into(),
            data,
            header,
            chunks: Vec::new(),
            truncated_at: None,
            summary: None,
            damage: Vec::new(),
            strict,
        };
        t.index()?;
        Ok(t)
    }

    /// Index the chunks, checking each header (magic, its CRC, sequence, stream, flags, length)
    /// before using it and each whole payload against its CRC. Only the last chunk may be cut
    /// short by the file's end: its header checks out, so its length is as written and the file
    /// really ends inside it. Its records before the cut are used unverified (there is no CRC of
    /// a part), each still bounds-checked as it is decoded.
    ///
    /// A chunk that fails a check is skipped and noted in [`Self::damage`]: one whose header
    /// checks out but whose payload does not is skipped by its length; after a damaged header
    /// (its length cannot be trusted) the next chunk is the next offset where a whole chunk
    /// header checks out (magic, CRC, fields), as a PT decoder resynchronises at its next sync
    /// packet.
    fn index(&mut self) -> Result<(), FormatError> {
        if self.header.version_major == 1 {
            return self.index_1_0();
        }
        let b = self.data.bytes();
        let mut off = HEADER_LEN;
        let mut seq = 0u32;
        let mut end_chunk = None;
        let mut gaps = Gaps::default();
        let mut damage = Vec::new();
        let mut chunks = Vec::new();
        // A damaged header's entry, waiting for the next chunk's number to say how many were lost.
        let mut scanning: Option<usize> = None;
        while off < b.len() {
            if end_chunk.is_some() {
                let what = format!("{} bytes after the end chunk", b.len() - off);
                damage.push(Damage::at(off, b.len() - off, None, Some(0), what));
                break;
            }
            let rest = &b[off..];
            let magic = &rest[..rest.len().min(4)];
            if magic == &CHUNK_MAGIC[..magic.len()] && rest.len() < CHUNK_HEADER_LEN {
                // A cut file: the bytes present start as a chunk header does.
                self.truncated_at = Some(off as u64);
                break;
            }
            let checked = if magic == CHUNK_MAGIC {
                self.check_chunk_header(off)
            } else {
                Err((off, format!("expected a chunk header (\"CHNK\"), found bytes {magic:02x?}")))
            };
            let h = match checked {
                Ok(h) => h,
                Err((at, what)) => {
                    let next = self.next_chunk_header(off + 1);
                    if let Some(i) = scanning {
                        // Still in the same damaged stretch: it grows.
                        let d: &mut Damage = &mut damage[i];
                        d.len = (next - d.offset as usize) as u64;
                    } else {
                        let mut d = Damage::at(off, next - off, None, None, what);
                        d.error_offset = at as u64;
                        scanning = Some(damage.len());
                        damage.push(d);
                    }
                    gaps.all();
                    off = next;
                    continue;
                }
            };
            let start = off + CHUNK_HEADER_LEN;
            let have = h.len.min(b.len() - start);
            let truncated = have < h.len;
            if let Some(i) = scanning.take() {
                damage[i].chunks = Some(h.seq.saturating_sub(seq));
                seq = seq.max(h.seq);
            }
            if h.seq != seq {
                let what = format!("chunk number {} where chunk {seq} belongs: chunks are missing or repeated", h.seq);
                if h.seq > seq {
                    damage.push(Damage::at(off, 0, None, Some(h.seq - seq), what));
                    gaps.all();
                    seq = h.seq;
                } else {
                    // Repeated: its records are the earlier chunk's, or stale; skipped.
                    damage.push(Damage::at(off, CHUNK_HEADER_LEN + have, Some(h.stream), Some(0), what));
                    off = start + have;
                    continue;
                }
            }
            if !truncated && crate::writer::crc32(&b[start..start + h.len]) != h.payload_crc {
                let what = format!("checksum mismatch in the {}-byte chunk of stream {}", h.len, h.stream);
                damage.push(Damage::at(off, CHUNK_HEADER_LEN + h.len, Some(h.stream), Some(1), what));
                gaps.stream(h.stream);
                seq = seq.wrapping_add(1);
                off = start + h.len;
                continue;
            }
            self.data.note_read(have);
            let after_gap = gaps.take(h.stream);
            let info =
                ChunkInfo { offset: off as u64, stream: h.stream, flags: h.flags, len: have, truncated, after_gap };
            if h.stream == STREAM_END {
                end_chunk = Some(info.clone());
            }
            chunks.push(info);
            if truncated {
                self.truncated_at = Some(b.len() as u64);
                break;
            }
            seq = seq.wrapping_add(1);
            off = start + h.len;
        }
        self.chunks = chunks;
        self.damage = damage;
        if self.strict {
            if let Some(d) = self.damage.first() {
                return Err(d.error());
            }
        }
        if let Some(c) = end_chunk {
            self.summary = self.read_summary(c)?;
        }
        Ok(())
    }

    /// The chunk header at `off` (whole in the file, its magic checked), if it checks out: its
    /// CRC, then its stream, flags and length; else the offset and what is wrong.
    fn check_chunk_header(&self, off: usize) -> Result<CheckedHeader, (usize, String)> {
        let h = &self.data.bytes()[off..off + CHUNK_HEADER_LEN];
        let e = self.header.endian;
        let ncpu = self.header.ncpu;
        if crate::writer::crc32(&h[..CHUNK_HEADER_CRC_AT]) != e.u32(&h[CHUNK_HEADER_CRC_AT..]) {
            return Err((off, "the chunk header is damaged (its checksum does not match)".into()));
        }
        let stream = e.u16(&h[4..]);
        let flags = e.u16(&h[6..]);
        let len = e.u32(&h[8..]) as usize;
        if stream >= ncpu && stream != STREAM_MTE && stream != STREAM_END {
            return Err((off + 4, format!("chunk for stream {stream}, but the trace has {ncpu} CPUs")));
        }
        // Format 3.0 added compressed chunks, and compact CPU chunks of any length.
        let v3 = self.header.version_major >= 3;
        let known = if v3 { CHUNK_FLAG_WRAPPED | CHUNK_FLAG_COMPRESSED } else { CHUNK_FLAG_WRAPPED };
        if !crate::header::later_minor(self.header.version_minor) && flags & !known != 0 {
            return Err((off + 6, format!("unknown chunk flag bits {:#x}", flags & !known)));
        }
        let any_length = v3 && (stream < ncpu || flags & CHUNK_FLAG_COMPRESSED != 0);
        if len == 0 {
            return Err((off + 8, "chunk payload length 0".into()));
        }
        if !any_length && len % 4 != 0 {
            return Err((off + 8, format!("chunk payload length {len} is not a positive multiple of 4")));
        }
        Ok(CheckedHeader { stream, flags, len, payload_crc: e.u32(&h[12..]), seq: e.u32(&h[16..]) })
    }

    /// Where reading goes on after a damaged chunk header at `from - 1`: the next offset that
    /// holds a chunk header that checks out, or one cut by the file's end (the file may end
    /// there), else the end of the file.
    fn next_chunk_header(&self, from: usize) -> usize {
        let b = self.data.bytes();
        let mut at = from;
        while let Some(i) = b.get(at..).and_then(|rest| rest.windows(4).position(|w| w == CHUNK_MAGIC)) {
            let cand = at + i;
            if b.len() - cand < CHUNK_HEADER_LEN || self.check_chunk_header(cand).is_ok() {
                return cand;
            }
            at = cand + 1;
        }
        // A magic cut by the file's end.
        (b.len().saturating_sub(3).max(from)..b.len())
            .find(|&i| b[i..] == CHUNK_MAGIC[..b.len() - i])
            .unwrap_or(b.len())
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
            let info = ChunkInfo { offset: off as u64, stream, flags, len: have, truncated, after_gap: false };
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

    /// The stretches skipped as damaged, in file order (empty for a strict reader, which
    /// refuses them).
    pub fn damage(&self) -> &[Damage] {
        &self.damage
    }

    /// What the damaged chunks held, by the end summary's counts minus what the other chunks
    /// hold (a second read of the CPU and MTE streams, done only when there is damage).
    pub fn damage_loss(&self) -> DamageLoss {
        if self.damage.is_empty() {
            return DamageLoss { records: Some(0), instructions: Some(0), mte_records: Some(0) };
        }
        let Some(s) = &self.summary else { return DamageLoss::default() };
        let mut records = Some(0u64);
        let mut instructions = 0u64;
        let mut readable = true;
        // Only the streams that have chunks are read: a header may claim 65533 CPUs.
        let present: std::collections::BTreeSet<StreamId> =
            self.chunks.iter().map(|c| c.stream).filter(|&c| c < self.header.ncpu).collect();
        for cpu in 0..self.header.ncpu {
            let (mut n, mut icount) = (0u64, 0u64);
            let chunks = if present.contains(&cpu) { self.stream(cpu) } else { StreamRecords::new(self, Vec::new()) };
            for r in chunks {
                match r {
                    Ok((_, Record::Branch(b))) => icount = icount.saturating_add(b.icount as u64),
                    Ok((_, Record::TraceOff(o))) => icount = icount.saturating_add(o.icount as u64),
                    Ok(_) => {}
                    Err(_) => {
                        readable = false;
                        break;
                    }
                }
                n += 1;
            }
            instructions = instructions.saturating_add(icount);
            let kept = s.records.get(cpu as usize).copied().unwrap_or(0);
            // A damaged summary may claim any count: a sum past u64 is not a count either.
            records = records.and_then(|r| r.checked_add(kept.checked_sub(n)?));
        }
        let wrap_lost = s.lost.iter().any(|&n| n > 0);
        let instructions = s.instructions.checked_sub(instructions).filter(|_| !wrap_lost);
        let mte = self.stream(STREAM_MTE).try_fold(0u64, |n, r| r.map(|_| n + 1)).ok();
        if !readable {
            return DamageLoss { mte_records: mte.and_then(|m| s.mte_records.checked_sub(m)), ..Default::default() };
        }
        DamageLoss { records, instructions, mte_records: mte.and_then(|m| s.mte_records.checked_sub(m)) }
    }

    /// The CPU stream whose last chunk the file's end cuts, and the timestamp of its last
    /// readable record: records of that stream after it are lost (and a thread last seen on it
    /// may have run on it meanwhile). `None` for a file not cut inside a CPU chunk, or when the
    /// stream has no readable record. Only that stream's chunks are read, from the end back to
    /// the first that holds a record (a compact chunk decodes on its own).
    pub fn cut_stream_end(&self) -> Option<(StreamId, u64)> {
        let cut = self.chunks.last().filter(|c| c.truncated && c.stream < self.header.ncpu)?;
        let last = self.chunks.iter().rev().filter(|c| c.stream == cut.stream).find_map(|c| {
            // Records that do not decode end the chunk there, as they end a merged read.
            StreamRecords::new(self, vec![c.clone()]).map_while(Result::ok).map(|(_, r)| r.ts()).max()
        })?;
        Some((cut.stream, last))
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
        MergedRecords {
            streams,
            heads,
            gaps: vec![false; n],
            order: BinaryHeap::new(),
            served: None,
            started: false,
            error: None,
        }
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

/// The kinds of item of a CPU stream `itrace info` counts, in the order the summary's stream
/// totals list them (docs/trace-format.md).
pub const RECORD_KINDS: [&str; 7] =
    ["table hit", "table hit, time moved", "new edge", "second-table hit", "run", "whole record", "40-byte branch"];

/// What one CPU stream's chunks hold, counted by the writer (see [`crate::Summary::totals`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamTotals {
    pub branches: u64,
    pub first_ts: Option<u64>,
    pub last_ts: Option<u64>,
    /// Records and bytes per kind, in the order of [`RECORD_KINDS`].
    pub kinds: [KindStats; RECORD_KINDS.len()],
}

impl StreamTotals {
    /// Add what another stretch of the stream holds.
    pub(crate) fn merge(&mut self, o: &StreamTotals) {
        self.branches += o.branches;
        self.first_ts = match (self.first_ts, o.first_ts) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_ts = self.last_ts.max(o.last_ts);
        for (k, ok) in self.kinds.iter_mut().zip(&o.kinds) {
            k.records += ok.records;
            k.bytes += ok.bytes;
        }
    }

    /// Add the uncompressed compact `payload` of one CPU chunk, as written: its items walked by
    /// their lengths and timestamps only, without the edge tables a decode keeps (a decode here
    /// made recording a third slower). What a decode would count ([`TraceFile::stream_stats`]):
    /// the item's timestamp resets with it, a run's records at its timestamp. A payload that
    /// does not parse (never the writer's encoder's) counts up to where it stops.
    pub(crate) fn add_chunk(&mut self, e: crate::Endian, payload: &[u8]) {
        use crate::compact::{meta, tag};
        let mut at = 0;
        let mut ts = 0u64;
        let varint = |at: &mut usize| -> Option<u64> {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let byte = *payload.get(*at)?;
                *at += 1;
                v |= u64::from(byte & 0x7F) << shift;
                if byte & 0x80 == 0 {
                    return Some(v);
                }
            }
            None
        };
        let byte = |at: &mut usize| -> Option<u8> {
            let b = *payload.get(*at)?;
            *at += 1;
            Some(b)
        };
        let item = |at: &mut usize, ts: &mut u64| -> Option<(usize, u64, bool)> {
            let mut t = byte(at)?;
            while t == tag::TS_SET {
                *ts = varint(at)?;
                t = byte(at)?;
            }
            let dts = |at: &mut usize, yes: bool| if yes { varint(at) } else { Some(0) };
            Some(match t {
                0x00..=0x3F => (0, 1, true),
                0x40..=0x7F => {
                    *ts = ts.wrapping_add(varint(at)?);
                    (1, 1, true)
                }
                0x80..=0x83 => {
                    *ts = ts.wrapping_add(dts(at, t & 1 != 0)?);
                    if t & 2 != 0 {
                        varint(at)?;
                    }
                    let m = byte(at)?;
                    if m & meta::FLAGS != 0 {
                        byte(at)?;
                        varint(at)?;
                    }
                    if m & meta::FROM_ZERO == 0 {
                        varint(at)?;
                    }
                    if m & meta::TO_ZERO == 0 {
                        varint(at)?;
                    }
                    varint(at)?;
                    (2, 1, true)
                }
                0x84..=0x8B => {
                    byte(at)?;
                    *ts = ts.wrapping_add(dts(at, (t - tag::FAR) & 1 != 0)?);
                    (3, 1, true)
                }
                tag::REPEAT => (4, u64::from(byte(at)?), true),
                tag::RECORD => {
                    let rest = &payload[*at..];
                    let len = crate::record::record_len(e, rest)
                        .filter(|&l| l >= crate::RECORD_HEADER_LEN && l <= rest.len())?;
                    *ts = e.u64(&rest[8..]);
                    *at += len;
                    // Trace on, trace off, lost: never a branch (a decode refuses one here).
                    (5, 1, false)
                }
                _ => return None,
            })
        };
        while at < payload.len() {
            // Most items are one-byte table hits at an unchanged time: counted a stretch at a
            // time (this walk was 7% of the translating recorder's time).
            let hits = payload[at..].iter().take_while(|&&b| b <= 0x3F).count();
            if hits > 0 {
                let k = &mut self.kinds[0];
                k.records += hits as u64;
                k.bytes += hits as u64;
                self.branches += hits as u64;
                self.first_ts = Some(self.first_ts.map_or(ts, |f| f.min(ts)));
                self.last_ts = Some(self.last_ts.map_or(ts, |l| l.max(ts)));
                at += hits;
                continue;
            }
            let start = at;
            let Some((kind, records, branch)) = item(&mut at, &mut ts) else { break };
            let k = &mut self.kinds[kind];
            k.records += records;
            k.bytes += (at - start) as u64;
            if branch {
                self.branches += records;
            }
            if records > 0 {
                self.first_ts = Some(self.first_ts.map_or(ts, |f| f.min(ts)));
                self.last_ts = Some(self.last_ts.map_or(ts, |l| l.max(ts)));
            }
        }
    }
}

/// The kind (an index of [`RECORD_KINDS`]) of the record `rec` whose item starts at `before` in
/// a CPU chunk's `payload` (`compact`: 3.0's encoding; else 40-byte branches and whole records).
fn kind_of(payload: &[u8], before: usize, compact: bool, rec: &Record) -> usize {
    use crate::compact::tag;
    if !compact {
        return if matches!(rec, Record::Branch(_)) { 6 } else { 5 };
    }
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
        0x00..=0x3F => 0,
        0x40..=0x7F => 1,
        0x80..=0x83 => 2,
        0x84..=0x8B => 3,
        tag::REPEAT => 4,
        _ => 5,
    }
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
    /// [`Self::stream_stats`] of CPU stream `id` from the chunk headers and the summary's
    /// stream totals, without decoding a record: `None` when the file has no totals (written
    /// before them), or damage or a cut that makes them say more than the file holds.
    pub fn stream_stats_from_totals(&self, id: StreamId) -> Option<StreamStats> {
        if id >= self.header.ncpu || !self.damage.is_empty() || self.truncated_at.is_some() {
            return None;
        }
        let t = self.summary.as_ref()?.totals.as_ref()?.get(id as usize)?;
        let mut st =
            StreamStats { branches: t.branches, first_ts: t.first_ts, last_ts: t.last_ts, ..StreamStats::default() };
        let hlen = self.chunk_header_len();
        for c in self.chunks.iter().filter(|c| c.stream == id) {
            st.chunks += 1;
            st.file_bytes += (hlen + c.len) as u64;
            let payload = &self.data.bytes()[c.offset as usize + hlen..][..c.len];
            if c.flags & CHUNK_FLAG_COMPRESSED != 0 && self.header.version_major >= 3 && payload.len() >= 4 {
                // A compressed payload starts with its length uncompressed.
                st.compressed_chunks += 1;
                st.payload_bytes += self.header.endian.u32(payload) as u64;
            } else {
                st.payload_bytes += c.len as u64;
            }
        }
        for (name, k) in RECORD_KINDS.iter().zip(&t.kinds) {
            if k.records > 0 {
                st.records = st.records.saturating_add(k.records);
                st.kinds.insert(name, k.clone());
            }
        }
        Some(st)
    }

    /// Decode stream `id` whole and say what its records cost, by kind of item.
    pub fn stream_stats(&self, id: StreamId) -> Result<StreamStats, FormatError> {
        self.stream_stats_with_progress(id, &mut |_| {})
    }

    /// [`Self::stream_stats`], calling `progress` with the payload bytes of each chunk (its
    /// `len`) once it is decoded.
    pub fn stream_stats_with_progress(
        &self,
        id: StreamId,
        progress: &mut dyn FnMut(u64),
    ) -> Result<StreamStats, FormatError> {
        let mut st = StreamStats::default();
        let chunks: Vec<ChunkInfo> = self.chunks.iter().filter(|c| c.stream == id).cloned().collect();
        for c in chunks {
            st.chunks += 1;
            if c.truncated {
                st.truncated = true;
            }
            let c_len = c.len;
            let chunk_bytes = (self.chunk_header_len() + c_len) as u64;
            st.file_bytes += chunk_bytes;
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
                let kind = RECORD_KINDS[kind_of(payload, before, compact, &rec)];
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
            progress(c_len as u64);
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
    /// A chunk after a gap was opened and none of its records was handed out yet.
    gap_pending: bool,
    /// The record handed out last is the first after a gap of this stream.
    after_gap: bool,
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
        StreamRecords {
            file,
            chunks: chunks.into_iter(),
            cur: None,
            dec: None,
            failed: false,
            gap_pending: false,
            after_gap: false,
        }
    }

    /// Whether the record handed out last is the first after a gap: records of this stream
    /// before it were lost to a damaged chunk (see [`TraceFile::damage`]).
    pub fn after_gap(&self) -> bool {
        self.after_gap
    }

    /// A chunk cut short by the file's end holds what does not decode: without a CRC over a
    /// part, that is damage. A strict reader says so; others end the chunk there.
    fn cut_damage(&mut self, offset: usize, what: String) -> Option<Option<Result<u64, FormatError>>> {
        let cur = self.cur.as_mut()?;
        if cur.truncated && !self.file.strict {
            cur.pos = cur.len;
            return None;
        }
        Some(self.fail(offset, what))
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
        self.gap_pending |= c.after_gap;
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
                    Ok(true) => {
                        self.after_gap = std::mem::take(&mut self.gap_pending);
                        return Some(Ok(offset as u64));
                    }
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
                    Err(DecodeError::Bad(what)) => match self.cut_damage(offset, what) {
                        Some(r) => return r,
                        None => continue,
                    },
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
                match self.cut_damage(offset, format!("record length {len} is shorter than a record header")) {
                    Some(r) => return r,
                    None => continue,
                }
            }
            cur.pos += len;
            match Record::decode(e, &rest[..len], offset as u64) {
                Ok(r) => {
                    *out = r;
                    self.after_gap = std::mem::take(&mut self.gap_pending);
                    return Some(Ok(offset as u64));
                }
                Err(_) if cur.truncated && !file.strict => cur.pos = cur.len,
                Err(err) => {
                    self.failed = true;
                    return Some(Err(err));
                }
            }
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
    /// Records of this stream just before this one were lost to a damaged chunk.
    pub after_gap: bool,
}

/// One record of a merged read, borrowed from the reader ([`MergedRecords::next_ref`]).
#[derive(Clone, Copy, Debug)]
pub struct EventRef<'r> {
    /// The stream it came from: its CPU, or [`STREAM_MTE`].
    pub stream: StreamId,
    /// File offset of the record.
    pub offset: u64,
    pub record: &'r Record,
    /// Records of this stream just before this one were lost to a damaged chunk.
    pub after_gap: bool,
}

/// Records of all streams in time order: a heap of each stream's next record, so a read
/// costs O(records x log streams).
pub struct MergedRecords<'a> {
    streams: Vec<(StreamId, StreamRecords<'a>)>,
    /// Each stream's next record (offset, record), read ahead in place; valid while the stream
    /// is in `order` or is `served`.
    heads: Vec<(u64, Record)>,
    /// Whether each stream's head follows a gap.
    gaps: Vec<bool>,
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
                self.gaps[i] = self.streams[i].1.after_gap;
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
            Some(i) => Some(Ok(EventRef {
                stream: self.streams[i].0,
                offset: self.heads[i].0,
                record: &self.heads[i].1,
                after_gap: self.gaps[i],
            })),
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
        Some(Ok(Event { stream: self.streams[i].0, offset, record, after_gap: self.gaps[i] }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Branch, BranchKind, Lost, StopReason, TraceOff, TraceOn, TraceOnReason};

    /// The encoder counts what the writer's walk of its payload finds, on a long random stream
    /// that makes every kind of item: second-table hits (more edges than the tables hold), runs
    /// longer than one run item holds, older timestamps, whole records, kernel branches.
    #[test]
    fn the_encoder_counts_what_a_walk_of_its_chunk_finds() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        let mut recs = Vec::new();
        let mut ts = 1000u64;
        for _ in 0..20_000 {
            ts = match next(8) {
                0 => ts.saturating_sub(next(30)),
                1 | 2 => ts + next(1000),
                _ => ts,
            };
            let spread = if next(4) == 0 { 3000 } else { 40 };
            let from = if next(50) == 0 { 0 } else { 0x40_0000 + 16 * next(spread) };
            let b = Branch {
                ts,
                kernel: from == 0,
                kind: if from == 0 { BranchKind::Iret } else { BranchKind::Jump },
                flags: if from == 0 { crate::branch_flags::SYSCALL } else { 0 },
                aux: if from == 0 { 1 } else { 0 },
                from,
                to: from + 0x80,
                tid: 7 + next(2) as u32,
                icount: 1 + (from as u32 & 7),
            };
            let copies = if next(100) == 0 { 1 + next(700) } else { 1 };
            recs.extend((0..copies).map(|_| Record::Branch(b)));
            if next(300) == 0 {
                recs.push(Record::Lost(Lost { ts, count: next(9) + 1 }));
            }
        }
        let (payload, counted) = crate::compact::encode_chunk_counted(&recs).unwrap();
        let mut walked = StreamTotals::default();
        walked.add_chunk(crate::Endian::native(), &payload);
        assert_eq!(counted, walked);
        assert!(walked.kinds.iter().take(6).all(|k| k.records > 0), "a kind of item missing: {walked:?}");
    }

    /// [`crate::compact::Encoder::hops`] (its fast path for table hits) writes the bytes and
    /// counts what [`crate::compact::Encoder::branch`] does for the branches the hops stand
    /// for: random batches of two threads, stamps whose shared reading ends inside a batch,
    /// older readings, runs, more edges than the tables hold, whole records between batches,
    /// and batches encoded in pieces (the stretches of `Buffers::push_hops`).
    #[test]
    fn hops_encode_as_their_branches_do() {
        use crate::{compact::Encoder, BatchStamp, Hop};
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        let (mut one, mut many) = (Encoder::new(), Encoder::new());
        let (mut by_branch, mut by_hops) = (Vec::new(), Vec::new());
        let mut ts = 1000u64;
        let mut chunk_start = 0;
        for _ in 0..2_000 {
            let tid = 7 + next(2) as u32;
            ts = if next(6) == 0 { ts.saturating_sub(next(30)) } else { ts + next(100) };
            let n = next(300) as usize;
            let stamp = BatchStamp { first: ts, first_n: next(n as u64 + 1) as usize, rest: ts + next(3) };
            let spread = if next(4) == 0 { 3000 } else { 40 };
            let mut hops = Vec::with_capacity(n);
            while hops.len() < n {
                let at = next(spread);
                let from = 0x40_0000 + 16 * at;
                // Keys as the translating recorder's exits give them: none, or one that stands
                // for the source, count and kind, and a second key for the same three (an exit
                // translated again); one source's target may change (an indirect exit), and many
                // sources share targets (so that a slot's edge replaced keeps its `to`).
                let key = match next(5) {
                    0 => 0,
                    1 => 50_000 + at as u32,
                    _ => 1 + at as u32,
                };
                let to = match next(4) {
                    0 => 0x50_0000,
                    1 => 0x50_0010,
                    _ => from + 0x80,
                };
                let h = Hop::new(from, to, 1 + (from as u32 & 7), BranchKind::Jump, key);
                let copies = if next(20) == 0 { 1 + next(300) as usize } else { 1 };
                hops.extend(std::iter::repeat_n(h, copies.min(n - hops.len())));
            }
            for (i, h) in hops.iter().enumerate() {
                one.branch(&mut by_branch, &h.branch(stamp.ts(i), tid));
            }
            let mut at = 0;
            while at < n {
                let end = (at + 1 + next(200) as usize).min(n);
                many.hops(&mut by_hops, &hops[at..end], tid, stamp, at);
                at = end;
            }
            // Branches of the engine between batches, as one at a time, some with a hop's edge.
            for _ in 0..next(3) {
                let from = 0x40_0000 + 16 * next(spread);
                let b = Branch {
                    icount: 1 + (from as u32 & 7),
                    ..Branch::user(ts, tid, from, from + 0x80, BranchKind::Jump, 0, 0)
                };
                one.branch(&mut by_branch, &b);
                many.branch(&mut by_hops, &b);
            }
            // A new chunk, now and then: the counts are the chunk's.
            if next(50) == 0 {
                one.finish(&mut by_branch);
                many.finish(&mut by_hops);
                let mut walked = StreamTotals::default();
                walked.add_chunk(crate::Endian::native(), &by_hops[chunk_start..]);
                assert_eq!(many.totals(), walked);
                assert_eq!(many.totals(), one.totals());
                chunk_start = by_hops.len();
                one.reset();
                many.reset();
            }
            // Whole records between batches (a loss, a thread's trace on or off).
            if next(10) == 0 {
                let r = Record::Lost(Lost { ts: ts + next(5), count: 1 + next(9) });
                let mut bytes = Vec::new();
                r.encode(&mut bytes).unwrap();
                one.record(&mut by_branch, &bytes, &r);
                many.record(&mut by_hops, &bytes, &r);
            }
        }
        // A record moves the timestamp; the batch after it at that time starts with a table hit
        // repeated (a run must start at its second record).
        for (round, t) in [(0u64, 90_000u64), (1, 90_000), (2, 90_500)] {
            let x = Hop::new(0x40_0000, 0x40_0080, 1, BranchKind::Jump, 1);
            let y = Hop::new(0x40_0010, 0x40_0090, 1, BranchKind::Jump, 0);
            let hops = if round == 0 { vec![x, y] } else { vec![x, x, x, y] };
            let stamp = BatchStamp { first: t, first_n: 0, rest: t };
            for (i, h) in hops.iter().enumerate() {
                one.branch(&mut by_branch, &h.branch(stamp.ts(i), 7));
            }
            many.hops(&mut by_hops, &hops, 7, stamp, 0);
            let r = Record::Lost(Lost { ts: t + if round == 1 { 500 } else { 0 }, count: 1 });
            let mut bytes = Vec::new();
            r.encode(&mut bytes).unwrap();
            one.record(&mut by_branch, &bytes, &r);
            many.record(&mut by_hops, &bytes, &r);
        }
        one.finish(&mut by_branch);
        many.finish(&mut by_hops);
        assert!(by_hops == by_branch, "the payloads differ ({} and {} bytes)", by_hops.len(), by_branch.len());
        let mut walked = StreamTotals::default();
        walked.add_chunk(crate::Endian::native(), &by_hops[chunk_start..]);
        assert_eq!(many.totals(), walked);
        assert_eq!(many.totals(), one.totals());
        assert!(walked.kinds.iter().take(6).all(|k| k.records > 0), "a kind of item missing: {walked:?}");
    }

    /// The writer's walk of a payload counts what a decode does: every kind of item, a
    /// timestamp reset, runs, whole records, kernel branches with flags.
    #[test]
    fn walking_a_chunk_counts_what_decoding_it_does() {
        let br = |ts: u64, from: u64, tid: u32| Branch {
            ts,
            kernel: from == 0,
            kind: if from == 0 { BranchKind::Iret } else { BranchKind::Jump },
            flags: if from == 0 { crate::branch_flags::SYSCALL } else { 0 },
            aux: if from == 0 { 60 } else { 0 },
            from,
            to: if tid == 3 { 0 } else { from + 0x40 },
            tid,
            icount: 3,
        };
        let mut recs =
            vec![Record::TraceOn(TraceOn { ts: 100, reason: TraceOnReason::Start, pid: 1, tid: 1, pc: 0x1000 })];
        for i in 0..300u64 {
            // New edges, table hits at the same and later times, runs of one edge at one time.
            let b = br(200 + i / 3, 0x1000 + (i % 7) * 0x10, 1 + (i % 3) as u32);
            recs.push(Record::Branch(b));
            if i % 11 == 0 {
                recs.extend([Record::Branch(b), Record::Branch(b)]);
            }
        }
        recs.push(Record::Branch(br(150, 0x2000, 2))); // older: a timestamp reset
        recs.push(Record::Branch(br(400, 0, 2))); // from the kernel
        recs.push(Record::Lost(Lost { ts: 401, count: 5 }));
        recs.push(Record::TraceOff(TraceOff {
            ts: 402,
            reason: StopReason::Exited,
            pid: 1,
            tid: 1,
            pc: 0x1234,
            icount: 2,
            value: 0,
        }));
        let (payload, counted) = crate::compact::encode_chunk_counted(&recs).unwrap();
        let mut walked = StreamTotals::default();
        walked.add_chunk(crate::Endian::native(), &payload);
        assert_eq!(counted, walked, "the encoder's totals against the walk's");

        let mut decoded = StreamTotals::default();
        let mut dec = Decoder::new();
        let mut rec = Record::Unknown { ts: 0, major: 0, minor: 0 };
        let (mut at, mut before) = (0, 0);
        while dec.next_into(crate::Endian::native(), &payload, &mut at, &mut rec).unwrap() {
            let k = &mut decoded.kinds[kind_of(&payload, before, true, &rec)];
            k.records += 1;
            k.bytes += (at - before) as u64;
            before = at;
            decoded.branches += matches!(rec, Record::Branch(_)) as u64;
            let ts = rec.ts();
            decoded.first_ts = Some(decoded.first_ts.map_or(ts, |f| f.min(ts)));
            decoded.last_ts = Some(decoded.last_ts.map_or(ts, |l| l.max(ts)));
        }
        assert_eq!(walked, decoded);
        assert_eq!(decoded.kinds.iter().map(|k| k.records).sum::<u64>(), recs.len() as u64);
        let seen: Vec<usize> = (0..6).filter(|&i| decoded.kinds[i].records > 0).collect();
        assert!(seen.contains(&4) && seen.contains(&5) && seen.contains(&2) && seen.contains(&0), "{decoded:?}");
    }
}
