//! kill -9 of an itrace attached with `--backend translate` never harms the program (issues 28
//! and 29): the recorder, the whole process group, or both, at random moments from the
//! takeover on. The target (tests/programs/xl_kill.c) has busy threads calling through
//! function pointers (the code cache's indirect lookups), sleeping between rounds (system
//! calls, stepped by the engine), and a thread blocked in `read` the whole time. After each
//! kill it must be let go (no tracer) and finish with the output and exit status of its run
//! without itrace, which is the truth.
//!
//! Before the fix a thread stopped for itrace at one of the cache's `int3`s, or stepped through
//! a system call (trap flag set), died of SIGTRAP when the recorder was killed.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use itrace_tests::{cache_mappings, itrace_bin, program, run, test_dir, wait_with_guard, CacheMappings, KillOnDrop};

const THREADS: &str = "3";
const ROUNDS: &str = "20000";
/// Between rounds while stdin is open: the busy threads spend much of their time in nanosleep.
const SLEEP_US: &str = "500";
const RUNS: u64 = 30;

/// Which processes get the SIGKILL.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// The recording process alone (the supervisor reports it and exits).
    Recorder,
    /// `kill -9 -- -PGID` of itrace's group: the supervisor (the recorder has its own group and
    /// detaches when its parent dies).
    Group,
    /// Both at once: nothing of itrace is left.
    Everything,
}

/// The recording process: the supervisor's child (None while it is not forked yet).
fn recorder_of(supervisor: u32) -> Option<i32> {
    let kids = std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).ok()?;
    kids.split_whitespace().next()?.parse().ok()
}

/// Every thread of `pid` has no tracer (None: the process is gone).
fn untraced(pid: u32) -> Option<bool> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut all = true;
    for t in tasks.flatten() {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).map(str::trim);
        all &= tracer == Some("0");
    }
    Some(all)
}

/// Whether the translator has moved a thread of `pid` into its code cache: a thread-state
/// block is mapped (anonymous, `rw-p`, from 64 GB up: docs/translate.md, Limits).
fn taken_over(pid: u32) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines().any(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        let start = fields.first().and_then(|r| r.split('-').next()).and_then(|s| u64::from_str_radix(s, 16).ok());
        let anonymous = fields.len() == 5;
        start.is_some_and(|s| (0x10_0000_0000..0x20_0000_0000).contains(&s))
            && fields.get(1) == Some(&"rw-p")
            && anonymous
    })
}

/// xl_kill running (THREADS threads, `rounds` rounds), its start line read.
struct XlKill {
    child: KillOnDrop,
    pid: u32,
    stdin: std::process::ChildStdin,
    out: BufReader<std::process::ChildStdout>,
}

fn start_xl_kill(target: &std::path::Path, rounds: &str) -> XlKill {
    let mut child = KillOnDrop(
        Command::new(target)
            .args([THREADS, rounds, SLEEP_US])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start xl_kill"),
    );
    let pid = child.0.id();
    let stdin = child.0.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.0.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("read the start line");
    assert_eq!(first.trim_end(), format!("xl_kill: started pid={pid}"));
    XlKill { child, pid, stdin, out }
}

impl XlKill {
    /// End of its input: the reader returns, the busy threads stop sleeping and finish; it must
    /// exit 0 with `want`, its untraced output.
    fn ends_with(self, what: &str, want: &[&str]) {
        let XlKill { mut child, stdin, mut out, .. } = self;
        drop(stdin);
        let mut rest = String::new();
        out.read_to_string(&mut rest).expect("read xl_kill's output");
        let status = wait_with_guard(&mut child.0, "xl_kill");
        assert!(status.success(), "{what}: xl_kill ended with {status}; output:\n{rest}");
        assert_eq!(rest.lines().collect::<Vec<_>>(), want, "{what}: xl_kill's output");
    }
}

/// A small xorshift generator: the moments of the kills, reproducible from the seed printed.
struct Moments(u64);

impl Moments {
    fn next_below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn kill_9_of_an_attached_translating_itrace_never_harms_the_program() {
    use std::os::unix::process::CommandExt;
    let target = program("xl_kill");
    let dir = test_dir("translate-kill9");
    // The truth: the program untraced, stdin at its end (no sleeps).
    let reference = run(Command::new(&target).args([THREADS, ROUNDS, "0"]).stdin(Stdio::null()));
    assert!(reference.success(), "xl_kill untraced failed: {}", reference.stderr);
    let want: Vec<&str> = reference.stdout.lines().skip(1).collect();
    assert_eq!(want.len(), 3, "untraced output:\n{}", reference.stdout);

    let seed = std::env::var("ITRACE_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    }) | 1;
    let mut moments = Moments(seed);
    for round in 0..RUNS {
        let kill = [Kill::Recorder, Kill::Group, Kill::Everything][(round % 3) as usize];
        // Even runs: 0 to 400 ms after the recorder exists (the attach, the takeover, running in
        // the cache). Odd runs: 0 to 300 ms after the first thread is in the cache.
        let after_takeover = round % 2 == 1;
        let delay_ms = moments.next_below(if after_takeover { 300 } else { 400 });
        let since = if after_takeover { "a thread entered the cache" } else { "the recorder started" };
        let what = format!("run {round} ({kill:?} killed {delay_ms} ms after {since}; ITRACE_KILL_SEED={seed})");

        let xl = start_xl_kill(&target, ROUNDS);
        let pid = xl.pid;

        let trace = dir.join(format!("t{round}.itr"));
        let mut rec = Command::new(itrace_bin())
            .args(["record", "--backend", "translate", "-p", &pid.to_string(), "-o"])
            .arg(&trace)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0) // its own group, as `setsid itrace ...`
            .spawn()
            .expect("start itrace");
        let supervisor = rec.id();
        let deadline = Instant::now() + Duration::from_secs(60);
        let recorder = loop {
            if let Some(r) = recorder_of(supervisor) {
                break r;
            }
            assert!(Instant::now() < deadline, "{what}: no recording process after 60 s");
            std::thread::sleep(Duration::from_millis(1));
        };
        while after_takeover && !taken_over(pid) {
            assert!(Instant::now() < deadline, "{what}: no thread in the code cache 60 s after the start");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        // SAFETY: plain kill(2) of processes we started (the group our child leads, its child).
        unsafe {
            if matches!(kill, Kill::Group | Kill::Everything) {
                assert_eq!(libc::kill(-(supervisor as i32), libc::SIGKILL), 0, "{what}: kill -9 of the group");
            }
            if matches!(kill, Kill::Recorder | Kill::Everything) {
                libc::kill(recorder, libc::SIGKILL);
            }
        }
        wait_with_guard(&mut rec, "itrace");
        // Bounded (the hang guard), not timed: after a kill of the group the recorder detaches
        // when it sees its parent gone; after a kill of the recorder the kernel lets go at once.
        loop {
            match untraced(pid) {
                None => break, // gone: the wait below says how
                Some(true) => break,
                Some(false) => assert!(Instant::now() < deadline, "{what}: xl_kill still traced 60 s after the kill"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        xl.ends_with(&what, &want);
        let _ = std::fs::remove_file(&trace);
    }
}

/// An attach reuses the code cache a clean detach left (issue 29), but never what a killed
/// itrace left: its threads may still run in it, or return into it from a signal frame. So:
/// attach `xl_kill` and detach cleanly (its cache stays mapped); attach again and kill -9 the
/// whole of itrace once threads record in the cache (that session reused the first one's);
/// attach a third time: it must map a new cache, leaving the old one where it was (the
/// regions and state blocks in /proc/PID/maps, counted); a fourth attach after the third's
/// clean detach maps nothing more. The program ends with its untraced output.
#[test]
fn an_attach_after_a_kill_maps_a_new_code_cache_and_leaves_the_old_one_alone() {
    use std::os::unix::process::CommandExt;
    // Rounds enough to outlast the four attaches with the sleeps; with stdin closed they run
    // on without sleeping.
    const LONG_ROUNDS: &str = "200000";
    let target = program("xl_kill");
    let dir = test_dir("translate-kill9-reuse");
    let reference = run(Command::new(&target).args([THREADS, LONG_ROUNDS, "0"]).stdin(Stdio::null()));
    assert!(reference.success(), "xl_kill untraced failed: {}", reference.stderr);
    let want: Vec<&str> = reference.stdout.lines().skip(1).collect();

    let xl = start_xl_kill(&target, LONG_ROUNDS);
    let pid = xl.pid;

    let clean_attach = |name: &str, duration: &str| -> CacheMappings {
        let rec = run(Command::new(itrace_bin())
            .args(["record", "--backend", "translate", "-p", &pid.to_string(), "--duration", duration, "-o"])
            .arg(dir.join(format!("{name}.itr"))));
        assert!(rec.success(), "{name}: itrace failed: {}", rec.stderr.trim());
        let left = cache_mappings(pid);
        assert!(!left.regions.is_empty() && left.states() > 0, "{name}: no code cache left: {left:?}\n{}", rec.stderr);
        left
    };
    let first_left = clean_attach("first", "1");

    // The second attach, killed (everything of itrace) once its threads record in the cache:
    // the trace file holds 256 KB (the branch records threads in the cache write, 1.4 MB/s
    // here; the module records and the few steps of the takeover are far less: the file's
    // first growth, at itrace's first flush, was once all there was before the threads
    // entered the cache, and that session had reused nothing yet).
    let trace = dir.join("killed.itr");
    let mut rec = Command::new(itrace_bin())
        .args(["record", "--backend", "translate", "-p", &pid.to_string(), "-o"])
        .arg(&trace)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start itrace");
    let supervisor = rec.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let size = || std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
    while size() < 256 << 10 {
        assert!(Instant::now() < deadline, "the second itrace wrote less than 256 KB in 60 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    let recorder = recorder_of(supervisor).expect("the recording process");
    // The recorder first: killed alone, the supervisor makes it detach cleanly.
    // SAFETY: plain kill(2) of processes we started (our child's child, the group it leads).
    unsafe {
        assert_eq!(libc::kill(recorder, libc::SIGKILL), 0, "kill -9 of the recorder");
        assert_eq!(libc::kill(-(supervisor as i32), libc::SIGKILL), 0, "kill -9 of the group");
    }
    wait_with_guard(&mut rec, "itrace");
    while untraced(pid) == Some(false) {
        assert!(Instant::now() < deadline, "xl_kill still traced 60 s after the kill");
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed_left = cache_mappings(pid);
    assert!(
        first_left.regions.iter().all(|r| killed_left.regions.contains(r)),
        "the first cache's regions went: {first_left:?} then {killed_left:?}"
    );

    // The third attach must map a cache of its own. One in which no thread reached the cache
    // (a loaded machine, 1 s) maps nothing at all, and is tried again; one that says it took
    // an earlier attach's cache took the killed one's (the only one left).
    let mut third_left = killed_left.clone();
    for attempt in 0..4 {
        let rec = run(Command::new(itrace_bin())
            .args(["record", "--backend", "translate", "-p", &pid.to_string(), "--duration", "1", "-o"])
            .arg(dir.join(format!("third-{attempt}.itr"))));
        assert!(rec.success(), "third attach: itrace failed: {}", rec.stderr.trim());
        assert!(
            !rec.stderr.contains("were an earlier attach's"),
            "after the kill, the next attach reused a cache: {}",
            rec.stderr.trim()
        );
        third_left = cache_mappings(pid);
        if third_left != killed_left {
            break;
        }
    }
    let new_regions: Vec<&u64> = third_left.regions.iter().filter(|r| !killed_left.regions.contains(r)).collect();
    assert!(
        !new_regions.is_empty() && killed_left.regions.iter().all(|r| third_left.regions.contains(r)),
        "after the kill, the next attach did not map a region of its own beside the killed one's: {killed_left:?} then {third_left:?}"
    );
    assert!(
        third_left.state_bytes > killed_left.state_bytes,
        "after the kill, the next attach mapped no state block of its own: {killed_left:?} then {third_left:?}"
    );
    let fourth_left = clean_attach("fourth", "0.5");
    assert_eq!(fourth_left, third_left, "an attach after a clean detach mapped more code cache");

    xl.ends_with("after four attaches", &want);
}
