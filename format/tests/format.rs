//! Round trips and the promises of each mode, checked against the records we
//! put in (the truth here is the input sequence itself).

use itrace_format::*;
use std::path::Path;

/// A directory in memory when there is one: the loops below write a file thousands of times,
/// and a disk file system flushes a truncated-and-rewritten file on close.
fn fast_tempdir() -> tempfile::TempDir {
    match std::path::Path::new("/dev/shm") {
        shm if shm.is_dir() => tempfile::tempdir_in(shm).unwrap_or_else(|_| tempfile::tempdir().unwrap()),
        _ => tempfile::tempdir().unwrap(),
    }
}

fn header(mode: Mode, ncpu: u16) -> FileHeader {
    FileHeader {
        endian: Endian::native(),
        version_major: VERSION_MAJOR,
        version_minor: VERSION_MINOR,
        arch: Arch::X86_64,
        mode,
        step_method: StepMethod::PtraceSingleStep,
        ncpu,
        flags: FLAG_ICOUNT,
        buffer_size: 0,
        segment_size: 0,
        start_realtime_ns: 1,
        start_monotonic_ns: 2,
    }
}

fn branch(i: u64, cpu: usize) -> Branch {
    Branch {
        ts: 1000 + i,
        kernel: i % 7 == 0,
        kind: if i % 3 == 0 { BranchKind::CondJump } else { BranchKind::Call },
        flags: 0,
        aux: (i % 5) as u16,
        from: 0x400000 + i * 16,
        to: 0x500000 + i,
        tid: 100 + cpu as u32,
        icount: (i % 13) as u32 + 1,
    }
}

/// Record `n` branches alternating over `ncpu` CPUs, plus MTE records; returns the branches pushed.
fn record(path: &Path, mode: Mode, ncpu: usize, buffer: usize, segment: usize, n: u64) -> (Vec<Branch>, Push) {
    let w = TraceWriter::create(path, &header(mode, ncpu as u16)).unwrap();
    let cfg = BufferConfig { mode, ncpu, buffer_size: buffer, segment_size: segment, mte_size: 1 << 20 };
    let mut b = Buffers::new(cfg, w).unwrap();
    b.push_mte(&Record::Mte(Mte::ProcessName { ts: 999, pid: 100, ppid: 1, name: "prog".into() })).unwrap();
    let mut pushed = Vec::new();
    let mut last = Push::Stored;
    for i in 0..n {
        let cpu = (i as usize) % ncpu;
        let br = branch(i, cpu);
        let mut a = [0u8; BRANCH_RECORD_LEN];
        br.encode_into(&mut a);
        last = b.push_trace(cpu, &a).unwrap();
        if last == Push::Full {
            break;
        }
        pushed.push(br);
        if i % 1000 == 0 {
            let seg = Mte::Segment {
                ts: 1000 + i,
                pid: 100,
                prot: prot::READ | prot::EXEC,
                start: i,
                end: i + 4096,
                offset: 0,
                path: format!("/lib/x{i}.so"),
            };
            b.push_mte(&Record::Mte(seg)).unwrap();
        }
    }
    b.finish(Summary { ts: 5_000_000, ..Default::default() }).unwrap();
    (pushed, last)
}

fn branches(t: &TraceFile) -> Vec<Branch> {
    t.merged()
        .filter_map(|e| match e.unwrap().record {
            Record::Branch(b) => Some(b),
            _ => None,
        })
        .collect()
}

#[test]
fn every_record_kind_round_trips() {
    let recs = vec![
        Record::Branch(branch(3, 0)),
        Record::TraceOn(TraceOn { ts: 1, reason: TraceOnReason::Attach, pid: 7, tid: 8, pc: 0xdead }),
        Record::TraceOff(TraceOff {
            ts: 2,
            reason: StopReason::Signaled,
            pid: 7,
            tid: 8,
            pc: 0xbeef,
            icount: 5,
            value: 11,
        }),
        Record::Lost(Lost { ts: 3, count: 42 }),
        Record::Mte(Mte::Segment { ts: 4, pid: 1, prot: 5, start: 1, end: 2, offset: 3, path: "/a b/ü".into() }),
        Record::Mte(Mte::Unmap { ts: 5, pid: 1, start: 1, end: 2 }),
        Record::Mte(Mte::ThreadName { ts: 6, pid: 1, tid: 2, name: "worker 1".into() }),
        Record::Mte(Mte::ProcessName { ts: 6, pid: 1, ppid: 0, name: "a program".into() }),
        Record::Mte(Mte::Exec { ts: 7, pid: 1, tid: 1, path: "/bin/true".into() }),
        Record::Mte(Mte::JitSymbol { ts: 8, pid: 1, start: 9, size: 10, name: "LazyCompile:foo".into() }),
        Record::Mte(Mte::VdsoImage { ts: 9, pid: 1, start: 0x7fff0000, image: vec![1, 2, 3, 4, 5] }),
        Record::Mte(Mte::Clone { ts: 10, parent_pid: 1, parent_tid: 1, child_pid: 1, child_tid: 3, thread: true }),
        Record::Mte(Mte::ModuleId {
            ts: 10,
            pid: 1,
            start: 0x1000,
            size: 12345,
            mtime_ns: 1_700_000_000_123_456_789,
            build_id: (0..20).collect(),
            path: "/usr/bin/a b".into(),
        }),
        Record::Mte(Mte::ModuleId {
            ts: 10,
            pid: 1,
            start: 0,
            size: 0,
            mtime_ns: 0,
            build_id: vec![],
            path: "/x".into(),
        }),
        Record::Mte(Mte::Recording {
            ts: 10,
            version: "0.1.0".into(),
            args: vec!["itrace".into(), "record".into(), "an argument".into(), String::new()],
            cwd: "/home/ü".into(),
            host: "vm".into(),
            kernel: "Linux 6.1.0 #1 SMP x86_64".into(),
            cpu: "AMD EPYC".into(),
        }),
        Record::Mte(Mte::Recording {
            ts: 10,
            version: String::new(),
            args: vec![],
            cwd: String::new(),
            host: String::new(),
            kernel: String::new(),
            cpu: String::new(),
        }),
        Record::Summary(Summary {
            ts: 11,
            stop_reason: 2,
            instructions: 99,
            records: vec![1, 2],
            lost: vec![0, 3],
            mte_records: 4,
            totals: None,
        }),
        // With the stream totals (after the pairs, where older readers stop).
        Record::Summary(Summary {
            ts: 11,
            stop_reason: 2,
            instructions: 99,
            records: vec![1, 2],
            lost: vec![0, 3],
            mte_records: 4,
            totals: Some(vec![
                StreamTotals {
                    branches: 1,
                    first_ts: Some(5),
                    last_ts: Some(9),
                    kinds: [0, 1, 2, 3, 4, 5, 6].map(|i| KindStats { records: i, bytes: 10 * i }),
                },
                StreamTotals::default(),
            ]),
        }),
    ];
    for r in recs {
        let mut v = Vec::new();
        r.encode(&mut v).unwrap();
        assert_eq!(v.len() % 4, 0, "{r:?} not padded");
        assert_eq!((u16::from_ne_bytes([v[0], v[1]]) & 0xfffc) as usize, v.len());
        assert_eq!(Record::decode(Endian::native(), &v, 0).unwrap(), r);
        // Its timestamp set (a recorder keeping a stream in time order), read back, written.
        let mut moved = r.clone();
        moved.set_ts(0x1234_5678);
        assert_eq!(moved.ts(), 0x1234_5678, "{r:?}");
        let mut v = Vec::new();
        moved.encode(&mut v).unwrap();
        assert_eq!(Record::decode(Endian::native(), &v, 0).unwrap().ts(), 0x1234_5678, "{r:?}");
        moved.set_ts(r.ts());
        assert_eq!(moved, r, "only the timestamp changes");
    }
}

#[test]
fn normal_mode_stops_when_full_and_keeps_everything_before() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.itr");
    let (pushed, last) = record(&p, Mode::Normal, 2, 4000, 0, 10_000);
    assert_eq!(last, Push::Full);
    // 4000 bytes per CPU held 100 records of 40 bytes in format 2.0: the compact encoding holds
    // more, even of these branches that never repeat an edge, and no more than 4000 bytes.
    assert!(pushed.len() > 400, "{}", pushed.len());
    let t = TraceFile::open(&p).unwrap();
    assert_eq!(branches(&t), pushed);
    for cpu in 0..2 {
        let bytes: usize = t.chunks().iter().filter(|c| c.stream == cpu).map(|c| c.len).sum();
        assert!(bytes <= 4000, "CPU {cpu} holds {bytes} bytes");
    }
    let half = pushed.len() as u64 / 2;
    assert_eq!(t.summary().unwrap().records, vec![half, half]);
    assert_eq!(t.truncated_at(), None);
}

#[test]
fn wrap_mode_keeps_exactly_the_last_records() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.itr");
    let (pushed, _) = record(&p, Mode::Wrap, 2, 4000, 4096, 10_000);
    assert_eq!(pushed.len(), 10_000);
    let t = TraceFile::open(&p).unwrap();
    let got = branches(&t);
    // The last whole blocks (a sixteenth of the buffer each) that fit in 4000 bytes per CPU:
    // more than the 100 records of 40 bytes of format 2.0, and exactly the newest.
    assert!(got.len() > 400, "{}", got.len());
    assert_eq!(got, pushed[pushed.len() - got.len()..]);
    let s = t.summary().unwrap();
    for cpu in 0..2 {
        let kept = got.iter().filter(|b| b.tid == 100 + cpu as u32).count() as u64;
        assert_eq!(s.lost[cpu] + kept, 5000, "CPU {cpu}");
        assert_eq!(s.records[cpu], kept, "CPU {cpu}");
        let bytes: usize = t.chunks().iter().filter(|c| c.stream == cpu as u16).map(|c| c.len).sum();
        assert!(bytes <= 4000 + 200, "CPU {cpu} holds {bytes} bytes (and the Lost chunk)");
    }
    let lost: u64 = t
        .merged()
        .filter_map(|e| match e.unwrap().record {
            Record::Lost(l) => Some(l.count),
            _ => None,
        })
        .sum();
    assert_eq!(lost, s.lost.iter().sum::<u64>());
    // MTE records are never overwritten: all 10 segments are there.
    let segs =
        t.stream(STREAM_MTE).filter(|r| matches!(r.as_ref().unwrap().1, Record::Mte(Mte::Segment { .. }))).count();
    assert_eq!(segs, 10);
}

#[test]
fn continuous_mode_loses_nothing_with_small_segments() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.itr");
    let (pushed, _) = record(&p, Mode::Continuous, 2, 0, 1024, 10_000);
    let t = TraceFile::open(&p).unwrap();
    assert!(t.chunks().len() > 50, "segments were written as they filled");
    assert_eq!(branches(&t), pushed);
    assert_eq!(t.summary().unwrap().lost, vec![0, 0]);
}

/// The borrowing merged read (`next_ref`, which post-processing uses) gives the records
/// pushed, in time order, with the MTE records between them where their timestamps put them.
#[test]
fn the_borrowing_merged_read_gives_every_record_in_time_order() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.itr");
    let (pushed, _) = record(&p, Mode::Continuous, 3, 0, 1024, 10_000);
    let t = TraceFile::open(&p).unwrap();
    let mut merged = t.merged();
    let (mut got, mut segments, mut last_ts) = (Vec::new(), Vec::new(), 0);
    while let Some(ev) = merged.next_ref() {
        let ev = ev.unwrap();
        assert!(ev.record.ts() >= last_ts, "records in time order");
        last_ts = ev.record.ts();
        match ev.record {
            Record::Branch(b) => {
                assert_eq!(ev.stream as u32, b.tid - 100, "a branch comes from its CPU's stream");
                got.push(*b);
            }
            Record::Mte(Mte::Segment { start, .. }) => {
                assert_eq!(ev.stream, STREAM_MTE);
                // Pushed after branch `start`, with its timestamp (1000 + start): MTE records
                // come first on equal timestamps, so just before it.
                assert_eq!(got.len() as u64, *start, "segment {start} just before branch {start}");
                segments.push(*start);
            }
            _ => {}
        }
    }
    assert_eq!(got, pushed);
    assert_eq!(segments, (0..10).map(|i| i * 1000).collect::<Vec<u64>>());
}

#[test]
fn a_file_cut_anywhere_reads_up_to_its_last_whole_record() {
    let d = fast_tempdir();
    let p = d.path().join("t.itr");
    let (pushed, _) = record(&p, Mode::Continuous, 2, 0, 512, 300);
    let full = std::fs::read(&p).unwrap();
    let cut = d.path().join("cut.itr");
    for len in 0..full.len() {
        std::fs::write(&cut, &full[..len]).unwrap();
        match TraceFile::open(&cut) {
            Err(FormatError::Empty { .. }) => assert_eq!(len, 0),
            Err(FormatError::NotATrace { .. }) => assert!(len < 4),
            Err(FormatError::HeaderCut { len: l, .. }) => assert!(len < HEADER_LEN && l as usize == len),
            Err(e) => panic!("cut at {len}: unexpected {e}"),
            Ok(t) => {
                assert!(t.truncated_at().is_some() || t.summary().is_none());
                let got = branches(&t);
                // Streams are read chunk by chunk; whatever came back is a prefix per CPU.
                for cpu in 0..2u32 {
                    let want: Vec<_> = pushed.iter().filter(|b| b.tid == 100 + cpu).collect();
                    let have: Vec<_> = got.iter().filter(|b| b.tid == 100 + cpu).collect();
                    assert_eq!(have[..], want[..have.len()], "cut at {len}");
                }
            }
        }
    }
}

/// A strict reader ([`TraceFile::open_strict`], `--strict`).
#[test]
fn corruption_is_an_error_naming_the_offset() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t.itr");
    record(&p, Mode::Continuous, 2, 0, 512, 300);
    let full = std::fs::read(&p).unwrap();
    let bad = d.path().join("bad.itr");
    let mut errors = 0;
    for at in (HEADER_LEN..full.len()).step_by(7) {
        let mut b = full.clone();
        b[at] ^= 0x5a;
        std::fs::write(&bad, &b).unwrap();
        let res = TraceFile::open_strict(&bad)
            .and_then(|t| t.merged().try_for_each(|e| e.map(|_| ())).map(|_| t.truncated_at()));
        match res {
            // Chunk headers have their own CRC: a damaged length is never taken for a cut file.
            Err(FormatError::Corrupt { offset, what }) => {
                errors += 1;
                assert!((offset as usize) <= at, "offset {offset:#x} after the damage at {at:#x}: {what}");
            }
            Err(e) => panic!("flip at {at}: unexpected {e}"),
            Ok(cut) => panic!("flip at {at:#x} went unnoticed (read as cut at {cut:?})"),
        }
    }
    assert!(errors > 100);
}

#[test]
fn not_a_trace_and_wrong_version() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x");
    std::fs::write(&p, b"hello world, this is not a trace file at all, no sir, not at all....").unwrap();
    assert!(matches!(TraceFile::open(&p), Err(FormatError::NotATrace { .. })));
    let mut h = header(Mode::Normal, 1);
    h.version_major = 9;
    std::fs::write(&p, h.encode()).unwrap();
    assert!(matches!(TraceFile::open(&p), Err(FormatError::UnsupportedVersion { major: 9, .. })));
}

/// `push_branches` (a drained ring's records at once) stores exactly what `push_branch` one by one
/// stores, in every mode and for any size of batch: the same records, the same refusal point in
/// normal mode, the same losses in wrap mode. The branches repeat in loops (table hits and runs,
/// as a drained ring's do) with new edges between.
#[test]
fn pushing_batches_of_branches_equals_pushing_them_one_by_one() {
    let d = tempfile::tempdir().unwrap();
    let all: Vec<Branch> = (0..3000u64)
        .map(|i| {
            let b = branch(if i % 100 < 60 { i % 3 } else { i }, 0);
            Branch { ts: 1000 + i / 64, ..b }
        })
        .collect();
    let store = |name: &str, mode: Mode, buffer: usize, segment: usize, batch: usize| {
        let p = d.path().join(name);
        let w = TraceWriter::create(&p, &header(mode, 1)).unwrap();
        let cfg = BufferConfig { mode, ncpu: 1, buffer_size: buffer, segment_size: segment, mte_size: 1 << 20 };
        let mut b = Buffers::new(cfg, w).unwrap();
        let mut stored = 0;
        if batch == 0 {
            for br in &all {
                if b.push_branch(0, br).unwrap() == Push::Full {
                    break;
                }
                stored += 1;
            }
        } else {
            for part in all.chunks(batch) {
                let n = b.push_branches(0, part).unwrap();
                stored += n;
                if n < part.len() {
                    break;
                }
            }
        }
        let lost = b.lost().to_vec();
        b.finish(Summary::default()).unwrap();
        (stored, lost, branches(&TraceFile::open(&p).unwrap()))
    };
    for (mode, buffer, segment) in [(Mode::Continuous, 0, 700), (Mode::Normal, 2000, 700), (Mode::Wrap, 2000, 700)] {
        let one_by_one = store(&format!("{mode}-1.itr"), mode, buffer, segment, 0);
        match mode {
            Mode::Normal => assert!(one_by_one.0 < all.len() && one_by_one.0 > 100, "normal: {}", one_by_one.0),
            Mode::Wrap => assert!(one_by_one.1[0] > 0, "wrap: nothing lost"),
            _ => assert_eq!(one_by_one.2, all),
        }
        for batch in [1, 7, 64, 1000, 5000] {
            let batched = store(&format!("{mode}-{batch}.itr"), mode, buffer, segment, batch);
            assert_eq!(batched, one_by_one, "{mode}, batches of {batch}");
        }
    }
}

/// `push_hops` (one thread's user branches, their timestamps given by a stamp per batch) stores
/// exactly what `push_branch` stores of the branches they stand for, one by one, in every mode
/// and for any size of batch: the same records (timestamps, threads, counts, kinds), the same
/// refusal point in normal mode, the same losses in wrap mode. Loops (table hits, runs) with new
/// edges between, kinds of every code, and stamps whose shared reading ends inside a batch.
#[test]
fn pushing_hops_equals_pushing_their_branches_one_by_one() {
    let d = tempfile::tempdir().unwrap();
    let kinds = [BranchKind::Jump, BranchKind::CondJump, BranchKind::Call, BranchKind::Return, BranchKind::Intrpt];
    let hops: Vec<Hop> = (0..3000u64)
        .map(|i| {
            let at = if i % 100 < 60 { i % 3 } else { i };
            // One key per source, count and kind, a second one for some, none for others.
            let key = match i % 4 {
                0 => 0,
                1 => 10_000 + at as u32,
                _ => 1 + at as u32,
            };
            Hop::new(
                0x400000 + at * 16,
                if at % 11 == 0 { 0 } else { 0x500000 + at },
                (at % 13) as u32 + 1,
                kinds[at as usize % kinds.len()],
                key,
            )
        })
        .collect();
    let tid = |batch: usize| 100 + (batch % 3) as u32;
    // Batch `b` of `size`: the first `size / 3` at the thread's earlier reading, the rest later.
    let stamp = |b: usize, size: usize| BatchStamp {
        first: 1000 + 10 * b as u64,
        first_n: size / 3,
        rest: 1005 + 10 * b as u64,
    };
    let store = |name: &str, mode: Mode, size: usize, batched: bool| {
        let p = d.path().join(name);
        let w = TraceWriter::create(&p, &header(mode, 1)).unwrap();
        let cfg = BufferConfig { mode, ncpu: 1, buffer_size: 2000, segment_size: 700, mte_size: 1 << 20 };
        let mut buf = Buffers::new(cfg, w).unwrap();
        let mut stored = 0;
        'batches: for (b, part) in hops.chunks(size).enumerate() {
            let (tid, stamp) = (tid(b), stamp(b, part.len()));
            if batched {
                let n = buf.push_hops(0, tid, stamp, part).unwrap();
                stored += n;
                if n < part.len() {
                    break;
                }
            } else {
                for (i, h) in part.iter().enumerate() {
                    if buf.push_branch(0, &h.branch(stamp.ts(i), tid)).unwrap() == Push::Full {
                        break 'batches;
                    }
                    stored += 1;
                }
            }
        }
        let lost = buf.lost().to_vec();
        buf.finish(Summary::default()).unwrap();
        (stored, lost, branches(&TraceFile::open(&p).unwrap()))
    };
    for mode in [Mode::Continuous, Mode::Normal, Mode::Wrap] {
        for size in [1, 7, 64, 1000, 5000] {
            let one_by_one = store(&format!("{mode}-{size}-1.itr"), mode, size, false);
            match mode {
                Mode::Normal => assert!(one_by_one.0 < hops.len() && one_by_one.0 > 100, "normal: {}", one_by_one.0),
                Mode::Wrap => assert!(one_by_one.1[0] > 0, "wrap: nothing lost"),
                _ => {
                    let expected: Vec<Branch> = hops
                        .chunks(size)
                        .enumerate()
                        .flat_map(|(b, part)| {
                            let (tid, stamp) = (tid(b), stamp(b, part.len()));
                            part.iter().enumerate().map(move |(i, h)| Branch {
                                ts: stamp.ts(i),
                                kernel: false,
                                kind: h.kind(),
                                flags: 0,
                                aux: 0,
                                from: h.from,
                                to: h.to,
                                tid,
                                icount: h.icount,
                            })
                        })
                        .collect();
                    assert_eq!(one_by_one.2, expected, "batches of {size}: the file's branches");
                }
            }
            let batched = store(&format!("{mode}-{size}.itr"), mode, size, true);
            assert_eq!(batched, one_by_one, "{mode}, batches of {size}");
        }
    }
}

/// `push_records` (runs of records at once) stores exactly what pushing them one by one stores,
/// in every mode: the same records, the same refusal point in normal mode.
#[test]
fn pushing_runs_of_records_equals_pushing_them_one_by_one() {
    let d = tempfile::tempdir().unwrap();
    for (mode, buffer, segment) in [(Mode::Continuous, 0, 1000), (Mode::Normal, 4000, 1000), (Mode::Wrap, 4000, 1000)] {
        let mut encoded = Vec::new();
        let mut all = Vec::new();
        for i in 0..500 {
            let br = branch(i, 0);
            Record::Branch(br).encode(&mut encoded).unwrap();
            all.push(br);
            if i % 50 == 0 {
                let on = TraceOn { ts: 1000 + i, reason: TraceOnReason::Resume, pid: 1, tid: 100, pc: i };
                Record::TraceOn(on).encode(&mut encoded).unwrap();
            }
        }
        let p = d.path().join(format!("{mode}.itr"));
        let w = TraceWriter::create(&p, &header(mode, 1)).unwrap();
        let cfg = BufferConfig { mode, ncpu: 1, buffer_size: buffer, segment_size: segment, mte_size: 1 << 20 };
        let mut b = Buffers::new(cfg, w).unwrap();
        // Runs of 37 records' worth of bytes, cut at record boundaries.
        let mut at = 0;
        let mut refused = false;
        while at < encoded.len() && !refused {
            let (mut end, mut n) = (at, 0);
            for _ in 0..37 {
                if end < encoded.len() {
                    end += u16::from_ne_bytes([encoded[end], encoded[end + 1]]) as usize & 0xFFFC;
                    n += 1;
                }
            }
            refused = b.push_records(0, &encoded[at..end], n).unwrap() == Push::Full;
            at = end;
        }
        b.finish(Summary::default()).unwrap();
        let got = branches(&TraceFile::open(&p).unwrap());
        match mode {
            Mode::Continuous => assert_eq!(got, all),
            // 4000 bytes held 100 branch records of 40 bytes; compact ones, more.
            Mode::Normal => {
                assert!(refused);
                assert_eq!(got, all[..got.len()].to_vec());
                assert!(got.len() > 200 && got.len() < 500, "{}", got.len());
            }
            _ => assert_eq!(got, all[all.len() - got.len()..].to_vec()),
        }
    }
}

#[test]
fn raw_records_walk_whole_records_and_stop_at_damage() {
    let e = Endian::native();
    let mut bytes = Vec::new();
    Record::Branch(branch(1, 0)).encode(&mut bytes).unwrap();
    let second = bytes.len();
    Record::Lost(Lost { ts: 9, count: 3 }).encode(&mut bytes).unwrap();
    let end = bytes.len();
    let found: Vec<(usize, u16, usize)> =
        raw_records(e, &bytes).map(|r| r.unwrap()).map(|r| (r.offset, r.major, r.bytes.len())).collect();
    assert_eq!(found, vec![(0, major::BRANCH_USER, BRANCH_RECORD_LEN), (second, major::LOST, end - second)]);
    // A tail shorter than a header ends the walk quietly, at the last whole record.
    bytes.extend_from_slice(&[0, 0]);
    let mut walk = raw_records(e, &bytes);
    assert_eq!(walk.by_ref().count(), 2);
    assert_eq!(walk.offset(), end);
    // A length that runs past the end is damage, reported once at its offset.
    bytes.truncate(end - 4);
    let got: Vec<Result<usize, usize>> = raw_records(e, &bytes).map(|r| r.map(|r| r.offset)).collect();
    assert_eq!(got, vec![Ok(0), Err(second)]);
}

/// The chunks of a trace written by this crate's writer on this machine: (offset, payload
/// length), read with the documented layout (24-byte chunk headers after the 64-byte header).
fn chunk_offsets(b: &[u8]) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut off = HEADER_LEN;
    while off < b.len() {
        let len = u32::from_ne_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        v.push((off, len));
        off += CHUNK_HEADER_LEN + len;
    }
    v
}

fn open_bytes(dir: &Path, b: &[u8]) -> Result<TraceFile, FormatError> {
    let p = dir.join("damaged.itr");
    std::fs::write(&p, b).unwrap();
    // Strict: damage is an error, as `--strict` readers see it (others skip damaged chunks,
    // see tests/damaged.rs).
    TraceFile::open_strict(&p)
}

fn err_text(r: Result<TraceFile, FormatError>) -> String {
    match r {
        Ok(_) => panic!("damage went unnoticed"),
        Err(e) => e.to_string(),
    }
}

/// Every bit of the file header flipped: an error that says the header is damaged, naming
/// the byte when it is the byte order or the header length (the magic's bytes: not a trace).
#[test]
fn every_header_bit_flipped_is_a_damaged_header() {
    let d = fast_tempdir();
    let p = d.path().join("t.itr");
    record(&p, Mode::Continuous, 2, 0, 512, 50);
    let full = std::fs::read(&p).unwrap();
    for at in 0..HEADER_LEN {
        for bit in 0..8 {
            let mut b = full.clone();
            b[at] ^= 1 << bit;
            let r = open_bytes(d.path(), &b);
            let what = format!("bit {bit} of byte {at}");
            match (at, r) {
                (0..4, Err(FormatError::NotATrace { .. })) => {}
                (4, Err(e @ FormatError::HeaderDamaged { .. })) => {
                    assert!(e.to_string().contains("byte-order byte (offset 4) is"), "{what}: {e}")
                }
                (5, Err(e @ FormatError::HeaderDamaged { .. })) => {
                    assert!(e.to_string().contains("header-length byte (offset 5) is"), "{what}: {e}")
                }
                (6.., Err(e @ FormatError::HeaderDamaged { .. })) => {
                    assert!(
                        e.to_string().ends_with("the file header is damaged: its checksum does not match"),
                        "{what}: {e}"
                    )
                }
                (_, Err(e)) => panic!("{what}: unexpected error {e}"),
                (_, Ok(_)) => panic!("{what}: went unnoticed"),
            }
        }
    }
}

/// A flipped bit in the length of a chunk in the middle: corruption at that chunk, not a file
/// cut short (format 1.0 read the rest as records and dropped the later chunks, exit 0).
#[test]
fn a_damaged_chunk_length_is_corruption_at_its_chunk() {
    let d = fast_tempdir();
    let p = d.path().join("t.itr");
    record(&p, Mode::Continuous, 2, 0, 256, 1000);
    let full = std::fs::read(&p).unwrap();
    let chunks = chunk_offsets(&full);
    assert!(chunks.len() > 10);
    let (mid, _) = chunks[chunks.len() / 2];
    for bit in 0..32 {
        let mut b = full.clone();
        b[mid + 8 + bit / 8] ^= 1 << (bit % 8);
        assert_eq!(
            err_text(open_bytes(d.path(), &b)),
            format!("corrupt trace at offset {mid:#x}: the chunk header is damaged (its checksum does not match)"),
            "bit {bit} of the length"
        );
    }
}

/// A whole chunk missing, a chunk repeated, bytes after the end chunk: each an error at the
/// offset where the file stops making sense.
#[test]
fn missing_repeated_and_trailing_chunks_are_corruption() {
    let d = fast_tempdir();
    let p = d.path().join("t.itr");
    record(&p, Mode::Continuous, 2, 0, 512, 300);
    let full = std::fs::read(&p).unwrap();
    let chunks = chunk_offsets(&full);
    let (mid, len) = chunks[chunks.len() / 2];
    let end = mid + CHUNK_HEADER_LEN + len;
    let n = chunks.len() / 2;

    let missing = [&full[..mid], &full[end..]].concat();
    assert_eq!(
        err_text(open_bytes(d.path(), &missing)),
        format!(
            "corrupt trace at offset {mid:#x}: chunk number {} where chunk {n} belongs: chunks are missing or repeated",
            n + 1
        )
    );
    let repeated = [&full[..end], &full[mid..]].concat();
    assert_eq!(
        err_text(open_bytes(d.path(), &repeated)),
        format!(
            "corrupt trace at offset {end:#x}: chunk number {n} where chunk {} belongs: chunks are missing or repeated",
            n + 1
        )
    );
    for tail in [&b"x"[..], b"CHNK", &full[mid..end]] {
        let trailing = [&full[..], tail].concat();
        assert_eq!(
            err_text(open_bytes(d.path(), &trailing)),
            format!("corrupt trace at offset {:#x}: {} bytes after the end chunk", full.len(), tail.len())
        );
    }
}

/// Headers that check out but say what no writer of this version writes.
#[test]
fn implausible_header_fields_are_invalid() {
    let d = fast_tempdir();
    let p = d.path().join("h.itr");
    for (ncpu, flags, want) in [
        (0xFFFF, FLAG_ICOUNT, "CPU count 65535 (offset 14); 1 to 65533 expected"),
        (0, FLAG_ICOUNT, "CPU count 0 (offset 14); 1 to 65533 expected"),
        (2, FLAG_ICOUNT | 0x100, "unknown flag bits 0x100 (offset 16)"),
    ] {
        let mut h = header(Mode::Normal, ncpu);
        h.flags = flags;
        std::fs::write(&p, h.encode()).unwrap();
        assert_eq!(err_text(TraceFile::open(&p)), format!("{}: the file header is invalid: {want}", p.display()));
    }
}

/// A summary for another number of CPUs than the header's, a second record in the end chunk:
/// the file's own parts disagree.
#[test]
fn the_summary_must_match_the_header() {
    let d = fast_tempdir();
    let p = d.path().join("s.itr");
    for (summary_cpus, extra, want) in [
        (3, false, "the summary counts 3 CPUs, the file header 2"),
        (2, true, "a record after the summary in the end chunk"),
    ] {
        let mut w = TraceWriter::create(&p, &header(Mode::Normal, 2)).unwrap();
        let mut end = Vec::new();
        let s = Summary { ts: 5, records: vec![0; summary_cpus], lost: vec![0; summary_cpus], ..Default::default() };
        Record::Summary(s.clone()).encode(&mut end).unwrap();
        let first_len = end.len();
        if extra {
            Record::Summary(s).encode(&mut end).unwrap();
        }
        w.write_chunk(STREAM_END, 0, &end).unwrap();
        drop(w);
        let at = HEADER_LEN + CHUNK_HEADER_LEN + if extra { first_len } else { 0 };
        assert_eq!(err_text(TraceFile::open(&p)), format!("corrupt trace at offset {at:#x}: {want}"));
    }
}

/// A file whose header says 1.0 (major 1, no header checksum) is read with 1.0's 16-byte chunk
/// headers: a 3.0 file's chunks under such a header fail 1.0's chunk checksum at the first
/// chunk. (Real 1.0 files read: tests/tests/format_compat.rs.)
#[test]
fn a_3_0_file_under_a_1_0_header_is_corrupt_at_its_first_chunk() {
    let d = fast_tempdir();
    let p = d.path().join("t.itr");
    record(&p, Mode::Continuous, 1, 0, 512, 20);
    let mut b = std::fs::read(&p).unwrap();
    // The 1.0 header: the same fields, major 1, and zeros where 2.0 has its reserved word and CRC.
    b[6..8].copy_from_slice(&1u16.to_ne_bytes());
    b[56..64].fill(0);
    std::fs::write(&p, &b).unwrap();
    let t = TraceFile::open(&p);
    let err = err_text(t);
    assert!(err.starts_with("corrupt trace at offset 0x40: "), "{err}");
}

/// What is not a regular file is refused by its kind, at once: a FIFO without a writer would
/// block a plain open.
#[test]
fn directories_fifos_and_devices_are_refused_without_blocking() {
    let d = fast_tempdir();
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (path, kind) in
        [(d.path(), "a directory"), (fifo.as_path(), "a pipe or FIFO"), (Path::new("/dev/zero"), "a character device")]
    {
        assert_eq!(
            err_text(TraceFile::open(path)),
            format!("{} is {kind}, not a trace file (a trace is a regular file)", path.display())
        );
    }
}
