//! Inputs the fuzz targets (fuzz/) found that broke post-processing, rebuilt here as small
//! traces written through the format crate: each must give an arc and a report, not a panic.

use itrace_format::*;
use itrace_post::{arc, report};
use std::path::Path;

fn header(ncpu: u16) -> FileHeader {
    FileHeader::starting_now(Arch::X86_64, Mode::Wrap, StepMethod::PtraceSingleStep, ncpu, FLAG_ICOUNT, 4096, 0)
}

fn chunk(records: &[Record]) -> Vec<u8> {
    let mut payload = Vec::new();
    for r in records {
        r.encode(&mut payload).unwrap();
    }
    payload
}

fn write(path: &Path, ncpu: u16, cpu0: &[Record], summary: Summary) {
    let mut w = TraceWriter::create(path, &header(ncpu)).unwrap();
    w.write_chunk(0, CHUNK_FLAG_WRAPPED, &chunk(cpu0)).unwrap();
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
