//! A program itrace launches inherits what it would inherit from the shell that started
//! itrace (issue 27, part 3): the signals ignored stay ignored, the others have their default
//! disposition (itrace's own handlers and its ignored SIGPIPE and SIGXFSZ do not leak), the
//! signal mask, and the environment in its order.
//!
//! The truth is the untraced program started the same way: `env -i VARS… PROGRAM` from a
//! process that ignored and blocked the signals of the case. tests/programs/inherit.c prints
//! the signals it starts with ignored and blocked, and its environment in order. Under
//! `--backend qemu` the signal lines are compared with plain qemu-user's (qemu maps real-time
//! signals to other numbers for its guest) and the environment with the native run's.

use itrace_tests::{itrace_bin, program, require_tool, run, test_dir, Output};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// The environment of every run, deliberately out of alphabetical order, with a comma in a
/// value (qemu-user splits its `-E` option at commas).
const VARS: [&str; 5] = ["Z_LAST_NAME=2", "A_FIRST_NAME=1", "M_MIDDLE=3", "B_LIST=x,y", "PATH=/usr/bin:/bin"];

/// How the process that starts itrace (or the program) was set up.
#[derive(Clone, Copy)]
struct Setup {
    ignored: &'static [libc::c_int],
    blocked: &'static [libc::c_int],
}

/// `nohup` and a script that ignores Ctrl-C and Ctrl-\ at once, with some signals blocked
/// (a real-time one too).
const IGNORING: Setup = Setup {
    ignored: &[libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGPIPE],
    blocked: &[libc::SIGUSR1, libc::SIGUSR2, 40],
};

/// SIGCHLD ignored (children reaped by the kernel): the program keeps it so, and itrace,
/// which waits for its children, still works.
const CHILD_IGNORING: Setup = Setup { ignored: &[libc::SIGCHLD], blocked: &[] };

/// A plain shell: nothing ignored or blocked. The signals itrace itself handles (INT, TERM,
/// HUP, QUIT, ALRM), ignores (PIPE, XFSZ) or blocks must reach the program as defaults.
const PLAIN: Setup = Setup { ignored: &[], blocked: &[] };

/// `env -i VARS… ARGS…`, started from a process set up as `setup` says.
fn command(setup: Setup, args: &[&std::ffi::OsStr]) -> Command {
    let mut cmd = Command::new(require_tool("env"));
    cmd.arg("-i").args(VARS).args(args);
    let Setup { ignored, blocked } = setup;
    // SAFETY: between fork and exec only sigaction, sigemptyset, sigaddset and sigprocmask,
    // which are async-signal-safe, on local memory.
    unsafe {
        cmd.pre_exec(move || {
            let mut sa: libc::sigaction = std::mem::zeroed();
            libc::sigemptyset(&mut sa.sa_mask);
            for sig in 1..=64 {
                sa.sa_sigaction = if ignored.contains(&sig) { libc::SIG_IGN } else { libc::SIG_DFL };
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
            let mut mask: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut mask);
            for &sig in blocked {
                libc::sigaddset(&mut mask, sig);
            }
            libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            Ok(())
        });
    }
    cmd
}

/// The program's output when run as `args` (a program and its arguments) under `setup`.
fn output(setup: Setup, args: &[&std::ffi::OsStr]) -> Output {
    let out = run(&mut command(setup, args));
    out.assert_success();
    out
}

/// The signal lines and the environment lines of inherit.c's output.
fn split(out: &str) -> (Vec<&str>, Vec<&str>) {
    let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("work ")).collect();
    lines.iter().partition(|l| !l.starts_with("env "))
}

/// The program run by itrace with `options`, under `setup`, prints what `truth` printed:
/// signal lines as `signals_truth`, environment lines as the native run's. `added` is the
/// variable the backend adds (documented), expected as the last one.
fn same_as_untraced(name: &str, setup: Setup, options: &[&str], signals_truth: Option<&str>, added: Option<&str>) {
    same_program_as_untraced("inherit", name, setup, options, signals_truth, added);
}

/// [`same_as_untraced`] of the test program `program_name` (inherit, or inherit_static).
fn same_program_as_untraced(
    program_name: &str,
    name: &str,
    setup: Setup,
    options: &[&str],
    signals_truth: Option<&str>,
    added: Option<&str>,
) {
    let prog = program(program_name);
    let native = output(setup, &[prog.as_os_str()]);
    let dir = test_dir(&format!("inherit-{name}"));
    let trace = dir.join("t.itr");
    let itrace = itrace_bin();
    let mut args: Vec<&std::ffi::OsStr> = vec![itrace.as_os_str(), "record".as_ref(), "-o".as_ref(), trace.as_os_str()];
    args.extend(options.iter().map(|o| std::ffi::OsStr::new(*o)));
    args.push("--".as_ref());
    args.push(prog.as_os_str());
    let traced = output(setup, &args);
    assert!(Path::new(&trace).is_file(), "{name}: no trace written");
    let (native_signals, native_env) = split(&native.stdout);
    let (traced_signals, mut traced_env) = split(&traced.stdout);
    if let Some(var) = added {
        let last = traced_env.pop().unwrap_or_default();
        assert!(
            last.starts_with(&format!("env {var}=")),
            "{name}: the last variable is {last:?}, not the {var} the backend adds\n--- traced ---\n{}",
            traced.stdout
        );
    }
    let signals_truth = signals_truth.map(split).map(|(s, _)| s).unwrap_or(native_signals);
    assert_eq!(
        traced_signals, signals_truth,
        "{name}: the traced program's ignored and blocked signals differ from the untraced program's"
    );
    assert_eq!(traced_env, native_env, "{name}: the traced program's environment differs from the untraced program's");
    // The work after the region ran too.
    assert!(traced.stdout.contains("work 1"), "{name}: the program did not finish\n{}", traced.stdout);
}

/// Plain qemu-user's output for the program under `setup`: qemu's own signal numbering.
fn under_qemu(setup: Setup) -> String {
    under_qemu_of("inherit", setup)
}

/// [`under_qemu`] of the test program `program_name`.
fn under_qemu_of(program_name: &str, setup: Setup) -> String {
    let qemu = require_tool("qemu-x86_64");
    output(setup, &[qemu.as_os_str(), program(program_name).as_os_str()]).stdout
}

#[test]
fn ptrace_block_stepping_keeps_ignored_signals_mask_and_environment() {
    same_as_untraced("ptrace-ignoring", IGNORING, &[], None, None);
}

#[test]
fn ptrace_block_stepping_gives_defaults_where_the_shell_had_them() {
    same_as_untraced("ptrace-plain", PLAIN, &[], None, None);
}

#[test]
fn ptrace_single_stepping_keeps_ignored_signals_mask_and_environment() {
    same_as_untraced("step-ignoring", IGNORING, &["--step", "instruction"], None, None);
}

#[test]
fn qemu_backend_keeps_ignored_signals_mask_and_environment_order() {
    let truth = under_qemu(IGNORING);
    same_as_untraced("qemu-ignoring", IGNORING, &["--backend", "qemu"], Some(&truth), None);
}

#[test]
fn qemu_backend_gives_defaults_where_the_shell_had_them() {
    let truth = under_qemu(PLAIN);
    same_as_untraced("qemu-plain", PLAIN, &["--backend", "qemu"], Some(&truth), None);
}

/// The in-process recorder adds ITRACE_SHM (where libitrace finds its shared memory).
#[test]
fn in_process_backend_keeps_ignored_signals_mask_and_environment_order() {
    same_as_untraced("inproc-ignoring", IGNORING, &["--region", "--backend", "inproc"], None, Some("ITRACE_SHM"));
}

#[test]
fn in_process_backend_gives_defaults_where_the_shell_had_them() {
    same_as_untraced("inproc-plain", PLAIN, &["--region", "--backend", "inproc"], None, Some("ITRACE_SHM"));
}

/// `--qemu ARCH` (qemu's GDB stub): the program's environment is only what `--env` gives, in
/// the order given (here: the same variables as the untraced run's, so the same lines). The
/// program is inherit_static (the same source, linked statically, no libitrace): the stub steps
/// every instruction from the first, and the dynamic one's loader made each test 20 s long.
fn gdb_stub_backend(name: &str, setup: Setup) {
    let truth = under_qemu_of("inherit_static", setup);
    let mut options = vec!["--qemu", "x86_64"];
    for kv in VARS {
        options.extend(["--env", kv]);
    }
    same_program_as_untraced("inherit_static", name, setup, &options, Some(&truth), None);
}

#[test]
fn gdb_stub_backend_keeps_ignored_signals_mask_and_environment_order() {
    gdb_stub_backend("gdb-ignoring", IGNORING);
}

#[test]
fn gdb_stub_backend_gives_defaults_where_the_shell_had_them() {
    gdb_stub_backend("gdb-plain", PLAIN);
}

#[test]
fn ptrace_backend_works_and_keeps_sigchld_ignored() {
    same_as_untraced("ptrace-sigchld", CHILD_IGNORING, &[], None, None);
}

#[test]
fn in_process_backend_works_and_keeps_sigchld_ignored() {
    same_as_untraced("inproc-sigchld", CHILD_IGNORING, &["--region", "--backend", "inproc"], None, Some("ITRACE_SHM"));
}

#[test]
fn qemu_backend_works_and_keeps_sigchld_ignored() {
    let truth = under_qemu(CHILD_IGNORING);
    same_as_untraced("qemu-sigchld", CHILD_IGNORING, &["--backend", "qemu"], Some(&truth), None);
}

/// itrace started by a shell that ignored HUP, INT and QUIT records region_loop; once the
/// program runs, `sig` is sent to itrace. Returns the program's output after its first line,
/// itrace's stderr, and whether itrace succeeded.
fn record_region_loop_and_send(test: &str, sig: libc::c_int) -> (String, String, std::process::ExitStatus) {
    use std::io::{BufRead, Read};
    let trace = test_dir(test).join("t.itr");
    let mut cmd = command(IGNORING, &[itrace_bin().as_os_str()]);
    cmd.args(["record", "-o"]).arg(&trace).arg("--").arg(program("region_loop")).args(["100", "10000"]);
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = itrace_tests::KillOnDrop(cmd.spawn().expect("start itrace"));
    let mut stdout = std::io::BufReader::new(child.0.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("the program's first line");
    assert!(line.starts_with("region_loop: started"), "unexpected first line {line:?}");
    // `env` exec'd itrace: its pid is itrace's. The program is running, traced.
    // SAFETY: kill with a pid of our own child and a signal number.
    unsafe { libc::kill(child.0.id() as i32, sig) };
    let (mut rest, mut stderr) = (String::new(), String::new());
    stdout.read_to_string(&mut rest).expect("the program's output");
    child.0.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
    let status = itrace_tests::wait_with_guard(&mut child.0, "itrace record region_loop");
    (rest, stderr, status)
}

/// `nohup itrace record`: a hangup does not stop the recording, as it would not stop the
/// program run untraced; the whole program is traced.
#[test]
fn a_hangup_ignored_by_the_shell_does_not_stop_the_recording() {
    let (rest, stderr, status) = record_region_loop_and_send("inherit-nohup", libc::SIGHUP);
    assert!(status.success(), "itrace failed ({status}):\n{stderr}");
    assert!(rest.contains("region_loop: result="), "the program did not finish:\n{rest}");
    assert!(stderr.contains("tracing ended: the program ended"), "the ignored SIGHUP stopped the recording:\n{stderr}");
}

/// A script's background job gets SIGINT and SIGQUIT ignored from the shell: `kill -INT` of
/// such an itrace still stops the recording (a clean detach; the program runs on to its end
/// untraced), as scripts stop a background recording.
#[test]
fn sigint_stops_the_recording_even_when_the_shell_ignored_it() {
    let (rest, stderr, status) = record_region_loop_and_send("inherit-background-int", libc::SIGINT);
    assert!(status.success(), "itrace failed ({status}):\n{stderr}");
    assert!(rest.contains("region_loop: result="), "the program did not finish after the detach:\n{rest}");
    assert!(stderr.contains("tracing ended: detached"), "SIGINT did not stop the recording:\n{stderr}");
}

/// The nice value in a /proc/PID/stat line: the 19th field, counted from the last `)`.
fn nice_of_stat(stat: &str) -> i32 {
    let after = &stat[stat.rfind(')').expect("stat has the name in parentheses") + 1..];
    after.split_whitespace().nth(16).expect("stat has a nice field").parse().expect("nice is a number")
}

/// A launched program runs at the nice value itrace was started with, not the raised one itrace
/// takes at its start for `-p` (itrace main.rs, supervise.rs): the truth is the value set before
/// the exec, and `cat /proc/self/stat` run without itrace the same way.
#[test]
fn a_launched_program_keeps_the_nice_value_itrace_was_started_with() {
    let cat = require_tool("cat");
    for nice in [0, 7] {
        let started_at = |args: &[&std::ffi::OsStr]| {
            let mut cmd = Command::new(args[0]);
            cmd.args(&args[1..]);
            // SAFETY: setpriority on the child alone, between fork and exec (async-signal-safe).
            unsafe {
                cmd.pre_exec(move || {
                    libc::setpriority(libc::PRIO_PROCESS, 0, nice);
                    Ok(())
                });
            }
            let out = run(&mut cmd);
            out.assert_success();
            out.stdout
        };
        let untraced = started_at(&[cat.as_os_str(), "/proc/self/stat".as_ref()]);
        assert_eq!(nice_of_stat(&untraced), nice, "the untraced cat did not start at nice {nice}");
        for backend in ["translate", "ptrace"] {
            let trace = test_dir(&format!("inherit-nice-{nice}-{backend}")).join("t.itr");
            let itrace = itrace_bin();
            let traced = started_at(&[
                itrace.as_os_str(),
                "record".as_ref(),
                "--backend".as_ref(),
                backend.as_ref(),
                "-o".as_ref(),
                trace.as_os_str(),
                "--".as_ref(),
                cat.as_os_str(),
                "/proc/self/stat".as_ref(),
            ]);
            let line =
                traced.lines().find(|l| l.contains("(cat)")).unwrap_or_else(|| panic!("no stat line in {traced:?}"));
            assert_eq!(
                nice_of_stat(line),
                nice,
                "--backend {backend}: the program ran at another nice value than itrace's"
            );
        }
    }
}
