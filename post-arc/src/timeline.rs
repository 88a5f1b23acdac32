//! `itrace export --format chrome|firefox`: the trace as a timeline of call spans per thread,
//! for Perfetto and chrome://tracing (Trace Event Format JSON) or the Firefox Profiler (its
//! processed profile format, through the fxprof-processed-profile crate, as samply writes it).
//!
//! The spans are the frames of [`crate::stacks`] (the call stacks `report`, `flamegraph` and
//! the callgrind export share), told in trace order by [`Collect::events`]: a span opens when a
//! frame does and ends when it closes. Instructions that run in a function without a frame of
//! its own (a PLT stub, a jump into the middle of another function) are a *leaf* span above the
//! newest frame, as they are a leaf in the flame graph. System calls and signal deliveries (the
//! kernel's `K` records) are instant markers. A call through a PLT stub is held back until the
//! stub jumps to its target, so that its span carries the target's name.
//!
//! Two clocks ([`TimeAxis`]): the instructions each thread ran (exact; one instruction is one
//! microsecond on the viewers' axis), or the recorded timestamps, interpolated by instruction
//! count between the records where the clock reading changes (some backends read the clock
//! once per 64 records). Memory grows with the call depth and the threads, not the trace's
//! length, for the Chrome format; the Firefox profile is built whole in memory by the crate.
//!
//! A Chrome file a browser can open holds a few hundred thousand spans: spans shorter than a
//! minimum are merged into the span they ran in ([`SpanSelection`]), the minimum chosen from
//! a first replay that measures the spans when the trace may not fit.

use crate::replay::{replay, Block, GapCause, Sink, Where};
use crate::resolve::{Location, Resolver};
use crate::stacks::{CallStacks, Collect, Opened, StackEvent};
use crate::threads::Names;
use crate::{PostError, Trace};
use itrace_format::{branch_flags, Lost, TraceOff};
use rustc_hash::FxHashMap;
use std::io::Write;
use std::sync::Arc;

/// What the time axis of a timeline counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeAxis {
    /// Instructions run: each thread's clock is the instructions it ran, started at the
    /// instructions the whole trace had run when the thread first ran (so later threads start
    /// later). Exact: a span's length is the instructions run while its frame was open.
    Instructions,
    /// The records' timestamps (CLOCK_MONOTONIC, from the trace's start), interpolated by
    /// instruction count between the records where the reading changes.
    Timestamps,
}

/// The file format of a timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimelineFormat {
    /// Trace Event Format JSON (B/E duration events, instant events, thread name metadata).
    Chrome,
    /// The Firefox Profiler's processed profile JSON, gzip-compressed when `gzip`.
    Firefox { gzip: bool },
}

/// What a span is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// A call (a CALL record, or a call through a PLT stub).
    Call,
    /// A jump to another function's first instruction.
    TailCall,
    /// A signal handler the kernel ran.
    SignalHandler,
    /// The signal trampoline (`__restore_rt`) a handler returned to, until `rt_sigreturn`.
    SignalTrampoline,
    /// A function no call was seen into: where a thread's trace starts, or what that returned to.
    Root,
    /// Instructions of a function without a frame of its own, above the newest frame.
    Leaf,
}

impl SpanKind {
    /// The name of the kind in the outputs (the Chrome format's `cat`).
    pub fn category(self) -> &'static str {
        match self {
            SpanKind::Call => "call",
            SpanKind::TailCall => "tail call",
            SpanKind::SignalHandler => "signal handler",
            SpanKind::SignalTrampoline => "signal trampoline",
            SpanKind::Root => "root",
            SpanKind::Leaf => "leaf",
        }
    }

    fn of(how: Opened) -> SpanKind {
        match how {
            Opened::Call | Opened::PltCall => SpanKind::Call,
            Opened::TailCall => SpanKind::TailCall,
            Opened::SignalHandler => SpanKind::SignalHandler,
            Opened::SignalTrampoline => SpanKind::SignalTrampoline,
            Opened::Root => SpanKind::Root,
        }
    }
}

/// What a marker marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerKind {
    /// A system call returned (`sys_write`).
    Syscall,
    /// The kernel delivered a signal (`signal_SIGUSR1`).
    Signal,
}

impl MarkerKind {
    pub fn category(self) -> &'static str {
        match self {
            MarkerKind::Syscall => "syscall",
            MarkerKind::Signal => "signal",
        }
    }
}

/// Which spans a Chrome timeline keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanSelection {
    /// Every span.
    All,
    /// Spans at least this long on the viewer's axis (microseconds: one instruction each on the
    /// instructions clock); shorter ones are merged into the span they ran in.
    MinSpan(u64),
    /// The smallest [`SpanSelection::MinSpan`] (or none; a whole number up to 4096, a power of
    /// two above) whose file fits in about this many bytes. A trace that may exceed it is
    /// replayed once more first, to measure.
    MaxBytes(u64),
}

/// The default size a Chrome timeline is kept under: about what a browser tab opens.
pub const CHROME_MAX_BYTES: u64 = 100 << 20;

/// What was written.
#[derive(Clone, Debug, Default)]
pub struct TimelineStats {
    pub threads: usize,
    pub spans: u64,
    pub markers: u64,
    pub total_instructions: u64,
    /// Warnings and hints about the names, as in [`crate::report::Report::notes`].
    pub notes: Vec<String>,
    /// Chrome: spans shorter than this many microseconds on the axis were merged (0: none).
    pub min_span: u64,
    /// Chrome: the spans merged, and the instructions they ran (each counted once).
    pub merged_spans: u64,
    pub merged_instructions: u64,
}

/// A timeline format's writer. Per thread, calls come in time order, spans nest (an `end`
/// ends the newest span of the thread), and `thread` comes before any other call of its tid.
/// Times are nanoseconds on the chosen axis (an instruction is 1000).
pub(crate) trait TimelineWriter {
    /// A thread, when first seen and again at the end (its name may have changed).
    fn thread(&mut self, pid: u32, tid: u32, process: &str, name: &str) -> Result<(), PostError>;
    fn begin(&mut self, tid: u32, name: &str, kind: SpanKind, time: u64) -> Result<(), PostError>;
    fn end(&mut self, tid: u32, time: u64) -> Result<(), PostError>;
    /// `instructions` ran with the thread's current spans, from `time` on.
    fn run(&mut self, tid: u32, instructions: u64, time: u64) -> Result<(), PostError>;
    fn marker(&mut self, tid: u32, name: &str, kind: MarkerKind, number: u16, time: u64) -> Result<(), PostError>;
    /// The end of the trace: write what is left.
    fn finish(&mut self) -> Result<(), PostError>;
}

/// Write the timeline of `trace` to `out`. `spans` says which spans a Chrome timeline keeps
/// (the Firefox profile keeps them all).
pub fn write_timeline(
    trace: &Trace,
    format: TimelineFormat,
    axis: TimeAxis,
    spans: SpanSelection,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<TimelineStats, PostError> {
    let header = trace.header();
    let start_ns = header.start_monotonic_ns;
    let what = match axis {
        TimeAxis::Instructions => "instructions (1 us = 1 instruction)",
        TimeAxis::Timestamps => "timestamps (CLOCK_MONOTONIC from the trace's start)",
    };
    let title = trace.path().file_name().map_or_else(|| "trace".to_string(), |n| n.to_string_lossy().into_owned());
    match format {
        TimelineFormat::Chrome => {
            let min_span = match spans {
                SpanSelection::All => 0,
                SpanSelection::MinSpan(micros) => micros,
                SpanSelection::MaxBytes(max) => chrome_min_span(trace, axis, start_ns, max, progress)?,
            };
            let mut writer = ChromeWriter::new(out, &title, what, min_span.saturating_mul(1000))?;
            let mut stats = run_timeline(trace, axis, start_ns, &mut writer, progress)?;
            (stats.merged_spans, stats.merged_instructions) = writer.merged();
            stats.spans -= stats.merged_spans;
            stats.min_span = min_span;
            Ok(stats)
        }
        TimelineFormat::Firefox { gzip } => {
            let mut writer = FirefoxWriter::new(&title, header.start_realtime_ns, firefox_window(trace));
            let mut stats = run_timeline(trace, axis, start_ns, &mut writer, progress)?;
            stats.notes.extend(writer.notes());
            if gzip {
                let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
                writer.write_json(&mut gz)?;
                gz.finish()?.flush()?;
            } else {
                writer.write_json(out)?;
                out.flush()?;
            }
            Ok(stats)
        }
    }
}

/// The minimum span (µs on the axis) that keeps the Chrome timeline of `trace` within about
/// `max_bytes`: 0 when even every span fits. A trace with few branches fits without looking;
/// a longer one is replayed once to measure its spans.
fn chrome_min_span(
    trace: &Trace,
    axis: TimeAxis,
    start_ns: u64,
    max_bytes: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<u64, PostError> {
    let branches = match trace.summary() {
        Some(s) => s.records.iter().sum::<u64>(),
        None => trace.trace_bytes(),
    };
    if branches.saturating_mul(CHROME_BYTES_PER_BRANCH) <= max_bytes {
        return Ok(0);
    }
    let mut sizes = ChromeSizes::new();
    run_timeline(trace, axis, start_ns, &mut sizes, progress)?;
    Ok(sizes.min_span_within(max_bytes).0)
}

pub(crate) fn run_timeline(
    trace: &Trace,
    axis: TimeAxis,
    start_ns: u64,
    writer: &mut dyn TimelineWriter,
    progress: &mut dyn FnMut(u64),
) -> Result<TimelineStats, PostError> {
    let mut sink = TimelineSink {
        stacks: CallStacks::new(Collect { events: true, ..Collect::default() }),
        axis,
        start_ns,
        writer,
        threads: FxHashMap::default(),
        func_names: Vec::new(),
        total_instructions: 0,
        batch: 0,
        spans: 0,
        markers: 0,
    };
    let (names, res) = replay(trace, false, &mut sink, progress)?;
    sink.finish(&names)?;
    Ok(TimelineStats {
        threads: sink.threads.len(),
        spans: sink.spans,
        markers: sink.markers,
        total_instructions: sink.total_instructions,
        notes: res.notes().to_vec(),
        ..TimelineStats::default()
    })
}

/// The time at instruction `count` of a thread whose clock read `t0` at instruction `i0` and
/// `t1` at `i1` (`i1 > i0`): as if the instructions between ran at an even pace.
fn interpolate((i0, t0): (u64, u64), (i1, t1): (u64, u64), count: u64) -> u64 {
    let done = count.clamp(i0, i1) - i0;
    t0 + (t1.saturating_sub(t0) as u128 * done as u128 / (i1 - i0) as u128) as u64
}

/// A stack change or marker of one thread, before its time is known.
#[derive(Clone, Copy, Debug)]
enum Op {
    Open { depth: u32, func: u32, how: Opened },
    Retarget { depth: u32, func: u32 },
    Close { depth: u32 },
    Run { func: u32, n: u32, framed: bool },
    Marker { func: u32, kind: MarkerKind, number: u16 },
}

/// An [`Op`] waiting for the clock's next reading.
struct Queued {
    op: Op,
    /// The thread's instructions when it happened.
    count: u64,
    /// The record it came from.
    batch: u64,
}

/// A writer call, timed, held while a PLT call's target is not known.
#[derive(Clone, Copy, Debug)]
enum Out {
    Begin { func: u32, kind: SpanKind, time: u64 },
    End { time: u64 },
    Run { n: u64, time: u64 },
    Marker { func: u32, kind: MarkerKind, number: u16, time: u64 },
}

/// An open frame's span.
struct FrameSpan {
    /// For a call to a PLT stub whose target is not known yet: its `Begin` in `held`.
    held_at: Option<usize>,
}

/// Ops waiting for a clock reading: at most this many per thread; past it they take the last
/// reading (a clock that stops would otherwise hold the whole trace).
const MAX_QUEUED: usize = 1 << 16;
/// Writer calls held for a PLT call's target: at most this many; past it they are written
/// with the stub's name.
const MAX_HELD: usize = 1 << 16;

#[derive(Default)]
struct ThreadLine {
    pid: u32,
    /// [`TimeAxis::Instructions`]: the trace's instructions when the thread first ran.
    offset: u64,
    /// The last clock reading: (the thread's instructions then, ns).
    point: Option<(u64, u64)>,
    last_ts: u64,
    queue: Vec<Queued>,
    frames: Vec<FrameSpan>,
    /// The function of the open leaf span.
    leaf: Option<u32>,
    /// Time of the thread's latest op (a leaf ends then).
    now: u64,
    /// PLT calls whose span is held.
    pending: u32,
    held: Vec<Out>,
}

struct TimelineSink<'w> {
    stacks: CallStacks,
    axis: TimeAxis,
    start_ns: u64,
    writer: &'w mut dyn TimelineWriter,
    threads: FxHashMap<u32, ThreadLine>,
    /// Function names by id, as far as seen (trace-off records come without the resolver).
    func_names: Vec<Option<Arc<str>>>,
    total_instructions: u64,
    batch: u64,
    spans: u64,
    markers: u64,
}

impl TimelineSink<'_> {
    fn learn_name(&mut self, func: u32, name: impl FnOnce() -> Arc<str>) {
        let i = func as usize;
        if i >= self.func_names.len() {
            self.func_names.resize(i + 1, None);
        }
        if self.func_names[i].is_none() {
            self.func_names[i] = Some(name());
        }
    }

    /// The thread's line, announced to the writer when first seen.
    fn ensure_thread(&mut self, tid: u32, pid: u32, names: &Names) -> Result<(), PostError> {
        if !self.threads.contains_key(&tid) {
            let line = ThreadLine { pid, offset: self.total_instructions, ..ThreadLine::default() };
            self.threads.insert(tid, line);
            self.writer.thread(pid, tid, names.process_name(pid), names.thread_name(tid))?;
        }
        Ok(())
    }

    /// The stack changes of the record just replayed, queued for their time.
    fn take_events(&mut self, res: Option<&Resolver>) {
        let events: Vec<StackEvent> = self.stacks.drain_events().collect();
        for e in events {
            let (tid, op, count) = match e {
                StackEvent::Open { tid, depth, func, how, at } => (tid, Op::Open { depth, func, how }, at),
                StackEvent::Retarget { tid, depth, func } => {
                    let at = self.stacks.threads.get(&tid).map_or(0, |t| t.instructions);
                    (tid, Op::Retarget { depth, func }, at)
                }
                StackEvent::Close { tid, depth, at } => (tid, Op::Close { depth }, at),
                StackEvent::Run { tid, func, n, framed, at } => {
                    self.total_instructions += n as u64;
                    (tid, Op::Run { func, n, framed }, at - n as u64)
                }
            };
            if let (Some(res), Op::Open { func, .. } | Op::Retarget { func, .. } | Op::Run { func, .. }) = (res, op) {
                self.learn_name(func, || Arc::from(res.func(func).1));
            }
            self.queue(tid, op, count);
        }
    }

    fn queue(&mut self, tid: u32, op: Op, count: u64) {
        let batch = self.batch;
        let th = self.threads.entry(tid).or_default();
        th.queue.push(Queued { op, count, batch });
    }

    /// The clock of `tid` read `ts` with the thread at `count` instructions (or nothing new
    /// when `ts` is none): time the queued ops that can be timed, and pass them on. `flush`
    /// times them all (the thread's trace ends, or the trace does).
    fn clock(&mut self, tid: u32, ts: Option<u64>, count: u64, flush: bool) -> Result<(), PostError> {
        let Some(th) = self.threads.get_mut(&tid) else { return Ok(()) };
        let timed: Vec<(Op, u64)> = match self.axis {
            TimeAxis::Instructions => {
                let offset = th.offset;
                th.queue.drain(..).map(|q| (q.op, (offset + q.count).saturating_mul(1000))).collect()
            }
            TimeAxis::Timestamps => {
                let new = ts.filter(|&t| th.point.is_none() || t > th.last_ts);
                let reading = match new {
                    Some(t) => Some(t),
                    None if flush || th.queue.len() > MAX_QUEUED => Some(th.point.map_or(0, |p| p.1)),
                    None => None,
                };
                let Some(t1) = reading else { return Ok(()) };
                let t1 = t1.max(th.point.map_or(0, |p| p.1));
                let (i0, t0) = th.point.unwrap_or((count, t1));
                let current = self.batch;
                let timed = th
                    .queue
                    .drain(..)
                    .map(|q| {
                        let t = if count > i0 {
                            interpolate((i0, t0), (count, t1), q.count)
                        } else if q.batch == current {
                            t1
                        } else {
                            t0
                        };
                        (q.op, t)
                    })
                    .collect();
                if let Some(t) = new {
                    th.last_ts = t;
                }
                th.point = Some((count, t1));
                timed
            }
        };
        for (op, time) in timed {
            self.apply(tid, op, time)?;
        }
        Ok(())
    }

    /// A timed op of `tid`: spans opened and closed, leaves, held PLT calls.
    fn apply(&mut self, tid: u32, op: Op, time: u64) -> Result<(), PostError> {
        let Some(th) = self.threads.get_mut(&tid) else { return Ok(()) };
        let time = time.max(th.now);
        th.now = time;
        let mut out: Vec<Out> = Vec::with_capacity(2);
        let leaf_ends = match op {
            Op::Open { .. } | Op::Close { .. } => true,
            Op::Run { func, framed, .. } => framed || th.leaf != Some(func),
            Op::Retarget { .. } | Op::Marker { .. } => false,
        };
        if leaf_ends && th.leaf.take().is_some() {
            out.push(Out::End { time });
        }
        match op {
            Op::Open { depth, func, how } => {
                // The stacks say where the frame is; anything above it was closed already.
                while th.frames.len() > depth as usize {
                    if th.frames.pop().is_some_and(|f| f.held_at.is_some()) {
                        th.pending -= 1;
                    }
                    out.push(Out::End { time });
                }
                let held = how == Opened::PltCall && th.held.len() < MAX_HELD;
                if held {
                    th.pending += 1;
                }
                let held_at = held.then(|| th.held.len() + out.len());
                th.frames.push(FrameSpan { held_at });
                out.push(Out::Begin { func, kind: SpanKind::of(how), time });
            }
            Op::Retarget { depth, func } => {
                if let Some(i) = th.frames.get_mut(depth as usize).and_then(|f| f.held_at.take()) {
                    if let Some(Out::Begin { func: f, .. }) = th.held.get_mut(i) {
                        *f = func;
                    }
                    th.pending -= 1;
                }
            }
            Op::Close { depth } => {
                while th.frames.len() > depth as usize {
                    if th.frames.pop().is_some_and(|f| f.held_at.is_some()) {
                        th.pending -= 1;
                    }
                    out.push(Out::End { time });
                }
            }
            Op::Run { func, n, framed } => {
                if !framed && th.leaf.is_none() {
                    th.leaf = Some(func);
                    out.push(Out::Begin { func, kind: SpanKind::Leaf, time });
                }
                out.push(Out::Run { n: n as u64, time });
            }
            Op::Marker { func, kind, number } => out.push(Out::Marker { func, kind, number, time }),
        }
        th.held.append(&mut out);
        let release = th.pending == 0 || th.held.len() >= MAX_HELD;
        if !release {
            return Ok(());
        }
        if th.pending > 0 {
            // Too much to hold: the held calls keep the stub's name.
            th.pending = 0;
            for f in &mut th.frames {
                f.held_at = None;
            }
        }
        let held = std::mem::take(&mut th.held);
        for o in &held {
            self.write(tid, *o)?;
        }
        // Keep the allocation.
        if let Some(th) = self.threads.get_mut(&tid) {
            let mut held = held;
            held.clear();
            th.held = held;
        }
        Ok(())
    }

    fn write(&mut self, tid: u32, o: Out) -> Result<(), PostError> {
        match o {
            Out::Begin { func, kind, time } => {
                self.spans += 1;
                let name = self.func_names.get(func as usize).and_then(|n| n.clone());
                self.writer.begin(tid, name.as_deref().unwrap_or("<unknown>"), kind, time)
            }
            Out::End { time } => self.writer.end(tid, time),
            Out::Run { n, time } => self.writer.run(tid, n, time),
            Out::Marker { func, kind, number, time } => {
                self.markers += 1;
                let name = self.func_names.get(func as usize).and_then(|n| n.clone());
                self.writer.marker(tid, name.as_deref().unwrap_or("kernel"), kind, number, time)
            }
        }
    }

    /// The trace ended: close every frame, time what is left, and name the threads again.
    fn finish(&mut self, names: &Names) -> Result<(), PostError> {
        self.stacks.close_all();
        self.batch += 1;
        self.take_events(None);
        let mut tids: Vec<u32> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        for &tid in &tids {
            let count = self.stacks.threads.get(&tid).map_or(0, |t| t.instructions);
            self.clock(tid, None, count, true)?;
        }
        for &tid in &tids {
            let pid = self.threads[&tid].pid;
            self.writer.thread(pid, tid, names.process_name(pid), names.thread_name(tid))?;
        }
        self.writer.finish()
    }
}

impl Sink for TimelineSink<'_> {
    fn block(&mut self, b: &Block, names: &mut Names, res: &mut Resolver) -> Result<(), PostError> {
        let br = b.branch;
        self.batch += 1;
        self.ensure_thread(br.tid, b.pid, names)?;
        let before = self.stacks.threads.get(&br.tid).map_or(0, |t| t.instructions);
        if let Where::Kernel(name) = &b.loc {
            // The delivery or return comes before what it does to the stack.
            let kind = if br.flags & branch_flags::SIGNAL != 0 {
                Some(MarkerKind::Signal)
            } else if br.flags & branch_flags::SYSCALL != 0 {
                Some(MarkerKind::Syscall)
            } else {
                None
            };
            if let Some(kind) = kind {
                let func = res.kernel_func(name);
                self.learn_name(func, || Arc::from(name.as_str()));
                self.queue(br.tid, Op::Marker { func, kind, number: br.aux }, before);
            }
        }
        self.stacks.block(b, names, res)?;
        self.take_events(Some(res));
        let count = self.stacks.threads.get(&br.tid).map_or(0, |t| t.instructions);
        self.clock(br.tid, Some(br.ts.saturating_sub(self.start_ns)), count, false)
    }

    fn trace_off(
        &mut self,
        off: &TraceOff,
        partial: Option<&Location>,
        at: &Location,
        names: &mut Names,
    ) -> Result<(), PostError> {
        self.batch += 1;
        if let Some(l) = partial {
            self.learn_name(l.func, || l.symbol.clone());
        }
        if !self.threads.contains_key(&off.tid) && partial.is_none() {
            // Nothing of the thread was seen: nothing to show.
            return self.stacks.trace_off(off, partial, at, names);
        }
        self.ensure_thread(off.tid, off.pid, names)?;
        self.stacks.trace_off(off, partial, at, names)?;
        self.take_events(None);
        let count = self.stacks.threads.get(&off.tid).map_or(0, |t| t.instructions);
        self.clock(off.tid, Some(off.ts.saturating_sub(self.start_ns)), count, true)
    }

    fn lost(&mut self, cpu: u16, lost: &Lost) -> Result<(), PostError> {
        self.stacks.lost(cpu, lost)
    }

    fn gap(&mut self, cpu: u16, tids: &[u32], cause: GapCause) -> Result<(), PostError> {
        self.stacks.gap(cpu, tids, cause)?;
        self.take_events(None);
        Ok(())
    }
}

/// Trace Event Format JSON, written as it comes: `B`/`E` duration events per span (in time
/// order per thread, which the viewers need for spans that start at the same time), `i`
/// instant events per marker, `M` metadata naming processes and threads.
///
/// With a minimum span length, a span shorter than it is not written: its instructions stay
/// in the span it ran in (whose length does not change), and its thread's `itrace_merged_spans`
/// metadata event counts it. Whether a span is that long is known once its thread's clock
/// passes its start plus the minimum; until then its `B` (and the markers after it) wait.
struct ChromeWriter<'o> {
    out: &'o mut dyn Write,
    first: bool,
    /// pid by tid.
    pids: FxHashMap<u32, u32>,
    /// Names written: threads by tid, processes by pid.
    thread_names: FxHashMap<u32, String>,
    process_names: FxHashMap<u32, String>,
    time_axis: String,
    title: String,
    /// Spans shorter than this (ns on the axis) are merged; 0: every span is written.
    min_span: u64,
    lines: FxHashMap<u32, ChromeLine>,
    /// One event, formatted.
    scratch: Vec<u8>,
}

/// A thread's open spans and what was merged of it.
#[derive(Default)]
struct ChromeLine {
    /// Open spans, outermost first: `open[..written]` are written, the rest wait.
    open: Vec<ChromeSpan>,
    written: usize,
    /// Markers after the first waiting span's start, with how many spans were open (clamped
    /// when spans close, so that the depths never decrease along the list).
    waiting_markers: Vec<(u32, WaitingMarker)>,
    merged_spans: u64,
    merged_instructions: u64,
}

struct ChromeSpan {
    begin: u64,
    name: String,
    kind: SpanKind,
    /// Instructions run in it (and the spans closed inside it).
    instructions: u64,
    /// Instructions of the spans merged right inside it (merged with it if it is merged too).
    merged_inside: u64,
}

struct WaitingMarker {
    name: String,
    kind: MarkerKind,
    number: u16,
    time: u64,
}

/// Markers waiting for a span's fate, at most this many per thread: past it the waiting spans
/// are written whatever their length (a clock that stops would otherwise hold them all).
const MAX_WAITING_MARKERS: usize = 1 << 16;

/// Nanoseconds as the format's microseconds.
fn chrome_time(buf: &mut Vec<u8>, ns: u64) {
    if ns % 1000 == 0 {
        let _ = write!(buf, "{}", ns / 1000);
    } else {
        let _ = write!(buf, "{}.{:03}", ns / 1000, ns % 1000);
    }
}

fn chrome_string(buf: &mut Vec<u8>, s: &str) {
    // Writing JSON into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *buf, s);
}

fn chrome_begin(buf: &mut Vec<u8>, pid: u32, tid: u32, name: &str, kind: SpanKind, time: u64) {
    let _ = write!(buf, "{{\"ph\":\"B\",\"pid\":{pid},\"tid\":{tid},\"ts\":");
    chrome_time(buf, time);
    let _ = write!(buf, ",\"cat\":\"{}\",\"name\":", kind.category());
    chrome_string(buf, name);
    buf.push(b'}');
}

fn chrome_end(buf: &mut Vec<u8>, pid: u32, tid: u32, time: u64) {
    let _ = write!(buf, "{{\"ph\":\"E\",\"pid\":{pid},\"tid\":{tid},\"ts\":");
    chrome_time(buf, time);
    buf.push(b'}');
}

fn chrome_marker(buf: &mut Vec<u8>, pid: u32, tid: u32, name: &str, kind: MarkerKind, number: u16, time: u64) {
    let _ = write!(buf, "{{\"ph\":\"i\",\"s\":\"t\",\"pid\":{pid},\"tid\":{tid},\"ts\":");
    chrome_time(buf, time);
    let _ = write!(buf, ",\"cat\":\"{}\",\"name\":", kind.category());
    chrome_string(buf, name);
    let _ = write!(buf, ",\"args\":{{\"number\":{number}}}}}");
}

fn chrome_metadata(buf: &mut Vec<u8>, what: &str, pid: u32, tid: u32, name: &str) {
    let _ = write!(buf, "{{\"ph\":\"M\",\"name\":\"{what}\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":");
    chrome_string(buf, name);
    buf.extend_from_slice(b"}}");
}

/// The bytes an event takes in the file, with its separator.
const CHROME_SEPARATOR: u64 = 2;

impl<'o> ChromeWriter<'o> {
    /// `min_span`: spans shorter than this many ns on the axis are merged (0: none).
    fn new(out: &'o mut dyn Write, title: &str, time_axis: &str, min_span: u64) -> Result<Self, PostError> {
        out.write_all(b"{\"traceEvents\":[")?;
        Ok(ChromeWriter {
            out,
            first: true,
            pids: FxHashMap::default(),
            thread_names: FxHashMap::default(),
            process_names: FxHashMap::default(),
            time_axis: time_axis.to_string(),
            title: title.to_string(),
            min_span,
            lines: FxHashMap::default(),
            scratch: Vec::with_capacity(256),
        })
    }

    /// Write the event in `scratch`.
    fn emit(&mut self) -> Result<(), PostError> {
        self.out.write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        self.out.write_all(&self.scratch)?;
        self.scratch.clear();
        Ok(())
    }

    fn pid(&self, tid: u32) -> u32 {
        self.pids.get(&tid).copied().unwrap_or(tid)
    }

    fn metadata(&mut self, what: &str, pid: u32, tid: u32, name: &str) -> Result<(), PostError> {
        chrome_metadata(&mut self.scratch, what, pid, tid, name);
        self.emit()
    }

    /// Write the waiting spans of `tid` that are known to be long enough at `time` (`force`:
    /// all of them), each followed by the markers that came before the next one started.
    fn promote(&mut self, tid: u32, time: u64, force: bool) -> Result<(), PostError> {
        let pid = self.pid(tid);
        let Some(line) = self.lines.get_mut(&tid) else { return Ok(()) };
        while let Some(s) = line.open.get(line.written) {
            if !force && time < s.begin.saturating_add(self.min_span) {
                break;
            }
            chrome_begin(&mut self.scratch, pid, tid, &s.name, s.kind, s.begin);
            self.out.write_all(if self.first { b"\n" } else { b",\n" })?;
            self.first = false;
            self.out.write_all(&self.scratch)?;
            self.scratch.clear();
            line.merged_instructions += s.merged_inside;
            line.written += 1;
            let before_next =
                line.waiting_markers.iter().take_while(|(depth, _)| *depth as usize <= line.written).count();
            for (_, m) in line.waiting_markers.drain(..before_next) {
                chrome_marker(&mut self.scratch, pid, tid, &m.name, m.kind, m.number, m.time);
                self.out.write_all(b",\n")?;
                self.out.write_all(&self.scratch)?;
                self.scratch.clear();
            }
        }
        Ok(())
    }

    /// What was merged: (spans, instructions in them).
    fn merged(&self) -> (u64, u64) {
        self.lines.values().fold((0, 0), |(s, i), l| (s + l.merged_spans, i + l.merged_instructions))
    }
}

impl TimelineWriter for ChromeWriter<'_> {
    fn thread(&mut self, pid: u32, tid: u32, process: &str, name: &str) -> Result<(), PostError> {
        self.pids.insert(tid, pid);
        let process = if process.is_empty() { format!("pid {pid}") } else { process.to_string() };
        if self.process_names.get(&pid) != Some(&process) {
            self.metadata("process_name", pid, pid, &process)?;
            self.process_names.insert(pid, process);
        }
        let name = if name.is_empty() { format!("tid {tid}") } else { format!("{name} ({tid})") };
        if self.thread_names.get(&tid) != Some(&name) {
            self.metadata("thread_name", pid, tid, &name)?;
            self.thread_names.insert(tid, name);
        }
        Ok(())
    }

    fn begin(&mut self, tid: u32, name: &str, kind: SpanKind, time: u64) -> Result<(), PostError> {
        if self.min_span == 0 {
            let pid = self.pid(tid);
            chrome_begin(&mut self.scratch, pid, tid, name, kind, time);
            return self.emit();
        }
        self.promote(tid, time, false)?;
        let line = self.lines.entry(tid).or_default();
        line.open.push(ChromeSpan { begin: time, name: name.to_string(), kind, instructions: 0, merged_inside: 0 });
        Ok(())
    }

    fn end(&mut self, tid: u32, time: u64) -> Result<(), PostError> {
        if self.min_span == 0 {
            let pid = self.pid(tid);
            chrome_end(&mut self.scratch, pid, tid, time);
            return self.emit();
        }
        self.promote(tid, time, false)?;
        let pid = self.pid(tid);
        let Some(line) = self.lines.get_mut(&tid) else { return Ok(()) };
        let Some(span) = line.open.pop() else { return Ok(()) };
        if let Some(parent) = line.open.last_mut() {
            parent.instructions += span.instructions;
        }
        let depth = line.open.len();
        if depth < line.written {
            line.written = depth;
            chrome_end(&mut self.scratch, pid, tid, time);
            return self.emit();
        }
        // Shorter than the minimum: merged into the span it ran in.
        line.merged_spans += 1;
        // Counted once, in the outermost span merged: one whose parent is written (or will be).
        match line.open.last_mut() {
            Some(parent) if depth > line.written => parent.merged_inside += span.instructions,
            _ => line.merged_instructions += span.instructions,
        }
        for (d, _) in line.waiting_markers.iter_mut().rev() {
            if *d as usize <= depth {
                break;
            }
            *d = depth as u32;
        }
        if depth == line.written && !line.waiting_markers.is_empty() {
            // No span waits any more: the markers can go.
            let markers = std::mem::take(&mut line.waiting_markers);
            for (_, m) in markers {
                chrome_marker(&mut self.scratch, pid, tid, &m.name, m.kind, m.number, m.time);
                self.emit()?;
            }
        }
        Ok(())
    }

    fn run(&mut self, tid: u32, instructions: u64, _time: u64) -> Result<(), PostError> {
        if let Some(top) = self.lines.get_mut(&tid).and_then(|l| l.open.last_mut()) {
            top.instructions += instructions;
        }
        Ok(())
    }

    fn marker(&mut self, tid: u32, name: &str, kind: MarkerKind, number: u16, time: u64) -> Result<(), PostError> {
        if self.min_span > 0 {
            self.promote(tid, time, false)?;
            if let Some(line) = self.lines.get_mut(&tid).filter(|l| l.written < l.open.len()) {
                let depth = line.open.len() as u32;
                line.waiting_markers.push((depth, WaitingMarker { name: name.to_string(), kind, number, time }));
                if line.waiting_markers.len() > MAX_WAITING_MARKERS {
                    self.promote(tid, time, true)?;
                }
                return Ok(());
            }
        }
        let pid = self.pid(tid);
        chrome_marker(&mut self.scratch, pid, tid, name, kind, number, time);
        self.emit()
    }

    fn finish(&mut self) -> Result<(), PostError> {
        let (spans, instructions) = self.merged();
        if self.min_span > 0 {
            // Per thread, what was merged (Perfetto shows a thread's metadata in its details).
            let mut tids: Vec<u32> = self.lines.keys().copied().collect();
            tids.sort_unstable();
            for tid in tids {
                let line = &self.lines[&tid];
                let (s, i) = (line.merged_spans, line.merged_instructions);
                let pid = self.pid(tid);
                let _ = write!(
                    self.scratch,
                    "{{\"ph\":\"M\",\"name\":\"itrace_merged_spans\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"min_span\":"
                );
                chrome_time(&mut self.scratch, self.min_span);
                let _ = write!(self.scratch, ",\"spans\":{s},\"instructions\":{i}}}}}");
                self.emit()?;
            }
        }
        self.out.write_all(b"\n],\"otherData\":{\"trace\":")?;
        chrome_string(&mut self.scratch, &self.title);
        self.scratch.extend_from_slice(b",\"time\":");
        chrome_string(&mut self.scratch, &self.time_axis);
        self.scratch.extend_from_slice(b",\"creator\":");
        chrome_string(&mut self.scratch, concat!("itrace ", env!("CARGO_PKG_VERSION")));
        if self.min_span > 0 {
            self.scratch.extend_from_slice(b",\"min_span\":");
            chrome_time(&mut self.scratch, self.min_span);
            let _ = write!(self.scratch, ",\"merged_spans\":{spans},\"merged_instructions\":{instructions}");
        }
        self.scratch.extend_from_slice(b"}}\n");
        self.out.write_all(&self.scratch)?;
        self.scratch.clear();
        self.out.flush()?;
        Ok(())
    }
}

/// Span lengths (µs) up to which the automatic minimum span is a whole number; above, a power
/// of two.
const EXACT_LENGTHS: u64 = 4096;

/// The first pass of [`SpanSelection::MaxBytes`]: the bytes the Chrome file's events would
/// take, spans by their length in whole microseconds, the rest apart.
struct ChromeSizes {
    pids: FxHashMap<u32, u32>,
    /// Per thread, open spans: (start, bytes of its `B`).
    open: FxHashMap<u32, Vec<(u64, u64)>>,
    /// Bytes of the spans `l` µs long: at index `l` below [`EXACT_LENGTHS`], else at
    /// `EXACT_LENGTHS + log2(l) - log2(EXACT_LENGTHS)`.
    by_length: Vec<u64>,
    /// Markers, metadata, the file's start and end.
    other: u64,
    scratch: Vec<u8>,
}

impl ChromeSizes {
    fn new() -> Self {
        ChromeSizes {
            pids: FxHashMap::default(),
            open: FxHashMap::default(),
            by_length: vec![0; EXACT_LENGTHS as usize + 64],
            // The file's start, and its end with otherData.
            other: 320,
            scratch: Vec::with_capacity(256),
        }
    }

    fn take(&mut self) -> u64 {
        let n = self.scratch.len() as u64 + CHROME_SEPARATOR;
        self.scratch.clear();
        n
    }

    fn bucket(micros: u64) -> usize {
        if micros < EXACT_LENGTHS {
            micros as usize
        } else {
            (EXACT_LENGTHS + u64::from(micros.ilog2() - EXACT_LENGTHS.ilog2())) as usize
        }
    }

    /// The smallest minimum span (µs: 0 for none, a whole number up to [`EXACT_LENGTHS`], a
    /// power of two above) whose file takes at most `max_bytes`, and the bytes it would take.
    fn min_span_within(&self, max_bytes: u64) -> (u64, u64) {
        // Keeping the spans of at least `min` µs keeps the buckets from `bucket(min)` on (a
        // power of two at or above EXACT_LENGTHS starts its bucket).
        let mut kept: u64 = self.by_length.iter().sum();
        let mut min = 0;
        loop {
            if self.other + kept <= max_bytes || kept == 0 {
                // Fits, or no span is left to merge.
                return (min, self.other + kept);
            }
            let next = if min < EXACT_LENGTHS { min + 1 } else { min * 2 };
            if next == 0 || min >= 1 << 62 {
                return (min, self.other + kept);
            }
            for b in Self::bucket(min)..Self::bucket(next) {
                kept -= self.by_length[b];
            }
            min = next;
        }
    }
}

impl TimelineWriter for ChromeSizes {
    fn thread(&mut self, pid: u32, tid: u32, process: &str, name: &str) -> Result<(), PostError> {
        // Names as the writer words them (a few bytes more), and its merge metadata event.
        if self.pids.insert(tid, pid).is_none() {
            self.other += 160;
        }
        chrome_metadata(&mut self.scratch, "process_name", pid, pid, process);
        chrome_metadata(&mut self.scratch, "thread_name", pid, tid, name);
        self.other += self.take() + 2 * 16;
        Ok(())
    }

    fn begin(&mut self, tid: u32, name: &str, kind: SpanKind, time: u64) -> Result<(), PostError> {
        chrome_begin(&mut self.scratch, self.pids.get(&tid).copied().unwrap_or(tid), tid, name, kind, time);
        let bytes = self.take();
        self.open.entry(tid).or_default().push((time, bytes));
        Ok(())
    }

    fn end(&mut self, tid: u32, time: u64) -> Result<(), PostError> {
        chrome_end(&mut self.scratch, self.pids.get(&tid).copied().unwrap_or(tid), tid, time);
        let end_bytes = self.take();
        if let Some((begin, bytes)) = self.open.get_mut(&tid).and_then(|o| o.pop()) {
            let micros = time.saturating_sub(begin) / 1000;
            self.by_length[Self::bucket(micros)] += bytes + end_bytes;
        }
        Ok(())
    }

    fn run(&mut self, _tid: u32, _instructions: u64, _time: u64) -> Result<(), PostError> {
        Ok(())
    }

    fn marker(&mut self, tid: u32, name: &str, kind: MarkerKind, number: u16, time: u64) -> Result<(), PostError> {
        chrome_marker(&mut self.scratch, self.pids.get(&tid).copied().unwrap_or(tid), tid, name, kind, number, time);
        self.other += self.take();
        Ok(())
    }

    fn finish(&mut self) -> Result<(), PostError> {
        Ok(())
    }
}

/// Bytes a taken branch can take in a Chrome timeline at most, about: a span opened and
/// closed, with a long name. A trace with fewer branches than the budget over this fits
/// without measuring.
const CHROME_BYTES_PER_BRANCH: u64 = 600;

/// The Firefox Profiler's processed profile: per thread, a sample at the start of each stretch
/// of instructions run with one stack, weighted by those instructions (so the call tree and
/// the flame graph count instructions, and the stack chart shows the spans), and instant
/// markers for system calls and signals.
/// Taken branches up to which a Firefox profile gets a sample per stretch of instructions with
/// one stack. The crate holds the whole profile in memory (about 100 bytes a sample), so a
/// longer trace's samples are merged per window of instructions: see [`firefox_window`].
const FIREFOX_EXACT_BRANCHES: u64 = 1 << 21;

/// About how many windows a long trace's Firefox profile is cut into (all threads together).
const FIREFOX_WINDOWS: u64 = 1 << 18;

/// Markers (system calls, signals) a Firefox profile keeps; later ones are counted, not kept.
const FIREFOX_MARKERS: u64 = 1 << 20;

/// Instructions per sample window of a Firefox profile of `trace` (0: a sample per stretch).
/// From the trace's end summary (taken branches and instructions), or, for a trace cut short,
/// from its size (format 3.0 takes at least a byte a branch; 5 instructions a branch).
fn firefox_window(trace: &Trace) -> u64 {
    let (branches, instructions) = match trace.summary() {
        Some(s) => (s.records.iter().sum::<u64>(), s.instructions),
        None => (trace.trace_bytes(), trace.trace_bytes().saturating_mul(5)),
    };
    if branches <= FIREFOX_EXACT_BRANCHES {
        0
    } else {
        (instructions / FIREFOX_WINDOWS).max(1)
    }
}

struct FirefoxWriter {
    /// Instructions of a thread per sample window; 0: a sample per stretch.
    window: u64,
    /// Markers left to keep, and those dropped past [`FIREFOX_MARKERS`].
    markers_left: u64,
    markers_dropped: u64,
    profile: fxprof_processed_profile::Profile,
    processes: FxHashMap<u32, fxprof_processed_profile::ProcessHandle>,
    threads: FxHashMap<u32, FirefoxThread>,
    user: fxprof_processed_profile::CategoryHandle,
    signal: fxprof_processed_profile::CategoryHandle,
    kernel: fxprof_processed_profile::CategoryHandle,
}

struct FirefoxThread {
    handle: fxprof_processed_profile::ThreadHandle,
    stack: Vec<fxprof_processed_profile::StackHandle>,
    /// Instructions run with the newest stack so far: (stack, start time, instructions).
    stretch: Option<(Option<fxprof_processed_profile::StackHandle>, u64, u64)>,
    started: bool,
    last_time: u64,
    /// Time of the latest sample (the CPU was busy with the thread since).
    last_sample: u64,
    /// Window mode: the thread's instructions so far and where its window started.
    ran: u64,
    window_start: u64,
    /// Window mode: per stack in this window, (stack, time of its first stretch, instructions),
    /// in the order first seen.
    pending: Vec<(Option<fxprof_processed_profile::StackHandle>, u64, u64)>,
    pending_at: FxHashMap<Option<fxprof_processed_profile::StackHandle>, usize>,
}

impl FirefoxWriter {
    fn new(title: &str, start_realtime_ns: u64, window: u64) -> Self {
        use fxprof_processed_profile::{CategoryColor, Profile, ReferenceTimestamp, SamplingInterval};
        let reference = ReferenceTimestamp::from_millis_since_unix_epoch(start_realtime_ns as f64 / 1e6);
        let mut profile = Profile::new(title, reference, SamplingInterval::from_nanos(1000));
        let user = profile.add_category("User", CategoryColor::Blue);
        let signal = profile.add_category("Signal", CategoryColor::Orange);
        let kernel = profile.add_category("Kernel", CategoryColor::Red);
        FirefoxWriter {
            window,
            markers_left: FIREFOX_MARKERS,
            markers_dropped: 0,
            profile,
            processes: FxHashMap::default(),
            threads: FxHashMap::default(),
            user,
            signal,
            kernel,
        }
    }

    /// The stretch of `tid` so far as samples, or into its window's (window mode: a window's
    /// samples are written when the thread has run past it, or at the end).
    fn flush(&mut self, tid: u32) {
        let Some(th) = self.threads.get_mut(&tid) else { return };
        let Some((stack, time, n)) = th.stretch.take() else { return };
        if self.window == 0 {
            add_samples(&mut self.profile, th, stack, time, n);
            return;
        }
        match th.pending_at.get(&stack) {
            Some(&i) => th.pending[i].2 += n,
            None => {
                th.pending_at.insert(stack, th.pending.len());
                th.pending.push((stack, time, n));
            }
        }
        th.ran += n;
        if th.ran - th.window_start >= self.window {
            flush_window(&mut self.profile, th);
        }
    }

    fn touch(&mut self, tid: u32, time: u64) {
        let Some(th) = self.threads.get_mut(&tid) else { return };
        if !th.started {
            th.started = true;
            th.last_sample = time;
            let at = fxprof_processed_profile::Timestamp::from_nanos_since_reference(time);
            self.profile.set_thread_start_time(th.handle, at);
        }
        th.last_time = th.last_time.max(time);
    }

    /// What the profile left out or merged, for the user.
    fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.window > 0 {
            notes.push(format!(
                "note: a long trace: the Firefox profile has a sample per stack and window of {} instructions of a \
                 thread (the call tree and flame graph stay exact; the stack chart shows windows, not calls)",
                self.window
            ));
        }
        if self.markers_dropped > 0 {
            notes.push(format!(
                "note: the Firefox profile keeps the first {FIREFOX_MARKERS} system call and signal markers; {} more \
                 were left out",
                self.markers_dropped
            ));
        }
        notes
    }

    fn write_json(&self, out: &mut dyn Write) -> Result<(), PostError> {
        serde_json::to_writer(&mut *out, &self.profile).map_err(std::io::Error::from)?;
        Ok(())
    }
}

impl TimelineWriter for FirefoxWriter {
    fn thread(&mut self, pid: u32, tid: u32, process: &str, name: &str) -> Result<(), PostError> {
        use fxprof_processed_profile::Timestamp;
        let process_name = if process.is_empty() { format!("pid {pid}") } else { process.to_string() };
        let zero = Timestamp::from_nanos_since_reference(0);
        let process = match self.processes.get(&pid) {
            Some(&p) => {
                self.profile.set_process_name(p, &process_name);
                p
            }
            None => {
                let p = self.profile.add_process(&process_name, pid, zero);
                self.processes.insert(pid, p);
                p
            }
        };
        let handle = match self.threads.get(&tid) {
            Some(th) => th.handle,
            None => {
                let handle = self.profile.add_thread(process, tid, zero, tid == pid);
                let th = FirefoxThread {
                    handle,
                    stack: Vec::new(),
                    stretch: None,
                    started: false,
                    last_time: 0,
                    last_sample: 0,
                    ran: 0,
                    window_start: 0,
                    pending: Vec::new(),
                    pending_at: FxHashMap::default(),
                };
                self.threads.insert(tid, th);
                handle
            }
        };
        let name = if name.is_empty() { process_name } else { name.to_string() };
        self.profile.set_thread_name(handle, &name);
        Ok(())
    }

    fn begin(&mut self, tid: u32, name: &str, kind: SpanKind, time: u64) -> Result<(), PostError> {
        use fxprof_processed_profile::{CategoryHandle, Frame, FrameFlags, FrameInfo};
        self.flush(tid);
        self.touch(tid, time);
        let category = match kind {
            SpanKind::SignalHandler | SpanKind::SignalTrampoline => self.signal,
            SpanKind::Leaf => CategoryHandle::OTHER,
            _ => self.user,
        };
        let label = self.profile.intern_string(name);
        let Some(th) = self.threads.get_mut(&tid) else { return Ok(()) };
        let info = FrameInfo { frame: Frame::Label(label), category_pair: category.into(), flags: FrameFlags::empty() };
        let frame = self.profile.intern_frame(th.handle, info);
        let stack = self.profile.intern_stack(th.handle, th.stack.last().copied(), frame);
        th.stack.push(stack);
        Ok(())
    }

    fn end(&mut self, tid: u32, time: u64) -> Result<(), PostError> {
        self.flush(tid);
        self.touch(tid, time);
        if let Some(th) = self.threads.get_mut(&tid) {
            th.stack.pop();
        }
        Ok(())
    }

    fn run(&mut self, tid: u32, instructions: u64, time: u64) -> Result<(), PostError> {
        self.touch(tid, time);
        let Some(th) = self.threads.get_mut(&tid) else { return Ok(()) };
        match &mut th.stretch {
            Some((_, _, n)) => *n += instructions,
            None => th.stretch = Some((th.stack.last().copied(), time, instructions)),
        }
        Ok(())
    }

    fn marker(&mut self, tid: u32, name: &str, kind: MarkerKind, number: u16, time: u64) -> Result<(), PostError> {
        use fxprof_processed_profile::{MarkerTiming, Timestamp};
        self.touch(tid, time);
        let Some(th) = self.threads.get(&tid) else { return Ok(()) };
        if self.markers_left == 0 {
            self.markers_dropped += 1;
            return Ok(());
        }
        self.markers_left -= 1;
        let handle = th.handle;
        let marker = KernelMarker {
            name: self.profile.intern_string(name),
            kind: self.profile.intern_string(kind.category()),
            number: number as f64,
            category: self.kernel,
        };
        self.profile.add_marker(handle, MarkerTiming::Instant(Timestamp::from_nanos_since_reference(time)), marker);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), PostError> {
        use fxprof_processed_profile::Timestamp;
        let tids: Vec<u32> = self.threads.keys().copied().collect();
        for tid in tids {
            self.flush(tid);
            let Some(th) = self.threads.get_mut(&tid) else { continue };
            flush_window(&mut self.profile, th);
            self.profile.set_thread_end_time(th.handle, Timestamp::from_nanos_since_reference(th.last_time));
        }
        Ok(())
    }
}

/// `n` instructions run with `stack` from `time` on, as samples of thread `th` (a weight is an
/// i32: more instructions are several samples).
fn add_samples(
    profile: &mut fxprof_processed_profile::Profile,
    th: &mut FirefoxThread,
    stack: Option<fxprof_processed_profile::StackHandle>,
    time: u64,
    mut n: u64,
) {
    use fxprof_processed_profile::{CpuDelta, Timestamp};
    while n > 0 {
        let weight = n.min(i32::MAX as u64);
        n -= weight;
        let at = Timestamp::from_nanos_since_reference(time);
        let busy = CpuDelta::from_nanos(time.saturating_sub(th.last_sample));
        th.last_sample = time;
        profile.add_sample(th.handle, at, stack, busy, weight as i32);
    }
}

/// Window mode: the samples of `th`'s window so far, one per stack at its first time.
fn flush_window(profile: &mut fxprof_processed_profile::Profile, th: &mut FirefoxThread) {
    let pending = std::mem::take(&mut th.pending);
    th.pending_at.clear();
    for &(stack, time, n) in &pending {
        add_samples(profile, th, stack, time, n);
    }
    th.pending = pending;
    th.pending.clear();
    th.window_start = th.ran;
}

/// A system call or signal delivery, as a Firefox Profiler marker.
struct KernelMarker {
    name: fxprof_processed_profile::StringHandle,
    kind: fxprof_processed_profile::StringHandle,
    number: f64,
    category: fxprof_processed_profile::CategoryHandle,
}

impl fxprof_processed_profile::StaticSchemaMarker for KernelMarker {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = "itrace-kernel";
    const DESCRIPTION: Option<&'static str> = Some("A system call's return or a signal's delivery");
    const CHART_LABEL: Option<&'static str> = Some("{marker.name}");
    const TABLE_LABEL: Option<&'static str> = Some("{marker.name} ({marker.data.kind} {marker.data.number})");
    const FIELDS: &'static [fxprof_processed_profile::StaticSchemaMarkerField] = &[
        fxprof_processed_profile::StaticSchemaMarkerField {
            key: "kind",
            label: "Kind",
            format: fxprof_processed_profile::MarkerFieldFormat::String,
            flags: fxprof_processed_profile::MarkerFieldFlags::SEARCHABLE,
        },
        fxprof_processed_profile::StaticSchemaMarkerField {
            key: "number",
            label: "Number",
            format: fxprof_processed_profile::MarkerFieldFormat::Integer,
            flags: fxprof_processed_profile::MarkerFieldFlags::empty(),
        },
    ];

    fn name(&self, _profile: &mut fxprof_processed_profile::Profile) -> fxprof_processed_profile::StringHandle {
        self.name
    }

    fn category(&self, _profile: &mut fxprof_processed_profile::Profile) -> fxprof_processed_profile::CategoryHandle {
        self.category
    }

    fn string_field_value(&self, _field_index: u32) -> fxprof_processed_profile::StringHandle {
        self.kind
    }

    fn number_field_value(&self, _field_index: u32) -> f64 {
        self.number
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events a Chrome writer with a minimum span writes: (ph, name or "", ts in µs).
    fn chrome_out(
        min_span_us: u64,
        calls: impl FnOnce(&mut ChromeWriter),
    ) -> (Vec<(String, String, f64)>, serde_json::Value) {
        let mut buf = Vec::new();
        let mut w = ChromeWriter::new(&mut buf, "t.itr", "instructions", min_span_us * 1000).unwrap();
        w.thread(7, 7, "prog", "").unwrap();
        calls(&mut w);
        w.finish().unwrap();
        drop(w);
        let json: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        let events = json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] != "M")
            .map(|e| {
                let name = e["name"].as_str().unwrap_or("").to_string();
                (e["ph"].as_str().unwrap().to_string(), name, e["ts"].as_f64().unwrap())
            })
            .collect();
        (events, json["otherData"].clone())
    }

    /// Hand-computed, minimum 3 µs: `a` (0-7) holds `b` (1-2, merged, 1 instruction, with a
    /// marker at 1.5 inside) and `c` (2-6, kept, holding `d`, 2-3, merged, 1 instruction); the
    /// marker waits for `a` to be known long and keeps its place.
    #[test]
    fn chrome_merges_short_spans_and_keeps_markers_in_order() {
        let (events, other) = chrome_out(3, |w| {
            w.begin(7, "a", SpanKind::Root, 0).unwrap();
            w.run(7, 1, 0).unwrap();
            w.begin(7, "b", SpanKind::Call, 1000).unwrap();
            w.marker(7, "sys_write", MarkerKind::Syscall, 1, 1500).unwrap();
            w.run(7, 1, 1000).unwrap();
            w.end(7, 2000).unwrap();
            w.begin(7, "c", SpanKind::Call, 2000).unwrap();
            w.begin(7, "d", SpanKind::Call, 2000).unwrap();
            w.run(7, 1, 2000).unwrap();
            w.end(7, 3000).unwrap();
            w.run(7, 3, 3000).unwrap();
            w.end(7, 6000).unwrap();
            w.run(7, 1, 6000).unwrap();
            w.end(7, 7000).unwrap();
        });
        let e = |ph: &str, name: &str, ts: f64| (ph.to_string(), name.to_string(), ts);
        assert_eq!(
            events,
            vec![e("B", "a", 0.0), e("i", "sys_write", 1.5), e("B", "c", 2.0), e("E", "", 6.0), e("E", "", 7.0)]
        );
        assert_eq!((other["merged_spans"].as_u64(), other["merged_instructions"].as_u64()), (Some(2), Some(2)));
        // A short span inside a short span: merged with it, its instructions counted once.
        let (events, other) = chrome_out(10, |w| {
            w.begin(7, "a", SpanKind::Root, 0).unwrap();
            w.begin(7, "b", SpanKind::Call, 1000).unwrap();
            w.run(7, 2, 1000).unwrap();
            w.end(7, 3000).unwrap();
            w.run(7, 1, 3000).unwrap();
            w.end(7, 4000).unwrap();
        });
        assert!(events.is_empty(), "{events:?}");
        assert_eq!((other["merged_spans"].as_u64(), other["merged_instructions"].as_u64()), (Some(2), Some(3)));
    }

    /// Hand-computed: spans of 0, 1, 2 and 5000 µs taking 10, 20, 30 and 40 bytes, and 5 bytes
    /// of the rest: the smallest minimum that fits each budget.
    #[test]
    fn chrome_min_span_is_the_smallest_that_fits() {
        let mut sizes = ChromeSizes::new();
        sizes.other = 5;
        for (micros, bytes) in [(0, 10), (1, 20), (2, 30), (5000, 40)] {
            sizes.by_length[ChromeSizes::bucket(micros)] += bytes;
        }
        assert_eq!(sizes.min_span_within(105), (0, 105));
        assert_eq!(sizes.min_span_within(104), (1, 95));
        assert_eq!(sizes.min_span_within(75), (2, 75));
        assert_eq!(sizes.min_span_within(74), (3, 45));
        assert_eq!(sizes.min_span_within(45), (3, 45));
        // 5000 µs is in the bucket from 4096 on: the next minimum is 8192.
        assert_eq!(sizes.min_span_within(44), (8192, 5));
        assert_eq!(sizes.min_span_within(1), (8192, 5));
    }

    /// Hand-computed: 100 instructions between readings at 1000 ns and 2000 ns.
    #[test]
    fn times_between_clock_readings_go_by_instructions() {
        let (a, b) = ((50, 1000), (150, 2000));
        assert_eq!(interpolate(a, b, 50), 1000);
        assert_eq!(interpolate(a, b, 75), 1250);
        assert_eq!(interpolate(a, b, 150), 2000);
        // Outside the readings: the nearer one.
        assert_eq!(interpolate(a, b, 10), 1000);
        assert_eq!(interpolate(a, b, 900), 2000);
    }

    /// The stacks of a profile's samples, read back through its tables as the Firefox
    /// Profiler does: (stack from the root, weight, time in ms).
    fn samples(thread: &serde_json::Value) -> Vec<(Vec<String>, u64, f64)> {
        let strings: Vec<&str> =
            thread["stringArray"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        let (stacks, frames, funcs) = (&thread["stackTable"], &thread["frameTable"], &thread["funcTable"]);
        let s = &thread["samples"];
        let mut time = 0.0;
        let mut out = Vec::new();
        for i in 0..s["length"].as_u64().unwrap() as usize {
            time += s["timeDeltas"][i].as_f64().unwrap();
            let mut names = Vec::new();
            let mut stack = s["stack"][i].as_u64();
            while let Some(st) = stack {
                let frame = stacks["frame"][st as usize].as_u64().unwrap() as usize;
                let func = frames["func"][frame].as_u64().unwrap() as usize;
                names.push(strings[funcs["name"][func].as_u64().unwrap() as usize].to_string());
                stack = stacks["prefix"][st as usize].as_u64();
            }
            names.reverse();
            out.push((names, s["weight"][i].as_u64().unwrap(), time));
        }
        out
    }

    /// Spans and runs through the crate's types and back out of its JSON: a sample per stretch
    /// of instructions with one stack, weighted by them, at the stretch's start; markers by name.
    #[test]
    fn firefox_profile_round_trip() {
        let mut w = FirefoxWriter::new("t.itr", 0, 0);
        w.thread(7, 8, "prog", "").unwrap();
        w.begin(8, "main", SpanKind::Root, 0).unwrap();
        w.run(8, 10, 0).unwrap();
        w.begin(8, "work", SpanKind::Call, 10_000).unwrap();
        w.run(8, 4, 10_000).unwrap();
        w.run(8, 1, 14_000).unwrap();
        w.marker(8, "sys_write", MarkerKind::Syscall, 1, 15_000).unwrap();
        w.end(8, 15_000).unwrap();
        w.run(8, 3, 15_000).unwrap();
        w.end(8, 18_000).unwrap();
        w.thread(7, 8, "prog", "renamed").unwrap();
        w.finish().unwrap();
        let mut json = Vec::new();
        w.write_json(&mut json).unwrap();
        let profile: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let threads = profile["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 1);
        let t = &threads[0];
        // A thread other than the process's main one keeps a name of its own.
        assert_eq!(t["name"], "renamed");
        let main = || vec!["main".to_string()];
        let work = || vec!["main".to_string(), "work".to_string()];
        assert_eq!(samples(t), vec![(main(), 10, 0.0), (work(), 5, 0.01), (main(), 3, 0.015)]);
        let m = &t["markers"];
        assert_eq!(m["length"], 1);
        let strings = t["stringArray"].as_array().unwrap();
        assert_eq!(strings[m["name"][0].as_u64().unwrap() as usize], "sys_write");
        assert_eq!(m["startTime"][0], 0.015);
    }

    /// A long trace's windows: per stack the same instructions as a sample per stretch gives
    /// (hand count: 20 calls of `work`, 1 instruction of main and 2 of work each), in at most
    /// two samples (two stacks) per window of 10 instructions, in time order.
    #[test]
    fn firefox_windows_keep_each_stacks_instructions() {
        let profile_of = |window: u64| {
            let mut w = FirefoxWriter::new("t.itr", 0, window);
            w.thread(7, 7, "prog", "").unwrap();
            w.begin(7, "main", SpanKind::Root, 0).unwrap();
            let mut t = 0;
            for _ in 0..20 {
                w.run(7, 1, t).unwrap();
                t += 1000;
                w.begin(7, "work", SpanKind::Call, t).unwrap();
                w.run(7, 2, t).unwrap();
                t += 2000;
                w.end(7, t).unwrap();
            }
            w.end(7, t).unwrap();
            w.finish().unwrap();
            let mut json = Vec::new();
            w.write_json(&mut json).unwrap();
            let profile: serde_json::Value = serde_json::from_slice(&json).unwrap();
            samples(&profile["threads"][0])
        };
        let per_stack = |samples: &[(Vec<String>, u64, f64)]| {
            let mut sums = std::collections::BTreeMap::new();
            for (stack, weight, _) in samples {
                *sums.entry(stack.join(";")).or_insert(0) += weight;
            }
            sums
        };
        let exact = profile_of(0);
        let windowed = profile_of(10);
        assert_eq!(exact.len(), 40);
        let want: std::collections::BTreeMap<String, u64> =
            [("main".to_string(), 20), ("main;work".to_string(), 40)].into();
        assert_eq!(per_stack(&exact), want);
        assert_eq!(per_stack(&windowed), want);
        assert!(windowed.len() <= 2 * (60 / 10 + 1), "{} samples: {windowed:?}", windowed.len());
        assert!(windowed.windows(2).all(|p| p[0].2 <= p[1].2), "times go back: {windowed:?}");
    }
}
