//! `itrace report`: instructions (self and inclusive) and calls per
//! function, instructions per module and per thread.
//!
//! Inclusive counts come from a shadow call stack per thread: a CALL pushes
//! a frame, a RETURN pops to the frame whose call it returns after (so
//! longjmp and unmatched returns resynchronise), a signal handler is a frame
//! that ends when the kernel returns to the interrupted pc. The function a
//! thread is in when its trace starts (or after that one returns) is a root
//! frame, as if called there. A function already on the stack (recursion)
//! is counted once.
//!
//! A call to a PLT stub is a call to the function the stub jumps to: the
//! frame opens at the call (so the stub's instructions, and on a lazily bound
//! first call the dynamic linker's resolver, count in the callee's inclusive
//! cost) and takes the callee's identity at the first jump out of the PLT
//! (not the header's jump to the resolver, nor the resolver's own jumps).

use crate::names::printable;
use crate::replay::{replay, Block, Sink, Where};
use crate::resolve::{Location, Resolver};
use crate::symbols::PltPart;
use crate::threads::Names;
use crate::{PostError, Trace};
use itrace_format::{branch_flags, BranchKind, Lost, TraceOff};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;

/// A return lands at most this far after its call (longest x86 call is 7 bytes; other architectures less).
const MAX_CALL_LEN: u64 = 16;

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
#[derive(Clone, Debug, Serialize)]
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
    pub arch: String,
    pub mode: String,
    pub step_method: String,
    pub total_instructions: u64,
    pub total_branches: u64,
    pub lost_records: u64,
    pub functions: Vec<FunctionRow>,
    pub modules: Vec<ModuleRow>,
    pub threads: Vec<ThreadRow>,
    /// Warnings and hints about the names (changed or missing files, stripped modules), one
    /// line each starting with `warning:` or `hint:`.
    pub notes: Vec<String>,
}

#[derive(Default, Clone)]
struct FuncStats {
    self_: u64,
    inclusive: u64,
    calls: u64,
    active: u32,
}

struct Frame {
    func: u32,
    /// The function a thread was in when its tracing started (no call seen): it stays on the
    /// stack until it returns, so its inclusive count covers what it called.
    root: bool,
    /// Address of the call instruction (u64::MAX for a signal handler frame).
    call_from: u64,
    /// For a signal handler: where the interrupted code resumes.
    resume_pc: u64,
    entry_total: u64,
    /// A call to a PLT stub whose target is not known yet: `func` is the stub.
    plt_pending: bool,
}

#[derive(Default)]
struct ThreadStats {
    pid: u32,
    instructions: u64,
    branches: u64,
    stack: Vec<Frame>,
    /// Where the last signal interrupted this thread.
    signal_from: u64,
}

/// Every function's totals, by interned function id.
#[derive(Default)]
struct FuncTable(Vec<FuncStats>);

impl FuncTable {
    fn get(&mut self, id: u32) -> &mut FuncStats {
        let i = id as usize;
        if i >= self.0.len() {
            self.0.resize(i + 1, FuncStats::default());
        }
        &mut self.0[i]
    }
}

#[derive(Default)]
struct ReportSink {
    funcs: FuncTable,
    /// By thread id: looked up once per record, so Fx-hashed; sorted by id at the end.
    threads: FxHashMap<u32, ThreadStats>,
    total_branches: u64,
    lost: u64,
}

impl ThreadStats {
    fn push(&mut self, funcs: &mut FuncTable, func: u32, call_from: u64, resume_pc: u64, plt_pending: bool) {
        funcs.get(func).active += 1;
        self.stack.push(Frame { func, root: false, call_from, resume_pc, entry_total: self.instructions, plt_pending });
    }

    /// A jump in process `pid` from a block at `from` to `to`: if the thread's newest frame is
    /// a call to a PLT stub still waiting for its target, and this jump leaves the PLT for the
    /// target, the frame becomes a call to the target.
    fn follow_plt(&mut self, funcs: &mut FuncTable, pid: u32, from: &Location, to: u64, res: &mut Resolver) {
        let Some(frame) = self.stack.last_mut().filter(|f| f.plt_pending) else { return };
        let target = res.resolve(pid, to);
        let waiting = match (target.plt, from.plt) {
            // From stub to stub (`.plt.sec` to `.plt` on a lazy first call), or to the header.
            (Some(_), _) => true,
            // The header jumps to the dynamic linker's resolver.
            (None, Some(PltPart::Header)) => true,
            (None, Some(PltPart::Stub)) => false,
            // In the resolver: its own jumps, until it jumps to the function it looked up.
            (None, None) => target.func == from.func,
        };
        if waiting {
            return;
        }
        let stub = std::mem::replace(&mut frame.func, target.func);
        frame.plt_pending = false;
        funcs.get(stub).active -= 1;
        let f = funcs.get(target.func);
        f.active += 1;
        f.calls += 1;
    }

    /// A thread with nothing on its stack is in a function it was not seen to call: the
    /// start of its trace, or after that function returned. Open a root frame for it.
    fn ensure_root(&mut self, funcs: &mut FuncTable, func: u32) {
        if self.stack.is_empty() {
            self.stack.push(Frame {
                func,
                root: true,
                call_from: 0,
                resume_pc: 0,
                entry_total: self.instructions,
                plt_pending: false,
            });
            funcs.get(func).active += 1;
        }
    }

    /// Close the frames from index `i` up, newest first.
    fn pop_to(&mut self, funcs: &mut FuncTable, i: usize) {
        let total = self.instructions;
        while self.stack.len() > i {
            let fr = self.stack.pop().expect("the stack is longer than i");
            let f = funcs.get(fr.func);
            if fr.plt_pending {
                // The stub's target was never seen: the call stays with the stub.
                f.calls += 1;
            }
            f.active -= 1;
            if f.active == 0 {
                f.inclusive += total - fr.entry_total;
            }
        }
    }

    fn add_self(&mut self, funcs: &mut FuncTable, pid: u32, func: u32, n: u32) {
        funcs.get(func).self_ += n as u64;
        self.pid = pid;
        self.instructions += n as u64;
    }
}

impl Sink for ReportSink {
    fn block(&mut self, b: &Block, _names: &mut Names, res: &mut Resolver) -> Result<(), PostError> {
        let br = b.branch;
        self.total_branches += 1;
        let funcs = &mut self.funcs;
        let th = self.threads.entry(br.tid).or_default();
        th.branches += 1;
        match &b.loc {
            Where::User(l) => {
                th.ensure_root(funcs, l.func);
                th.add_self(funcs, b.pid, l.func, br.icount);
                match br.kind {
                    // A call from PLT code to PLT code is ppc64 glink's `bcl` that reads its
                    // own address, not a call.
                    BranchKind::Call if l.plt.is_some() && res.resolve(b.pid, br.to).plt.is_some() => {}
                    BranchKind::Call => {
                        let callee = res.resolve(b.pid, br.to);
                        let via_plt = callee.plt.is_some();
                        if !via_plt {
                            funcs.get(callee.func).calls += 1;
                        }
                        th.push(funcs, callee.func, br.from, 0, via_plt);
                    }
                    BranchKind::Jump => th.follow_plt(funcs, b.pid, l, br.to, res),
                    BranchKind::Return => {
                        let hit = th.stack.iter().rposition(|f| {
                            !f.root
                                && f.call_from != u64::MAX
                                && br.to > f.call_from
                                && br.to - f.call_from <= MAX_CALL_LEN
                        });
                        if let Some(i) = hit {
                            th.pop_to(funcs, i);
                        } else if th.stack.len() == 1 && th.stack[0].root {
                            // The root function returns to a caller the trace never saw call it.
                            th.pop_to(funcs, 0);
                        }
                    }
                    BranchKind::Intrpt if br.flags & branch_flags::SIGNAL != 0 => {
                        th.signal_from = br.from;
                    }
                    _ => {}
                }
            }
            Where::Kernel(_) => {
                // Back from the kernel to where a signal interrupted: its handler frames end.
                if let Some(i) = th.stack.iter().rposition(|f| f.call_from == u64::MAX && f.resume_pc == br.to) {
                    th.pop_to(funcs, i);
                }
                if br.flags & branch_flags::SIGNAL != 0 {
                    let resume = th.signal_from;
                    let handler = res.resolve(b.pid, br.to).func;
                    funcs.get(handler).calls += 1;
                    th.push(funcs, handler, u64::MAX, resume, false);
                }
            }
        }
        Ok(())
    }

    fn trace_off(
        &mut self,
        off: &TraceOff,
        partial: Option<&Location>,
        _at: &Location,
        _names: &mut Names,
    ) -> Result<(), PostError> {
        let th = self.threads.entry(off.tid).or_default();
        if let Some(l) = partial {
            th.ensure_root(&mut self.funcs, l.func);
            th.add_self(&mut self.funcs, off.pid, l.func, off.icount);
        }
        th.pop_to(&mut self.funcs, 0);
        Ok(())
    }

    fn lost(&mut self, _cpu: u16, lost: &Lost) -> Result<(), PostError> {
        self.lost = self.lost.saturating_add(lost.count);
        Ok(())
    }
}

/// Build the report of `trace`.
pub fn build(trace: &Trace, progress: &mut dyn FnMut(u64)) -> Result<Report, PostError> {
    let mut sink = ReportSink::default();
    let (names, res) = replay(trace, false, &mut sink, progress)?;
    // In thread id order: a function active in several threads gets its inclusive count
    // when the last of them closes it.
    let mut threads: Vec<(u32, ThreadStats)> = sink.threads.into_iter().collect();
    threads.sort_unstable_by_key(|&(tid, _)| tid);
    for (_, th) in &mut threads {
        th.pop_to(&mut sink.funcs, 0);
    }
    let mut functions: Vec<FunctionRow> = sink
        .funcs
        .0
        .iter()
        .enumerate()
        .filter(|(_, f)| f.self_ > 0 || f.calls > 0 || f.inclusive > 0)
        .map(|(i, f)| {
            let (module, name) = res.func(i as u32);
            FunctionRow {
                name: name.to_string(),
                module: module.to_string(),
                self_instructions: f.self_,
                // A function never seen called (the entry point) still includes its own work.
                inclusive: f.inclusive.max(f.self_),
                calls: f.calls,
            }
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
    let threads: Vec<ThreadRow> = threads
        .iter()
        .map(|(tid, t)| ThreadRow {
            pid: if t.pid != 0 { t.pid } else { names.pid_of(*tid) },
            tid: *tid,
            name: names.thread_name(*tid).to_string(),
            instructions: t.instructions,
            branches: t.branches,
        })
        .collect();
    let h = trace.header();
    let lost = match trace.summary() {
        Some(s) => crate::summary_lost(s).max(sink.lost),
        None => sink.lost,
    };
    Ok(Report {
        arch: h.arch.to_string(),
        mode: h.mode.to_string(),
        step_method: h.step_method.to_string(),
        total_instructions: threads.iter().map(|t| t.instructions).sum(),
        total_branches: sink.total_branches,
        lost_records: lost,
        functions,
        modules,
        threads,
        notes: res.notes().to_vec(),
    })
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
        writeln!(out, "\nFunctions (by self instructions)")?;
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
