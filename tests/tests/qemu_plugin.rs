//! The qemu plugin backend (`itrace record --backend qemu`): the freestanding
//! x86_64 programs' arcs equal qemu's single-step log (the oracle) and the
//! ptrace single-step backend's, block for block; the libc programs' own
//! functions get the ptrace backend's self counts; bad set-ups fail in one
//! line naming the fix. The cross-architecture programs are in cross.rs.

use itrace_tests::{
    arc_lines, arc_text, checked_arc, compare_lines, itrace, itrace_bin, program, record, report_calls, report_json,
    report_self_counts, report_thread_ids, require_tool, run, target_dir, test_dir, without_exit_kernel_line,
    write_executable, ArcLine, Oracle, COUNT_LOOP_BLOCKS, COUNT_LOOP_INSTRUCTIONS, FIB_ASM_SELF, FIB_CALLS,
    LONG_LOOP_BLOCKS, LONG_LOOP_INSTRUCTIONS,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const QEMU: &[&str] = &["--backend", "qemu"];

/// A test directory made earlier in this test (not emptied).
fn test_dir_path(name: &str) -> std::path::PathBuf {
    target_dir().join("test-output").join(name)
}

/// (kernel, type, count, symbol+offset) of each line: what must agree between backends.
fn shape(lines: &[ArcLine]) -> Vec<(bool, u8, u64, String)> {
    lines.iter().map(|l| (l.kernel, l.type_code, l.count, l.location())).collect()
}

fn check_freestanding(name: &str) -> Vec<ArcLine> {
    let bin = program(name);
    let oracle = Oracle::of(&bin, &[]);
    let dir = test_dir(&format!("qemu_plugin-{name}"));
    let trace = dir.join("plugin.itr");
    record(&trace, QEMU, &bin, &[]).assert_success();
    let (_, lines) = checked_arc(&trace, &dir.join("plugin.arc"));
    for l in &lines {
        assert_eq!(l.pname, name, "arc line {}: process name", l.lineno);
    }
    let total: u64 = lines.iter().map(|l| l.count).sum();
    assert_eq!(total, oracle.instructions, "{name}: total instructions against qemu's single-step log");
    let module = bin.to_string_lossy().into_owned();
    if let Err(e) = compare_lines(without_exit_kernel_line(&lines), &oracle.expected, &module) {
        panic!("{name}: the plugin's arc differs from qemu's single-step log: {e}");
    }
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(oracle.instructions), "{name}: report total");
    assert_eq!(report["lost_records"].as_u64(), Some(0));

    // The ptrace single-step backend, on the same program: the same lines.
    let stepped = dir.join("ptrace.itr");
    record(&stepped, &["--backend", "ptrace"], &bin, &[]).assert_success();
    let want = arc_lines(&arc_text(&stepped));
    assert_eq!(shape(&lines), shape(&want), "{name}: plugin against the ptrace single-step backend");
    lines
}

#[test]
fn count_loop() {
    let lines = check_freestanding("count_loop");
    assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), COUNT_LOOP_INSTRUCTIONS, "hand count");
    assert_eq!(lines.iter().filter(|l| !l.kernel).count(), COUNT_LOOP_BLOCKS, "hand count of blocks");
}

#[test]
fn branches() {
    let lines = check_freestanding("branches");
    assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), 102, "hand count (branches.S)");
    let k: Vec<&str> =
        without_exit_kernel_line(&lines).iter().filter(|l| l.kernel).map(|l| l.symbol.as_str()).collect();
    assert_eq!(k, vec!["sys_write"]);
}

#[test]
fn long_loop() {
    let lines = check_freestanding("long_loop");
    assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), LONG_LOOP_INSTRUCTIONS, "hand count");
    assert_eq!(lines.iter().filter(|l| !l.kernel).count(), LONG_LOOP_BLOCKS, "hand count of blocks");
}

/// One taken branch after 70,001 instructions, more than the 16 bits of a branch the plugin's
/// vCPU hands to its writer packed: it travels whole, its count exact (straight_line.S's hand
/// count, and qemu's single-step log through `check_freestanding`).
#[test]
fn straight_line_past_the_packed_count() {
    let lines = check_freestanding("straight_line");
    let counts: Vec<u64> = lines.iter().map(|l| l.count).collect();
    assert_eq!(counts, vec![70_001, 3], "hand count: the jmp after 70,000 nops, then the exit");
}

/// The three collection modes: the same long_loop, whole (continuous, normal with room) or its
/// most recent records (wrap), each read back without error. Its 200,000 taken branches take
/// about 22 KB in format 3.0 (a loop of runs), so the ring of wrap mode is 4K.
#[test]
fn modes() {
    let bin = program("long_loop");
    let dir = test_dir("qemu_plugin-modes");
    for (mode, size) in [("normal", "64M"), ("wrap", "4K"), ("continuous", "64K")] {
        let trace = dir.join(format!("{mode}.itr"));
        let opts = ["--backend", "qemu", "--mode", mode, "--buffer-size", size, "--segment-size", "64K"];
        record(&trace, &opts, &bin, &[]).assert_success();
        let report = report_json(&trace);
        let total = report["total_instructions"].as_u64().unwrap();
        let lost = report["lost_records"].as_u64().unwrap();
        if mode == "wrap" {
            assert!(lost > 0 && total < LONG_LOOP_INSTRUCTIONS, "wrap: {lost} lost, {total} instructions");
        } else {
            assert_eq!((total, lost), (LONG_LOOP_INSTRUCTIONS, 0), "{mode}");
        }
    }
}

/// Normal mode with a buffer too small for long_loop: its branches are exactly the first ones
/// of the whole (continuous) trace, none changed or dropped on the way through the writer,
/// then a trace-off for the full buffer ends the stream; the program runs on to its end.
#[test]
fn normal_mode_full_buffer_keeps_the_first_branches() {
    let bin = program("long_loop");
    let dir = test_dir("qemu_plugin-normal-full");
    // Each branch line of the dump without its offset, timestamp and thread id.
    let branches = |trace: &Path| -> Vec<String> {
        let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
        dump.assert_success();
        dump.stdout
            .lines()
            .filter(|l| matches!(l.split_whitespace().nth(3), Some("U" | "K")))
            .map(|l| l.split_whitespace().skip(3).filter(|w| !w.starts_with("tid=")).collect::<Vec<_>>().join(" "))
            .collect()
    };
    let whole = dir.join("continuous.itr");
    record(&whole, &["--backend", "qemu", "--segment-size", "64K"], &bin, &[]).assert_success();
    let small = dir.join("normal.itr");
    let opts = ["--backend", "qemu", "--mode", "normal", "--buffer-size", "4K", "--segment-size", "64K"];
    let out = record(&small, &opts, &bin, &[]);
    out.assert_success();
    assert!(out.stdout.contains("long_loop: done"), "the program did not run on: {}", out.stdout);
    let (all, first) = (branches(&whole), branches(&small));
    // long_loop takes 200,000 branches; 4K holds some thousands of them.
    assert!(
        all.len() >= 200_000 && !first.is_empty() && first.len() < all.len() / 2,
        "{} of {}",
        first.len(),
        all.len()
    );
    assert_eq!(first[..], all[..first.len()], "normal mode's branches are not the whole trace's first ones");
    let dump = itrace(["dump".as_ref(), small.as_os_str()]);
    let last = dump.stdout.lines().rfind(|l| l.contains(" cpu0 ")).unwrap_or_default();
    assert!(last.contains("TraceOff") && last.contains("reason: BufferFull"), "last record: {last}");
}

/// libc programs: self counts of the program's own functions, plugin against ptrace stepping
/// (glibc's own work differs: the emulated CPU's features pick other string routines).
fn compare_with_ptrace(name: &str, funcs: &[&str]) -> serde_json::Value {
    let bin = program(name);
    let dir = test_dir(&format!("qemu_plugin-libc-{name}"));
    let plugin = dir.join("plugin.itr");
    record(&plugin, QEMU, &bin, &[]).assert_success();
    let stepped = dir.join("ptrace.itr");
    record(&stepped, &["--backend", "ptrace"], &bin, &[]).assert_success();
    let report = report_json(&plugin);
    let got = report_self_counts(&report, &bin);
    let want = report_self_counts(&report_json(&stepped), &bin);
    let mut diffs = BTreeMap::new();
    for f in funcs {
        assert!(want.get(*f).copied().unwrap_or(0) > 0, "ptrace trace has no {f}");
        if got.get(*f) != want.get(*f) {
            diffs.insert(*f, (got.get(*f).copied(), want.get(*f).copied()));
        }
    }
    assert!(diffs.is_empty(), "{name}: self counts (plugin, ptrace) differ: {diffs:?}");
    report
}

#[test]
fn libc_loops_and_recursion() {
    compare_with_ptrace("loops", &["main", "loops_fill", "loops_sum", "loops_nested", "loops_bits"]);
    let report = compare_with_ptrace("fib", &["main", "fib", "fib_asm"]);
    let bin = program("fib");
    assert_eq!(report_self_counts(&report, &bin).get("fib_asm"), Some(&FIB_ASM_SELF), "closed form in fib.c");
    assert_eq!(report_calls(&report, &bin).get("fib_asm"), Some(&FIB_CALLS));
}

#[test]
fn libc_function_pointers_and_jump_table() {
    compare_with_ptrace("funcptr", &["main", "fp_add", "fp_sub", "fp_mul", "fp_xor", "fp_fold"]);
    compare_with_ptrace("jumptable", &["main", "jt_classify"]);
}

/// Signals (delivered by qemu-user on the way out of the raise system call) and longjmp.
#[test]
fn libc_signals_and_longjmp() {
    let report = compare_with_ptrace("signal", &["main", "sig_handler", "sig_compute"]);
    let bin = program("signal");
    assert_eq!(report_calls(&report, &bin).get("sig_handler"), Some(&3), "three deliveries, each a call");
    let arc = arc_text(&test_dir_path("qemu_plugin-libc-signal").join("plugin.itr"));
    assert_eq!(arc.matches("signal_SIGUSR1:[kernel]").count(), 3, "three SIGUSR1 deliveries in the arc");
    compare_with_ptrace("longjmp", &["main", "lj_dive", "lj_round"]);
}

/// Guest threads: each gets its own stream (vCPU index) and thread id.
#[test]
fn libc_threads() {
    let report = compare_with_ptrace("threads", &["main", "thr_main", "thr_compute"]);
    let tids = report_thread_ids(&report, "tid");
    assert_eq!(tids.len(), 5, "main thread + 4 workers: {}", report["threads"]);
}

#[test]
fn missing_qemu_names_the_package() {
    let dir = test_dir("qemu_plugin-no-qemu");
    let o = run(Command::new(itrace_bin())
        .env("PATH", &dir)
        .args(["record", "--backend", "qemu", "-o"])
        .arg(dir.join("t.itr"))
        .arg("--")
        .arg(program("count_loop")));
    let line = o.assert_clean_error();
    assert!(line.contains("qemu-x86_64 is not installed") && line.contains("qemu-user"), "{line}");
}

/// A plugin built for another API version: qemu refuses it, itrace says so in one line.
#[test]
fn plugin_api_mismatch_is_one_line() {
    let dir = test_dir("qemu_plugin-api-mismatch");
    let src = dir.join("future.c");
    std::fs::write(
        &src,
        "int qemu_plugin_version = 99;\n\
         int qemu_plugin_install(unsigned long id, const void *info, int argc, char **argv) { return 0; }\n",
    )
    .unwrap();
    let so = dir.join("future.so");
    run(Command::new(require_tool("gcc")).args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src)).assert_success();
    let o = run(Command::new(itrace_bin())
        .env("ITRACE_QEMU_PLUGIN", &so)
        .args(["record", "--backend", "qemu", "-o"])
        .arg(dir.join("t.itr"))
        .arg("--")
        .arg(program("count_loop")));
    let line = o.assert_clean_error();
    assert!(line.contains("plugin API mismatch") && line.contains("install qemu-user 7.2"), "{line}");
    assert!(!Path::new(&dir.join("t.itr")).exists(), "no trace file is left behind");
}

#[test]
fn arch_mismatch_is_one_line() {
    let o = itrace(
        ["record", "--backend", "qemu", "--arch", "s390x", "--"]
            .iter()
            .map(|s| s.as_ref())
            .chain([program("count_loop").as_os_str()]),
    );
    let line = o.assert_clean_error();
    assert!(line.contains("is a x86_64 program, not s390x"), "{line}");
}

/// A script (a pyenv-like shim) runs as the kernel runs it: its `#!` interpreter with the
/// line's argument, the script and the command's arguments. Truth: the script run directly
/// (its output and exit status), and count_loop's hand count for a script whose interpreter
/// is count_loop; itrace says it is a script and names the interpreter. An interpreter that
/// is missing is one line naming it.
#[test]
fn a_script_is_traced_through_its_interpreter() {
    let dir = test_dir("qemu_plugin-script");
    let shim = dir.join("shim");
    write_executable(&shim, "#!/bin/sh -e\necho \"args: $0 $*\"\nexit 3\n");
    let direct = run(Command::new(&shim).args(["a", "b c"]));
    assert_eq!(direct.status.code(), Some(3), "the shim run directly: {}", direct.stderr);
    let trace = dir.join("shim.itr");
    let traced = record(&trace, QEMU, &shim, &["a", "b c"]);
    assert_eq!(traced.status.code(), Some(3), "the program's exit status: {}", traced.stderr);
    assert_eq!(traced.stdout, direct.stdout, "the shim's output under qemu");
    let said = format!("{} is a script for /bin/sh", shim.display());
    assert!(traced.stderr.contains(&said), "itrace names the interpreter: {}", traced.stderr);
    let report = report_json(&trace);
    assert!(report["total_instructions"].as_u64().unwrap_or(0) > 10_000, "the shell ran: {report}");

    // A script whose interpreter is count_loop: the trace is count_loop's, exactly.
    let counted = dir.join("counted");
    write_executable(&counted, &format!("#!{}\n", program("count_loop").display()));
    let trace = dir.join("counted.itr");
    let out = record(&trace, QEMU, &counted, &[]);
    assert!(out.stderr.contains(&format!("is a script for {}", program("count_loop").display())), "{}", out.stderr);
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(COUNT_LOOP_INSTRUCTIONS), "hand count (count_loop.S)");

    // A shim through env (`#!/usr/bin/env sh`, as pyenv's): env execs the shell, which qemu-user
    // runs natively: the trace is env's, itrace says it ended at the exec, and the script
    // still runs whole.
    let env_shim = dir.join("env_shim");
    write_executable(&env_shim, "#!/usr/bin/env sh\necho \"args: $0 $*\"\nexit 3\n");
    let direct = run(Command::new(&env_shim).args(["a", "b c"]));
    let traced = record(&dir.join("env.itr"), QEMU, &env_shim, &["a", "b c"]);
    assert_eq!(traced.status.code(), Some(3), "the program's exit status: {}", traced.stderr);
    assert_eq!(traced.stdout, direct.stdout, "the shim's output under qemu");
    assert!(traced.stderr.contains("is a script for /usr/bin/env"), "{}", traced.stderr);
    assert!(traced.stderr.contains("tracing ended: the program called exec"), "{}", traced.stderr);

    let missing = dir.join("missing");
    write_executable(&missing, "#!/nonexistent/interpreter -x\n");
    let o = itrace([
        "record".as_ref(),
        "--backend".as_ref(),
        "qemu".as_ref(),
        "-o".as_ref(),
        dir.join("missing.itr").as_os_str(),
        "--".as_ref(),
        missing.as_os_str(),
    ]);
    let line = o.assert_clean_error();
    assert!(line.contains("is a script for /nonexistent/interpreter, which cannot be run"), "{line}");
}

/// `itrace record --backend qemu -- spinner 400 10000` with the spinner's stdout piped here:
/// the reference result line, itrace (still running) and the spinner's output.
fn start_spinner_under_qemu(
    trace: &Path,
) -> (itrace_tests::KillOnDrop, std::io::BufReader<std::process::ChildStdout>, String) {
    use std::io::BufRead;
    use std::process::Stdio;
    require_tool("qemu-x86_64");
    let spinner = program("spinner");
    let reference = run(Command::new(&spinner).args(["400", "0"]));
    reference.assert_success();
    let want = reference.stdout.lines().find(|l| l.starts_with("spinner: result=")).expect("result line").to_string();
    let mut rec = itrace_tests::KillOnDrop(
        Command::new(itrace_bin())
            .args(["record", "--backend", "qemu", "-o"])
            .arg(trace)
            .arg("--")
            .arg(&spinner)
            .args(["400", "10000"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start itrace"),
    );
    let mut out = std::io::BufReader::new(rec.0.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).expect("read the spinner's start line");
    assert!(first.starts_with("spinner: started"), "{first}");
    // Some rounds traced (each is about 10,000 instructions, then a 10 ms sleep).
    std::thread::sleep(std::time::Duration::from_millis(300));
    (rec, out, want)
}

/// The spinner, left running by itrace, ends with the right result, and the trace read
/// back ends with the detach.
fn spinner_runs_on(mut out: std::io::BufReader<std::process::ChildStdout>, want: &str, trace: &Path) {
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read the spinner's output");
    assert_eq!(rest.lines().find(|l| l.starts_with("spinner: result=")), Some(want), "spinner output:\n{rest}");
    let report = report_json(trace);
    let own = report_self_counts(&report, &program("spinner"));
    let rounds = own.get("spin_round").copied().unwrap_or(0);
    // spin_round is 2,000 iterations of a few instructions: some rounds, not all 400.
    assert!(rounds >= 2_000, "spin_round ran {rounds} traced instructions: {own:?}");
    assert!(rounds < 400 * 2_000 * 3, "the whole run was traced ({rounds} instructions in spin_round)");
    assert!(arc_text(trace).contains("detached"), "the arc does not say the trace ended by detaching");
}

/// SIGTERM to itrace under --backend qemu: the plugin ends the trace at the program's next
/// block, itrace exits 0, and the program runs on under qemu, untraced, to its right result.
#[test]
fn sigterm_ends_the_trace_and_the_program_runs_on() {
    let dir = test_dir("qemu-sigterm");
    let trace = dir.join("t.itr");
    let (mut rec, out, want) = start_spinner_under_qemu(&trace);
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(rec.0.id() as i32, libc::SIGTERM) };
    let status = itrace_tests::wait_with_guard(&mut rec.0, "itrace");
    let mut err = String::new();
    std::io::Read::read_to_string(rec.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "itrace exited with {status} after SIGTERM: {err}");
    assert!(err.contains("stopped on request"), "itrace's summary: {err}");
    spinner_runs_on(out, &want, &trace);
}

/// itrace killed outright (SIGKILL, no handler runs): the plugin sees its parent go, ends the
/// trace the same way, and the program runs on to its right result.
#[test]
fn killed_itrace_leaves_the_program_running_and_the_trace_whole() {
    let dir = test_dir("qemu-sigkill");
    let trace = dir.join("t.itr");
    let (mut rec, out, want) = start_spinner_under_qemu(&trace);
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(rec.0.id() as i32, libc::SIGKILL) };
    let _ = itrace_tests::wait_with_guard(&mut rec.0, "itrace");
    spinner_runs_on(out, &want, &trace);
}

/// `--duration` under --backend qemu ends the trace the same way.
#[test]
fn duration_ends_the_trace_and_the_program_runs_on() {
    require_tool("qemu-x86_64");
    let spinner = program("spinner");
    let reference = run(Command::new(&spinner).args(["200", "0"]));
    let want = reference.stdout.lines().find(|l| l.starts_with("spinner: result=")).expect("result line").to_string();
    let dir = test_dir("qemu-duration");
    let trace = dir.join("t.itr");
    let marker = dir.join("after");
    // The spinner's output goes to a file: itrace returns before the spinner ends.
    let out = std::fs::File::create(&marker).unwrap();
    let status = Command::new(itrace_bin())
        .args(["record", "--backend", "qemu", "--duration", "0.5", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&spinner)
        .args(["200", "10000"])
        .stdout(out)
        .status()
        .expect("run itrace");
    assert!(status.success(), "itrace --duration exited with {status}");
    // The spinner (200 rounds, 10 ms apart: 2 s or more) still runs; wait for its result line.
    let mut text = String::new();
    for _ in 0..600 {
        text = std::fs::read_to_string(&marker).unwrap_or_default();
        if text.contains("spinner: result=") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(text.lines().find(|l| l.starts_with("spinner: result=")), Some(want.as_str()), "output:\n{text}");
    assert!(arc_text(&trace).contains("detached"), "the arc does not say the trace ended by detaching");
}

/// A directory holding a stand-in `qemu-x86_64` running `script` (sh), for PATH.
fn fake_qemu(dir: &Path, script: &str) -> std::ffi::OsString {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let qemu = bin.join("qemu-x86_64");
    write_executable(&qemu, &format!("#!/bin/sh\n{script}\n"));
    let mut path = bin.into_os_string();
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    path
}

/// What the one error line says the trace file holds must be so (issue 27, part 6): a file a
/// reader can open when it speaks of one, no file when it says none was written.
fn assert_message_is_true(line: &str, trace: &Path) {
    if line.contains("no trace was written") {
        assert!(
            !trace.exists() || std::fs::metadata(trace).unwrap().len() == 0,
            "{line}: yet {} exists",
            trace.display()
        );
    } else {
        let info = itrace([std::ffi::OsStr::new("info"), trace.as_os_str()]);
        assert!(info.success(), "{line}: but `itrace info` says: {}", info.stderr);
    }
}

/// The recording process killed (SIGKILL: nothing can finish the file) while qemu-user is still
/// being asked whether it takes the plugin, before the program ran: itrace must not say that a
/// trace holds what was written until then; none was.
#[test]
fn recorder_killed_before_the_program_ran_says_no_trace_was_written() {
    let dir = test_dir("qemu_plugin-killed-before-start");
    let qemu_pid = dir.join("qemu.pid");
    // A qemu-user that never answers the plugin probe.
    let path = fake_qemu(&dir, &format!("echo $$ > {}\nexec sleep 300", qemu_pid.display()));
    let trace = dir.join("t.itr");
    let child = Command::new(itrace_bin())
        .env("PATH", &path)
        .args(["record", "--backend", "qemu", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(program("count_loop"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start itrace");
    itrace_tests::wait_until("the stand-in qemu-user", || {
        std::fs::read_to_string(&qemu_pid).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    });
    let qemu: i32 = std::fs::read_to_string(&qemu_pid).unwrap().trim().parse().unwrap();
    // Its parent is the recording process (itrace's child).
    let stat = std::fs::read_to_string(format!("/proc/{qemu}/stat")).expect("qemu's stat");
    let recorder: i32 = stat.rsplit(')').next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_ne!(recorder, child.id() as i32, "the recorder is itrace's child, not itrace");
    // SAFETY: kill(2) of the recording process this test's itrace started, then of the stand-in.
    unsafe {
        assert_eq!(libc::kill(recorder, libc::SIGKILL), 0);
        libc::kill(qemu, libc::SIGKILL);
    }
    let out = child.wait_with_output().expect("wait for itrace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGKILL), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("killed by SIGKILL"), "{stderr}");
    assert!(!trace.exists(), "the recorder died before it created {}", trace.display());
    assert_message_is_true(lines[0], &trace);
}

/// qemu-user killed by a signal after it took the plugin but before the plugin wrote anything
/// (a stand-in answers the probe, then kills itself): one line, true about the file.
#[test]
fn qemu_killed_before_the_plugin_wrote_says_no_trace_was_written() {
    let dir = test_dir("qemu_plugin-qemu-killed-before-start");
    let src = dir.join("fake_qemu.c");
    std::fs::write(
        &src,
        r#"/* A stand-in qemu-x86_64 without libc (itrace preloads its plugin into qemu, which a
 * dynamic program here could not load): answers the plugin probe, then dies of SIGKILL. */
static long sys(long n, long a, long b, long c)
{
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

static char *find(char *s, const char *w)
{
    for (; *s; s++) {
        int i = 0;
        while (w[i] && s[i] == w[i])
            i++;
        if (!w[i])
            return s;
    }
    return 0;
}

__asm__(".globl _start\n_start:\n mov %rsp, %rdi\n and $-16, %rsp\n call start_c\n hlt\n");

void start_c(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    static const char ok[] = "ok api=1 target=x86_64\n";
    for (long i = 1; i < argc; i++) {
        char *status = find(argv[i], "status=");
        if (find(argv[i], "probe=on") && status) {
            status += 7;
            char *end = find(status, ",");
            if (end)
                *end = 0;
            long fd = sys(2 /* open */, (long)status, 01 | 0100 | 01000 /* O_WRONLY|O_CREAT|O_TRUNC */, 0644);
            sys(1 /* write */, fd, (long)ok, sizeof ok - 1);
            sys(60 /* exit */, fd < 0, 0, 0);
        }
    }
    sys(62 /* kill */, sys(39 /* getpid */, 0, 0, 0), 9 /* SIGKILL */, 0);
    sys(60, 1, 0, 0);
}
"#,
    )
    .unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    run(Command::new(require_tool("gcc"))
        .args(["-static", "-nostdlib", "-ffreestanding", "-fno-stack-protector", "-O1", "-o"])
        .arg(bin.join("qemu-x86_64"))
        .arg(&src))
    .assert_success();
    let mut path = bin.into_os_string();
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    let trace = dir.join("t.itr");
    let o = run(Command::new(itrace_bin())
        .env("PATH", &path)
        .args(["record", "--backend", "qemu", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(program("count_loop")));
    let line = o.assert_clean_error();
    assert!(line.contains("killed by signal 9"), "{line}");
    assert_message_is_true(&line, &trace);
}
