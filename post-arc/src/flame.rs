//! `itrace flamegraph`: exact instructions per call stack, as folded stacks (one line per
//! distinct stack: `main;fib;fib 1234`, what flamegraph.pl and inferno read) or as an SVG
//! drawn by inferno. The stacks are those of [`crate::stacks`]; memory grows with the number
//! of distinct stacks, not the trace's length.

use crate::names::printable;
use crate::stacks::{self, Collect};
use crate::{PostError, Trace};
use std::collections::BTreeMap;
use std::io::Write;

/// The folded stacks of a trace.
pub struct Folded {
    /// Stack (frames joined by `;`, root first) and its instructions, sorted by stack.
    pub stacks: Vec<(String, u64)>,
    pub total_instructions: u64,
    /// Warnings and hints about the names, as in [`crate::report::Report::notes`].
    pub notes: Vec<String>,
}

/// A function name as one frame of a folded line: `;` separates frames and a line ends the
/// stack, so neither may appear in it.
fn frame_name(name: &str) -> String {
    printable(name).replace(';', ":")
}

/// Replay `trace` into its folded stacks.
pub fn folded(trace: &Trace, progress: &mut dyn FnMut(u64)) -> Result<Folded, PostError> {
    let collect = Collect { tree: true, ..Collect::default() };
    let (stacks, _names, res) = stacks::build(trace, collect, progress)?;
    let tree = stacks.tree.as_ref().expect("asked for the tree");
    // Functions of the same name in different modules fold into one line, as in perf's output.
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    let mut names: Vec<Option<String>> = vec![None; res.func_count()];
    for (path, n) in tree.stacks() {
        let mut line = String::new();
        for (i, func) in path.iter().enumerate() {
            if i > 0 {
                line.push(';');
            }
            let name = names[*func as usize].get_or_insert_with(|| frame_name(res.func(*func).1));
            line.push_str(name);
        }
        *lines.entry(line).or_default() += n;
    }
    Ok(Folded {
        total_instructions: stacks.threads.values().map(|t| t.instructions).sum(),
        stacks: lines.into_iter().collect(),
        notes: res.notes().to_vec(),
    })
}

impl Folded {
    /// The folded text: `frame;frame;frame COUNT` per line.
    pub fn write_text(&self, out: &mut dyn Write) -> Result<(), PostError> {
        for (stack, n) in &self.stacks {
            writeln!(out, "{stack} {n}")?;
        }
        Ok(())
    }

    /// The flame graph SVG; frames narrower than `min_width` pixels are left out (inferno's
    /// `--minwidth`; 0 keeps all).
    pub fn write_svg(&self, title: &str, min_width: f64, out: &mut dyn Write) -> Result<(), PostError> {
        let lines: Vec<String> = self.stacks.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let mut opt = inferno::flamegraph::Options::default();
        opt.title = title.to_string();
        opt.count_name = "instructions".to_string();
        opt.min_width = min_width;
        // Colours from the names, so that two runs of one program look alike.
        opt.hash = true;
        opt.deterministic = true;
        inferno::flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), out)?;
        Ok(())
    }
}
