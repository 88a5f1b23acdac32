//! `--backend kmod` on a machine without the kernel module (the module itself is tested in a
//! booted guest by kmod-shim/test-in-guest.sh, a step of scripts/test.sh).

use itrace_tests::{itrace, program, require_tool, run, test_dir};

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
    // auto records without it: with the translating recorder on x86_64, else with ptrace
    let bin = program("count_loop");
    let out = itrace(["record", "-o", trace.to_str().unwrap(), "--", bin.to_str().unwrap()]);
    out.assert_success();
    let expected = if cfg!(target_arch = "x86_64") { "translated (auto: an x86_64 program)" } else { "ptrace" };
    assert!(out.stderr.contains(expected), "{}", out.stderr);
}

#[test]
fn kmod_backend_refuses_start_and_stop() {
    let out = itrace(["record", "--backend", "kmod", "--start", "main", "--", "/bin/true"]);
    let msg = out.assert_clean_error();
    assert!(msg.contains("--backend kmod") && msg.contains("--start"), "{msg}");
}

/// The module classifies 64-bit code only: an i386 program is refused before it starts.
#[test]
fn kmod_backend_refuses_32_bit_programs() {
    require_tool("i686-linux-gnu-gcc");
    let dir = test_dir("kmod_cli-i386");
    let src = dir.join("exit.S");
    std::fs::write(&src, ".globl _start\n_start: movl $1, %eax\n xorl %ebx, %ebx\n int $0x80\n").unwrap();
    let exe = dir.join("exit32");
    let o =
        run(std::process::Command::new("i686-linux-gnu-gcc").args(["-nostdlib", "-static", "-o"]).arg(&exe).arg(&src));
    assert!(o.success(), "{}", o.stderr);
    let out =
        itrace(["record", "--backend", "kmod", "-o", dir.join("t.itr").to_str().unwrap(), "--", exe.to_str().unwrap()]);
    let msg = out.assert_clean_error();
    assert!(msg.contains("64-bit programs only") && msg.contains("i386"), "{msg}");
    assert!(!dir.join("t.itr").exists(), "no trace file is left behind");
}
