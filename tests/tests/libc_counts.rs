//! The libc programs traced by itrace: `report --json` per-function `self`
//! counts of the programs' own functions equal callgrind's self Ir.

use itrace_tests::{
    callgrind_profile, program, record, report_calls, report_json, report_self_counts, report_thread_ids, test_dir,
    FIB_ASM_SELF, FIB_CALLS,
};
use std::collections::BTreeMap;

/// Traces `name args` (with `options`), runs callgrind on the same command,
/// and compares the self counts of `funcs` (module = the program).
fn compare(name: &str, args: &[&str], options: &[&str], trace_children: bool, funcs: &[&str]) -> serde_json::Value {
    let bin = program(name);
    let dir = test_dir(&format!("libc_counts-{name}{}", options.join("")));
    let trace = dir.join("t.itr");
    record(&trace, options, &bin, args).assert_success();
    let report = report_json(&trace);
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&report).unwrap()).unwrap();
    let traced = report_self_counts(&report, &bin);
    let oracle = callgrind_profile(&bin, args, trace_children).self_counts_in(&bin);

    let mut diffs = BTreeMap::new();
    for f in funcs {
        let want = oracle.get(*f).copied();
        assert!(want.unwrap_or(0) > 0, "oracle problem: callgrind reports nothing for {name}: {f}");
        let got = traced.get(*f).copied();
        if got != want {
            diffs.insert(*f, (got, want));
        }
    }
    assert!(
        diffs.is_empty(),
        "{name}: self instruction counts (itrace, callgrind) differ: {diffs:?}\n\
         itrace's functions in {}: {traced:?}",
        bin.display()
    );
    assert!(report["total_instructions"].as_u64().unwrap_or(0) > 0);
    report
}

#[test]
fn loops() {
    compare("loops", &[], &[], false, &["main", "loops_fill", "loops_sum", "loops_nested", "loops_bits"]);
}

#[test]
fn fib_recursion() {
    let report = compare("fib", &[], &[], false, &["main", "fib", "fib_asm"]);
    let bin = program("fib");
    let own = report_self_counts(&report, &bin);
    assert_eq!(own.get("fib_asm"), Some(&FIB_ASM_SELF), "closed form in fib.c");
    let calls = report_calls(&report, &bin);
    assert_eq!(calls.get("fib_asm"), Some(&FIB_CALLS), "2 F(16) - 1 calls");
    assert_eq!(calls.get("fib"), Some(&FIB_CALLS), "2 F(16) - 1 calls");
}

#[test]
fn function_pointers() {
    let report = compare("funcptr", &[], &[], false, &["main", "fp_add", "fp_sub", "fp_mul", "fp_xor", "fp_fold"]);
    // 200 calls through the table (50 each) + fp_fold's callbacks
    let calls = report_calls(&report, &program("funcptr"));
    assert_eq!(calls.get("fp_add"), Some(&(50 + 50)));
    assert_eq!(calls.get("fp_sub"), Some(&50));
    assert_eq!(calls.get("fp_mul"), Some(&50));
    assert_eq!(calls.get("fp_xor"), Some(&(50 + 20)));
    assert_eq!(calls.get("fp_fold"), Some(&2));
}

#[test]
fn jump_table() {
    let report = compare("jumptable", &[], &[], false, &["main", "jt_classify"]);
    let calls = report_calls(&report, &program("jumptable"));
    assert_eq!(calls.get("jt_classify"), Some(&300));
}

#[test]
fn setjmp_longjmp() {
    let report = compare("longjmp", &[], &[], false, &["main", "lj_dive", "lj_round"]);
    let calls = report_calls(&report, &program("longjmp"));
    // lj_round(8 + i) for i in 0..5 dives 9 + i levels
    assert_eq!(calls.get("lj_round"), Some(&5));
    assert_eq!(calls.get("lj_dive"), Some(&(9 + 10 + 11 + 12 + 13)));
}

#[test]
fn signal_handler() {
    let report = compare("signal", &[], &[], false, &["main", "sig_handler", "sig_compute"]);
    let calls = report_calls(&report, &program("signal"));
    assert_eq!(calls.get("sig_compute"), Some(&3));
}

#[test]
fn threads() {
    let report = compare("threads", &[], &[], false, &["main", "thr_main", "thr_compute"]);
    let calls = report_calls(&report, &program("threads"));
    assert_eq!(calls.get("thr_compute"), Some(&4));
    let tids = report_thread_ids(&report, "tid");
    assert_eq!(tids.len(), 5, "main thread + 4 workers: {}", report["threads"]);
    let pids = report_thread_ids(&report, "pid");
    assert_eq!(pids.len(), 1, "one process: {}", report["threads"]);
}

/// fork + exec, followed with --follow-forks (itrace) and
/// --trace-children=yes (callgrind). fe_spawn and fe_exec_self are left
/// out: callgrind cannot see part of the child's work in them (see
/// forkexec.c).
#[test]
fn fork_and_exec() {
    let report = compare(
        "forkexec",
        &[],
        &["--follow-forks"],
        true,
        &["main", "fe_mix", "fe_parent_work", "fe_child_main", "fe_child_work", "fe_exec_work"],
    );
    let calls = report_calls(&report, &program("forkexec"));
    assert_eq!(calls.get("fe_mix"), Some(&3), "parent, child, exec'd child");
    assert_eq!(calls.get("fe_spawn"), Some(&1));
    assert_eq!(calls.get("fe_exec_self"), Some(&1));
    let pids = report_thread_ids(&report, "pid");
    assert_eq!(pids.len(), 2, "parent and child processes: {}", report["threads"]);
}

// The block-step decoder (fed by `--emulate-block-step`, see exact_counts.rs)
// on the programs with signals, longjmp, threads and fork+exec.

#[test]
fn signal_handler_block_step() {
    compare("signal", &[], &["--emulate-block-step"], false, &["main", "sig_handler", "sig_compute"]);
}

#[test]
fn setjmp_longjmp_block_step() {
    compare("longjmp", &[], &["--emulate-block-step"], false, &["main", "lj_dive", "lj_round"]);
}

#[test]
fn threads_block_step() {
    compare("threads", &[], &["--emulate-block-step"], false, &["main", "thr_main", "thr_compute"]);
}

#[test]
fn fork_and_exec_block_step() {
    compare(
        "forkexec",
        &[],
        &["--follow-forks", "--emulate-block-step"],
        true,
        &["main", "fe_mix", "fe_parent_work", "fe_child_main", "fe_child_work", "fe_exec_work"],
    );
}
