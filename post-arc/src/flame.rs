//! `itrace flamegraph`: exact instructions per call stack, as folded stacks (one line per
//! distinct stack: `main;fib;fib 1234`, what flamegraph.pl and inferno read) or as an SVG
//! drawn by inferno. The stacks are those of [`crate::stacks`]; memory grows with the number
//! of distinct stacks, not the trace's length, and the folded text is written straight from
//! the tree of stacks (one path in memory at a time).

use crate::names::printable;
use crate::stacks::{self, Collect, StackTree};
use crate::{PostError, Trace};
use std::io::Write;

/// The call stacks of a trace, ready to be written.
pub struct Folded {
    tree: StackTree,
    /// Frame names by function id.
    names: Vec<String>,
    pub total_instructions: u64,
    /// Warnings and hints about the names, as in [`crate::report::Report::notes`].
    pub notes: Vec<String>,
}

/// A function name as one frame of a folded line: `;` separates frames and a line ends the
/// stack, so neither may appear in it.
fn frame_name(name: &str) -> String {
    printable(name).replace(';', ":")
}

/// Replay `trace` into its call stacks.
pub fn folded(trace: &Trace, progress: &mut dyn FnMut(u64)) -> Result<Folded, PostError> {
    let collect = Collect { tree: true, ..Collect::default() };
    let (mut stacks, _names, res) = stacks::build(trace, collect, progress)?;
    let tree = stacks.tree.take().expect("asked for the tree");
    let names = (0..res.func_count()).map(|id| frame_name(res.func(id as u32).1)).collect();
    Ok(Folded {
        tree,
        names,
        total_instructions: stacks.threads.values().map(|t| t.instructions).sum(),
        notes: res.notes().to_vec(),
    })
}

impl Folded {
    /// Visit each folded line (`frame;frame;frame COUNT`, no newline). Functions of the same
    /// name in different modules give lines of the same stack, which readers add up.
    fn lines(&self, visit: &mut dyn FnMut(&str) -> std::io::Result<()>) -> std::io::Result<()> {
        let mut line = String::new();
        self.tree.walk(&mut |path, n| {
            line.clear();
            for (i, func) in path.iter().enumerate() {
                if i > 0 {
                    line.push(';');
                }
                line.push_str(&self.names[*func as usize]);
            }
            line.push(' ');
            line.push_str(&n.to_string());
            visit(&line)
        })
    }

    /// Distinct stacks that ran instructions.
    pub fn stack_count(&self) -> usize {
        let mut count = 0;
        let _ = self.tree.walk(&mut |_, _| {
            count += 1;
            Ok(())
        });
        count
    }

    /// The folded text: `frame;frame;frame COUNT` per line.
    pub fn write_text(&self, out: &mut dyn Write) -> Result<(), PostError> {
        self.lines(&mut |line| writeln!(out, "{line}"))?;
        Ok(())
    }

    /// The flame graph SVG; frames narrower than `min_width` pixels are left out (inferno's
    /// `--minwidth`; 0 keeps all).
    pub fn write_svg(&self, title: &str, min_width: f64, out: &mut dyn Write) -> Result<(), PostError> {
        // inferno takes the lines as borrowed strings: all of them at once.
        let mut lines: Vec<String> = Vec::new();
        self.lines(&mut |line| {
            lines.push(line.to_string());
            Ok(())
        })?;
        if lines.is_empty() {
            // inferno refuses no stacks ("No stack counts found"); an empty trace is still a
            // graph, as its exports are files: the title and a line that says so.
            return write_empty_svg(title, out);
        }
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

/// A valid SVG of the flame graph's size with `title` and "no instructions" in place of frames.
fn write_empty_svg(title: &str, out: &mut dyn Write) -> Result<(), PostError> {
    let escape = |s: &str| {
        s.chars()
            .map(|c| match c {
                '&' => "&amp;".to_string(),
                '<' => "&lt;".to_string(),
                '>' => "&gt;".to_string(),
                '"' => "&quot;".to_string(),
                c if c.is_control() => format!("&#{};", c as u32),
                c => c.to_string(),
            })
            .collect::<String>()
    };
    write!(
        out,
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"1200\" height=\"70\" viewBox=\"0 0 1200 70\" \
         xmlns=\"http://www.w3.org/2000/svg\">\n\
         <text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text>\n\
         <text x=\"600\" y=\"52\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"12\">\
         no instructions in the trace: no stacks to draw</text>\n\
         </svg>\n",
        escape(title)
    )?;
    Ok(())
}
