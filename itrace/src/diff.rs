//! `itrace diff BASE NEW`: the report of each trace, compared per function
//! ([`itrace_post::diff`]).

use crate::cli::DiffArgs;
use crate::read::{build_report, terminal_width};
use anyhow::Result;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// What `itrace diff` is asked to do.
pub struct DiffSettings {
    pub base: PathBuf,
    pub new: PathBuf,
    pub json: bool,
    /// Rows in the text table (0: all).
    pub top: usize,
    pub width: usize,
}

/// The settings the command line asks for.
pub fn settings(a: DiffArgs) -> DiffSettings {
    DiffSettings {
        base: a.base,
        new: a.new,
        json: a.output.json,
        top: a.output.top,
        width: a.output.width.unwrap_or_else(terminal_width),
    }
}

pub fn run(s: &DiffSettings) -> Result<ExitCode> {
    let before = build_report(&s.base)?;
    let after = build_report(&s.new)?;
    let diff = itrace_post::diff::diff(&s.base.display().to_string(), &before, &s.new.display().to_string(), &after);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if s.json {
        diff.write_json(&mut out)?;
    } else {
        diff.write_text(&mut out, s.top, s.width)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
