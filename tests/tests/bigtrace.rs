//! Long traces: reading one takes memory bounded by its distinct call stacks, not by its length.
//!
//! calls_loop runs the same three-deep calls ROUNDS times, recorded with `--backend qemu` for
//! a short run and a run ten times longer. `itrace report --json`, `flamegraph --folded` and
//! `export --format callgrind` of each: the longer run's trace is about ten times the bytes,
//! yet each command's peak resident memory (the kernel's ru_maxrss from wait4, which counts
//! the pages of the mapped trace that the reader touched) stays within a small margin of the
//! short run's; the folded stacks are the same ones; and the calls are the hand count
//! (cl_top once a round, cl_mid and cl_leaf twice), so both reads are whole.

use itrace_tests::{itrace_bin, program, record, require_tool, test_dir};
use std::collections::BTreeSet;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SHORT_ROUNDS: u64 = 300_000;
const LONG_ROUNDS: u64 = 10 * SHORT_ROUNDS;
/// How much more a long run's read may hold than the short run's: a fifth, plus this many KiB
/// (the reader lets a mapped trace's pages go every 8 MiB it reads).
const MARGIN_KB: u64 = 12 * 1024;

/// The peak resident memory (KiB) of `itrace ARGS`, whose stdout goes to `out`.
fn max_rss_kb(args: &[&str], trace: &Path, out: &Path) -> u64 {
    let mut cmd = Command::new(itrace_bin());
    cmd.args(args).arg(trace).stdin(Stdio::null());
    cmd.stdout(File::create(out).expect("create the output file"));
    cmd.stderr(File::create(out.with_extension("stderr")).expect("create the stderr file"));
    // Reaped by the wait4 below, which also says the child's peak memory (Child::wait does not).
    #[allow(clippy::zombie_processes)]
    let pid = cmd.spawn().expect("start itrace").id() as libc::pid_t;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let mut status = 0;
        // SAFETY: rusage is plain data that wait4 fills in; all-zero is a valid value of it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child, with pointers to two live locals; WNOHANG so that
        // the hang guard below runs.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
        if r == pid {
            let stderr = std::fs::read_to_string(out.with_extension("stderr")).unwrap_or_default();
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "itrace {args:?} {} failed (status {status:#x}): {stderr}",
                trace.display()
            );
            return usage.ru_maxrss as u64;
        }
        assert!(Instant::now() < deadline, "hang guard: itrace {args:?} still running after 600 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The calls of `name` in a report.
fn calls(report: &serde_json::Value, name: &str) -> u64 {
    report["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in the report"))["calls"]
        .as_u64()
        .expect("calls")
}

/// The stacks of a folded flame graph (each line's text before its count).
fn folded_stacks(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).expect("read the folded stacks");
    text.lines().map(|l| l.rsplit_once(' ').expect("STACK COUNT").0.to_string()).collect()
}

#[test]
fn reading_a_ten_times_longer_trace_takes_no_more_memory() {
    require_tool("qemu-x86_64");
    let dir = test_dir("bigtrace");
    let prog = program("calls_loop");
    let mut runs = Vec::new();
    for rounds in [SHORT_ROUNDS, LONG_ROUNDS] {
        let trace = dir.join(format!("{rounds}.itr"));
        record(&trace, &["--backend", "qemu"], &prog, &[&rounds.to_string()]).assert_success();
        let bytes = std::fs::metadata(&trace).expect("trace").len();
        let mut rss = Vec::new();
        for (what, args) in [
            ("report", &["report", "--json"][..]),
            ("folded", &["flamegraph", "--folded"][..]),
            ("callgrind", &["export", "--format", "callgrind"][..]),
        ] {
            let out = dir.join(format!("{rounds}.{what}"));
            rss.push((what, max_rss_kb(args, &trace, &out)));
        }
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{rounds}.report"))).expect("report"))
                .expect("the report is JSON");
        assert_eq!(calls(&report, "cl_top"), rounds, "{rounds} rounds: calls of cl_top");
        assert_eq!(calls(&report, "cl_mid"), 2 * rounds, "{rounds} rounds: calls of cl_mid");
        assert_eq!(calls(&report, "cl_leaf"), 2 * rounds, "{rounds} rounds: calls of cl_leaf");
        let stacks = folded_stacks(&dir.join(format!("{rounds}.folded")));
        eprintln!("{rounds} rounds: {bytes} bytes of trace, {} stacks, max RSS KiB {rss:?}", stacks.len());
        runs.push((bytes, stacks, rss));
    }
    let (short, long) = (&runs[0], &runs[1]);
    assert!(long.0 >= 8 * short.0, "the long run's trace ({} bytes) is not ~10x the short one's ({})", long.0, short.0);
    assert_eq!(long.1, short.1, "the long run's call stacks differ from the short run's");
    for ((what, short_kb), (_, long_kb)) in short.2.iter().zip(&long.2) {
        assert!(
            *long_kb <= short_kb + short_kb / 5 + MARGIN_KB,
            "{what}: {long_kb} KiB at most for a {}-byte trace, against {short_kb} KiB for {} bytes: \
             memory grows with the trace's length",
            long.0,
            short.0
        );
    }
}
