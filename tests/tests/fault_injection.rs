//! Fault injection: `itrace record` is sent SIGINT, SIGTERM, SIGHUP, SIGQUIT or SIGKILL at a random
//! moment (a third of the runs within the first 10 ms) while it is attached to a program or
//! has launched one, on the ptrace stepper and on ptrace regions. Each run checks what a user
//! would: the program's output and exit status are those of an untraced run (a launched
//! program killed with itrace by SIGKILL is the one allowed exception: that is what killing
//! itrace means for it), its CPU affinity is what it was, no itrace process is left (running,
//! stopped or traced), and the trace file, if any, reads.
//!
//! `ITRACE_FAULT_RUNS` sets the runs per scenario and signal (default 3: about a minute);
//! `ITRACE_FAULT_SEED` replays a run's random delays. The table at the end is the measurement
//! the closing notes quote; `bench/fault-campaign.sh` runs it at 100 per cell.

use itrace_tests::{itrace_bin, program, run, test_dir};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A way of tracing, and the program it traces.
struct Scenario {
    name: &'static str,
    options: &'static [&'static str],
    attach: bool,
    program: &'static str,
    args: [&'static str; 2],
}

const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "ptrace -p",
        options: &["--backend", "ptrace"],
        attach: true,
        program: "spinner",
        args: ["40", "10000"],
    },
    Scenario {
        name: "ptrace launch",
        options: &["--backend", "ptrace"],
        attach: false,
        program: "spinner",
        args: ["40", "10000"],
    },
    Scenario {
        name: "region -p",
        options: &["--backend", "ptrace", "--region"],
        attach: true,
        program: "region_loop",
        args: ["60", "10000"],
    },
    Scenario {
        name: "region launch",
        options: &["--backend", "ptrace", "--region"],
        attach: false,
        program: "region_loop",
        args: ["60", "10000"],
    },
];

const SIGNALS: [(i32, &str); 5] = [
    (libc::SIGINT, "INT"),
    (libc::SIGTERM, "TERM"),
    (libc::SIGHUP, "HUP"),
    (libc::SIGQUIT, "QUIT"),
    (libc::SIGKILL, "KILL"),
];

/// Longest a run may take before the test calls it a hang.
const GUARD: Duration = Duration::from_secs(60);

#[derive(Default, Clone, Copy)]
struct Cell {
    runs: u32,
    harmed: u32,
    leftovers: u32,
    unreadable: u32,
    not_started: u32,
}

#[test]
fn signals_to_itrace_never_harm_the_program() {
    let runs: u32 = std::env::var("ITRACE_FAULT_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let seed: u64 = std::env::var("ITRACE_FAULT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    eprintln!("fault injection: {runs} runs per cell, ITRACE_FAULT_SEED={seed}");
    let mut rng = XorShift(seed | 1);
    // Orphans (a launched program after a detach, a recorder whose supervisor was killed) come
    // to this process, so their exit status can be read.
    // SAFETY: prctl with integer arguments.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }, 0, "PR_SET_CHILD_SUBREAPER failed");
    let dir = test_dir("fault-injection");
    let mut table = vec![[Cell::default(); SIGNALS.len()]; SCENARIOS.len()];
    let mut failures = Vec::new();
    for (si, sc) in SCENARIOS.iter().enumerate() {
        let want = expected_result(sc);
        for n in 0..runs {
            for (gi, &(sig, sig_name)) in SIGNALS.iter().enumerate() {
                let delay = if rng.next() % 3 == 0 {
                    Duration::from_micros(rng.next() % 10_000)
                } else {
                    Duration::from_micros(10_000 + rng.next() % 590_000)
                };
                let tag = format!("{}-{sig_name}-{n}", sc.name.replace([' ', '-'], ""));
                let outcome = one_run(sc, sig, delay, &dir.join(&tag), &want);
                let cell = &mut table[si][gi];
                cell.runs += 1;
                cell.not_started += outcome.not_started as u32;
                for (problem, count) in [
                    (&outcome.harm, &mut cell.harmed),
                    (&outcome.leftover, &mut cell.leftovers),
                    (&outcome.unreadable, &mut cell.unreadable),
                ] {
                    if let Some(p) = problem {
                        *count += 1;
                        failures.push(format!("{} SIG{sig_name} after {delay:?}: {p}", sc.name));
                    }
                }
            }
        }
    }
    print_table(&table);
    assert!(failures.is_empty(), "{} failed runs (seed {seed}):\n{}", failures.len(), failures.join("\n"));
}

/// What one run showed; `None` is good.
#[derive(Default)]
struct Outcome {
    harm: Option<String>,
    leftover: Option<String>,
    unreadable: Option<String>,
    not_started: bool,
}

fn one_run(sc: &Scenario, sig: i32, delay: Duration, base: &Path, want: &str) -> Outcome {
    fs::create_dir_all(base).expect("run dir");
    let tag = format!("fault-run-{}", base.display());
    let trace = base.join("t.itr");
    let out_path = base.join("out");
    let err_path = base.join("err");
    let mut o = Outcome::default();
    let mut cmd = Command::new(itrace_bin());
    cmd.arg("record").arg("-o").arg(&trace).args(sc.options);
    cmd.stdin(Stdio::null()).stderr(fs::File::create(&err_path).expect("err file"));
    // The attached program, and its affinity before itrace came.
    let mut attached: Option<(Child, BufReader<std::process::ChildStdout>, String)> = None;
    if sc.attach {
        let mut child = Command::new(program(sc.program))
            .args(sc.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the program");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        out.read_line(&mut first).expect("started line");
        let affinity = cpus_allowed(child.id() as i32).expect("affinity of the program");
        cmd.arg("-p").arg(child.id().to_string()).stdout(Stdio::null());
        attached = Some((child, out, affinity));
    } else {
        // The run's tag as an extra (ignored) argument finds the program in /proc, even one
        // killed before it printed its pid.
        cmd.arg("--").arg(program(sc.program)).args(sc.args).arg(&tag);
        cmd.stdout(fs::File::create(&out_path).expect("out file"));
    }
    // Children of ours that are not this run's: whatever is new after the run is this run's.
    let before = our_children();
    let mut itrace = cmd.spawn().expect("start itrace");
    std::thread::sleep(delay);
    // SAFETY: kill with our own child's pid.
    unsafe { libc::kill(itrace.id() as i32, sig) };
    let deadline = Instant::now() + GUARD;
    let itrace_status = loop {
        if let Some(st) = itrace.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = itrace.kill();
            o.leftover = Some(format!("itrace still running {GUARD:?} after the signal"));
            break itrace.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // No itrace process may stay: the recording process finishes its detach and exits.
    let marker = trace.to_string_lossy().into_owned();
    let settle = Instant::now() + Duration::from_secs(20);
    loop {
        let left = itrace_processes(&marker);
        if left.is_empty() {
            break;
        }
        if Instant::now() > settle {
            o.leftover = Some(format!("itrace processes left: {left:?}"));
            for (pid, _) in &left {
                // SAFETY: kill of a leftover process of this test.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    let last_err = stderr.lines().last().unwrap_or("").to_string();
    if let Some((mut child, mut out, affinity)) = attached {
        let pid = child.id() as i32;
        if let Some(now) = cpus_allowed(pid) {
            if now != affinity {
                o.harm = Some(format!("affinity {now} after itrace, {affinity} before"));
            }
        }
        let status = wait_guarded(pid).unwrap_or_else(|| {
            let _ = child.kill();
            "hung".into()
        });
        let _ = child.try_wait();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        if status != "exit 0" || !rest.contains(want) {
            o.harm = Some(format!("program {status}, output {rest:?} (want {want:?}); itrace: {last_err}"));
        }
    } else {
        // Once itrace is gone the program, running or a zombie, is our child (we are a
        // subreaper); not finding it means itrace waited for its end, or it never started.
        let found = launched_program(&before, &mut o);
        let text = fs::read_to_string(&out_path).unwrap_or_default();
        let status = match found {
            None if !text.contains("started pid=") => {
                o.not_started = true;
                None
            }
            None => Some("reaped by itrace".to_string()),
            Some(pid) => {
                let affinity = cpus_allowed(pid);
                let status = wait_guarded(pid).unwrap_or_else(|| "hung".into());
                let ours = cpus_allowed(std::process::id() as i32).unwrap_or_default();
                // A program being killed with itrace may still be pinned as it dies.
                match affinity {
                    Some(now) if now != ours && status != "killed by signal 9" => {
                        o.harm = Some(format!("launched program's affinity {now}, itrace's caller has {ours}"));
                    }
                    _ => {}
                }
                Some(status)
            }
        };
        if let Some(status) = status {
            let text = fs::read_to_string(&out_path).unwrap_or_default();
            let finished = text.contains(want);
            let fine = match status.as_str() {
                "exit 0" => finished,
                "reaped by itrace" => finished || sig == libc::SIGKILL,
                "killed by signal 9" => sig == libc::SIGKILL,
                _ => false,
            };
            if !fine {
                o.harm = Some(format!(
                    "launched program {status}, output {:?} (want {want:?}); itrace {itrace_status}: {last_err}",
                    text.lines().last().unwrap_or("")
                ));
            }
        }
    }
    if trace.exists() && fs::metadata(&trace).map(|m| m.len()).unwrap_or(0) > 0 {
        let r = run(Command::new(itrace_bin()).arg("report").arg("-i").arg(&trace));
        if !r.success() || r.stderr.contains("panicked") {
            o.unreadable = Some(format!("itrace report: {}", r.stderr.trim()));
        }
    }
    o
}

/// The launched program, once every itrace process of the run is gone: the one new child of
/// ours (we are a subreaper) that is not an itrace process. A child still named itrace may be
/// the program in the middle of its exec: wait for it to become one or the other.
fn launched_program(before: &[i32], o: &mut Outcome) -> Option<i32> {
    let settle = Instant::now() + Duration::from_secs(20);
    loop {
        let mut program = None;
        let mut undecided = Vec::new();
        for pid in our_children().into_iter().filter(|p| !before.contains(p)) {
            match (comm(pid).starts_with("itrace"), state(pid).as_str()) {
                (true, "Z") => {
                    let mut st = 0;
                    // SAFETY: reaping our own zombie child; WNOHANG never blocks.
                    unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
                }
                (true, st) => undecided.push((pid, st.to_string())),
                (false, _) => program = Some(pid),
            }
        }
        if undecided.is_empty() {
            return program;
        }
        if Instant::now() > settle {
            o.leftover = Some(format!("itrace processes left: {undecided:?}"));
            return program;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The result line of an untraced run without the sleeps (the result depends only on the rounds).
fn expected_result(sc: &Scenario) -> String {
    let o = run(Command::new(program(sc.program)).args([sc.args[0], "0"]));
    assert!(o.success(), "untraced {} failed: {}", sc.program, o.stderr);
    o.stdout.lines().find(|l| l.contains("result=")).expect("a result line").to_string()
}

/// Wait for a process that is, or will become, our child (we are a subreaper): its end as
/// "exit N" / "killed by signal N", "reaped by itrace" if it is not ours to wait for (itrace
/// waited for it), or None after the guard.
fn wait_guarded(pid: i32) -> Option<String> {
    let deadline = Instant::now() + GUARD;
    loop {
        let mut status = 0;
        // SAFETY: status is a valid int; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(if libc::WIFEXITED(status) {
                format!("exit {}", libc::WEXITSTATUS(status))
            } else {
                format!("killed by signal {}", libc::WTERMSIG(status))
            });
        }
        if r == -1 {
            // Not our child: itrace reaped it, or it is still a child of a live itrace process.
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return Some("reaped by itrace".into());
            }
        }
        if Instant::now() > deadline {
            // SAFETY: kill of a process this test started (directly or through itrace).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `Cpus_allowed_list` of a live, not yet reaped process.
fn cpus_allowed(pid: i32) -> Option<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    if status.lines().any(|l| l.starts_with("State:") && l.contains("zombie")) {
        return None;
    }
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|s| s.trim().to_string())
}

/// itrace processes (any name) of the run whose trace is `marker`, running or stopped; the
/// itrace zombies that came to us (a recorder whose supervisor died) are reaped here.
fn itrace_processes(marker: &str) -> Vec<(i32, String)> {
    for pid in our_children() {
        if comm(pid).starts_with("itrace") && state(pid) == "Z" {
            let mut st = 0;
            // SAFETY: reaping our own zombie child; WNOHANG never blocks.
            unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
        }
    }
    processes_with(marker).into_iter().filter(|(pid, st)| comm(*pid).starts_with("itrace") && st != "Z").collect()
}

/// This process's children, orphans adopted included.
fn our_children() -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(tasks) = fs::read_dir("/proc/self/task") else { return pids };
    for t in tasks.flatten() {
        let text = fs::read_to_string(t.path().join("children")).unwrap_or_default();
        pids.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    pids
}

fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

/// The one-letter state of a process (`R`, `S`, `t`, `Z`...).
fn state(pid: i32) -> String {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(") ").next().and_then(|s| s.split(' ').next()).unwrap_or("?").to_string()
}

/// Processes whose command line mentions `marker`, and their state (`R`, `S`, `t`, `Z`...).
fn processes_with(marker: &str) -> Vec<(i32, String)> {
    let mut left = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else { return left };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(marker) {
            continue;
        }
        left.push((pid, state(pid)));
    }
    left
}

fn print_table(table: &[[Cell; SIGNALS.len()]]) {
    eprintln!("\n| scenario | signal | runs | harmed | itrace left | trace unreadable | stopped before start |");
    eprintln!("|---|---|---|---|---|---|---|");
    for (sc, row) in SCENARIOS.iter().zip(table) {
        for ((_, name), c) in SIGNALS.iter().zip(row) {
            eprintln!(
                "| {} | {name} | {} | {} | {} | {} | {} |",
                sc.name, c.runs, c.harmed, c.leftovers, c.unreadable, c.not_started
            );
        }
    }
}

/// xorshift64: the random delays, repeatable from the printed seed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
