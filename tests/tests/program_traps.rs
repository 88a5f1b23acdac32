//! Programs that take their own SIGTRAP and SIGILL (issue 27, part 2): a SIGTRAP handler for
//! `raise(SIGTRAP)` twice, an `int3` and one more raise (program_sigtrap.c), and rounds of
//! `int3` then `ud2` with a SIGILL handler that siglongjmps out (program_traps.c). Under every
//! step method the program must run as it runs untraced (exit status and output), and its
//! handlers must be traced: their calls are the hand counts of the sources, and the self
//! counts of the program's own functions equal callgrind's (valgrind delivers these signals
//! as the kernel does: the untraced output is the same under it). The program's functions
//! only are compared, so the comparison does not depend on which glibc code the CPU picks.
//! program_sigtrap_sent.c has its SIGTRAPs sent by a child process with kill(): each merges
//! with a step trap of the parent and must be told apart by its siginfo.

use itrace_tests::{
    callgrind_profile, checked_arc, program, record, report_calls, report_json, report_self_counts, run, test_dir,
};
use std::process::Command;

/// The step methods of the ptrace backend (`--step`).
const STEPS: &[&str] = &["auto", "block", "instruction"];

/// Runs `name` untraced: (exit code, stdout).
fn untraced(name: &str) -> (Option<i32>, String) {
    let o = run(&mut Command::new(program(name)));
    (o.status.code(), o.stdout)
}

/// Records `name` with `options`: the program's exit code and output, the report.
fn traced(name: &str, options: &[&str]) -> (Option<i32>, String, serde_json::Value) {
    let bin = program(name);
    let dir = test_dir(&format!("program-traps-{name}{}", options.join("").replace('-', "")));
    let trace = dir.join("t.itr");
    let rec = record(&trace, options, &bin, &[]);
    // itrace exits with the program's status (128 + signal when a signal killed it).
    let report = report_json(&trace);
    checked_arc(&trace, &dir.join("t.arc"));
    (rec.status.code(), rec.stdout, report)
}

/// Under each of `runs` (itrace options), `name` exits and prints as untraced, its functions in
/// `calls` are called that many times, and the self counts of `own` equal callgrind's. With
/// `same_totals` (a program whose path does not depend on timing), every run counts the same
/// instructions.
fn runs_as_untraced(name: &str, runs: &[Vec<&str>], calls: &[(&str, u64)], own: &[&str], same_totals: bool) {
    let bin = program(name);
    let (code, stdout) = untraced(name);
    assert_eq!(code, Some(0), "{name} untraced: exit code (stdout {stdout:?})");
    let oracle = callgrind_profile(&bin, &[], false).self_counts_in(&bin);
    let mut totals = Vec::new();
    for options in runs {
        let (tcode, tstdout, report) = traced(name, options);
        assert_eq!((tcode, &tstdout), (code, &stdout), "{name} {options:?}: exit code and output (traced, untraced)");
        let traced_calls = report_calls(&report, &bin);
        for (f, n) in calls {
            assert_eq!(traced_calls.get(*f), Some(n), "{name} {options:?}: calls of {f} (traced, hand count)");
        }
        let traced_self = report_self_counts(&report, &bin);
        let differ: Vec<String> = own
            .iter()
            .filter(|f| traced_self.get(**f) != oracle.get(**f))
            .map(|f| format!("{f}: itrace {:?}, callgrind {:?}", traced_self.get(*f), oracle.get(*f)))
            .collect();
        assert!(differ.is_empty(), "{name} {options:?}: self instructions differ from callgrind's: {differ:?}");
        totals.push((options.clone(), report["total_instructions"].as_u64().expect("total_instructions")));
    }
    // Every step method counts the same instructions (single steps are the oracle of the others).
    if same_totals {
        assert!(totals.windows(2).all(|w| w[0].1 == w[1].1), "{name}: total instructions per step method: {totals:?}");
    }
}

fn step_runs() -> Vec<Vec<&'static str>> {
    STEPS.iter().map(|s| vec!["--step", *s]).collect()
}

#[test]
fn sigtrap_handler_of_the_program_gets_raise_and_int3_under_every_step_method() {
    // Hand count (program_sigtrap.c): raise, raise, int3, raise: 4 calls of the handler.
    runs_as_untraced("program_sigtrap", &step_runs(), &[("pt_on_trap", 4)], &["main", "pt_on_trap"], true);
}

#[test]
fn int3_ud2_and_siglongjmp_out_of_the_handler_under_every_step_method() {
    // Hand count (program_traps.c): 3 rounds of int3 (SIGTRAP handler) then ud2 (SIGILL
    // handler, which siglongjmps back to main).
    runs_as_untraced(
        "program_traps",
        &step_runs(),
        &[("pt2_on_trap", 3), ("pt2_on_ill", 3), ("pt2_round", 3)],
        &["main", "pt2_on_trap", "pt2_on_ill", "pt2_round"],
        true,
    );
}

#[test]
fn traps_inside_a_region_on_the_ptrace_backend() {
    // Hand count (region_traps.c): 2 raises, an int3, a raise, then 3 int3 of rt_round: 7;
    // 3 ud2.
    let runs: Vec<Vec<&str>> = STEPS.iter().map(|s| vec!["--region", "--backend", "ptrace", "--step", *s]).collect();
    runs_as_untraced(
        "region_traps",
        &runs,
        &[("rt_on_trap", 7), ("rt_on_ill", 3), ("rt_round", 3)],
        &["rt_on_trap", "rt_on_ill", "rt_round"],
        true,
    );
}

#[test]
fn sigtrap_sent_by_another_process_reaches_the_handler_under_every_step_method() {
    // Hand count (program_sigtrap_sent.c): the child sends 5 SIGTRAPs, one per acknowledgement.
    runs_as_untraced("program_sigtrap_sent", &step_runs(), &[("ps_on_trap", 5)], &["ps_on_trap"], false);
}
