//! The commands that read a trace: `itrace arc`, `report`, `flamegraph` and `export`, and what
//! every reader shares (opening a trace, progress on a terminal, the truncation warning).

use crate::cli::{
    AnnotateArgs, ArcArgs, ArchiveArgs, ExportArgs, ExportFormat, FlamegraphArgs, FrameColorsArg, RangeArgs,
    ReplayArgs, ReportArgs, SortArg, TimeAxisArg, TraceInput,
};
use anyhow::{bail, Context, Result};
use itrace_post::PostError;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// A progress bar on a terminal for reads of traces that take a second or more; hidden otherwise.
pub fn progress(total: u64) -> indicatif::ProgressBar {
    itrace_post::progress::read_bar("reading", total)
}

pub fn arc(args: ArcArgs) -> Result<ExitCode> {
    write_arc(&args.input.path(), args.output.as_deref(), &args.range)?;
    Ok(ExitCode::SUCCESS)
}

/// The arc file of `trace` (over `range`), into `output` (with a line saying so) or onto stdout.
pub fn write_arc(trace_path: &Path, output: Option<&Path>, range: &RangeArgs) -> Result<()> {
    let trace = open_ranged(trace_path, range)?;
    let pb = progress(trace.trace_bytes());
    let out = create_output(output)?;
    let stats = itrace_post::arc::write_arc(&trace, out, &mut |done| pb.set_position(done))
        .with_context(|| format!("cannot write the arc of {}", trace_path.display()))?;
    pb.finish_and_clear();
    warn_truncated(&trace);
    print_notes(&trace, &stats.notes);
    if let Some(p) = output {
        eprintln!("itrace: wrote {} ({} lines)", p.display(), stats.lines);
    }
    Ok(())
}

/// `output` opened for writing (buffered), or standard output.
fn create_output(output: Option<&Path>) -> Result<std::io::BufWriter<Box<dyn Write>>> {
    let out: Box<dyn Write> = match output {
        Some(p) => Box::new(std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    Ok(std::io::BufWriter::with_capacity(1 << 16, out))
}

/// Read the open `trace` with `read`, with a progress bar on a terminal; then warn if it was
/// cut short.
fn read_trace<T>(
    trace: &itrace_post::Trace,
    read: impl FnOnce(&itrace_post::Trace, &mut dyn FnMut(u64)) -> Result<T, itrace_post::PostError>,
) -> Result<T> {
    let pb = progress(trace.trace_bytes());
    let result = read(trace, &mut |done| pb.set_position(done)).map_err(|e| match e {
        // About what was asked for, not about reading the file: in its own words.
        PostError::NoSuchFunction(_)
        | PostError::NamesGone { .. }
        | PostError::NoSuchThread(_)
        | PostError::Name(_)
        | PostError::CodeUnreadable { .. } => anyhow::Error::new(e),
        e => anyhow::Error::new(e).context(format!("cannot read {}", trace.path().display())),
    })?;
    pb.finish_and_clear();
    warn_truncated(trace);
    Ok(result)
}

pub fn flamegraph(args: FlamegraphArgs) -> Result<ExitCode> {
    let path = args.input.path();
    let trace = open_ranged(&path, &args.range)?;
    let folded = read_trace(&trace, |trace, progress| {
        // The index holds the stacks of all threads merged, not per thread.
        if args.per_thread || NO_INDEX.load(std::sync::atomic::Ordering::Relaxed) {
            itrace_post::flame::folded(trace, args.per_thread, progress)
        } else {
            itrace_post::flame::folded_summarized(trace, progress)
        }
    })?;
    print_notes(&trace, &folded.notes);
    if folded.stack_count() == 0 {
        eprintln!("itrace: note: {} holds no instructions: the flame graph is empty", path.display());
    }
    let mut out = create_output(args.output.as_deref())?;
    let written = if args.folded {
        folded.write_text(&mut out)
    } else {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let title = args.title.unwrap_or_else(|| format!("{name}: instructions per call stack"));
        let colors = match args.colors {
            FrameColorsArg::Name => itrace_post::flame::FrameColors::Name,
            FrameColorsArg::Module => itrace_post::flame::FrameColors::Module,
        };
        folded.write_svg(&title, args.min_width, colors, &mut out)
    };
    written.and_then(|()| Ok(out.flush()?)).context("cannot write the flame graph")?;
    if let Some(p) = &args.output {
        eprintln!(
            "itrace: wrote {} ({} stacks, {} instructions)",
            p.display(),
            folded.stack_count(),
            folded.total_instructions
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn export(args: ExportArgs) -> Result<ExitCode> {
    if args.format != ExportFormat::Chrome && (args.all_spans || args.min_span.is_some() || args.max_size.is_some()) {
        bail!("--all-spans, --min-span and --max-size are for --format chrome");
    }
    if args.format == ExportFormat::Parquet {
        return export_parquet(args);
    }
    let trace = open_ranged(&args.input.path(), &args.range)?;
    if matches!(args.format, ExportFormat::Chrome | ExportFormat::Firefox) {
        return export_timeline(&args, &trace);
    }
    let mut out = create_output(args.output.as_deref())?;
    let stats = read_trace(&trace, |trace, progress| match args.format {
        ExportFormat::Callgrind => itrace_post::callgrind::write_callgrind(trace, &mut out, progress),
        ExportFormat::Parquet | ExportFormat::Chrome | ExportFormat::Firefox => {
            unreachable!("parquet and timelines are written above")
        }
    })?;
    print_notes(&trace, &stats.notes);
    if let Some(p) = &args.output {
        eprintln!(
            "itrace: wrote {} ({} functions, {} instructions)",
            p.display(),
            stats.functions,
            stats.total_instructions
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `itrace export --format parquet`: a binary file, to `-o FILE` or a pipe (never a terminal).
fn export_parquet(args: ExportArgs) -> Result<ExitCode> {
    use std::io::IsTerminal;
    let trace = open_ranged(&args.input.path(), &args.range)?;
    let out: Box<dyn Write + Send> = match &args.output {
        Some(p) => Box::new(std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?),
        None if std::io::stdout().is_terminal() => {
            bail!("a Parquet file is binary: name it with -o FILE, or redirect standard output")
        }
        None => Box::new(std::io::stdout()),
    };
    let out = std::io::BufWriter::with_capacity(1 << 16, out);
    let rows_per_group = usize::try_from(args.row_group_size).unwrap_or(usize::MAX);
    let stats = read_trace(&trace, |trace, progress| {
        itrace_post::parquet::write_parquet(trace, out, rows_per_group, progress)
    })?;
    print_notes(&trace, &stats.notes);
    if stats.calls_without_row > 0 {
        eprintln!(
            "itrace: note: {} of the report's calls have no row with a call_kind (counted where no row was written, \
             as a PLT call whose target was never seen closed at the end of the trace, or a second one at a row)",
            stats.calls_without_row
        );
    }
    if let Some(p) = &args.output {
        let ends = stats.rows - stats.branches;
        eprintln!(
            "itrace: wrote {} ({} rows: {} taken branches, {ends} unfinished last block{} of threads; {} instructions)",
            p.display(),
            stats.rows,
            stats.branches,
            if ends == 1 { "" } else { "s" },
            stats.instructions
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `itrace export --format chrome|firefox`: a timeline of call spans per thread.
fn export_timeline(args: &ExportArgs, trace: &itrace_post::Trace) -> Result<ExitCode> {
    use itrace_post::timeline::{SpanSelection, TimeAxis, TimelineFormat};
    let format = match args.format {
        ExportFormat::Firefox => {
            let gzip = args.output.as_deref().is_some_and(|p| p.extension().is_some_and(|e| e == "gz"));
            TimelineFormat::Firefox { gzip }
        }
        _ => TimelineFormat::Chrome,
    };
    let axis = match args.time {
        TimeAxisArg::Instructions => TimeAxis::Instructions,
        TimeAxisArg::Timestamps => TimeAxis::Timestamps,
    };
    let max_bytes = args.max_size.map_or(itrace_post::timeline::CHROME_MAX_BYTES, |b| b as u64);
    let spans = if args.all_spans {
        SpanSelection::All
    } else if let Some(n) = args.min_span {
        SpanSelection::MinSpan(n)
    } else {
        SpanSelection::MaxBytes(max_bytes)
    };
    let mut out = create_output(args.output.as_deref())?;
    let stats = read_trace(trace, |trace, progress| {
        itrace_post::timeline::write_timeline(trace, format, axis, spans, &mut out, progress)
    })?;
    out.flush().context("cannot write the timeline")?;
    print_notes(trace, &stats.notes);
    if stats.min_span > 0 {
        let unit = match axis {
            TimeAxis::Instructions => "instructions",
            TimeAxis::Timestamps => "us",
        };
        eprintln!(
            "itrace: note: {} spans shorter than {} {unit} were merged into the spans they ran in ({} instructions \
             ran in them){}; --all-spans writes every span",
            stats.merged_spans,
            stats.min_span,
            stats.merged_instructions,
            if args.min_span.is_some() {
                String::new()
            } else {
                format!(", to keep the file within {} (--max-size)", crate::size::human_size(max_bytes))
            }
        );
    }
    if let Some(p) = &args.output {
        eprintln!(
            "itrace: wrote {} ({} threads, {} spans, {} markers, {} instructions)",
            p.display(),
            stats.threads,
            stats.spans,
            stats.markers,
            stats.total_instructions
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn archive(args: ArchiveArgs) -> Result<ExitCode> {
    let path = args.input.path();
    let trace = open_trace(&path)?;
    let stats =
        itrace_post::archive::write_archive(&trace).with_context(|| format!("cannot archive {}", path.display()))?;
    print_notes(&trace, &stats.notes);
    let dir = itrace_post::archive::archive_dir(&path);
    eprintln!(
        "itrace: archived {} files ({} bytes, {} already there) in {}; keep it next to {} (e.g. tar cf t.tar {} {})",
        stats.files,
        stats.bytes,
        stats.kept,
        dir.display(),
        path.display(),
        path.display(),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn report(args: ReportArgs) -> Result<ExitCode> {
    use itrace_post::views::{Filter, SortKey, TreeLimits, ViewOptions};
    let v = &args.views;
    let grep = grep_regex(v.grep.as_deref())?;
    let path = args.input.path();
    let trace = open_ranged(&path, &args.range)?;
    let opts = ViewOptions { tid: v.tid, tree: v.tree, callers: v.callers.clone(), callees: v.callees.clone() };
    let mut report = read_trace(&trace, |trace, progress| build_views(trace, &opts, progress))?;
    print_notes(&trace, &report.report.notes);
    let matches = |name: &str| grep.as_ref().is_some_and(|re| re.is_match(name));
    let name_test: Option<&dyn Fn(&str) -> bool> = if grep.is_some() { Some(&matches) } else { None };
    report.filter(&Filter { module: v.module.as_deref(), name: name_test, name_pattern: v.grep.as_deref() });
    report.sort(match v.sort {
        SortArg::SelfInstructions => SortKey::SelfInstructions,
        SortArg::Inclusive => SortKey::Inclusive,
        SortArg::Calls => SortKey::Calls,
        SortArg::Name => SortKey::Name,
    });
    let limits = TreeLimits { min_percent: v.min_percent, depth: v.depth };
    let pruned = report.prune_tree(limits);
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::new(stdout);
    if args.output.json {
        report.write_json(&mut out)?;
    } else {
        let width = args.output.width.unwrap_or_else(terminal_width);
        let text = itrace_post::report::TextOptions { top: args.output.top, width };
        report.write_text(&mut out, &text, limits, pruned)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `--grep RE` compiled; a one-line error when it is not a regular expression.
pub fn grep_regex(re: Option<&str>) -> Result<Option<regex::Regex>> {
    let Some(re) = re else { return Ok(None) };
    regex::Regex::new(re).map(Some).map_err(|e| {
        // regex's message draws the pattern over lines: its last line says what is wrong.
        let text = e.to_string();
        let why = text.lines().last().unwrap_or_default().trim_start_matches("error: ").to_string();
        anyhow::anyhow!("--grep {re:?} is not a regular expression: {why}")
    })
}

/// `itrace replay`: the call flow, streamed to the output.
pub fn replay(args: ReplayArgs) -> Result<ExitCode> {
    let path = args.input.path();
    let trace = open_ranged(&path, &args.range)?;
    let opts = itrace_post::callflow::FlowOptions { tid: args.tid, depth: args.depth, function: args.function.clone() };
    let mut out = create_output(args.output.as_deref())?;
    let stats =
        read_trace(&trace, |trace, progress| itrace_post::callflow::write_call_flow(trace, &opts, &mut out, progress))?;
    out.flush().context("cannot write the call flow")?;
    print_notes(&trace, &stats.notes);
    if let Some(p) = &args.output {
        eprintln!("itrace: wrote {} ({} calls, {} instructions)", p.display(), stats.calls, stats.total_instructions);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn annotate(args: AnnotateArgs) -> Result<ExitCode> {
    let (path, function) = match args.args.as_slice() {
        [function] => (args.input.clone().unwrap_or_else(|| TraceInput::DEFAULT.into()), function),
        [_, _] if args.input.is_some() => bail!("annotate takes one trace: TRACE or -i TRACE, not both"),
        [trace, function] => (trace.clone(), function),
        _ => bail!("annotate needs a function name: itrace annotate [TRACE] FUNCTION"),
    };
    let function = function.to_string_lossy();
    let trace = open_ranged(&path, &args.range)?;
    let module = args.module.as_deref();
    let mut annotation =
        read_trace(&trace, |trace, progress| itrace_post::annotate::annotate(trace, &function, module, progress))?;
    if let Some(hot) = args.hot {
        annotation.retain_hot(hot);
    }
    print_notes(&trace, &annotation.notes);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        annotation.write_json(&mut out)?;
    } else {
        annotation.write_text(&mut out, args.asm)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The report of the trace at `path` over `range`, of thread `tid` alone when given (as
/// `report --tid`), its warnings and notes said on stderr.
pub fn build_report(path: &Path, range: &RangeArgs, tid: Option<u32>) -> Result<itrace_post::views::Views> {
    let trace = open_ranged(path, range)?;
    let opts = itrace_post::views::ViewOptions { tid, ..Default::default() };
    let views =
        read_trace(&trace, |trace, progress| build_views(trace, &opts, progress)).with_context(|| match tid {
            Some(_) => format!("in {}", path.display()),
            None => format!("cannot read {}", path.display()),
        })?;
    print_notes(&trace, &views.report.notes);
    Ok(views)
}

/// The report's views of `trace`: from the index beside it when it answers (see
/// `itrace_post::summary`), else replayed (and the index written); replayed alone with `--no-index`.
fn build_views(
    trace: &itrace_post::Trace,
    opts: &itrace_post::views::ViewOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<itrace_post::views::Views, PostError> {
    if NO_INDEX.load(std::sync::atomic::Ordering::Relaxed) {
        itrace_post::views::build(trace, opts, progress)
    } else {
        itrace_post::views::build_summarized(trace, opts, progress)
    }
}

/// `--no-index`: replay every time, write no index.
static NO_INDEX: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set once from the command line, before any trace is read.
pub fn set_no_index(no_index: bool) {
    NO_INDEX.store(no_index, std::sync::atomic::Ordering::Relaxed);
}

/// `--strict`: readers refuse a damaged chunk instead of skipping it.
static STRICT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set once from the command line, before any trace is opened.
pub fn set_strict(strict: bool) {
    STRICT.store(strict, std::sync::atomic::Ordering::Relaxed);
}

/// Open a trace for reading; a missing default file gets a hint. Damaged chunks are skipped
/// (one warning says what was lost, see [`warn_truncated`]), or refused with `--strict`.
pub fn open_trace(path: &Path) -> Result<itrace_post::Trace> {
    if path == Path::new(TraceInput::DEFAULT) && !path.exists() {
        bail!("no trace file {} here: name one, or record one with `itrace record`", path.display());
    }
    let open =
        if STRICT.load(std::sync::atomic::Ordering::Relaxed) { itrace_post::open_strict } else { itrace_post::open };
    open(path).map_err(|e| naming(e, path))
}

/// [`open_trace`], read over `range` by every view.
pub fn open_ranged(path: &Path, range: &RangeArgs) -> Result<itrace_post::Trace> {
    let range = range.range().map_err(anyhow::Error::msg)?;
    Ok(open_trace(path)?.with_range(range))
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
pub fn terminal_width() -> usize {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes a winsize into ws, a valid and exclusively borrowed struct.
    let on_tty = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0;
    if on_tty {
        return ws.ws_col as usize;
    }
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|&c: &usize| c > 0).unwrap_or(120)
}

/// The one line that says where a trace is damaged and what the skipped chunks held.
pub fn damage_warning(trace: &itrace_post::Trace) -> Option<String> {
    let damage = trace.damage();
    let first = damage.first()?;
    let where_ = |d: &itrace_format::Damage| {
        let stream = match d.stream {
            Some(itrace_format::STREAM_MTE) => "the module table".to_string(),
            Some(itrace_format::STREAM_END) => "the end summary".to_string(),
            Some(cpu) => format!("stream {cpu}"),
            None => "stream unknown".to_string(),
        };
        format!("{} bytes at {:#x} ({stream})", d.len, d.offset)
    };
    let chunks: Option<u32> = damage.iter().try_fold(0u32, |n, d| Some(n.saturating_add(d.chunks?)));
    let chunks = chunks.map_or_else(|| "chunks".to_string(), |n| format!("{n} chunk{}", if n == 1 { "" } else { "s" }));
    let mut places = where_(first);
    if damage.len() > 1 {
        places += &format!(
            " and {} more stretch{} (`itrace info` lists them)",
            damage.len() - 1,
            if damage.len() == 2 { "" } else { "es" }
        );
    }
    let loss = trace.damage_loss();
    let count = |n: Option<u64>| n.map_or_else(|| "unknown".to_string(), |n| n.to_string());
    let lost = if trace.summary().is_none() {
        "records and instructions unknown (no end summary to count them by; chunks hold no counts)".to_string()
    } else {
        let mut lost = format!("{} records and {} instructions", count(loss.records), count(loss.instructions));
        if loss.mte_records.is_some_and(|n| n > 0) {
            lost += &format!(", {} module-table records", count(loss.mte_records));
        }
        lost + " (by the end summary's counts)"
    };
    Some(format!(
        "itrace: warning: {} is damaged: {chunks} skipped, {places}; lost there: {lost}; call stacks \
         restart after the gap (--strict refuses the file)",
        trace.path().display()
    ))
}

/// Warnings and hints about the names in the output (stripped, changed or missing files), on
/// stderr. Warnings are said every time; a hint once per trace (see [`crate::hints`]), and never
/// with `--quiet`.
fn print_notes(trace: &itrace_post::Trace, notes: &[String]) {
    let mut hints = crate::hints::Shown::load(trace.path());
    for n in notes {
        if n.starts_with("hint:") && (QUIET.load(std::sync::atomic::Ordering::Relaxed) || !hints.first_time(n)) {
            continue;
        }
        eprintln!("itrace: {n}");
    }
    hints.save();
}

/// `--quiet`: readers print no hints.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set once from the command line, before any trace is read.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// Tell the user when a trace was damaged (one line: where, and what was lost) or cut short
/// (records up to the cut were used).
pub fn warn_truncated(trace: &itrace_post::Trace) {
    if let Some(line) = damage_warning(trace) {
        eprintln!("{line}");
    }
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
