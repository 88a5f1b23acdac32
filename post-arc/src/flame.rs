//! `itrace flamegraph`: exact instructions per call stack, as folded stacks (one line per
//! distinct stack: `main;fib;fib 1234`, what flamegraph.pl and inferno read) or as an SVG
//! drawn by inferno. The stacks are those of [`crate::stacks`]; memory grows with the number
//! of distinct stacks, not the trace's length, and the folded text is written straight from
//! the tree of stacks (one path in memory at a time).
//!
//! `--per-thread` puts a frame per thread at the root (`name-pid/tid`, as inferno's and
//! stackcollapse-perf's `--tid` folding name them); `--colors module` fills every frame of a
//! module with one colour, its hue from the module's file name (the same on every run).

use crate::names::printable;
use crate::stacks::{self, Collect, StackTree};
use crate::summary::{self, TreeEntry};
use crate::{PostError, Trace};
use rustc_hash::FxHashMap;
use std::io::Write;

/// How the SVG's frames are coloured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrameColors {
    /// inferno's "hot" palette, the shade from the function's name (flamegraph.pl's `--hash`).
    #[default]
    Name,
    /// One colour per module, its hue from the module's file name.
    Module,
}

/// The tree of call stacks: replayed, or read from the trace's index (its nodes in the order
/// [`StackTree::visit_nodes`] gives, with their depths).
enum Stacks {
    Tree(StackTree),
    Entries(Vec<TreeEntry>),
}

impl Stacks {
    /// As [`StackTree::walk`]: every stack that ran instructions, root first, depth first.
    fn walk(&self, visit: &mut dyn FnMut(&[u32], u64) -> std::io::Result<()>) -> std::io::Result<()> {
        match self {
            Stacks::Tree(tree) => tree.walk(visit),
            Stacks::Entries(nodes) => {
                let mut path: Vec<u32> = Vec::new();
                for n in nodes {
                    path.truncate(n.depth as usize);
                    path.push(n.func);
                    if n.instructions > 0 {
                        visit(&path, n.instructions)?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// The call stacks of a trace, ready to be written.
pub struct Folded {
    tree: Stacks,
    /// Frame names by function id.
    names: Vec<String>,
    /// Module file names by function id.
    modules: Vec<String>,
    /// The frames of threads (per-thread stacks), by their function id in the tree.
    thread_frames: FxHashMap<u32, String>,
    pub total_instructions: u64,
    /// Warnings and hints about the names, as in [`crate::report::Report::notes`].
    pub notes: Vec<String>,
}

/// A function name as one frame of a folded line: `;` separates frames and a line ends the
/// stack, so neither may appear in it.
fn frame_name(name: &str) -> String {
    printable(name).replace(';', ":")
}

/// Replay `trace` into its call stacks; with `per_thread`, each thread's under a frame of
/// its own.
pub fn folded(trace: &Trace, per_thread: bool, progress: &mut dyn FnMut(u64)) -> Result<Folded, PostError> {
    let collect = Collect { tree: true, per_thread, ..Collect::default() };
    let (mut stacks, names, res) = stacks::build(trace, collect, progress)?;
    let tree = stacks.tree.take().expect("asked for the tree");
    let funcs = (0..res.func_count()).map(|id| res.func(id as u32));
    let (modules, names_by_id): (Vec<String>, Vec<String>) =
        funcs.map(|(module, name)| (crate::report::basename(module).to_string(), frame_name(name))).unzip();
    let mut thread_frames = FxHashMap::default();
    tree.walk(&mut |path, _| {
        if let Some(tid) = tree.thread_of(path[0]) {
            thread_frames.entry(path[0]).or_insert_with(|| {
                let pid = stacks.threads.get(&tid).map(|t| t.pid).filter(|&p| p != 0).unwrap_or(names.pid_of(tid));
                let name = match names.thread_name(tid) {
                    "" => "?",
                    n => n,
                };
                // Spaces as `_`, as inferno's perf folding writes a comm.
                frame_name(&format!("{}-{pid}/{tid}", name.replace(' ', "_")))
            });
        }
        Ok(())
    })?;
    Ok(Folded {
        tree: Stacks::Tree(tree),
        names: names_by_id,
        modules,
        thread_frames,
        total_instructions: stacks.threads.values().map(|t| t.instructions).sum(),
        notes: res.notes().to_vec(),
    })
}

/// [`folded`] (all threads merged) from the trace's index when it has the call tree, else
/// replayed and the index written ([`crate::summary`]).
pub fn folded_summarized(trace: &Trace, progress: &mut dyn FnMut(u64)) -> Result<Folded, PostError> {
    let need = summary::Collected { tree: true, edges: false };
    let mut agg = summary::aggregate(trace, None, need, |collect| {
        crate::views::replay_aggregate(trace, None, collect, progress)
    })?;
    let (modules, names): (Vec<String>, Vec<String>) =
        agg.funcs.iter().map(|f| (crate::report::basename(&f.module).to_string(), frame_name(&f.name))).unzip();
    Ok(Folded {
        tree: Stacks::Entries(agg.tree.take().expect("the index's aggregate holds the tree asked for")),
        names,
        modules,
        thread_frames: FxHashMap::default(),
        total_instructions: agg.threads.iter().map(|t| t.instructions).sum(),
        notes: std::mem::take(&mut agg.notes),
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
                line.push_str(self.frame(*func));
            }
            line.push(' ');
            line.push_str(&n.to_string());
            visit(&line)
        })
    }

    /// The frame name of function id `func` (or of a thread's frame).
    fn frame(&self, func: u32) -> &str {
        match self.names.get(func as usize) {
            Some(name) => name,
            None => self.thread_frames.get(&func).map_or("?", String::as_str),
        }
    }

    /// The fill of each frame name by its module: one hue per module file name, from a hash
    /// of it (stable across runs and traces); threads' frames grey. A name in two modules
    /// takes the first one's colour met in the tree.
    fn module_palette(&self) -> inferno::flamegraph::color::PaletteMap {
        let mut palette = inferno::flamegraph::color::PaletteMap::default();
        let _ = self.tree.walk(&mut |path, _| {
            for &func in path {
                let name = self.frame(func);
                if palette.get(name).is_none() {
                    let colour = match self.modules.get(func as usize) {
                        Some(module) => module_colour(module),
                        None => inferno::flamegraph::color::Color { r: 160, g: 160, b: 160 },
                    };
                    palette.insert(name, colour);
                }
            }
            Ok(())
        });
        palette
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
    pub fn write_svg(
        &self,
        title: &str,
        min_width: f64,
        colors: FrameColors,
        out: &mut dyn Write,
    ) -> Result<(), PostError> {
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
        let mut palette;
        if colors == FrameColors::Module {
            palette = self.module_palette();
            opt.palette_map = Some(&mut palette);
        }
        inferno::flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), out)?;
        Ok(())
    }
}

/// The colour of a module's frames: its hue from an FNV-1a hash of its file name, at one
/// saturation and lightness light enough for the black frame names.
fn module_colour(module: &str) -> inferno::flamegraph::color::Color {
    let hash = module.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let hue = (hash % 360) as f64;
    let (s, l) = (0.6, 0.7);
    // HSL to RGB.
    let c = (1.0 - (2.0 * l - 1.0_f64).abs()) * s;
    let h = hue / 60.0;
    let x = c * (1.0 - (h % 2.0 - 1.0).abs());
    let (r, g, b) = match h as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    inferno::flamegraph::color::Color { r: byte(r), g: byte(g), b: byte(b) }
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
