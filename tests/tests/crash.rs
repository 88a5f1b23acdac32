//! A program that dies of SIGSEGV: the trace is complete up to the crash,
//! the last blocks are in the crashing function, and a comment names the
//! signal.

use itrace_tests::{
    checked_arc, program, record, report_calls, report_json, report_self_counts, test_dir, trailing_comments,
};

#[test]
fn crash_in_level3() {
    let bin = program("crash");
    let module = bin.to_string_lossy().into_owned();
    let dir = test_dir("crash");
    let trace = dir.join("t.itr");
    let rec = record(&trace, &[], &bin, &[]);
    rec.assert_no_panic();
    assert!(rec.status.code().is_some(), "itrace itself died: {}\n{}", rec.status, rec.stderr);
    assert!(rec.stdout.contains("crash: about to crash"), "the program did not run: {}", rec.stdout);

    let (text, lines) = checked_arc(&trace, &dir.join("t.arc"));

    // the last user-space block is in crash_level3, in the program
    let last_user = lines.iter().rev().find(|l| !l.kernel).expect("no user blocks");
    assert_eq!(
        (last_user.symbol.as_str(), last_user.module.as_str()),
        ("crash_level3", module.as_str()),
        "last user block (arc line {}) is not where the program crashed",
        last_user.lineno
    );
    let comments = trailing_comments(&text);
    assert!(
        comments.iter().any(|c| c.contains("SIGSEGV")),
        "no closing comment naming SIGSEGV; trailing comments: {comments:?}"
    );

    // the whole way down: main -> crash_level1 -> crash_level2 -> crash_level3
    let report = report_json(&trace);
    let calls = report_calls(&report, &bin);
    for f in ["crash_level1", "crash_level2", "crash_level3"] {
        assert_eq!(calls.get(f), Some(&1), "{f} called once: {calls:?}");
    }
    let own = report_self_counts(&report, &bin);
    assert!(own.get("main").copied().unwrap_or(0) > 0, "main: {own:?}");

    // blocks in order: the last CALLs of the program are the three levels
    let calls_in_order: Vec<&str> = lines
        .iter()
        .filter(|l| !l.kernel && l.module == module && l.type_code == 1)
        .map(|l| l.symbol.as_str())
        .collect();
    assert!(
        calls_in_order.ends_with(&["main", "crash_level1", "crash_level2"]),
        "the last calls should be main -> level1 -> level2 -> level3: {calls_in_order:?}"
    );
}
