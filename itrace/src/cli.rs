//! The command line: clap's definitions only. Each command turns its arguments into what
//! it runs (`record`: plain settings); nothing here runs anything.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;

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
  ITRACE_STEP         default of `record --step` (instruction, block, auto) where ptrace steps
  ITRACE_BACKEND      default of `record --backend` (auto, ptrace, translate, ...)
  DEBUGINFOD_URLS     debuginfod servers (space-separated) for debug files of stripped modules
  DEBUGINFOD_CACHE_PATH  their cache, shared with elfutils (default ~/.cache/debuginfod_client)
  DEBUGINFOD_TIMEOUT  seconds to connect to a server and for each read (default 90)
  XDG_CACHE_HOME      the hints already shown: itrace/hints-shown there (default: ~/.cache)
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
    /// Show the call flow per thread: one line per call and return, nested, with each call's
    /// inclusive and self instructions (as `uftrace replay`).
    Replay(ReplayArgs),
    /// Show one function's instructions per source line (and per instruction with --asm).
    Annotate(AnnotateArgs),
    /// Compare two traces per function: self, inclusive and calls before, after and change.
    Diff(DiffArgs),
    /// Draw a flame graph: exact instructions per call stack, as an SVG (or folded stacks).
    Flamegraph(FlamegraphArgs),
    /// Convert a trace for other tools: a callgrind profile (kcachegrind, callgrind_annotate), a
    /// timeline of calls per thread (Perfetto, chrome://tracing, the Firefox Profiler), a Parquet table.
    Export(ExportArgs),
    /// Print every record of a trace, raw (for debugging traces and itrace itself).
    Dump(DumpArgs),
    /// Say what a trace holds and costs: header, streams, records, bytes per taken branch by kind, time span.
    Info(InfoArgs),
    /// Copy the files a trace ran into TRACE.files/, so that it reads right after they change or go.
    Archive(ArchiveArgs),
    /// Calibrate the hookit entry/exit profiler and validate it against the trace.
    Calib(CalibArgs),
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
    /// x86_64: the program runs from a code cache of translated blocks that record their own
    /// branches (no trap per block); the same trace as `--step instruction`.
    Translate,
}

/// `--step`: how the ptrace backend stops the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StepArg {
    /// Every instruction (PTRACE_SINGLESTEP). On s390x under qemu's TCG single steps miss
    /// the stop after conditional and some direct branches, so such traces are not exact there.
    Instruction,
    /// Block by block with debug-register breakpoints (x86_64; probed at start-up, an error
    /// where they do not work); the trace is the same as single-stepping's.
    Block,
    /// The fastest that works here: block, else PTRACE_SINGLEBLOCK, else single steps.
    Auto,
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
    /// Trace file to write; a trace already there is kept as FILE.old (as perf does).
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
    /// Compress each chunk of the trace with zstd (format 3.0's compressed chunks): about 3x
    /// smaller again, at some cost in recording speed.
    #[arg(long)]
    pub compress: bool,
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
    /// --start, --stop), else in-process for `--region` on a launched program, else translate
    /// for an x86_64 program (unless --step or $ITRACE_STEP asks for stepping), else ptrace
    /// (i386 programs; the summary says why auto chose). translate (x86_64): the program runs
    /// from a code cache of translated blocks that record their own branches, the trace of
    /// --step instruction at a fraction of its cost. Default: $ITRACE_BACKEND, else auto.
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
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
    /// How the ptrace backend stops the program (so --backend auto records with it, not
    /// translate): every instruction, block by block with debug-register breakpoints (x86_64,
    /// i386), or auto: the fastest that works here (block, else PTRACE_SINGLEBLOCK where the
    /// branch trap works, else every instruction). The trace is the same with each (but s390x
    /// single steps under qemu's TCG miss stops after branches: there only block steps are
    /// exact). Default: $ITRACE_STEP, else auto.
    #[arg(long, value_enum)]
    pub step: Option<StepArg>,
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
    #[command(flatten)]
    pub read: ReadOptions,
}

/// The part of a trace a view reads (docs/arc-and-report.md, "Ranges"): a place is a count
/// of instructions of all threads from the trace's start (1000000, 1.5M) or a time from its
/// start (2.5ms, 100us, 1s); bounds fall between blocks.
#[derive(Args, Clone, Default)]
pub struct RangeArgs {
    /// Read from this place on: instructions from the trace's start (1000000, 1.5M) or time (2.5ms, 100us, 1s).
    #[arg(long, value_name = "PLACE", help_heading = "Range")]
    pub from: Option<itrace_post::range::Bound>,
    /// Read up to this place (as --from).
    #[arg(long, value_name = "PLACE", help_heading = "Range")]
    pub to: Option<itrace_post::range::Bound>,
    /// Read from the first call of this function on, in any thread (`--after main` leaves out
    /// the program's start-up).
    #[arg(long, value_name = "FUNCTION", help_heading = "Range")]
    pub after: Option<String>,
}

impl RangeArgs {
    /// The range asked for, or why it is empty.
    pub fn range(&self) -> Result<itrace_post::range::Range, String> {
        let r = itrace_post::range::Range { from: self.from, to: self.to, after: self.after.clone() };
        r.check()?;
        Ok(r)
    }
}

/// How every reading command reads a trace.
#[derive(Args, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Refuse a trace with a damaged chunk (a checksum that does not match) instead of
    /// skipping it: an error naming its offset, exit 1.
    #[arg(long)]
    pub strict: bool,
    /// Print no hints (what to install for the names of stripped modules); warnings stay.
    /// Without it, each hint is printed once per trace.
    #[arg(short, long)]
    pub quiet: bool,
    /// `report`, `diff` and `flamegraph`: replay the trace even when the index beside it
    /// (TRACE.itrace-idx, what the last report of it added up) could answer, and write no index.
    #[arg(long)]
    pub no_index: bool,
}

impl Command {
    /// The reading options of a command that reads traces.
    pub fn read_options(&self) -> Option<ReadOptions> {
        match self {
            Command::Arc(a) => Some(a.input.read),
            Command::Report(a) => Some(a.input.read),
            Command::Annotate(a) => Some(a.read),
            Command::Replay(a) => Some(a.input.read),
            Command::Diff(a) => Some(a.read),
            Command::Flamegraph(a) => Some(a.input.read),
            Command::Export(a) => Some(a.input.read),
            Command::Dump(a) => Some(a.input.read),
            Command::Info(a) => Some(a.input.read),
            Command::Archive(a) => Some(a.input.read),
            Command::Record(_) | Command::Calib(_) | Command::Completions(_) | Command::Man(_) => None,
        }
    }
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
    #[command(flatten)]
    pub range: RangeArgs,
    /// Where to write the arc file (default: standard output).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(Args)]
pub struct ArchiveArgs {
    #[command(flatten)]
    pub input: TraceInput,
}

#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub input: TraceInput,
    #[command(flatten)]
    pub range: RangeArgs,
    #[command(flatten)]
    pub output: TableOutput,
    #[command(flatten)]
    pub views: ReportViews,
}

/// Orders of `report`'s function table (no help per value: it would turn `report --help`
/// into its long form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SortArg {
    #[value(name = "self")]
    SelfInstructions,
    Inclusive,
    Calls,
    Name,
}

/// `report`'s views and filters (docs/arc-and-report.md, "Call tree, callers and callees").
#[derive(Args)]
pub struct ReportViews {
    /// Show the call tree: one node per distinct call stack (all threads merged, or --tid's),
    /// with inclusive and self instructions and calls.
    #[arg(long)]
    pub tree: bool,
    /// With --tree: leave out stacks under this percentage of all instructions (0 keeps all).
    #[arg(long, default_value_t = 0.5, value_name = "PERCENT", value_parser = parse_percent)]
    pub min_percent: f64,
    /// With --tree: show this many levels at most (0: all).
    #[arg(long, default_value_t = 0, value_name = "LEVELS")]
    pub depth: usize,
    /// Show the callers of the functions of this name: calls and inclusive instructions per caller.
    #[arg(long, value_name = "FUNCTION")]
    pub callers: Option<String>,
    /// Show the callees of the functions of this name: calls and inclusive instructions per callee.
    #[arg(long, value_name = "FUNCTION")]
    pub callees: Option<String>,
    /// Only this thread: its records alone are replayed, and every total is the thread's.
    #[arg(long, value_name = "TID")]
    pub tid: Option<u32>,
    /// Only the functions of this module (file name or path); totals stay the trace's.
    #[arg(long, value_name = "MODULE")]
    pub module: Option<String>,
    /// Only the functions whose name matches this regular expression; totals stay the trace's.
    #[arg(long, value_name = "REGEX")]
    pub grep: Option<String>,
    /// Order of the function table: self, inclusive or calls (most first), or name.
    #[arg(long, value_enum, default_value_t = SortArg::SelfInstructions)]
    pub sort: SortArg,
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a percentage (0 to 100)")),
    }
}

#[derive(Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub input: TraceInput,
    #[command(flatten)]
    pub range: RangeArgs,
    /// Only this thread.
    #[arg(long, value_name = "TID")]
    pub tid: Option<u32>,
    /// Show calls this many levels deep at most (from the thread's outermost call, or from
    /// -F's function); 0: all.
    #[arg(long, default_value_t = 0, value_name = "LEVELS")]
    pub depth: usize,
    /// Only the calls of this function and what they call (a name as `report --callers` takes).
    #[arg(short = 'F', long, value_name = "FUNCTION")]
    pub function: Option<String>,
    /// Where to write the flow (default: standard output).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(Args)]
pub struct AnnotateArgs {
    /// `[TRACE] FUNCTION`: the function to annotate, in TRACE (default: itrace.itr, or -i).
    #[arg(value_name = "ARGS", num_args = 1..=2, required = true)]
    pub args: Vec<PathBuf>,
    /// Trace file to read, as an option (perf's -i).
    #[arg(short = 'i', long = "input", value_name = "TRACE")]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub read: ReadOptions,
    #[command(flatten)]
    pub range: RangeArgs,
    /// Only the function of this module (file name or path), when several have the name.
    #[arg(long, value_name = "MODULE")]
    pub module: Option<String>,
    /// Also show each instruction, disassembled, with its executions.
    #[arg(long)]
    pub asm: bool,
    /// Show only the lines (and instructions) with at least this percentage of the function's
    /// self instructions.
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    pub hot: Option<f64>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How a reading command prints its tables (`report`, `diff`).
#[derive(Args)]
pub struct TableOutput {
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
pub struct DiffArgs {
    /// The trace to compare against.
    #[arg(value_name = "BASE")]
    pub base: PathBuf,
    /// The trace compared with it.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    #[command(flatten)]
    pub output: TableOutput,
    #[command(flatten)]
    pub read: ReadOptions,
    /// The range of both traces compared (as `report`'s).
    #[command(flatten)]
    pub range: RangeArgs,
    /// Only this thread of each trace: TID in both, or BASE_TID:NEW_TID (a thread's id
    /// differs between runs); every total is the thread's.
    #[arg(long, value_name = "TID[:TID]", value_parser = parse_tid_pair)]
    pub tid: Option<(u32, u32)>,
    /// Only the functions of this module (file name or path); totals stay the traces'.
    #[arg(long, value_name = "MODULE")]
    pub module: Option<String>,
    /// Only the functions whose name matches this regular expression; totals stay the traces'.
    #[arg(long, value_name = "REGEX")]
    pub grep: Option<String>,
}

/// `diff --tid`: one thread id for both traces, or `BASE:NEW`.
fn parse_tid_pair(s: &str) -> Result<(u32, u32), String> {
    let tid = |t: &str| t.parse::<u32>().map_err(|_| format!("'{s}' is not a thread id, nor BASE_TID:NEW_TID"));
    match s.split_once(':') {
        Some((a, b)) => Ok((tid(a)?, tid(b)?)),
        None => tid(s).map(|t| (t, t)),
    }
}

#[derive(Args)]
pub struct FlamegraphArgs {
    #[command(flatten)]
    pub input: TraceInput,
    #[command(flatten)]
    pub range: RangeArgs,
    /// Where to write the SVG (or the folded stacks) (default: standard output).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Write the folded stacks (`main;fib;fib 1234`, flamegraph.pl's input) instead of the SVG.
    #[arg(long)]
    pub folded: bool,
    /// Leave out frames narrower than this many pixels (0 keeps all).
    #[arg(long, default_value_t = 0.1, value_name = "PIXELS", value_parser = parse_min_width)]
    pub min_width: f64,
    /// Title of the SVG (default: the trace file's name).
    #[arg(long)]
    pub title: Option<String>,
    /// A frame per thread at the root (`name-pid/tid`, as inferno's `--tid` folding): each
    /// thread's stacks apart instead of merged.
    #[arg(long)]
    pub per_thread: bool,
    /// How the SVG's frames are coloured: by function name (shades of one palette) or one
    /// colour per module.
    #[arg(long, value_enum, default_value_t = FrameColorsArg::Name, value_name = "BY")]
    pub colors: FrameColorsArg,
}

/// `flamegraph --colors` (no help per value: it would turn `flamegraph --help` into its long form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FrameColorsArg {
    Name,
    Module,
}

fn parse_min_width(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a width in pixels (0 or more)")),
    }
}

/// Formats of `itrace export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// callgrind's profile format: self instructions per function and line, calls and their
    /// inclusive instructions (kcachegrind, callgrind_annotate).
    Callgrind,
    /// A Parquet table, one row per taken branch (the arc's lines) with typed columns:
    /// thread, kind, instructions, addresses, functions, source line (DuckDB, pandas, Spark).
    Parquet,
    /// Trace Event Format JSON: call spans per thread, system calls and signals as instant
    /// events (Perfetto, chrome://tracing).
    Chrome,
    /// The Firefox Profiler's processed profile: call tree, flame graph and stack chart per
    /// thread, system calls and signals as markers (profiler.firefox.com); gzipped when the
    /// output's name ends in .gz.
    Firefox,
}

/// The time axis of the timeline exports (`--format chrome|firefox`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TimeAxisArg {
    /// Instructions each thread ran, shown as 1 us each: exact, the same on every run.
    Instructions,
    /// The recorded timestamps (wall time of the traced run), interpolated by instruction count
    /// where the backend read the clock once per 64 records (ptrace, qemu).
    Timestamps,
}

#[derive(Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub input: TraceInput,
    #[command(flatten)]
    pub range: RangeArgs,
    /// What to write.
    #[arg(short, long, value_enum)]
    pub format: ExportFormat,
    /// Where to write it (default: standard output).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Parquet: rows per row group (memory while writing grows with it, about 170 bytes a row).
    #[arg(long, value_name = "ROWS", default_value_t = itrace_post::parquet::ROWS_PER_GROUP as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub row_group_size: u64,
    /// The clock of the timeline exports (chrome, firefox).
    #[arg(long, value_enum, default_value_t = TimeAxisArg::Instructions)]
    pub time: TimeAxisArg,
    /// Chrome: merge the spans shorter than N into the span they ran in (N instructions on the
    /// instructions clock, N microseconds on the timestamps clock). Default: the smallest N (a
    /// whole number up to 4096, a power of two above) that keeps the file within --max-size
    /// (none when every span fits).
    #[arg(long, value_name = "N", conflicts_with = "all_spans",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub min_span: Option<u64>,
    /// Chrome: write every span, however large the file (a browser may not open it).
    #[arg(long)]
    pub all_spans: bool,
    /// Chrome: the size the file is kept within by merging short spans (K, M, G: powers of
    /// 1024; default 100M).
    #[arg(long, value_name = "BYTES", value_parser = crate::size::parse_size,
          conflicts_with_all = ["all_spans", "min_span"])]
    pub max_size: Option<usize>,
}

#[derive(Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub input: TraceInput,
}

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub input: TraceInput,
    /// Count by decoding every record, not from the totals the writer left in the end summary
    /// (as for files written before those totals: slower, the same answer).
    #[arg(long)]
    pub decode: bool,
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

#[derive(Args)]
pub struct CalibArgs {
    #[command(subcommand)]
    pub command: CalibCommand,
}

#[derive(Subcommand)]
pub enum CalibCommand {
    /// Build and run the trainer under itrace; write the minimum delta of every sequence and
    /// its environmental minimum (from the trace) to the calibration file.
    Train(TrainArgs),
    /// Run an instrumented program under itrace once; compare the profiler's calibrated
    /// per-function counts with the trace's. Exits 1 when an error exceeds --tolerance.
    Validate(ValidateArgs),
}

#[derive(Args)]
pub struct TrainArgs {
    /// Calibration file to write.
    #[arg(short, long, default_value = "itrace.calib")]
    pub output: PathBuf,
    /// C compiler for the trainer.
    #[arg(long, default_value = "gcc")]
    pub cc: String,
    /// Compiler flags for the trainer: use those of the programs you profile.
    #[arg(long, default_value = "-O1 -fno-omit-frame-pointer", allow_hyphen_values = true)]
    pub cflags: String,
}

#[derive(Args)]
pub struct ValidateArgs {
    /// Calibration file (from `itrace calib train`).
    #[arg(short, long, default_value = "itrace.calib")]
    pub calibration: PathBuf,
    /// Largest calibrated error allowed per function, in percent.
    #[arg(long, default_value_t = 1.0)]
    pub tolerance: f64,
    /// Check only functions called at least this often.
    #[arg(long, default_value_t = 1)]
    pub min_calls: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the profiler's reports (log-rt, log-gen) into this directory.
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
    /// Keep the trace of the run here.
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// The instrumented program and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}
