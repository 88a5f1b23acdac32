//! Shared helpers for the end-to-end tests: building the test programs,
//! running itrace, and the independent oracles (qemu-user's execution log,
//! objdump, nm, addr2line, valgrind's callgrind).
//!
//! None of the oracles uses itrace's own code (decoder, symbol tables, trace
//! format): they only use external tools and the documented text formats.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Locations
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------

/// Debian package providing each external tool the tests use.
const TOOL_PACKAGES: &[(&str, &str)] = &[
    ("gcc", "gcc"),
    ("make", "make"),
    ("objdump", "binutils"),
    ("nm", "binutils"),
    ("addr2line", "binutils"),
    ("qemu-x86_64", "qemu-user"),
    ("valgrind", "valgrind"),
    ("strace", "strace"),
    ("env", "coreutils"),
    ("sleep", "coreutils"),
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
            let pkg = TOOL_PACKAGES.iter().find(|(t, _)| *t == tool).map(|(_, p)| *p).unwrap_or("(unknown package)");
            panic!(
                "required tool `{tool}` is not installed: install the Debian package `{pkg}` \
                 (apt-get install -y {pkg}, or run scripts/install-test-deps.sh)"
            )
        }
    }
}

// ---------------------------------------------------------------------------
// Running commands
// ---------------------------------------------------------------------------

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
    let command = describe(cmd);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || read_all(out));
    let err_t = std::thread::spawn(move || read_all(err));
    let status = wait_with_guard(&mut child, &command);
    Output {
        status,
        stdout: out_t.join().expect("stdout reader"),
        stderr: err_t.join().expect("stderr reader"),
        command,
    }
}

fn read_all(mut r: impl Read) -> String {
    let mut v = Vec::new();
    let _ = r.read_to_end(&mut v);
    String::from_utf8_lossy(&v).into_owned()
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

/// `itrace arc TRACE` (to stdout); panics unless it succeeds.
pub fn arc_text(trace: &Path) -> String {
    let out = itrace([OsStr::new("arc"), trace.as_os_str()]);
    out.assert_success();
    out.stdout
}

/// `itrace report TRACE --json`, parsed; panics unless it succeeds.
pub fn report_json(trace: &Path) -> serde_json::Value {
    let out = itrace([OsStr::new("report"), trace.as_os_str(), OsStr::new("--json")]);
    out.assert_success();
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("report --json is not valid JSON ({e}):\n{}", tail(&out.stdout, 2000)))
}

/// Self instructions per function name from a report, summed over all the
/// entries (processes, threads) whose module is `module`.
pub fn report_self_counts(report: &serde_json::Value, module: &Path) -> HashMap<String, u64> {
    let module = module.to_string_lossy();
    let mut m = HashMap::new();
    for f in report["functions"].as_array().expect("report: `functions` array") {
        if f["module"].as_str() == Some(&*module) {
            let name = f["name"].as_str().expect("function name").to_string();
            *m.entry(name).or_insert(0) += f["self"].as_u64().expect("function self");
        }
    }
    m
}

/// `calls` per function name of `module`, summed like [`report_self_counts`].
pub fn report_calls(report: &serde_json::Value, module: &Path) -> HashMap<String, u64> {
    let module = module.to_string_lossy();
    let mut m = HashMap::new();
    for f in report["functions"].as_array().expect("report: `functions` array") {
        if f["module"].as_str() == Some(&*module) {
            let name = f["name"].as_str().expect("function name").to_string();
            *m.entry(name).or_insert(0) += f["calls"].as_u64().expect("function calls");
        }
    }
    m
}

// ---------------------------------------------------------------------------
// Test programs
// ---------------------------------------------------------------------------

/// Freestanding (no libc) programs.
pub const FREESTANDING: &[&str] = &["count_loop", "branches", "long_loop"];

/// Hand counts (see the comments in the .S files).
pub const COUNT_LOOP_INSTRUCTIONS: u64 = 3011;
/// Taken branches of count_loop including the exit syscall (= U blocks).
pub const COUNT_LOOP_BLOCKS: usize = 1003;
pub const LONG_LOOP_INSTRUCTIONS: u64 = 406_009;
pub const LONG_LOOP_BLOCKS: usize = 201_501;

/// fib.c: fib_asm(15) self count and calls (closed form, see fib.c).
pub const FIB_ASM_SELF: u64 = 4 * 987 + 14 * 986;
pub const FIB_CALLS: u64 = 2 * 987 - 1;

static PROGRAMS: OnceLock<PathBuf> = OnceLock::new();

/// Builds the test programs (once per test binary, serialised between test
/// binaries with a lock file) into `target/test-programs/` and returns that
/// directory, canonicalised.
pub fn programs_dir() -> &'static Path {
    PROGRAMS.get_or_init(|| {
        require_tool("make");
        require_tool("gcc");
        let out = target_dir().join("test-programs");
        fs::create_dir_all(&out).expect("create test-programs dir");
        let out = out.canonicalize().expect("canonicalize");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs");
        let lock = fs::File::create(out.join(".build.lock")).expect("lock file");
        let _guard = FileLock::new(&lock);
        // The region programs link target/<profile>/libitrace.so (cargo build --workspace makes it).
        let libdir = profile_dir();
        assert!(
            libdir.join("libitrace.so").is_file(),
            "{} is missing: run `cargo build --workspace` first (scripts/test.sh does)",
            libdir.join("libitrace.so").display()
        );
        let o = run(Command::new("make")
            .arg("-C")
            .arg(&src)
            .arg(format!("OUT={}", out.display()))
            .arg(format!("LIBDIR={}", libdir.display())));
        assert!(o.success(), "building the test programs failed:\n{}\n{}", o.stdout, o.stderr);
        out
    })
}

/// The canonical absolute path of a test program.
pub fn program(name: &str) -> PathBuf {
    let p = programs_dir().join(name);
    assert!(p.is_file(), "test program {} missing", p.display());
    p
}

struct FileLock<'a>(&'a fs::File);

impl<'a> FileLock<'a> {
    fn new(f: &'a fs::File) -> Self {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a valid open descriptor.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock failed");
        FileLock(f)
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

// ---------------------------------------------------------------------------
// objdump: instruction boundaries and mnemonics
// ---------------------------------------------------------------------------

/// One instruction as objdump disassembles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insn {
    pub len: u64,
    /// The opcode mnemonic without prefixes (`call`, `jne`, `movsb`, `ret`).
    pub mnemonic: String,
    /// A `rep`/`repz`/`repnz` prefix is present.
    pub rep: bool,
    /// objdump's full text (`rep movsb %ds:(%rsi),%es:(%rdi)`).
    pub text: String,
}

/// How an instruction transfers control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    Call,
    Return,
    /// Unconditional jump (direct or indirect).
    Jump,
    /// Conditional jump (`jcc`, `loop*`, `jrcxz`): taken iff next != pc+len.
    CondJump,
    /// `syscall`, `sysenter`, `int`: a transition to the kernel.
    Syscall,
}

const PREFIXES: &[&str] = &[
    "rep", "repz", "repe", "repnz", "repne", "lock", "notrack", "bnd", "data16", "data32", "addr32", "cs", "ds", "es",
    "fs", "gs", "ss", "rex", "rex.w", "xacquire", "xrelease",
];

impl Insn {
    /// A string instruction with a rep prefix: qemu logs it once per
    /// iteration; it is one instruction.
    pub fn is_rep_string(&self) -> bool {
        if !self.rep {
            return false;
        }
        let m = self.mnemonic.as_str();
        ["movs", "stos", "lods", "cmps", "scas", "ins", "outs"].iter().any(|base| {
            m.strip_prefix(base).is_some_and(|sfx| sfx.is_empty() || matches!(sfx, "b" | "w" | "l" | "d" | "q"))
        })
    }

    pub fn flow(&self) -> Flow {
        let m = self.mnemonic.as_str();
        match m {
            "call" | "callq" | "lcall" => Flow::Call,
            "ret" | "retq" | "lret" | "lretq" | "retf" => Flow::Return,
            "jmp" | "jmpq" | "ljmp" => Flow::Jump,
            "syscall" | "sysenter" | "int" | "int3" | "into" | "int1" => Flow::Syscall,
            "loop" | "loope" | "loopz" | "loopne" | "loopnz" | "jrcxz" | "jecxz" | "jcxz" => Flow::CondJump,
            _ if m.starts_with('j') => Flow::CondJump,
            _ => Flow::Next,
        }
    }
}

/// Disassembles every executable section of `binary` with `objdump -d -w`
/// and returns pc -> instruction.
pub fn objdump_insns(binary: &Path) -> BTreeMap<u64, Insn> {
    require_tool("objdump");
    let o = run(Command::new("objdump").arg("-d").arg("-w").arg(binary));
    o.assert_success();
    parse_objdump(&o.stdout)
}

/// Parses `objdump -d -w` output.
pub fn parse_objdump(text: &str) -> BTreeMap<u64, Insn> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        // "  401000:\tb9 e8 03 00 00       \tmov    $0x3e8,%ecx"
        let Some((addr, rest)) = line.split_once(":\t") else {
            continue;
        };
        let addr = addr.trim();
        if addr.is_empty() || !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let pc = u64::from_str_radix(addr, 16).expect("hex address");
        let (bytes, text) = match rest.split_once('\t') {
            Some((b, t)) => (b, t.trim()),
            None => (rest, ""),
        };
        let len = bytes.split_whitespace().count() as u64;
        if len == 0 {
            continue;
        }
        if text.is_empty() {
            // continuation line of a long instruction (not produced with -w,
            // handled anyway): belongs to the previous instruction
            if let Some((_, last)) = m.iter_mut().next_back() {
                let last: &mut Insn = last;
                last.len += len;
            }
            continue;
        }
        let text = text.split('#').next().unwrap_or("").trim().to_string();
        let mut rep = false;
        let mut mnemonic = String::new();
        for tok in text.split_whitespace() {
            if PREFIXES.contains(&tok) {
                rep |= tok.starts_with("rep");
                continue;
            }
            mnemonic = tok.to_string();
            break;
        }
        m.insert(pc, Insn { len, mnemonic, rep, text });
    }
    m
}

// ---------------------------------------------------------------------------
// qemu-user: the executed pc sequence
// ---------------------------------------------------------------------------

/// Runs `env -i qemu-x86_64 -singlestep -d nochain,exec -D LOG binary args`
/// and returns the guest pc of every `Trace` line: one line per executed
/// instruction, except that a `rep` string instruction is logged once per
/// iteration (see [`oracle_branches`]). The program must exit 0.
pub fn qemu_exec_pcs(binary: &Path, args: &[&str]) -> Vec<u64> {
    qemu_exec_pcs_status(binary, args, true)
}

/// Like [`qemu_exec_pcs`]; `expect_success` = false accepts any exit.
pub fn qemu_exec_pcs_status(binary: &Path, args: &[&str], expect_success: bool) -> Vec<u64> {
    let qemu = require_tool("qemu-x86_64");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("qemu.log");
    let o = run(Command::new("env")
        .arg("-i")
        .arg(qemu)
        .args(["-singlestep", "-d", "nochain,exec", "-D"])
        .arg(&log)
        .arg(binary)
        .args(args));
    if expect_success {
        o.assert_success();
    }
    let f = fs::File::open(&log).unwrap_or_else(|e| panic!("qemu log {}: {e}", log.display()));
    let pcs = parse_qemu_log(BufReader::new(f));
    assert!(!pcs.is_empty(), "qemu logged no instructions for {}", binary.display());
    pcs
}

/// Parses qemu 7.2's `-d exec` log. A line looks like
/// `Trace 0: 0x7fcaf4a00100 [0000000000000000/0000000000401000/1040c0b3/00000201] `
/// (cpu index, host address of the translated block, then
/// cs_base/pc/flags/cflags); the second bracketed field is the guest pc.
pub fn parse_qemu_log(r: impl BufRead) -> Vec<u64> {
    let mut pcs = Vec::new();
    for line in r.lines() {
        let line = line.expect("read qemu log");
        let Some(rest) = line.strip_prefix("Trace ") else {
            continue;
        };
        let Some(open) = rest.find('[') else {
            panic!("unexpected qemu log line: {line}");
        };
        let inner = &rest[open + 1..];
        let inner = &inner[..inner.find(']').expect("closing ]")];
        let pc = inner.split('/').nth(1).unwrap_or_else(|| panic!("unexpected qemu log line: {line}"));
        pcs.push(u64::from_str_radix(pc, 16).expect("hex pc"));
    }
    pcs
}

// ---------------------------------------------------------------------------
// The branch oracle
// ---------------------------------------------------------------------------

/// Kind of a block's last instruction, as in the arc's field 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BranchKind {
    /// A system call (`U` line of type 0, INTRPT).
    Intrpt,
    Call,
    Return,
    /// Any jump, conditional or not.
    Jump,
    /// A non-branch instruction after which control went elsewhere (or the
    /// end of the trace after a non-branch instruction).
    Other,
}

impl BranchKind {
    pub fn type_code(self) -> u8 {
        match self {
            BranchKind::Intrpt => 0,
            BranchKind::Call => 1,
            BranchKind::Return => 2,
            BranchKind::Jump => 3,
            BranchKind::Other => 5,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            BranchKind::Intrpt => "INTRPT",
            BranchKind::Call => "CALL",
            BranchKind::Return => "RETURN",
            BranchKind::Jump => "JUMP",
            BranchKind::Other => "OTHER",
        }
    }
}

/// One taken branch (end of a block) found in an executed pc sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OracleBranch {
    /// pc of the branch instruction (the block's last instruction).
    pub from: u64,
    /// pc executed next; 0 when the trace ends here.
    pub to: u64,
    pub kind: BranchKind,
    /// First instruction of the block (the previous branch's target).
    pub start: u64,
    /// Instructions in the block, including the branch; a rep string
    /// instruction counts once.
    pub count: u64,
}

/// Splits an executed pc sequence into blocks. A block ends at a taken
/// branch: wherever the next pc is not pc + length, and at every
/// unconditional control transfer (call, jmp, ret, syscall) even when its
/// target is the next instruction. A system call ends a block of kind
/// [`BranchKind::Intrpt`] (itrace writes it as a `U` INTRPT line followed
/// by a `K` IRET line). Consecutive repetitions of the pc of a rep string
/// instruction are iterations of one instruction. The last instruction of
/// the sequence ends the last block (`to` = 0).
pub fn oracle_branches(pcs: &[u64], insns: &BTreeMap<u64, Insn>) -> Vec<OracleBranch> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut start = match pcs.first() {
        Some(&p) => p,
        None => return out,
    };
    let mut count = 0u64;
    while i < pcs.len() {
        let pc = pcs[i];
        let insn = insns
            .get(&pc)
            .unwrap_or_else(|| panic!("pc {pc:#x} (step {i}) is not an instruction start in objdump's output"));
        let mut j = i + 1;
        if insn.is_rep_string() {
            while j < pcs.len() && pcs[j] == pc {
                j += 1;
            }
        }
        count += 1;
        let next = pcs.get(j).copied();
        let flow = insn.flow();
        let fallthrough = pc + insn.len;
        let kind = match flow {
            Flow::Call => Some(BranchKind::Call),
            Flow::Return => Some(BranchKind::Return),
            Flow::Jump => Some(BranchKind::Jump),
            Flow::Syscall => Some(BranchKind::Intrpt),
            Flow::CondJump => match next {
                Some(n) if n == fallthrough => None,
                _ => Some(BranchKind::Jump),
            },
            Flow::Next => match next {
                Some(n) if n == fallthrough => None,
                _ => Some(BranchKind::Other),
            },
        };
        if let Some(kind) = kind {
            out.push(OracleBranch { from: pc, to: next.unwrap_or(0), kind, start, count });
            count = 0;
            if let Some(n) = next {
                start = n;
            }
        }
        i = j;
    }
    out
}

/// Number of executed instructions (rep string iterations collapsed).
pub fn oracle_instruction_count(pcs: &[u64], insns: &BTreeMap<u64, Insn>) -> u64 {
    let mut n = 0;
    let mut i = 0;
    while i < pcs.len() {
        let pc = pcs[i];
        let mut j = i + 1;
        if insns.get(&pc).is_some_and(Insn::is_rep_string) {
            while j < pcs.len() && pcs[j] == pc {
                j += 1;
            }
        }
        n += 1;
        i = j;
    }
    n
}

// ---------------------------------------------------------------------------
// nm and addr2line
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub addr: u64,
    pub size: u64,
    /// nm's type letter (`T`, `t`, `W`, ...).
    pub kind: char,
}

/// Code symbols of `binary` from `nm -S --defined-only`, sorted by address,
/// and its sections from `objdump -h`.
pub struct Symbols {
    pub syms: Vec<Symbol>,
    /// (name, start, end) of every section.
    pub sections: Vec<(String, u64, u64)>,
}

impl Symbols {
    pub fn of(binary: &Path) -> Symbols {
        require_tool("nm");
        require_tool("objdump");
        let o = run(Command::new("nm").arg("-S").arg("--defined-only").arg(binary));
        o.assert_success();
        let mut s = Symbols::parse(&o.stdout);
        let h = run(Command::new("objdump").arg("-h").arg("-w").arg(binary));
        h.assert_success();
        s.sections = parse_sections(&h.stdout);
        s
    }

    /// Parses nm output (no section information: zero-size symbols then
    /// extend to the next symbol).
    pub fn parse(text: &str) -> Symbols {
        let mut v = Vec::new();
        for line in text.lines() {
            let t: Vec<&str> = line.split_whitespace().collect();
            let (addr, size, kind, name) = match t.len() {
                4 => (t[0], Some(t[1]), t[2], t[3]),
                3 => (t[0], None, t[1], t[2]),
                _ => continue,
            };
            let kind = kind.chars().next().unwrap_or('?');
            if !matches!(kind, 'T' | 't' | 'W' | 'w' | 'i') {
                continue;
            }
            v.push(Symbol {
                name: name.to_string(),
                addr: u64::from_str_radix(addr, 16).expect("nm address"),
                size: size.map_or(0, |s| u64::from_str_radix(s, 16).expect("nm size")),
                kind,
            });
        }
        v.sort_by_key(|s| (s.addr, s.kind.is_ascii_lowercase()));
        Symbols { syms: v, sections: Vec::new() }
    }

    pub fn by_name(&self, name: &str) -> Option<&Symbol> {
        self.syms.iter().find(|s| s.name == name)
    }

    fn section_of(&self, addr: u64) -> Option<&(String, u64, u64)> {
        self.sections.iter().find(|(_, lo, hi)| *lo <= addr && addr < *hi)
    }

    /// The symbol covering `addr`, and the offset: a symbol with a size
    /// covers [addr, addr+size); one without (crt code such as `_init`,
    /// `frame_dummy`) covers up to the next symbol, within its section.
    pub fn lookup(&self, addr: u64) -> Option<(&Symbol, u64)> {
        if let Some(s) = self
            .syms
            .iter()
            .filter(|s| s.addr <= addr && addr < s.addr + s.size)
            .min_by_key(|s| (s.kind.is_ascii_lowercase(), s.size))
        {
            return Some((s, addr - s.addr));
        }
        let s = self.syms.iter().rev().find(|s| s.addr <= addr)?;
        if s.size != 0 {
            return None; // after the end of a sized symbol
        }
        if !self.sections.is_empty() && self.section_of(s.addr) != self.section_of(addr) {
            return None;
        }
        Some((s, addr - s.addr))
    }

    /// `symbol+0xoff` (or `<unknown>`), as used in comparisons.
    pub fn describe(&self, addr: u64) -> String {
        match self.lookup(addr) {
            Some((s, off)) => format!("{}+{off:#x}", s.name),
            None => "<unknown>".to_string(),
        }
    }
}

/// Parses `objdump -h -w`: (name, start, end) of each section.
pub fn parse_sections(text: &str) -> Vec<(String, u64, u64)> {
    let mut v = Vec::new();
    for line in text.lines() {
        // "  0 .interp  0000001c  0000000000000318  0000000000000318  00000318  2**0  CONTENTS, ..."
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 6 || t[0].parse::<u32>().is_err() {
            continue;
        }
        let (Ok(size), Ok(vma)) = (u64::from_str_radix(t[2], 16), u64::from_str_radix(t[3], 16)) else {
            continue;
        };
        v.push((t[1].to_string(), vma, vma + size));
    }
    v
}

/// Source line of each address from `addr2line -e binary`; 0 when unknown.
pub fn addr2line_lines(binary: &Path, addrs: &[u64]) -> Vec<u64> {
    require_tool("addr2line");
    if addrs.is_empty() {
        return Vec::new();
    }
    let mut cmd = Command::new("addr2line");
    cmd.arg("-e").arg(binary);
    for a in addrs {
        cmd.arg(format!("{a:#x}"));
    }
    let o = run(&mut cmd);
    o.assert_success();
    let lines: Vec<u64> = o
        .stdout
        .lines()
        .map(|l| {
            // "file.c:12", "file.c:12 (discriminator 3)", "??:0", "??:?"
            let loc = l.split(" (").next().unwrap_or(l);
            let n = loc.rsplit(':').next().unwrap_or("0");
            n.trim().parse().unwrap_or(0)
        })
        .collect();
    assert_eq!(lines.len(), addrs.len(), "addr2line output:\n{}", o.stdout);
    lines
}

// ---------------------------------------------------------------------------
// ELF header
// ---------------------------------------------------------------------------

/// (e_type, e_entry) of a 64-bit little-endian ELF file.
pub fn elf_type_entry(binary: &Path) -> (u16, u64) {
    let b = fs::read(binary).expect("read ELF");
    assert!(b.len() >= 64 && &b[..4] == b"\x7fELF", "not an ELF file");
    assert_eq!(b[4], 2, "not ELF64");
    let e_type = u16::from_le_bytes([b[16], b[17]]);
    let e_entry = u64::from_le_bytes(b[24..32].try_into().unwrap());
    (e_type, e_entry)
}

/// Self instruction counts per function of `binary` from a qemu pc sequence
/// of a run of `binary` (rep iterations collapsed). Works for static and for
/// position-independent executables: the load bias is found by locating
/// the entry point's first instructions in the sequence.
pub fn qemu_self_counts(binary: &Path, pcs: &[u64]) -> HashMap<String, u64> {
    let insns = objdump_insns(binary);
    let syms = Symbols::of(binary);
    let (e_type, entry) = elf_type_entry(binary);
    let bias = if e_type == 3 { find_load_bias(pcs, &insns, entry) } else { 0 };
    let mut counts = HashMap::new();
    let mut i = 0;
    while i < pcs.len() {
        let pc = pcs[i].wrapping_sub(bias);
        let mut j = i + 1;
        if let Some(insn) = insns.get(&pc) {
            if insn.is_rep_string() {
                while j < pcs.len() && pcs[j] == pcs[i] {
                    j += 1;
                }
            }
            if let Some((s, _)) = syms.lookup(pc) {
                *counts.entry(s.name.clone()).or_insert(0) += 1;
            }
        }
        i = j;
    }
    counts
}

fn find_load_bias(pcs: &[u64], insns: &BTreeMap<u64, Insn>, entry: u64) -> u64 {
    // the straight-line start of _start: its first instructions in order
    let mut seq = vec![entry];
    while seq.len() < 6 {
        let last = *seq.last().unwrap();
        match insns.get(&last) {
            Some(i) if i.flow() == Flow::Next => seq.push(last + i.len),
            _ => break,
        }
    }
    for (k, &p) in pcs.iter().enumerate() {
        let bias = p.wrapping_sub(entry);
        if bias % 4096 != 0 {
            continue;
        }
        if seq.iter().enumerate().all(|(n, &a)| pcs.get(k + n) == Some(&a.wrapping_add(bias))) {
            return bias;
        }
    }
    panic!("could not find the entry point {entry:#x} in the qemu trace");
}

// ---------------------------------------------------------------------------
// callgrind
// ---------------------------------------------------------------------------

/// Self Ir per (object, function) from one or more callgrind output files.
#[derive(Debug, Default, Clone)]
pub struct CallgrindProfile {
    pub by_object: HashMap<(String, String), u64>,
    /// Sum of all costs of all files (checked against each file's
    /// `totals:` line).
    pub summary: u64,
}

impl CallgrindProfile {
    /// Self Ir per function name, over all objects.
    pub fn self_counts(&self) -> HashMap<String, u64> {
        let mut m = HashMap::new();
        for ((_, f), v) in &self.by_object {
            *m.entry(f.clone()).or_insert(0) += v;
        }
        m
    }

    /// Self Ir per function name of one object (the path as valgrind saw it).
    pub fn self_counts_in(&self, object: &Path) -> HashMap<String, u64> {
        let object = object.to_string_lossy();
        let mut m = HashMap::new();
        for ((o, f), v) in &self.by_object {
            if *o == *object {
                *m.entry(f.clone()).or_insert(0) += v;
            }
        }
        m
    }
}

/// Runs `valgrind --tool=callgrind --collect-jumps=yes --skip-plt=no` on
/// `binary args`
/// (following exec'd children when `trace_children`; forked children are
/// always followed) and returns its self Ir per function name, summed over
/// every output file (every process).
pub fn callgrind_self_counts(binary: &Path, args: &[&str], trace_children: bool) -> HashMap<String, u64> {
    callgrind_profile(binary, args, trace_children).self_counts()
}

/// Like [`callgrind_self_counts`], keeping the objects apart.
pub fn callgrind_profile(binary: &Path, args: &[&str], trace_children: bool) -> CallgrindProfile {
    let valgrind = require_tool("valgrind");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(valgrind);
    cmd.args([
        "-q",
        "--tool=callgrind",
        "--collect-jumps=yes",
        "--separate-recs=1",
        // the default (yes) charges PLT stubs to their caller; itrace
        // (and qemu with nm) charge them to no function of the program
        "--skip-plt=no",
    ])
    .arg(format!("--trace-children={}", if trace_children { "yes" } else { "no" }))
    .arg(format!("--callgrind-out-file={}/callgrind.out.%p", dir.path().display()))
    .arg(binary)
    .args(args);
    let o = run(&mut cmd);
    o.assert_success();
    let mut profile = CallgrindProfile::default();
    let mut files: Vec<PathBuf> =
        fs::read_dir(dir.path()).expect("read callgrind dir").map(|e| e.expect("dir entry").path()).collect();
    files.sort();
    assert!(!files.is_empty(), "callgrind wrote no output file");
    for f in files {
        let text = fs::read_to_string(&f).expect("read callgrind output");
        parse_callgrind_into(&text, &mut profile).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
    profile
}

/// Parses one callgrind output file (format version 1, with name
/// compression `(id) name`, relative positions, `calls=` lines whose
/// following cost line is an inclusive call cost, and `jump=`/`jcnd=`
/// lines) and adds its self Ir to `profile`. Recursion suffixes (`'2`) are
/// folded into the function name. Checks that the self costs add up to the
/// file's `totals:`.
pub fn parse_callgrind_into(text: &str, profile: &mut CallgrindProfile) -> Result<(), String> {
    let mut positions = 1usize;
    let mut ir_index: Option<usize> = None;
    let mut names: HashMap<(&'static str, String), String> = HashMap::new();
    let mut ob = String::from("???");
    let mut func: Option<String> = None;
    let mut skip_next_cost = false;
    let mut file_total = 0u64;
    let mut summary: Option<u64> = None;
    let mut totals: Option<u64> = None;

    let resolve = |names: &mut HashMap<(&'static str, String), String>, ns: &'static str, v: &str| -> String {
        let v = v.trim();
        if let Some(rest) = v.strip_prefix('(') {
            let close = rest.find(')').unwrap_or(rest.len());
            let id = rest[..close].to_string();
            let name = rest[(close + 1).min(rest.len())..].trim();
            if name.is_empty() {
                names.get(&(ns, id.clone())).cloned().unwrap_or_else(|| format!("<undefined id {id}>"))
            } else {
                names.insert((ns, id), name.to_string());
                name.to_string()
            }
        } else {
            v.to_string()
        }
    };

    for (lineno, line) in text.lines().enumerate() {
        let lineno = lineno + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let first = line.as_bytes()[0];
        if first.is_ascii_digit() || first == b'+' || first == b'-' || first == b'*' {
            if skip_next_cost {
                skip_next_cost = false;
                continue;
            }
            let toks: Vec<&str> = line.split_whitespace().collect();
            let Some(ir) = ir_index else {
                return Err(format!("line {lineno}: cost line before `events:`"));
            };
            let v = match toks.get(positions + ir) {
                Some(t) => t.parse::<u64>().map_err(|e| format!("line {lineno}: bad cost {t:?}: {e}"))?,
                None => 0,
            };
            let Some(f) = &func else {
                return Err(format!("line {lineno}: cost line outside a function"));
            };
            *profile.by_object.entry((ob.clone(), f.clone())).or_insert(0) += v;
            file_total += v;
            continue;
        }
        let Some((key, value)) = line.split_once(['=', ':']) else {
            continue;
        };
        match key {
            "positions" => positions = value.split_whitespace().count(),
            "events" => {
                ir_index = value.split_whitespace().position(|e| e == "Ir");
                if ir_index.is_none() {
                    return Err("no Ir event".into());
                }
            }
            "summary" => summary = value.trim().parse().ok(),
            "totals" => totals = value.trim().parse().ok(),
            "ob" => ob = resolve(&mut names, "ob", value),
            "cob" => {
                resolve(&mut names, "ob", value);
            }
            "fl" | "fi" | "fe" | "cfi" | "cfl" => {
                resolve(&mut names, "fl", value);
            }
            "fn" => {
                let name = resolve(&mut names, "fn", value);
                func = Some(strip_recursion_suffix(&name).to_string());
            }
            "cfn" => {
                resolve(&mut names, "fn", value);
            }
            "calls" => skip_next_cost = true,
            _ => {}
        }
    }
    // `totals:` is the sum of all cost lines; `summary:` can be smaller
    // (callgrind 3.19 leaves out some costs of signal handlers there).
    if let Some(t) = totals.or(summary) {
        if t != file_total {
            return Err(format!("self costs add up to {file_total}, the file's totals say {t}"));
        }
    }
    profile.summary += file_total;
    Ok(())
}

fn strip_recursion_suffix(name: &str) -> &str {
    if let Some(q) = name.rfind('\'') {
        if q + 1 < name.len() && name[q + 1..].bytes().all(|b| b.is_ascii_digit()) {
            return &name[..q];
        }
    }
    name
}

// ---------------------------------------------------------------------------
// Arc files
// ---------------------------------------------------------------------------

/// One block line of an arc file (docs/arc-and-report.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArcLine {
    pub cpu: u32,
    /// Field 2 is `K`.
    pub kernel: bool,
    pub type_code: u8,
    pub count: u64,
    /// Field 5 (`@`).
    pub marker: String,
    pub offset: u64,
    pub symbol: String,
    pub module: String,
    pub pid: u64,
    pub tid: u64,
    /// `pidname_threadname` as written (names may contain `_`).
    pub names: String,
    /// Process name; see [`split_names`] for how the ambiguity is resolved.
    pub pname: String,
    pub tname: String,
    pub type_str: String,
    pub line: u64,
    /// Line number in the arc text (1-based).
    pub lineno: usize,
}

impl ArcLine {
    /// `symbol+0xoff`.
    pub fn location(&self) -> String {
        format!("{}+{:#x}", self.symbol, self.offset)
    }
}

/// Splits `pidname_threadname` when the two names are equal (`a_b_a_b`)
/// or contain no `_`; otherwise splits at the first `_`.
pub fn split_names(names: &str) -> (String, String) {
    let n = names.len();
    if n % 2 == 1 {
        let mid = n / 2;
        if names.as_bytes()[mid] == b'_' && names[..mid] == names[mid + 1..] {
            return (names[..mid].to_string(), names[mid + 1..].to_string());
        }
    }
    match names.split_once('_') {
        Some((p, t)) => (p.to_string(), t.to_string()),
        None => (names.to_string(), String::new()),
    }
}

/// Parses the block lines of an arc file, skipping `#` comments and blank
/// lines. Fields 1-6 are taken from the left, 8-10 from the right, and
/// field 7 (which may contain spaces) is split at its last `:`.
pub fn parse_arc(text: &str) -> Result<Vec<ArcLine>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let mut l = parse_arc_line(raw).map_err(|e| format!("arc line {lineno}: {e}: {raw:?}"))?;
        l.lineno = lineno;
        out.push(l);
    }
    Ok(out)
}

fn parse_arc_line(raw: &str) -> Result<ArcLine, String> {
    // token spans
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in raw.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                spans.push((s, i));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        spans.push((s, raw.len()));
    }
    if spans.len() < 10 {
        return Err(format!("{} fields, expected 10", spans.len()));
    }
    let tok = |k: usize| &raw[spans[k].0..spans[k].1];
    let n = spans.len();
    let num = |s: &str, what: &str| s.parse::<u64>().map_err(|e| format!("{what} {s:?}: {e}"));
    let cpu = num(tok(0), "cpu")? as u32;
    let kernel = match tok(1) {
        "K" => true,
        "U" => false,
        o => return Err(format!("field 2 is {o:?}, not K or U")),
    };
    let type_code = num(tok(2), "type")? as u8;
    let count = num(tok(3), "count")?;
    let marker = tok(4).to_string();
    let offset = u64::from_str_radix(tok(5), 16).map_err(|e| format!("offset {:?}: {e}", tok(5)))?;
    let f7 = &raw[spans[6].0..spans[n - 4].1];
    let (symbol, module) = f7.rsplit_once(':').ok_or_else(|| format!("field 7 {f7:?} has no ':'"))?;
    let f8 = tok(n - 3);
    let mut parts = f8.splitn(3, '_');
    let pid = parts.next().unwrap_or("");
    let tid = parts.next().ok_or("field 8 has no tid")?;
    let names = parts.next().ok_or("field 8 has no names")?.to_string();
    let pid = u64::from_str_radix(pid, 16).map_err(|e| format!("pid {pid:?}: {e}"))?;
    let tid = u64::from_str_radix(tid, 16).map_err(|e| format!("tid {tid:?}: {e}"))?;
    let (pname, tname) = split_names(&names);
    let type_str = tok(n - 2).to_string();
    let line = num(tok(n - 1), "line")?;
    Ok(ArcLine {
        cpu,
        kernel,
        type_code,
        count,
        marker,
        offset,
        symbol: symbol.to_string(),
        module: module.to_string(),
        pid,
        tid,
        names,
        pname,
        tname,
        type_str,
        line,
        lineno: 0,
    })
}

/// Parses an arc, panicking with the error.
pub fn arc_lines(text: &str) -> Vec<ArcLine> {
    parse_arc(text).unwrap_or_else(|e| panic!("{e}"))
}

/// The comment lines (`#`) that come after the last block line.
pub fn trailing_comments(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    for l in text.lines() {
        let t = l.trim();
        if t.is_empty() {
            continue;
        }
        if t.starts_with('#') {
            v.push(t.to_string());
        } else {
            v.clear();
        }
    }
    v
}

/// Basic consistency of every line: field 9 matches field 3, `@` marker,
/// `K` lines are in `[kernel]`.
pub fn check_arc_consistency(lines: &[ArcLine]) {
    const NAMES: [&str; 8] = ["INTRPT", "CALL", "RETURN", "JUMP", "IRET", "OTHER", "UNDEFD", "ALLOC"];
    for l in lines {
        assert!(
            (l.type_code as usize) < NAMES.len() && NAMES[l.type_code as usize] == l.type_str,
            "arc line {}: type {} does not match {}",
            l.lineno,
            l.type_code,
            l.type_str
        );
        assert_eq!(l.marker, "@", "arc line {}: field 5", l.lineno);
        if l.kernel {
            assert_eq!(l.module, "[kernel]", "arc line {}: K line module", l.lineno);
        }
    }
}

// ---------------------------------------------------------------------------
// Comparing an arc with the oracle
// ---------------------------------------------------------------------------

/// What one arc line must look like, from the oracle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// A `U` block line.
    User { location: String, count: u64, type_code: u8 },
    /// The `K` IRET line after a system call that returned (count 0,
    /// `sys_NAME` or `signal_NAME` in `[kernel]`).
    Kernel,
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expected::User { location, count, type_code } => write!(f, "U {type_code} {count:>5} {location}"),
            Expected::Kernel => write!(f, "K 4     0 sys_*/signal_*"),
        }
    }
}

fn show_line(l: &ArcLine) -> String {
    if l.kernel {
        format!("K {} {:>5} {}", l.type_code, l.count, l.symbol)
    } else {
        format!("U {} {:>5} {}", l.type_code, l.count, l.location())
    }
}

fn matches(l: &ArcLine, e: &Expected, module: &str) -> bool {
    match e {
        Expected::User { location, count, type_code } => {
            !l.kernel
                && l.type_code == *type_code
                && l.count == *count
                && l.location() == *location
                && l.module == module
        }
        Expected::Kernel => {
            l.kernel
                && l.type_code == 4
                && l.count == 0
                && (l.symbol.starts_with("sys_") || l.symbol.starts_with("signal_"))
        }
    }
}

/// The arc lines the oracle predicts for a program whose code is all in
/// `syms`. The `K` line after the final system call (exit) is not
/// predicted: tracing ends inside it.
pub fn expected_lines(branches: &[OracleBranch], syms: &Symbols) -> Vec<Expected> {
    let mut v = Vec::new();
    for b in branches {
        v.push(Expected::User { location: syms.describe(b.start), count: b.count, type_code: b.kind.type_code() });
        if b.kind == BranchKind::Intrpt && b.to != 0 {
            v.push(Expected::Kernel);
        }
    }
    v
}

/// Drops a final `K` line that follows a final `U` INTRPT line (the exit
/// system call; whether it gets a `K` line is up to the tracer).
pub fn without_exit_kernel_line(lines: &[ArcLine]) -> &[ArcLine] {
    let n = lines.len();
    if n >= 2 && lines[n - 1].kernel && !lines[n - 2].kernel && lines[n - 2].type_code == 0 {
        &lines[..n - 1]
    } else {
        lines
    }
}

/// Compares `arc` line by line with `expected`, reporting the first
/// difference with context.
pub fn compare_lines(arc: &[ArcLine], expected: &[Expected], module: &str) -> Result<(), String> {
    let n = arc.len().min(expected.len());
    for i in 0..n {
        if !matches(&arc[i], &expected[i], module) {
            return Err(format!(
                "first difference at block {i} (arc line {}):\n{}",
                arc[i].lineno,
                context(arc, expected, i)
            ));
        }
    }
    if arc.len() != expected.len() {
        return Err(format!(
            "arc has {} block lines, oracle {}:\n{}",
            arc.len(),
            expected.len(),
            context(arc, expected, n)
        ));
    }
    Ok(())
}

fn context(arc: &[ArcLine], expected: &[Expected], at: usize) -> String {
    let mut s = String::from("    idx  | arc                                      | oracle\n");
    let lo = at.saturating_sub(5);
    let hi = (at + 5).min(arc.len().max(expected.len()));
    for i in lo..hi {
        let a = arc.get(i).map(show_line).unwrap_or_else(|| "-".into());
        let e = expected.get(i).map(|e| e.to_string()).unwrap_or_else(|| "-".into());
        let mark = if i == at { ">>" } else { "  " };
        s.push_str(&format!("{mark} {i:>6} | {a:<40} | {e}\n"));
    }
    s
}

/// Everything the oracle knows about one run of a freestanding program.
pub struct Oracle {
    pub pcs: Vec<u64>,
    pub insns: BTreeMap<u64, Insn>,
    pub branches: Vec<OracleBranch>,
    pub instructions: u64,
    pub syms: Symbols,
    pub expected: Vec<Expected>,
}

impl Oracle {
    pub fn of(binary: &Path, args: &[&str]) -> Oracle {
        let pcs = qemu_exec_pcs(binary, args);
        let insns = objdump_insns(binary);
        let branches = oracle_branches(&pcs, &insns);
        let instructions = oracle_instruction_count(&pcs, &insns);
        let syms = Symbols::of(binary);
        let expected = expected_lines(&branches, &syms);
        Oracle { pcs, insns, branches, instructions, syms, expected }
    }
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

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
