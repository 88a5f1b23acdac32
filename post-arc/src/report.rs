//! `itrace report`: instructions (self and inclusive) and calls per
//! function, instructions per module and per thread.
//!
//! Inclusive counts come from the call stacks of [`crate::stacks`].

use crate::names::printable;
use crate::stacks::{self, Collect};
use crate::summary::Aggregate;
use crate::{PostError, Trace};
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;

/// One function's totals.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionRow {
    pub name: String,
    pub module: String,
    #[serde(rename = "self")]
    pub self_instructions: u64,
    pub inclusive: u64,
    pub calls: u64,
}

/// One module's total.
#[derive(Clone, Debug, Serialize)]
pub struct ModuleRow {
    pub module: String,
    #[serde(rename = "self")]
    pub self_instructions: u64,
}

/// One thread's totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadRow {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    pub instructions: u64,
    pub branches: u64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Where the trace came from (absent for a trace recorded without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<crate::origin::Origin>,
    pub arch: String,
    pub mode: String,
    pub step_method: String,
    pub total_instructions: u64,
    pub total_branches: u64,
    pub lost_records: u64,
    /// Threads whose call stack was cut where a damaged chunk was skipped (absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub stacks_cut_at_gaps: u64,
    pub functions: Vec<FunctionRow>,
    pub modules: Vec<ModuleRow>,
    pub threads: Vec<ThreadRow>,
    /// Warnings and hints about the names (changed or missing files, stripped modules), one
    /// line each starting with `warning:` or `hint:`.
    pub notes: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Build the report of `trace`.
pub fn build(trace: &Trace, progress: &mut dyn FnMut(u64)) -> Result<Report, PostError> {
    let (sink, names, res) = stacks::build(trace, Collect::default(), progress)?;
    Ok(from_aggregate(trace, &Aggregate::from_stacks(&sink, &names, &res)))
}

/// The report of an aggregate of `trace` (replayed, or read from its summary).
pub(crate) fn from_aggregate(trace: &Trace, agg: &Aggregate) -> Report {
    let mut functions: Vec<FunctionRow> = agg
        .funcs
        .iter()
        .filter(|f| f.stats.self_instructions > 0 || f.stats.calls > 0 || f.stats.inclusive > 0)
        .map(|f| FunctionRow {
            name: f.name.clone(),
            module: f.module.clone(),
            self_instructions: f.stats.self_instructions,
            inclusive: f.stats.inclusive,
            calls: f.stats.calls,
        })
        .collect();
    functions.sort_by(|a, b| b.self_instructions.cmp(&a.self_instructions).then(a.name.cmp(&b.name)));
    let mut modules: HashMap<&str, u64> = HashMap::new();
    for f in &functions {
        *modules.entry(&f.module).or_default() += f.self_instructions;
    }
    let mut modules: Vec<ModuleRow> =
        modules.into_iter().map(|(m, n)| ModuleRow { module: m.to_string(), self_instructions: n }).collect();
    modules.sort_by(|a, b| b.self_instructions.cmp(&a.self_instructions).then(a.module.cmp(&b.module)));
    let threads = agg.threads.clone();
    let h = trace.header();
    let lost = match trace.summary() {
        Some(s) => crate::summary_lost(s).max(agg.lost),
        None => agg.lost,
    };
    Report {
        recorded: crate::origin::origin(trace),
        arch: h.arch.to_string(),
        mode: h.mode.to_string(),
        step_method: h.step_method.to_string(),
        total_instructions: threads.iter().map(|t| t.instructions).sum(),
        total_branches: agg.total_branches,
        lost_records: lost,
        stacks_cut_at_gaps: agg.cut_at_gaps,
        functions,
        modules,
        threads,
        notes: agg.notes.clone(),
    }
}

impl Report {
    /// JSON, for machines.
    pub fn write_json(&self, out: &mut dyn Write) -> Result<(), PostError> {
        serde_json::to_writer_pretty(&mut *out, self).map_err(std::io::Error::from)?;
        writeln!(out)?;
        Ok(())
    }

    /// Text tables, fitted to `opts.width` columns, `opts.top` rows each (0: all). A cut
    /// table says how many rows it left out; names too long for their column end in `…`,
    /// control characters in names are written as escapes (the JSON report has them whole).
    pub fn write_text(&self, out: &mut dyn Write, opts: &TextOptions) -> Result<(), PostError> {
        self.write_text_ordered(out, opts, "self instructions")
    }

    /// Where the trace came from, one line, when the trace says.
    pub(crate) fn write_origin(&self, out: &mut dyn Write) -> Result<(), PostError> {
        if let Some(o) = &self.recorded {
            writeln!(out, "{}", crate::names::printable(&o.line()))?;
        }
        Ok(())
    }

    /// [`Self::write_text`], the function table's title saying it is sorted `by`.
    pub(crate) fn write_text_ordered(
        &self,
        out: &mut dyn Write,
        opts: &TextOptions,
        by: &str,
    ) -> Result<(), PostError> {
        self.write_origin(out)?;
        writeln!(
            out,
            "{} instructions, {} taken branches, {} records lost ({} trace, {} mode, {})",
            self.total_instructions, self.total_branches, self.lost_records, self.arch, self.mode, self.step_method
        )?;
        let pct =
            |n: u64| if self.total_instructions == 0 { 0.0 } else { 100.0 * n as f64 / self.total_instructions as f64 };
        let shown = |n: usize| if opts.top == 0 { n } else { n.min(opts.top) };
        let more = |out: &mut dyn Write, total: usize, what: &str| -> std::io::Result<()> {
            let left = total - shown(total);
            let plural = if left == 1 { "" } else { "s" };
            if left > 0 {
                writeln!(out, "{:>12} ... {left} more {what}{plural} (--top 0 for all)", "")?;
            }
            Ok(())
        };

        // self(12) %(6) inclusive(12) calls(9), single spaces, then two before each name column.
        const NUMBERS: usize = 12 + 1 + 6 + 1 + 12 + 1 + 9;
        let rows = &self.functions[..shown(self.functions.len())];
        // The columns share what the numbers leave; a name gets at least 12, a module 6.
        let room = opts.width.saturating_sub(NUMBERS + 2 + 2).max(18);
        let longest_module = rows.iter().map(|f| printable(basename(&f.module)).chars().count()).max().unwrap_or(0);
        let longest_name = rows.iter().map(|f| printable(&f.name).chars().count()).max().unwrap_or(0).max(8);
        let module_w = longest_module.clamp(6, 20).min(room - 12);
        let name_w = longest_name.min(room - module_w);
        writeln!(out, "\nFunctions (by {by})")?;
        writeln!(out, "{:>12} {:>6} {:>12} {:>9}  {:<name_w$}  module", "self", "%", "inclusive", "calls", "function")?;
        for f in rows {
            writeln!(
                out,
                "{:>12} {:>6.2} {:>12} {:>9}  {:<name_w$}  {}",
                f.self_instructions,
                pct(f.self_instructions),
                f.inclusive,
                f.calls,
                fit(&printable(&f.name), name_w),
                fit(&printable(basename(&f.module)), module_w)
            )?;
        }
        more(out, self.functions.len(), "function")?;

        let path_w = opts.width.saturating_sub(12 + 1 + 6 + 2).max(24);
        writeln!(out, "\nModules")?;
        writeln!(out, "{:>12} {:>6}  module", "self", "%")?;
        for m in &self.modules[..shown(self.modules.len())] {
            writeln!(
                out,
                "{:>12} {:>6.2}  {}",
                m.self_instructions,
                pct(m.self_instructions),
                fit_tail(&printable(&m.module), path_w)
            )?;
        }
        more(out, self.modules.len(), "module")?;

        writeln!(out, "\nThreads")?;
        writeln!(out, "{:>8} {:>8} {:>12} {:>10}  name", "pid", "tid", "instructions", "branches")?;
        for t in &self.threads[..shown(self.threads.len())] {
            writeln!(
                out,
                "{:>8} {:>8} {:>12} {:>10}  {}",
                t.pid,
                t.tid,
                t.instructions,
                t.branches,
                printable(&t.name)
            )?;
        }
        more(out, self.threads.len(), "thread")?;
        Ok(())
    }
}

/// How the text report is laid out.
#[derive(Clone, Copy, Debug)]
pub struct TextOptions {
    /// Rows per table (0: all).
    pub top: usize,
    /// Columns to fit in.
    pub width: usize,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions { top: 40, width: 120 }
    }
}

/// A module's file name (the Modules table and the JSON keep the path).
pub(crate) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `s` cut to `width` characters, ending in `…` when cut.
pub(crate) fn fit(s: &str, width: usize) -> std::borrow::Cow<'_, str> {
    if s.chars().count() <= width {
        return s.into();
    }
    let mut cut: String = s.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut.into()
}

/// `s` cut to `width` characters from the left, starting with `…` when cut (a path's end
/// says the most).
fn fit_tail(s: &str, width: usize) -> std::borrow::Cow<'_, str> {
    let n = s.chars().count();
    if n <= width {
        return s.into();
    }
    let tail: String = s.chars().skip(n - width.saturating_sub(1)).collect();
    format!("…{tail}").into()
}
