//! Inputs the fuzz targets (fuzz/) found that broke post-processing, rebuilt here as small
//! traces written through the format crate: each must give an arc and a report, not a panic.

use itrace_format::*;
use itrace_post::{arc, report};
use std::path::Path;

fn header(ncpu: u16) -> FileHeader {
    FileHeader::starting_now(Arch::X86_64, Mode::Wrap, StepMethod::PtraceSingleStep, ncpu, FLAG_ICOUNT, 4096, 0)
}

/// An MTE or end chunk's payload (CPU chunks are compact: `compact::encode_chunk`).
fn chunk(records: &[Record]) -> Vec<u8> {
    let mut payload = Vec::new();
    for r in records {
        r.encode(&mut payload).unwrap();
    }
    payload
}

fn write(path: &Path, ncpu: u16, cpu0: &[Record], summary: Summary) {
    let mut w = TraceWriter::create(path, &header(ncpu)).unwrap();
    w.write_chunk(0, CHUNK_FLAG_WRAPPED, &compact::encode_chunk(cpu0).unwrap()).unwrap();
    w.write_chunk(STREAM_END, 0, &chunk(&[Record::Summary(summary)])).unwrap();
    w.sync().unwrap();
}

/// fuzz/ report and arc: lost-record counts that add up past u64::MAX (a damaged summary or
/// Lost records) overflowed the sum ("attempt to add with overflow" in a debug build). They
/// now stop at u64::MAX.
#[test]
fn lost_counts_past_u64_max_saturate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lost.itr");
    let lost = |ts| Record::Lost(Lost { ts, count: u64::MAX - 1 });
    let summary = Summary { ts: 10, records: vec![2, 0], lost: vec![u64::MAX, 1], ..Default::default() };
    write(&path, 2, &[lost(1), lost(2)], summary);

    let trace = itrace_post::open(&path).unwrap();
    let r = report::build(&trace, &mut |_| {}).unwrap();
    assert_eq!(r.lost_records, u64::MAX);

    let mut out = Vec::new();
    arc::write_arc(&trace, &mut out, &mut |_| {}).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains(&format!("{} records lost", u64::MAX)), "{text}");
}

/// fuzz/ arc: a newline in a module path (a file name may hold one) or in a JIT symbol broke
/// an arc line in two, and a terminal escape in a process name went out as it was. Names are
/// now written with such characters escaped (`\n`, `\u{1b}`): every arc line keeps the
/// layout of docs/arc-and-report.md, and the text report's rows stay one line each.
#[test]
fn control_characters_in_names_stay_inside_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("names.itr");
    let mut w = TraceWriter::create(&path, &header(1)).unwrap();
    let (start, end, path_name) = (0x1000, 0x2000, "/no/such\nfile x");
    let mte = [
        Record::Mte(Mte::Segment { ts: 1, pid: 7, prot: 5, start, end, offset: 0, path: path_name.into() }),
        Record::Mte(Mte::JitSymbol { ts: 1, pid: 7, start: 0x3000, size: 0x100, name: "jit\r\nsym".into() }),
        Record::Mte(Mte::ProcessName { ts: 1, pid: 7, ppid: 1, name: "pro\u{1b}[2Jcess".into() }),
        Record::Mte(Mte::ThreadName { ts: 1, pid: 7, tid: 7, name: "thre\u{2028}ad".into() }),
    ];
    w.write_chunk(STREAM_MTE, 0, &chunk(&mte)).unwrap();
    let branch =
        |ts, from, to, kind, icount| Record::Branch(Branch { icount, ..Branch::user(ts, 7, from, to, kind, 0, 0) });
    let cpu = [
        Record::TraceOn(TraceOn { ts: 2, reason: TraceOnReason::Start, pid: 7, tid: 7, pc: 0x1000 }),
        branch(3, 0x1010, 0x3000, BranchKind::Call, 3),
        branch(4, 0x3010, 0x1020, BranchKind::Return, 2),
        Record::TraceOff(TraceOff {
            ts: 5,
            reason: StopReason::Signaled,
            pid: 7,
            tid: 7,
            pc: 0x1030,
            icount: 1,
            value: 11,
        }),
    ];
    w.write_chunk(0, 0, &compact::encode_chunk(&cpu).unwrap()).unwrap();
    w.sync().unwrap();
    let trace = itrace_post::open(&path).unwrap();

    let mut out = Vec::new();
    let stats = arc::write_arc(&trace, &mut out, &mut |_| {}).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len() as u64, stats.lines, "{text}");
    for l in &lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert!(f.len() >= 10 && f[4] == "@" && f[f.len() - 1] == "0", "not an arc line: {l:?}\n{text}");
    }
    assert!(text.contains("<unknown>:/no/such\\nfile x   7_7_pro\\u{1b}[2Jcess_thre-ad CALL 0"), "{text}");
    assert!(text.contains(" jit\\r\\nsym:JITCODE "), "{text}");
    assert!(!text.chars().any(|c| c != '\n' && c.is_control()), "{text}");

    let r = report::build(&trace, &mut |_| {}).unwrap();
    let mut out = Vec::new();
    r.write_text(&mut out, &Default::default()).unwrap();
    let table = String::from_utf8(out).unwrap();
    assert!(table.contains("/no/such\\nfile x") && table.contains("thre\\u{2028}ad"), "{table}");
    assert!(!table.chars().any(|c| c != '\n' && (c.is_control() || c == '\u{2028}')), "{table}");
    // The JSON report keeps the names whole (JSON escapes them itself).
    let mut out = Vec::new();
    r.write_json(&mut out).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(json["modules"].as_array().unwrap().iter().filter(|m| m["module"] == path_name).count(), 1, "{json}");
}
