//! `itrace record --qemu ARCH -- PROG ARGS` and `itrace record --gdb
//! HOST:PORT`: tracing through the GDB remote protocol (foreign
//! architectures under qemu-user, or any stub), into the same trace format.

use crate::cli::RecordArgs;
use crate::size::human_size;
use crate::status::{Source, StatusLine};
use crate::summary::{self, ProgramEnd, RecordSummary};
use anyhow::{anyhow, bail, Context, Result};
use itrace_arch::elf::Program;
use itrace_arch::gdb::{self, Connection, Qemu, RemoteOptions};
use itrace_format::{Arch, StepMethod, StopReason, Summary};
use std::path::{Path, PathBuf};

const ARCHES: [Arch; 5] = [Arch::Ppc64le, Arch::Ppc64, Arch::S390x, Arch::I386, Arch::X86_64];

fn parse_arch(name: &str) -> Result<Arch> {
    ARCHES.into_iter().find(|a| a.name() == name).ok_or_else(|| {
        let known: Vec<&str> = ARCHES.iter().map(|a| a.name()).collect();
        anyhow!("unknown architecture '{name}' for --qemu (known: {})", known.join(", "))
    })
}

/// A program path as given (with a slash) or found along $PATH.
fn find_program(cmd: &Path) -> Result<PathBuf> {
    if cmd.as_os_str().as_encoded_bytes().contains(&b'/') {
        return if cmd.is_file() { Ok(cmd.to_path_buf()) } else { bail!("cannot run {}: no such file", cmd.display()) };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("cannot run {}: command not found in PATH", cmd.display()))
}

pub fn run(args: &RecordArgs) -> Result<RecordSummary> {
    let qemu_arch = args.qemu.as_deref().map(parse_arch).transpose()?;
    let program_path = match (&args.gdb_program, args.command.first()) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(cmd)) => Some(find_program(Path::new(cmd))?),
        (None, None) if qemu_arch.is_some() => bail!("nothing to trace: give a command after `--`"),
        (None, None) => None,
    };
    let program = match &program_path {
        Some(p) => Some(Program::read(p).with_context(|| "cannot read the program's ELF file".to_string())?),
        None => None,
    };
    let elf_arch = program.as_ref().and_then(|p| p.arch);
    let arch = match (qemu_arch, elf_arch) {
        (Some(q), Some(e)) if q != e => {
            bail!("{} is a {e} program, not {q}", program_path.as_deref().unwrap_or(Path::new("?")).display())
        }
        (Some(q), _) => q,
        (None, Some(e)) => e,
        (None, None) => {
            bail!("--gdb: cannot tell the target's architecture: give its program with --gdb-program PATH (or -- PATH)")
        }
    };
    let mode = crate::record::checked_mode(args)?;

    // Start the program (or reach the stub) before creating the trace file.
    let (qemu, mut conn): (Option<Qemu>, Connection) = match (qemu_arch, &args.gdb) {
        (Some(a), _) => {
            let prog = program_path.as_deref().expect("checked above");
            let (q, c) = gdb::launch_qemu(a, prog, &args.command, &args.qemu_env)?;
            (Some(q), c)
        }
        (None, Some(addr)) => (None, Connection::connect(addr, gdb::REPLY_TIMEOUT)?),
        (None, None) => unreachable!("remote::run is only called with --qemu or --gdb"),
    };

    let mut buffers = crate::record::open_trace(args, arch, mode, StepMethod::GdbStep, 1, false)?;
    crate::signals::install(args.duration).context("cannot install signal handlers")?;
    let arch_impl = itrace_arch::for_arch(arch);
    let process_name = program_path
        .as_deref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().chars().take(15).collect())
        .unwrap_or_default();
    let opts = RemoteOptions {
        arch: arch_impl.as_ref(),
        program,
        sysroot: gdb::cross_sysroot(arch),
        process_name,
        pid_hint: qemu.as_ref().map(|q| q.child.id()).unwrap_or(0),
        launched: qemu.is_some(),
        stub_steps_over_breakpoints: qemu.is_some(),
        stop: &crate::signals::STOP,
    };
    let status = StatusLine::start(Source::Buffers(buffers.live()), args.duration);
    let recorded = gdb::record(&mut conn, &opts, &mut buffers);
    status.finish();
    let result = match recorded {
        Ok(r) => r,
        Err(e) => {
            drop(buffers);
            let _ = std::fs::remove_file(&args.output);
            return Err(e.into());
        }
    };
    drop(conn);
    let outcome = result.outcome;
    let stop_reason = outcome.stop_reason.unwrap_or(StopReason::Exited);
    let summary = Summary {
        ts: now_ns(),
        stop_reason: stop_reason as u32,
        instructions: outcome.instructions,
        ..Default::default()
    };
    let records: u64 = buffers.records().iter().sum();
    let lost: u64 = buffers.lost().iter().sum();
    let finished = buffers.finish(summary);
    let size = std::fs::metadata(&args.output).map(|m| m.len()).unwrap_or(0);
    if let Some(mut q) = qemu {
        // qemu exits with the program (or runs it on after a detach).
        if result.error.is_some() {
            drop(q);
        } else {
            let _ = q.child.wait();
        }
    }
    finished.with_context(|| format!("cannot finish writing {}", args.output.display()))?;
    if let Some(e) = result.error {
        bail!("{e}; tracing stopped, the trace up to there is in {} ({})", args.output.display(), human_size(size));
    }
    if let Some(e) = outcome.write_error {
        bail!(
            "{e}; tracing stopped, the trace up to the failure is in {} ({})",
            args.output.display(),
            human_size(size)
        );
    }
    Ok(RecordSummary {
        records,
        instructions: outcome.instructions,
        branches: outcome.branches,
        lost,
        mode,
        step: StepMethod::GdbStep.to_string(),
        arch: Some(arch),
        bytes: size,
        output: Some(args.output.clone()),
        why: summary::why(stop_reason).into(),
        program: ProgramEnd::from_status(outcome.exit_status),
    })
}

use itrace_format::now_ns;
