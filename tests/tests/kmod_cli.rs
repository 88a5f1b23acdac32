//! `--backend kmod` on a machine without the kernel module (the module itself is tested in a
//! booted guest by kmod-shim/test-in-guest.sh, a step of scripts/test.sh).

mod common;

use common::*;

#[test]
fn kmod_backend_without_the_module_says_so() {
    if std::path::Path::new("/dev/itrace").exists() {
        eprintln!("skipped: the itrace module is loaded on this machine");
        return;
    }
    let dir = test_dir("kmod_cli-without-module");
    let trace = dir.join("t.itr");
    let out = itrace(["record", "--backend", "kmod", "-o", trace.to_str().unwrap(), "--", "/bin/true"]);
    let msg = out.assert_clean_error();
    assert!(msg.contains("kernel module is not loaded"), "{msg}");
    assert!(!trace.exists(), "no trace file is left behind");
    // auto falls back to ptrace
    let bin = program("count_loop");
    let out = itrace(["record", "-o", trace.to_str().unwrap(), "--", bin.to_str().unwrap()]);
    out.assert_success();
    assert!(out.stderr.contains("ptrace"), "{}", out.stderr);
}

#[test]
fn kmod_backend_refuses_regions() {
    let out = itrace(["record", "--backend", "kmod", "--region", "--", "/bin/true"]);
    let msg = out.assert_clean_error();
    assert!(msg.contains("--backend kmod") && msg.contains("--region"), "{msg}");
}
