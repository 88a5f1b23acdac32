//! `itrace diff BASE NEW`: the report of each trace, compared per function
//! ([`itrace_post::diff`]), over a range and of one thread as `report` takes them, its rows
//! filtered by module and name as `report`'s.

use crate::cli::{DiffArgs, RangeArgs};
use crate::read::{build_report, grep_regex, terminal_width};
use anyhow::Result;
use itrace_post::views::Filter;
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
    pub range: RangeArgs,
    /// The thread of the base trace and of the new one.
    pub tids: Option<(u32, u32)>,
    pub module: Option<String>,
    pub grep: Option<String>,
}

/// The settings the command line asks for.
pub fn settings(a: DiffArgs) -> DiffSettings {
    DiffSettings {
        base: a.base,
        new: a.new,
        json: a.output.json,
        top: a.output.top,
        width: a.output.width.unwrap_or_else(terminal_width),
        range: a.range,
        tids: a.tid,
        module: a.module,
        grep: a.grep,
    }
}

pub fn run(s: &DiffSettings) -> Result<ExitCode> {
    let grep = grep_regex(s.grep.as_deref())?;
    let mut before = build_report(&s.base, &s.range, s.tids.map(|t| t.0))?;
    let mut after = build_report(&s.new, &s.range, s.tids.map(|t| t.1))?;
    let matches = |name: &str| grep.as_ref().is_some_and(|re| re.is_match(name));
    let name_test: Option<&dyn Fn(&str) -> bool> = if grep.is_some() { Some(&matches) } else { None };
    let filter = Filter { module: s.module.as_deref(), name: name_test, name_pattern: s.grep.as_deref() };
    before.filter(&filter);
    after.filter(&filter);
    let mut diff = itrace_post::diff::diff(
        &s.base.display().to_string(),
        &before.report,
        &s.new.display().to_string(),
        &after.report,
    );
    if let Some(range) = &before.range {
        diff.scope.push(format!("range {range} of each trace: every total is of the instructions in it"));
    }
    match s.tids {
        Some((a, b)) if a == b => diff.scope.push(format!("thread {a} only: every total is of this thread's")),
        Some((a, b)) => diff
            .scope
            .push(format!("thread {a} of the base and {b} of the new trace only: every total is of these threads'")),
        None => {}
    }
    if let Some(m) = &s.module {
        diff.scope.push(format!("only the functions of module {m}; totals stay the traces'"));
    }
    if let Some(re) = &s.grep {
        diff.scope.push(format!("only the functions whose name matches {re}; totals stay the traces'"));
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if s.json {
        diff.write_json(&mut out)?;
    } else {
        diff.write_text(&mut out, s.top, s.width)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
