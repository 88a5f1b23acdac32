//! The commands that read a trace: `itrace arc` and `itrace report`, and what every reader
//! shares (opening a trace, progress on a terminal, the truncation warning).

use crate::cli::{ArcArgs, ArchiveArgs, ReportArgs, TraceInput};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

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
    print_notes(&stats.notes);
    if let Some(p) = output {
        eprintln!("itrace: wrote {} ({} lines)", p.display(), stats.lines);
    }
    Ok(())
}

pub fn archive(args: ArchiveArgs) -> Result<ExitCode> {
    let path = args.input.path();
    let trace = open_trace(&path)?;
    let stats =
        itrace_post::archive::write_archive(&trace).with_context(|| format!("cannot archive {}", path.display()))?;
    print_notes(&stats.notes);
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
    let report = build_report(&args.input.path())?;
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::new(stdout);
    if args.output.json {
        report.write_json(&mut out)?;
    } else {
        let width = args.output.width.unwrap_or_else(terminal_width);
        report.write_text(&mut out, &itrace_post::report::TextOptions { top: args.output.top, width })?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The report of the trace at `path`, its warnings and notes said on stderr.
pub fn build_report(path: &Path) -> Result<itrace_post::report::Report> {
    let trace = open_trace(path)?;
    let pb = progress(trace.trace_bytes());
    let report = itrace_post::report::build(&trace, &mut |done| pb.set_position(done))
        .with_context(|| format!("cannot read {}", path.display()))?;
    pb.finish_and_clear();
    warn_truncated(&trace);
    print_notes(&report.notes);
    Ok(report)
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
pub fn terminal_width() -> usize {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes a winsize into ws, a valid and exclusively borrowed struct.
    let on_tty = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0;
    if on_tty {
        return ws.ws_col as usize;
    }
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|&c: &usize| c > 0).unwrap_or(120)
}

/// Warnings and hints about the names in the output (stripped, changed or missing files).
fn print_notes(notes: &[String]) {
    for n in notes {
        eprintln!("itrace: {n}");
    }
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
