//! `itrace diff` on two builds of one program (tests/programs/diff_work.c) where only `work`
//! does more iterations: only `work` and its callers move, and every change equals the one
//! callgrind measures between the two builds.
//!
//! The builds have one file name (`diff_work`) in two directories of equal length (`a/`,
//! `b/`), so the two runs' environments are alike byte for byte except for the program.

use itrace_tests::{callgrind_profile, itrace, program, record, require_tool, run, test_dir};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

fn build(dir: &Path, iterations: u32) -> PathBuf {
    require_tool("gcc");
    std::fs::create_dir_all(dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/diff_work.c");
    let bin = dir.join("diff_work");
    run(Command::new("gcc")
        .args(["-g", "-O1", "-fno-omit-frame-pointer"])
        .arg(format!("-DWORK_ITERATIONS={iterations}"))
        .arg("-o")
        .arg(&bin)
        .arg(&src))
    .assert_success();
    bin
}

/// A function's (self, inclusive, calls) on one side of the diff's JSON (`null`: missing).
fn side(f: &serde_json::Value, which: &str) -> Option<[u64; 3]> {
    let c = &f[which];
    if c.is_null() {
        return None;
    }
    Some(["self", "inclusive", "calls"].map(|k| c[k].as_u64().unwrap_or_else(|| panic!("{which}.{k}: {f}"))))
}

fn change(f: &serde_json::Value) -> [i64; 3] {
    ["self", "inclusive", "calls"].map(|k| f["change"][k].as_i64().unwrap_or_else(|| panic!("change.{k}: {f}")))
}

/// callgrind's (self, inclusive, calls) of the program's functions.
fn callgrind_counts(bin: &Path) -> HashMap<&'static str, [i64; 3]> {
    let profile = callgrind_profile(bin, &[], false);
    let selfs = profile.self_counts_in(bin);
    ["work", "caller", "helper", "main"]
        .into_iter()
        .map(|name| {
            let (calls, inclusive) = profile.calls_and_inclusive(bin, name);
            (name, [selfs[name] as i64, inclusive as i64, calls as i64])
        })
        .collect()
}

#[test]
fn only_the_changed_function_and_its_callers_move() {
    let dir = test_dir("diff");
    let a = build(&dir.join("a"), 100);
    let b = build(&dir.join("b"), 700);
    let (ta, tb) = (dir.join("a.itr"), dir.join("b.itr"));
    record(&ta, &[], &a, &[]).assert_success();
    record(&tb, &[], &b, &[]).assert_success();

    let out = itrace([OsStr::new("diff"), ta.as_os_str(), tb.as_os_str(), OsStr::new("--json")]);
    out.assert_success();
    let diff: serde_json::Value = serde_json::from_str(&out.stdout).expect("diff --json is JSON");
    let functions = diff["functions"].as_array().expect("functions");
    let find = |name: &str| {
        functions
            .iter()
            .find(|f| f["name"] == name && f["module"] == "diff_work")
            .unwrap_or_else(|| panic!("{name} of diff_work in the diff:\n{}", out.stdout))
    };

    // The truth: callgrind's counts of each build, subtracted.
    let (ca, cb) = (callgrind_counts(&a), callgrind_counts(&b));
    let expected = |name: &str| {
        let (x, y) = (ca[name], cb[name]);
        [y[0] - x[0], y[1] - x[1], y[2] - x[2]]
    };
    let grown = expected("work")[0];
    assert!(grown > 600 * 2, "work's loop does 600 more iterations per call, 3 calls: {grown}");
    assert_eq!(change(find("work")), [grown, grown, 0], "work");
    for name in ["work", "caller", "main", "helper"] {
        assert_eq!(change(find(name)), expected(name), "{name}: itrace diff vs callgrind");
        assert_eq!(find(name)["status"], "both", "{name}");
    }
    assert_eq!(change(find("caller")), [0, grown, 0], "caller moves by work's change, inclusively");
    assert_eq!(change(find("main")), [0, grown, 0], "main moves by work's change, inclusively");
    assert_eq!(change(find("helper")), [0, 0, 0], "helper, a sibling, does not move");
    assert_eq!(side(find("work"), "before").unwrap()[0] as i64, ca["work"][0], "work's self in the base build");
    // Its relative change: callgrind's change of work's self count over its base count.
    let relative = find("work")["relative"]["self"].as_f64().expect("relative self change");
    let truth = 100.0 * grown as f64 / ca["work"][0] as f64;
    assert!((relative - truth).abs() < 1e-9, "work's relative change {relative}% vs callgrind's {truth}%");
    assert_eq!(find("helper")["relative"]["self"].as_f64(), Some(0.0), "helper: no change");

    // Everything else: no self or call change; an inclusive change only for work's
    // ancestors in libc's start-up (by exactly work's change).
    for f in functions {
        let [s, i, c] = change(f);
        assert_eq!(f["status"], "both", "a function only in one build: {f}");
        if f["name"] != "work" {
            assert_eq!((s, c), (0, 0), "only work's self and calls change: {f}");
        }
        assert!(i == 0 || i == grown, "an inclusive change other than work's: {f}");
    }
    assert_eq!(functions[0]["name"], "work", "the biggest change is first");
    assert_eq!(diff["change_instructions"].as_i64(), Some(grown), "the totals differ by work's change");
    assert_eq!(
        diff["after"]["total_instructions"].as_u64().unwrap() - diff["before"]["total_instructions"].as_u64().unwrap(),
        grown as u64
    );

    // The text form: a header with both totals, then work's row first.
    let text = itrace([OsStr::new("diff"), ta.as_os_str(), tb.as_os_str()]);
    text.assert_success();
    let lines: Vec<&str> = text.stdout.lines().collect();
    let before_total = diff["before"]["total_instructions"].as_u64().unwrap();
    let after_total = diff["after"]["total_instructions"].as_u64().unwrap();
    assert!(
        lines[0].contains(&format!("{before_total} instructions"))
            && lines[0].contains(&format!("{after_total} instructions"))
            && lines[0].ends_with(&format!("change +{grown} instructions")),
        "header: {}",
        lines[0]
    );
    let first: Vec<&str> = lines[5].split_whitespace().collect();
    assert_eq!(first.last(), Some(&"diff_work"), "{}", text.stdout);
    assert_eq!(first[first.len() - 2], "work", "{}", text.stdout);
    assert_eq!(first[2], format!("+{grown}"), "{}", text.stdout);
    assert_eq!(first[3], format!("{truth:+.1}%"), "{}", text.stdout);
}

#[test]
fn added_and_removed_functions_between_programs() {
    // Two programs of one file name: `g` only in the first, `h` only in the second.
    let dir = test_dir("diff-added");
    require_tool("gcc");
    let mut bins = Vec::new();
    for (sub, f) in [("a", "g"), ("b", "h")] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        let c = d.join("p.c");
        std::fs::write(
            &c,
            format!("__attribute__((noinline)) int {f}(int x) {{ return x + 1; }}\nint main(void) {{ return {f}(0) - 1; }}\n"),
        )
        .unwrap();
        let bin = d.join("p");
        run(Command::new("gcc").args(["-O1", "-g", "-fcf-protection=none", "-o"]).arg(&bin).arg(&c)).assert_success();
        let t = dir.join(format!("{sub}.itr"));
        record(&t, &[], &bin, &[]).assert_success();
        bins.push(t);
    }
    let out = itrace([OsStr::new("diff"), bins[0].as_os_str(), bins[1].as_os_str(), OsStr::new("--json")]);
    out.assert_success();
    let diff: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let f = |name: &str| {
        diff["functions"].as_array().unwrap().iter().find(|f| f["name"] == name && f["module"] == "p").cloned()
    };
    let g = f("g").expect("g in the diff");
    let h = f("h").expect("h in the diff");
    assert_eq!(
        (g["status"].as_str(), g["after"].is_null(), g["before"]["calls"].as_u64()),
        (Some("removed"), true, Some(1))
    );
    assert_eq!(
        (h["status"].as_str(), h["before"].is_null(), h["after"]["calls"].as_u64()),
        (Some("added"), true, Some(1))
    );
    // `g(int x) { return x + 1; }` at -O1 on x86_64 without endbr64: lea 0x1(%rdi),%eax; ret.
    assert_eq!(change(&g), [-2, -2, -1]);
    assert_eq!(change(&h), [2, 2, 1]);
    // Gone: all of its before side (-100%); new: none to be relative to.
    assert_eq!(g["relative"]["self"].as_f64(), Some(-100.0), "{g}");
    assert!(h["relative"]["self"].is_null(), "{h}");
    // The text marks them in the relative columns: `gone` and `new`.
    let text =
        itrace([OsStr::new("diff"), bins[0].as_os_str(), bins[1].as_os_str(), OsStr::new("--top"), OsStr::new("0")]);
    text.assert_success();
    let row = |name: &str| -> Vec<String> {
        let line = text
            .stdout
            .lines()
            .find(|l| l.split_whitespace().rev().nth(2) == Some(name))
            .unwrap_or_else(|| panic!("{name}: {}", text.stdout));
        line.split_whitespace().map(String::from).collect()
    };
    assert_eq!(row("g")[..8], ["2", "-", "-2", "gone", "2", "-", "-2", "gone"]);
    assert_eq!(row("h")[..8], ["-", "2", "+2", "new", "-", "2", "+2", "new"]);
}

/// (module file name, function) -> (self, inclusive, calls), summed over rows of one key.
type Rows = BTreeMap<(String, String), [u64; 3]>;

fn rows_of(report: &serde_json::Value) -> Rows {
    let mut rows = Rows::new();
    for f in report["functions"].as_array().expect("functions") {
        let module = f["module"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
        let r = rows.entry((module, f["name"].as_str().unwrap().to_string())).or_default();
        for (k, key) in ["self", "inclusive", "calls"].iter().enumerate() {
            r[k] += f[key].as_u64().unwrap();
        }
    }
    rows
}

/// (module file name, function) -> (before, after), each side missing or (self, inclusive, calls).
type Sides = BTreeMap<(String, String), (Option<[u64; 3]>, Option<[u64; 3]>)>;

/// A diff's functions as (before, after) per key.
fn diff_rows(diff: &serde_json::Value) -> Sides {
    diff["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .map(|f| {
            let key = (f["module"].as_str().unwrap().to_string(), f["name"].as_str().unwrap().to_string());
            (key, (side(f, "before"), side(f, "after")))
        })
        .collect()
}

/// The diff the test makes itself of two reports: every key of either, with its sides.
fn expected(before: &Rows, after: &Rows) -> Sides {
    let mut m = BTreeMap::new();
    for k in before.keys().chain(after.keys()) {
        m.insert(k.clone(), (before.get(k).copied(), after.get(k).copied()));
    }
    m
}

fn json_of(args: &[&OsStr]) -> serde_json::Value {
    let o = itrace(args);
    o.assert_success();
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e})"))
}

/// `diff --tid BASE:NEW` is the diff of `report --tid BASE` and `report --tid NEW` (a worker
/// thread of two runs of threads.c); `--module` and `--grep` keep the rows of that diff whose
/// module and name match; `--after main` is the diff of the two reports `--after main`.
#[test]
fn filters_and_range_are_the_reports() {
    let dir = test_dir("diff-filters");
    let (ta, tb) = (dir.join("a.itr"), dir.join("b.itr"));
    record(&ta, &[], &program("threads"), &[]).assert_success();
    record(&tb, &[], &program("threads"), &[]).assert_success();
    let report = |t: &Path, extra: &[&str]| {
        let mut args = vec![OsStr::new("report"), t.as_os_str(), OsStr::new("--json")];
        args.extend(extra.iter().map(OsStr::new));
        json_of(&args)
    };
    // worker2's id in each run (the ids differ between runs).
    let tid_of = |t: &Path| {
        let r = report(t, &[]);
        let w = r["threads"].as_array().unwrap().iter().find(|th| th["name"] == "worker2").expect("worker2").clone();
        w["tid"].as_u64().unwrap().to_string()
    };
    let (a, b) = (tid_of(&ta), tid_of(&tb));
    let pair = format!("{a}:{b}");
    let diff = |extra: &[&str]| {
        let mut args = vec![OsStr::new("diff"), ta.as_os_str(), tb.as_os_str(), OsStr::new("--json")];
        args.extend(extra.iter().map(OsStr::new));
        json_of(&args)
    };

    let (ra, rb) = (report(&ta, &["--tid", &a]), report(&tb, &["--tid", &b]));
    let by_thread = diff(&["--tid", &pair]);
    let want = expected(&rows_of(&ra), &rows_of(&rb));
    assert!(want.keys().any(|(_, f)| f == "thr_compute"), "worker2 runs thr_compute: {want:?}");
    assert_eq!(diff_rows(&by_thread), want, "diff --tid {pair} vs the two reports --tid");
    assert_eq!(by_thread["before"]["total_instructions"], ra["total_instructions"]);
    assert_eq!(by_thread["after"]["total_instructions"], rb["total_instructions"]);

    let filtered = diff(&["--tid", &pair, "--module", "threads", "--grep", "^thr_"]);
    let want_filtered: BTreeMap<_, _> = want
        .iter()
        .filter(|((m, f), _)| m == "threads" && f.starts_with("thr_"))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(want_filtered.len(), 2, "thr_main and thr_compute: {want_filtered:?}");
    assert_eq!(diff_rows(&filtered), want_filtered, "--module threads --grep ^thr_");
    assert_eq!(filtered["before"]["total_instructions"], ra["total_instructions"], "totals stay the thread's");

    let ranged = diff(&["--after", "main"]);
    let (ra, rb) = (report(&ta, &["--after", "main"]), report(&tb, &["--after", "main"]));
    assert_eq!(diff_rows(&ranged), expected(&rows_of(&ra), &rows_of(&rb)), "diff --after main");
    assert!(ranged["before"]["total_instructions"].as_u64() < report(&ta, &[])["total_instructions"].as_u64());

    // A thread one trace does not have: one line naming the trace.
    let o = itrace([
        OsStr::new("diff"),
        ta.as_os_str(),
        tb.as_os_str(),
        OsStr::new("--tid"),
        OsStr::new(&format!("{a}:1")),
    ]);
    let line = o.assert_clean_error();
    assert!(line.contains("no thread 1") && line.contains("b.itr"), "{line}");
    let o = itrace([OsStr::new("diff"), ta.as_os_str(), tb.as_os_str(), OsStr::new("--tid"), OsStr::new("x:1")]);
    o.assert_clean_error();
}

#[test]
fn missing_trace_is_a_one_line_error() {
    let dir = test_dir("diff-missing");
    let missing = dir.join("nothing.itr");
    let out = itrace([OsStr::new("diff"), missing.as_os_str(), missing.as_os_str()]);
    let line = out.assert_clean_error();
    assert!(line.contains(&*missing.to_string_lossy()), "the error names the file: {line}");
    let out = itrace([OsStr::new("diff"), missing.as_os_str()]);
    out.assert_clean_error();

    // A file that is not a trace: the same, naming it.
    let text = dir.join("not-a-trace.itr");
    std::fs::write(&text, "just text\n").unwrap();
    let out = itrace([OsStr::new("diff"), text.as_os_str(), text.as_os_str()]);
    let line = out.assert_clean_error();
    assert!(line.contains(&*text.to_string_lossy()), "the error names the file: {line}");
}
