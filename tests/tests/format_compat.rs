//! Format 3.0 (the compact encoding) against format 2.0 (40-byte branch records). The truth
//! is what itrace 9109344, the last to write 2.0, wrote and dumped: `tests/data/format-2.0/`
//! holds count_loop recorded by it with three backends, and each file's `itrace dump` by it.
//! - Today's itrace reads those files and dumps them byte for byte as that itrace did; the same
//!   for a format 1.0 file written and dumped by itrace df41df4 (`tests/data/format-1.0/`).
//! - Their records, written again in format 3.0 (every mode, compressed or not), read back
//!   equal, field for field, timestamps included: the encoding loses nothing.
//! - count_loop recorded today with the same backends gives the same CPU records as the 2.0
//!   recording (timestamps, pids and file offsets aside: they differ from run to run).

use itrace_format::{
    BufferConfig, Buffers, FileHeader, Mode, Record, StreamId, TraceFile, TraceWriter, STREAM_MTE, VERSION_MAJOR,
};
use itrace_tests::{itrace, program, record, require_tool, test_dir};
use std::path::{Path, PathBuf};

const BACKENDS: [(&str, &[&str]); 3] =
    [("ptrace", &["--backend", "ptrace"]), ("qemu", &["--backend", "qemu"]), ("gdb", &["--qemu", "x86_64"])];
/// The same, compressed (`--compress`), for the backends that write in itrace's process and in
/// the qemu plugin's.
const COMPRESSED: [(&str, &[&str]); 2] =
    [("ptrace", &["--backend", "ptrace", "--compress"]), ("qemu", &["--backend", "qemu", "--compress"])];

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/format-2.0").join(name)
}

fn dump(trace: &Path) -> String {
    let o = itrace([Path::new("dump").as_os_str(), trace.as_os_str()]);
    o.assert_success();
    o.stdout
}

#[test]
fn format_2_0_files_dump_as_the_itrace_that_wrote_them() {
    for (name, _) in BACKENDS {
        let want = std::fs::read_to_string(data(&format!("{name}.dump"))).unwrap();
        assert!(want.starts_with("# itrace trace v2.0 "), "{name}.dump is not of a 2.0 file");
        let got = dump(&data(&format!("{name}.itr")));
        assert!(got == want, "{name}.itr: itrace dump differs from the 2.0 itrace's:\n{}", first_diff(&got, &want));
    }
}

/// The format 1.0 file (16-byte chunk headers, no header checksum) too, and its CPU records are
/// those the 2.0 itrace recorded of the same program.
#[test]
fn format_1_0_file_dumps_as_the_itrace_that_wrote_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/format-1.0");
    let want = std::fs::read_to_string(dir.join("ptrace.dump")).unwrap();
    assert!(want.starts_with("# itrace trace v1.0 "), "ptrace.dump is not of a 1.0 file");
    let got = dump(&dir.join("ptrace.itr"));
    assert!(got == want, "1.0 ptrace.itr: itrace dump differs from the 1.0 itrace's:\n{}", first_diff(&got, &want));
    let v2 = std::fs::read_to_string(data("ptrace.dump")).unwrap();
    assert_eq!(cpu_lines(&got), cpu_lines(&v2), "the 1.0 and 2.0 recordings of count_loop");
}

fn first_diff(got: &str, want: &str) -> String {
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        if g != w {
            return format!("line {}:\n  got:  {g}\n  want: {w}", i + 1);
        }
    }
    format!("{} lines against {}", got.lines().count(), want.lines().count())
}

/// Each stream's records, in order.
fn streams(t: &TraceFile) -> Vec<(StreamId, Vec<Record>)> {
    let mut ids: Vec<StreamId> =
        t.chunks().iter().map(|c| c.stream).filter(|&s| s != itrace_format::STREAM_END).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter().map(|id| (id, t.stream(id).map(|r| r.unwrap().1).collect())).collect()
}

/// Write `t`'s records again through the recorders' buffers, in format 3.0.
fn rewrite(t: &TraceFile, out: &Path, mode: Mode, buffer: usize, segment: usize, compress: bool) {
    let h = t.header();
    let header = FileHeader { version_major: VERSION_MAJOR, mode, ..h.clone() };
    let mut w = TraceWriter::create(out, &header).unwrap();
    if compress {
        w.compress(3);
    }
    let cfg =
        BufferConfig { mode, ncpu: h.ncpu as usize, buffer_size: buffer, segment_size: segment, mte_size: 64 << 20 };
    let mut b = Buffers::new(cfg, w).unwrap();
    for (id, recs) in streams(t) {
        for r in recs {
            match (&r, id) {
                (_, STREAM_MTE) => assert_eq!(b.push_mte(&r).unwrap(), itrace_format::Push::Stored),
                (Record::Branch(br), cpu) => {
                    assert_eq!(b.push_branch(cpu as usize, br).unwrap(), itrace_format::Push::Stored)
                }
                (_, cpu) => b.push_control(cpu as usize, &r).unwrap(),
            }
        }
    }
    b.finish(t.summary().cloned().unwrap_or_default()).unwrap();
}

#[test]
fn format_2_0_records_written_as_3_0_read_back_equal() {
    let dir = test_dir("format-compat-rewrite");
    for (name, _) in BACKENDS {
        let old = TraceFile::open(&data(&format!("{name}.itr"))).unwrap();
        assert_eq!(old.header().version_major, 2);
        let want = streams(&old);
        let branches: usize = want.iter().filter(|(id, _)| *id < old.header().ncpu).map(|(_, r)| r.len()).sum();
        assert!(branches > 1000, "{name}: {branches} CPU records");
        for (mode, buffer, segment, compress) in [
            (Mode::Continuous, 0, 256, false),
            (Mode::Continuous, 0, 1 << 20, true),
            (Mode::Normal, 64 << 20, 1 << 20, false),
            (Mode::Wrap, 1 << 20, 1 << 20, false),
        ] {
            let p = dir.join(format!("{name}-{mode}-{compress}.itr"));
            rewrite(&old, &p, mode, buffer, segment, compress);
            let new = TraceFile::open(&p).unwrap();
            assert_eq!(new.header().version_major, 3);
            let what = format!("{name} rewritten in {mode} mode, segments of {segment}, compressed {compress}");
            assert_eq!(streams(&new), want, "{what}");
            let old_size = std::fs::metadata(data(&format!("{name}.itr"))).unwrap().len();
            let new_size = std::fs::metadata(&p).unwrap().len();
            assert!(new_size < old_size, "{what}: {new_size} bytes, the 2.0 file {old_size}");
        }
    }
}

/// A dump's CPU-stream lines without what differs between two runs of the same program: the
/// file offset, the CPU number, timestamps, pids and tids.
fn cpu_lines(dump: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in dump.lines() {
        let mut f = line.splitn(3, ' ');
        let (_offset, stream, rest) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if !stream.starts_with("cpu") {
            continue;
        }
        let mut words: Vec<String> = rest.split(' ').map(str::to_string).collect();
        if words.first().is_some_and(|w| w.chars().all(|c| c.is_ascii_digit())) {
            words.remove(0); // a branch's timestamp
        }
        let mut s = words.join(" ");
        for key in ["ts: ", "pid: ", "tid: ", "tid="] {
            while let Some(at) = s.find(key).filter(|&at| s[at + key.len()..].starts_with(|c: char| c.is_ascii_digit()))
            {
                let end = at
                    + key.len()
                    + s[at + key.len()..].find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len() - at - key.len());
                s.replace_range(at + key.len()..end, "N");
            }
        }
        out.push(s);
    }
    out
}

#[test]
fn each_backend_records_what_format_2_0_held() {
    require_tool("qemu-x86_64");
    let dir = test_dir("format-compat-backends");
    let prog = program("count_loop");
    for (i, (name, options)) in BACKENDS.into_iter().chain(COMPRESSED).enumerate() {
        let trace = dir.join(format!("{name}-{i}.itr"));
        record(&trace, options, &prog, &[]).assert_success();
        let got = dump(&trace);
        assert!(got.starts_with("# itrace trace v3.0 "), "{name}: {}", got.lines().next().unwrap_or(""));
        let want = cpu_lines(&std::fs::read_to_string(data(&format!("{name}.dump"))).unwrap());
        assert_eq!(want.len(), 1005, "{name}.dump: count_loop's 1003 blocks, its trace-on and trace-off");
        let got = cpu_lines(&got);
        assert!(
            got == want,
            "{name}: the CPU records differ from format 2.0's:\n{}",
            first_diff(&got.join("\n"), &want.join("\n"))
        );
        let size = std::fs::metadata(&trace).unwrap().len();
        let old = std::fs::metadata(data(&format!("{name}.itr"))).unwrap().len();
        assert!(size < old, "{name}: {size} bytes in format 3.0, {old} in 2.0");
    }
}

/// `itrace info` on count_loop: the hand count of its taken branches (1003, count_loop.S) and
/// records (with its trace-on and trace-off), bytes per branch as the file's size says.
#[test]
fn info_says_what_the_trace_holds() {
    let dir = test_dir("format-compat-info");
    let trace = dir.join("t.itr");
    record(&trace, &[], &program("count_loop"), &[]).assert_success();
    let o = itrace([Path::new("info").as_os_str(), trace.as_os_str()]);
    o.assert_success();
    let text = o.stdout;
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(text.contains(&format!("({size} bytes)")), "{text}");
    assert!(text.contains("format 3.0"), "{text}");
    let line = text.lines().find(|l| l.starts_with("taken branches: ")).expect(&text);
    assert!(line.starts_with("taken branches: 1003;"), "{line}");
    let whole = format!("{:.2} for the whole file", size as f64 / 1003.0);
    assert!(line.ends_with(&whole), "{line}, want {whole}");
    // The kinds' records add up to the CPU stream's 1005.
    let kinds: u64 = text
        .lines()
        .skip_while(|l| !l.starts_with("CPU records by kind"))
        .skip(2)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().rev().nth(3).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(kinds, 1005, "{text}");
}
