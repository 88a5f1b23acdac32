//! Running things: where the itrace binary and each test's directory are,
//! the external tools a test needs, commands run under a hang guard with
//! their output captured, `itrace` and `itrace record` invocations, and the
//! child processes a test starts (killed on drop, waited for, probed).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Longest any single external command may run before the test gives up on
/// it. This is a guard against hangs, not a performance assertion: the
/// slowest command (single-stepping long_loop) takes a few seconds.
pub const HANG_GUARD: Duration = Duration::from_secs(300);

/// `target/<profile>` (the directory holding the `itrace` binary), derived
/// from the test executable, which lives in `target/<profile>/deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a parent directory");
    let profile =
        if deps.file_name() == Some(OsStr::new("deps")) { deps.parent().expect("deps has a parent") } else { deps };
    profile.to_path_buf()
}

/// The cargo target directory (`target/`).
pub fn target_dir() -> PathBuf {
    let profile = profile_dir();
    profile.parent().expect("profile dir has a parent").to_path_buf()
}

/// The itrace binary under test: `$ITRACE_BIN` if set, else
/// `target/<profile>/itrace`.
pub fn itrace_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ITRACE_BIN") {
        return PathBuf::from(p);
    }
    let p = profile_dir().join("itrace");
    assert!(
        p.is_file(),
        "itrace binary not found at {} (run `cargo build -p itrace` or `cargo test --workspace`)",
        p.display()
    );
    p
}

/// A fresh directory for one test's files: `target/test-output/<name>`.
/// It is left in place after the test so failures can be inspected.
pub fn test_dir(name: &str) -> PathBuf {
    let d = target_dir().join("test-output").join(name);
    if d.exists() {
        fs::remove_dir_all(&d).unwrap_or_else(|e| panic!("removing {}: {e}", d.display()));
    }
    fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    d.canonicalize().expect("canonicalize test dir")
}

/// Debian package providing each external tool the tests use.
const TOOL_PACKAGES: &[(&str, &str)] = &[
    ("gcc", "gcc"),
    ("make", "make"),
    ("objdump", "binutils"),
    ("nm", "binutils"),
    ("addr2line", "binutils"),
    ("readelf", "binutils"),
    ("objcopy", "binutils"),
    ("strip", "binutils"),
    ("debuginfod", "debuginfod"),
    ("qemu-x86_64", "qemu-user"),
    ("valgrind", "valgrind"),
    ("callgrind_annotate", "valgrind"),
    ("strace", "strace"),
    ("gdb", "gdb"),
    ("setarch", "util-linux"),
    ("env", "coreutils"),
    ("sleep", "coreutils"),
    ("stty", "coreutils"),
    ("seq", "coreutils"),
    ("script", "bsdutils"),
    ("taskset", "util-linux"),
    ("chromium", "chromium"),
];

fn find_in_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path).map(|d| d.join(tool)).find(|p| p.is_file())
}

/// Fails the test with an installation hint when `tool` is missing.
pub fn require_tool(tool: &str) -> PathBuf {
    match find_in_path(tool) {
        Some(p) => p,
        None => {
            let pkg = TOOL_PACKAGES
                .iter()
                .find(|(t, _)| *t == tool)
                .map(|(_, p)| *p)
                .or_else(|| tool.starts_with("qemu-").then_some("qemu-user"))
                .unwrap_or("(unknown package)");
            panic!(
                "required tool `{tool}` is not installed: install the Debian package `{pkg}` \
                 (apt-get install -y {pkg}, or run scripts/install-test-deps.sh)"
            )
        }
    }
}

/// The result of a finished command.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub command: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with the whole output unless the command succeeded.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "command failed ({}): {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            self.command,
            tail(&self.stdout, 4000),
            tail(&self.stderr, 4000)
        );
        self.assert_no_panic();
        self
    }

    /// itrace must never print a Rust panic message.
    pub fn assert_no_panic(&self) -> &Self {
        assert!(
            !self.stderr.contains("panicked at") && !self.stderr.contains("RUST_BACKTRACE"),
            "itrace panicked: {}\n--- stderr ---\n{}",
            self.command,
            tail(&self.stderr, 4000)
        );
        self
    }

    /// The documented error convention: non-zero exit and exactly one line
    /// on stderr, starting with `itrace: `, no panic. Returns that line.
    pub fn assert_clean_error(&self) -> String {
        assert!(
            !self.status.success(),
            "expected a failure, but the command succeeded: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            tail(&self.stdout, 2000),
            tail(&self.stderr, 2000)
        );
        assert!(
            self.status.code().is_some(),
            "itrace was killed by a signal ({}) instead of exiting with an error: {}\n--- stderr ---\n{}",
            self.status,
            self.command,
            tail(&self.stderr, 2000)
        );
        self.assert_no_panic();
        let lines: Vec<&str> = self.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("itrace: "),
            "expected exactly one stderr line starting with `itrace: `, got {} line(s): {}\n--- stderr ---\n{}",
            lines.len(),
            self.command,
            self.stderr
        );
        lines[0].to_string()
    }
}

pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion (stdin closed, stdout and stderr captured),
/// killing it if it outlives [`HANG_GUARD`].
pub fn run(cmd: &mut Command) -> Output {
    let out = run_binary(cmd);
    Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: out.stderr,
        command: out.command,
    }
}

/// The result of a finished command whose standard output is bytes (a program's binary dump).
#[derive(Debug)]
pub struct BinaryOutput {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub command: String,
}

/// [`run`], keeping stdout as it came (not read as UTF-8).
pub fn run_binary(cmd: &mut Command) -> BinaryOutput {
    let command = describe(cmd);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || read_all(out));
    let err_t = std::thread::spawn(move || read_all(err));
    let status = wait_with_guard(&mut child, &command);
    BinaryOutput {
        status,
        stdout: out_t.join().expect("stdout reader"),
        stderr: String::from_utf8_lossy(&err_t.join().expect("stderr reader")).into_owned(),
        command,
    }
}

fn read_all(mut r: impl Read) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = r.read_to_end(&mut v);
    v
}

/// Waits for `child`; kills it (by its pid) after [`HANG_GUARD`].
pub fn wait_with_guard(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hang guard: `{what}` still running after {} s; killed it", HANG_GUARD.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs itrace with `args`.
pub fn itrace<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(Command::new(itrace_bin()).args(args))
}

/// `itrace record -o TRACE OPTIONS -- PROGRAM ARGS`.
pub fn record(trace: &Path, options: &[&str], program: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(itrace_bin());
    cmd.arg("record").arg("-o").arg(trace);
    cmd.args(options);
    cmd.arg("--").arg(program).args(args);
    run(&mut cmd)
}

/// `itrace record -p PID --duration SECONDS -o TRACE`: attaches to a running process.
pub fn record_pid(trace: &Path, pid: u32, duration: &str) -> Output {
    let pid = pid.to_string();
    itrace([
        OsStr::new("record"),
        OsStr::new("-p"),
        OsStr::new(&pid),
        OsStr::new("--duration"),
        OsStr::new(duration),
        OsStr::new("-o"),
        trace.as_os_str(),
    ])
}

/// `itrace record --gdb 127.0.0.1:PORT -o TRACE --gdb-program PROGRAM`: through the GDB stub
/// that listens on `port`.
pub fn record_gdb(trace: &Path, port: u16, program: &Path) -> Output {
    let stub = format!("127.0.0.1:{port}");
    itrace([
        OsStr::new("record"),
        OsStr::new("--gdb"),
        OsStr::new(&stub),
        OsStr::new("-o"),
        trace.as_os_str(),
        OsStr::new("--gdb-program"),
        program.as_os_str(),
    ])
}

/// Kills a child we started (by its pid) when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (up to the hang guard) for `cond`, polling every 20 ms.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "hang guard: gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pid that exists nowhere: pids are always below kernel.pid_max.
pub fn nonexistent_pid() -> u32 {
    let max: u32 =
        fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(4_194_304);
    assert!(!Path::new(&format!("/proc/{max}")).exists());
    max
}

/// Whether a local TCP port is in the LISTEN state (from /proc/net/tcp), without connecting to it
/// (qemu's and gdbserver's stubs take one connection).
pub fn listening(port: u16) -> bool {
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    t.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&format!(":{port:04X}")) && f[3] == "0A"
    })
}

/// A local TCP port that was free a moment ago (bound on 127.0.0.1 and released), for a GDB
/// stub to listen on.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The state letter (R, S, t, Z...) and tracer pid of a process or thread, from /proc (None:
/// it is gone).
pub fn state_and_tracer(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?.chars().next()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:"))?.trim().parse().ok()?;
    Some((state, tracer))
}

/// The threads of process `pid`, each running or asleep (not stopped, not dead) and untraced:
/// how a detach must leave a program. Threads that exit meanwhile are left out.
pub fn live_untraced_threads(pid: u32) -> Result<Vec<u32>, String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| format!("process gone: {e}"))?;
    let mut live = Vec::new();
    for t in tasks.flatten() {
        let tid: u32 = t.file_name().to_string_lossy().parse().unwrap_or(0);
        match state_and_tracer(tid) {
            Some((s, 0)) if s == 'R' || s == 'S' || s == 'D' => live.push(tid),
            None => continue, // exited meanwhile
            other => return Err(format!("thread {tid}: (state, tracer) {other:?}")),
        }
    }
    Ok(live)
}

/// Write an executable script at `path`. The file is written by `install` (a child process),
/// never opened for writing here: a test binary runs its tests on threads, and another test's
/// fork between our open and close would hold a writer of the file until its exec, so that
/// running it failed with "Text file busy" (ETXTBSY).
pub fn write_executable(path: &Path, contents: &str) {
    let source = path.with_extension("source");
    std::fs::write(&source, contents).unwrap_or_else(|e| panic!("write {}: {e}", source.display()));
    let o = run(Command::new("install").arg("-m").arg("755").arg(&source).arg(path));
    assert!(o.success(), "install {}: {}", path.display(), o.stderr);
}

/// The bytes of one thread-state block of the translating recorder (2 MB and 4 KB:
/// docs/translate.md, Limits).
pub const STATE_BLOCK_BYTES: u64 = (2 << 20) + 4096;

/// What of the translating recorder's code cache is mapped in a process, as /proc/PID/maps
/// shows it (docs/translate.md, Limits): its regions, anonymous `r-xp` mappings of 8 MB, and
/// its thread-state blocks, anonymous `rw-p` mappings from 64 GB up (side by side, the kernel
/// shows them as one line: their bytes are counted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheMappings {
    /// The regions' start addresses, in address order.
    pub regions: Vec<u64>,
    /// The bytes of the state blocks' mappings.
    pub state_bytes: u64,
}

impl CacheMappings {
    /// How many state blocks those bytes are.
    pub fn states(&self) -> u64 {
        self.state_bytes / STATE_BLOCK_BYTES
    }
}

/// The code cache mapped in process `pid` (empty when it is gone).
pub fn cache_mappings(pid: u32) -> CacheMappings {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut out = CacheMappings::default();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Anonymous: no path after the inode (0).
        if fields.len() != 5 || fields[4] != "0" {
            continue;
        }
        let Some((start, end)) = fields[0]
            .split_once('-')
            .and_then(|(s, e)| Some((u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?)))
        else {
            continue;
        };
        if fields[1] == "r-xp" && end - start == 8 << 20 {
            out.regions.push(start);
        } else if fields[1] == "rw-p" && (0x10_0000_0000..0x20_0000_0000).contains(&start) {
            out.state_bytes += end - start;
        }
    }
    out
}

/// From the translating recorder's statistics line (ITRACE_STATS=1): the number written before `key`.
pub fn stat_count(what: &str, stderr: &str, key: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("itrace: translate: "))
        .unwrap_or_else(|| panic!("{what}: no statistics line (ITRACE_STATS=1) in itrace's output:\n{stderr}"));
    let at = line.find(key).unwrap_or_else(|| panic!("{what}: no {key:?} in the statistics line: {line}"));
    line[..at]
        .split_whitespace()
        .last()
        .and_then(|w| w.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("{what}: no number before {key:?} in the statistics line: {line}"))
}
