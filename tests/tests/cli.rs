//! The command line as a user meets it: help text and the report table (insta snapshots,
//! whose content was read and checked against the hand counts of count_loop.S), exit
//! statuses, quiet ends of pipes, the default trace file, and errors said once, before the
//! program runs.

use itrace_tests::{itrace, itrace_bin, program, record, report_json, run, test_dir, wait_with_guard};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// itrace's help as a terminal of 100 columns shows it (clap wraps to the terminal; a pipe
/// has none, so the width is fixed here).
fn help(args: &[&str]) -> String {
    let o = run(Command::new(itrace_bin()).args(args).env("COLUMNS", "100"));
    o.assert_success();
    o.stdout
}

#[test]
fn help_snapshots() {
    insta::assert_snapshot!("help", help(&["--help"]));
    insta::assert_snapshot!("record_help", help(&["record", "--help"]));
    insta::assert_snapshot!("report_help", help(&["report", "--help"]));
}

#[test]
fn help_lists_the_environment() {
    let text = help(&["--help"]);
    for var in ["ITRACE_QEMU_PLUGIN", "PATH", "COLUMNS", "LD_PRELOAD"] {
        assert!(text.lines().any(|l| l.trim_start().starts_with(var)), "--help does not list {var}:\n{text}");
    }
}

/// The report of count_loop.S, whose every count is worked out by hand in its header:
/// _start 3007 self (2 + 3000 + 2 + 3) and 3011 inclusive, check 4 self and 1 call, 3011
/// instructions and 1003 taken branches in all. Paths and pids, which change from run to run, are replaced.
#[test]
fn report_table_of_count_loop() {
    let dir = test_dir("cli-report_table");
    let trace = dir.join("t.itr");
    let bin = program("count_loop");
    record(&trace, &[], &bin, &[]).assert_success();
    let o = itrace([OsStr::new("report"), trace.as_os_str(), OsStr::new("--width"), OsStr::new("100")]);
    o.assert_success();
    // The first line says where the trace came from: the command that recorded it (as the
    // recorder's argv: see `record`), the working directory and the itrace version.
    let (origin, text) = o.stdout.split_once('\n').expect("a first line");
    let text = text.to_string();
    let cwd = std::env::current_dir().unwrap();
    let command = format!("`{} record -o {} -- {}`", itrace_bin().display(), trace.display(), bin.display());
    assert!(origin.starts_with(&format!("recorded by {command} in {}, ", cwd.display())), "{origin}");
    assert!(origin.ends_with(&format!("(itrace {})", env!("CARGO_PKG_VERSION"))), "{origin}");
    let row = |name: &str| -> Vec<String> {
        let line = text.lines().find(|l| l.split_whitespace().nth(4) == Some(name)).unwrap_or_else(|| {
            panic!("no row for {name}:\n{text}");
        });
        line.split_whitespace().map(String::from).collect()
    };
    assert!(text.starts_with("3011 instructions, 1003 taken branches, 0 records lost"), "{text}");
    let start = row("_start");
    assert_eq!(
        (start[0].as_str(), start[2].as_str(), start[3].as_str(), start[5].as_str()),
        ("3007", "3011", "0", "count_loop"),
        "_start: self, inclusive (all: it is where the trace starts), calls, module basename"
    );
    let check = row("check");
    assert_eq!(
        (check[0].as_str(), check[2].as_str(), check[3].as_str()),
        ("4", "4", "1"),
        "check: self inclusive calls"
    );

    let pid_line = text.lines().skip_while(|l| *l != "Threads").nth(2).expect("a thread row").to_string();
    let masked = text
        .replace(&pid_line, &format!("{:>8} {:>8}{}", "PID", "TID", &pid_line[17..]))
        .replace(&bin.display().to_string(), "<programs>/count_loop");
    // The step method is the fastest the probes find on this machine; the counts are the same.
    let masked = ["ptrace-hwbreak", "ptrace-singleblock", "ptrace-singlestep", "translated"]
        .iter()
        .fold(masked, |t, m| t.replace(m, "<step method>"));
    insta::assert_snapshot!("count_loop_report", masked);
}

#[test]
fn cut_tables_say_so() {
    let dir = test_dir("cli-cut_tables");
    let trace = dir.join("t.itr");
    record(&trace, &[], &program("count_loop"), &[]).assert_success();
    let o = itrace([OsStr::new("report"), trace.as_os_str(), OsStr::new("--top"), OsStr::new("1")]);
    o.assert_success();
    assert!(o.stdout.contains("... 1 more function (--top 0 for all)"), "{}", o.stdout);
    let all = itrace([OsStr::new("report"), trace.as_os_str(), OsStr::new("--top"), OsStr::new("0")]);
    assert!(!all.stdout.contains("more"), "{}", all.stdout);
}

/// Long names are cut to the width with `…`; the JSON report keeps them whole.
#[test]
fn report_fits_the_width() {
    let dir = test_dir("cli-report_width");
    let trace = dir.join("t.itr");
    record(&trace, &[], &program("plain/calib_cpp"), &[]).assert_success();
    let o = itrace([OsStr::new("report"), trace.as_os_str(), OsStr::new("--width"), OsStr::new("80")]);
    o.assert_success();
    let table: Vec<&str> =
        o.stdout.lines().skip_while(|l| !l.starts_with("Functions")).take_while(|l| !l.is_empty()).collect();
    for l in &table {
        assert!(l.chars().count() <= 80, "wider than 80 columns: {l}");
    }
    let json = report_json(&trace);
    let names: Vec<&str> = json["functions"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    let cut: Vec<&str> =
        table.iter().filter_map(|l| l.split_whitespace().nth(4)).filter(|n| n.ends_with('…')).collect();
    assert!(!cut.is_empty(), "no name was cut at 80 columns:\n{}", o.stdout);
    for c in cut {
        let head = c.trim_end_matches('…');
        assert!(names.iter().any(|n| n.starts_with(head) && n.len() > head.len()), "{c} is no whole name's start");
    }
}

#[test]
fn record_exits_with_the_programs_status() {
    let dir = test_dir("cli-exit_status");
    let o = record(&dir.join("false.itr"), &[], Path::new("/bin/false"), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", o.stderr);
    assert!(o.stderr.contains("the program exited with status 1"), "{}", o.stderr);
    let o = record(&dir.join("crash.itr"), &[], &program("crash"), &[]);
    assert_eq!(o.status.code(), Some(128 + 11), "{}", o.stderr);
    assert!(o.stderr.contains("killed by signal SIGSEGV (11)"), "{}", o.stderr);
    record(&dir.join("true.itr"), &[], Path::new("/bin/true"), &[]).assert_success();
}

#[test]
fn usage_errors_exit_2() {
    let none = itrace(std::iter::empty::<&str>());
    assert_eq!(none.status.code(), Some(2), "itrace with no arguments");
    assert!(none.stderr.contains("Usage:"), "{}", none.stderr);
    let bad = itrace(["record", "--no-such-option"]);
    assert_eq!(bad.status.code(), Some(2));
    bad.assert_clean_error();
}

/// `itrace record ./prog args`, no `--`: the program's own options stay its own.
#[test]
fn program_without_double_dash() {
    let dir = test_dir("cli-no_double_dash");
    let trace = dir.join("t.itr");
    let o = run(Command::new(itrace_bin())
        .arg("record")
        .arg("-o")
        .arg(&trace)
        .arg("/bin/echo")
        .args(["-n", "--mode", "wrap"]));
    o.assert_success();
    assert_eq!(o.stdout, "--mode wrap", "echo got its own options");
    let header = itrace([OsStr::new("dump"), trace.as_os_str()]);
    assert!(
        header.stdout.starts_with("# itrace trace")
            && header.stdout.lines().next().unwrap().contains("mode=continuous")
    );
}

/// `report`, `arc` and `dump` read itrace.itr by default and take `-i FILE` as perf does.
#[test]
fn default_trace_and_input_option() {
    let dir = test_dir("cli-default_trace");
    let o = run(Command::new(itrace_bin()).current_dir(&dir).args(["record", "/bin/true"]));
    o.assert_success();
    assert!(dir.join("itrace.itr").is_file());
    for cmd in ["report", "arc", "dump"] {
        let by_default = run(Command::new(itrace_bin()).current_dir(&dir).arg(cmd));
        by_default.assert_success();
        let by_option = run(Command::new(itrace_bin()).current_dir(&dir).args([cmd, "-i", "itrace.itr"]));
        by_option.assert_success();
        assert_eq!(by_default.stdout, by_option.stdout, "{cmd}");
    }
    std::fs::remove_file(dir.join("itrace.itr")).unwrap();
    let none = run(Command::new(itrace_bin()).current_dir(&dir).arg("report"));
    let line = none.assert_clean_error();
    assert!(line.contains("itrace.itr"), "{line}");
}

/// Reading a few lines and closing the pipe, as `| head` does: itrace ends quietly.
#[test]
fn closed_pipe_is_quiet() {
    let dir = test_dir("cli-closed_pipe");
    let trace = dir.join("t.itr");
    record(&trace, &[], Path::new("/bin/true"), &[]).assert_success();
    for args in [vec!["arc"], vec!["report", "--json"], vec!["dump"]] {
        let mut child = Command::new(itrace_bin())
            .args(&args)
            .arg(&trace)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert!(!first.is_empty(), "{args:?}: no output");
        drop(out);
        let status = wait_with_guard(&mut child, "itrace with a closed pipe");
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        // Hints that /bin/true is stripped are fine; nothing else (no broken-pipe error).
        let err: Vec<&str> = err.lines().filter(|l| !l.starts_with("itrace: hint: ")).collect();
        assert!(err.is_empty(), "{args:?}: stderr after the reader left: {err:?}");
        assert!(status.success(), "{args:?}: {status}");
    }
}

#[test]
fn errors_are_said_once() {
    let o = itrace(["report", "/nonexistent/t.itr"]);
    let line = o.assert_clean_error();
    assert_eq!(line.matches("No such file or directory").count(), 1, "{line}");
    let dir = test_dir("cli-not_a_trace");
    let f = dir.join("notes.txt");
    std::fs::write(&f, "root:x:0:0\n").unwrap();
    let line = itrace([OsStr::new("report"), f.as_os_str()]).assert_clean_error();
    assert!(line.contains("0x72 0x6f 0x6f 0x74"), "bytes as 0x hex: {line}");
}

/// A --start naming no function fails before the program runs: it does not create its file.
#[test]
fn unknown_start_function_fails_before_running() {
    let dir = test_dir("cli-unknown_start");
    let marker = dir.join("ran");
    let o = record(
        &dir.join("t.itr"),
        &["--start", "no_such_function_xyz"],
        Path::new("/usr/bin/touch"),
        &[marker.to_str().unwrap()],
    );
    let line = o.assert_clean_error();
    assert!(line.contains("no_such_function_xyz"), "{line}");
    assert!(!marker.exists(), "the program ran although its trace could not start");
    // A function that exists starts tracing at its entry: check's 4 instructions, then
    // _start's last 3 (count_loop.S).
    let t2 = dir.join("t2.itr");
    record(&t2, &["--start", "check"], &program("count_loop"), &[]).assert_success();
    assert_eq!(report_json(&t2)["total_instructions"].as_u64(), Some(7));
}

#[test]
fn completions_and_man_pages() {
    let bash = itrace(["completions", "bash"]);
    bash.assert_success();
    assert!(bash.stdout.contains("_itrace()") && bash.stdout.contains("--follow-forks"), "{}", bash.stdout);
    for shell in ["zsh", "fish"] {
        itrace(["completions", shell]).assert_success();
    }
    let dir = test_dir("cli-man");
    itrace([OsStr::new("man"), OsStr::new("-o"), dir.as_os_str()]).assert_success();
    for page in ["itrace.1", "itrace-record.1", "itrace-report.1", "itrace-arc.1"] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page} is not a man page");
    }
    let record_page = std::fs::read_to_string(dir.join("itrace-record.1")).unwrap();
    assert!(record_page.contains("follow\\-forks"), "itrace-record.1 lacks --follow-forks");
}
