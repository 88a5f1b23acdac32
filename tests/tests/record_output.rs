//! `itrace record` keeps the trace already at its output path as `PATH.old` (as perf keeps
//! perf.data.old), byte for byte.

use itrace_tests::{program, record, test_dir};

#[test]
fn previous_trace_is_kept_as_old() {
    let dir = test_dir("record-output-old");
    let trace = dir.join("itrace.itr");
    let old = dir.join("itrace.itr.old");
    let prog = program("loops");
    record(&trace, &[], &prog, &[]).assert_success();
    let first = std::fs::read(&trace).unwrap();
    assert!(!old.exists());
    record(&trace, &[], &prog, &[]).assert_success();
    assert_eq!(std::fs::read(&old).unwrap(), first, "the first trace is not itrace.itr.old");
    let second = std::fs::read(&trace).unwrap();
    assert_ne!(second, first, "the second recording wrote nothing new");
    record(&trace, &[], &prog, &[]).assert_success();
    assert_eq!(std::fs::read(&old).unwrap(), second, "the second trace is not itrace.itr.old");
}
