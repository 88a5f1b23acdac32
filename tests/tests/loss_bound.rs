//! Loss is bounded in time (issue 14): continuous mode writes what it holds at least about
//! once a second, so `kill -9` of every itrace process leaves a readable trace that lacks at
//! most the last second; under `--backend qemu` a crashing program's trace ends at its crash;
//! on a full disk the error says what reached the file, and the file holds exactly that.

use itrace_tests::{itrace, itrace_bin, program, record, report_json, require_tool, test_dir};
use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// CLOCK_MONOTONIC in ns: the clock of the records' timestamps.
fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: t is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// What `itrace info` says of a trace whose recording did not finish: its taken branches (a
/// decode of every chunk, as there is no end summary to count from) and the CLOCK_MONOTONIC time
/// of its last CPU-stream record, from the header's start time (FileHeader, the file's own first
/// 64 bytes) and info's `records from A s to B s after the trace started`, to the microsecond.
/// Control records count too: spin_forever's are all at its start, so for it that is the last
/// branch record, the one a scan of `dump` finds. info must succeed: the file is a valid trace.
fn branches_and_last_record_ns(trace: &Path) -> (u64, u64) {
    let out = itrace([OsStr::new("info"), trace.as_os_str()]);
    out.assert_success();
    let branches = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("taken branches: ")?.split(';').next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `taken branches:` line in info:\n{}", out.stdout));
    let last_s: f64 = out
        .stdout
        .lines()
        .find_map(|l| l.split(" to ").nth(1)?.strip_suffix(" s after the trace started)")?.parse().ok())
        .unwrap_or_else(|| panic!("no time span in info (no branch record?):\n{}", out.stdout));
    let bytes = std::fs::read(trace).expect("read the trace");
    let header = itrace_format::FileHeader::decode(trace, &bytes[..bytes.len().min(64)]).expect("the trace's header");
    (branches, header.start_monotonic_ns + (last_s * 1e9).round() as u64)
}

/// SIGKILL to itrace and everything it started (its process group, the worst case: no
/// process is left to finish the file), ~2.5 s into tracing a program that never ends. The
/// trace must read without error and hold records up to at most 1.5 s before the kill (the
/// promise is 1 s; the margin is for a loaded machine). One run: spin_forever's 2.5 s are some
/// 50 to 80 million branch records, and reading them back is most of the test's time; the three
/// runs this test once made checked the same thing three times over (their losses were 335 to
/// 502 ms). They are read with `info` (a decode that counts a run of repeated records at once:
/// 5 s) and `report`, not `dump`, whose line per record (some 6 GB of text, held and parsed
/// here) took 80 of the test's 105 s.
#[test]
fn kill_9_loses_at_most_the_last_second() {
    let prog = program("spin_forever");
    let dir = test_dir("loss_bound-kill9");
    let trace = dir.join("run.itr");
    let mut child = Command::new(itrace_bin())
        .arg("record")
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&prog)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start itrace");
    std::thread::sleep(Duration::from_millis(2500));
    let killed_at = now_ns();
    // SAFETY: kill(2) of the process group this test created (itrace is its leader).
    assert_eq!(unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) }, 0, "kill -9 of the group");
    child.wait().expect("wait for itrace");
    let (branches, last) = branches_and_last_record_ns(&trace);
    assert!(branches > 0, "no branch record reached {} before the kill", trace.display());
    let lost_ms = killed_at.saturating_sub(last) as f64 / 1e6;
    let bytes = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
    eprintln!("{branches} branch records, {bytes} bytes, the last {lost_ms:.0} ms before the kill");
    assert!(lost_ms < 1500.0, "the last record in {} is {lost_ms:.0} ms older than the kill", trace.display());
    let report = report_json(&trace);
    assert_eq!(report["total_branches"].as_u64(), Some(branches), "report and info agree");
}

/// qemu-user ends a program killed by a signal without a plugin callback; the plugin, preloaded
/// into qemu, ends the trace at the crash anyway: every branch before it, a summary, and
/// itrace's summary line. Hand count in crash_loop.S.
#[test]
fn qemu_crash_trace_ends_at_the_crash() {
    require_tool("qemu-x86_64");
    let prog = program("crash_loop");
    let dir = test_dir("loss_bound-qemu-crash");
    let trace = dir.join("crash.itr");
    let out = record(&trace, &["--backend", "qemu"], &prog, &[]);
    out.assert_no_panic();
    assert_eq!(out.status.code(), Some(128 + libc::SIGSEGV), "itrace exits as the program died\n{}", out.stderr);
    assert!(out.stderr.contains("killed by signal SIGSEGV"), "{}", out.stderr);
    let summary = out.stderr.lines().find(|l| l.contains(" records (")).unwrap_or_else(|| panic!("{}", out.stderr));
    let report = report_json(&trace);
    let reader = itrace([OsStr::new("report"), trace.as_os_str()]);
    assert!(!reader.stderr.contains("no end summary"), "the trace has its end: {}", reader.stderr);
    assert_eq!(report["total_branches"].as_u64(), Some(999), "every taken branch before the crash; {summary}");
    // 2002 instructions ran before the fault; the plugin cannot see where in the faulting
    // block (here: xor, then the store) the fault came, so that block's instructions are not
    // counted: 2001.
    let total = report["total_instructions"].as_u64().expect("total");
    assert!((2001..=2002).contains(&total), "{total} instructions, hand count 2002; {summary}");
}

/// A tmpfs of `kib` KiB, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn new(dir: &Path, kib: u32) -> Self {
        let at = dir.join("disk");
        std::fs::create_dir_all(&at).expect("mount point");
        let size = format!("size={kib}k");
        let o = itrace_tests::run(Command::new("mount").args(["-t", "tmpfs", "-o", &size, "tmpfs"]).arg(&at));
        assert!(o.success(), "cannot mount a {kib} KiB tmpfs at {} (the test needs root): {}", at.display(), o.stderr);
        SmallDisk(at)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// `R records (I instructions, B taken branches); U records were not written` in the error.
fn reached(stderr: &str) -> (u64, u64, u64, u64) {
    let at = stderr.find("holds what reached it: ").unwrap_or_else(|| panic!("no totals in: {stderr}"));
    let nums: Vec<u64> = stderr[at..]
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(4)
        .map(|s| s.parse().expect("number"))
        .collect();
    (nums[0], nums[1], nums[2], nums[3])
}

/// The disk fills while recording (long_loop's 8 MB of records, default 1 MiB segments, 2 MiB
/// of disk): exit 1, one line
/// saying the file system is full, with the totals of what reached the file, which are exactly
/// what a reader finds there, and how many records were not written.
#[test]
fn full_disk_counts_only_what_reached_the_file() {
    let prog = program("long_loop");
    let dir = test_dir("loss_bound-full-disk");
    // Segments of 4K: long_loop's trace is about 800 KB under ptrace (after 8.5 KB of module
    // table, the vDSO's image) and 22 KB under qemu in format 3.0; each disk takes the module
    // table and a few chunks, then is full.
    let mut backends = vec![(&["--backend", "ptrace", "--segment-size", "4K"][..], 32)];
    if which("qemu-x86_64") {
        backends.push((&["--backend", "qemu", "--segment-size", "4K"][..], 12));
    }
    for (options, kib) in backends {
        let disk = SmallDisk::new(&dir, kib);
        let trace = disk.0.join("t.itr");
        let _ = std::fs::remove_file(&trace);
        let out = record(&trace, options, &prog, &[]);
        let line = out.assert_clean_error();
        assert!(line.contains("the file system is full"), "{options:?}: {line}");
        let (records, instructions, branches, unwritten) = reached(&line);
        eprintln!("{options:?}: {line}");
        assert!(unwritten > 0 && records > 0, "{options:?}: {line}");
        let report = report_json(&trace);
        assert_eq!(report["total_instructions"].as_u64(), Some(instructions), "{options:?}: {line}");
        assert_eq!(report["total_branches"].as_u64(), Some(branches), "{options:?}: {line}");
        assert!(records >= branches, "{options:?}: {line}");
        drop(disk);
    }
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// A disk that is nearly full (issue 27): a 1 MiB tmpfs with 144 KiB free, and calls_loop,
/// whose trace is 2 to 4 times that. Each backend fills the disk with whole chunks, smaller
/// ones once the next does not fit (the qemu plugin's 256 KiB chunks kept nothing), so the
/// file holds all but the last few KiB of the free space: exit 1 saying the file system is
/// full, a file that `info`, `report` and `dump` read without complaint, the totals the error
/// gives, and its records exactly the first ones of the same program traced into a directory
/// with room (timestamps and thread ids aside). The program runs on to its end, untraced: its
/// output is the reference run's (the gdb backend, whose write failed while the stub ran the
/// program, hung and left it a breakpoint to die of).
///
/// One test per backend (they ran one after the other in one test, the longest of this file:
/// apart, the test threads share them out). Rounds: calls_loop's trace is about 17 bytes a
/// round under qemu, 14 under ptrace, which takes 0.6 ms a round (the reference run is the long
/// part of each). The gdb backend (qemu-user's stub) records 1,000 branches a second in 5 bytes
/// each: a smaller program and 48 KiB free.
#[test]
fn nearly_full_disk_keeps_what_fits_ptrace() {
    nearly_full_disk_keeps_what_fits("ptrace", &["--backend", "ptrace"], "20000", 144);
}

/// [`nearly_full_disk_keeps_what_fits_ptrace`] under qemu with itrace's plugin.
#[test]
fn nearly_full_disk_keeps_what_fits_qemu() {
    require_tool("qemu-x86_64");
    nearly_full_disk_keeps_what_fits("qemu", &["--backend", "qemu"], "30000", 144);
}

/// [`nearly_full_disk_keeps_what_fits_ptrace`] through qemu-user's GDB stub.
#[test]
fn nearly_full_disk_keeps_what_fits_gdb() {
    require_tool("qemu-x86_64");
    nearly_full_disk_keeps_what_fits("gdb", &["--qemu", "x86_64"], "1000", 48);
}

fn nearly_full_disk_keeps_what_fits(backend: &str, options: &[&str], rounds: &str, free_kib: usize) {
    let prog = program("calls_loop");
    let dir = test_dir(&format!("loss_bound-nearly-full-disk-{backend}"));
    let reference = dir.join(format!("{backend}-reference.itr"));
    let untroubled = record(&reference, options, &prog, &[rounds]);
    untroubled.assert_success();
    let want = cpu_records(&reference);
    let disk = SmallDisk::new(&dir, 1024);
    std::fs::write(disk.0.join("filler"), vec![0u8; (1024 - free_kib) * 1024]).expect("fill the disk");
    let free = free_bytes(&disk.0);
    let trace = disk.0.join("t.itr");
    let out = record(&trace, options, &prog, &[rounds]);
    let line = out.assert_clean_error();
    eprintln!("{backend}: {free} bytes free: {line}");
    assert!(line.contains("the file system is full"), "{backend}: {line}");
    assert_eq!(out.stdout, untroubled.stdout, "{backend}: the program's own output: {line}");
    let kept = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
    let reference_len = std::fs::metadata(&reference).expect("reference").len();
    assert!(reference_len > 2 * free, "{backend}: the reference trace ({reference_len} bytes) must not fit");
    // What fits, to within a few records and the page the last chunk did not fit in.
    assert!(
        kept + 4 * 1024 >= free,
        "{backend}: {kept} bytes kept of {free} free on the disk (the chunk that did not fit was dropped \
         whole?): {line}"
    );
    let copy = dir.join(format!("{backend}-kept.itr"));
    std::fs::copy(&trace, &copy).expect("copy the kept trace");
    drop(disk);
    let info = itrace([OsStr::new("info"), copy.as_os_str()]);
    info.assert_success();
    for bad in ["truncat", "corrupt", "damage", "checksum"] {
        assert!(!info.stdout.contains(bad) && !info.stderr.contains(bad), "{backend}: {}{}", info.stdout, info.stderr);
    }
    let report = report_json(&copy);
    let (_, instructions, branches, _) = reached(&line);
    assert_eq!(report["total_instructions"].as_u64(), Some(instructions), "{backend}: {line}");
    assert_eq!(report["total_branches"].as_u64(), Some(branches), "{backend}: {line}");
    let got = cpu_records(&copy);
    assert!(got.len() as u64 > branches / 2 && got.len() < want.len(), "{backend}: {} records kept", got.len());
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("{backend}: kept record {i} is `{}`; the reference run's is `{}`", got[i], want[i]);
    }
}

/// Bytes free on the file system at `dir`.
fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).expect("path");
    // SAFETY: zeroed statvfs is a valid value for the call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated, st a valid statvfs.
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0, "statvfs {}", dir.display());
    st.f_bavail as u64 * st.f_frsize as u64
}

/// The CPU streams' records as `itrace dump` shows them, without what differs between two
/// runs of the same program: file offsets, timestamps, process and thread ids.
fn cpu_records(trace: &Path) -> Vec<String> {
    let out = itrace([OsStr::new("dump"), trace.as_os_str()]);
    out.assert_success();
    out.stdout
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().skip(1);
            let stream = f.next().filter(|c| c.starts_with("cpu"))?;
            let mut words = vec![stream.to_string()];
            let mut id_next = false;
            for (i, w) in f.enumerate() {
                let number = w.trim_end_matches([',', ')', '}']).bytes().all(|b| b.is_ascii_digit());
                if (i == 0 || id_next) && number {
                    words.push("N".into()); // a branch's timestamp, or the value of ts:, pid:, tid:
                } else if let Some(name) = w.strip_prefix("tid=") {
                    words.push(format!("tid={}", if name.is_empty() { "" } else { "N" }));
                } else {
                    words.push(w.to_string());
                }
                id_next = matches!(w, "ts:" | "pid:" | "tid:");
            }
            Some(words.join(" "))
        })
        .collect()
}
