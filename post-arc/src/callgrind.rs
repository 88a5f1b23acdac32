//! `itrace export --format callgrind`: the trace as a callgrind profile (format version 1,
//! what kcachegrind and callgrind_annotate read): self instructions (event `Ir`) per function
//! and source line, and per call site the calls made and their inclusive instructions. Names
//! and files are compressed (`(id) name` once, `(id)` after), line numbers are relative to
//! the previous line (`+N`, `-N`, `*`), as callgrind itself writes them.
//!
//! A block's instructions are charged to the line of its first instruction (the trace has
//! counts per block, not per instruction). The calls come from [`crate::stacks`].

use crate::names::printable;
use crate::stacks::{self, CallEdge, Collect};
use crate::{PostError, Trace};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;

/// What was written.
#[derive(Clone, Debug, Default)]
pub struct CallgrindStats {
    pub functions: usize,
    pub total_instructions: u64,
    /// Warnings and hints about the names, as in [`crate::report::Report::notes`].
    pub notes: Vec<String>,
}

/// The file of unknown lines, as callgrind names it.
const UNKNOWN_FILE: &str = "???";

/// Name compression: `(id) name` the first time a name is written, `(id)` after.
#[derive(Default)]
struct Compressed {
    ids: HashMap<String, usize>,
}

impl Compressed {
    fn name(&mut self, name: &str) -> String {
        if let Some(id) = self.ids.get(name) {
            return format!("({id})");
        }
        let id = self.ids.len() + 1;
        self.ids.insert(name.to_string(), id);
        format!("({id}) {name}")
    }
}

/// A line position relative to the previous one (`*` for the same), or absolute when there is
/// none yet in this function (readers keep the base across functions; an absolute number
/// sets it).
fn relative(line: u32, last: &mut Option<u32>) -> String {
    let s = match *last {
        None => line.to_string(),
        Some(prev) if line == prev => "*".to_string(),
        Some(prev) if line > prev => format!("+{}", line - prev),
        Some(prev) => format!("-{}", prev - line),
    };
    *last = Some(line);
    s
}

/// One function's lines: cost per (file, line), and the file most of its cost is in.
#[derive(Default)]
struct FuncLines {
    by_file: BTreeMap<Arc<str>, BTreeMap<u32, u64>>,
}

impl FuncLines {
    /// The function's file (callgrind_annotate names a function `file:name`): the one with
    /// the most instructions, the first by name on a tie.
    fn main_file(&self) -> Arc<str> {
        let mut best: Option<(&Arc<str>, u64)> = None;
        for (file, lines) in &self.by_file {
            let n: u64 = lines.values().sum();
            let more = match best {
                None => true,
                Some((_, most)) => n > most,
            };
            if more {
                best = Some((file, n));
            }
        }
        best.map_or_else(|| Arc::from(UNKNOWN_FILE), |(f, _)| f.clone())
    }

    /// The first known line of the function in `file` (0 when none).
    fn first_line(&self, file: &str) -> u32 {
        self.by_file.get(file).and_then(|l| l.keys().copied().find(|&l| l != 0)).unwrap_or(0)
    }
}

/// Write the callgrind profile of `trace` to `out`.
pub fn write_callgrind(
    trace: &Trace,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<CallgrindStats, PostError> {
    let collect = Collect { edges: true, lines: true, ..Collect::default() };
    let (stacks, names, res) = stacks::build(trace, collect, progress)?;
    let lines = stacks.lines.as_ref().expect("asked for lines");
    let edges = stacks.edges.as_ref().expect("asked for edges");

    let mut funcs: BTreeMap<u32, FuncLines> = BTreeMap::new();
    for ((func, file, line), n) in lines {
        let file = file.clone().unwrap_or_else(|| Arc::from(UNKNOWN_FILE));
        // Without a file the line means nothing.
        let line = if &*file == UNKNOWN_FILE { 0 } else { *line };
        *funcs.entry(*func).or_default().by_file.entry(file).or_default().entry(line).or_default() += n;
    }
    let mut calls_by_caller: BTreeMap<u32, Vec<(u32, u32, &CallEdge)>> = BTreeMap::new();
    for ((caller, line, callee), e) in edges {
        calls_by_caller.entry(*caller).or_default().push((*line, *callee, e));
        funcs.entry(*callee).or_default();
        funcs.entry(*caller).or_default();
    }
    let main_files: HashMap<u32, Arc<str>> = funcs.iter().map(|(f, l)| (*f, l.main_file())).collect();
    let total: u64 = lines.values().sum();

    let h = trace.header();
    let first_pid = stacks.threads.values().map(|t| t.pid).find(|&p| p != 0).unwrap_or(0);
    writeln!(out, "# callgrind format")?;
    writeln!(out, "version: 1")?;
    writeln!(out, "creator: itrace {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(out, "pid: {first_pid}")?;
    writeln!(out, "cmd: {}", printable(names.process_name(first_pid)))?;
    writeln!(out, "desc: Trace: {} ({} trace, {} mode)", trace.path().display(), h.arch, h.mode)?;
    writeln!(out, "positions: line")?;
    writeln!(out, "events: Ir")?;
    writeln!(out, "summary: {total}")?;

    let (mut obs, mut fls, mut fns) = (Compressed::default(), Compressed::default(), Compressed::default());
    for (func, fl) in &funcs {
        let (module, name) = res.func(*func);
        let main_file = &main_files[func];
        writeln!(out)?;
        writeln!(out, "ob={}", obs.name(&printable(module)))?;
        writeln!(out, "fl={}", fls.name(&printable(main_file)))?;
        writeln!(out, "fn={}", fns.name(&printable(name)))?;
        let mut last = None;
        // The main file's lines, then each other file's (inlined code) after `fi=`.
        let files = fl
            .by_file
            .iter()
            .filter(|(f, _)| *f == main_file)
            .chain(fl.by_file.iter().filter(|(f, _)| *f != main_file));
        for (file, costs) in files {
            if file != main_file {
                writeln!(out, "fi={}", fls.name(&printable(file)))?;
                // A line of another file: absolute.
                last = None;
            }
            for (line, n) in costs {
                writeln!(out, "{} {n}", relative(*line, &mut last))?;
            }
        }
        if fl.by_file.keys().any(|f| f != main_file) {
            writeln!(out, "fe={}", fls.name(&printable(main_file)))?;
            last = None;
        }
        for (line, callee, e) in calls_by_caller.get(func).map(Vec::as_slice).unwrap_or(&[]) {
            let (callee_module, callee_name) = res.func(*callee);
            let callee_file = &main_files[callee];
            writeln!(out, "cob={}", obs.name(&printable(callee_module)))?;
            writeln!(out, "cfi={}", fls.name(&printable(callee_file)))?;
            writeln!(out, "cfn={}", fns.name(&printable(callee_name)))?;
            // The target position is absolute, and does not move the relative base.
            writeln!(out, "calls={} {}", e.calls, funcs[callee].first_line(callee_file))?;
            writeln!(out, "{} {}", relative(*line, &mut last), e.inclusive)?;
        }
    }
    writeln!(out, "\ntotals: {total}")?;
    out.flush()?;
    Ok(CallgrindStats { functions: funcs.len(), total_instructions: total, notes: res.notes().to_vec() })
}

#[cfg(test)]
mod tests {
    /// The first line of each function is absolute, later ones relative to the line before.
    #[test]
    fn positions_are_absolute_then_relative() {
        let mut last = None;
        let written: Vec<String> = [17, 18, 18, 12].iter().map(|&l| super::relative(l, &mut last)).collect();
        assert_eq!(written, ["17", "+1", "*", "-6"]);
    }
}
