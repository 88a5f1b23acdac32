//! Format 3.0's compact CPU chunks: what goes in comes out (the truth is the input sequence
//! itself), in every mode and compressed; a file cut anywhere reads as a prefix; damage of
//! every kind is an error with an offset or the valid prefix, never a panic or a hang.

use itrace_format::*;
use std::path::Path;

fn fast_tempdir() -> tempfile::TempDir {
    match Path::new("/dev/shm") {
        shm if shm.is_dir() => tempfile::tempdir_in(shm).unwrap_or_else(|_| tempfile::tempdir().unwrap()),
        _ => tempfile::tempdir().unwrap(),
    }
}

/// A small deterministic generator (xorshift), so every run tests the same inputs.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Records as a program's trace has them: loops over a few dozen edges (table hits), runs of
/// one branch at one timestamp, edges never seen (new items), system calls (kernel records,
/// `to` 0, flags and numbers), two threads taking turns, trace on/off, a timestamp that goes
/// back, addresses far apart (large deltas) and at the ends of the address space.
fn program_like(n: usize, seed: u64) -> Vec<(usize, Record)> {
    let mut r = Rng(seed);
    let edges: Vec<(u64, u64, BranchKind, u32)> = (0..40)
        .map(|i| {
            let from: u64 = 0x401000 + i * 0x37;
            let kind = [BranchKind::CondJump, BranchKind::Call, BranchKind::Return, BranchKind::Jump][i as usize % 4];
            (from, from.wrapping_add(r.below(0x2000)).wrapping_sub(0x1000), kind, 1 + (i % 9) as u32)
        })
        .collect();
    let mut out = Vec::new();
    let mut ts = 1_000_000u64;
    let mut tid = 100u32;
    out.push((0, Record::TraceOn(TraceOn { ts, reason: TraceOnReason::Start, pid: 100, tid, pc: 0x401000 })));
    while out.len() < n {
        let cpu = (tid - 100) as usize % 2;
        match r.below(100) {
            0..=69 => {
                let hot = if r.below(4) == 0 { 40 } else { 6 };
                let (from, to, kind, icount) = edges[r.below(hot) as usize];
                ts += [0, 0, 0, 1, 700, 25_000, 3_000_000][r.below(7) as usize];
                out.push((cpu, Record::Branch(Branch { icount, ..Branch::user(ts, tid, from, to, kind, 0, 0) })));
            }
            70..=79 => {
                let b = Branch { icount: 3, ..Branch::user(ts, tid, 0x402000, 0x402010, BranchKind::CondJump, 0, 0) };
                for _ in 0..r.below(50) {
                    out.push((cpu, Record::Branch(b)));
                }
            }
            80..=86 => {
                let from = [0x1, u64::MAX - 3, 0x7fff_f7ff_d000 + r.below(1 << 20), r.next()][r.below(4) as usize];
                let to = [0, 0x2, u64::MAX, r.next()][r.below(4) as usize];
                let b = Branch {
                    icount: r.next() as u32,
                    ..Branch::user(ts, tid, from, to, BranchKind::Other, r.below(3) as u8, r.next() as u16)
                };
                out.push((cpu, Record::Branch(b)));
            }
            87..=92 => {
                ts += 1000;
                let sc = Branch { icount: 2, ..Branch::user(ts, tid, 0x401234, 0, BranchKind::Intrpt, 1, 60) };
                out.push((cpu, Record::Branch(sc)));
                out.push((cpu, Record::Branch(Branch::kernel_return(ts + 5, tid, 0x401236, 1, 60))));
            }
            93..=95 => {
                tid = if tid == 100 { 101 } else { 100 };
                let on = TraceOn { ts, reason: TraceOnReason::Resume, pid: 100, tid, pc: 0x401000 };
                out.push(((tid - 100) as usize % 2, Record::TraceOn(on)));
            }
            96..=97 => {
                let back = ts - r.below(5000);
                out.push((
                    cpu,
                    Record::Branch(Branch {
                        icount: 1,
                        ..Branch::user(back, tid, 0x401000, 0x401100, BranchKind::Jump, 0, 0)
                    }),
                ));
            }
            _ => {
                let off =
                    TraceOff { ts, reason: StopReason::RegionEnd, pid: 100, tid, pc: 0x401500, icount: 4, value: 0 };
                out.push((cpu, Record::TraceOff(off)));
                out.push((cpu, Record::Lost(Lost { ts, count: r.below(9) })));
            }
        }
    }
    out
}

fn header(mode: Mode) -> FileHeader {
    FileHeader::starting_now(Arch::X86_64, mode, StepMethod::PtraceSingleStep, 2, FLAG_ICOUNT, 0, 0)
}

fn write(path: &Path, recs: &[(usize, Record)], mode: Mode, buffer: usize, segment: usize, compress: bool) {
    let mut w = TraceWriter::create(path, &header(mode)).unwrap();
    if compress {
        w.compress(1);
    }
    let cfg = BufferConfig { mode, ncpu: 2, buffer_size: buffer, segment_size: segment, mte_size: 1 << 20 };
    let mut b = Buffers::new(cfg, w).unwrap();
    b.push_mte(&Record::Mte(Mte::ProcessName { ts: 1, pid: 100, ppid: 1, name: "p".into() })).unwrap();
    for (cpu, r) in recs {
        match r {
            Record::Branch(br) => assert_eq!(b.push_branch(*cpu, br).unwrap(), Push::Stored),
            r => b.push_control(*cpu, r).unwrap(),
        }
    }
    b.finish(Summary::default()).unwrap();
}

fn per_cpu(recs: &[(usize, Record)], cpu: usize) -> Vec<Record> {
    recs.iter().filter(|(c, _)| *c == cpu).map(|(_, r)| r.clone()).collect()
}

fn read_cpu(t: &TraceFile, cpu: u16) -> Result<Vec<Record>, FormatError> {
    t.stream(cpu).map(|r| r.map(|(_, r)| r)).collect()
}

#[test]
fn records_come_back_as_they_went_in_every_mode() {
    let d = fast_tempdir();
    let recs = program_like(60_000, 7);
    for (mode, buffer, segment, compress) in [
        (Mode::Continuous, 0, 1 << 20, false),
        (Mode::Continuous, 0, 300, false),
        (Mode::Continuous, 0, 4096, true),
        (Mode::Normal, 64 << 20, 1 << 20, false),
        (Mode::Wrap, 64 << 20, 1 << 20, true),
    ] {
        let p = d.path().join("t.itr");
        write(&p, &recs, mode, buffer, segment, compress);
        let t = TraceFile::open(&p).unwrap();
        for cpu in 0..2 {
            assert_eq!(read_cpu(&t, cpu).unwrap(), per_cpu(&recs, cpu as usize), "{mode} {segment} {compress}");
        }
    }
}

/// The encoding is a few bytes per branch when the program loops, not 40.
#[test]
fn a_loop_costs_a_few_bytes_per_branch() {
    let d = fast_tempdir();
    let p = d.path().join("t.itr");
    let mut recs = Vec::new();
    for i in 0..100_000u64 {
        // Three edges in turn, each at a new timestamp a microsecond later.
        let (from, to) = [(0x401010, 0x401100), (0x401120, 0x401200), (0x401210, 0x401000)][i as usize % 3];
        recs.push((
            0,
            Record::Branch(Branch { icount: 4, ..Branch::user(1000 * i, 5, from, to, BranchKind::Jump, 0, 0) }),
        ));
    }
    write(&p, &recs, Mode::Continuous, 0, 1 << 20, false);
    let t = TraceFile::open(&p).unwrap();
    let bytes: usize = t.chunks().iter().filter(|c| c.stream == 0).map(|c| c.len).sum();
    // A table hit (1 byte) and the timestamp delta 1000 (2 bytes).
    assert!(bytes <= 3 * 100_000 + 100, "{bytes} bytes");
    assert_eq!(read_cpu(&t, 0).unwrap(), per_cpu(&recs, 0));
}

fn chunk_offsets(b: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut off = HEADER_LEN;
    while off + CHUNK_HEADER_LEN <= b.len() {
        let len = u32::from_ne_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        out.push((off, len));
        off += CHUNK_HEADER_LEN + len;
    }
    out
}

/// Recompute every checksum, so that damage reaches the decoder instead of the CRC check.
fn fix_crcs(b: &mut [u8]) {
    let crc = crc32fast::hash(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_ne_bytes());
    for (off, len) in chunk_offsets(b) {
        let end = (off + CHUNK_HEADER_LEN + len).min(b.len());
        let p = crc32fast::hash(&b[off + CHUNK_HEADER_LEN..end]);
        b[off + 12..off + 16].copy_from_slice(&p.to_ne_bytes());
        let h = crc32fast::hash(&b[off..off + 20]);
        b[off + 20..off + 24].copy_from_slice(&h.to_ne_bytes());
    }
}

/// Open and read everything; whatever happens must be an answer, not a panic.
fn read_all(p: &Path) -> Result<(Vec<Record>, Vec<Record>), FormatError> {
    let t = TraceFile::open(p)?;
    let merged: Result<Vec<_>, _> = t.merged().map(|e| e.map(|e| e.record)).collect();
    merged?;
    Ok((read_cpu(&t, 0)?, read_cpu(&t, 1)?))
}

#[test]
fn a_file_cut_at_any_byte_or_chunk_boundary_reads_as_a_prefix() {
    let d = fast_tempdir();
    let recs = program_like(3000, 11);
    for compress in [false, true] {
        let p = d.path().join("t.itr");
        write(&p, &recs, Mode::Continuous, 0, 512, compress);
        let full = std::fs::read(&p).unwrap();
        let boundaries: Vec<usize> = chunk_offsets(&full).iter().map(|&(off, _)| off).collect();
        assert!(boundaries.len() > 10);
        let cut = d.path().join("cut.itr");
        let mut rng = Rng(3);
        let lens: Vec<usize> = if compress {
            (0..full.len()).collect()
        } else {
            // Every chunk boundary, a byte either side, and 2000 random places.
            let mut v: Vec<usize> = boundaries.iter().flat_map(|&b| [b - 1, b, b + 1]).collect();
            v.extend((0..2000).map(|_| HEADER_LEN + rng.below((full.len() - HEADER_LEN) as u64) as usize));
            v
        };
        for len in lens {
            std::fs::write(&cut, &full[..len]).unwrap();
            let Ok((c0, c1)) = read_all(&cut) else {
                assert!(len < HEADER_LEN, "cut at {len}: {}", read_all(&cut).unwrap_err());
                continue;
            };
            let t = TraceFile::open(&cut).unwrap();
            if len < full.len() {
                assert!(t.summary().is_none(), "cut at {len}");
                if boundaries.contains(&len) {
                    assert_eq!(t.truncated_at(), None, "cut at the chunk boundary {len}");
                }
            }
            for (cpu, got) in [c0, c1].into_iter().enumerate() {
                let want = per_cpu(&recs, cpu);
                assert_eq!(got[..], want[..got.len()], "cut at {len}, CPU {cpu}, compressed {compress}");
            }
        }
    }
}

#[test]
fn mutated_files_give_an_error_or_records_never_a_panic() {
    let d = fast_tempdir();
    let recs = program_like(4000, 5);
    let p = d.path().join("t.itr");
    let m = d.path().join("m.itr");
    let mut rng = Rng(99);
    let (mut errors, mut read) = (0, 0);
    for compress in [false, true] {
        write(&p, &recs, Mode::Continuous, 0, 700, compress);
        let full = std::fs::read(&p).unwrap();
        let chunks = chunk_offsets(&full);
        for i in 0..2000 {
            let mut b = full.clone();
            // Bit flips, random bytes and overflowing values (runs of 0xff: varints longer than
            // 64 bits, huge lengths and deltas), mostly inside CPU payloads.
            let (off, len) = chunks[rng.below(chunks.len() as u64) as usize];
            let start = off + CHUNK_HEADER_LEN;
            for _ in 0..1 + rng.below(4) {
                let at = if i % 10 == 0 {
                    rng.below(b.len() as u64) as usize
                } else {
                    start + rng.below(len as u64) as usize
                };
                match rng.below(3) {
                    0 => b[at] ^= 1 << rng.below(8),
                    1 => b[at] = rng.next() as u8,
                    _ => {
                        let end = (at + 11).min(b.len());
                        b[at..end].fill(0xff)
                    }
                }
            }
            // Most with the checksums made right again, so the decoder meets the damage.
            if i % 4 != 0 {
                fix_crcs(&mut b);
            }
            std::fs::write(&m, &b).unwrap();
            match read_all(&m) {
                Ok(_) => read += 1,
                Err(e) => {
                    let text = e.to_string();
                    assert!(!text.contains('\n'), "a one-line error: {text}");
                    errors += 1;
                }
            }
        }
    }
    assert!(errors > 1000 && read > 100, "{errors} errors, {read} read");
}

/// Hand-made payloads: each damage is named, with the offset of its item.
#[test]
fn damaged_items_are_errors_at_their_offset() {
    let d = fast_tempdir();
    let p = d.path().join("t.itr");
    let cases: [(&[u8], &str); 8] = [
        (&[0x86, 0x05], "second-table slot 261, which is empty"),
        (&[0x04], "table slot 4, which is empty"),
        (&[0x80, 0x0F, 0x01, 0x01, 0x01], "unknown branch kind 15"),
        (&[0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], "longer than 64 bits"),
        (&[0x80, 0x03, 0x01], "runs past the end of its chunk"),
        (&[0xF0, 0x00], "a run of 0 branches"),
        (&[0xFE, 0xff, 0xff], "runs past the end of its chunk"),
        (&[0x99], "unknown item tag 0x99"),
    ];
    for (payload, want) in cases {
        let mut w = TraceWriter::create(&p, &header(Mode::Continuous)).unwrap();
        // A good branch first, so the error's offset is the second item's.
        let mut ok = Vec::new();
        let mut enc = compact::Encoder::new();
        enc.branch(&mut ok, &Branch { icount: 1, ..Branch::user(5, 1, 0x1000, 0x2000, BranchKind::Jump, 0, 0) });
        let at = HEADER_LEN + CHUNK_HEADER_LEN + ok.len();
        ok.extend_from_slice(payload);
        w.write_chunk(0, 0, &ok).unwrap();
        drop(w);
        let t = TraceFile::open(&p).unwrap();
        let got: Vec<_> = t.stream(0).collect();
        assert!(matches!(got[0], Ok((_, Record::Branch(_)))), "{want}");
        let err = got.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(err.contains(want) && err.contains(&format!("offset {at:#x}")), "{want}: {err}");
    }
    // A compressed chunk that says it holds more than any writer compresses.
    let mut w = TraceWriter::create(&p, &header(Mode::Continuous)).unwrap();
    let mut payload = u32::MAX.to_ne_bytes().to_vec();
    payload.extend_from_slice(&[0; 16]);
    w.write_chunk(0, CHUNK_FLAG_COMPRESSED, &payload).unwrap();
    drop(w);
    let t = TraceFile::open(&p).unwrap();
    let err = t.stream(0).next().unwrap().unwrap_err().to_string();
    assert!(err.contains("holds 4294967295 bytes (1 to 67108864 allowed)"), "{err}");
}
