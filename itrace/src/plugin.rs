//! `itrace record --backend qemu [--arch ARCH] -- PROG ARGS`: run the program
//! under qemu-user with the itrace TCG plugin (`libitrace_qemu.so`, crate
//! `qemu-plugin/`), which writes the trace file itself; this side finds qemu
//! and the plugin, checks that qemu accepts the plugin, launches, waits, and
//! reports what the plugin wrote.

use crate::cli::RecordArgs;
use crate::size::human_size;
use crate::status::{Source, StatusLine};
use crate::summary::{self, ProgramEnd, RecordSummary};
use anyhow::{anyhow, bail, Context, Result};
use itrace_arch::gdb::{cross_sysroot, qemu_binary};
use itrace_format::{Arch, StepMethod, StopReason};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// File name of the plugin, looked for next to the itrace executable.
const PLUGIN_FILE: &str = "libitrace_qemu.so";
/// Environment variable naming another plugin file.
const PLUGIN_ENV: &str = "ITRACE_QEMU_PLUGIN";
/// Trace streams in the file: guest threads alive at once (vCPU indexes) beyond this are not traced.
const STREAMS: usize = 64;

fn search_path() -> OsString {
    std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into())
}

/// A program path as given (with a slash) or found along $PATH.
fn find_program(cmd: &Path) -> Result<PathBuf> {
    if cmd.as_os_str().as_encoded_bytes().contains(&b'/') {
        return if cmd.is_file() { Ok(cmd.to_path_buf()) } else { bail!("cannot run {}: no such file", cmd.display()) };
    }
    std::env::split_paths(&search_path())
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("cannot run {}: command not found in PATH", cmd.display()))
}

/// The qemu-user emulator for `arch`, or an error naming the package to install.
fn find_qemu(arch: Arch) -> Result<PathBuf> {
    let name = qemu_binary(arch);
    std::env::split_paths(&search_path()).map(|d| d.join(name)).find(|p| p.is_file()).ok_or_else(|| {
        anyhow!("{name} is not installed (not found in PATH): install the Debian package qemu-user (apt-get install qemu-user)")
    })
}

/// The plugin: $ITRACE_QEMU_PLUGIN, else next to the itrace executable (cargo puts both in target/PROFILE).
fn find_plugin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(PLUGIN_ENV) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("{PLUGIN_ENV}={} is not a file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot locate the itrace executable")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for cand in [dir.join(PLUGIN_FILE), dir.join("../lib/itrace").join(PLUGIN_FILE)] {
        if cand.is_file() {
            return Ok(cand);
        }
    }
    bail!(
        "the qemu plugin {PLUGIN_FILE} is not next to itrace in {}: build it with `cargo build -p itrace-qemu-plugin` \
         (same profile as itrace), or name it with {PLUGIN_ENV}=PATH",
        dir.display()
    )
}

/// qemu's option syntax: a comma inside a value is written twice.
fn opt_value(s: &str) -> String {
    s.replace(',', ",,")
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
        .with_context(|| format!("cannot run {}", qemu.display()))?;
    let said = status.read();
    if said.lines().any(|l| l.starts_with("ok")) {
        return Ok(());
    }
    let qemu_name = qemu.file_name().unwrap_or_default().to_string_lossy().into_owned();
    if let Some(e) = said.lines().find_map(|l| l.strip_prefix("error ")) {
        bail!("{qemu_name} cannot use the itrace plugin: {e}: install qemu-user 7.2 (Debian 12), whose plugin API itrace is built for");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no message");
    if stderr.contains("plugin") && stderr.contains("version") {
        bail!(
            "{qemu_name} refused the itrace plugin {}: plugin API mismatch ({first}): itrace's plugin needs QEMU's \
             plugin API version 1: install qemu-user 7.2 (Debian 12), or rebuild itrace-qemu-plugin for this qemu",
            plugin.display()
        );
    }
    if stderr.contains("-plugin") || stderr.contains("unknown option") {
        bail!("{qemu_name} was built without TCG plugin support ({first}): install Debian's qemu-user 7.2");
    }
    bail!("{qemu_name} could not load the itrace plugin {} ({first})", plugin.display())
}

/// Totals the plugin reports at the end.
#[derive(Default)]
struct Done {
    records: u64,
    instructions: u64,
    branches: u64,
    lost: u64,
    bytes: u64,
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
            "stop" => d.stop = v as u32,
            _ => {}
        }
    }
    Some(d)
}

pub fn run(args: &RecordArgs) -> Result<RecordSummary> {
    if args.pid.is_some() {
        bail!("--backend qemu launches the program under qemu-user: it cannot attach to a running process (-p)");
    }
    if args.region || !args.start.is_empty() || !args.stop.is_empty() || args.duration.is_some() || args.follow_forks {
        bail!("--backend qemu records the whole program: --region, --start, --stop, --duration and --follow-forks are not supported with it");
    }
    let Some(cmd) = args.command.first() else { bail!("nothing to trace: give a command after `--`") };
    let program = find_program(Path::new(cmd))?;
    let elf_arch = itrace_arch::elf::arch_of(&program);
    let arch = match (args.arch.map(|a| a.arch()), elf_arch) {
        (Some(a), Some(e)) if a != e => bail!("{} is a {e} program, not {a}", program.display()),
        (Some(a), _) => a,
        (None, Some(e)) => e,
        (None, None) => {
            bail!("{} is not an ELF program itrace can trace: give its architecture with --arch", program.display())
        }
    };
    let mode = crate::record::checked_mode(args)?;
    let qemu = find_qemu(arch)?;
    let plugin = find_plugin()?;
    probe(&qemu, &plugin, arch, &program)?;

    // Fail early (and in one line) when the trace file cannot be created; the plugin rewrites it.
    std::fs::File::create(&args.output)
        .with_context(|| format!("cannot create trace file {}", args.output.display()))?;
    let out = std::fs::canonicalize(&args.output).unwrap_or_else(|_| args.output.clone());
    let status = StatusFile::new("run");
    let name: String = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let sysroot = cross_sysroot(arch);
    let mut spec = format!(
        "{},out={},status={},arch={arch},mode={mode},bufsize={},segsize={},mtesize={},streams={STREAMS},name={}",
        opt_value(&plugin.to_string_lossy()),
        opt_value(&out.to_string_lossy()),
        opt_value(&status.0.to_string_lossy()),
        args.buffer_size,
        args.segment_size,
        args.mte_size,
        opt_value(&name),
    );
    if let Some(root) = &sysroot {
        spec.push_str(&format!(",sysroot={}", opt_value(&root.to_string_lossy())));
    }
    let mut qcmd = Command::new(&qemu);
    // qemu-user reads QEMU_* settings from its environment and passes the rest to the program.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("QEMU_") {
            qcmd.env_remove(k);
        }
    }
    if let Some(root) = &sysroot {
        qcmd.arg("-L").arg(root);
    }
    qcmd.arg("-plugin").arg(spec).arg(&program).args(args.command.iter().skip(1));
    let status_line = StatusLine::start(Source::File(out.clone()), None);
    let exit = qcmd.status().with_context(|| format!("cannot run {}", qemu.display()));
    status_line.finish();
    let exit = exit?;
    let said = status.read();
    let qemu_name = qemu.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let Some(done) = parse_done(&said) else {
        if let Some(e) = said.lines().find_map(|l| l.strip_prefix("error ")) {
            bail!("the itrace plugin failed: {e}");
        }
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = exit.signal() {
            bail!(
                "the program was killed by signal {sig} and qemu-user does not tell plugins: the end of the trace \
                 (its last segment and summary) is missing from {}",
                args.output.display()
            );
        }
        bail!(
            "{qemu_name} ended ({exit}) without the itrace plugin finishing the trace; {} is incomplete",
            args.output.display()
        );
    };
    if let Some(e) = &done.error {
        bail!(
            "{e}; tracing stopped, the trace up to the failure is in {} ({})",
            args.output.display(),
            human_size(done.bytes)
        );
    }
    let why = match StopReason::from_code(done.stop) {
        Some(StopReason::Detached) => "the program called exec (qemu-user runs the new program untraced)",
        Some(r) => summary::why(r),
        None => "the program ended",
    };
    Ok(RecordSummary {
        records: done.records,
        instructions: done.instructions,
        branches: done.branches,
        lost: done.lost,
        mode,
        step: format!("{} (qemu plugin)", StepMethod::Emulated),
        arch: Some(arch),
        bytes: done.bytes,
        output: Some(args.output.clone()),
        why: why.into(),
        program: ProgramEnd::from_exit(exit),
    })
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
