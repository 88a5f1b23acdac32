//! `itrace diff` on two builds of one program (tests/programs/diff_work.c) where only `work`
//! does more iterations: only `work` and its callers move, and every change equals the one
//! callgrind measures between the two builds.
//!
//! The builds have one file name (`diff_work`) in two directories of equal length (`a/`,
//! `b/`), so the two runs' environments are alike byte for byte except for the program.

use itrace_tests::{callgrind_profile, itrace, record, require_tool, run, test_dir};
use std::collections::HashMap;
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
