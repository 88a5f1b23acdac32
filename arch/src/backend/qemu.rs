//! `itrace record --backend qemu [--arch ARCH] -- PROG ARGS`: run the program
//! under qemu-user with the itrace TCG plugin (`libitrace_qemu.so`, crate
//! `qemu-plugin/`), which writes the trace file itself; this side finds qemu
//! and the plugin, checks that qemu accepts the plugin, launches, waits, and
//! reports what the plugin wrote.

use super::gdb::{cross_loader_env, cross_sysroot, qemu_binary};
use super::settings::find_program;
use super::{BackendError, RecordSettings, Recorded, Recorder, Target};
use itrace_format::{human_size, Arch, LiveCounts, StepMethod, StopReason};
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

type Result<T, E = BackendError> = std::result::Result<T, E>;

/// File name of the plugin, looked for next to the itrace executable.
const PLUGIN_FILE: &str = "libitrace_qemu.so";
/// Environment variable naming another plugin file.
const PLUGIN_ENV: &str = "ITRACE_QEMU_PLUGIN";
/// Trace streams in the file: guest threads alive at once (vCPU indexes) beyond this are not traced.
const STREAMS: usize = 64;

fn search_path() -> OsString {
    std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into())
}

/// The qemu-user emulator for `arch`, or an error naming the package to install.
fn find_qemu(arch: Arch) -> Result<PathBuf> {
    let name = qemu_binary(arch);
    std::env::split_paths(&search_path()).map(|d| d.join(name)).find(|p| p.is_file()).ok_or_else(|| {
        BackendError::Settings(format!(
            "{name} is not installed (not found in PATH): install the Debian package qemu-user (apt-get install qemu-user)"
        ))
    })
}

/// The plugin: $ITRACE_QEMU_PLUGIN, else next to the itrace executable (cargo puts both in target/PROFILE).
fn find_plugin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(PLUGIN_ENV) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            fail!("{PLUGIN_ENV}={} is not a file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().map_err(|e| BackendError::io("cannot locate the itrace executable", e))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [dir.join(PLUGIN_FILE), dir.join("../lib/itrace").join(PLUGIN_FILE)] {
        if cand.is_file() {
            return Ok(cand);
        }
    }
    fail!(
        "the qemu plugin {PLUGIN_FILE} is not next to itrace in {}: build it with `cargo build -p itrace-qemu-plugin` \
         (same profile as itrace), or name it with {PLUGIN_ENV}=PATH",
        dir.display()
    )
}

/// qemu's option syntax: a comma inside a value is written twice.
fn opt_value(s: &str) -> String {
    s.replace(',', ",,")
}

/// The environment to start qemu-user with so that the program it runs sees ours (with `set`
/// over it) in its order, and the user's own `LD_PRELOAD` if there is one (for `-E`).
///
/// qemu-user gives the program its own environment, each variable put at the front of the
/// list as it reads them: reversed. So qemu gets ours reversed, and the program sees it in
/// order. Left out: QEMU_* variables (qemu-user would take them as its own settings); and
/// qemu's `LD_PRELOAD` is the plugin (see the caller), taken out with `-U`, or replaced by the
/// user's with `-E`, which qemu puts first in the program's environment.
fn qemu_environment(set: &[(OsString, OsString)], plugin: &Path) -> (Vec<OsString>, Option<OsString>) {
    let guest: Vec<OsString> = crate::inherit::inherited_with(set)
        .into_iter()
        .filter(|kv| !kv.as_encoded_bytes().starts_with(b"QEMU_"))
        .collect();
    let mut user_preload = None;
    let mut preload = OsString::from("LD_PRELOAD=");
    preload.push(plugin);
    let mut qemu_env = vec![preload];
    for kv in guest.into_iter().rev() {
        match kv.as_encoded_bytes().strip_prefix(b"LD_PRELOAD=") {
            // The last one is the one a program reads; here, reversed, the first.
            Some(v) => {
                if user_preload.is_none() {
                    user_preload = Some(std::ffi::OsStr::from_bytes(v).to_os_string());
                }
            }
            None => qemu_env.push(kv),
        }
    }
    (qemu_env, user_preload)
}

/// A status file for the plugin to report through (it runs inside qemu, whose stderr is the program's).
struct StatusFile(PathBuf);

impl StatusFile {
    fn new(what: &str) -> Self {
        let p = std::env::temp_dir().join(format!("itrace-qemu-{}-{what}.status", std::process::id()));
        let _ = std::fs::remove_file(&p);
        StatusFile(p)
    }
    fn read(&self) -> String {
        std::fs::read_to_string(&self.0).unwrap_or_default()
    }
}

impl Drop for StatusFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The plugin's live counts: `INSTRUCTIONS BRANCHES` (fixed-width, rewritten in place).
fn parse_live(text: &str) -> Option<(u64, u64)> {
    let mut it = text.split_whitespace();
    let (ins, br) = (it.next()?.parse().ok()?, it.next()?.parse().ok()?);
    Some((ins, br))
}

/// Check that qemu loads the plugin and accepts its API version: the plugin, told `probe=on`,
/// reports and refuses to run, so qemu stops before starting the program.
fn probe(qemu: &Path, plugin: &Path, arch: Arch, program: &Path) -> Result<()> {
    let status = StatusFile::new("probe");
    let spec = format!(
        "{},arch={},probe=on,status={}",
        opt_value(&plugin.to_string_lossy()),
        arch,
        opt_value(&status.0.to_string_lossy())
    );
    let out = Command::new(qemu)
        .arg("-plugin")
        .arg(spec)
        .arg(program)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_clear()
        .output()
        .map_err(|e| BackendError::io(format!("cannot run {}", qemu.display()), e))?;
    let said = status.read();
    if said.lines().any(|l| l.starts_with("ok")) {
        return Ok(());
    }
    let qemu_name = qemu.file_name().unwrap_or_default().to_string_lossy().into_owned();
    if let Some(e) = said.lines().find_map(|l| l.strip_prefix("error ")) {
        fail!("{qemu_name} cannot use the itrace plugin: {e}: install qemu-user 7.2 (Debian 12), whose plugin API itrace is built for");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no message");
    if stderr.contains("plugin") && stderr.contains("version") {
        fail!(
            "{qemu_name} refused the itrace plugin {}: plugin API mismatch ({first}): itrace's plugin needs QEMU's \
             plugin API version 1: install qemu-user 7.2 (Debian 12), or rebuild itrace-qemu-plugin for this qemu",
            plugin.display()
        );
    }
    if stderr.contains("-plugin") || stderr.contains("unknown option") {
        fail!("{qemu_name} was built without TCG plugin support ({first}): install Debian's qemu-user 7.2");
    }
    fail!("{qemu_name} could not load the itrace plugin {} ({first})", plugin.display())
}

/// Totals the plugin reports at the end.
#[derive(Default)]
struct Done {
    records: u64,
    instructions: u64,
    branches: u64,
    lost: u64,
    bytes: u64,
    unwritten: u64,
    stop: u32,
    error: Option<String>,
}

fn parse_done(status: &str) -> Option<Done> {
    let line = status.lines().find_map(|l| l.strip_prefix("done "))?;
    let mut d = Done::default();
    let (fields, error) = match line.split_once(" error=") {
        Some((f, e)) => (f, Some(e.to_string())),
        None => (line, None),
    };
    d.error = error;
    for kv in fields.split_whitespace() {
        let Some((k, v)) = kv.split_once('=') else { continue };
        let v: u64 = v.parse().unwrap_or(0);
        match k {
            "records" => d.records = v,
            "instructions" => d.instructions = v,
            "branches" => d.branches = v,
            "lost" => d.lost = v,
            "bytes" => d.bytes = v,
            "unwritten" => d.unwritten = v,
            "stop" => d.stop = v as u32,
            _ => {}
        }
    }
    Some(d)
}

/// What the trace file holds when qemu ended before the plugin finished it, said only as far
/// as it is true. The empty file created before the launch (so that a path that cannot be
/// written fails early) is no trace: it goes, as when a stop comes before tracing starts.
fn unfinished_trace(output: &Path) -> String {
    let len = std::fs::metadata(output).map(|m| m.len()).unwrap_or(0);
    if len == 0 {
        let _ = std::fs::remove_file(output);
        return "the program never ran under the plugin; no trace was written".into();
    }
    if len <= itrace_format::HEADER_LEN as u64 {
        return format!("{} holds no records", output.display());
    }
    format!("{} holds the trace without its last second and summary", output.display())
}

/// Scripts run through scripts at most this deep (the kernel's BINPRM_MAX_RECURSION).
const MAX_SCRIPT_DEPTH: usize = 4;

/// The `#!` line of a script at `path`, as the kernel's binfmt_script reads it: the
/// interpreter (the first word after `#!`) and the rest of the line, trimmed, as one optional
/// argument. None for a file that does not start with `#!`.
fn shebang(path: &Path) -> Option<(PathBuf, Option<OsString>)> {
    use std::io::Read;
    use std::os::unix::ffi::OsStringExt;
    // The kernel reads this much of the file (BINPRM_BUF_SIZE).
    let mut head = [0u8; 256];
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let line = &line[line.iter().position(|b| !blank(b))?..];
    let end = line.iter().position(blank).unwrap_or(line.len());
    let rest = &line[end..];
    let arg = match (rest.iter().position(|b| !blank(b)), rest.iter().rposition(|b| !blank(b))) {
        (Some(a), Some(z)) => Some(OsString::from_vec(rest[a..=z].to_vec())),
        _ => None,
    };
    Some((PathBuf::from(OsString::from_vec(line[..end].to_vec())), arg))
}

/// `itrace record --backend qemu`: the launched program under qemu-user with itrace's plugin.
pub struct QemuRecorder {
    settings: RecordSettings,
    /// The ELF program qemu runs: the command's, or its script's interpreter.
    program: PathBuf,
    /// For a script: what comes before the command's arguments, as the kernel runs it (the
    /// interpreter's argument from the `#!` line, the script).
    script_args: Vec<OsString>,
    /// The process's name: the command's file name (a script's, not its interpreter's).
    name: String,
    arch: Arch,
}

impl QemuRecorder {
    /// Refuse what the plugin cannot record; find the program and its architecture.
    pub fn new(s: &RecordSettings) -> Result<Self> {
        let refuse = |m: &str| Err(BackendError::Settings(m.to_string()));
        let command =
            match &s.target {
                Target::Launch { command, .. } => command,
                _ => return refuse(
                    "--backend qemu launches the program under qemu-user: it cannot attach to a running process (-p)",
                ),
            };
        if s.region || s.has_triggers() || s.follow_forks {
            return refuse(
                "--backend qemu records the whole program: --region, --start, --stop and --follow-forks are not \
                 supported with it",
            );
        }
        let Some(cmd) = command.first() else { return refuse("nothing to trace: give a command to run") };
        let mut program = find_program(cmd)?;
        let name: String = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // A script runs as the kernel runs it: its interpreter, with the `#!` line's argument
        // and the script before the command's arguments (and so on for an interpreter that is
        // a script itself).
        let mut script_args: Vec<OsString> = Vec::new();
        let mut scripts = Vec::new();
        while crate::elf::arch_of(&program).is_none() && scripts.len() < MAX_SCRIPT_DEPTH {
            let Some((interpreter, arg)) = shebang(&program) else { break };
            if let Err(e) = std::fs::metadata(&interpreter) {
                fail!("{} is a script for {}, which cannot be run: {e}", program.display(), interpreter.display());
            }
            let mut before: Vec<OsString> = arg.into_iter().collect();
            before.push(program.clone().into_os_string());
            before.append(&mut script_args);
            script_args = before;
            scripts.push(format!("{} is a script for {}", program.display(), interpreter.display()));
            program = interpreter;
        }
        let elf_arch = crate::elf::arch_of(&program);
        let what = scripts.join(", ");
        let what_then = if what.is_empty() { String::new() } else { format!("{what}: ") };
        let arch = match (s.arch, elf_arch) {
            (Some(a), Some(e)) if a != e => fail!("{what_then}{} is a {e} program, not {a}", program.display()),
            (Some(a), _) => a,
            (None, Some(e)) => e,
            (None, None) => {
                fail!(
                    "{what_then}{} is not an ELF program itrace can trace: give its architecture with --arch",
                    program.display()
                )
            }
        };
        if !scripts.is_empty() {
            let mut argv = vec![program.clone().into_os_string()];
            argv.extend(script_args.iter().cloned());
            argv.extend(command.iter().skip(1).cloned());
            let argv: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            eprintln!("itrace: {what}: tracing `{}`, as the kernel runs it", argv.join(" "));
        }
        Ok(QemuRecorder { settings: s.clone(), program, script_args, name, arch })
    }
}

impl Recorder for QemuRecorder {
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<Recorded> {
        let s = &self.settings;
        let (arch, program) = (self.arch, &self.program);
        let Target::Launch { command, .. } = &s.target else { unreachable!("checked in new()") };
        let qemu = find_qemu(arch)?;
        let plugin = find_plugin()?;
        probe(&qemu, &plugin, arch, program)?;

        // Fail early (and in one line) when the trace file cannot be created; the plugin rewrites it.
        std::fs::File::create(&s.output)
            .map_err(|e| BackendError::io(format!("cannot create trace file {}", s.output.display()), e))?;
        let out = std::fs::canonicalize(&s.output).unwrap_or_else(|_| s.output.clone());
        let status = StatusFile::new("run");
        let ctl = StatusFile::new("stop");
        let counts = StatusFile::new("live");
        // Where the trace comes from, encoded here (the plugin cannot know itrace's command line).
        let origin = StatusFile::new("origin");
        let mut encoded = Vec::new();
        let record = itrace_format::Record::Mte(super::output::recording_record(itrace_format::now_ns()));
        if record.encode(&mut encoded).is_ok() {
            let _ = std::fs::write(&origin.0, &encoded);
        }
        let name = &self.name;
        let sysroot = cross_sysroot(arch);
        let mut spec = format!(
            "{},out={},status={},ctl={},live={},origin={},arch={arch},mode={},bufsize={},segsize={},mtesize={},streams={STREAMS},name={}",
            opt_value(&plugin.to_string_lossy()),
            opt_value(&out.to_string_lossy()),
            opt_value(&status.0.to_string_lossy()),
            opt_value(&ctl.0.to_string_lossy()),
            opt_value(&counts.0.to_string_lossy()),
            opt_value(&origin.0.to_string_lossy()),
            s.mode,
            s.buffer_size,
            s.segment_size,
            s.mte_size,
            opt_value(name),
        );
        if let Some(level) = s.compress {
            spec.push_str(&format!(",compress={level}"));
        }
        if let Some(root) = &sysroot {
            spec.push_str(&format!(",sysroot={}", opt_value(&root.to_string_lossy())));
        }
        let mut qcmd = Command::new(&qemu);
        if let Some(root) = &sysroot {
            qcmd.arg("-L").arg(root);
            let user_path = s.env.iter().find(|(k, _)| k == "LD_LIBRARY_PATH").and_then(|(_, v)| v.to_str());
            let inherited = std::env::var("LD_LIBRARY_PATH").ok();
            if let Some(e) = cross_loader_env(arch, program, user_path.or(inherited.as_deref())) {
                qcmd.arg("-E").arg(e);
            }
        }
        let (qemu_env, user_preload) = qemu_environment(&s.env, &plugin);
        // The plugin, preloaded into qemu itself, sees the kill() with which qemu-user ends a
        // program a signal kills (no plugin callback tells it), and ends the trace there. The
        // guest must not get it: -U takes it out of the guest's environment, -E gives back a
        // preload of the user's own.
        match user_preload {
            Some(v) => qcmd.arg("-E").arg({
                let mut kv = OsString::from("LD_PRELOAD=");
                kv.push(v);
                kv
            }),
            None => qcmd.arg("-U").arg("LD_PRELOAD"),
        };
        qcmd.arg("-plugin").arg(spec).arg(program).args(&self.script_args).args(command.iter().skip(1));
        let qemu_env = crate::inherit::Environment::from_vars(qemu_env)
            .map_err(|e| BackendError::io(format!("cannot run {}", qemu.display()), std::io::Error::other(e)))?;
        use std::os::unix::process::CommandExt;
        // No death signal: qemu runs the program itself, which must outlive a stop. If itrace
        // goes away, the plugin sees its parent change and ends the trace as a detach.
        // SAFETY: only async-signal-safe calls (sigaction, sigprocmask, a store to the child's
        // `environ`) between fork and exec; qemu_env lives in the closure until the exec.
        unsafe {
            qcmd.pre_exec(move || {
                crate::inherit::restore_signals();
                qemu_env.install_in_child();
                Ok(())
            });
        }
        // A stop asked while itrace was starting: the plugin finds the file before the program's
        // first block (a short program under qemu could end before the first look after it).
        let mut asked: Option<std::time::Instant> = None;
        if stop.load(Ordering::Relaxed) {
            std::fs::File::create(&ctl.0)
                .map_err(|e| BackendError::io(format!("cannot create {}", ctl.0.display()), e))?;
            asked = Some(std::time::Instant::now());
        }
        let mut child = qcmd.spawn().map_err(|e| BackendError::io(format!("cannot run {}", qemu.display()), e))?;
        // The plugin writes the file: the status line shows its size, and the instructions and
        // branches the plugin's writer puts in the live file a few times a second. A stop request
        // (Ctrl-C, SIGTERM, --duration) creates the ctl file: the plugin ends the trace at the
        // program's next block and leaves it running under qemu, untraced.
        let mut told = false;
        // Its end seen at once (a sleep between looks added up to 50 ms to every run).
        let pidfd = crate::procfs::pidfd_open(child.id() as i32);
        let exit = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) => {
                    live.bytes.store(std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0), Ordering::Relaxed);
                    if let Some((ins, br)) = parse_live(&counts.read()) {
                        live.instructions.store(ins, Ordering::Relaxed);
                        live.branches.store(br, Ordering::Relaxed);
                    }
                    if asked.is_none() && stop.load(Ordering::Relaxed) {
                        std::fs::File::create(&ctl.0)
                            .map_err(|e| BackendError::io(format!("cannot create {}", ctl.0.display()), e))?;
                        asked = Some(std::time::Instant::now());
                    }
                    if let Some(t) = asked {
                        if parse_done(&status.read()).is_some() {
                            // The trace is finished; the program runs on (or is ending now).
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            break child.try_wait().ok().flatten();
                        }
                        if !told && t.elapsed() > std::time::Duration::from_secs(2) {
                            eprintln!(
                                "itrace: stopping: the program runs no code (a blocking system call?); the trace \
                                 ends when it runs again"
                            );
                            told = true;
                        }
                    }
                    match &pidfd {
                        Some(fd) => {
                            crate::procfs::pidfd_wait(fd, 50);
                        }
                        None => std::thread::sleep(std::time::Duration::from_millis(50)),
                    }
                }
                Err(e) => return Err(BackendError::io(format!("waiting for {}", qemu.display()), e)),
            }
        };
        let said = status.read();
        let qemu_name = qemu.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let Some(done) = parse_done(&said) else {
            if let Some(e) = said.lines().find_map(|l| l.strip_prefix("error ")) {
                fail!("the itrace plugin failed: {e}");
            }
            use std::os::unix::process::ExitStatusExt;
            let left = unfinished_trace(&s.output);
            if let Some(sig) = exit.and_then(|e| e.signal()) {
                fail!("qemu-user was killed by signal {sig} before the itrace plugin could finish the trace: {left}");
            }
            let exit = exit.map(|e| e.to_string()).unwrap_or_else(|| "still running".into());
            fail!("{qemu_name} ended ({exit}) without the itrace plugin finishing the trace: {left}");
        };
        if let Some(e) = &done.error {
            let disk_full = if e.contains("os error 28") { " (the file system is full)" } else { "" };
            fail!(
                "{e}{disk_full}; tracing stopped. {} ({}) holds what reached it: {} records ({} instructions, {} taken \
                 branches); {} records were not written",
                s.output.display(),
                human_size(done.bytes),
                done.records,
                done.instructions,
                done.branches,
                done.unwritten
            );
        }
        let stop_reason = StopReason::from_code(done.stop).unwrap_or(StopReason::Exited);
        let why = match stop_reason {
            StopReason::Detached if asked.is_some() => {
                Some("stopped on request; the program runs on under qemu-user, untraced")
            }
            StopReason::Detached => Some("the program called exec (qemu-user runs the new program untraced)"),
            _ => None,
        };
        Ok(Recorded {
            records: done.records,
            instructions: done.instructions,
            branches: done.branches,
            lost: done.lost,
            bytes: done.bytes,
            arch,
            step: format!("{} (qemu plugin)", StepMethod::Emulated),
            stop_reason,
            why,
            exit_status: exit.map(super::exit_status),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_plugins_totals() {
        let d = parse_done("started\ndone records=5 instructions=3011 branches=4 lost=0 bytes=999 stop=0\n").unwrap();
        assert_eq!((d.records, d.instructions, d.branches, d.bytes, d.stop), (5, 3011, 4, 999, 0));
        let d = parse_done("done records=1 instructions=2 branches=1 lost=0 bytes=1 stop=4 error=disk full").unwrap();
        assert_eq!(d.error.as_deref(), Some("disk full"));
        assert!(parse_done("started\n").is_none());
        assert_eq!(opt_value("/a,b/c"), "/a,,b/c");
    }
}
