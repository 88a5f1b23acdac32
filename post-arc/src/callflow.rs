//! `itrace replay`: the call flow of each thread, one line per call and per return, nested by
//! depth, as `uftrace replay` shows it, with each call's instructions: inclusive (all that ran
//! while its frame was open, less signal handlers that interrupted it, as the report counts
//! them) and self (less the calls it made).
//!
//! The calls are the frames of [`crate::stacks`], told in trace order through the timeline's
//! machinery ([`crate::timeline`]): the same tail calls, PLT calls (named after their target),
//! longjmps, signal handlers and roots as the report's call tree. A call that makes no call is
//! one line (`fib();`); others open (`main() {`) and close (`} /* main */`) with their
//! counts on the closing line. Output streams: memory grows with the call depth and the
//! threads, never with the trace's length.

use crate::funcname::{FunctionQuery, NameError};
use crate::names::printable;
use crate::timeline::{run_timeline, MarkerKind, SpanKind, TimeAxis, TimelineWriter};
use crate::{PostError, Trace};
use rustc_hash::{FxHashMap, FxHashSet};
use std::io::Write;
use std::sync::Arc;

/// `name` as a call: `main()`, and a C++ signature as it is (`geo::Rect::area() const`).
fn called(name: &str) -> String {
    let name = printable(name);
    if name.contains('(') {
        name.into_owned()
    } else {
        format!("{name}()")
    }
}

/// What `itrace replay` shows.
#[derive(Clone, Debug, Default)]
pub struct FlowOptions {
    /// Only this thread.
    pub tid: Option<u32>,
    /// Only calls this many levels deep at most (from the thread's outermost frame, or from
    /// the `function`'s frame with `function`); 0: all.
    pub depth: usize,
    /// Only calls of the function this names and what they call.
    pub function: Option<String>,
}

/// What was written.
#[derive(Clone, Debug, Default)]
pub struct FlowStats {
    /// Call lines written (a call shown as `f();` or as `f() {` ... `}` counts once).
    pub calls: u64,
    /// Instructions of the threads' outermost frames shown, summed (with a range covering the
    /// whole trace and no filter: every instruction of the trace not run in a signal handler).
    pub top_inclusive: u64,
    pub total_instructions: u64,
    pub notes: Vec<String>,
}

/// Write the call flow of `trace` (over its range) to `out`.
pub fn write_call_flow(
    trace: &Trace,
    opts: &FlowOptions,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<FlowStats, PostError> {
    let function = match &opts.function {
        Some(name) => Some(crate::replay::functions_named(trace, &FunctionQuery::new(name)).map_err(|e| match e {
            PostError::Name(NameError::NotFound(n)) => PostError::NoSuchFunction(n),
            e => e,
        })?),
        None => None,
    };
    writeln!(out, "# {:>12} {:>12}  {:>7}  function", "inclusive", "self", "tid")?;
    let mut writer = FlowWriter { out, opts, function, threads: FxHashMap::default(), calls: 0, top_inclusive: 0 };
    let stats = run_timeline(trace, TimeAxis::Instructions, 0, &mut writer, progress)?;
    if let Some(tid) = opts.tid {
        if !writer.threads.contains_key(&tid) {
            return Err(PostError::NoSuchThread(tid));
        }
    }
    Ok(FlowStats {
        calls: writer.calls,
        top_inclusive: writer.top_inclusive,
        total_instructions: stats.total_instructions,
        notes: stats.notes,
    })
}

struct FlowFrame {
    name: Arc<str>,
    kind: SpanKind,
    begin: u64,
    /// The thread's signal-handler instructions when the frame opened.
    handlers_then: u64,
    /// Inclusive instructions of the calls it made (signal handlers apart).
    children: u64,
    /// Its `name() {` line is written.
    opened: bool,
    /// Its depth in the flow shown: from the thread's outermost frame, or from the outermost
    /// call of `-F`'s function (None outside it).
    level: Option<usize>,
    /// Within `--tid` and `--depth`.
    shown: bool,
}

#[derive(Default)]
struct FlowThread {
    frames: Vec<FlowFrame>,
    /// Instructions run in signal handlers so far (each once when nested).
    handlers: u64,
    /// Open frames of `-F`'s function.
    inside: usize,
    /// A leaf span is open.
    in_leaf: bool,
}

struct FlowWriter<'a> {
    out: &'a mut dyn Write,
    opts: &'a FlowOptions,
    function: Option<FxHashSet<Arc<str>>>,
    threads: FxHashMap<u32, FlowThread>,
    calls: u64,
    top_inclusive: u64,
}

/// Instructions on the timeline's axis (1000 units each).
const UNIT: u64 = 1000;

impl FlowWriter<'_> {
    fn indent(depth: usize) -> String {
        // Deep recursion stays readable: the indent stops growing at 40 levels and says its depth.
        if depth <= 40 {
            "  ".repeat(depth)
        } else {
            format!("{}[{depth}] ", "  ".repeat(40))
        }
    }

    fn kind_note(kind: SpanKind) -> &'static str {
        match kind {
            SpanKind::TailCall => "  /* tail call */",
            SpanKind::SignalHandler => "  /* signal handler */",
            SpanKind::SignalTrampoline => "  /* signal return */",
            SpanKind::Root => "  /* not seen called */",
            SpanKind::Call | SpanKind::Leaf => "",
        }
    }

    /// Write the `name() {` line of the newest frame of `tid` if it is shown and not written yet.
    fn open_line(&mut self, tid: u32) -> Result<(), PostError> {
        let Some(th) = self.threads.get_mut(&tid) else { return Ok(()) };
        let Some(f) = th.frames.last_mut() else { return Ok(()) };
        if let (true, Some(depth), false) = (f.shown, f.level, f.opened) {
            f.opened = true;
            writeln!(
                self.out,
                "  {:>12} {:>12}  [{tid:>5}]  {}{} {{{}",
                "",
                "",
                Self::indent(depth),
                called(&f.name),
                Self::kind_note(f.kind)
            )?;
        }
        Ok(())
    }
}

impl TimelineWriter for FlowWriter<'_> {
    fn thread(&mut self, _pid: u32, tid: u32, _process: &str, _name: &str) -> Result<(), PostError> {
        self.threads.entry(tid).or_default();
        Ok(())
    }

    fn begin(&mut self, tid: u32, name: &str, kind: SpanKind, time: u64) -> Result<(), PostError> {
        if kind == SpanKind::Leaf {
            // Instructions of a function without a frame of its own: the caller's self. (A
            // leaf span ends before any other span begins or ends.)
            self.threads.entry(tid).or_default().in_leaf = true;
            return Ok(());
        }
        let in_thread = self.opts.tid.is_none_or(|t| t == tid);
        let is_function = self.function.as_ref().is_some_and(|f| f.contains(name));
        let th = self.threads.entry(tid).or_default();
        let parent_level = th.frames.last().and_then(|f| f.level);
        let level = match &self.function {
            None => Some(th.frames.len()),
            // The outermost call of -F's function is level 0; what it calls is under it.
            Some(_) if th.inside == 0 && is_function => Some(0),
            Some(_) if th.inside > 0 => parent_level.map(|l| l + 1),
            Some(_) => None,
        };
        if is_function {
            th.inside += 1;
        }
        let shown = in_thread && level.is_some_and(|l| self.opts.depth == 0 || l < self.opts.depth);
        let handlers_then = th.handlers;
        if shown {
            self.open_line(tid)?;
        }
        let th = self.threads.entry(tid).or_default();
        th.frames.push(FlowFrame {
            name: Arc::from(name),
            kind,
            begin: time,
            handlers_then,
            children: 0,
            opened: false,
            level,
            shown,
        });
        Ok(())
    }

    fn end(&mut self, tid: u32, time: u64) -> Result<(), PostError> {
        let Some(th) = self.threads.get_mut(&tid) else { return Ok(()) };
        if std::mem::take(&mut th.in_leaf) {
            return Ok(());
        }
        let Some(f) = th.frames.pop() else { return Ok(()) };
        let handled = th.handlers - f.handlers_then;
        let inclusive = (time.saturating_sub(f.begin) / UNIT).saturating_sub(handled);
        let handler = matches!(f.kind, SpanKind::SignalHandler | SpanKind::SignalTrampoline);
        if handler {
            th.handlers += inclusive;
        } else if let Some(parent) = th.frames.last_mut() {
            parent.children += inclusive;
        }
        let self_instructions = inclusive.saturating_sub(f.children);
        if self.function.as_ref().is_some_and(|s| s.contains(&f.name)) {
            th.inside -= 1;
        }
        let (true, Some(level)) = (f.shown, f.level) else { return Ok(()) };
        if level == 0 && !handler {
            self.top_inclusive += inclusive;
        }
        self.calls += 1;
        let (name, indent) = (printable(&f.name), Self::indent(level));
        if f.opened {
            writeln!(self.out, "  {inclusive:>12} {self_instructions:>12}  [{tid:>5}]  {indent}}} /* {name} */")?;
        } else {
            writeln!(
                self.out,
                "  {inclusive:>12} {self_instructions:>12}  [{tid:>5}]  {indent}{};{}",
                called(&f.name),
                Self::kind_note(f.kind)
            )?;
        }
        Ok(())
    }

    fn run(&mut self, _tid: u32, _instructions: u64, _time: u64) -> Result<(), PostError> {
        Ok(())
    }

    fn marker(&mut self, _tid: u32, _name: &str, _kind: MarkerKind, _number: u16, _time: u64) -> Result<(), PostError> {
        Ok(())
    }

    fn finish(&mut self) -> Result<(), PostError> {
        Ok(())
    }
}
