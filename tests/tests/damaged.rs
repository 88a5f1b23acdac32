//! A damaged trace reads around its damage (issue 27, part 4): one byte flipped in the middle
//! of a real trace loses that chunk only. The truth is the undamaged trace: its report, and its
//! `itrace dump` records that lie in the damaged chunk (their offsets are inside its bytes).
//! Also: `flamegraph` of a trace without instructions writes an empty graph, as the exports
//! write empty files (issue 27, part 6).

use itrace_tests::{itrace, program, record, test_dir};
use std::ffi::OsStr;
use std::fs;
use std::path::Path;

/// (offset, payload length, stream) of each chunk, read with the layout docs/trace-format.md
/// gives: a 64-byte file header, then chunks of a 24-byte header (stream at offset 4, payload
/// length at offset 8) and the payload, in this machine's byte order.
fn chunks_of(b: &[u8]) -> Vec<(usize, usize, u16)> {
    let mut v = Vec::new();
    let mut off = 64;
    while off < b.len() {
        let stream = u16::from_ne_bytes(b[off + 4..off + 6].try_into().unwrap());
        let len = u32::from_ne_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        v.push((off, len, stream));
        off += 24 + len;
    }
    v
}

fn report_json(trace: &Path, strict: bool) -> itrace_tests::Output {
    let mut args = vec![OsStr::new("report"), trace.as_os_str(), OsStr::new("--json")];
    if strict {
        args.push(OsStr::new("--strict"));
    }
    itrace(args)
}

/// What the records at file offsets `from..to` of `trace` hold, by `itrace dump`: (records,
/// taken branches, instructions). A branch line ends in `n=COUNT`; a trace-off record counts
/// its partial block (`icount: N`).
fn dumped(trace: &Path, from: usize, to: usize) -> (u64, u64, u64) {
    let out = itrace([OsStr::new("dump"), trace.as_os_str()]);
    out.assert_success();
    let (mut records, mut branches, mut instructions) = (0, 0, 0);
    for line in out.stdout.lines().filter(|l| !l.starts_with('#')) {
        let off = usize::from_str_radix(line.split(' ').next().unwrap().trim_start_matches("0x"), 16).unwrap();
        if !(from..to).contains(&off) {
            continue;
        }
        records += 1;
        if let Some(n) = line.rsplit_once(" n=").map(|(_, n)| n) {
            branches += 1;
            instructions += n.parse::<u64>().unwrap();
        } else if let Some((_, rest)) = line.split_once("icount: ") {
            instructions += rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse::<u64>().unwrap();
        }
    }
    (records, branches, instructions)
}

#[test]
fn one_flipped_byte_loses_one_chunk() {
    let dir = test_dir("damaged-one_byte");
    let trace = dir.join("t.itr");
    // 4K segments: fib's trace is many chunks.
    record(&trace, &["--segment-size", "4K"], &program("fib"), &[]).assert_success();
    let bytes = fs::read(&trace).unwrap();
    let cpu_chunks: Vec<(usize, usize, u16)> =
        chunks_of(&bytes).into_iter().filter(|&(_, _, stream)| stream < 0xFFFE).collect();
    assert!(cpu_chunks.len() >= 5, "expected several CPU chunks, got {}", cpu_chunks.len());
    let (off, len, stream) = cpu_chunks[cpu_chunks.len() / 2];
    let mut bad_bytes = bytes.clone();
    bad_bytes[off + 24 + len / 2] ^= 0x10;
    let bad = dir.join("bad.itr");
    fs::write(&bad, &bad_bytes).unwrap();

    let good = report_json(&trace, false);
    good.assert_success();
    let good: serde_json::Value = serde_json::from_str(&good.stdout).unwrap();
    let (records, branches, instructions) = dumped(&trace, off + 24, off + 24 + len);
    assert!(branches > 0 && instructions > 0, "the chunk at {off:#x} holds branches");

    // Read around the damage: exit 0, one warning that says where and what was lost.
    let out = report_json(&bad, false);
    out.assert_success();
    let warnings: Vec<&str> = out.stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "one warning line:\n{}", out.stderr);
    let want = format!(
        "itrace: warning: {} is damaged: 1 chunk skipped, {} bytes at {off:#x} (stream {stream}); lost there: \
         {records} records and {instructions} instructions (by the end summary's counts)",
        bad.display(),
        24 + len
    );
    assert!(warnings[0].starts_with(&want), "{}\nwanted it to start with\n{want}", warnings[0]);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let total = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    assert_eq!(total(&report, "total_instructions"), total(&good, "total_instructions") - instructions);
    assert_eq!(total(&report, "total_branches"), total(&good, "total_branches") - branches);
    // fib's one thread was inside main when the chunk was lost: its stack is cut, not carried.
    assert_eq!(report["stacks_cut_at_gaps"].as_u64(), Some(1), "{report:#}");
    assert!(good.get("stacks_cut_at_gaps").is_none());

    // --strict: the refusal of before.
    let strict = report_json(&bad, true);
    assert_eq!(
        strict.assert_clean_error(),
        format!(
            "itrace: cannot read {}: corrupt trace at offset {off:#x}: checksum mismatch in the {len}-byte chunk of \
             stream {stream}",
            bad.display()
        )
    );

    // `itrace info` lists the damaged chunk.
    let info = itrace([OsStr::new("info"), bad.as_os_str()]);
    info.assert_success();
    let listed = info.stdout.lines().skip_while(|l| !l.starts_with("damaged (skipped):")).nth(2).unwrap_or_default();
    let fields: Vec<&str> = listed.split_whitespace().collect();
    assert_eq!(
        fields[..4],
        [format!("{off:#x}"), (24 + len).to_string(), format!("cpu{stream}"), "1".into()],
        "{}",
        info.stdout
    );

    // The arc marks the gap where it is.
    let arc = itrace([OsStr::new("arc"), bad.as_os_str()]);
    arc.assert_success();
    let marks = arc.stdout.lines().filter(|l| l.contains("records lost to a damaged chunk")).count();
    assert_eq!(marks, 1, "one gap mark in the arc");
    let dump = itrace([OsStr::new("dump"), bad.as_os_str()]);
    dump.assert_success();
    let want = format!("# cpu{stream}: records lost to a damaged chunk before this point");
    assert_eq!(dump.stdout.lines().filter(|l| *l == want).count(), 1, "one gap mark in the dump");
}

/// A trace without instructions (the file header only: nothing was written after it): the
/// flame graph is an empty SVG and empty folded stacks, exit 0, as `export` writes empty files.
#[test]
fn flamegraph_of_an_empty_trace() {
    let dir = test_dir("damaged-empty_flamegraph");
    let trace = dir.join("t.itr");
    record(&trace, &[], &program("count_loop"), &[]).assert_success();
    let empty = dir.join("empty.itr");
    fs::write(&empty, &fs::read(&trace).unwrap()[..64]).unwrap();
    let svg = dir.join("empty.svg");
    let out = itrace([OsStr::new("flamegraph"), empty.as_os_str(), OsStr::new("-o"), svg.as_os_str()]);
    out.assert_success();
    let text = fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("not XML: {e}\n{text}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(out.stderr.contains("holds no instructions"), "{}", out.stderr);
    let folded = itrace([OsStr::new("flamegraph"), OsStr::new("--folded"), empty.as_os_str()]);
    folded.assert_success();
    assert_eq!(folded.stdout, "");
    let cg = itrace([OsStr::new("export"), OsStr::new("--format"), OsStr::new("callgrind"), empty.as_os_str()]);
    cg.assert_success();
}
