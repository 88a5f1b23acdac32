//! `itrace diff`: two reports side by side, per function: self, inclusive and calls before,
//! after, and the change, sorted by the size of the change (self, then inclusive).
//!
//! Functions are matched by name and module file name, not by address: the two traces may
//! come from two builds of a program (a rebuilt binary's functions move) or two paths of one
//! library. Rows of one key (a function in several processes) are summed. A function in only
//! one trace is `added` or `removed`; its other side counts as zero in the change.
//!
//! The relative change of self and inclusive instructions is the change as a percentage of
//! the before side; a function new in the after trace shows `new`, one gone from it `gone`.

use crate::names::printable;
use crate::report::{basename, fit, FunctionRow, Report};
use crate::PostError;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

/// One function's counts in one trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    #[serde(rename = "self")]
    pub self_instructions: u64,
    pub inclusive: u64,
    pub calls: u64,
}

/// After minus before (a missing side is zero).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Change {
    #[serde(rename = "self")]
    pub self_instructions: i64,
    pub inclusive: i64,
    pub calls: i64,
}

/// The change as a percentage of the before side, where it has one (not 0, not missing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RelativeChange {
    #[serde(rename = "self")]
    pub self_instructions: Option<f64>,
    pub inclusive: Option<f64>,
}

/// Whether a function is in both traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Both,
    Added,
    Removed,
}

/// One function of either trace.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionDiff {
    pub name: String,
    /// The module's file name (the match key; the paths may differ).
    pub module: String,
    pub status: Status,
    pub before: Option<Counts>,
    pub after: Option<Counts>,
    pub change: Change,
    /// `change` in percent of `before` (null where before is 0 or missing).
    pub relative: RelativeChange,
}

/// One trace's totals.
#[derive(Clone, Debug, Serialize)]
pub struct Totals {
    pub trace: String,
    pub total_instructions: u64,
    pub total_branches: u64,
    pub lost_records: u64,
}

/// The whole diff.
#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub before: Totals,
    pub after: Totals,
    pub change_instructions: i64,
    pub functions: Vec<FunctionDiff>,
    /// What the diff is limited to (thread, range, module, name), one line each (text only).
    #[serde(skip)]
    pub scope: Vec<String>,
}

/// `after - before` as a signed count (saturating at i64's range, which no trace reaches).
fn delta(before: u64, after: u64) -> i64 {
    if after >= before {
        i64::try_from(after - before).unwrap_or(i64::MAX)
    } else {
        i64::try_from(before - after).map(|d| -d).unwrap_or(i64::MIN)
    }
}

/// Counts per (module file name, function name), summed over the rows of one key.
fn by_key(functions: &[FunctionRow]) -> BTreeMap<(String, String), Counts> {
    let mut m: BTreeMap<(String, String), Counts> = BTreeMap::new();
    for f in functions {
        let c = m.entry((basename(&f.module).to_string(), f.name.clone())).or_default();
        c.self_instructions += f.self_instructions;
        c.inclusive += f.inclusive;
        c.calls += f.calls;
    }
    m
}

fn totals(trace: &str, r: &Report) -> Totals {
    Totals {
        trace: trace.to_string(),
        total_instructions: r.total_instructions,
        total_branches: r.total_branches,
        lost_records: r.lost_records,
    }
}

/// The diff of two reports, `before` from the trace named `before_name`, `after` likewise.
pub fn diff(before_name: &str, before: &Report, after_name: &str, after: &Report) -> Diff {
    let mut old = by_key(&before.functions);
    let new = by_key(&after.functions);
    let mut functions = Vec::with_capacity(old.len().max(new.len()));
    for ((module, name), a) in new {
        let b = old.remove(&(module.clone(), name.clone()));
        let status = if b.is_some() { Status::Both } else { Status::Added };
        functions.push(FunctionDiff {
            name,
            module,
            status,
            before: b,
            after: Some(a),
            change: Change::default(),
            relative: RelativeChange::default(),
        });
    }
    for ((module, name), b) in old {
        functions.push(FunctionDiff {
            name,
            module,
            status: Status::Removed,
            before: Some(b),
            after: None,
            change: Change::default(),
            relative: RelativeChange::default(),
        });
    }
    for f in &mut functions {
        let b = f.before.unwrap_or_default();
        let a = f.after.unwrap_or_default();
        f.change = Change {
            self_instructions: delta(b.self_instructions, a.self_instructions),
            inclusive: delta(b.inclusive, a.inclusive),
            calls: delta(b.calls, a.calls),
        };
        let relative = |before: u64, change: i64| (before > 0).then(|| 100.0 * change as f64 / before as f64);
        f.relative = RelativeChange {
            self_instructions: relative(b.self_instructions, f.change.self_instructions),
            inclusive: relative(b.inclusive, f.change.inclusive),
        };
    }
    functions.sort_by(|x, y| {
        y.change
            .self_instructions
            .unsigned_abs()
            .cmp(&x.change.self_instructions.unsigned_abs())
            .then(y.change.inclusive.unsigned_abs().cmp(&x.change.inclusive.unsigned_abs()))
            .then(y.change.calls.unsigned_abs().cmp(&x.change.calls.unsigned_abs()))
            .then_with(|| x.name.cmp(&y.name))
            .then_with(|| x.module.cmp(&y.module))
    });
    Diff {
        before: totals(before_name, before),
        after: totals(after_name, after),
        change_instructions: delta(before.total_instructions, after.total_instructions),
        functions,
        scope: Vec::new(),
    }
}

/// A relative change as the text shows it: `+12.5%`, `new` for a function only in the after
/// trace, `gone` for one only in the before trace, `-` from a before side of 0.
fn relative(f: &FunctionDiff, pct: Option<f64>) -> String {
    match (f.status, pct) {
        (Status::Added, _) => "new".to_string(),
        (Status::Removed, _) => "gone".to_string(),
        (Status::Both, Some(p)) => format!("{p:+.1}%"),
        (Status::Both, None) => "-".to_string(),
    }
}

/// A count of one side: `-` where the function is not in that trace.
fn side(c: Option<Counts>, field: fn(&Counts) -> u64) -> String {
    c.map_or_else(|| "-".to_string(), |c| field(&c).to_string())
}

impl Diff {
    /// JSON, for machines.
    pub fn write_json(&self, out: &mut dyn Write) -> Result<(), PostError> {
        serde_json::to_writer_pretty(&mut *out, self).map_err(std::io::Error::from)?;
        writeln!(out)?;
        Ok(())
    }

    /// A header line with both totals, then one row per function: self, inclusive and calls
    /// before, after and change (`-` for the side a function is missing from), `top` rows
    /// (0: all), names fitted to `width` columns.
    pub fn write_text(&self, out: &mut dyn Write, top: usize, width: usize) -> Result<(), PostError> {
        writeln!(
            out,
            "{}: {} instructions, {} taken branches, {} records lost; {}: {} instructions, {} taken branches, {} records lost; change {:+} instructions",
            printable(&self.before.trace),
            self.before.total_instructions,
            self.before.total_branches,
            self.before.lost_records,
            printable(&self.after.trace),
            self.after.total_instructions,
            self.after.total_branches,
            self.after.lost_records,
            self.change_instructions
        )?;
        for line in &self.scope {
            writeln!(out, "{}", printable(line))?;
        }
        let shown = if top == 0 { self.functions.len() } else { self.functions.len().min(top) };
        let rows = &self.functions[..shown];
        // Eleven number columns in three groups, each as wide as its widest entry or heading.
        let cells: Vec<[String; 11]> = rows
            .iter()
            .map(|f| {
                [
                    side(f.before, |c| c.self_instructions),
                    side(f.after, |c| c.self_instructions),
                    format!("{:+}", f.change.self_instructions),
                    relative(f, f.relative.self_instructions),
                    side(f.before, |c| c.inclusive),
                    side(f.after, |c| c.inclusive),
                    format!("{:+}", f.change.inclusive),
                    relative(f, f.relative.inclusive),
                    side(f.before, |c| c.calls),
                    side(f.after, |c| c.calls),
                    format!("{:+}", f.change.calls),
                ]
            })
            .collect();
        let headings =
            ["before", "after", "change", "%", "before", "after", "change", "%", "before", "after", "change"];
        let groups = [("self", 0..4), ("inclusive", 4..8), ("calls", 8..11)];
        let mut w = [0usize; 11];
        for (i, wi) in w.iter_mut().enumerate() {
            *wi = cells.iter().map(|c| c[i].len()).max().unwrap_or(0).max(headings[i].len());
        }
        let numbers: usize = w.iter().sum::<usize>() + 10;
        let module_w = rows.iter().map(|f| printable(&f.module).chars().count()).max().unwrap_or(0).clamp(6, 20);
        let longest_name = rows.iter().map(|f| printable(&f.name).chars().count()).max().unwrap_or(0).max(8);
        let name_w = longest_name.min(width.saturating_sub(numbers + 2 + 2 + module_w).max(12));
        writeln!(out, "\nFunctions (by change in self, then inclusive instructions)")?;
        // A title over each group of three columns, then the columns' headings.
        let mut titles = String::new();
        let mut line = String::new();
        for (g, (title, columns)) in groups.iter().enumerate() {
            let group = w[columns.clone()].iter().sum::<usize>() + columns.len() - 1;
            if g > 0 {
                titles.push(' ');
            }
            titles.push_str(&format!("{title:^group$}"));
            for i in columns.clone() {
                if i > 0 {
                    line.push(' ');
                }
                line.push_str(&format!("{:>width$}", headings[i], width = w[i]));
            }
        }
        writeln!(out, "{}", titles.trim_end())?;
        writeln!(out, "{line}  {:<name_w$}  module", "function")?;
        for (f, c) in rows.iter().zip(&cells) {
            let mut line = String::new();
            for (i, cell) in c.iter().enumerate() {
                if i > 0 {
                    line.push(' ');
                }
                line.push_str(&format!("{cell:>width$}", width = w[i]));
            }
            let status = match f.status {
                Status::Both => "",
                Status::Added => "  (added)",
                Status::Removed => "  (removed)",
            };
            writeln!(
                out,
                "{line}  {:<name_w$}  {}{status}",
                fit(&printable(&f.name), name_w),
                fit(&printable(&f.module), module_w)
            )?;
        }
        let left = self.functions.len() - shown;
        if left > 0 {
            let plural = if left == 1 { "" } else { "s" };
            writeln!(out, "{:>12} ... {left} more function{plural} (--top 0 for all)", "")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, module: &str, s: u64, i: u64, c: u64) -> FunctionRow {
        FunctionRow { name: name.into(), module: module.into(), self_instructions: s, inclusive: i, calls: c }
    }

    fn report(functions: Vec<FunctionRow>) -> Report {
        Report {
            recorded: None,
            stacks_cut_at_gaps: 0,
            arch: "x86_64".into(),
            mode: "continuous".into(),
            step_method: "test".into(),
            total_instructions: functions.iter().map(|f| f.self_instructions).sum(),
            total_branches: 0,
            lost_records: 0,
            functions,
            modules: vec![],
            threads: vec![],
            notes: vec![],
        }
    }

    #[test]
    fn matches_by_name_and_module_file_name_and_sorts_by_change() {
        let before = report(vec![
            row("work", "/a/prog", 100, 100, 1),
            row("main", "/a/prog", 10, 110, 1),
            row("gone", "/a/prog", 5, 5, 1),
            row("memset", "/lib/libc.so.6", 7, 7, 2),
        ]);
        let after = report(vec![
            row("work", "/b/prog", 300, 300, 1),
            row("main", "/b/prog", 10, 310, 1),
            row("memset", "/usr/lib/libc.so.6", 7, 7, 2),
            row("new", "/b/prog", 1, 1, 1),
        ]);
        let d = diff("a.itr", &before, "b.itr", &after);
        let keys: Vec<(&str, Status, i64, i64)> = d
            .functions
            .iter()
            .map(|f| (f.name.as_str(), f.status, f.change.self_instructions, f.change.inclusive))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("work", Status::Both, 200, 200),
                ("gone", Status::Removed, -5, -5),
                ("new", Status::Added, 1, 1),
                ("main", Status::Both, 0, 200),
                ("memset", Status::Both, 0, 0),
            ]
        );
        assert_eq!(d.change_instructions, 318 - 122);
        assert_eq!(d.functions[1].after, None);
        assert_eq!(d.functions[2].before, None);
    }

    #[test]
    fn same_key_rows_are_summed() {
        let before = report(vec![row("f", "/a/p", 1, 2, 1), row("f", "/a/p", 3, 4, 1)]);
        let after = report(vec![row("f", "/a/p", 4, 6, 2)]);
        let d = diff("a", &before, "b", &after);
        assert_eq!(d.functions.len(), 1);
        assert_eq!(d.functions[0].change, Change::default());
    }

    #[test]
    fn text_has_header_and_marks_added_and_removed() {
        let before = report(vec![row("gone", "/a/p", 5, 5, 1)]);
        let after = report(vec![row("new", "/a/p", 2, 2, 1)]);
        let mut out = Vec::new();
        diff("a.itr", &before, "b.itr", &after).write_text(&mut out, 40, 120).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("a.itr: 5 instructions"), "{text}");
        assert!(lines[0].ends_with("change -3 instructions"), "{text}");
        assert_eq!(lines[3].split_whitespace().collect::<Vec<_>>(), ["self", "inclusive", "calls"], "{text}");
        let words = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>().join(" ");
        assert_eq!(words(lines[5]), "5 - -5 gone 5 - -5 gone 1 - -1 gone p (removed)", "{text}");
        assert_eq!(words(lines[6]), "- 2 +2 new - 2 +2 new - 1 +1 new p (added)", "{text}");
    }

    #[test]
    fn relative_change_is_of_the_before_side() {
        let before = report(vec![row("f", "/a/p", 200, 400, 1), row("z", "/a/p", 0, 10, 1)]);
        let after = report(vec![row("f", "/a/p", 250, 300, 1), row("z", "/a/p", 5, 10, 1)]);
        let d = diff("a", &before, "b", &after);
        let f = d.functions.iter().find(|f| f.name == "f").unwrap();
        assert_eq!(f.relative, RelativeChange { self_instructions: Some(25.0), inclusive: Some(-25.0) });
        let z = d.functions.iter().find(|f| f.name == "z").unwrap();
        assert_eq!(z.relative, RelativeChange { self_instructions: None, inclusive: Some(0.0) });
        let mut out = Vec::new();
        d.write_text(&mut out, 0, 200).unwrap();
        let text = String::from_utf8(out).unwrap();
        let words = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>().join(" ");
        let rows: Vec<String> = text.lines().skip(5).map(words).collect();
        assert_eq!(rows[0], "200 250 +50 +25.0% 400 300 -100 -25.0% 1 1 +0 f p", "{text}");
        assert_eq!(rows[1], "0 5 +5 - 10 10 +0 +0.0% 1 1 +0 z p", "{text}");
    }

    #[test]
    fn delta_is_signed() {
        assert_eq!(delta(3, 1), -2);
        assert_eq!(delta(1, 3), 2);
        assert_eq!(delta(0, u64::MAX), i64::MAX);
        assert_eq!(delta(u64::MAX, 0), i64::MIN);
    }
}
