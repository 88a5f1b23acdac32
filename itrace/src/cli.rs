//! Command-line definitions.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "itrace",
    version,
    about = "Instruction and branch tracer for Linux: records every taken branch of a program (or a region of it) and writes PI-style arc files and reports.",
    after_help = ENVIRONMENT_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The environment variables itrace reads, for `--help` and the man page.
pub const ENVIRONMENT_HELP: &str = "\
Environment:
  ITRACE_QEMU_PLUGIN  the TCG plugin of --backend qemu (default: next to itrace)
  PATH                where `record` finds a program named without a slash
  COLUMNS             report width when stdout is not a terminal (default 120)
  LD_PRELOAD          `record --region` accepts a preloaded libitrace.so
  QEMU_*              not passed to a program run by --backend qemu";

#[derive(Subcommand)]
pub enum Command {
    /// Trace a program: launch it (`itrace record CMD ARGS`) or attach to a running one (`-p PID`).
    Record(Box<RecordArgs>),
    /// Write the arc file: one line per taken branch (PI's `post -arc`).
    Arc(ArcArgs),
    /// Summarise a trace: instructions and calls per function, module and thread.
    Report(ReportArgs),
    /// Print every record of a trace, raw (for debugging traces and itrace itself).
    Dump(DumpArgs),
    /// Calibrate the hookit entry/exit profiler and validate it against the trace.
    Calib(crate::calib::CalibArgs),
    /// Print a shell completion script: `itrace completions bash > /etc/bash_completion.d/itrace`.
    Completions(CompletionsArgs),
    /// Write man pages (itrace.1 and one per command) into a directory, or itrace.1 to stdout.
    Man(ManArgs),
}

/// Recording backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Auto,
    Ptrace,
    Inproc,
    /// qemu-user with the itrace TCG plugin: the whole launched program at emulation speed.
    Qemu,
    /// The kernel module (kmod-shim): traps handled in the kernel, no tracer process per step.
    Kmod,
}

/// Architectures of programs run under qemu-user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ArchArg {
    #[value(name = "x86_64")]
    X86_64,
    I386,
    Ppc64le,
    Ppc64,
    S390x,
}

impl ArchArg {
    /// The trace header's architecture.
    pub fn arch(self) -> itrace_format::Arch {
        match self {
            ArchArg::X86_64 => itrace_format::Arch::X86_64,
            ArchArg::I386 => itrace_format::Arch::I386,
            ArchArg::Ppc64le => itrace_format::Arch::Ppc64le,
            ArchArg::Ppc64 => itrace_format::Arch::Ppc64,
            ArchArg::S390x => itrace_format::Arch::S390x,
        }
    }
}

/// Collection modes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// Stop tracing when a per-CPU buffer is full; the program runs on untraced.
    Normal,
    /// Keep only the most recent records (a flight recorder); older ones are counted as lost.
    Wrap,
    /// Write full segments to the file as tracing goes on; constant memory, nothing lost.
    Continuous,
}

#[derive(Args)]
pub struct RecordArgs {
    /// Trace file to write.
    #[arg(short, long, default_value = "itrace.itr")]
    pub output: PathBuf,
    /// Collection mode.
    #[arg(long, value_enum, default_value_t = ModeArg::Continuous)]
    pub mode: ModeArg,
    /// Trace buffer size per CPU (normal and wrap modes), e.g. 64K, 8M, 1G.
    #[arg(long, default_value = "64M", value_parser = crate::size::parse_size)]
    pub buffer_size: usize,
    /// Segment size for continuous mode (and the MTE stream in wrap mode): a segment is written when full.
    #[arg(long, default_value = "1M", value_parser = crate::size::parse_size)]
    pub segment_size: usize,
    /// Module-table buffer size (normal mode): tracing stops when it is full.
    #[arg(long, default_value = "8M", value_parser = crate::size::parse_size)]
    pub mte_size: usize,
    /// Also trace child processes (fork, vfork) and what they execute.
    #[arg(long)]
    pub follow_forks: bool,
    /// Do not trace threads created after tracing starts.
    #[arg(long)]
    pub no_follow_threads: bool,
    /// Stop tracing after this many seconds (fractions allowed), detach and keep the program running.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<f64>,
    /// Also write the arc file next to the trace (TRACE.arc).
    #[arg(long)]
    pub arc: bool,
    /// Keep address-space randomisation on for a launched program (off by default, like gdb, so traces repeat).
    #[arg(long)]
    pub aslr: bool,
    /// Trace only regions the program brackets with ITraceOn()/ITraceOff() (libitrace); the
    /// rest runs at full speed.
    #[arg(long)]
    pub region: bool,
    /// How to record: ptrace single-stepping, the in-process recorder (the program steps
    /// itself in a SIGTRAP handler; `--region` on a launched program only), the kernel module
    /// (kmod-shim, /dev/itrace), or qemu (the launched program under qemu-user with itrace's TCG
    /// plugin: fast, emulated CPU). auto: the kernel module when it is loaded (without --region,
    /// --start, --stop), else in-process for `--region` on a launched program, else ptrace.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Start tracing a thread when it enters this function (a symbol of the program or its
    /// libraries); with --stop, trace from here to there. Repeatable.
    #[arg(long, value_name = "SYMBOL")]
    pub start: Vec<String>,
    /// Stop tracing a thread when it enters this function. Repeatable.
    #[arg(long, value_name = "SYMBOL")]
    pub stop: Vec<String>,
    /// Testing: feed the block-step (PTRACE_SINGLEBLOCK) decoder from single steps, as if the
    /// branch trap worked, to check that both give the same trace.
    #[arg(long, hide = true)]
    pub emulate_block_step: bool,
    /// Attach to this running process (all its threads).
    #[arg(short, long, conflicts_with = "command")]
    pub pid: Option<i32>,
    /// Trace through the GDB remote protocol: connect to a stub at HOST:PORT (`qemu-ARCH -g PORT`,
    /// gdbserver) and step the program it holds. The architecture and symbols come from
    /// --gdb-program (or the command after `--`, which is not run).
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["pid", "qemu"])]
    pub gdb: Option<String>,
    /// The ELF file of the program behind --gdb.
    #[arg(long, value_name = "PATH", requires = "gdb")]
    pub gdb_program: Option<PathBuf>,
    /// Run the command under qemu-user for ARCH (ppc64le, ppc64, s390x, i386, x86_64) and trace it
    /// from its first instruction through qemu's GDB stub.
    #[arg(long, value_name = "ARCH", conflicts_with = "pid")]
    pub qemu: Option<String>,
    /// Architecture of the program for --backend qemu (x86_64, i386, ppc64le, ppc64, s390x);
    /// default: from its ELF header.
    #[arg(long, value_enum, value_name = "ARCH")]
    pub arch: Option<ArchArg>,
    /// Environment variable for a program run with --qemu (repeatable); its environment is empty otherwise.
    #[arg(long = "env", value_name = "VAR=VALUE", requires = "qemu")]
    pub qemu_env: Vec<std::ffi::OsString>,
    /// Program to launch and its arguments. Everything after the program's name is its own
    /// (`itrace record -o t.itr ./prog -v`); a `--` before it is allowed.
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

fn parse_duration(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() && v < 1e9 => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

/// The trace file a reading command reads: `itrace report t.itr`, `itrace report -i t.itr`, or
/// `itrace.itr` (what `record` writes by default), as perf does with perf.data.
#[derive(Args)]
pub struct TraceInput {
    /// Trace file to read (default: itrace.itr).
    #[arg(value_name = "TRACE")]
    pub trace: Option<PathBuf>,
    /// Trace file to read, as an option (perf's -i).
    #[arg(short = 'i', long = "input", value_name = "TRACE", conflicts_with = "trace")]
    pub input: Option<PathBuf>,
}

impl TraceInput {
    pub const DEFAULT: &'static str = "itrace.itr";

    pub fn path(&self) -> PathBuf {
        self.trace.clone().or_else(|| self.input.clone()).unwrap_or_else(|| PathBuf::from(Self::DEFAULT))
    }
}

#[derive(Args)]
pub struct ArcArgs {
    #[command(flatten)]
    pub input: TraceInput,
    /// Where to write the arc file (default: standard output).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub input: TraceInput,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Rows per table in the text report (0: all).
    #[arg(long, default_value_t = 40)]
    pub top: usize,
    /// Width the text tables fit to (default: the terminal's, else $COLUMNS, else 120).
    #[arg(long, value_name = "COLUMNS")]
    pub width: Option<usize>,
}

#[derive(Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub input: TraceInput,
}

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args)]
pub struct ManArgs {
    /// Write itrace.1 and itrace-COMMAND.1 here (default: itrace.1 to standard output).
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
}

/// A progress bar on a terminal for reads of large traces; hidden otherwise.
pub fn progress(total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() || total < (64 << 20) {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {bytes}/{total_bytes} [{bar:40}] {eta} left")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
}

pub fn arc(args: ArcArgs) -> Result<ExitCode> {
    write_arc(&args.input.path(), args.output.as_deref())?;
    Ok(ExitCode::SUCCESS)
}

/// The arc file of `trace`, into `output` (with a line saying so) or onto stdout.
pub fn write_arc(trace_path: &Path, output: Option<&Path>) -> Result<()> {
    let trace = open_trace(trace_path)?;
    let pb = progress(trace.trace_bytes());
    let out: Box<dyn std::io::Write> = match output {
        Some(p) => Box::new(std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let out = std::io::BufWriter::with_capacity(1 << 16, out);
    let stats = itrace_post::arc::write_arc(&trace, out, &mut |done| pb.set_position(done))
        .with_context(|| format!("cannot write the arc of {}", trace_path.display()))?;
    pb.finish_and_clear();
    warn_truncated(&trace);
    if let Some(p) = output {
        eprintln!("itrace: wrote {} ({} lines)", p.display(), stats.lines);
    }
    Ok(())
}

pub fn report(args: ReportArgs) -> Result<ExitCode> {
    let path = args.input.path();
    let trace = open_trace(&path)?;
    let pb = progress(trace.trace_bytes());
    let report = itrace_post::report::build(&trace, &mut |done| pb.set_position(done))
        .with_context(|| format!("cannot read {}", path.display()))?;
    pb.finish_and_clear();
    warn_truncated(&trace);
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::new(stdout);
    if args.json {
        report.write_json(&mut out)?;
    } else {
        let width = args.width.unwrap_or_else(terminal_width);
        report.write_text(&mut out, &itrace_post::report::TextOptions { top: args.top, width })?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Open a trace for reading; a missing default file gets a hint.
pub fn open_trace(path: &Path) -> Result<itrace_post::Trace> {
    if path == Path::new(TraceInput::DEFAULT) && !path.exists() {
        bail!("no trace file {} here: name one, or record one with `itrace record`", path.display());
    }
    itrace_post::open(path).map_err(|e| naming(e, path))
}

/// An error about reading `path`, named once: errors that already name the file keep their
/// own words.
pub fn naming<E: std::error::Error + Send + Sync + 'static>(e: E, path: &Path) -> anyhow::Error {
    if e.to_string().contains(&path.display().to_string()) {
        anyhow::Error::new(e)
    } else {
        anyhow::Error::new(e).context(format!("cannot read {}", path.display()))
    }
}

/// The width text tables fit to: the terminal's, else $COLUMNS, else 120.
fn terminal_width() -> usize {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes a winsize into ws, a valid and exclusively borrowed struct.
    let on_tty = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0;
    if on_tty {
        return ws.ws_col as usize;
    }
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|&c: &usize| c > 0).unwrap_or(120)
}

pub fn completions(args: CompletionsArgs) -> Result<ExitCode> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "itrace", &mut out);
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn man(args: ManArgs) -> Result<ExitCode> {
    let cmd = <Cli as clap::CommandFactory>::command();
    match &args.output {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            eprintln!("itrace: wrote man pages into {}", dir.display());
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Tell the user when a trace was cut short (records up to the cut were used).
pub fn warn_truncated(trace: &itrace_post::Trace) {
    if let Some(off) = trace.truncated_at() {
        eprintln!(
            "itrace: warning: {} is truncated at offset {off:#x}; read up to its last whole record",
            trace.path().display()
        );
    } else if trace.summary().is_none() {
        eprintln!(
            "itrace: warning: {} has no end summary (recording did not finish); read what is there",
            trace.path().display()
        );
    }
}
