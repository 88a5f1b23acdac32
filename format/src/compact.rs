//! Format 3.0's compact encoding of a CPU stream's records within one chunk
//! (docs/trace-format.md, "CPU chunks: the compact encoding"): the encoder and its tables are
//! `itrace-compact`'s (no_std, so that traced threads can run it too); this module adds the
//! records carried whole, the totals the reader keeps, and the decoder.

use crate::record::{record_len, Record};
use crate::Endian;
pub use itrace_compact::{meta, tag, Counted, Out, SliceOut, FAR_SLOTS, MAX_BRANCH_ITEM, MAX_RUN, SLOTS};
use itrace_compact::{places, unzigzag, Edge, State, Whole};
use itrace_compact::{Branch, BranchKind};

/// Encodes one stream's records into chunk payloads: `itrace-compact`'s encoder (boxed: its
/// tables are about 100 KB), with the records carried whole and the totals as the reader
/// counts them.
#[derive(Clone)]
pub struct Encoder(Box<itrace_compact::Encoder>);

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for Encoder {
    type Target = itrace_compact::Encoder;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Encoder {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Encoder {
    pub fn new() -> Self {
        Encoder(Box::default())
    }

    /// Append a record carried whole: `bytes` is its 16-byte-header encoding, `r` the record.
    pub fn record(&mut self, out: &mut Vec<u8>, bytes: &[u8], r: &Record) {
        self.0.whole_record(out, bytes, r.ts(), whole_of(r));
    }

    /// What the items written since the last reset hold (call after
    /// [`itrace_compact::Encoder::finish`]): the totals a walk of the payload
    /// (`StreamTotals::add_chunk`) finds.
    pub fn totals(&self) -> crate::reader::StreamTotals {
        totals_of(&self.0.counted())
    }
}

/// The reader's totals of what an encoder counted.
pub fn totals_of(c: &Counted) -> crate::reader::StreamTotals {
    let mut t = crate::reader::StreamTotals::default();
    for k in 0..c.records.len() {
        t.kinds[k].records = c.records[k];
        t.kinds[k].bytes = c.bytes[k];
    }
    t.branches = c.records[..itrace_compact::kind::RECORD].iter().sum();
    if c.records.iter().any(|&n| n > 0) {
        (t.first_ts, t.last_ts) = (Some(c.first_ts), Some(c.last_ts));
    }
    t
}

/// A chunk's payload whose branches all have timestamp 0 (encoded from a fresh state at one
/// timestamp, 0: a traced thread's own), with that timestamp made `ts`: its first item, a new
/// edge with no delta, gets the delta `ts`, and the others are at the last timestamp already.
/// The counts change with it (`counted`: its NEW item's bytes and the time span). `None` if the
/// payload does not start so.
pub fn restamp_chunk(payload: &[u8], ts: u64, counted: &mut Counted) -> Option<Vec<u8>> {
    let (&first, rest) = payload.split_first()?;
    if first & !0x02 != tag::NEW {
        return None;
    }
    let mut out = Vec::with_capacity(payload.len() + 10);
    out.push(first | 1);
    let at = out.len();
    itrace_compact::put_varint(&mut out, ts);
    counted.bytes[itrace_compact::kind::NEW] += (out.len() - at) as u64;
    out.extend_from_slice(rest);
    (counted.first_ts, counted.last_ts) = (ts, ts);
    Some(out)
}

/// What record `r`, carried whole, changes in the state both sides keep.
fn whole_of(r: &Record) -> Whole {
    match r {
        Record::TraceOn(on) => Whole::TraceOn { tid: on.tid, pc: on.pc },
        Record::TraceOff(off) => Whole::TraceOff { tid: off.tid },
        _ => Whole::Other,
    }
}

/// The payload of one CPU chunk holding `records` (for tools and tests that write chunks with
/// [`crate::TraceWriter::write_chunk`] themselves; recorders go through [`crate::Buffers`]).
pub fn encode_chunk(records: &[Record]) -> Result<Vec<u8>, crate::FormatError> {
    encode_chunk_counted(records).map(|(payload, _)| payload)
}

/// [`encode_chunk`], and the totals its encoder counted.
pub(crate) fn encode_chunk_counted(
    records: &[Record],
) -> Result<(Vec<u8>, crate::reader::StreamTotals), crate::FormatError> {
    let mut enc = Encoder::new();
    let (mut out, mut rec) = (Vec::new(), Vec::new());
    for r in records {
        match r {
            Record::Branch(b) => enc.branch(&mut out, b),
            r => {
                rec.clear();
                r.encode(&mut rec)?;
                enc.record(&mut out, &rec, r);
            }
        }
    }
    enc.finish(&mut out);
    Ok((out, enc.totals()))
}

/// Why an item could not be decoded.
#[derive(Debug)]
pub enum DecodeError {
    /// The item runs past the end of the bytes (a chunk cut by the file's end, or damage).
    Short,
    /// The bytes are not an item.
    Bad(String),
}

/// Decodes the items of one chunk payload.
pub struct Decoder {
    s: Box<State>,
    run: u64,
    /// Where the item after a run being yielded starts.
    run_end: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads varints and bytes from an item, failing with [`DecodeError::Short`] at the end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    #[inline]
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let x = *self.b.get(self.at).ok_or(DecodeError::Short)?;
        self.at += 1;
        Ok(x)
    }

    #[inline]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let x = self.byte()?;
            if i == 9 && x > 1 {
                return Err(DecodeError::Bad("a number longer than 64 bits".into()));
            }
            v |= ((x & 0x7f) as u64) << (7 * i);
            if x < 0x80 {
                return Ok(v);
            }
        }
        Err(DecodeError::Bad("a number longer than 64 bits".into()))
    }
}

impl Decoder {
    pub fn new() -> Self {
        Decoder { s: Box::new(State::new()), run: 0, run_end: 0 }
    }

    /// Start a new chunk.
    pub fn reset(&mut self) {
        self.s.clear();
        self.run = 0;
    }

    /// Decode the item at `*at` of `b` and move `*at` past it. `Ok(None)` at the end of `b`.
    /// A run yields its branch once per call, `*at` staying at the run's item until the last.
    pub fn next(&mut self, e: Endian, b: &[u8], at: &mut usize) -> Result<Option<Record>, DecodeError> {
        let mut r = Record::Unknown { ts: 0, major: 0, minor: 0 };
        Ok(self.next_into(e, b, at, &mut r)?.then_some(r))
    }

    /// [`Self::next`] into `out`, which is left as it was at the end of `b` (`Ok(false)`) or
    /// on an error: the merged read decodes in place, as moving records between the
    /// iterators' return values cost a third of a report's time.
    pub fn next_into(&mut self, e: Endian, b: &[u8], at: &mut usize, out: &mut Record) -> Result<bool, DecodeError> {
        if self.run > 0 {
            self.run -= 1;
            let last = self.s.last.expect("a run follows a branch");
            if self.run == 0 {
                *at = self.run_end;
            }
            *out = Record::Branch(last);
            return Ok(true);
        }
        if *at >= b.len() {
            return Ok(false);
        }
        let mut c = Cursor { b, at: *at };
        let mut t = c.byte()?;
        // A timestamp reset applies to the item after it (a loop, not a recursion: resets may
        // follow each other in a damaged payload).
        while t == tag::TS_SET {
            let ts = c.varint()?;
            if ts >= self.s.ts {
                return Err(DecodeError::Bad("a timestamp reset that does not go back".into()));
            }
            self.s.ts = ts;
            self.s.last = None;
            t = c.byte()?;
        }
        // Branches (nearly every item) are built as a `Branch` and written into `out` once.
        let br = match t {
            0x00..=0x7F => {
                let slot = (t & 0x3F) as usize;
                let dts = if t >= tag::HIT_TS { c.varint()? } else { 0 };
                let e = self.s.table[slot];
                if !e.valid() {
                    return Err(DecodeError::Bad(format!("item {t:#04x} names table slot {slot}, which is empty")));
                }
                self.s.mru[slot / 2] = (slot & 1) as u8;
                let ts = self.s.ts.checked_add(dts).ok_or_else(|| DecodeError::Bad("timestamp overflows".into()))?;
                let br = e.branch(ts).expect("a valid slot holds a known kind");
                self.s.after_branch(&br);
                br
            }
            0x80..=0x83 => {
                let dts = if t & 1 != 0 { c.varint()? } else { 0 };
                let tid = if t & 2 != 0 {
                    let d = c.varint()?;
                    if d > u32::MAX as u64 {
                        return Err(DecodeError::Bad("thread id delta out of range".into()));
                    }
                    self.s.tid.wrapping_add(unzigzag(d) as u32)
                } else {
                    self.s.tid
                };
                let m = c.byte()?;
                let kind = BranchKind::from_code(m & 0x0F)
                    .ok_or_else(|| DecodeError::Bad(format!("unknown branch kind {}", m & 0x0F)))?;
                let (flags, aux) = if m & meta::FLAGS != 0 {
                    let f = c.byte()?;
                    let a = c.varint()?;
                    if a > u16::MAX as u64 {
                        return Err(DecodeError::Bad(format!("system call or signal number {a} out of range")));
                    }
                    (f, a as u16)
                } else {
                    (0, 0)
                };
                let from = if m & meta::FROM_ZERO != 0 {
                    0
                } else {
                    self.s.base_of_from().wrapping_add(unzigzag(c.varint()?) as u64)
                };
                let to = if m & meta::TO_ZERO != 0 {
                    0
                } else {
                    self.s.base_of_to(from).wrapping_add(unzigzag(c.varint()?) as u64)
                };
                let icount = c.varint()?;
                if icount > u32::MAX as u64 {
                    return Err(DecodeError::Bad(format!("instruction count {icount} out of range")));
                }
                let ts = self.s.ts.checked_add(dts).ok_or_else(|| DecodeError::Bad("timestamp overflows".into()))?;
                let br = Branch {
                    ts,
                    kernel: m & meta::KERNEL != 0,
                    kind,
                    flags,
                    aux,
                    from,
                    to,
                    tid,
                    icount: icount as u32,
                };
                let e = Edge::of(&br);
                let (set, far) = places(e.hash());
                self.s.insert(e, set, far);
                self.s.after_branch(&br);
                br
            }
            0x84..=0x8B => {
                let v = t - tag::FAR;
                let far = (v as usize >> 1) << 8 | c.byte()? as usize;
                let dts = if v & 1 != 0 { c.varint()? } else { 0 };
                let e = self.s.far[far];
                if !e.valid() {
                    return Err(DecodeError::Bad(format!(
                        "item {t:#04x} names second-table slot {far}, which is empty"
                    )));
                }
                let (set, _) = places(e.hash());
                self.s.insert(e, set, far);
                let ts = self.s.ts.checked_add(dts).ok_or_else(|| DecodeError::Bad("timestamp overflows".into()))?;
                let br = e.branch(ts).expect("a valid slot holds a known kind");
                self.s.after_branch(&br);
                br
            }
            tag::REPEAT => {
                let n = c.byte()? as u64;
                let Some(last) = self.s.last else {
                    return Err(DecodeError::Bad("a run that follows no branch".into()));
                };
                if n == 0 {
                    return Err(DecodeError::Bad("a run of 0 branches".into()));
                }
                self.run = n - 1;
                if self.run > 0 {
                    self.run_end = c.at;
                    *out = Record::Branch(last);
                    return Ok(true);
                }
                last
            }
            tag::RECORD => {
                let rest = &b[c.at..];
                let len = record_len(e, rest).ok_or(DecodeError::Short)?;
                if len < crate::RECORD_HEADER_LEN {
                    return Err(DecodeError::Bad(format!("record length {len} is shorter than a record header")));
                }
                if len > rest.len() {
                    return Err(DecodeError::Short);
                }
                let r = Record::decode(e, &rest[..len], 0).map_err(|err| match err {
                    crate::FormatError::Corrupt { what, .. } => DecodeError::Bad(what),
                    other => DecodeError::Bad(other.to_string()),
                })?;
                match r {
                    Record::TraceOn(_) | Record::TraceOff(_) | Record::Lost(_) | Record::Unknown { .. } => {}
                    _ => return Err(DecodeError::Bad("a module or summary record in a CPU stream".into())),
                }
                c.at += len;
                self.s.after_whole(r.ts(), whole_of(&r));
                *at = c.at;
                *out = r;
                return Ok(true);
            }
            _ => return Err(DecodeError::Bad(format!("unknown item tag {t:#04x}"))),
        };
        *at = c.at;
        *out = Record::Branch(br);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::StreamTotals;
    use crate::{BatchStamp, Endian, Hop};

    /// A chunk encoded at timestamp 0 (as a traced thread encodes its ring), restamped: every
    /// branch decodes with the new timestamp and its other fields as given, and the counts are
    /// those a walk of the new payload finds.
    #[test]
    fn a_restamped_chunk_decodes_at_its_new_timestamp() {
        let kinds = [BranchKind::Jump, BranchKind::CondJump, BranchKind::Call, BranchKind::Return];
        let hops: Vec<Hop> = (0..5_000u64)
            .map(|i| {
                let k = i * 7919 % 97;
                Hop::new(
                    0x40_0000 + k * 16,
                    0x40_8000 + k * 40,
                    1 + (k % 9) as u32,
                    kinds[k as usize % 4],
                    1 + k as u32,
                )
            })
            .collect();
        for ts in [1u64, 127, 128, 1 << 40, u64::MAX >> 1] {
            let mut enc = Encoder::new();
            let mut payload = Vec::new();
            enc.hops(&mut payload, &hops, 7, BatchStamp { first: 0, first_n: usize::MAX, rest: 0 }, 0);
            enc.finish(&mut payload);
            let mut counted = enc.counted();
            let out = restamp_chunk(&payload, ts, &mut counted).expect("a fresh chunk starts with a new edge");
            let mut dec = Decoder::new();
            let (mut at, mut got) = (0, Vec::new());
            while let Some(r) = dec.next(Endian::native(), &out, &mut at).expect("decodes") {
                let Record::Branch(b) = r else { panic!("not a branch: {r:?}") };
                got.push(b);
            }
            let want: Vec<Branch> = hops.iter().map(|h| h.branch(ts, 7)).collect();
            assert_eq!(got, want, "restamped to {ts}");
            let mut walked = StreamTotals::default();
            walked.add_chunk(Endian::native(), &out);
            assert_eq!(totals_of(&counted), walked, "restamped to {ts}");
        }
        // Not a fresh chunk's start: refused.
        assert!(restamp_chunk(
            &[tag::HIT],
            5,
            &mut Counted { records: [0; 6], bytes: [0; 6], first_ts: 0, last_ts: 0 }
        )
        .is_none());
    }
}
