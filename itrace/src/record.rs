//! `itrace record`: set up the trace file and buffers, run the recorder,
//! write the summary.

use crate::cli::{BackendArg, ModeArg, RecordArgs};
use crate::size::human_size;
use crate::status::{Source, StatusLine};
use crate::summary::{self, ProgramEnd, RecordSummary};
use anyhow::{bail, Context, Result};
use itrace_arch::ptrace::breakpoints::{Trigger, TriggerKind};
use itrace_arch::ptrace::procfs::Mapping;
use itrace_arch::ptrace::{self, BlockStep, RecordOptions, Target};
use itrace_format::{
    Arch, BufferConfig, Buffers, FileHeader, Mode, StepMethod, StopReason, Summary, TraceWriter, FLAG_ICOUNT,
    FLAG_NO_ASLR,
};
use itrace_post::symbols::SymbolCache;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Find `cmd` the way execvp would: a path with a slash as is, else along $PATH.
pub fn resolve_program(cmd: &OsString) -> Result<PathBuf> {
    let p = Path::new(cmd);
    let check = |p: &Path| -> Result<()> {
        let md = std::fs::metadata(p).with_context(|| format!("cannot run {}", p.display()))?;
        use std::os::unix::fs::PermissionsExt;
        if md.is_dir() {
            bail!("cannot run {}: it is a directory", p.display());
        }
        if md.permissions().mode() & 0o111 == 0 {
            bail!("cannot run {}: it is not executable", p.display());
        }
        Ok(())
    };
    if cmd.as_encoded_bytes().contains(&b'/') {
        check(p)?;
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let cand = dir.join(p);
        if cand.is_file() && check(&cand).is_ok() {
            return Ok(cand);
        }
    }
    bail!("cannot run {}: command not found in PATH", p.display())
}

fn ncpu() -> u16 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.clamp(1, u16::MAX as libc::c_long) as u16
}

/// `itrace record`: record, print the summary, write the arc when asked, and exit with the
/// program's status.
pub fn command(args: RecordArgs) -> Result<ExitCode> {
    let summary = run(&args)?;
    summary.print();
    if args.arc {
        let arc_path = args.output.with_extension("arc");
        crate::cli::write_arc(&args.output, Some(&arc_path))?;
    }
    Ok(summary.program.exit_code())
}

/// Record as `args` say; the trace is complete in `args.output` when this returns Ok.
pub fn run(args: &RecordArgs) -> Result<RecordSummary> {
    if args.backend == BackendArg::Qemu {
        return crate::plugin::run(args);
    }
    if args.gdb.is_some() || args.qemu.is_some() {
        return crate::remote::run(args);
    }
    let target = match (&args.pid, args.command.first()) {
        (Some(pid), _) => Target::Attach { pid: *pid },
        (None, Some(cmd)) => {
            Target::Launch { program: resolve_program(cmd)?, args: args.command.clone(), aslr: args.aslr }
        }
        (None, None) => bail!("nothing to trace: give a command to run, or `-p PID`"),
    };
    if let Target::Attach { pid } = target {
        if pid <= 0 || !Path::new(&format!("/proc/{pid}")).exists() {
            bail!("no process with pid {pid}");
        }
    }
    let mode = checked_mode(args)?;

    // Block stepping only where the probe saw it stop at a branch target; the trace is the same either way.
    let block_step = args.emulate_block_step || ptrace::probe_singleblock() == BlockStep::Works;
    let step = if block_step && !args.emulate_block_step {
        StepMethod::PtraceSingleBlock
    } else {
        StepMethod::PtraceSingleStep
    };
    let inproc = match (args.backend, &target) {
        (BackendArg::Inproc, Target::Launch { .. }) if args.region && args.start.is_empty() && args.stop.is_empty() => {
            true
        }
        (BackendArg::Inproc, _) => {
            bail!("--backend inproc records --region of a launched program (not -p, --start or --stop)")
        }
        (BackendArg::Auto, Target::Launch { .. }) => args.region && args.start.is_empty() && args.stop.is_empty(),
        _ => false,
    };
    let arch = traced_arch(&target)?;
    let kmod = crate::kmod::chosen(args.backend, !args.start.is_empty() || !args.stop.is_empty(), arch)?;
    if let Target::Launch { program, .. } = &target {
        check_functions_exist(program, args.start.iter().chain(&args.stop))?;
    }
    if let (true, Target::Launch { program, .. }) = (inproc || (kmod && args.region), &target) {
        if !crate::inproc::uses_libitrace(program) {
            bail!(
                "--region: {} does not use libitrace (no ITraceOn in it or its libraries): link it with -litrace \
                 or load libitrace.so with LD_PRELOAD (see README)",
                program.display()
            );
        }
    }
    let step = if kmod {
        StepMethod::Kernel
    } else if inproc {
        StepMethod::InProcess
    } else {
        step
    };
    let ncpu = ncpu();
    let no_aslr = matches!(target, Target::Launch { aslr: false, .. });
    let mut buffers = open_trace(args, arch, mode, step, ncpu, no_aslr)?;
    crate::signals::install(args.duration).context("cannot install signal handlers")?;
    let mut wanted: Vec<(String, TriggerKind)> = Vec::new();
    if args.region {
        wanted.push(("ITraceOn".into(), TriggerKind::RegionOn));
        wanted.push(("ITraceOff".into(), TriggerKind::RegionOff));
        wanted.push(("ITraceEnabled".into(), TriggerKind::RegionEnabled));
    }
    wanted.extend(args.start.iter().map(|s| (s.clone(), TriggerKind::Start)));
    wanted.extend(args.stop.iter().map(|s| (s.clone(), TriggerKind::Stop)));
    if !args.stop.is_empty() && args.start.is_empty() && !args.region {
        bail!("--stop needs --start (or --region): nothing would start tracing");
    }
    let resolve = |pid: i32, maps: &[Mapping]| resolve_triggers(pid, maps, &wanted, args.region);
    let opts = RecordOptions {
        target: target.clone(),
        follow_forks: args.follow_forks,
        follow_threads: !args.no_follow_threads,
        stop: &crate::signals::STOP,
        block_step,
        emulate_block_step: args.emulate_block_step,
        triggers: if wanted.is_empty() { None } else { Some(&resolve) },
    };
    let status = StatusLine::start(Source::Buffers(buffers.live()), args.duration);
    let recorded = if kmod {
        crate::kmod::record_args(args, &target, mode, &mut buffers)
    } else if let (true, Target::Launch { program, args: argv, aslr }) = (inproc, &target) {
        let ring = match mode {
            Mode::Continuous => args.segment_size.max(args.buffer_size.min(16 << 20)),
            _ => args.buffer_size,
        };
        crate::inproc::record(program, argv, *aslr, mode, ring, &crate::signals::STOP, &mut buffers)
    } else {
        ptrace::record(&opts, &mut buffers).map_err(anyhow::Error::from)
    };
    status.finish();
    let outcome = match recorded {
        Ok(o) => o,
        Err(e) => {
            drop(buffers);
            let _ = std::fs::remove_file(&args.output);
            return Err(e);
        }
    };
    let stop_reason = outcome.stop_reason.unwrap_or(StopReason::Exited);
    let lost: u64 = buffers.lost().iter().sum();
    let records: u64 = buffers.records().iter().sum();
    let summary = Summary {
        ts: ptrace::now_ns(),
        stop_reason: stop_reason as u32,
        instructions: outcome.instructions,
        ..Default::default()
    };
    let finished = buffers.finish(summary);
    let size = std::fs::metadata(&args.output).map(|m| m.len()).unwrap_or(0);
    if let Some(e) = outcome.trigger_error {
        bail!("{e}");
    }
    if let Some(e) = outcome.write_error {
        // One line: what failed and what is kept.
        bail!(
            "{e}; tracing stopped, the trace up to the failure is in {} ({})",
            args.output.display(),
            human_size(size)
        );
    }
    finished.with_context(|| format!("cannot finish writing {}", args.output.display()))?;
    Ok(RecordSummary {
        records,
        instructions: outcome.instructions,
        branches: outcome.branches,
        lost,
        mode,
        step: step.to_string(),
        arch: None,
        bytes: size,
        output: Some(args.output.clone()),
        why: summary::why(stop_reason).into(),
        program: ProgramEnd::from_status(outcome.exit_status),
    })
}

/// Fail before the program runs when a `--start`/`--stop` function is in neither the program
/// nor the libraries it links (found as the dynamic loader would). When a library cannot be
/// found here, the check is left to the run, which sees what is really mapped.
fn check_functions_exist<'a>(program: &Path, names: impl Iterator<Item = &'a String>) -> Result<()> {
    let names: Vec<&String> = names.collect();
    if names.is_empty() {
        return Ok(());
    }
    let Some(objects) = itrace_arch::elf::linked_objects(program) else { return Ok(()) };
    let mut symbols = SymbolCache::new();
    for name in names {
        let found =
            objects.iter().any(|o| symbols.get(&o.to_string_lossy()).is_some_and(|m| m.find_function(name).is_some()));
        if !found {
            bail!("no function named {name} in {} or its libraries", program.display());
        }
    }
    Ok(())
}

/// The architecture of the program to trace, from its ELF header (x86_64 when it is not ELF,
/// e.g. a script). Foreign programs need --qemu.
fn traced_arch(target: &Target) -> Result<Arch> {
    let exe = match target {
        Target::Launch { program, .. } => program.clone(),
        Target::Attach { pid } => PathBuf::from(format!("/proc/{pid}/exe")),
    };
    match itrace_arch::elf::arch_of(&exe) {
        Some(a @ (Arch::X86_64 | Arch::I386)) => Ok(a),
        Some(a) => bail!("{} is a {a} program: trace it with --qemu {a}", exe.display()),
        None => Ok(Arch::X86_64),
    }
}

/// Where the wanted functions are in process `pid`, given its executable mappings.
fn resolve_triggers(
    pid: i32,
    maps: &[Mapping],
    wanted: &[(String, TriggerKind)],
    region: bool,
) -> Result<Vec<Trigger>, String> {
    let mut symbols = SymbolCache::new();
    let mut found: Vec<Trigger> = Vec::new();
    let mut resolved = vec![false; wanted.len()];
    for m in maps.iter().filter(|m| !m.path.is_empty() && !m.path.starts_with('[')) {
        let Some(ms) = symbols.get(&m.path) else { continue };
        for (i, (name, kind)) in wanted.iter().enumerate() {
            let Some(vaddr) = ms.find_function(name) else { continue };
            if let Some(addr) = ms.runtime_addr(m.start, m.offset, m.end - m.start, vaddr) {
                resolved[i] = true;
                if !found.iter().any(|t| t.addr == addr) {
                    found.push(Trigger { addr, kind: *kind });
                }
            }
        }
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
    if region && !found.iter().any(|t| t.kind == TriggerKind::RegionOn) {
        return Err(format!(
            "--region: {exe} does not use libitrace (no ITraceOn in it or its libraries): link it with -litrace \
             or load libitrace.so with LD_PRELOAD (see README)"
        ));
    }
    if let Some(((name, _), _)) = wanted
        .iter()
        .zip(&resolved)
        .find(|((_, k), r)| !**r && *k != TriggerKind::RegionEnabled && *k != TriggerKind::RegionOff)
    {
        return Err(format!("no function named {name} in {exe} or its libraries"));
    }
    Ok(found)
}

/// Create the trace file (header written) and the buffers that fill it.
/// Why a launched program's trace ended, and the trace-off value (exit code or signal): a
/// detach or a full buffer first, then how the program ended (`None`: it was not waited for).
pub fn stop_reason(status: Option<std::process::ExitStatus>, detached: bool, full: bool) -> (StopReason, i32) {
    use std::os::unix::process::ExitStatusExt;
    match status {
        _ if detached => (StopReason::Detached, 0),
        _ if full => (StopReason::BufferFull, 0),
        Some(st) => match (st.signal(), st.code()) {
            (Some(sig), _) => (StopReason::Signaled, sig),
            (None, code) => (StopReason::Exited, code.unwrap_or(0)),
        },
        None => (StopReason::Detached, 0),
    }
}

/// The summary's exit status: the code, or minus the signal that killed the program.
pub fn exit_status(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (st.signal(), st.code()) {
        (Some(sig), _) => -sig,
        (None, code) => code.unwrap_or(0),
    }
}

pub fn open_trace(
    args: &RecordArgs,
    arch: Arch,
    mode: Mode,
    step: StepMethod,
    ncpu: u16,
    no_aslr: bool,
) -> Result<Buffers> {
    let flags = FLAG_ICOUNT | if no_aslr { FLAG_NO_ASLR } else { 0 };
    let header =
        FileHeader::starting_now(arch, mode, step, ncpu, flags, args.buffer_size as u64, args.segment_size as u64);
    let writer = TraceWriter::create(&args.output, &header)
        .with_context(|| format!("cannot create trace file {}", args.output.display()))?;
    let cfg = BufferConfig {
        mode,
        ncpu: ncpu as usize,
        buffer_size: args.buffer_size,
        segment_size: args.segment_size,
        mte_size: args.mte_size,
    };
    Ok(Buffers::new(cfg, writer))
}

/// The collection mode, once the buffer sizes given for it are checked.
pub fn checked_mode(args: &RecordArgs) -> Result<Mode> {
    let mode = match args.mode {
        ModeArg::Normal => Mode::Normal,
        ModeArg::Wrap => Mode::Wrap,
        ModeArg::Continuous => Mode::Continuous,
    };
    const MIN: usize = 4096;
    if args.buffer_size < MIN || args.segment_size < MIN || args.mte_size < MIN {
        bail!("buffer, segment and MTE sizes must be at least 4K");
    }
    if mode == Mode::Continuous && args.segment_size > 1 << 30 {
        bail!("--segment-size must be at most 1G");
    }
    Ok(mode)
}
