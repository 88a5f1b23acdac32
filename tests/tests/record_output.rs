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
    // The `.old` replaced (freed on a thread of its own) left no name behind.
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["itrace.itr", "itrace.itr.old"], "files other than the trace and its .old");
}

/// `date -u '+%F %T UTC'`: now, as the trace writes its date.
fn date_u() -> String {
    let o = itrace_tests::run(std::process::Command::new("date").args(["-u", "+%F %T UTC"]));
    o.assert_success();
    o.stdout.trim().to_string()
}

fn uname(flag: &str) -> String {
    let o = itrace_tests::run(std::process::Command::new("uname").arg(flag));
    o.assert_success();
    o.stdout.trim().to_string()
}

/// The trace says where it came from, in `info` and on the report's first line: the command
/// line (an argument with a space quoted), the working directory, the date (between the
/// clock before and after recording), the host and kernel (`uname -n`, `-r`, `-m`) and the
/// itrace version. A trace of an older itrace says it has none.
#[test]
fn trace_says_where_it_came_from() {
    let dir = test_dir("record-output-origin");
    let prog = program("loops");
    let before = date_u();
    let o = itrace_tests::run(
        std::process::Command::new(itrace_tests::itrace_bin())
            .current_dir(&dir)
            .args(["record", "-o", "t.itr", "--"])
            .arg(&prog)
            .arg("an argument"),
    );
    o.assert_success();
    let after = date_u();
    let info = itrace_tests::itrace([std::ffi::OsStr::new("info"), dir.join("t.itr").as_os_str()]);
    info.assert_success();
    let field = |name: &str| -> String {
        let line =
            info.stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}:\n{}", info.stdout));
        line[name.len()..].trim().to_string()
    };
    let bin = itrace_tests::itrace_bin();
    assert_eq!(field("command:"), format!("{} record -o t.itr -- {} 'an argument'", bin.display(), prog.display()));
    assert_eq!(field("directory:"), dir.display().to_string());
    let recorded = field("recorded");
    let (date, rest) = recorded.split_at("2026-11-27 03:09:22 UTC".len());
    assert!(before.as_str() <= date && date <= after.as_str(), "{date} not between {before} and {after}");
    assert_eq!(rest, format!(" on {} by itrace {}", uname("-n"), env!("CARGO_PKG_VERSION")));
    let kernel = field("kernel:");
    assert!(kernel.contains(&uname("-r")) && kernel.ends_with(&uname("-m")), "kernel: {kernel}");
    assert!(!field("cpu:").is_empty());

    let report = itrace_tests::itrace([std::ffi::OsStr::new("report"), dir.join("t.itr").as_os_str()]);
    report.assert_success();
    let first = report.stdout.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "recorded by `{} record -o t.itr -- {} 'an argument'` in {}, {date}, on {} (itrace {})",
            bin.display(),
            prog.display(),
            dir.display(),
            uname("-n"),
            env!("CARGO_PKG_VERSION")
        )
    );
    // A trace from before the record existed.
    let old = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/format-2.0/ptrace.itr");
    let info = itrace_tests::itrace([std::ffi::OsStr::new("info"), old.as_os_str()]);
    info.assert_success();
    assert!(info.stdout.contains("(no command line, host or kernel in this trace)"), "{}", info.stdout);
}

/// Under `--backend qemu` the plugin writes the file: it writes the recording record itrace
/// encoded for it, so `info` shows the command line there too.
#[test]
fn qemu_backend_trace_says_where_it_came_from() {
    itrace_tests::require_tool("qemu-x86_64");
    let dir = test_dir("record-output-origin-qemu");
    let prog = program("loops");
    let trace = dir.join("q.itr");
    record(&trace, &["--backend", "qemu"], &prog, &[]).assert_success();
    let info = itrace_tests::itrace([std::ffi::OsStr::new("info"), trace.as_os_str()]);
    info.assert_success();
    let want = format!(
        "command: {} record -o {} --backend qemu -- {}",
        itrace_tests::itrace_bin().display(),
        trace.display(),
        prog.display()
    );
    assert!(info.stdout.lines().any(|l| l == want), "no line {want:?} in:\n{}", info.stdout);
    assert!(info.stdout.contains(&format!(" on {} by itrace ", uname("-n"))), "{}", info.stdout);
}
