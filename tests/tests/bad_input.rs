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

/// The state letter and flags of /proc/PID/stat ("pid (comm) state ppid pgrp session tty_nr
/// tpgid flags ..."; comm may contain spaces and ')').
fn state_and_flags(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut after = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = after.next()?.chars().next()?;
    Some((state, after.nth(5)?.parse().ok()?))
}

/// A zombie (exited, not reaped): the error says so, not "it may be traced already".
#[test]
fn attach_to_a_zombie() {
    require_tool("true");
    let dir = test_dir("bad_input-zombie");
    // Our own child, left unreaped until the end.
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    wait_until("the child to be a zombie", || state_and_flags(pid).is_some_and(|(s, _)| s == 'Z'));
    let line = record_pid(&dir.join("t.itr"), pid, "1").assert_clean_error();
    child.wait().expect("reap the zombie");
    assert!(
        line.contains(&pid.to_string()) && line.contains("zombie"),
        "the error should say pid {pid} is a zombie: {line}"
    );
    assert!(!line.contains("traced already"), "{line}");
}

/// A kernel thread: the error says so.
#[test]
fn attach_to_a_kernel_thread() {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let kthread = fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| state_and_flags(pid).is_some_and(|(_, flags)| flags & PF_KTHREAD != 0))
        .expect("no kernel thread visible in /proc (a container with its own pid namespace?): run this test on the host or a VM");
    let dir = test_dir("bad_input-kernel_thread");
    let line = record_pid(&dir.join("t.itr"), kthread, "1").assert_clean_error();
    assert!(
        line.contains(&kthread.to_string()) && line.contains("kernel thread"),
        "the error should say pid {kthread} is a kernel thread: {line}"
    );
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
    // Any child of strace that is `sleep` and traced by it (looked for afresh each time: the
    // first child seen may still be strace's own fork before its exec, or gone).
    wait_until("strace to start sleep", || {
        let Ok(rd) = fs::read_dir("/proc") else { return false };
        sleeper = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
            .find(|&pid| {
                ppid_of(pid) == Some(strace_pid)
                    && tracer_of(pid) == Some(strace_pid)
                    && fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
            })
            .unwrap_or(0);
        sleeper != 0
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

/// `--step` is about ptrace stepping: a backend that does not step with ptrace refuses it in
/// one line rather than ignoring it, before the program runs.
#[test]
fn step_with_a_backend_that_does_not_step() {
    let dir = test_dir("bad_input-step_with_a_backend_that_does_not_step");
    for backend in ["inproc", "kmod", "qemu"] {
        let trace = dir.join(format!("{backend}.itr"));
        let marker = dir.join(format!("{backend}.ran"));
        let options = ["--step", "block", "--backend", backend];
        let out = record(&trace, &options, Path::new("/usr/bin/touch"), &[marker.to_str().unwrap()]);
        let line = out.assert_clean_error();
        assert!(line.contains("--step") && line.contains(backend), "{backend}: {line}");
        assert!(!marker.exists(), "{backend}: the program ran");
    }
}

/// ITRACE_STEP is a default for the ptrace backend: a bad value is a one-line error before
/// anything runs; a good one does not stop a backend that does not step from recording.
#[test]
fn itrace_step_from_the_environment() {
    let dir = test_dir("bad_input-itrace_step_env");
    let marker = dir.join("bogus.ran");
    let mut cmd = std::process::Command::new(itrace_bin());
    cmd.env("ITRACE_STEP", "sometimes").arg("record").arg("-o").arg(dir.join("bogus.itr"));
    cmd.arg("--").arg("/usr/bin/touch").arg(&marker);
    let line = run(&mut cmd).assert_clean_error();
    assert!(line.contains("ITRACE_STEP"), "{line}");
    assert!(!marker.exists(), "the program ran");
    let marker = dir.join("qemu.ran");
    let mut cmd = std::process::Command::new(itrace_bin());
    cmd.env("ITRACE_STEP", "instruction").args(["record", "--backend", "qemu", "-o"]).arg(dir.join("qemu.itr"));
    cmd.arg("--").arg("/usr/bin/touch").arg(&marker);
    let out = run(&mut cmd);
    assert!(out.status.success(), "ITRACE_STEP with --backend qemu:\n{}", out.stderr);
    assert!(marker.exists(), "the program did not run");
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
    check_cut_in_the_last_cpu_chunk(&dir, &trace);
}

/// Cuts `trace` in its last CPU chunk, so that the other CPU streams stay whole and the cut
/// one keeps some of its records, and checks the cut trace's arc against the whole one's.
fn check_cut_in_the_last_cpu_chunk(dir: &Path, trace: &Path) {
    let full_text = arc_text(trace);
    let full = arc_lines(&full_text);
    let bytes = fs::read(trace).unwrap();
    let cut = dir.join("cut.itr");
    // The module table's chunks come first and, with the compact encoding, are as large as the
    // branches'.
    let stream_of = |off: usize| u16::from_ne_bytes([bytes[off + 4], bytes[off + 5]]);
    let (off, len) =
        chunks_of(&bytes).into_iter().rev().find(|&(off, _)| stream_of(off) < 0xFFFE).expect("a CPU chunk");
    let cut_cpu = stream_of(off);
    // The raw records of the cut stream (`itrace dump`; the format crate's tests check what a
    // cut chunk reads as against the chunk's own records).
    let records_on = |trace: &Path| {
        let out = dump_of(trace);
        out.assert_success();
        out.stdout.lines().filter(|l| l.split_whitespace().nth(1) == Some(&format!("cpu{cut_cpu}"))).count()
    };
    let whole = records_on(trace);
    // In the middle; if that leaves no whole item (a chunk's first item holds a whole record),
    // one byte short of its end.
    let mut kept = 0;
    for at in [len / 2, len - 1] {
        fs::write(&cut, &bytes[..off + 24 + at]).unwrap();
        kept = records_on(&cut);
        if kept > 0 {
            break;
        }
    }
    assert!(kept > 0 && kept < whole, "the cut keeps some of CPU {cut_cpu}'s {whole} records: {kept}");

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
    assert!(!part.is_empty() && part.len() <= full.len(), "{} blocks of {}", part.len(), full.len());
    // Each CPU stream is read up to its own end: the cut one's last blocks are lost, the other
    // CPU's are all there (the recorder moves a lone thread to the CPU itrace runs on, so its
    // blocks may be on both). So the cut arc is the full one without the cut CPU's last blocks.
    // Where the thread goes on on the other CPU after the end of the cut one's records, what it
    // did in between may be lost: the arc says so with a mark, and the block after it is placed
    // at its branch (its start is unknown), not where the thread last was.
    let cut_cpu = u32::from(cut_cpu);
    let kept_on_cut_cpu = part.iter().filter(|p| p.cpu == cut_cpu).count();
    let mut on_cut_cpu = 0;
    let want: Vec<_> = full
        .iter()
        .filter(|f| {
            on_cut_cpu += usize::from(f.cpu == cut_cpu);
            f.cpu != cut_cpu || on_cut_cpu <= kept_on_cut_cpu
        })
        .collect();
    assert_eq!(
        part.len(),
        want.len(),
        "the cut arc is the full one without CPU {cut_cpu}'s last blocks:\n{}",
        out.stdout
    );
    let mut after_mark = vec![false; part.len()];
    let mut blocks = 0;
    for l in out.stdout.lines() {
        if l.starts_with("# cpu ") && l.contains("(the trace was cut") {
            assert!(l.starts_with(&format!("# cpu {cut_cpu}: ")), "a mark for a stream that is whole: {l}");
            if let Some(next) = after_mark.get_mut(blocks) {
                *next = true;
            }
        } else if !l.starts_with('#') && !l.trim().is_empty() {
            blocks += 1;
        }
    }
    for (i, (p, f)) in part.iter().zip(&want).enumerate() {
        // a block cut at the end may be shorter
        let last = i + 1 == part.len();
        let same_block = p.kernel == f.kernel
            && p.cpu == f.cpu
            && (p.type_code == f.type_code || (last && p.type_code == 5))
            && (p.count == f.count || (last && p.count <= f.count));
        assert!(same_block, "block {i} of the truncated trace differs: {p:?} vs {f:?}");
        if !after_mark[i] {
            // the module table is written ahead of the trace chunks, so a cut trace still resolves
            assert_eq!(p.location(), f.location(), "block {i}: location");
        }
    }
}

/// Bytes flipped in the middle: read around (exit 0, a warning naming the offset); with
/// `--strict`, a clean error that names it.
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
        out.assert_success();
        let warning = out.stderr.lines().find(|l| l.starts_with("itrace: warning: ") && l.contains("is damaged"));
        assert!(warning.is_some_and(|l| l.contains(" bytes at 0x")), "no warning naming the damage:\n{}", out.stderr);
    }
    let strict = |cmd: &str| itrace([OsStr::new(cmd), OsStr::new("--strict"), bad.as_os_str()]);
    for out in [strict("arc"), strict("report")] {
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
    // the first block is the dynamic loader's entry point (readelf's): the module table is
    // written ahead of the trace chunks, so even a partial trace resolves it
    let first = &lines[0];
    assert!(first.module.ends_with("/ld-linux-x86-64.so.2"), "first block of {FULL_DISK_PROGRAM}: {}", first.module);
    require_tool("readelf");
    let header = run(Command::new("readelf").arg("-h").arg(&first.module));
    let entry = header
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Entry point address:"))
        .map(|v| v.trim().to_string())
        .expect("readelf -h names the entry point");
    // a stripped loader: its entry as module+offset
    assert!(
        first.location() == "_start+0x0" || first.location().starts_with(&format!("ld-linux-x86-64.so.2+{entry}")),
        "first block of {FULL_DISK_PROGRAM}: {} (the loader's entry is {entry})",
        first.location()
    );
}

/// `itrace record OPTIONS -o TRACE -- calls_loop 20000` pinned to CPU 0 (itrace and the program),
/// with a file size limit of `limit` bytes if given; SIGXFSZ is ignored so that writes fail with
/// EFBIG instead of killing itrace. On one CPU the trace is one CPU stream, whose first chunk is
/// the first written: on two, the thread's records were spread over both streams, and once the
/// first chunk to fill (and be written) was the second stream's, so the partial trace started in
/// `_dl_sysdep_parse_arguments`, the loader's entry in a chunk the disk never took.
fn record_full_disk(trace: &Path, limit: Option<u64>) -> Output {
    let mut cmd = Command::new(require_tool("taskset"));
    cmd.args(["-c", "0"]).arg(itrace_bin()).arg("record").arg("-o").arg(trace).args(FULL_DISK_OPTIONS);
    cmd.arg("--").arg(program(FULL_DISK_PROGRAM)).arg(FULL_DISK_ROUNDS);
    if let Some(limit) = limit {
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
    }
    run(&mut cmd)
}

#[test]
fn file_size_limit() {
    let dir = test_dir("bad_input-file_size_limit");
    let trace = dir.join("t.itr");
    let out = record_full_disk(&trace, Some(16 * 1024));
    check_write_failure(&out, &trace);
}

// Small segments and a small disk (16 KiB): calls_loop's trace of 20,000 rounds is about
// 300 KB whichever way it is recorded. (long_loop's was 37 KB stepped but 14.5 KB translated:
// the records of one drain share a time stamp, and its one loop edge repeats into runs.)
const FULL_DISK_OPTIONS: &[&str] = &["--mode", "continuous", "--segment-size", "4K"];
const FULL_DISK_PROGRAM: &str = "calls_loop";
const FULL_DISK_ROUNDS: &str = "20000";

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
        .args(["-t", "tmpfs", "-o", "size=16k", "itrace-test-full"])
        .arg(&mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let unmount = Unmount(mnt.clone());
        let trace = mnt.join("t.itr");
        // small segments, so that some whole segments fit before the disk
        // is full
        let out = record_full_disk(&trace, None);
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
        let out = record_full_disk(&trace, Some(16 * 1024));
        check_write_failure(&out, &trace);
    }
}

/// count_loop in 4 KiB segments: a trace of a dozen chunks, its bytes, and its chunks.
fn chunked_trace(test: &str) -> (PathBuf, PathBuf, Vec<u8>, Vec<(usize, usize)>) {
    let dir = test_dir(test);
    let trace = dir.join("t.itr");
    // long_loop: about 37 KB of records, so 4K segments make several CPU chunks (count_loop's
    // 1,000 branches are one 216-byte chunk since timestamps became sparse).
    record(&trace, &["--segment-size", "4K"], &program("long_loop"), &[]).assert_success();
    let bytes = fs::read(&trace).unwrap();
    let chunks = chunks_of(&bytes);
    assert!(chunks.len() >= 5, "expected several chunks, got {}", chunks.len());
    (dir, trace, bytes, chunks)
}

/// (offset, payload length) of each chunk, read with the layout docs/trace-format.md gives:
/// a 64-byte file header, then chunks of a 24-byte header (payload length at offset 8) and the
/// payload, in the recording machine's byte order (this one's).
fn chunks_of(b: &[u8]) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut off = 64;
    while off < b.len() {
        let len = u32::from_ne_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        v.push((off, len));
        off += 24 + len;
    }
    v
}

fn dump_of(trace: &Path) -> Output {
    itrace([OsStr::new("dump"), trace.as_os_str()])
}

/// `report -i`, `arc` and `dump` of `trace`: each one line, this one.
fn assert_every_reader_says(trace: &Path, want: &str) {
    let report = itrace([OsStr::new("report"), OsStr::new("-i"), trace.as_os_str()]);
    for out in [report, arc_of(trace), dump_of(trace)] {
        assert_eq!(out.assert_clean_error(), want, "{}", out.command);
    }
}

/// [`assert_every_reader_says`] with `--strict`; without it each reads around the damage at
/// `offset`, exit 0, with a warning that names it.
fn assert_every_strict_reader_says(trace: &Path, want: &str, offset: usize) {
    let with = |cmd: &str, strict: bool| {
        let mut args = vec![OsStr::new(cmd), trace.as_os_str()];
        if strict {
            args.insert(1, OsStr::new("--strict"));
        }
        itrace(args)
    };
    for cmd in ["report", "arc", "dump"] {
        let out = with(cmd, true);
        assert_eq!(out.assert_clean_error(), want, "{}", out.command);
        let out = with(cmd, false);
        out.assert_success();
        let at = format!(" bytes at {offset:#x} ");
        assert!(
            out.stderr.lines().any(|l| l.starts_with("itrace: warning: ") && l.contains(&at)),
            "{}: no warning naming the damage at {offset:#x}:\n{}",
            out.command,
            out.stderr
        );
    }
}

/// A flipped bit in the length of a chunk in the middle of the file, one that makes it run
/// past the end of the file and one that does not: corruption at that chunk (exit 1 with
/// `--strict`, else skipped with a warning), never a cut file. Format 1.0 took the first for a
/// file cut short, read the bytes after it as records and exited 0.
#[test]
fn damaged_chunk_length() {
    let (dir, _, bytes, chunks) = chunked_trace("bad_input-damaged_chunk_length");
    let (mid, len) = chunks[chunks.len() / 2];
    for bit in [20, 2] {
        let mut b = bytes.clone();
        b[mid + 8 + bit / 8] ^= 1 << (bit % 8);
        let new_len = u32::from_ne_bytes(b[mid + 8..mid + 12].try_into().unwrap()) as usize;
        assert_eq!(new_len > bytes.len(), bit == 20, "length {len} -> {new_len}");
        let bad = dir.join(format!("bit{bit}.itr"));
        fs::write(&bad, &b).unwrap();
        let want = format!(
            "itrace: cannot read {}: corrupt trace at offset {mid:#x}: the chunk header is damaged (its checksum does \
             not match)",
            bad.display()
        );
        assert_every_strict_reader_says(&bad, &want, mid);
    }
}

/// Each field of the file header changed: one line that says the header is damaged, and which
/// byte when it is the byte order or the header length.
#[test]
fn damaged_file_header() {
    let (dir, _, bytes, _) = chunked_trace("bad_input-damaged_header");
    let checksum = "the file header is damaged: its checksum does not match";
    let mut cases = vec![
        ("byte-order", 4, 3, "the file header is damaged: its byte-order byte (offset 4) is 0x03, not 1 (little-endian) or 2 (big-endian)".to_string()),
        ("header-length-65", 5, 65, "the file header is damaged: its header-length byte (offset 5) is 65; format 2 and 3 headers are 64 bytes".into()),
        ("header-length-72", 5, 72, "the file header is damaged: its header-length byte (offset 5) is 72, not 64".into()),
        ("header-length-0", 5, 0, "the file header is damaged: its header-length byte (offset 5) is 0; format 2 and 3 headers are 64 bytes".into()),
        ("version", 6, 4, checksum.into()),
        ("arch", 10, 99, checksum.into()),
        ("mode", 12, 7, checksum.into()),
        ("step-method", 13, 9, checksum.into()),
        ("cpu-count", 15, 0xff, checksum.into()),
        ("flags", 16, 0x80, checksum.into()),
        ("buffer-size", 30, 0x01, checksum.into()),
        ("checksum", 61, 0x00, checksum.into()),
    ];
    if cfg!(target_endian = "little") {
        cases.push(("byte-order-swapped", 4, 2, "the file header is damaged: its byte-order byte (offset 4) is 2, but the header was written little-endian (1)".into()));
    }
    for (name, at, value, want) in cases {
        let mut b = bytes.clone();
        assert_ne!(b[at], value, "{name}: the value is already there");
        b[at] = value;
        let bad = dir.join(format!("{name}.itr"));
        fs::write(&bad, &b).unwrap();
        assert_every_reader_says(&bad, &format!("itrace: {}: {want}", bad.display()));
    }
    // All 16 bits of the CPU count: a count of 65535 with the streams of a 2-CPU machine.
    let mut b = bytes.clone();
    b[14..16].fill(0xff);
    let bad = dir.join("cpu-count-65535.itr");
    fs::write(&bad, &b).unwrap();
    assert_every_reader_says(&bad, &format!("itrace: {}: {checksum}", bad.display()));
}

/// A header that says format 1.0 over chunks of a later format: 1.0 files are read (with
/// their 16-byte chunk headers), so the first chunk is damage, one line with its offset.
#[test]
fn trace_of_an_older_itrace() {
    let (dir, _, mut bytes, _) = chunked_trace("bad_input-older_trace");
    // The 1.0 header: major 1, zeros in the 8 bytes where 2.0 has a reserved word and the CRC.
    bytes[6..8].copy_from_slice(&1u16.to_ne_bytes());
    bytes[56..64].fill(0);
    let old = dir.join("old.itr");
    fs::write(&old, &bytes).unwrap();
    for out in [arc_of(&old), report_of(&old), dump_of(&old)] {
        let line = out.assert_clean_error();
        assert!(line.contains("corrupt trace at offset 0x40: "), "{line}");
    }
}

/// Things that are not trace files, named for what they are, the OS's words once: /dev/zero
/// is not "empty", a FIFO does not block the reader.
#[test]
fn not_trace_files() {
    let dir = test_dir("bad_input-not_trace_files");
    let fifo = dir.join("fifo");
    let _ = fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let missing = dir.join("missing.itr");
    let empty = dir.join("empty.itr");
    fs::write(&empty, b"").unwrap();
    let short = dir.join("short.itr");
    fs::write(&short, b"ITRC\x01\x40").unwrap();
    let kind =
        |p: &Path, k: &str| format!("itrace: {} is {k}, not a trace file (a trace is a regular file)", p.display());
    let cases = [
        (Path::new("/dev/zero").to_path_buf(), kind(Path::new("/dev/zero"), "a character device")),
        (dir.clone(), kind(&dir, "a directory")),
        (fifo.clone(), kind(&fifo, "a pipe or FIFO")),
        (
            missing.clone(),
            format!("itrace: cannot open trace file {}: No such file or directory (os error 2)", missing.display()),
        ),
        (empty.clone(), format!("itrace: {} is empty: not a trace file", empty.display())),
        (
            short.clone(),
            format!(
                "itrace: {} ends after 6 bytes, inside its 64-byte file header: nothing of the trace is left",
                short.display()
            ),
        ),
    ];
    for (path, want) in cases {
        assert_every_reader_says(&path, &want);
    }
}

/// A file cut short is read up to the cut with a warning, exit 0: cut inside a chunk header,
/// exactly the chunks before it; cut inside a payload, those and the whole records of the cut
/// chunk before the cut.
#[test]
fn truncated_trace_keeps_what_precedes_the_cut() {
    let (dir, _, bytes, chunks) = chunked_trace("bad_input-truncated_exact");
    let full = dump_of(&dir.join("t.itr"));
    full.assert_success();
    let records = |text: &str| -> Vec<(usize, String)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| (usize::from_str_radix(&l[2..10], 16).unwrap(), l.to_string()))
            .collect()
    };
    let all = records(&full.stdout);
    let (mid, len) = chunks[chunks.len() / 2];
    for (cut, warn_at) in [(mid + 10, mid), (mid + 24 + len / 2, mid + 24 + len / 2)] {
        let p = dir.join(format!("cut{cut}.itr"));
        fs::write(&p, &bytes[..cut]).unwrap();
        let out = dump_of(&p);
        out.assert_success();
        assert_eq!(
            out.stderr.trim_end(),
            format!(
                "itrace: warning: {} is truncated at offset {warn_at:#x}; read up to its last whole record",
                p.display()
            )
        );
        let got = records(&out.stdout);
        let before: Vec<_> = all.iter().filter(|(off, _)| *off < mid).cloned().collect();
        let kept: Vec<_> = got.iter().filter(|(off, _)| *off < mid).cloned().collect();
        assert_eq!(kept, before, "cut at {cut:#x}: every record of the chunks before the cut");
        let in_cut_chunk: Vec<_> = got.iter().filter(|(off, _)| *off >= mid).collect();
        if cut < mid + 24 {
            assert!(in_cut_chunk.is_empty(), "cut at {cut:#x}: records of the cut chunk {in_cut_chunk:?}");
        } else {
            assert!(!in_cut_chunk.is_empty(), "cut at {cut:#x}: no record of the cut chunk");
            for r in in_cut_chunk {
                // Format 3.0's items are 1 to a few dozen bytes: a record read from the cut file
                // starts before the cut and is the full trace's record at that offset.
                assert!(r.0 < cut && all.contains(r), "cut at {cut:#x}: {r:?} is not a whole record of the trace");
            }
        }
    }
}
