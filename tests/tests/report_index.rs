//! The index beside a trace (`TRACE.itrace-idx`, post-arc/src/summary.rs): what a report of the
//! trace added up, kept so that the next report (or flame graph) does not replay the trace.
//!
//! Truth: the replay, `itrace report --no-index` (checked against callgrind, qemu's logs and
//! hand counts by views.rs, calltree.rs, exact_counts.rs). The report written from the index
//! must be the replay's, byte for byte, for every view; and whenever something the answer
//! depends on changed (the trace rewritten, the program rebuilt, a debug file put where it is
//! looked for, the index itself damaged), the answer must be the fresh replay's, never the
//! index's.

use itrace_tests::{program, record, require_tool, run, test_dir};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `itrace report TRACE ARGS` (with `--no-index`: a replay); its stdout and stderr.
fn report(trace: &Path, args: &[&str], no_index: bool) -> (String, String) {
    report_env(trace, args, no_index, &[])
}

/// [`report`] with environment variables set.
fn report_env(trace: &Path, args: &[&str], no_index: bool, env: &[(&str, &Path)]) -> (String, String) {
    command("report", trace, args, no_index, env)
}

/// `itrace COMMAND TRACE ARGS` (with `--no-index`: a replay), with environment variables set.
fn command(command: &str, trace: &Path, args: &[&str], no_index: bool, env: &[(&str, &Path)]) -> (String, String) {
    let mut cmd = Command::new(itrace_tests::itrace_bin());
    cmd.arg(command).arg(trace).args(args);
    if no_index {
        cmd.arg("--no-index");
    }
    for v in ["DEBUGINFOD_URLS", "DEBUGINFOD_CACHE_PATH"] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run(&mut cmd);
    out.assert_success();
    (out.stdout, out.stderr)
}

fn index_of(trace: &Path) -> PathBuf {
    let mut p = trace.as_os_str().to_owned();
    p.push(".itrace-idx");
    PathBuf::from(p)
}

/// Every view, from the index, is the replay's; a damaged index is replayed over.
#[test]
fn reports_from_the_index_are_the_replays_byte_for_byte() {
    let dir = test_dir("report_index-views");
    let trace = dir.join("fib.itr");
    record(&trace, &[], &program("fib"), &[]).assert_success();
    let idx = index_of(&trace);
    let json: serde_json::Value = serde_json::from_str(&report(&trace, &["--json"], true).0).unwrap();
    let tid = json["threads"][0]["tid"].as_u64().unwrap().to_string();
    let half = (json["total_instructions"].as_u64().unwrap() / 2).to_string();
    let views: Vec<Vec<&str>> = vec![
        vec![],
        vec!["--json"],
        vec!["--tree", "--min-percent", "0"],
        vec!["--tree", "--json", "--depth", "4"],
        vec!["--callers", "fib", "--callees", "fib"],
        vec!["--callers", "main", "--json"],
        vec!["--tid", &tid],
        vec!["--tid", &tid, "--tree", "--callees", "fib"],
        vec!["--module", "fib", "--sort", "calls", "--top", "5"],
        vec!["--grep", "^f", "--tree"],
        vec!["--from", &half, "--callers", "fib"],
        vec!["--after", "fib", "--json"],
    ];
    let truths: Vec<(String, String)> = views.iter().map(|v| report(&trace, v, true)).collect();
    assert!(!idx.exists(), "--no-index wrote {}", idx.display());
    for (view, truth) in views.iter().zip(&truths) {
        let first = report(&trace, view, false);
        assert!(idx.is_file(), "report {view:?} left no index");
        let second = report(&trace, view, false);
        assert_eq!(first.0, truth.0, "report {view:?}, first (replayed)");
        assert_eq!(second.0, truth.0, "report {view:?}, from the index");
        assert!(!second.1.contains("panic"), "{}", second.1);
    }
    // Each view once more, now that the index holds every scope it asked for.
    for (view, truth) in views.iter().zip(&truths) {
        assert_eq!(report(&trace, view, false).0, truth.0, "report {view:?}, again");
    }

    // Flame graphs (all threads merged) are drawn from the index's call tree too.
    for view in [vec!["--folded"], vec![], vec!["--colors", "module", "--title", "t"], vec!["--per-thread", "--folded"]]
    {
        let truth = command("flamegraph", &trace, &view, true, &[]).0;
        assert_eq!(command("flamegraph", &trace, &view, false, &[]).0, truth, "flamegraph {view:?}");
    }
    std::fs::remove_file(&idx).unwrap();
    let truth = command("flamegraph", &trace, &["--folded"], true, &[]).0;
    assert_eq!(command("flamegraph", &trace, &["--folded"], false, &[]).0, truth, "flamegraph, replayed");
    assert!(idx.is_file(), "flamegraph left no index");
    assert_eq!(command("flamegraph", &trace, &["--folded"], false, &[]).0, truth, "flamegraph, from its index");
    let tree = &views[2];
    assert_eq!(report(&trace, tree, false).0, truths[2].0, "report {tree:?} from a flamegraph's index");

    // A damaged index, one cut short and one of garbage: the replay's answer, and a good index again.
    let good = std::fs::read(&idx).unwrap();
    for bad in [good[..good.len() / 2].to_vec(), b"ITRIDX\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff".to_vec()] {
        std::fs::write(&idx, &bad).unwrap();
        assert_eq!(report(&trace, &[], false).0, truths[0].0, "with a damaged index");
        assert_eq!(report(&trace, &["--json"], false).0, truths[1].0, "after a damaged index");
    }
}

/// The index is what answers: with the records in the middle of the trace overwritten but its
/// size, modification time, header and end summary as they were (what the key looks at), the
/// report is still the one of the intact trace, while a replay sees the damage; touching the
/// trace makes the report the replay's.
#[test]
fn the_second_report_reads_the_index_not_the_records() {
    let dir = test_dir("report_index-used");
    let trace = dir.join("calls.itr");
    record(&trace, &["--backend", "qemu"], &program("calls_loop"), &["200000"]).assert_success();
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(size > 512 << 10, "the trace is {size} bytes: too small to damage past its ends");
    let intact = report(&trace, &[], false).0;
    let mtime = std::fs::metadata(&trace).unwrap().modified().unwrap();
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&trace).unwrap();
        f.seek(SeekFrom::Start(size / 2)).unwrap();
        f.write_all(&vec![0x5a; 64 << 10]).unwrap();
        f.set_modified(mtime).unwrap();
    }
    let replayed = report(&trace, &[], true).0;
    assert_ne!(replayed, intact, "overwriting 64 KiB of records changed nothing in a replay");
    assert_eq!(report(&trace, &[], false).0, intact, "the report did not come from the index");
    let f = std::fs::File::options().write(true).open(&trace).unwrap();
    f.set_modified(mtime + std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(report(&trace, &[], false).0, replayed, "a touched trace answered from the index");
}

const V1: &str = "int f(int x) { return x * 3; }\nint main(void) { int s = 0; for (int i = 0; i < 60; i++) s += f(i); return s & 1; }\n";
const V2: &str = "int g(int x) { return x + 1; }\n\
                  int main(void) { int s = 0; for (int i = 0; i < 61; i++) s += g(i); return s == 7; }\n";

fn build(dir: &Path, src: &str, name: &str) -> PathBuf {
    require_tool("gcc");
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let bin = dir.join(name);
    run(Command::new("gcc").args(["-O0", "-g", "-Wl,--build-id=sha1", "-o"]).arg(&bin).arg(&c)).assert_success();
    bin
}

/// The names of the functions of the report (JSON) in `module`.
fn names_in(report_json: &str, module: &Path) -> Vec<String> {
    let r: serde_json::Value = serde_json::from_str(report_json).unwrap();
    let module = module.to_string_lossy();
    let mut names: Vec<String> = r["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["module"].as_str() == Some(&*module))
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// A program rebuilt after the index was written, and a trace recorded again over the old one:
/// the fresh replay's answer each time.
#[test]
fn a_rebuilt_program_or_a_rewritten_trace_is_replayed() {
    let dir = test_dir("report_index-rebuilt");
    let bin = build(&dir, V1, "small");
    let trace = dir.join("t.itr");
    record(&trace, &[], &bin, &[]).assert_success();
    let before = report(&trace, &["--json"], false).0;
    assert!(names_in(&before, &bin).contains(&"f".to_string()), "{before}");
    assert_eq!(report(&trace, &["--json"], false).0, before);

    build(&dir, V2, "small");
    let (changed, stderr) = report(&trace, &["--json"], false);
    assert_eq!(changed, report(&trace, &["--json"], true).0, "the rebuilt program's report is not the replay's");
    assert!(!names_in(&changed, &bin).contains(&"f".to_string()), "f, of the old build, named from the index");
    assert!(stderr.contains("has changed"), "no warning about the rebuilt program: {stderr}");

    record(&trace, &[], &bin, &[]).assert_success();
    let rewritten = report(&trace, &["--json"], false).0;
    assert_eq!(rewritten, report(&trace, &["--json"], true).0, "the new trace's report is not the replay's");
    assert!(names_in(&rewritten, &bin).contains(&"g".to_string()), "{rewritten}");
}

/// A stripped program whose debug file appears, after the index was written, where it is
/// looked for (elfutils' client cache, `DEBUGINFOD_CACHE_PATH`): its names come, as in a replay.
#[test]
fn a_debug_file_found_later_gives_names() {
    require_tool("objcopy");
    require_tool("strip");
    let dir = test_dir("report_index-debugfile");
    let full = build(&dir, V1, "full");
    let stripped = dir.join("small");
    run(Command::new("strip").arg("--strip-all").arg("-o").arg(&stripped).arg(&full)).assert_success();
    let o = run(Command::new("readelf").arg("-n").arg(&full));
    o.assert_success();
    let id = o.stdout.lines().find_map(|l| l.trim().strip_prefix("Build ID: ")).expect("a build-id").to_string();
    let trace = dir.join("t.itr");
    record(&trace, &[], &stripped, &[]).assert_success();
    let cache = dir.join("debuginfod-cache");
    std::fs::create_dir_all(&cache).unwrap();
    let env = [("DEBUGINFOD_CACHE_PATH", cache.as_path())];

    let (without, _) = report_env(&trace, &["--json"], false, &env);
    assert!(!names_in(&without, &stripped).contains(&"f".to_string()), "names without a debug file: {without}");
    assert_eq!(report_env(&trace, &["--json"], false, &env).0, without);

    let entry = cache.join(&id);
    std::fs::create_dir_all(&entry).unwrap();
    run(Command::new("objcopy").arg("--only-keep-debug").arg(&full).arg(entry.join("debuginfo"))).assert_success();
    let (with, _) = report_env(&trace, &["--json"], false, &env);
    assert_eq!(with, report_env(&trace, &["--json"], true, &env).0, "not the replay's");
    assert!(names_in(&with, &stripped).contains(&"f".to_string()), "no names from the debug file: {with}");

    // Another cache directory (a setting of the key): the replay's answer again.
    let empty = dir.join("empty-cache");
    std::fs::create_dir_all(&empty).unwrap();
    let env = [("DEBUGINFOD_CACHE_PATH", empty.as_path())];
    assert_eq!(report_env(&trace, &["--json"], false, &env).0, without, "another cache's answer");
}
