//! Attaching to a running process (`itrace record -p PID --duration 1`):
//! the trace has records, and the process carries on undisturbed.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

// 500 rounds with 10 ms sleeps: about 5 s, ample time to attach
const ROUNDS: &str = "500";

#[test]
fn attach_to_spinner() {
    let spinner = program("spinner");
    let dir = test_dir("attach-spinner");

    // the expected result, from an untraced run without the sleeps
    let reference = run(Command::new(&spinner).args([ROUNDS, "0"]));
    reference.assert_success();
    let want = reference
        .stdout
        .lines()
        .find(|l| l.starts_with("spinner: result="))
        .expect("reference result line")
        .to_string();

    let child = Command::new(&spinner)
        .args([ROUNDS, "10000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start spinner");
    let mut child = KillOnDrop(child);
    let pid = child.0.id();
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).expect("read start line");
    assert_eq!(first.trim_end(), format!("spinner: started pid={pid}"));

    let trace = dir.join("t.itr");
    let rec = itrace([
        "record".as_ref(),
        "-p".as_ref(),
        pid.to_string().as_ref(),
        "--duration".as_ref(),
        "1".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
    ]);
    rec.assert_success();

    // the spinner finishes normally with the right result
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read spinner output");
    let status = wait_with_guard(&mut child.0, "spinner");
    assert!(status.success(), "spinner exited with {status} after the trace");
    assert_eq!(
        rest.lines().find(|l| l.starts_with("spinner: result=")),
        Some(want.as_str()),
        "spinner output after detach:\n{rest}"
    );

    let report = report_json(&trace);
    assert!(report["total_instructions"].as_u64().unwrap_or(0) > 0, "no instructions recorded: {report}");
    // spin_round is where the spinner computes: a second of tracing sees it
    let own = report_self_counts(&report, &spinner);
    assert!(own.get("spin_round").copied().unwrap_or(0) > 0, "spin_round not in the trace; spinner functions: {own:?}");
    let threads = report["threads"].as_array().expect("threads");
    assert!(
        threads.iter().all(|t| t["pid"].as_u64() == Some(pid as u64)),
        "threads of another process in the trace: {threads:?}"
    );

    let text = arc_text(&trace);
    std::fs::write(dir.join("t.arc"), &text).unwrap();
    let lines = arc_lines(&text);
    check_arc_consistency(&lines);
    assert!(!lines.is_empty());
}
