//! A trace cut while a thread's records were spread over two CPU streams (the translating
//! recorder moves a lone traced thread to the CPU itrace runs on). Each CPU stream is read up
//! to its own end, so a cut leaves streams that end at different times: a thread whose records
//! go on on another CPU after the end of the stream it was on may have run on that stream in
//! what was cut off. The arc must not join its blocks across that hole (the block after it
//! would start where the thread last was, with the instructions of another place), while a
//! thread that moved before that end moved for real and keeps its blocks joined.
//!
//! The truth is the list of records written here by hand: which of them the cut file still
//! holds is read from `itrace_format`'s raw stream reads, and every arc line is checked
//! against the record it comes from.

use itrace_format::*;
use itrace_post::arc;
use std::path::Path;

const PID: u32 = 7;
const MOVER: u32 = 7;
const OTHER: u32 = 9;
const MODULE: &str = "/no/such/prog";
const BASE: u64 = 0x10000;

fn header() -> FileHeader {
    FileHeader::starting_now(Arch::X86_64, Mode::Continuous, StepMethod::Translated, 2, FLAG_ICOUNT, 0, 0)
}

/// Branch `i` of thread `tid`: each from a place of its own (so that the compact encoding
/// spends about as many bytes on each and a cut in the middle of a chunk keeps about half),
/// to the place the next one of the same thread starts.
fn branch(ts: u64, tid: u32, i: u64) -> Record {
    let from = BASE + u64::from(tid) * 0x1000 + i * 0x10 + 4;
    let to = BASE + u64::from(tid) * 0x1000 + (i + 1) * 0x10;
    Record::Branch(Branch { icount: 2 + (i % 3) as u32, ..Branch::user(ts, tid, from, to, BranchKind::Jump, 0, 0) })
}

/// Writes the trace: the MTE chunk, CPU 0's chunk, CPU 1's, and the end summary. Returns the file offset and length of CPU 1's payload.
fn write(path: &Path, cpu0: &[Record], cpu1: &[Record]) -> (usize, usize) {
    let mut w = TraceWriter::create(path, &header()).unwrap();
    let mut mte = Vec::new();
    for r in [
        Record::Mte(Mte::Segment {
            ts: 1,
            pid: PID,
            prot: 5,
            start: BASE,
            end: BASE + 0x10000,
            offset: 0,
            path: MODULE.into(),
        }),
        Record::Mte(Mte::ProcessName { ts: 1, pid: PID, ppid: 1, name: "prog".into() }),
        Record::Mte(Mte::ThreadName { ts: 1, pid: PID, tid: OTHER, name: "other".into() }),
    ] {
        r.encode(&mut mte).unwrap();
    }
    w.write_chunk(STREAM_MTE, 0, &mte).unwrap();
    w.write_chunk(0, 0, &compact::encode_chunk(cpu0).unwrap()).unwrap();
    let cpu1_payload = compact::encode_chunk(cpu1).unwrap();
    w.write_chunk(1, 0, &cpu1_payload).unwrap();
    w.sync().unwrap();
    let cpu1_end = std::fs::metadata(path).unwrap().len() as usize;
    let records = vec![cpu0.len() as u64, cpu1.len() as u64];
    let summary = Summary { ts: 1000, records, lost: vec![0, 0], mte_records: 3, ..Default::default() };
    let mut payload = Vec::new();
    Record::Summary(summary).encode(&mut payload).unwrap();
    w.write_chunk(STREAM_END, 0, &payload).unwrap();
    w.sync().unwrap();
    (cpu1_end - cpu1_payload.len(), cpu1_payload.len())
}

/// The records of `stream` that the reader hands out, raw.
fn stream_records(path: &Path, stream: StreamId) -> Vec<Record> {
    let f = TraceFile::open(path).unwrap();
    f.stream(stream).map(|r| r.unwrap().1).collect()
}

/// One arc line: cpu, type code, instruction count, module offset of the block's start (the
/// module has no symbols: `<unknown>` at its offset), thread.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Line {
    cpu: u16,
    type_code: u8,
    count: u32,
    start: u64,
}

/// The arc of `path`: its block lines and its comment lines about cut streams.
fn arc_of(path: &Path) -> (Vec<Line>, Vec<String>) {
    let trace = itrace_post::open(path).unwrap();
    let mut out = Vec::new();
    arc::write_arc(&trace, &mut out, &mut |_| {}).unwrap();
    let text = String::from_utf8(out).unwrap();
    let marks = text.lines().filter(|l| l.contains("the trace was cut")).map(str::to_string).collect();
    let lines = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f[6], format!("<unknown>:{MODULE}"), "{l}");
            Line {
                cpu: f[0].parse().unwrap(),
                type_code: f[2].parse().unwrap(),
                count: f[3].parse().unwrap(),
                start: u64::from_str_radix(f[5], 16).unwrap(),
            }
        })
        .collect();
    (lines, marks)
}

/// What the arc line of branch record `b` is, its block starting at `start` (an address).
fn line_of(cpu: u16, b: &Record, start: u64) -> Line {
    let Record::Branch(b) = b else { panic!("not a branch: {b:?}") };
    Line { cpu, type_code: 3, count: b.icount, start: start - BASE }
}

fn from_of(r: &Record) -> u64 {
    match r {
        Record::Branch(b) => b.from,
        r => panic!("not a branch: {r:?}"),
    }
}

fn to_of(r: &Record) -> u64 {
    match r {
        Record::Branch(b) => b.to,
        r => panic!("not a branch: {r:?}"),
    }
}

/// The thread runs 40 blocks on CPU 1, then 40 on CPU 0; the file is cut in the middle of
/// CPU 1's chunk (written last). CPU 1 keeps its first records only: what the thread did
/// after them until its first record on CPU 0 is unknown. The arc shows CPU 1's records,
/// a line saying the stream ends early, and CPU 0's records with the first block placed at
/// its branch, as at the start of a trace, never starting where the thread was on CPU 1.
#[test]
fn a_thread_that_moved_after_the_cut_is_not_joined_across_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moved.itr");
    let on_cpu1: Vec<Record> = (0..40).map(|i| branch(100 + i, MOVER, i)).collect();
    let on_cpu0: Vec<Record> = (40..80).map(|i| branch(100 + i, MOVER, i)).collect();
    let (cpu1_at, cpu1_len) = write(&path, &on_cpu0, &on_cpu1);

    // Uncut: 80 blocks, each starting where the one before went, no mark.
    let (full, marks) = arc_of(&path);
    assert!(marks.is_empty(), "{marks:?}");
    let mut want: Vec<Line> = vec![line_of(1, &on_cpu1[0], from_of(&on_cpu1[0]))];
    let all: Vec<(u16, &Record)> = on_cpu1.iter().map(|r| (1, r)).chain(on_cpu0.iter().map(|r| (0, r))).collect();
    want.extend(all.windows(2).map(|w| line_of(w[1].0, w[1].1, to_of(w[0].1))));
    assert_eq!(full, want);

    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.itr");
    std::fs::write(&cut, &bytes[..cpu1_at + cpu1_len / 2]).unwrap();
    let kept = stream_records(&cut, 1);
    assert!(kept.len() > 5 && kept.len() < 35, "a cut in the middle keeps some of CPU 1's 40 records: {}", kept.len());
    assert_eq!(kept[..], on_cpu1[..kept.len()], "what is kept is the start of what was written");
    assert_eq!(stream_records(&cut, 0), on_cpu0, "CPU 0's chunk is whole");

    let (part, marks) = arc_of(&cut);
    assert_eq!(marks.len(), 1, "one mark where CPU 1's stream ends: {marks:?}");
    assert!(marks[0].starts_with("# cpu 1:") && marks[0].contains(&format!("thread {MOVER} ")), "{}", marks[0]);
    let mut want: Vec<Line> = full[..kept.len()].to_vec();
    // After the hole: the first block at its branch, the others joined.
    want.push(line_of(0, &on_cpu0[0], from_of(&on_cpu0[0])));
    want.extend(on_cpu0.windows(2).map(|w| line_of(0, &w[1], to_of(&w[0]))));
    assert_eq!(part, want);
}

/// The thread moves from CPU 1 to CPU 0 early, while another thread goes on on CPU 1 past the
/// cut: CPU 1's records up to its end are all there, so the move is a real one and the
/// thread's first block on CPU 0 starts where its last on CPU 1 went, as in the uncut arc.
#[test]
fn a_thread_that_moved_before_the_cut_keeps_its_blocks_joined() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("early.itr");
    // Thread 7 on CPU 1 at even times 100..118, then on CPU 0 at 120..198; thread 9 on CPU 1
    // at odd times 101..179.
    let mover_cpu1: Vec<Record> = (0..10).map(|i| branch(100 + 2 * i, MOVER, i)).collect();
    let on_cpu0: Vec<Record> = (10..50).map(|i| branch(100 + 2 * i, MOVER, i)).collect();
    let other: Vec<Record> = (0..40).map(|i| branch(101 + 2 * i, OTHER, i)).collect();
    let mut on_cpu1: Vec<Record> = mover_cpu1.iter().chain(&other).cloned().collect();
    on_cpu1.sort_by_key(Record::ts);
    let (cpu1_at, cpu1_len) = write(&path, &on_cpu0, &on_cpu1);
    // The uncut arc: a line per record in time order.
    let (full, marks) = arc_of(&path);
    assert!(marks.is_empty(), "{marks:?}");
    let mut in_time: Vec<(u16, &Record)> =
        on_cpu1.iter().map(|r| (1, r)).chain(on_cpu0.iter().map(|r| (0, r))).collect();
    in_time.sort_by_key(|(_, r)| r.ts());
    assert_eq!(full.len(), in_time.len());

    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.itr");
    std::fs::write(&cut, &bytes[..cpu1_at + cpu1_len / 2]).unwrap();
    let kept = stream_records(&cut, 1);
    assert_eq!(kept[..], on_cpu1[..kept.len()], "what is kept is the start of what was written");
    let cpu1_end = kept.last().map(Record::ts).unwrap();
    assert!(cpu1_end > on_cpu0[0].ts(), "the cut falls after the move: CPU 1 ends at {cpu1_end}");
    assert!(kept.len() < on_cpu1.len());

    // The cut arc: the uncut arc's lines of the records still there, the same in every field
    // (thread 7's first block on CPU 0 included), and no mark.
    let (part, marks) = arc_of(&cut);
    assert!(marks.is_empty(), "{marks:?}");
    let want: Vec<Line> =
        full.iter().zip(&in_time).filter(|(_, (cpu, r))| *cpu == 0 || r.ts() <= cpu1_end).map(|(l, _)| *l).collect();
    assert_eq!(part, want);
    let mover_first_on_cpu0 = line_of(0, &on_cpu0[0], to_of(&mover_cpu1[9]));
    assert!(part.contains(&mover_first_on_cpu0), "{part:?}");
}
