//! The timeline exports, `itrace export --format chrome` and `--format firefox`, read by
//! independent readers (serde_json, gzip) and checked against `itrace report` (whose counts
//! tests/views.rs checks against callgrind) and strace.
//!
//! Chrome (Trace Event Format JSON), with the instructions clock: per thread the B/E events
//! nest and their times never go back; per function the span lengths (outermost spans of a
//! thread, less the signal handlers nested in them, as the report counts) add up to the
//! report's inclusive count, the spans that are calls to its calls, and the spans at the
//! bottom of each thread to the thread's instructions; each system call strace sees return,
//! and each signal it sees delivered, is an instant event, the handler's span opening with
//! the delivery. With the timestamps clock the spans are the same and lie within the time
//! the recording took.
//!
//! Merging (Chrome): `--min-span N` leaves exactly the spans of `--all-spans` at least N long,
//! every marker, and metadata counting what was merged (computed from `--all-spans`); by
//! default a file over `--max-size` gets the smallest minimum that fits it.
//!
//! Firefox (processed profile, gzipped): one thread per traced thread with its tid, samples
//! weighted by instructions that add up to the thread's instructions in the report, the
//! program's functions in the thread's string table, and the signals as markers.

use itrace_tests::{itrace, itrace_bin, program, report_json, require_tool, run, test_dir, unique_functions};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The programs: recursion (fib), longjmp, a signal handler, threads, tail calls, lazily bound
/// PLT calls (no LD_BIND_NOW here: the resolver runs inside the first call of each).
const PROGRAMS: &[&str] = &["fib", "longjmp", "signal", "threads", "tailcall", "pltcalls"];

/// Span kinds that are calls in the report's `calls`.
const CALL_KINDS: &[&str] = &["call", "tail call", "signal handler"];
/// Span kinds whose instructions the report leaves out of the frames they interrupted.
const SIGNAL_KINDS: &[&str] = &["signal handler", "signal trampoline"];
const ALL_KINDS: &[&str] = &["call", "tail call", "signal handler", "signal trampoline", "root", "leaf"];

/// Records `name` into a fresh directory; returns the trace and how long the recording took.
fn traced(test: &str, name: &str) -> (PathBuf, Duration) {
    let dir = test_dir(&format!("timeline-{test}-{name}"));
    let trace = dir.join("t.itr");
    let started = Instant::now();
    run(Command::new(itrace_bin())
        .arg("record")
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(program(name))
        .env_remove("LD_BIND_NOW"))
    .assert_success();
    (trace, started.elapsed())
}

/// `itrace export TRACE --format FORMAT --time TIME -o OUT`.
fn export(trace: &Path, format: &str, time: &str, out: &Path) {
    let args = [trace.as_os_str(), out.as_os_str()];
    itrace([
        "export".as_ref(),
        args[0],
        "--format".as_ref(),
        format.as_ref(),
        "--time".as_ref(),
        time.as_ref(),
        "-o".as_ref(),
        args[1],
    ])
    .assert_success();
}

/// The events of the Chrome export of `trace`, with every span.
fn chrome_events(trace: &Path, time: &str) -> Vec<serde_json::Value> {
    let out = trace.with_extension(format!("{time}.json"));
    let json = chrome_json(trace, &["--time", time, "--all-spans"], &out);
    json["traceEvents"].as_array().unwrap_or_else(|| panic!("no traceEvents in {}", out.display())).clone()
}

/// `itrace export TRACE --format chrome ARGS -o OUT`, parsed by serde_json.
fn chrome_json(trace: &Path, args: &[&str], out: &Path) -> serde_json::Value {
    let mut cmd: Vec<&std::ffi::OsStr> =
        vec!["export".as_ref(), trace.as_os_str(), "--format".as_ref(), "chrome".as_ref()];
    cmd.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    cmd.extend(["-o".as_ref(), out.as_os_str()]);
    itrace(cmd).assert_success();
    let text = std::fs::read_to_string(out).expect("read the chrome export");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", out.display()))
}

/// One closed span.
#[derive(Debug)]
struct Span {
    tid: u64,
    name: String,
    kind: String,
    begin: f64,
    end: f64,
    depth: usize,
    /// Time in signal handler spans nested in it (outermost ones).
    in_handlers: f64,
    /// Another span of its function is open below it, with no signal handler between.
    nested_in_own: bool,
    /// Its place among the thread's spans in the order they begin, and its parent's.
    id: usize,
    parent: Option<usize>,
}

/// The spans of B/E events, checking that per thread they nest and time never goes back.
fn spans(events: &[serde_json::Value]) -> Vec<Span> {
    struct Open {
        name: String,
        kind: String,
        begin: f64,
        in_handlers: f64,
        id: usize,
    }
    let mut next_id = 0;
    let mut open: HashMap<u64, Vec<Open>> = HashMap::new();
    let mut last: HashMap<u64, f64> = HashMap::new();
    let mut out = Vec::new();
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        if ph == "M" {
            continue;
        }
        let tid = e["tid"].as_u64().expect("tid");
        let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("ts of {e}"));
        let prev = last.insert(tid, ts).unwrap_or(0.0);
        assert!(ts >= prev, "tid {tid}: time goes back from {prev} at {e}");
        let stack = open.entry(tid).or_default();
        match ph {
            "B" => {
                let kind = e["cat"].as_str().expect("cat").to_string();
                assert!(ALL_KINDS.contains(&kind.as_str()), "unknown span kind {e}");
                stack.push(Open {
                    name: e["name"].as_str().expect("name").to_string(),
                    kind,
                    begin: ts,
                    in_handlers: 0.0,
                    id: next_id,
                });
                next_id += 1;
            }
            "E" => {
                let o = stack.pop().unwrap_or_else(|| panic!("tid {tid}: E without a B at {e}"));
                let is_handler = SIGNAL_KINDS.contains(&o.kind.as_str());
                let mut nested_in_own = false;
                for below in stack.iter().rev() {
                    if SIGNAL_KINDS.contains(&below.kind.as_str()) {
                        break;
                    }
                    if below.name == o.name {
                        nested_in_own = true;
                        break;
                    }
                }
                if let Some(parent) = stack.last_mut() {
                    parent.in_handlers += if is_handler { ts - o.begin } else { o.in_handlers };
                }
                out.push(Span {
                    tid,
                    name: o.name,
                    kind: o.kind,
                    begin: o.begin,
                    end: ts,
                    depth: stack.len(),
                    in_handlers: o.in_handlers,
                    nested_in_own,
                    id: o.id,
                    parent: stack.last().map(|p| p.id),
                });
            }
            "i" => assert_eq!(e["s"], "t", "an instant of a thread: {e}"),
            _ => panic!("unexpected event {e}"),
        }
    }
    for (tid, stack) in &open {
        assert!(stack.is_empty(), "tid {tid}: {} spans never end", stack.len());
    }
    out
}

#[test]
fn chrome_spans_add_up_to_the_report() {
    let mut diffs = Vec::new();
    for name in PROGRAMS {
        let (trace, _) = traced("spans", name);
        let events = chrome_events(&trace, "instructions");
        let spans = spans(&events);
        let report = report_json(&trace);
        let functions = unique_functions(&report);
        assert!(functions.len() > 50, "{name}: the report has {} functions", functions.len());

        let (mut inclusive, mut calls): (HashMap<&str, f64>, HashMap<&str, u64>) = Default::default();
        let mut recursive = std::collections::HashSet::new();
        for s in &spans {
            if CALL_KINDS.contains(&s.kind.as_str()) {
                *calls.entry(&s.name).or_default() += 1;
            }
            if s.nested_in_own {
                recursive.insert(s.name.as_str());
            } else {
                *inclusive.entry(&s.name).or_default() += s.end - s.begin - s.in_handlers;
            }
        }
        let mut compared = 0;
        for (f, row) in &functions {
            let want_calls = row["calls"].as_u64().expect("calls");
            let got_calls = calls.get(f.as_str()).copied().unwrap_or(0);
            if got_calls != want_calls {
                diffs.push(format!("{name}: {f}: {got_calls} call spans, report calls {want_calls}"));
            }
            if recursive.contains(f.as_str()) {
                continue;
            }
            compared += 1;
            let want = row["inclusive"].as_u64().expect("inclusive");
            let got = inclusive.get(f.as_str()).copied().unwrap_or(0.0);
            if got != want as f64 {
                diffs.push(format!("{name}: {f}: spans {got} instructions, report inclusive {want}"));
            }
        }
        assert!(compared > 50, "{name}: only {compared} functions compared");
        if *name == "fib" {
            assert!(recursive.contains("fib"), "fib: no fib span inside another");
        }

        // Every instruction runs under a bottom span of its thread.
        let mut bottom: BTreeMap<u64, f64> = BTreeMap::new();
        for s in spans.iter().filter(|s| s.depth == 0) {
            *bottom.entry(s.tid).or_default() += s.end - s.begin;
        }
        let threads = report["threads"].as_array().expect("threads");
        let want: BTreeMap<u64, f64> = threads
            .iter()
            .map(|t| (t["tid"].as_u64().expect("tid"), t["instructions"].as_u64().expect("instructions") as f64))
            .collect();
        assert_eq!(bottom, want, "{name}: instructions under the bottom spans per thread vs the report's threads");
        // Each thread is named.
        for t in threads {
            let tid = t["tid"].as_u64().expect("tid");
            let named = events.iter().any(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == tid);
            assert!(named, "{name}: no thread_name for tid {tid}");
        }
    }
    assert!(diffs.is_empty(), "differences:\n{}", diffs.join("\n"));
}

/// System calls and signal deliveries per name, as strace sees them run `name`; the system
/// calls that do not return to the program (execve into it, exit_group) are left out.
fn strace_counts(name: &str) -> BTreeMap<String, u64> {
    require_tool("strace");
    let dir = test_dir(&format!("timeline-strace-{name}"));
    let log = dir.join("strace.txt");
    run(Command::new("strace").arg("-f").arg("-o").arg(&log).arg(program(name)).env_remove("LD_BIND_NOW"))
        .assert_success();
    let text = std::fs::read_to_string(&log).expect("read the strace log");
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        // `PID name(args) = result`, `PID --- SIGUSR1 {...} ---`, `PID +++ exited with 0 +++`.
        let rest = line.split_once(' ').map_or(line, |(_, r)| r).trim_start();
        let key = if let Some(sig) = rest.strip_prefix("--- ") {
            format!("signal_{}", sig.split_whitespace().next().expect("signal name"))
        } else if rest.starts_with("+++") || rest.starts_with("<...") {
            continue;
        } else {
            let call = rest.split('(').next().expect("name");
            if ["execve", "exit_group", "exit"].contains(&call) {
                continue;
            }
            format!("sys_{call}")
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

#[test]
fn chrome_markers_are_the_system_calls_and_signals_strace_sees() {
    let (trace, _) = traced("markers", "signal");
    let events = chrome_events(&trace, "instructions");
    let mut markers: BTreeMap<String, u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "i") {
        *markers.entry(e["name"].as_str().expect("name").to_string()).or_default() += 1;
        let cat = e["cat"].as_str().expect("cat");
        let name = e["name"].as_str().expect("name");
        assert!(name.starts_with(if cat == "signal" { "signal_" } else { "sys_" }), "marker {e}");
    }
    let want = strace_counts("signal");
    assert_eq!(want.get("signal_SIGUSR1"), Some(&3), "oracle: strace saw {want:?}");
    assert_eq!(markers, want, "instant events vs strace");
    // The handler runs from the delivery on.
    for (i, e) in events.iter().enumerate().filter(|(_, e)| e["name"] == "signal_SIGUSR1") {
        let next = &events[i + 1];
        assert_eq!(
            (&next["ph"], &next["cat"], &next["name"]),
            (&"B".into(), &"signal handler".into(), &"sig_handler".into())
        );
        assert_eq!(next["ts"], e["ts"], "the handler's span starts at the delivery");
    }
}

#[test]
fn chrome_timestamps_keep_the_spans_within_the_recording() {
    let (trace, took) = traced("timestamps", "threads");
    let by_instructions = chrome_events(&trace, "instructions");
    let by_time = chrome_events(&trace, "timestamps");
    let shape = |events: &[serde_json::Value]| -> Vec<(String, String, String)> {
        events
            .iter()
            .filter(|e| e["ph"] != "M")
            .map(|e| (e["ph"].to_string(), e["tid"].to_string(), e["name"].to_string()))
            .collect()
    };
    let mut a = shape(&by_instructions);
    let mut b = shape(&by_time);
    // Threads interleave differently on the two clocks; per thread the order is the same.
    a.sort_by(|x, y| x.1.cmp(&y.1));
    b.sort_by(|x, y| x.1.cmp(&y.1));
    assert_eq!(a, b, "the same events per thread on both clocks");
    let spans = spans(&by_time);
    let limit = took.as_secs_f64() * 1e6;
    for s in &spans {
        assert!(s.begin >= 0.0 && s.end <= limit, "span {s:?} outside the {limit} us the recording took");
    }
    let tids: std::collections::BTreeSet<u64> = spans.iter().map(|s| s.tid).collect();
    assert_eq!(tids.len(), 5, "threads: main and four workers");
}

/// A number the profile may write as a string (pids and tids).
fn number(v: &serde_json::Value) -> u64 {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The Firefox profile of `name`, gunzipped by gzip and parsed.
fn firefox_profile(trace: &Path) -> serde_json::Value {
    let gzip = require_tool("gzip");
    let out = trace.with_extension("json.gz");
    export(trace, "firefox", "instructions", &out);
    let bytes = std::fs::read(&out).expect("read the firefox export");
    assert_eq!(&bytes[..2], b"\x1f\x8b", "{} is not gzip", out.display());
    let text = run(Command::new(gzip).arg("-dc").arg(&out));
    text.assert_success();
    serde_json::from_str(&text.stdout).unwrap_or_else(|e| panic!("{} is not JSON: {e}", out.display()))
}

#[test]
fn firefox_profile_has_each_thread_its_instructions_and_markers() {
    let cases: [(&str, &[&str], &[&str], u64); 2] = [
        ("threads", &["main", "thr_main", "thr_compute"], &["thr_main", "thr_compute"], 0),
        ("signal", &["main", "sig_handler", "sig_compute"], &[], 3),
    ];
    for (name, own, workers, signals) in cases {
        let (trace, _) = traced("firefox", name);
        let profile = firefox_profile(&trace);
        assert!(profile["meta"]["version"].as_u64().is_some(), "{name}: no meta.version");
        let report = report_json(&trace);
        let want: BTreeMap<u64, u64> = report["threads"]
            .as_array()
            .expect("threads")
            .iter()
            .map(|t| (t["tid"].as_u64().expect("tid"), t["instructions"].as_u64().expect("instructions")))
            .collect();
        let threads = profile["threads"].as_array().expect("threads");
        let mut got = BTreeMap::new();
        let mut signal_markers = 0;
        for t in threads {
            let tid = number(&t["tid"]);
            let samples = &t["samples"];
            let weights = samples["weight"].as_array().expect("sample weights");
            assert_eq!(weights.len() as u64, samples["length"].as_u64().expect("length"), "{name}: sample count");
            got.insert(tid, weights.iter().map(|w| w.as_u64().expect("weight")).sum::<u64>());
            let strings: Vec<&str> =
                t["stringArray"].as_array().expect("strings").iter().filter_map(|s| s.as_str()).collect();
            let markers = &t["markers"];
            for i in 0..markers["length"].as_u64().expect("markers length") as usize {
                let name_index = markers["name"][i].as_u64().expect("marker name") as usize;
                if strings[name_index] == "signal_SIGUSR1" {
                    signal_markers += 1;
                }
            }
            if tid != number(&t["pid"]) {
                for f in workers {
                    assert!(strings.contains(f), "{name}: worker {tid} has no {f} in its strings");
                }
            }
        }
        assert_eq!(got, want, "{name}: sample weights per thread vs the report's instructions");
        let all: Vec<&str> = threads
            .iter()
            .flat_map(|t| t["stringArray"].as_array().expect("strings").iter().filter_map(|s| s.as_str()))
            .collect();
        for f in own {
            assert!(all.contains(f), "{name}: {f} in no thread's strings");
        }
        assert_eq!(signal_markers, signals, "{name}: signal markers");
    }
}

/// The instant events of `json`, per thread in the file's order (threads interleave
/// differently when spans wait to be known long enough).
fn instants(json: &serde_json::Value) -> BTreeMap<u64, Vec<String>> {
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let mut per_thread: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "i") {
        per_thread.entry(e["tid"].as_u64().expect("tid")).or_default().push(e.to_string());
    }
    per_thread
}

/// `--min-span N` against the same trace with every span (which the test above checks against
/// the report): exactly the spans at least N instructions long are left, at the same times;
/// every marker stays; the metadata counts, per thread, the spans left out and the
/// instructions that ran in the outermost of them.
#[test]
fn chrome_min_span_leaves_out_exactly_the_shorter_spans() {
    for name in ["fib", "signal", "threads"] {
        let (trace, _) = traced("minspan", name);
        let all_json = chrome_json(&trace, &["--all-spans"], &trace.with_extension("all.json"));
        let all = spans(all_json["traceEvents"].as_array().expect("traceEvents"));
        for min in [3u64, 40] {
            let json = chrome_json(&trace, &["--min-span", &min.to_string()], &trace.with_extension("min.json"));
            let events = json["traceEvents"].as_array().expect("traceEvents");
            let kept = spans(events);
            let key = |s: &Span| (s.tid, s.name.clone(), s.kind.clone(), s.begin.to_bits(), s.end.to_bits());
            let want: Vec<_> = all.iter().filter(|s| s.end - s.begin >= min as f64).map(key).collect();
            let mut want = want;
            let mut got: Vec<_> = kept.iter().map(key).collect();
            want.sort();
            got.sort();
            assert!(want.len() < all.len(), "{name}: no span shorter than {min} to merge");
            assert_eq!(got, want, "{name} --min-span {min}: the spans left");
            assert_eq!(instants(&json), instants(&all_json), "{name} --min-span {min}: the markers");

            // Per thread: spans left out, and the instructions of the outermost of them.
            let by_id: HashMap<(u64, usize), &Span> = all.iter().map(|s| ((s.tid, s.id), s)).collect();
            let short = |s: &Span| s.end - s.begin < min as f64;
            let mut want_merged: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            for s in all.iter().filter(|s| short(s)) {
                let e = want_merged.entry(s.tid).or_default();
                e.0 += 1;
                if s.parent.is_none_or(|p| !short(by_id[&(s.tid, p)])) {
                    e.1 += (s.end - s.begin) as u64;
                }
            }
            let mut got_merged = BTreeMap::new();
            for e in events.iter().filter(|e| e["ph"] == "M" && e["name"] == "itrace_merged_spans") {
                assert_eq!(e["args"]["min_span"].as_u64(), Some(min), "{e}");
                let counts =
                    (e["args"]["spans"].as_u64().expect("spans"), e["args"]["instructions"].as_u64().expect("n"));
                if counts.0 > 0 {
                    got_merged.insert(e["tid"].as_u64().expect("tid"), counts);
                }
            }
            assert_eq!(got_merged, want_merged, "{name} --min-span {min}: merged spans and instructions per thread");
            let total = want_merged.values().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            let other = &json["otherData"];
            assert_eq!(
                (other["merged_spans"].as_u64(), other["merged_instructions"].as_u64()),
                (Some(total.0), Some(total.1))
            );
        }
    }
}

/// By default the file is kept within --max-size by the smallest minimum span that does it (a
/// whole number of instructions up to 4096, a power of two above): the file fits, the next
/// smaller minimum would not, and stderr says what was merged. A trace that fits keeps every
/// span.
#[test]
fn chrome_default_keeps_the_file_within_max_size() {
    let (trace, _) = traced("maxsize", "fib");
    let all = trace.with_extension("all.json");
    chrome_json(&trace, &["--all-spans"], &all);
    let all_bytes = std::fs::metadata(&all).expect("all").len();
    let max = all_bytes / 8;
    let out = trace.with_extension("max.json");
    let max_arg = max.to_string();
    let args: [&std::ffi::OsStr; 8] = [
        "export".as_ref(),
        trace.as_os_str(),
        "--format".as_ref(),
        "chrome".as_ref(),
        "--max-size".as_ref(),
        max_arg.as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    let run = itrace(args);
    run.assert_success();
    let bytes = std::fs::metadata(&out).expect("out").len();
    assert!(bytes <= max, "{bytes} bytes written, more than --max-size {max}");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("read")).expect("JSON");
    let min = json["otherData"]["min_span"].as_u64().expect("a min_span in otherData");
    assert!(min > 1 && (min <= 4096 || min.is_power_of_two()), "min_span {min}");
    let merged = json["otherData"]["merged_spans"].as_u64().expect("merged_spans");
    assert!(
        run.stderr.contains(&format!("{merged} spans shorter than {min} instructions were merged")),
        "stderr: {}",
        run.stderr
    );
    let smaller = if min <= 4096 { min - 1 } else { min / 2 };
    let out_smaller = trace.with_extension("smaller.json");
    chrome_json(&trace, &["--min-span", &smaller.to_string()], &out_smaller);
    let smaller_bytes = std::fs::metadata(&out_smaller).expect("smaller").len();
    assert!(
        smaller_bytes > max,
        "--min-span {smaller} gives {smaller_bytes} bytes, within {max}: {min} was not the smallest"
    );
    // The options are the Chrome format's: one line elsewhere.
    let firefox = itrace([
        "export".as_ref(),
        trace.as_os_str(),
        "--format".as_ref(),
        "firefox".as_ref(),
        "--min-span".as_ref(),
        "3".as_ref(),
        "-o".as_ref(),
        trace.with_extension("ff.json").as_os_str(),
    ]);
    let line = firefox.assert_clean_error();
    assert!(line.contains("are for --format chrome"), "{line}");
    // Within the default 100 MiB: every span, nothing said.
    let run = itrace([
        "export".as_ref(),
        trace.as_os_str(),
        "--format".as_ref(),
        "chrome".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    run.assert_success();
    assert!(!run.stderr.contains("merged"), "stderr: {}", run.stderr);
    assert_eq!(std::fs::read(&out).expect("out"), std::fs::read(&all).expect("all"), "default against --all-spans");
}
