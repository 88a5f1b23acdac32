//! Collection modes with a buffer smaller than long_loop's trace (about
//! 200,000 taken branches in about 7 KiB): normal stops early, wrap keeps the
//! last blocks, continuous keeps everything.

use itrace_tests::{
    checked_arc, compare_lines, itrace_bin, program, record, report_json, require_tool, run, test_dir,
    trailing_comments, without_exit_kernel_line, ArcLine, Expected, Oracle, LONG_LOOP_INSTRUCTIONS,
};
use std::process::Command;
use std::sync::OnceLock;

const SMALL_BUFFER: &str = "4K";
const SMALL_SEGMENT: &str = "16K";

fn oracle() -> &'static Oracle {
    static O: OnceLock<Oracle> = OnceLock::new();
    O.get_or_init(|| {
        let o = Oracle::of(&program("long_loop"), &[]);
        assert_eq!(o.instructions, LONG_LOOP_INSTRUCTIONS);
        o
    })
}

/// long_loop recorded with `options`; `one_cpu`: itrace and the program pinned to CPU 0, so that
/// one CPU buffer holds the trace (long_loop's whole trace is about 7 KiB; two 4 KiB buffers,
/// one a CPU, could hold all of it).
fn trace_long_loop(test: &str, options: &[&str], one_cpu: bool) -> (std::path::PathBuf, String, Vec<ArcLine>) {
    let bin = program("long_loop");
    let dir = test_dir(test);
    let trace = dir.join("t.itr");
    let rec = if one_cpu {
        let mut cmd = Command::new(require_tool("taskset"));
        cmd.args(["-c", "0"]).arg(itrace_bin()).arg("record").arg("-o").arg(&trace).args(options);
        run(cmd.arg("--").arg(&bin))
    } else {
        record(&trace, options, &bin, &[])
    };
    rec.assert_success();
    assert!(
        rec.stdout.contains("long_loop: done"),
        "long_loop did not run to its end under itrace {options:?}; stdout:\n{}",
        rec.stdout
    );
    let (text, lines) = checked_arc(&trace, &dir.join("t.arc"));
    (trace, text, lines)
}

/// The small buffer held some blocks, and not the whole run's. (Not "far fewer": format 3.0
/// stores a run of one loop's branch in about 0.01 byte a record, so one 4 KiB buffer holds
/// about 95 k of long_loop's 201 k blocks; a CI run whose program ran on both CPUs kept 161 k
/// in two.)
fn assert_cut_short(lines: &[ArcLine], o: &Oracle) {
    assert!(!lines.is_empty(), "no blocks recorded");
    assert!(
        lines.len() < o.expected.len(),
        "a {SMALL_BUFFER} buffer held all {} of the run's blocks: the test needs a run that overflows it",
        o.expected.len()
    );
}

#[test]
fn normal_mode_stops_when_the_buffer_is_full() {
    let o = oracle();
    let (_, text, lines) = trace_long_loop("modes-normal", &["--mode", "normal", "--buffer-size", SMALL_BUFFER], true);
    let module = program("long_loop").to_string_lossy().into_owned();
    assert_cut_short(&lines, o);
    // the blocks are the first blocks of the run; a block cut short by the
    // full buffer may end it as an OTHER line
    let n = lines.len();
    let last = &lines[n - 1];
    let full = if last.type_code == 5 {
        let Expected::User { location, count, .. } = &o.expected[n - 1] else {
            panic!("oracle block {} is a K line", n - 1)
        };
        assert_eq!(&last.location(), location, "cut-short block start");
        assert!(last.count <= *count, "cut-short block longer than the oracle's");
        &lines[..n - 1]
    } else {
        &lines[..]
    };
    if let Err(e) = compare_lines(full, &o.expected[..full.len()], &module) {
        panic!("normal mode: the arc is not the start of the oracle's sequence: {e}");
    }
    let comments = trailing_comments(&text);
    assert!(
        comments.iter().any(|c| c.to_lowercase().contains("full")),
        "no closing comment saying the buffer is full; trailing comments: {comments:?}"
    );
}

#[test]
fn wrap_mode_keeps_the_last_blocks() {
    let o = oracle();
    let (trace, _, lines) = trace_long_loop("modes-wrap", &["--mode", "wrap", "--buffer-size", SMALL_BUFFER], true);
    let module = program("long_loop").to_string_lossy().into_owned();
    let lines = without_exit_kernel_line(&lines);
    assert_cut_short(lines, o);
    let tail = &o.expected[o.expected.len() - lines.len()..];
    if let Err(e) = compare_lines(lines, tail, &module) {
        panic!("wrap mode: the arc is not the end of the oracle's sequence: {e}");
    }
    let report = report_json(&trace);
    assert!(
        report["lost_records"].as_u64().unwrap_or(0) > 0,
        "wrap mode overwrote records but reports lost_records = {}",
        report["lost_records"]
    );
}

#[test]
fn continuous_mode_keeps_everything() {
    let o = oracle();
    let (trace, _, lines) = trace_long_loop(
        "modes-continuous",
        &["--mode", "continuous", "--buffer-size", SMALL_BUFFER, "--segment-size", SMALL_SEGMENT],
        false,
    );
    let module = program("long_loop").to_string_lossy().into_owned();
    if let Err(e) = compare_lines(without_exit_kernel_line(&lines), &o.expected, &module) {
        panic!("continuous mode: the arc differs from the oracle: {e}");
    }
    assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), LONG_LOOP_INSTRUCTIONS);
    let report = report_json(&trace);
    assert_eq!(report["lost_records"].as_u64(), Some(0), "lost_records");
    assert_eq!(report["total_instructions"].as_u64(), Some(LONG_LOOP_INSTRUCTIONS));
}
