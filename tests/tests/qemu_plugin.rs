//! The qemu plugin backend (`itrace record --backend qemu`): the freestanding
//! x86_64 programs' arcs equal qemu's single-step log (the oracle) and the
//! ptrace single-step backend's, block for block; the libc programs' own
//! functions get the ptrace backend's self counts; bad set-ups fail in one
//! line naming the fix. The cross-architecture programs are in cross.rs.

use itrace_tests::{
    arc_lines, arc_text, checked_arc, compare_lines, itrace, itrace_bin, program, record, report_calls, report_json,
    report_self_counts, report_thread_ids, require_tool, run, target_dir, test_dir, without_exit_kernel_line, ArcLine,
    Oracle, COUNT_LOOP_BLOCKS, COUNT_LOOP_INSTRUCTIONS, FIB_ASM_SELF, FIB_CALLS, LONG_LOOP_BLOCKS,
    LONG_LOOP_INSTRUCTIONS,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const QEMU: &[&str] = &["--backend", "qemu"];

/// A test directory made earlier in this test (not emptied).
fn test_dir_path(name: &str) -> std::path::PathBuf {
    target_dir().join("test-output").join(name)
}

/// (kernel, type, count, symbol+offset) of each line: what must agree between backends.
fn shape(lines: &[ArcLine]) -> Vec<(bool, u8, u64, String)> {
    lines.iter().map(|l| (l.kernel, l.type_code, l.count, l.location())).collect()
}

fn check_freestanding(name: &str) -> Vec<ArcLine> {
    let bin = program(name);
    let oracle = Oracle::of(&bin, &[]);
    let dir = test_dir(&format!("qemu_plugin-{name}"));
    let trace = dir.join("plugin.itr");
    record(&trace, QEMU, &bin, &[]).assert_success();
    let (_, lines) = checked_arc(&trace, &dir.join("plugin.arc"));
    for l in &lines {
        assert_eq!(l.pname, name, "arc line {}: process name", l.lineno);
    }
    let total: u64 = lines.iter().map(|l| l.count).sum();
    assert_eq!(total, oracle.instructions, "{name}: total instructions against qemu's single-step log");
    let module = bin.to_string_lossy().into_owned();
    if let Err(e) = compare_lines(without_exit_kernel_line(&lines), &oracle.expected, &module) {
        panic!("{name}: the plugin's arc differs from qemu's single-step log: {e}");
    }
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(oracle.instructions), "{name}: report total");
    assert_eq!(report["lost_records"].as_u64(), Some(0));

    // The ptrace single-step backend, on the same program: the same lines.
    let stepped = dir.join("ptrace.itr");
    record(&stepped, &["--backend", "ptrace"], &bin, &[]).assert_success();
    let want = arc_lines(&arc_text(&stepped));
    assert_eq!(shape(&lines), shape(&want), "{name}: plugin against the ptrace single-step backend");
    lines
}

#[test]
fn count_loop() {
    let lines = check_freestanding("count_loop");
    assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), COUNT_LOOP_INSTRUCTIONS, "hand count");
    assert_eq!(lines.iter().filter(|l| !l.kernel).count(), COUNT_LOOP_BLOCKS, "hand count of blocks");
}

#[test]
fn branches() {
    let lines = check_freestanding("branches");
    assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), 102, "hand count (branches.S)");
    let k: Vec<&str> =
        without_exit_kernel_line(&lines).iter().filter(|l| l.kernel).map(|l| l.symbol.as_str()).collect();
    assert_eq!(k, vec!["sys_write"]);
}

#[test]
fn long_loop() {
    let lines = check_freestanding("long_loop");
    assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), LONG_LOOP_INSTRUCTIONS, "hand count");
    assert_eq!(lines.iter().filter(|l| !l.kernel).count(), LONG_LOOP_BLOCKS, "hand count of blocks");
}

/// The three collection modes: the same long_loop, whole (continuous, normal with room) or its
/// most recent records (wrap), each read back without error. Its 200,000 taken branches take
/// about 22 KB in format 3.0 (a loop of runs), so the ring of wrap mode is 4K.
#[test]
fn modes() {
    let bin = program("long_loop");
    let dir = test_dir("qemu_plugin-modes");
    for (mode, size) in [("normal", "64M"), ("wrap", "4K"), ("continuous", "64K")] {
        let trace = dir.join(format!("{mode}.itr"));
        let opts = ["--backend", "qemu", "--mode", mode, "--buffer-size", size, "--segment-size", "64K"];
        record(&trace, &opts, &bin, &[]).assert_success();
        let report = report_json(&trace);
        let total = report["total_instructions"].as_u64().unwrap();
        let lost = report["lost_records"].as_u64().unwrap();
        if mode == "wrap" {
            assert!(lost > 0 && total < LONG_LOOP_INSTRUCTIONS, "wrap: {lost} lost, {total} instructions");
        } else {
            assert_eq!((total, lost), (LONG_LOOP_INSTRUCTIONS, 0), "{mode}");
        }
    }
}

/// libc programs: self counts of the program's own functions, plugin against ptrace stepping
/// (glibc's own work differs: the emulated CPU's features pick other string routines).
fn compare_with_ptrace(name: &str, funcs: &[&str]) -> serde_json::Value {
    let bin = program(name);
    let dir = test_dir(&format!("qemu_plugin-libc-{name}"));
    let plugin = dir.join("plugin.itr");
    record(&plugin, QEMU, &bin, &[]).assert_success();
    let stepped = dir.join("ptrace.itr");
    record(&stepped, &["--backend", "ptrace"], &bin, &[]).assert_success();
    let report = report_json(&plugin);
    let got = report_self_counts(&report, &bin);
    let want = report_self_counts(&report_json(&stepped), &bin);
    let mut diffs = BTreeMap::new();
    for f in funcs {
        assert!(want.get(*f).copied().unwrap_or(0) > 0, "ptrace trace has no {f}");
        if got.get(*f) != want.get(*f) {
            diffs.insert(*f, (got.get(*f).copied(), want.get(*f).copied()));
        }
    }
    assert!(diffs.is_empty(), "{name}: self counts (plugin, ptrace) differ: {diffs:?}");
    report
}

#[test]
fn libc_loops_and_recursion() {
    compare_with_ptrace("loops", &["main", "loops_fill", "loops_sum", "loops_nested", "loops_bits"]);
    let report = compare_with_ptrace("fib", &["main", "fib", "fib_asm"]);
    let bin = program("fib");
    assert_eq!(report_self_counts(&report, &bin).get("fib_asm"), Some(&FIB_ASM_SELF), "closed form in fib.c");
    assert_eq!(report_calls(&report, &bin).get("fib_asm"), Some(&FIB_CALLS));
}

#[test]
fn libc_function_pointers_and_jump_table() {
    compare_with_ptrace("funcptr", &["main", "fp_add", "fp_sub", "fp_mul", "fp_xor", "fp_fold"]);
    compare_with_ptrace("jumptable", &["main", "jt_classify"]);
}

/// Signals (delivered by qemu-user on the way out of the raise system call) and longjmp.
#[test]
fn libc_signals_and_longjmp() {
    let report = compare_with_ptrace("signal", &["main", "sig_handler", "sig_compute"]);
    let bin = program("signal");
    assert_eq!(report_calls(&report, &bin).get("sig_handler"), Some(&3), "three deliveries, each a call");
    let arc = arc_text(&test_dir_path("qemu_plugin-libc-signal").join("plugin.itr"));
    assert_eq!(arc.matches("signal_SIGUSR1:[kernel]").count(), 3, "three SIGUSR1 deliveries in the arc");
    compare_with_ptrace("longjmp", &["main", "lj_dive", "lj_round"]);
}

/// Guest threads: each gets its own stream (vCPU index) and thread id.
#[test]
fn libc_threads() {
    let report = compare_with_ptrace("threads", &["main", "thr_main", "thr_compute"]);
    let tids = report_thread_ids(&report, "tid");
    assert_eq!(tids.len(), 5, "main thread + 4 workers: {}", report["threads"]);
}

#[test]
fn missing_qemu_names_the_package() {
    let dir = test_dir("qemu_plugin-no-qemu");
    let o = run(Command::new(itrace_bin())
        .env("PATH", &dir)
        .args(["record", "--backend", "qemu", "-o"])
        .arg(dir.join("t.itr"))
        .arg("--")
        .arg(program("count_loop")));
    let line = o.assert_clean_error();
    assert!(line.contains("qemu-x86_64 is not installed") && line.contains("qemu-user"), "{line}");
}

/// A plugin built for another API version: qemu refuses it, itrace says so in one line.
#[test]
fn plugin_api_mismatch_is_one_line() {
    let dir = test_dir("qemu_plugin-api-mismatch");
    let src = dir.join("future.c");
    std::fs::write(
        &src,
        "int qemu_plugin_version = 99;\n\
         int qemu_plugin_install(unsigned long id, const void *info, int argc, char **argv) { return 0; }\n",
    )
    .unwrap();
    let so = dir.join("future.so");
    run(Command::new(require_tool("gcc")).args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src)).assert_success();
    let o = run(Command::new(itrace_bin())
        .env("ITRACE_QEMU_PLUGIN", &so)
        .args(["record", "--backend", "qemu", "-o"])
        .arg(dir.join("t.itr"))
        .arg("--")
        .arg(program("count_loop")));
    let line = o.assert_clean_error();
    assert!(line.contains("plugin API mismatch") && line.contains("install qemu-user 7.2"), "{line}");
    assert!(!Path::new(&dir.join("t.itr")).exists(), "no trace file is left behind");
}

#[test]
fn arch_mismatch_is_one_line() {
    let o = itrace(
        ["record", "--backend", "qemu", "--arch", "s390x", "--"]
            .iter()
            .map(|s| s.as_ref())
            .chain([program("count_loop").as_os_str()]),
    );
    let line = o.assert_clean_error();
    assert!(line.contains("is a x86_64 program, not s390x"), "{line}");
}
