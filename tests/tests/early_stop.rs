//! A stop (SIGTERM) that reaches itrace while it is still starting, before it launched the
//! program (issue 27, part 6): the program is launched all the same and runs on, as it does
//! for a stop a moment later, and itrace says what happened. Before, `--region` with the
//! in-process backend said "nothing was traced" and never ran the program.
//!
//! The moment is not left to chance: strace delivers the SIGTERM to the recording process
//! when its `timer_create` (the status tick, set up right before launching) returns, and its
//! log shows that this came before the program's exec. strace follows every process, so the
//! ptrace backend, which cannot trace a program strace traces, is not covered here.

use itrace_tests::{itrace_bin, program, require_tool, run, test_dir};
use std::process::Command;

fn program_runs_on_after_an_early_stop(name: &str, options: &[&str]) {
    let strace = require_tool("strace");
    let dir = test_dir(&format!("early-stop-{name}"));
    let (trace, log) = (dir.join("t.itr"), dir.join("strace.log"));
    let prog = program("inherit");
    let out = run(Command::new(strace)
        .args(["-f", "-o"])
        .arg(&log)
        .args(["-e", "trace=timer_create,execve", "-e", "inject=timer_create:signal=SIGTERM"])
        .arg(itrace_bin())
        .args(["record", "-o"])
        .arg(&trace)
        .args(options)
        .arg("--")
        .arg(&prog));
    let log = std::fs::read_to_string(&log).expect("strace log");
    // The stop came before the program was started.
    let stop_at = log.find("--- SIGTERM").unwrap_or_else(|| panic!("{name}: strace sent no SIGTERM:\n{log}"));
    // (The one exec before it is itrace's own; the program's, or qemu's, comes after.)
    let execs_before = log[..stop_at].matches("execve(").count();
    assert_eq!(execs_before, 1, "{name}: the SIGTERM came after the program started:\n{log}");
    // The program ran to its end, and itrace ended normally, saying it stopped.
    assert!(
        out.stdout.lines().any(|l| l == "work 1"),
        "{name}: the program did not run\n{}\n{}",
        out.stdout,
        out.stderr
    );
    out.assert_success();
    assert!(
        !out.stderr.contains("nothing was traced"),
        "{name}: itrace says nothing was traced, yet the program ran:\n{}",
        out.stderr
    );
    let said = out.stderr.lines().find(|l| l.contains("tracing ended:")).unwrap_or_default();
    assert!(
        said.contains("detached") || said.contains("stopped on request"),
        "{name}: itrace does not say it stopped on the request:\n{}",
        out.stderr
    );
    assert!(trace.is_file(), "{name}: no trace file");
}

#[test]
fn in_process_region_recorder_launches_the_program_after_an_early_stop() {
    program_runs_on_after_an_early_stop("inproc", &["--region", "--backend", "inproc"]);
}

#[test]
fn qemu_backend_launches_the_program_after_an_early_stop() {
    program_runs_on_after_an_early_stop("qemu", &["--backend", "qemu"]);
}
