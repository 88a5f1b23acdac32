//! The views of `itrace report` beyond its flat tables: the call tree (`--tree`), the callers
//! and callees of a function (`--callers`, `--callees`, gprof's call graph entries), one
//! thread only (`--tid`), and which functions the table shows in what order (`--module`,
//! `--grep`, `--sort`).
//!
//! All come from the call stacks of [`crate::stacks`]: the tree from its stack tree (one node
//! per distinct call stack, merged over threads), the callers and callees from its call edges.

use crate::funcname::{FunctionQuery, NameError};
use crate::names::printable;
use crate::report::{self, basename, fit, Report, TextOptions};
use crate::stacks::{self, Collect};
use crate::summary::{self, Aggregate, Collected, NameSources, TreeEntry};
use crate::{PostError, Trace};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

/// What to build beyond the flat report.
#[derive(Clone, Debug, Default)]
pub struct ViewOptions {
    /// Only this thread's records.
    pub tid: Option<u32>,
    /// The call tree.
    pub tree: bool,
    /// Callers of the functions of this name.
    pub callers: Option<String>,
    /// Callees of the functions of this name.
    pub callees: Option<String>,
}

/// Order of the function table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    /// Self instructions, most first (the default).
    #[default]
    SelfInstructions,
    /// Inclusive instructions, most first.
    Inclusive,
    /// Calls, most first.
    Calls,
    /// Function name, then module.
    Name,
}

impl SortKey {
    fn title(self) -> &'static str {
        match self {
            SortKey::SelfInstructions => "self instructions",
            SortKey::Inclusive => "inclusive instructions",
            SortKey::Calls => "calls",
            SortKey::Name => "name",
        }
    }
}

/// One node of the call tree: one call stack, the functions from the root to `name`.
#[derive(Clone, Debug, Serialize)]
pub struct TreeNode {
    pub name: String,
    pub module: String,
    /// Instructions run with exactly this stack.
    #[serde(rename = "self")]
    pub self_instructions: u64,
    /// Instructions run with this stack or one it called: the node's self plus its children's inclusive.
    pub inclusive: u64,
    /// Calls that made this stack (0 for a root the trace did not see called, and for the
    /// instructions of a function run without a frame of its own under another's).
    pub calls: u64,
    /// Most inclusive first.
    pub children: Vec<TreeNode>,
}

/// A caller or callee of a function, summed over its call sites.
#[derive(Clone, Debug, Serialize)]
pub struct Relative {
    pub name: String,
    pub module: String,
    /// Calls between the two.
    pub calls: u64,
    /// Instructions run inside those calls (a recursive call's are also in its caller's).
    pub inclusive: u64,
}

/// A function with its callers or callees (gprof's call graph entry).
#[derive(Clone, Debug, Serialize)]
pub struct CallGraphEntry {
    pub name: String,
    pub module: String,
    #[serde(rename = "self")]
    pub self_instructions: u64,
    pub inclusive: u64,
    pub calls: u64,
    /// Most inclusive first; None when not asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callers: Option<Vec<Relative>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callees: Option<Vec<Relative>>,
}

/// The report with its views.
#[derive(Clone, Debug, Serialize)]
pub struct Views {
    #[serde(flatten)]
    pub report: Report,
    /// The range the report covers (`--from`, `--to`, `--after`), in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
    /// The thread the report is limited to (`--tid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    /// Roots of the call tree, most inclusive first (`--tree`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree: Option<Vec<TreeNode>>,
    /// `--callers`, `--callees`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub call_graph: Vec<CallGraphEntry>,
    /// What the filters left out, as lines saying what the totals mean (text only).
    #[serde(skip)]
    pub scope: Vec<String>,
    #[serde(skip)]
    sort: SortKey,
}

/// Which functions to show: `--module`, `--grep`.
pub struct Filter<'a> {
    /// A module's file name or path.
    pub module: Option<&'a str>,
    /// A test of function names.
    pub name: Option<&'a dyn Fn(&str) -> bool>,
    /// What `name` tests, for the text (`--grep RE`).
    pub name_pattern: Option<&'a str>,
}

impl Filter<'_> {
    fn module_matches(&self, module: &str) -> bool {
        match self.module {
            None => true,
            Some(m) => module == m || basename(module) == m,
        }
    }

    fn matches(&self, name: &str, module: &str) -> bool {
        let name_matches = match self.name {
            None => true,
            Some(test) => test(name),
        };
        self.module_matches(module) && name_matches
    }
}

/// Build the report of `trace` with the views `opts` asks for, replaying it.
pub fn build(trace: &Trace, opts: &ViewOptions, progress: &mut dyn FnMut(u64)) -> Result<Views, PostError> {
    let agg = replay_aggregate(trace, opts.tid, needs(opts), progress)?.0;
    from_aggregate(trace, opts, &agg)
}

/// [`build`] from the trace's summary ([`crate::summary`]) when it has one that answers, else
/// replaying it and saving the summary for the next query.
pub fn build_summarized(trace: &Trace, opts: &ViewOptions, progress: &mut dyn FnMut(u64)) -> Result<Views, PostError> {
    let agg = summary::aggregate(trace, opts.tid, needs(opts), |collect| {
        replay_aggregate(trace, opts.tid, collect, progress)
    })?;
    from_aggregate(trace, opts, &agg)
}

/// What the views of `opts` need beyond the totals.
fn needs(opts: &ViewOptions) -> Collected {
    Collected { tree: opts.tree, edges: opts.callers.is_some() || opts.callees.is_some() }
}

/// Replay `trace` (thread `tid` alone when given), collecting `collect`.
pub(crate) fn replay_aggregate(
    trace: &Trace,
    tid: Option<u32>,
    collect: Collected,
    progress: &mut dyn FnMut(u64),
) -> Result<(Aggregate, NameSources), PostError> {
    let collect = Collect { tree: collect.tree, edges: collect.edges, ..Collect::default() };
    let (sink, names, res) = match tid {
        Some(tid) => stacks::build_thread(trace, collect, tid, progress)?,
        None => stacks::build(trace, collect, progress)?,
    };
    Ok((Aggregate::from_stacks(&sink, &names, &res), NameSources::of(trace, &res)?))
}

/// The views `opts` asks for, from an aggregate of `trace` that holds what they need.
fn from_aggregate(trace: &Trace, opts: &ViewOptions, agg: &Aggregate) -> Result<Views, PostError> {
    if let Some(tid) = opts.tid {
        if !agg.threads.iter().any(|t| t.tid == tid) {
            return Err(PostError::NoSuchThread(tid));
        }
    }
    let mut report = report::from_aggregate(trace, agg);
    let mut report_notes = Vec::new();
    let tree = opts.tree.then(|| agg.tree.as_deref().map(|t| call_tree(t, agg))).flatten();

    let mut call_graph = Vec::new();
    let wanted: Vec<&String> = opts.callers.iter().chain(opts.callees.iter()).collect();
    if let (Some(edges), false) = (&agg.edges, wanted.is_empty()) {
        // (caller, callee) -> (calls, inclusive), over call sites.
        let pairs: BTreeMap<(u32, u32), (u64, u64)> =
            edges.iter().map(|p| ((p.caller, p.callee), (p.calls, p.inclusive))).collect();
        let relative = |id: u32, calls: u64, inclusive: u64| {
            let (module, name) = agg.func(id);
            Relative { name: name.to_string(), module: module.to_string(), calls, inclusive }
        };
        let by_inclusive = |v: &mut Vec<Relative>| {
            v.sort_by(|a, b| b.inclusive.cmp(&a.inclusive).then(a.name.cmp(&b.name)).then(a.module.cmp(&b.module)))
        };
        let mut done: Vec<u32> = Vec::new();
        let ran: Vec<u32> = (0..agg.funcs.len() as u32)
            .filter(|&id| agg.funcs[id as usize].stats.calls > 0 || agg.funcs[id as usize].stats.inclusive > 0)
            .collect();
        let mut missing = Vec::new();
        for name in &wanted {
            let query = FunctionQuery::new(name);
            let ids = match query.select(ran.iter().map(|&id| (id, agg.func(id).1.to_string()))) {
                Ok(ids) => ids,
                Err(NameError::NotFound(_)) => {
                    // As perf does with a symbol filter that matches nothing: the other name's
                    // entry is still shown; only when no name is found is it an error.
                    missing.push(name.as_str());
                    continue;
                }
                Err(e) => return Err(PostError::Name(e)),
            };
            for id in ids {
                if done.contains(&id) {
                    continue;
                }
                done.push(id);
                let f = &agg.funcs[id as usize].stats;
                let (module, fname) = agg.func(id);
                let callers = opts.callers.is_some().then(|| {
                    let mut v: Vec<Relative> = pairs
                        .iter()
                        .filter(|((_, callee), _)| *callee == id)
                        .map(|((caller, _), (c, i))| relative(*caller, *c, *i))
                        .collect();
                    by_inclusive(&mut v);
                    v
                });
                let callees = opts.callees.is_some().then(|| {
                    let mut v: Vec<Relative> = pairs
                        .iter()
                        .filter(|((caller, _), _)| *caller == id)
                        .map(|((_, callee), (c, i))| relative(*callee, *c, *i))
                        .collect();
                    by_inclusive(&mut v);
                    v
                });
                call_graph.push(CallGraphEntry {
                    name: fname.to_string(),
                    module: module.to_string(),
                    self_instructions: f.self_instructions,
                    inclusive: f.inclusive,
                    calls: f.calls,
                    callers,
                    callees,
                });
            }
        }
        if !missing.is_empty() && missing.len() == wanted.len() {
            return Err(crate::no_such_function(missing[0], &agg.notes));
        }
        for name in missing {
            report_notes
                .push(format!("warning: no function named {name} ran in the trace: its call graph entry is left out"));
        }
    }
    let mut scope = Vec::new();
    if !trace.range().is_all() {
        scope.push(format!("range {}: every total is of the instructions in it", trace.range().describe()));
    }
    if let Some(tid) = opts.tid {
        scope.push(format!("thread {tid} only: every total and percentage is of this thread's instructions"));
    }
    report.notes.extend(report_notes);
    let range = (!trace.range().is_all()).then(|| trace.range().describe());
    Ok(Views { report, range, tid: opts.tid, tree, call_graph, scope, sort: SortKey::default() })
}

/// The stack tree as nested nodes, each child list most inclusive first.
fn call_tree(tree: &[TreeEntry], agg: &Aggregate) -> Vec<TreeNode> {
    fn attach(done: TreeNode, open: &mut [TreeNode], roots: &mut Vec<TreeNode>) {
        // A stack that neither ran nor was called (a left-over of a merged PLT call) shows nothing.
        if done.inclusive == 0 && done.calls == 0 {
            return;
        }
        match open.last_mut() {
            Some(parent) => {
                parent.inclusive += done.inclusive;
                parent.children.push(done);
            }
            None => roots.push(done),
        }
    }
    let mut roots = Vec::new();
    // The path from a root to the node visited last.
    let mut open: Vec<TreeNode> = Vec::new();
    let known = agg.funcs.len();
    for node in tree {
        let depth = node.depth as usize;
        while open.len() > depth {
            let done = open.pop().expect("deeper than depth");
            attach(done, &mut open, &mut roots);
        }
        let (module, name) = if (node.func as usize) < known { agg.func(node.func) } else { ("", "<pending>") };
        open.push(TreeNode {
            name: name.to_string(),
            module: module.to_string(),
            self_instructions: node.instructions,
            inclusive: node.instructions,
            calls: node.calls,
            children: Vec::new(),
        });
    }
    while let Some(done) = open.pop() {
        attach(done, &mut open, &mut roots);
    }
    sort_tree(&mut roots);
    roots
}

fn sort_tree(nodes: &mut [TreeNode]) {
    nodes.sort_by(|a, b| b.inclusive.cmp(&a.inclusive).then(a.name.cmp(&b.name)).then(a.module.cmp(&b.module)));
    for n in nodes {
        sort_tree(&mut n.children);
    }
}

/// The nodes of `nodes` that match `filter`, with their whole subtrees, and the paths that
/// lead to them.
fn filter_tree(nodes: Vec<TreeNode>, filter: &Filter) -> Vec<TreeNode> {
    nodes
        .into_iter()
        .filter_map(|mut n| {
            if filter.matches(&n.name, &n.module) {
                return Some(n);
            }
            n.children = filter_tree(std::mem::take(&mut n.children), filter);
            (!n.children.is_empty()).then_some(n)
        })
        .collect()
}

/// `nodes` without those under `min` inclusive instructions or deeper than `depth` (0: any);
/// returns how many nodes went.
fn prune_tree(nodes: &mut Vec<TreeNode>, min: u64, depth: usize) -> usize {
    fn count(nodes: &[TreeNode]) -> usize {
        nodes.iter().map(|n| 1 + count(&n.children)).sum()
    }
    // Each subtree that goes is counted once: counting the whole list before and after at
    // every level cost the tree's size times its depth (15 s of 19 for a Python trace).
    let mut gone = 0;
    nodes.retain(|n| {
        let keep = n.inclusive >= min;
        if !keep {
            gone += 1 + count(&n.children);
        }
        keep
    });
    for n in nodes.iter_mut() {
        if depth == 1 {
            gone += count(&n.children);
            n.children.clear();
        } else {
            gone += prune_tree(&mut n.children, min, depth.saturating_sub(1));
        }
    }
    gone
}

/// How the tree is cut (`--min-percent`, `--depth`).
#[derive(Clone, Copy, Debug)]
pub struct TreeLimits {
    /// Leave out stacks under this percentage of all instructions (inclusive).
    pub min_percent: f64,
    /// Levels shown (0: all).
    pub depth: usize,
}

impl Default for TreeLimits {
    fn default() -> Self {
        TreeLimits { min_percent: 0.5, depth: 0 }
    }
}

impl Views {
    /// Keep the functions, modules and tree nodes `filter` lets through, and say so in
    /// [`Self::scope`]. The totals stay those of the whole trace (or thread): percentages
    /// are of all its instructions.
    pub fn filter(&mut self, filter: &Filter) {
        if filter.module.is_none() && filter.name.is_none() {
            return;
        }
        let total = self.report.total_instructions;
        self.report.functions.retain(|f| filter.matches(&f.name, &f.module));
        self.report.modules.retain(|m| filter.module_matches(&m.module));
        self.call_graph.retain(|e| filter.module_matches(&e.module));
        if let Some(tree) = self.tree.take() {
            self.tree = Some(filter_tree(tree, filter));
        }
        let shown: u64 = self.report.functions.iter().map(|f| f.self_instructions).sum();
        let mut what = Vec::new();
        if let Some(m) = filter.module {
            what.push(format!("of module {m}"));
        }
        if let Some(p) = filter.name_pattern {
            what.push(format!("whose name matches {p}"));
        }
        let share = if total == 0 { 0.0 } else { 100.0 * shown as f64 / total as f64 };
        self.scope.push(format!(
            "functions {}: {shown} self instructions, {share:.2}% of all {total}; percentages are of all instructions",
            what.join(" and ")
        ));
    }

    /// Order the function table by `key`.
    pub fn sort(&mut self, key: SortKey) {
        let rows = &mut self.report.functions;
        let by_name =
            |a: &report::FunctionRow, b: &report::FunctionRow| a.name.cmp(&b.name).then(a.module.cmp(&b.module));
        match key {
            SortKey::SelfInstructions => {
                rows.sort_by(|a, b| b.self_instructions.cmp(&a.self_instructions).then(by_name(a, b)))
            }
            SortKey::Inclusive => rows.sort_by(|a, b| b.inclusive.cmp(&a.inclusive).then(by_name(a, b))),
            SortKey::Calls => rows.sort_by(|a, b| b.calls.cmp(&a.calls).then(by_name(a, b))),
            SortKey::Name => rows.sort_by(by_name),
        }
        self.sort = key;
    }

    /// Cut the tree to `limits`; returns how many nodes went.
    pub fn prune_tree(&mut self, limits: TreeLimits) -> usize {
        let total = self.report.total_instructions as f64;
        let min = (limits.min_percent / 100.0 * total).ceil() as u64;
        match &mut self.tree {
            Some(tree) => prune_tree(tree, min, limits.depth),
            None => 0,
        }
    }

    /// JSON, for machines: the report's fields, and `tid`, `tree`, `call_graph` when asked for.
    pub fn write_json(&self, out: &mut dyn Write) -> Result<(), PostError> {
        serde_json::to_writer_pretty(&mut *out, self).map_err(std::io::Error::from)?;
        writeln!(out)?;
        Ok(())
    }

    /// Text: the tree and call graph entries when asked for, else the report's tables.
    /// `pruned` is what [`Self::prune_tree`] left out, `limits` how.
    pub fn write_text(
        &self,
        out: &mut dyn Write,
        opts: &TextOptions,
        limits: TreeLimits,
        pruned: usize,
    ) -> Result<(), PostError> {
        for line in &self.scope {
            writeln!(out, "# {line}")?;
        }
        if self.tree.is_none() && self.call_graph.is_empty() {
            return self.report.write_text_ordered(out, opts, self.sort.title());
        }
        let r = &self.report;
        r.write_origin(out)?;
        writeln!(
            out,
            "{} instructions, {} taken branches, {} records lost ({} trace, {} mode, {})",
            r.total_instructions, r.total_branches, r.lost_records, r.arch, r.mode, r.step_method
        )?;
        if let Some(tree) = &self.tree {
            self.write_tree(out, tree, opts, limits, pruned)?;
        }
        for e in &self.call_graph {
            self.write_entry(out, e, opts)?;
        }
        Ok(())
    }

    fn pct(&self, n: u64) -> f64 {
        let total = self.report.total_instructions;
        if total == 0 {
            0.0
        } else {
            100.0 * n as f64 / total as f64
        }
    }

    fn write_tree(
        &self,
        out: &mut dyn Write,
        tree: &[TreeNode],
        opts: &TextOptions,
        limits: TreeLimits,
        pruned: usize,
    ) -> Result<(), PostError> {
        let whose = match self.tid {
            Some(tid) => format!("thread {tid}"),
            None => "all threads merged".to_string(),
        };
        writeln!(out, "\nCall tree ({whose}; children most inclusive first)")?;
        // inclusive(12) %(7) self(12) calls(9), single spaces, two before the name.
        const NUMBERS: usize = 12 + 1 + 7 + 1 + 12 + 1 + 9 + 2;
        let room = opts.width.saturating_sub(NUMBERS).max(24);
        writeln!(out, "{:>12} {:>7} {:>12} {:>9}  function [module]", "inclusive", "%", "self", "calls")?;
        // Depth first, with each node's depth.
        let mut todo: Vec<(&TreeNode, usize)> = tree.iter().rev().map(|n| (n, 0)).collect();
        while let Some((n, depth)) = todo.pop() {
            // Deep recursion stays readable: the indent stops growing at 40 levels, and says its depth.
            let indent = if depth <= 40 { " ".repeat(depth) } else { format!("{}[{depth}] ", " ".repeat(40)) };
            let label = format!("{indent}{} [{}]", printable(&n.name), printable(basename(&n.module)));
            writeln!(
                out,
                "{:>12} {:>7.2} {:>12} {:>9}  {}",
                n.inclusive,
                self.pct(n.inclusive),
                n.self_instructions,
                n.calls,
                fit(&label, room)
            )?;
            todo.extend(n.children.iter().rev().map(|c| (c, depth + 1)));
        }
        if pruned > 0 {
            let depth =
                if limits.depth > 0 { format!(" or deeper than {} levels", limits.depth) } else { String::new() };
            writeln!(
                out,
                "{:>12} ... {pruned} more stacks under {}% of the instructions{depth} (--min-percent 0 for all)",
                "", limits.min_percent
            )?;
        }
        Ok(())
    }

    fn write_entry(&self, out: &mut dyn Write, e: &CallGraphEntry, opts: &TextOptions) -> Result<(), PostError> {
        writeln!(
            out,
            "\n{} [{}]: {} calls, {} self, {} inclusive instructions ({:.2}%)",
            printable(&e.name),
            printable(basename(&e.module)),
            e.calls,
            e.self_instructions,
            e.inclusive,
            self.pct(e.inclusive)
        )?;
        let room = opts.width.saturating_sub(12 + 1 + 12 + 1 + 7 + 2).max(24);
        for (title, list) in [("callers", &e.callers), ("callees", &e.callees)] {
            let Some(list) = list else { continue };
            writeln!(out, "{:>12} {:>12} {:>7}  {title} [module]", "calls", "inclusive", "%")?;
            if list.is_empty() {
                writeln!(out, "{:>12} {:>12} {:>7}  (none seen)", "", "", "")?;
            }
            for r in list {
                let label = format!("{} [{}]", printable(&r.name), printable(basename(&r.module)));
                writeln!(
                    out,
                    "{:>12} {:>12} {:>7.2}  {}",
                    r.calls,
                    r.inclusive,
                    self.pct(r.inclusive),
                    fit(&label, room)
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, inclusive: u64, children: Vec<TreeNode>) -> TreeNode {
        TreeNode {
            name: name.to_string(),
            module: "/bin/m".to_string(),
            self_instructions: 0,
            inclusive,
            calls: 1,
            children,
        }
    }

    /// A filter keeps the matching nodes whole and the paths to them; pruning drops small
    /// and deep nodes and counts them.
    #[test]
    fn filter_and_prune() {
        let tree = vec![node("main", 100, vec![node("a", 60, vec![node("b", 10, vec![])]), node("b", 30, vec![])])];
        let only_a = |n: &str| n == "a";
        let f = Filter { module: None, name: Some(&only_a), name_pattern: Some("a") };
        let kept = filter_tree(tree.clone(), &f);
        assert_eq!(kept[0].children.len(), 1);
        assert_eq!(kept[0].children[0].children[0].name, "b");
        let mut cut = tree.clone();
        assert_eq!(prune_tree(&mut cut, 20, 0), 1);
        assert_eq!(cut[0].children[0].children.len(), 0);
        let mut shallow = tree;
        assert_eq!(prune_tree(&mut shallow, 0, 1), 3);
    }
}
