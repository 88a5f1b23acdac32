//! The library's C and Rust examples (libitrace/examples/) are built and run
//! under `itrace record --region`; the traced function's count equals
//! callgrind's (it runs only inside the region).

use itrace_tests::{callgrind_profile, profile_dir, record, report_json, report_self_counts, run, test_dir};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Traces `bin` with --region; returns its stdout and the self count of `func` per the report.
fn region_count(bin: &Path, name: &str, func: &str) -> (String, Option<u64>) {
    let dir = test_dir(&format!("examples-{name}"));
    let trace = dir.join("t.itr");
    let rec = record(&trace, &["--region"], bin, &[]);
    rec.assert_success();
    let report = report_json(&trace);
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&report).unwrap()).unwrap();
    (rec.stdout.clone(), report_self_counts(&report, bin).get(func).copied())
}

#[test]
fn c_example() {
    let dir = test_dir("examples-c-build");
    let bin = dir.join("region");
    let lib = profile_dir();
    let out = run(Command::new("gcc")
        .args(["-O1", "-g", "-I"])
        .arg(repo().join("libitrace/include"))
        .arg(repo().join("libitrace/examples/region.c"))
        .arg("-o")
        .arg(&bin)
        .arg(format!("-L{}", lib.display()))
        .arg("-litrace")
        .arg(format!("-Wl,-rpath,{}", lib.display())));
    assert!(out.success(), "building the C example failed: {}", out.stderr);
    let (stdout, traced) = region_count(&bin, "c", "collatz_steps");
    assert!(stdout.contains("traced 1"), "ITraceEnabled inside the region: {stdout}");
    let oracle = callgrind_profile(&bin, &[], false).self_counts_in(&bin);
    assert!(oracle.get("collatz_steps").copied().unwrap_or(0) > 0);
    assert_eq!(traced, oracle.get("collatz_steps").copied(), "collatz_steps (itrace, callgrind)");
}

#[test]
fn rust_example() {
    let bin = profile_dir().join("examples/region");
    assert!(bin.is_file(), "{} missing: `cargo test --workspace` builds the examples", bin.display());
    let (stdout, traced) = region_count(&bin, "rust", "region::collatz_steps");
    assert!(stdout.contains("traced true"), "itrace::enabled() inside the region: {stdout}");
    let oracle = callgrind_profile(&bin, &[], false).self_counts_in(&bin);
    assert!(oracle.get("region::collatz_steps").copied().unwrap_or(0) > 0, "callgrind: {oracle:?}");
    assert_eq!(traced, oracle.get("region::collatz_steps").copied(), "collatz_steps (itrace, callgrind)");
}
