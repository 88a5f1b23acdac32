//! The live status line of `itrace record` on a terminal, as a terminal shows it: `itrace record`
//! runs under a pseudo-terminal of 24 rows and 80 columns (`script`), and its bytes are drawn by a
//! terminal emulator (the vt100 crate). The truth is the program's own output: each of its lines
//! must be a row of its own, with nothing of the status line glued on; the status line is gone
//! at the end and the whole screen scrolls again.

use itrace_tests::{itrace_bin, require_tool, run, test_dir};
use std::path::Path;
use std::process::Command;

const ROWS: u16 = 24;
const COLS: u16 = 80;

/// A program that writes a line after 0.7 s and another after 1.4 s: the status line is drawn
/// before each.
const PROGRAM: &str = r#"
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec t = {0, 700000000};
    nanosleep(&t, 0);
    printf("39998 79997\n");
    fflush(stdout);
    nanosleep(&t, 0);
    printf("done\n");
    return 0;
}
"#;

/// The screen rows (right-trimmed) after `shell` ran in a 24x80 pseudo-terminal.
fn screen_after(shell: &str) -> Vec<String> {
    let out = run(Command::new("script").args(["-qfec", shell, "/dev/null"]).env("TERM", "xterm"));
    out.assert_success();
    let mut parser = vt100::Parser::new(ROWS, COLS, 0);
    parser.process(out.stdout.as_bytes());
    parser.screen().rows(0, COLS).map(|r| r.trim_end().to_string()).collect()
}

fn build(dir: &Path) -> std::path::PathBuf {
    build_from(dir, PROGRAM)
}

fn build_from(dir: &Path, program: &str) -> std::path::PathBuf {
    require_tool("gcc");
    let src = dir.join("prints.c");
    std::fs::write(&src, program).unwrap();
    let exe = dir.join("prints");
    run(Command::new("gcc").arg("-O1").arg("-o").arg(&exe).arg(&src)).assert_success();
    exe
}

#[test]
fn program_output_is_never_glued_to_the_status_line() {
    require_tool("script");
    require_tool("stty");
    let dir = test_dir("status-line-glue");
    let exe = build(&dir);
    let trace = dir.join("t.itr");
    let rows = screen_after(&format!(
        "stty rows {ROWS} cols {COLS}; {} record -o {} {}",
        itrace_bin().display(),
        trace.display(),
        exe.display()
    ));
    let screen = rows.join("\n");
    assert!(rows.iter().any(|r| r == "39998 79997"), "the program's first line is not a row of its own:\n{screen}");
    assert!(rows.iter().any(|r| r == "done"), "the program's last line is not a row of its own:\n{screen}");
    assert!(!screen.contains("recording "), "the status line is left on the screen:\n{screen}");
    assert!(screen.contains("itrace: "), "no summary line:\n{screen}");
}

#[test]
fn whole_screen_scrolls_again_after_recording() {
    require_tool("script");
    require_tool("stty");
    require_tool("seq");
    let dir = test_dir("status-line-scroll");
    let exe = build(&dir);
    let trace = dir.join("t.itr");
    let rows = screen_after(&format!(
        "stty rows {ROWS} cols {COLS}; {} record -o {} {}; seq 1 40",
        itrace_bin().display(),
        trace.display(),
        exe.display()
    ));
    // seq's 40 lines scroll the whole screen: 40 on the row above the cursor's (the last
    // one, left empty by the final newline), and nothing of the status line anywhere.
    let want: Vec<String> = (18..=40).map(|n| n.to_string()).chain([String::new()]).collect();
    assert_eq!(rows, want, "the screen after seq:\n{}", rows.join("\n"));
}

#[test]
fn no_status_line_without_a_terminal() {
    let dir = test_dir("status-line-none");
    let exe = build(&dir);
    let trace = dir.join("t.itr");
    let out = run(Command::new(itrace_bin()).arg("record").arg("-o").arg(&trace).arg(&exe));
    out.assert_success();
    assert_eq!(out.stdout, "39998 79997\ndone\n");
    assert!(!out.stderr.contains('\x1b') && !out.stderr.contains("recording "), "{:?}", out.stderr);
}

/// Under `--backend qemu` the plugin writes the trace in qemu's process; its writer tells
/// itrace the instructions and branches written so far: the status line shows them (seen in
/// the bytes drawn on the last row while the program sleeps 3 s after its first line), and
/// the counts it shows never exceed the trace's (`itrace report`).
#[test]
fn qemu_backend_status_line_shows_instructions_and_branches() {
    require_tool("script");
    require_tool("stty");
    require_tool("qemu-x86_64");
    let dir = test_dir("status-line-qemu");
    let exe = build_from(&dir, &PROGRAM.replace("{0, 700000000}", "{3, 0}"));
    let trace = dir.join("t.itr");
    let shell = format!(
        "stty rows {ROWS} cols 120; {} record --backend qemu -o {} {}",
        itrace_bin().display(),
        trace.display(),
        exe.display()
    );
    let out = run(Command::new("script").args(["-qfec", &shell, "/dev/null"]).env("TERM", "xterm"));
    out.assert_success();
    // Each redraw: save the cursor, go to the last row, clear it, the text, restore.
    let draws: Vec<&str> = out
        .stdout
        .split(&format!("\x1b[{ROWS};1H\x1b[2K"))
        .skip(1)
        .map(|d| d.split("\x1b8").next().unwrap_or(""))
        .filter(|d| !d.is_empty())
        .collect();
    let number = |d: &str, what: &str| -> Option<u64> {
        let before = d.split(&format!(" {what},")).next().filter(|b| b.len() < d.len())?;
        before.rsplit(' ').next()?.replace(',', "").parse().ok()
    };
    let counted: Vec<(u64, u64)> =
        draws.iter().filter_map(|d| Some((number(d, "instructions")?, number(d, "branches")?))).collect();
    assert!(!counted.is_empty(), "no status line with instructions and branches: {draws:?}");
    let report = itrace_tests::report_json(&trace);
    let total = report["total_instructions"].as_u64().unwrap();
    let (ins, br) = *counted.last().unwrap();
    assert!(ins > 0 && ins <= total, "status line {ins} instructions, trace {total}");
    assert!(br > 0 && br <= ins, "status line {br} branches for {ins} instructions");
}
