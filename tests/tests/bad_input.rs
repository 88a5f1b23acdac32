//! Bad input: every error is a non-zero exit with one `itrace: ` line on
//! stderr and no panic; damaged traces are handled as documented.

use itrace_tests::{
    arc_lines, arc_text, itrace, itrace_bin, nonexistent_pid, program, record, record_pid, require_tool, run, test_dir,
    wait_until, KillOnDrop, Output,
};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn record_count_loop(test: &str) -> (PathBuf, PathBuf) {
    let dir = test_dir(test);
    let trace = dir.join("t.itr");
    record(&trace, &[], &program("count_loop"), &[]).assert_success();
    (dir, trace)
}

fn arc_of(trace: &Path) -> Output {
    itrace([OsStr::new("arc"), trace.as_os_str()])
}

fn report_of(trace: &Path) -> Output {
    itrace([OsStr::new("report"), trace.as_os_str(), OsStr::new("--json")])
}

#[test]
fn missing_program() {
    let dir = test_dir("bad_input-missing_program");
    let out = record(&dir.join("t.itr"), &[], Path::new("/nonexistent/itrace-test-program"), &[]);
    let line = out.assert_clean_error();
    assert!(line.contains("/nonexistent/itrace-test-program"), "the error should name the program: {line}");
}

#[test]
fn program_not_executable() {
    let dir = test_dir("bad_input-not_executable");
    let f = dir.join("not-a-program.txt");
    fs::write(&f, "just text\n").unwrap();
    record(&dir.join("t.itr"), &[], &f, &[]).assert_clean_error();
}

#[test]
fn attach_to_nonexistent_pid() {
    let dir = test_dir("bad_input-nonexistent_pid");
    let pid = nonexistent_pid();
    let line = record_pid(&dir.join("t.itr"), pid, "1").assert_clean_error();
    assert!(line.contains(&pid.to_string()), "the error should name the pid: {line}");
}

fn ppid_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ..." ; comm may contain spaces and ')'
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(1)?.parse().ok()
}

fn tracer_of(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("TracerPid:")).and_then(|v| v.trim().parse().ok())
}

/// A process already traced by strace cannot be traced again.
#[test]
fn pid_already_traced() {
    require_tool("strace");
    require_tool("sleep");
    let dir = test_dir("bad_input-already_traced");
    let strace = Command::new("strace")
        .args(["-o", "/dev/null", "sleep", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start strace");
    let strace = KillOnDrop(strace);
    let strace_pid = strace.0.id();
    let mut sleeper = 0;
    wait_until("strace to start sleep", || {
        if sleeper == 0 {
            if let Ok(rd) = fs::read_dir("/proc") {
                for e in rd.flatten() {
                    if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) {
                        if ppid_of(pid) == Some(strace_pid) {
                            sleeper = pid;
                        }
                    }
                }
            }
        }
        sleeper != 0
            && tracer_of(sleeper) == Some(strace_pid)
            && fs::read_to_string(format!("/proc/{sleeper}/comm")).is_ok_and(|c| c.trim() == "sleep")
    });

    let line = record_pid(&dir.join("t.itr"), sleeper, "1").assert_clean_error();
    assert!(line.contains(&sleeper.to_string()), "the error should name the pid: {line}");
    // strace still has it
    assert_eq!(tracer_of(sleeper), Some(strace_pid));
    // end the sleep we started through strace (by its pid), then strace
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(sleeper as libc::pid_t, libc::SIGKILL) };
    drop(strace);
}

#[test]
fn unknown_mode() {
    let dir = test_dir("bad_input-unknown_mode");
    let out = record(&dir.join("t.itr"), &["--mode", "bogus"], &program("count_loop"), &[]);
    let line = out.assert_clean_error();
    assert!(line.contains("bogus"), "the error should name the value: {line}");
}

#[test]
fn bad_buffer_size() {
    let dir = test_dir("bad_input-bad_buffer_size");
    let out = record(&dir.join("t.itr"), &["--buffer-size", "12Q"], &program("count_loop"), &[]);
    let line = out.assert_clean_error();
    assert!(line.contains("12Q"), "the error should name the value: {line}");
}

/// A buffer the machine cannot give (24 GiB of memory here) is one line before anything runs,
/// in every mode that reserves buffers per CPU: no abort, no trace file, no program run.
#[test]
fn buffer_larger_than_memory() {
    let dir = test_dir("bad_input-buffer_larger_than_memory");
    for mode in ["wrap", "normal"] {
        let trace = dir.join(format!("{mode}.itr"));
        let marker = dir.join(format!("{mode}.ran"));
        let options = ["--mode", mode, "--buffer-size", "100G"];
        let out = record(&trace, &options, Path::new("/usr/bin/touch"), &[marker.to_str().unwrap()]);
        let line = out.assert_clean_error();
        assert!(line.contains("--buffer-size"), "{mode}: the error should name the option: {line}");
        assert!(!trace.exists(), "{mode}: the trace file was left behind");
        assert!(!marker.exists(), "{mode}: the program ran");
    }
}

#[test]
fn missing_trace_file() {
    let dir = test_dir("bad_input-missing_trace");
    arc_of(&dir.join("nothing-here.itr")).assert_clean_error();
    report_of(&dir.join("nothing-here.itr")).assert_clean_error();
}

#[test]
fn empty_trace_file() {
    let dir = test_dir("bad_input-empty_trace");
    let f = dir.join("empty.itr");
    fs::write(&f, b"").unwrap();
    arc_of(&f).assert_clean_error();
    report_of(&f).assert_clean_error();
}

#[test]
fn not_a_trace_file() {
    let dir = test_dir("bad_input-not_a_trace");
    let f = dir.join("text.itr");
    fs::write(&f, "this is not a trace file\n".repeat(100)).unwrap();
    arc_of(&f).assert_clean_error();
}

/// A trace cut in the middle: arc succeeds, warns, and prints the records
/// before the cut.
#[test]
fn truncated_trace() {
    let (dir, trace) = record_count_loop("bad_input-truncated");
    let full_text = arc_text(&trace);
    let full = arc_lines(&full_text);
    let bytes = fs::read(&trace).unwrap();
    let cut = dir.join("cut.itr");
    fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();

    let out = arc_of(&cut);
    out.assert_success();
    fs::write(dir.join("cut.arc"), &out.stdout).unwrap();
    assert!(
        out.stderr.lines().any(|l| {
            let l = l.to_lowercase();
            l.starts_with("itrace: ") && (l.contains("warn") || l.contains("trunc"))
        }),
        "no warning about the truncation on stderr:\n{}",
        out.stderr
    );
    let part = arc_lines(&out.stdout);
    assert!(
        !part.is_empty() && part.len() < full.len(),
        "expected some but not all of the {} blocks, got {}",
        full.len(),
        part.len()
    );
    // a block cut at the end may be shorter
    for (i, (p, f)) in part.iter().zip(&full).enumerate() {
        let last = i + 1 == part.len();
        let same_block = p.kernel == f.kernel
            && (p.type_code == f.type_code || (last && p.type_code == 5))
            && (p.count == f.count || (last && p.count <= f.count));
        assert!(same_block, "block {i} of the truncated trace differs: {p:?} vs {f:?}");
        // the module table is written ahead of the trace chunks, so a cut trace still resolves
        assert_eq!(p.location(), f.location(), "block {i}: location");
    }
}

/// Bytes flipped in the middle: a clean error that names an offset.
#[test]
fn corrupted_trace() {
    let (dir, trace) = record_count_loop("bad_input-corrupted");
    let mut bytes = fs::read(&trace).unwrap();
    let mid = bytes.len() / 2;
    let end = (mid + 64).min(bytes.len());
    for b in &mut bytes[mid..end] {
        *b ^= 0xa5;
    }
    let bad = dir.join("corrupt.itr");
    fs::write(&bad, &bytes).unwrap();
    for out in [arc_of(&bad), report_of(&bad)] {
        let line = out.assert_clean_error();
        let l = line.to_lowercase();
        assert!(
            l.contains("offset") && l.chars().any(|c| c.is_ascii_digit()),
            "the error should name the offset of the damage: {line}"
        );
    }
}

/// `itrace record` writing into `dir` until the disk (or file size limit)
/// is exhausted: a clean error, and the partial trace is readable.
fn check_write_failure(out: &Output, trace: &Path) {
    out.assert_clean_error();
    assert!(trace.exists(), "no partial trace left at {}", trace.display());
    let arc = arc_of(trace);
    arc.assert_success();
    let lines = arc_lines(&arc.stdout);
    assert!(!lines.is_empty(), "the partial trace has no blocks");
    // the first block is long_loop's _start: the module table is written ahead of
    // the trace chunks, so even a partial trace resolves it
    let bin = program("long_loop");
    let first = &lines[0];
    assert_eq!(first.location(), "_start+0x0", "first block of long_loop");
    assert_eq!(first.module, bin.to_string_lossy());
}

/// Runs itrace with a file size limit; SIGXFSZ is ignored so that writes
/// fail with EFBIG instead of killing itrace.
fn record_with_fsize_limit(trace: &Path, options: &[&str], limit: u64) -> Output {
    let mut cmd = Command::new(itrace_bin());
    cmd.arg("record").arg("-o").arg(trace).args(options);
    cmd.arg("--").arg(program("long_loop"));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit { rlim_cur: limit as libc::rlim_t, rlim_max: limit as libc::rlim_t };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    run(&mut cmd)
}

#[test]
fn file_size_limit() {
    let dir = test_dir("bad_input-file_size_limit");
    let trace = dir.join("t.itr");
    let out = record_with_fsize_limit(&trace, &["--mode", "continuous", "--segment-size", "16K"], 64 * 1024);
    check_write_failure(&out, &trace);
}

const FULL_DISK_OPTIONS: &[&str] = &["--mode", "continuous", "--segment-size", "16K"];

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A full file system: a 128 KiB tmpfs when we may mount one (root with
/// CAP_SYS_ADMIN), else the same situation through a file size limit.
#[test]
fn disk_full() {
    let dir = test_dir("bad_input-disk_full");
    let mnt = dir.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128k", "itrace-test-full"])
        .arg(&mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let unmount = Unmount(mnt.clone());
        let trace = mnt.join("t.itr");
        // small segments, so that some whole segments fit before the disk
        // is full
        let out = record(&trace, FULL_DISK_OPTIONS, &program("long_loop"), &[]);
        let line = out.assert_clean_error();
        assert!(line.to_lowercase().contains("space"), "the error should say the disk is full (ENOSPC): {line}");
        // read the partial trace from a copy, then release the tmpfs
        let copy = dir.join("partial.itr");
        fs::copy(&trace, &copy).expect("no partial trace left");
        drop(unmount);
        check_write_failure(&out, &copy);
    } else {
        eprintln!(
            "note: cannot mount a tmpfs here (not root or no CAP_SYS_ADMIN); \
             testing a full disk through RLIMIT_FSIZE instead"
        );
        let trace = dir.join("t.itr");
        let out = record_with_fsize_limit(&trace, FULL_DISK_OPTIONS, 128 * 1024);
        check_write_failure(&out, &trace);
    }
}
