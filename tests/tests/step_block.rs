//! `--step block` (debug-register breakpoints, arch/src/backend/ptrace/x86_64/hwstep.rs) against
//! `--step instruction`: the same program recorded both ways gives the same records, one by
//! one, in `itrace dump` (timestamps, file offsets, pids, the step method and the recording
//! record, whose command line names the --step, aside).
//! Skipped (with a message) where the probe finds the breakpoints do not work.

use itrace_tests::{
    assert_streams_in_time_order, itrace, normalized_dump, program, record, report_calls, report_json,
    report_self_counts, test_dir,
};

/// Block stepping is what these tests are about: where the probe finds the debug registers
/// unusable, they fail, saying so (never skip).
fn fail_if_block_unavailable(step: &str, stderr: &str) {
    assert!(
        !(step == "block" && stderr.contains("debug-register breakpoints do not work")),
        "block stepping is not available on this machine: {}",
        stderr.trim()
    );
}

/// Records `name` with `--step instruction` and `--step block` and compares the dumps. False if
/// block stepping is not available here.
fn same_trace(name: &str) -> bool {
    same_trace_of(name, &program(name), &[])
}

/// [`same_trace`] of `bin` recorded with `options` too; `name` names the test's directory.
fn same_trace_of(name: &str, bin: &std::path::Path, options: &[&str]) -> bool {
    same_trace_with_args(name, bin, options, &[])
}

/// [`same_trace_of`] with arguments for the program.
fn same_trace_with_args(name: &str, bin: &std::path::Path, options: &[&str], args: &[&str]) -> bool {
    let dir = test_dir(&format!("step_block-{name}"));
    let mut dumps = Vec::new();
    for step in ["instruction", "block"] {
        let trace = dir.join(format!("{step}.itr"));
        let mut opts = vec!["--step", step];
        opts.extend_from_slice(options);
        let rec = record(&trace, &opts, bin, args);
        fail_if_block_unavailable(step, &rec.stderr);
        assert!(rec.status.code().is_some(), "{name}: itrace record --step {step} was killed:\n{}", rec.stderr);
        assert!(rec.stderr.contains("itrace: "), "{name} --step {step}: no summary:\n{}", rec.stderr);
        if step == "block" {
            assert!(rec.stderr.contains("ptrace-hwbreak"), "{name}: the summary names the method:\n{}", rec.stderr);
        }
        let dump = itrace([std::ffi::OsStr::new("dump"), trace.as_os_str()]);
        dump.assert_success();
        std::fs::write(dir.join(format!("{step}.dump")), &dump.stdout).unwrap();
        assert_streams_in_time_order(&trace);
        dumps.push(normalized_dump(&dump.stdout));
    }
    let (single, block) = (&dumps[0], &dumps[1]);
    assert!(single.len() > 10, "{name}: a trace of {} lines", single.len());
    for (i, (s, b)) in single.iter().zip(block).enumerate() {
        assert_eq!(s, b, "{name}: dump line {} differs (files in {})", i + 1, dir.display());
    }
    assert_eq!(single.len(), block.len(), "{name}: dump lengths differ (files in {})", dir.display());
    true
}

macro_rules! same {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                same_trace($name);
            }
        )*
    };
}

// Not long_loop (406,009 instructions stepped one by one, the longest of these): its arc is
// compared block by block with the qemu oracle's by tests/tests/exact_counts.rs, which
// scripts/test.sh runs under ITRACE_STEP=instruction and again under ITRACE_BACKEND=ptrace (block
// stepping), so both step methods already give its oracle's blocks; count_loop has its loop shape.
same! {
    count_loop => "count_loop",
    branches => "branches",
    loops => "loops",
    fib => "fib",
    funcptr => "funcptr",
    jumptable => "jumptable",
    longjmp => "longjmp",
    signal => "signal",
    crash => "crash",
    jit => "jit",
    startstop => "startstop",
    segv => "segv",
}

/// Region tracing with the ptrace backend: ITraceOn/ITraceOff (nested, with system calls inside),
/// and `--start`/`--stop` symbols, whose int3s are stop points of a run (hwstep.rs, rule 9).
#[test]
fn regions() {
    same_trace_of("region", &program("region"), &["--backend", "ptrace", "--region"]);
    same_trace_of("region_loop", &program("region_loop"), &["--backend", "ptrace", "--region"]);
    same_trace_of("region_segv", &program("region_segv"), &["--backend", "ptrace", "--region"]);
    same_trace_of("region_sigtrap", &program("region_sigtrap"), &["--backend", "ptrace", "--region"]);
    same_trace_of("startstop-symbols", &program("startstop"), &["--start", "ss_target", "--stop", "ss_marker"]);
}

/// Programs whose threads or processes interleave differently from run to run: the self
/// counts of their own functions `funcs` must be the same in both modes.
fn same_counts(name: &str, options: &[&str], funcs: &[&str]) {
    let bin = program(name);
    let dir = test_dir(&format!("step_block-counts-{name}"));
    let mut counts = Vec::new();
    for step in ["instruction", "block"] {
        let trace = dir.join(format!("{step}.itr"));
        let mut opts = vec!["--step", step];
        opts.extend_from_slice(options);
        let rec = record(&trace, &opts, &bin, &[]);
        fail_if_block_unavailable(step, &rec.stderr);
        rec.assert_success();
        let own = report_self_counts(&report_json(&trace), &bin);
        let picked: Vec<(String, Option<u64>)> = funcs.iter().map(|f| (f.to_string(), own.get(*f).copied())).collect();
        assert!(picked.iter().all(|(_, c)| c.is_some_and(|c| c > 0)), "{name} --step {step}: {picked:?}");
        counts.push(picked);
    }
    assert_eq!(counts[0], counts[1], "{name}: self counts, --step instruction then --step block");
}

#[test]
fn threads_created_mid_trace() {
    same_counts("threads", &[], &["main", "thr_main", "thr_compute"]);
}

#[test]
fn fork_and_exec() {
    same_counts(
        "forkexec",
        &["--follow-forks"],
        &["main", "fe_mix", "fe_parent_work", "fe_child_main", "fe_child_work", "fe_exec_work", "fe_spawn"],
    );
}

#[test]
fn normalizing() {
    let a = "# itrace trace v2.0 arch=x86_64 mode=continuous step=ptrace-hwbreak cpus=2\n\
             0x0000220c cpu0 11349238898155 U CondJump flags=0 aux=0 0x40100b -> 0x401007 tid=5500 n=5\n\
             0x0000009c mte Mte(ProcessName { ts: 11349232912494, pid: 5500, ppid: 5494, name: \"x\" })";
    let b = "# itrace trace v2.0 arch=x86_64 mode=continuous step=ptrace-singlestep cpus=2\n\
             0x0000230c cpu0 21349238898155 U CondJump flags=0 aux=0 0x40100b -> 0x401007 tid=5600 n=5\n\
             0x0000019c mte Mte(ProcessName { ts: 21349232912494, pid: 5600, ppid: 5594, name: \"x\" })";
    assert_eq!(normalized_dump(a), normalized_dump(b));
    let c = a.replace("n=5", "n=6");
    assert_ne!(normalized_dump(a), normalized_dump(&c));
}

/// SIGALRM every millisecond lands anywhere in timer_compute's loop, mid-block in block mode:
/// its own count must not move, and each handler call counts the same in both modes.
#[test]
fn timer_signals_mid_block() {
    let bin = program("timer");
    let dir = test_dir("step_block-timer");
    let mut per_mode = Vec::new();
    for step in ["instruction", "block"] {
        let trace = dir.join(format!("{step}.itr"));
        let rec = record(&trace, &["--step", step], &bin, &[]);
        fail_if_block_unavailable(step, &rec.stderr);
        rec.assert_success();
        assert!(rec.stdout.contains("ticked"), "no SIGALRM arrived under --step {step}: {}", rec.stdout);
        let report = report_json(&trace);
        let own = report_self_counts(&report, &bin);
        let calls = report_calls(&report, &bin);
        let handler_calls = calls.get("timer_handler").copied().unwrap_or(0);
        assert!(handler_calls > 0, "--step {step}: no handler call in the trace");
        let handler_self = own.get("timer_handler").copied().unwrap_or(0);
        assert_eq!(handler_self % handler_calls, 0, "--step {step}: handler calls differ in length");
        per_mode.push((own.get("timer_compute").copied(), own.get("main").copied(), handler_self / handler_calls));
    }
    assert_eq!(per_mode[0], per_mode[1], "(timer_compute, main, per handler call): instruction, then block");
}

/// A 32-bit process (tests/programs/cross/i386.S, freestanding: call, ret, jnz, je, an
/// indirect jmp, int $0x80), built here with i686-linux-gnu-gcc.
#[test]
fn i386_freestanding() {
    let dir = test_dir("step_block-i386-build");
    let bin = dir.join("i386");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/cross/i386.S");
    // The i686 cross compiler (gcc-i686-linux-gnu, from scripts/install-test-deps.sh):
    // gcc-multilib's `gcc -m32` conflicts with the other cross compilers.
    let built = std::process::Command::new("i686-linux-gnu-gcc")
        .args(["-nostdlib", "-static", "-no-pie", "-o"])
        .arg(&bin)
        .arg(&src)
        .status();
    assert!(
        built.is_ok_and(|s| s.success()),
        "i686-linux-gnu-gcc cannot build {} (install gcc-i686-linux-gnu: scripts/install-test-deps.sh does)",
        src.display()
    );
    same_trace_of("i386", &bin, &[]);
}

/// SIGUSR1 from another process (this test) every few milliseconds while sigmid_body's long
/// straight-line block runs in a loop: in block mode the signals stop the thread mid-run. The
/// program counts its own loop iterations and handler calls: the trace has exactly as many
/// calls of each, every call the same length, and the same lengths as single-stepping's.
#[test]
fn signals_from_another_process_mid_block() {
    use std::io::BufRead;
    use std::sync::atomic::{AtomicBool, Ordering};
    let bin = program("sigmid");
    let dir = test_dir("step_block-sigmid");
    let mut per_mode = Vec::new();
    for step in ["instruction", "block"] {
        let trace = dir.join(format!("{step}.itr"));
        let mut child = std::process::Command::new(itrace_tests::itrace_bin())
            .args(["record", "--step", step, "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&bin)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start itrace record");
        let stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
            s
        });
        let mut lines = std::io::BufReader::new(stdout).lines();
        let ready = lines.next().and_then(Result::ok).unwrap_or_default();
        let pid: i32 = ready
            .strip_prefix("sigmid: ready pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("--step {step}: no ready line from sigmid, got {ready:?}"));
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let out_reader = {
            let done = done.clone();
            std::thread::spawn(move || {
                let last = lines.find_map(|l| l.ok().filter(|l| l.starts_with("sigmid: iterations=")));
                done.store(true, Ordering::SeqCst);
                last.unwrap_or_default()
            })
        };
        let mut sent = 0;
        while !done.load(Ordering::SeqCst) && sent < 100_000 {
            // SAFETY: kill(2) with a pid and a signal number; no memory is passed.
            if unsafe { libc::kill(pid, libc::SIGUSR1) } != 0 {
                break;
            }
            sent += 1;
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        let status = itrace_tests::wait_with_guard(&mut child, "itrace record sigmid");
        let err = err_reader.join().unwrap();
        fail_if_block_unavailable(step, &err);
        assert!(status.success(), "--step {step}: itrace record exited with {status}:\n{err}");
        let last = out_reader.join().unwrap();
        let field = |name: &str| -> u64 {
            last.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("--step {step}: no {name} in sigmid's line {last:?}"))
        };
        let (iterations, handled) = (field("iterations="), field("handled="));
        let report = report_json(&trace);
        let own = report_self_counts(&report, &bin);
        let calls = report_calls(&report, &bin);
        assert_eq!(calls.get("sigmid_body").copied(), Some(iterations), "--step {step}: sigmid_body calls");
        assert_eq!(calls.get("sigmid_handler").copied(), Some(handled), "--step {step}: handler calls");
        let body = own.get("sigmid_body").copied().unwrap_or(0);
        let handler = own.get("sigmid_handler").copied().unwrap_or(0);
        assert_eq!(body % iterations, 0, "--step {step}: sigmid_body calls differ in length ({body} / {iterations})");
        assert_eq!(handler % handled, 0, "--step {step}: handler calls differ in length ({handler} / {handled})");
        per_mode.push((body / iterations, handler / handled));
    }
    assert_eq!(per_mode[0], per_mode[1], "(sigmid_body, sigmid_handler) per call: instruction, then block");
}

/// A program of the system, built as Debian builds (-O2, CET's endbr64, `.plt.sec` stubs whose
/// indirect jumps itrace carries out in block mode, jump tables, the vDSO, libc's string
/// functions chosen at run time): `sha256sum` of a fixed 3,000-byte file.
#[test]
fn system_program_sha256sum() {
    let dir = test_dir("step_block-sha256sum-input");
    let input = dir.join("input.txt");
    let text: String = (0..3000).map(|i| (b'a' + (i * 7 % 26) as u8) as char).collect();
    std::fs::write(&input, text).unwrap();
    let sha = std::path::Path::new("/usr/bin/sha256sum");
    assert!(sha.exists(), "/usr/bin/sha256sum is missing (Debian package coreutils)");
    same_trace_with_args("sha256sum", sha, &[], &[input.to_str().unwrap()]);
}
