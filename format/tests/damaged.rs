//! Damaged traces read around their damage: thousands of mutated copies of real multi-chunk
//! traces (bytes flipped, runs overwritten, chunk headers hit, the file cut), each checked
//! against the undamaged file's own chunks, decoded one by one (the truth): every chunk whose
//! bytes are untouched reads with exactly its records, the damaged ones are listed as damage,
//! and the loss said is what the damaged chunks held. Deterministic: a seeded PRNG, no timing.

use itrace_format::*;
use std::collections::BTreeMap;
use std::path::Path;

fn fast_tempdir() -> tempfile::TempDir {
    match Path::new("/dev/shm") {
        shm if shm.is_dir() => tempfile::tempdir_in(shm).unwrap_or_else(|_| tempfile::tempdir().unwrap()),
        _ => tempfile::tempdir().unwrap(),
    }
}

/// A continuous-mode trace of `n` branches over 2 CPUs in chunks of about `segment` bytes,
/// with module-table records every 200 branches, and the summary's instructions the sum of the
/// branches' counts (as a recorder's are).
fn record(path: &Path, segment: usize, n: u64, compress: bool) {
    let mode = Mode::Continuous;
    let header = FileHeader::starting_now(Arch::X86_64, mode, StepMethod::PtraceSingleStep, 2, FLAG_ICOUNT, 0, 0);
    let mut w = TraceWriter::create(path, &header).unwrap();
    if compress {
        w.compress(COMPRESS_LEVEL);
    }
    let cfg = BufferConfig { mode, ncpu: 2, buffer_size: 0, segment_size: segment, mte_size: 1 << 20 };
    let mut b = Buffers::new(cfg, w).unwrap();
    let mut instructions = 0u64;
    let mut seed = 7u64;
    for i in 0..n {
        let cpu = (i as usize / 3) % 2;
        let r = next(&mut seed);
        let br = Branch {
            ts: 1000 + i * 3,
            kernel: false,
            kind: if r % 3 == 0 { BranchKind::CondJump } else { BranchKind::Call },
            flags: 0,
            aux: 0,
            // A few hundred distinct edges: table hits, new edges and runs all occur.
            from: 0x400000 + (r % 300) * 16,
            to: 0x500000 + (r % 250) * 8,
            tid: 100 + cpu as u32,
            icount: (r % 13) as u32 + 1,
        };
        instructions += br.icount as u64;
        let mut a = [0u8; BRANCH_RECORD_LEN];
        br.encode_into(&mut a);
        assert_eq!(b.push_trace(cpu, &a).unwrap(), Push::Stored);
        if i % 200 == 0 {
            let seg = Mte::Segment {
                ts: 1000 + i * 3,
                pid: 100,
                prot: prot::READ | prot::EXEC,
                start: i << 12,
                end: (i << 12) + 4096,
                offset: 0,
                path: format!("/lib/x{i}.so"),
            };
            b.push_mte(&Record::Mte(seg)).unwrap();
        }
    }
    b.finish(Summary { ts: 1 << 40, instructions, ..Default::default() }).unwrap();
}

/// xorshift64*: the same mutations on every run.
fn next(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545F4914F6CDD1D)
}

/// One chunk of the undamaged file and the records it decodes to.
struct TrueChunk {
    offset: usize,
    /// Header and payload.
    bytes: usize,
    stream: StreamId,
    records: Vec<Record>,
}

impl TrueChunk {
    fn end(&self) -> usize {
        self.offset + self.bytes
    }
}

/// The records of each chunk of `t`, stream by stream: a record belongs to the chunk whose
/// bytes hold its offset (a compressed chunk's records carry the chunk's own offset).
fn records_by_chunk(t: &TraceFile) -> BTreeMap<u64, Vec<Record>> {
    let mut by: BTreeMap<u64, Vec<Record>> = BTreeMap::new();
    let chunks = t.chunks();
    let mut ids: Vec<StreamId> = chunks.iter().map(|c| c.stream).collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        for r in t.stream(id) {
            let (offset, rec) = r.unwrap_or_else(|e| panic!("stream {id}: {e}"));
            let c = chunks
                .iter()
                .rfind(|c| c.stream == id && c.offset <= offset)
                .unwrap_or_else(|| panic!("a record at {offset:#x} before every chunk of stream {id}"));
            by.entry(c.offset).or_default().push(rec);
        }
    }
    by
}

fn truth(t: &TraceFile) -> Vec<TrueChunk> {
    let mut by = records_by_chunk(t);
    t.chunks()
        .iter()
        .map(|c| TrueChunk {
            offset: c.offset as usize,
            bytes: CHUNK_HEADER_LEN + c.len,
            stream: c.stream,
            records: by.remove(&c.offset).unwrap_or_default(),
        })
        .collect()
}

#[derive(Debug)]
enum Mutation {
    Flip(Vec<(usize, u8)>),
    Overwrite(usize, Vec<u8>),
    ChunkHeader(usize, u8),
    Cut(usize),
}

/// A mutation of a file of `len` bytes whose chunks are `chunks`: never the file header (a
/// damaged file header is refused, nothing after it can be trusted: see format.rs).
fn mutation(s: &mut u64, len: usize, chunks: &[TrueChunk]) -> Mutation {
    let at = |s: &mut u64| HEADER_LEN + (next(s) as usize) % (len - HEADER_LEN);
    let nonzero = |s: &mut u64| (next(s) % 255) as u8 + 1;
    match next(s) % 8 {
        0..=2 => Mutation::Flip((0..1 + next(s) % 4).map(|_| (at(s), nonzero(s))).collect()),
        3 | 4 => {
            let n = 1 + (next(s) % 64) as usize;
            Mutation::Overwrite(at(s), (0..n).map(|_| next(s) as u8).collect())
        }
        5 | 6 => {
            let c = &chunks[(next(s) as usize) % chunks.len()];
            Mutation::ChunkHeader(c.offset + (next(s) as usize) % CHUNK_HEADER_LEN, nonzero(s))
        }
        _ => Mutation::Cut(at(s)),
    }
}

fn apply(full: &[u8], m: &Mutation) -> Vec<u8> {
    let mut b = full.to_vec();
    match m {
        Mutation::Flip(v) => {
            for &(at, x) in v {
                b[at] ^= x;
            }
        }
        Mutation::Overwrite(at, bytes) => {
            let end = (at + bytes.len()).min(b.len());
            b[*at..end].copy_from_slice(&bytes[..end - at]);
        }
        Mutation::ChunkHeader(at, x) => b[*at] ^= x,
        Mutation::Cut(at) => b.truncate(*at),
    }
    b
}

fn check_mutations(name: &str, segment: usize, n: u64, compress: bool, rounds: u64, seed: u64) {
    let d = fast_tempdir();
    let p = d.path().join(format!("{name}.itr"));
    record(&p, segment, n, compress);
    let full = std::fs::read(&p).unwrap();
    let t = TraceFile::open(&p).unwrap();
    assert!(t.damage().is_empty());
    let chunks = truth(&t);
    let cpu_chunks = chunks.iter().filter(|c| c.stream < 2).count();
    assert!(cpu_chunks > 20, "{name}: {cpu_chunks} CPU chunks");
    if compress {
        assert!(t.chunks().iter().any(|c| c.flags & CHUNK_FLAG_COMPRESSED != 0), "{name}: nothing compressed");
    }
    let summary = t.summary().unwrap().clone();
    let total: u64 = chunks.iter().filter(|c| c.stream < 2).map(|c| c.records.len() as u64).sum();
    assert_eq!(total, summary.records.iter().sum::<u64>(), "{name}: the summary counts every record");
    drop(t);

    let bad = d.path().join(format!("{name}-bad.itr"));
    let mut s = seed;
    let mut skipped = 0;
    for round in 0..rounds {
        let m = mutation(&mut s, full.len(), &chunks);
        let b = apply(&full, &m);
        let what = format!("{name} round {round}: {m:?}");
        // A chunk is touched when a byte of it changed or is missing.
        let touched = |c: &TrueChunk| c.end() > b.len() || b[c.offset..c.end()] != full[c.offset..c.end()];
        if chunks.iter().all(|c| !touched(c)) {
            continue;
        }
        std::fs::write(&bad, &b).unwrap();
        let t = TraceFile::open(&bad).unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = records_by_chunk(&t);
        // Every untouched chunk is read, with exactly its records.
        for c in chunks.iter().filter(|c| !touched(c)) {
            let info = t.chunks().iter().find(|i| i.offset as usize == c.offset);
            let info = info.unwrap_or_else(|| panic!("{what}: the untouched chunk at {:#x} is not read", c.offset));
            assert!(!info.truncated && info.stream == c.stream, "{what}: {info:?}");
            let empty = Vec::new();
            let records = got.get(&(c.offset as u64)).unwrap_or(&empty);
            assert!(records == &c.records, "{what}: the chunk at {:#x} reads other records", c.offset);
        }
        // Every chunk read is one of the file's, untouched, or the last one cut by the end.
        for i in t.chunks() {
            let c = chunks.iter().find(|c| c.offset as u64 == i.offset);
            let c = c.unwrap_or_else(|| panic!("{what}: a chunk read at {:#x} that the file never had", i.offset));
            assert!(!touched(c) || (i.truncated && c.end() > b.len()), "{what}: damaged chunk {i:?} read");
        }
        // Every damaged chunk wholly in the file lies in a stretch said to be damaged.
        let damaged: Vec<&TrueChunk> = chunks.iter().filter(|c| touched(c) && c.end() <= b.len()).collect();
        for c in &damaged {
            let d = t.damage().iter().find(|d| d.offset as usize <= c.offset && c.end() <= (d.offset + d.len) as usize);
            assert!(d.is_some(), "{what}: the damaged chunk at {:#x} is not in {:?}", c.offset, t.damage());
        }
        // A chunk after a lost one of its stream says so (a gap: stacks restart there).
        let mut prev_lost: BTreeMap<StreamId, bool> = BTreeMap::new();
        for c in &chunks {
            if let Some(i) = t.chunks().iter().find(|i| i.offset as usize == c.offset) {
                if prev_lost.get(&c.stream) == Some(&true) {
                    assert!(i.after_gap, "{what}: the chunk at {:#x} follows a lost one, unmarked", c.offset);
                }
            }
            let read = t.chunks().iter().any(|i| i.offset as usize == c.offset);
            prev_lost.insert(c.stream, !read);
        }
        // The loss said is what the damaged chunks held, when the end summary survived.
        let cut = chunks.iter().any(|c| c.end() > b.len());
        if t.summary().is_some() && !cut {
            let lost_cpu: Vec<&&TrueChunk> = damaged.iter().filter(|c| c.stream < 2).collect();
            let records: u64 = lost_cpu.iter().map(|c| c.records.len() as u64).sum();
            let instructions: u64 = lost_cpu
                .iter()
                .flat_map(|c| &c.records)
                .map(|r| match r {
                    Record::Branch(b) => b.icount as u64,
                    _ => 0,
                })
                .sum();
            let mte: u64 = damaged.iter().filter(|c| c.stream == STREAM_MTE).map(|c| c.records.len() as u64).sum();
            let loss = t.damage_loss();
            assert_eq!(
                loss,
                DamageLoss { records: Some(records), instructions: Some(instructions), mte_records: Some(mte) },
                "{what}"
            );
            let said: Option<u32> = t.damage().iter().map(|d| d.chunks).sum();
            assert_eq!(said, Some(damaged.len() as u32), "{what}: chunks lost, {:?}", t.damage());
        } else {
            skipped += 1;
            let _ = t.damage_loss();
        }
        // The merged read goes through every stream without an error.
        let mut merged = 0;
        for e in t.merged() {
            e.unwrap_or_else(|e| panic!("{what}: merged: {e}"));
            merged += 1;
        }
        assert_eq!(merged, got.values().map(Vec::len).sum::<usize>() - got_end(&t, &got), "{what}");
        // A strict reader refuses what this one read around.
        if !t.damage().is_empty() {
            let strict = TraceFile::open_strict(&bad).err().map(|e| e.to_string());
            assert_eq!(strict, Some(t.damage()[0].error().to_string()), "{what}");
        }
    }
    assert!(skipped < rounds / 2, "{name}: {skipped} of {rounds} rounds without the summary");
}

/// Records of the end chunk (not part of the merged read).
fn got_end(t: &TraceFile, got: &BTreeMap<u64, Vec<Record>>) -> usize {
    t.chunks().iter().filter(|c| c.stream == STREAM_END).map(|c| got.get(&c.offset).map_or(0, Vec::len)).sum()
}

#[test]
fn every_untouched_chunk_of_a_damaged_trace_reads() {
    check_mutations("plain", 600, 6000, false, 2500, 0x1234_5678_9abc_def1);
}

#[test]
fn every_untouched_compressed_chunk_of_a_damaged_trace_reads() {
    check_mutations("compressed", 2000, 12000, true, 1500, 0x0fed_cba9_8765_4321);
}

/// One byte flipped in the middle of a chunk's payload: that chunk is skipped, the reader goes on
/// from the next, and a strict reader gives today's error.
#[test]
fn one_flipped_byte_loses_one_chunk() {
    let d = fast_tempdir();
    let p = d.path().join("t.itr");
    record(&p, 600, 6000, false);
    let full = std::fs::read(&p).unwrap();
    let t = TraceFile::open(&p).unwrap();
    let chunks = truth(&t);
    let c = chunks.iter().filter(|c| c.stream == 0).nth(5).unwrap();
    let mut b = full.clone();
    b[c.offset + CHUNK_HEADER_LEN + 10] ^= 0x40;
    let bad = d.path().join("bad.itr");
    std::fs::write(&bad, &b).unwrap();
    let t = TraceFile::open(&bad).unwrap();
    assert_eq!(
        t.damage(),
        &[Damage {
            offset: c.offset as u64,
            len: c.bytes as u64,
            stream: Some(0),
            chunks: Some(1),
            what: format!("checksum mismatch in the {}-byte chunk of stream 0", c.bytes - CHUNK_HEADER_LEN),
            error_offset: c.offset as u64,
        }]
    );
    assert_eq!(t.chunks().len(), chunks.len() - 1);
    assert_eq!(t.damage_loss().records, Some(c.records.len() as u64));
    assert_eq!(
        TraceFile::open_strict(&bad).err().map(|e| e.to_string()),
        Some(format!(
            "corrupt trace at offset {:#x}: checksum mismatch in the {}-byte chunk of stream 0",
            c.offset,
            c.bytes - CHUNK_HEADER_LEN
        ))
    );
}
