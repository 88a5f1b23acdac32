//! Per-thread call stacks rebuilt from the trace's CALL and RETURN records: the one piece
//! that `itrace report` (inclusive counts), `itrace flamegraph` (instructions per call stack)
//! and `itrace export --format callgrind` (calls between functions) share.
//!
//! A shadow stack per thread: a CALL pushes a frame, a RETURN pops to the frame whose call
//! it returns after (so unmatched returns resynchronise), a signal handler is a frame that
//! ends when the kernel returns to the interrupted pc. The function a thread is in when its
//! trace starts (or after that one returns) is a root frame, as if called there. A block that
//! starts in a function with a frame below the top (a `longjmp`, an exception's landing pad)
//! ends the frames above it. A function already on the stack (recursion) is counted once in
//! inclusive counts. How each hard case is handled: docs/arc-and-report.md, "Call stacks".
//!
//! A call to a PLT stub is a call to the function the stub jumps to: the frame opens at the
//! call (so the stub's instructions, and on a lazily bound first call the dynamic linker's
//! resolver, count in the callee's inclusive cost) and takes the callee's identity at the
//! first jump out of the PLT (not the header's jump to the resolver, nor the resolver's own
//! jumps).
//!
//! Memory: the functions and threads always; with [`Collect::tree`] one node per distinct
//! call stack; with [`Collect::edges`] one entry per distinct (caller, call line, callee);
//! with [`Collect::lines`] one per source line that ran. Never the trace's length.
//!
//! Timelines (`itrace export --format chrome|firefox`) need the order of things, not totals:
//! with [`Collect::events`] every frame opened and closed, and every block's instructions, is
//! also told as a [`StackEvent`], for the caller to take after each record
//! ([`CallStacks::drain_events`]).

use crate::replay::{replay, Block, GapCause, Sink, Where};
use crate::resolve::{Location, Resolver};
use crate::symbols::PltPart;
use crate::threads::Names;
use crate::{PostError, Trace};
use itrace_format::{branch_flags, BranchKind, Lost, TraceOff};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A return lands at most this far after its call (longest x86 call is 7 bytes; other architectures less).
const MAX_CALL_LEN: u64 = 16;

/// What to collect beyond the per-function and per-thread totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Collect {
    /// The tree of call stacks with the instructions of each (flame graphs).
    pub tree: bool,
    /// With `tree`: each thread's stacks under a frame of its own ([`StackTree::thread_of`]),
    /// not merged over threads.
    pub per_thread: bool,
    /// Calls and their inclusive instructions per (caller, call line, callee) (callgrind).
    pub edges: bool,
    /// Self instructions per (function, source file, line); makes the replay read line tables.
    pub lines: bool,
    /// Each change to a thread's stack as a [`StackEvent`] (timelines).
    pub events: bool,
    /// Each call counted in a function's `calls`, as a [`CountedCall`] (the Parquet table).
    pub calls: bool,
}

/// A call counted in [`FuncStats::calls`] ([`Collect::calls`]), when it is counted: at the
/// CALL, the tail call's jump, the signal's delivery, the PLT stub's jump to its target, or
/// (a PLT call whose target was never seen) when its frame closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountedCall {
    pub tid: u32,
    /// The function whose calls it counts in.
    pub func: u32,
    /// [`Opened::Call`], [`Opened::PltCall`], [`Opened::TailCall`] or [`Opened::SignalHandler`].
    pub how: Opened,
}

/// How a frame came to be opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// A CALL record (counted in the callee's calls).
    Call,
    /// A call to a PLT stub: the frame is the stub's until a [`StackEvent::Retarget`] gives it
    /// the stub's target (the call is counted then, or for the stub when the frame closes
    /// first).
    PltCall,
    /// A jump to another function's first instruction (counted as a call).
    TailCall,
    /// A signal handler, run by the kernel (counted as a call of the handler).
    SignalHandler,
    /// The signal trampoline a handler returned to: runs under the signal, not a call.
    SignalTrampoline,
    /// The function a thread was in when its trace started, or after that one returned: no call
    /// was seen.
    Root,
}

/// One change to a thread's call stack, in trace order ([`Collect::events`]). `depth` is the
/// frame's index in the thread's stack (0: the bottom); `at` the thread's instructions so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackEvent {
    Open {
        tid: u32,
        depth: u32,
        func: u32,
        how: Opened,
        at: u64,
    },
    /// The frame at `depth`, a call to a PLT stub, is a call to `func`, the stub's target.
    Retarget {
        tid: u32,
        depth: u32,
        func: u32,
    },
    Close {
        tid: u32,
        depth: u32,
        at: u64,
    },
    /// `n` instructions ran in `func`, ending at `at`; `framed` when `func` is the newest
    /// frame's function (else they run above it, without a frame of their own: a PLT stub, a
    /// jump into the middle of another function).
    Run {
        tid: u32,
        func: u32,
        n: u32,
        framed: bool,
        at: u64,
    },
}

/// One function's totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FuncStats {
    /// Instructions of blocks that start in the function.
    pub self_instructions: u64,
    /// Instructions run while a frame of the function is open, or while the function runs
    /// without one (a tail call into it, the start of a trace).
    pub inclusive: u64,
    pub calls: u64,
}

/// Calls from one call site to one function.
#[derive(Clone, Debug, Default)]
pub struct CallEdge {
    pub calls: u64,
    /// Instructions run inside these calls (a recursive call's are also in its caller's).
    pub inclusive: u64,
}

/// (caller function, line of the call instruction in the caller's file (0: unknown), callee).
pub type EdgeKey = (u32, u32, u32);

/// (function, source file, line): the file and line of a block's first instruction.
pub type LineKey = (u32, Option<Arc<str>>, u32);

struct Frame {
    func: u32,
    /// The function a thread was in when its tracing started (no call seen): it stays on the
    /// stack until it returns, so its inclusive count covers what it called.
    root: bool,
    /// Address of the call instruction (u64::MAX for a signal handler frame).
    call_from: u64,
    /// Line of the call instruction (0 unless lines are collected).
    call_line: u32,
    /// For a signal handler: where the interrupted code resumes.
    resume_pc: u64,
    entry_total: u64,
    /// A call to a PLT stub whose target is not known yet: `func` is the stub.
    plt_pending: bool,
    /// The frame's node in the stack tree (when one is built).
    node: u32,
    /// For a signal handler: the signal's id (`[kernel]` `signal_SIGUSR1`), its caller.
    signal: Option<u32>,
    /// The thread's `in_handlers` when the frame opened.
    entry_in_handlers: u64,
    /// Opened by a tail call (a jump to a function's first instruction): it returns where the
    /// frame below it would, and closes with it.
    tail: bool,
}

/// The first frame of the tail-call chain that ends at `stack[i]`: a return from a function
/// reached by tail calls also ends the frames that jumped to it.
fn chain_start(stack: &[Frame], mut i: usize) -> usize {
    while i > 0 && stack[i].tail {
        i -= 1;
    }
    i
}

/// One thread's totals and stack.
#[derive(Default)]
pub struct ThreadStack {
    pub pid: u32,
    pub instructions: u64,
    pub branches: u64,
    stack: Vec<Frame>,
    /// Where the last signal interrupted this thread.
    signal_from: u64,
    /// Instructions run in signal handlers so far (each counted once when nested): they are
    /// not part of the inclusive cost of the functions they interrupted.
    in_handlers: u64,
    /// Open frames per function on this thread (recursion is counted once per thread; other
    /// threads' frames of the same function are other runs of it), one map per signal
    /// handler level: a handler's run of a function it interrupted is a run of its own, as
    /// the handler's time is not part of the interrupted frames'.
    open: Vec<FxHashMap<u32, u32>>,
}

impl ThreadStack {
    /// The open-frame counts of the current handler level (or of the thread's own code).
    fn level(&mut self) -> &mut FxHashMap<u32, u32> {
        if self.open.is_empty() {
            self.open.push(FxHashMap::default());
        }
        self.open.last_mut().expect("one level at least")
    }

    fn enter(&mut self, func: u32) {
        *self.level().entry(func).or_default() += 1;
    }

    /// A frame of `func` closes; true when it was the outermost one of its level.
    fn leave(&mut self, func: u32) -> bool {
        let level = self.level();
        match level.get_mut(&func) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                level.remove(&func);
                true
            }
        }
    }

    /// A frame of `func` is open at the current level.
    fn runs_in_own_frame(&self, func: u32) -> bool {
        self.open.last().is_some_and(|l| l.contains_key(&func))
    }

    /// A frame of `func` is open at any level (a `siglongjmp` leaves a handler for it).
    fn has_frame_of(&self, func: u32) -> bool {
        self.open.iter().any(|l| l.contains_key(&func))
    }
}

/// The replayed call stacks of a trace and what they add up to.
#[derive(Default)]
pub struct CallStacks {
    /// Totals per function id (the resolver's interned ids).
    pub funcs: Vec<FuncStats>,
    pub threads: BTreeMap<u32, ThreadStack>,
    pub total_branches: u64,
    /// Records lost, as the Lost records say.
    pub lost: u64,
    /// Threads whose call stack was cut at a gap (a damaged chunk skipped): their frames were
    /// closed there, and what they run next starts new root frames, as at a trace's start.
    pub cut_at_gaps: u64,
    pub tree: Option<StackTree>,
    pub edges: Option<FxHashMap<EdgeKey, CallEdge>>,
    pub lines: Option<FxHashMap<LineKey, u64>>,
    /// Stack changes not taken yet.
    events: Vec<StackEvent>,
    /// [`Collect::events`].
    record_events: bool,
    /// Calls counted and not taken yet ([`Collect::calls`]).
    counted: Vec<CountedCall>,
    record_calls: bool,
}

/// Replay `trace` into call stacks, collecting what `collect` asks for; every frame is
/// closed at the end.
pub fn build(
    trace: &Trace,
    collect: Collect,
    progress: &mut dyn FnMut(u64),
) -> Result<(CallStacks, Names, Resolver), PostError> {
    let mut stacks = CallStacks::new(collect);
    let (names, res) = replay(trace, collect.lines, &mut stacks, progress)?;
    stacks.close_all();
    Ok((stacks, names, res))
}

/// [`build`] over the records of thread `tid` only: functions, threads, edges and stacks are
/// that thread's (records lost still count for the whole trace).
pub fn build_thread(
    trace: &Trace,
    collect: Collect,
    tid: u32,
    progress: &mut dyn FnMut(u64),
) -> Result<(CallStacks, Names, Resolver), PostError> {
    let mut stacks = CallStacks::new(collect);
    let (names, res) = replay(trace, collect.lines, &mut OneThread { stacks: &mut stacks, tid }, progress)?;
    if stacks.threads.contains_key(&tid) {
        stacks.pop_to(tid, 0);
    }
    Ok((stacks, names, res))
}

/// A sink that passes on the records of one thread.
struct OneThread<'a> {
    stacks: &'a mut CallStacks,
    tid: u32,
}

impl Sink for OneThread<'_> {
    fn block(&mut self, b: &Block, names: &mut Names, res: &mut Resolver) -> Result<(), PostError> {
        if b.branch.tid != self.tid {
            return Ok(());
        }
        self.stacks.block(b, names, res)
    }

    fn trace_off(
        &mut self,
        off: &TraceOff,
        partial: Option<&Location>,
        at: &Location,
        names: &mut Names,
    ) -> Result<(), PostError> {
        if off.tid != self.tid {
            return Ok(());
        }
        self.stacks.trace_off(off, partial, at, names)
    }

    fn lost(&mut self, cpu: u16, lost: &Lost) -> Result<(), PostError> {
        self.stacks.lost(cpu, lost)
    }

    fn gap(&mut self, cpu: u16, tids: &[u32], cause: GapCause) -> Result<(), PostError> {
        if tids.contains(&self.tid) {
            self.stacks.gap(cpu, &[self.tid], cause)?;
        }
        Ok(())
    }
}

impl CallStacks {
    /// Empty stacks collecting what `collect` asks for, to be fed as a [`Sink`] (by
    /// [`build`], or by a sink of a caller's that passes the records on).
    pub fn new(collect: Collect) -> Self {
        CallStacks {
            tree: collect.tree.then(|| StackTree::new(collect.per_thread)),
            edges: collect.edges.then(FxHashMap::default),
            lines: collect.lines.then(FxHashMap::default),
            record_events: collect.events,
            record_calls: collect.calls,
            ..CallStacks::default()
        }
    }

    /// Close every thread's frames (the end of the trace).
    pub fn close_all(&mut self) {
        let tids: Vec<u32> = self.threads.keys().copied().collect();
        for tid in tids {
            self.pop_to(tid, 0);
        }
    }

    /// The stack changes since the last call, oldest first (none without [`Collect::events`]).
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, StackEvent> {
        self.events.drain(..)
    }

    fn event(&mut self, e: StackEvent) {
        if self.record_events {
            self.events.push(e);
        }
    }

    fn func(&mut self, id: u32) -> &mut FuncStats {
        Self::func_in(&mut self.funcs, id)
    }

    /// A call of `func` by `tid`, counted.
    fn count_call(&mut self, tid: u32, func: u32, how: Opened) {
        self.func(func).calls += 1;
        if self.record_calls {
            self.counted.push(CountedCall { tid, func, how });
        }
    }

    /// The calls counted since the last time ([`Collect::calls`]), in order.
    pub fn drain_calls(&mut self) -> std::vec::Drain<'_, CountedCall> {
        self.counted.drain(..)
    }

    /// [`Self::func`] on the field alone, for callers that hold a thread's stack meanwhile.
    fn func_in(funcs: &mut Vec<FuncStats>, id: u32) -> &mut FuncStats {
        let i = id as usize;
        if i >= funcs.len() {
            funcs.resize(i + 1, FuncStats::default());
        }
        &mut funcs[i]
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        tid: u32,
        func: u32,
        call_from: u64,
        call_line: u32,
        resume_pc: u64,
        plt_pending: bool,
        signal: Option<u32>,
    ) {
        let th = self.threads.entry(tid).or_default();
        if signal.is_some() {
            th.open.push(FxHashMap::default());
        }
        // A stub's frame is not the stub's: it becomes the callee's (`follow_plt`).
        if !plt_pending {
            th.enter(func);
        }
        let base = StackTree::base_of(&mut self.tree, tid);
        let parent = th.stack.last().map_or(base, |f| f.node);
        let node = match (&mut self.tree, signal) {
            // A handler runs under its signal, not under the function it interrupted.
            (Some(t), Some(signal)) => {
                let root = t.child(base, signal);
                t.child(root, func)
            }
            (Some(t), None) if plt_pending => t.detached(),
            (Some(t), None) => t.child(parent, func),
            (None, _) => ROOT,
        };
        let (depth, at) = (th.stack.len() as u32, th.instructions);
        th.stack.push(Frame {
            func,
            root: false,
            call_from,
            call_line,
            resume_pc,
            entry_total: th.instructions,
            plt_pending,
            node,
            signal,
            entry_in_handlers: th.in_handlers,
            tail: false,
        });
        let how = match (signal, plt_pending) {
            (Some(_), _) => Opened::SignalHandler,
            (None, true) => Opened::PltCall,
            (None, false) => Opened::Call,
        };
        self.event(StackEvent::Open { tid, depth, func, how, at });
    }

    /// The signal trampoline a handler returned to: a frame under the signal (not a call) that
    /// ends with the handler's signal, when the kernel returns to `resume_pc`.
    fn push_trampoline(&mut self, tid: u32, func: u32, resume_pc: u64, signal: u32) {
        let th = self.threads.entry(tid).or_default();
        th.open.push(FxHashMap::default());
        th.enter(func);
        let node = match &mut self.tree {
            Some(t) => {
                let base = t.base(tid);
                let root = t.child(base, signal);
                t.child(root, func)
            }
            None => ROOT,
        };
        let (depth, at) = (th.stack.len() as u32, th.instructions);
        th.stack.push(Frame {
            func,
            root: true,
            call_from: u64::MAX,
            call_line: 0,
            resume_pc,
            entry_total: th.instructions,
            plt_pending: false,
            node,
            signal: Some(signal),
            entry_in_handlers: th.in_handlers,
            tail: false,
        });
        self.event(StackEvent::Open { tid, depth, func, how: Opened::SignalTrampoline, at });
    }

    /// A jump by `tid` from a block at `from` to `to`: if the thread's newest frame is a call
    /// to a PLT stub still waiting for its target, and this jump leaves the PLT for the
    /// target, the frame becomes a call to the target.
    fn follow_plt(&mut self, tid: u32, pid: u32, from: &Location, to: u64, res: &mut Resolver) {
        let Some(th) = self.threads.get(&tid) else { return };
        if !th.stack.last().is_some_and(|f| f.plt_pending) {
            return;
        }
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
        let base = StackTree::base_of(&mut self.tree, tid);
        let Some(th) = self.threads.get_mut(&tid) else { return };
        let parent = th.stack.len().checked_sub(2).map_or(base, |i| th.stack[i].node);
        let depth = th.stack.len().saturating_sub(1) as u32;
        let Some(frame) = th.stack.last_mut() else { return };
        frame.func = target.func;
        frame.plt_pending = false;
        if let Some(t) = &mut self.tree {
            let node = t.child(parent, target.func);
            t.merge(frame.node, node);
            frame.node = node;
        }
        th.enter(target.func);
        self.count_call(tid, target.func, Opened::PltCall);
        self.event(StackEvent::Retarget { tid, depth, func: target.func });
    }

    /// A jump by `tid` from code at `from` to `to`: if it goes to the first instruction of
    /// another function (not through the PLT), it is a tail call, as callgrind counts it: a
    /// frame opens for the callee, called from the function that jumped, returning where that
    /// function's frame would.
    fn tail_call(&mut self, tid: u32, pid: u32, from: &Location, to: u64, call_line: u32, res: &mut Resolver) {
        let Some(th) = self.threads.get(&tid) else { return };
        let Some(top) = th.stack.last() else { return };
        if top.plt_pending || from.plt.is_some() {
            return;
        }
        // Every taken conditional jump comes here: look without copying the location.
        let target = res.resolve(pid, to);
        if target.func == from.func || target.plt.is_some() || &*target.symbol == "<unknown>" {
            return;
        }
        // At a function's first instruction, or (64-bit PowerPC ELFv2) at its local entry.
        if target.offset != 0 && !(target.offset <= 64 && res.is_local_entry(pid, to)) {
            return;
        }
        let target_func = target.func;
        let (root, call_from, resume_pc, parent) = (top.root, top.call_from, top.resume_pc, top.node);
        let th = self.threads.entry(tid).or_default();
        th.enter(target_func);
        let node = match &mut self.tree {
            Some(t) => t.child(parent, target_func),
            None => ROOT,
        };
        let (depth, at) = (th.stack.len() as u32, th.instructions);
        th.stack.push(Frame {
            func: target_func,
            root,
            call_from,
            call_line,
            resume_pc,
            entry_total: th.instructions,
            plt_pending: false,
            node,
            signal: None,
            entry_in_handlers: th.in_handlers,
            tail: true,
        });
        self.count_call(tid, target_func, Opened::TailCall);
        self.event(StackEvent::Open { tid, depth, func: target_func, how: Opened::TailCall, at });
    }

    /// A thread with nothing on its stack is in a function it was not seen to call: the
    /// start of its trace, or after that function returned. Open a root frame for it.
    fn ensure_root(&mut self, tid: u32, func: u32) {
        let th = self.threads.entry(tid).or_default();
        if th.stack.is_empty() {
            let node = match &mut self.tree {
                Some(t) => {
                    let base = t.base(tid);
                    t.child(base, func)
                }
                None => ROOT,
            };
            th.stack.push(Frame {
                func,
                root: true,
                call_from: 0,
                call_line: 0,
                resume_pc: 0,
                entry_total: th.instructions,
                plt_pending: false,
                node,
                signal: None,
                entry_in_handlers: th.in_handlers,
                tail: false,
            });
            th.enter(func);
            let at = th.instructions;
            self.event(StackEvent::Open { tid, depth: 0, func, how: Opened::Root, at });
        }
    }

    /// A block of `tid` starts in `loc`: if that function has a frame below the newest one,
    /// the frames above it are gone (a `longjmp` or an exception's unwinding left them without
    /// returning); close them.
    fn unwind_to(&mut self, tid: u32, loc: &Location) {
        // Most blocks are in the newest frame's function, or in one with no frame at all.
        // (The cheap test first: this runs for every block.)
        let Some(th) = self.threads.get(&tid) else { return };
        match th.stack.last() {
            Some(top) if top.func != loc.func => {}
            _ => return,
        }
        if !th.has_frame_of(loc.func) || &*loc.symbol == "<unknown>" {
            return;
        }
        if let Some(i) = th.stack.iter().rposition(|f| f.func == loc.func && !f.plt_pending) {
            self.pop_to(tid, i + 1);
        }
    }

    /// Close the frames of `tid` from index `i` up, newest first.
    fn pop_to(&mut self, tid: u32, i: usize) {
        let base = StackTree::base_of(&mut self.tree, tid);
        let th = self.threads.entry(tid).or_default();
        let total = th.instructions;
        let mut in_handlers = th.in_handlers;
        // One frame at a time, without collecting them: this runs at every return.
        while th.stack.len() > i {
            let Some(fr) = th.stack.pop() else { break };
            if self.record_events {
                // Newest first, as they close.
                self.events.push(StackEvent::Close { tid, depth: th.stack.len() as u32, at: total });
            }
            // The frame below is the caller's (the signal for a handler; none below a root).
            let below = th.stack.last();
            let caller = fr.signal.or(below.map(|b| b.func));
            let parent_node = below.map_or(base, |b| b.node);
            // Instructions run while the frame was open, less those of signal handlers that
            // interrupted it.
            // (Saturating: a damaged trace must not make it wrap.)
            let spent =
                total.saturating_sub(fr.entry_total).saturating_sub(in_handlers.saturating_sub(fr.entry_in_handlers));
            if fr.signal.is_some() {
                in_handlers += spent;
            }
            let mut node = fr.node;
            if fr.plt_pending {
                if let Some(t) = &mut self.tree {
                    // The stub's target was never seen: the call stays with the stub.
                    node = t.child(parent_node, fr.func);
                    t.merge(fr.node, node);
                }
            }
            if let (Some(t), false) = (&mut self.tree, fr.root && !fr.tail) {
                // A call with this stack (a root frame was not seen called).
                t.nodes[node as usize].calls += 1;
            }
            if let (Some(edges), Some(caller), false) = (&mut self.edges, caller, fr.root && !fr.tail) {
                let e = edges.entry((caller, fr.call_line, fr.func)).or_default();
                e.calls += 1;
                e.inclusive += spent;
            }
            if fr.plt_pending {
                // Its own instructions are already in its inclusive count (it had no frame).
                Self::func_in(&mut self.funcs, fr.func).calls += 1;
                if self.record_calls {
                    self.counted.push(CountedCall { tid, func: fr.func, how: Opened::PltCall });
                }
                continue;
            }
            let outermost = th.leave(fr.func);
            if fr.signal.is_some() {
                th.open.pop();
            }
            if outermost {
                Self::func_in(&mut self.funcs, fr.func).inclusive += spent;
            }
        }
        th.in_handlers = in_handlers;
    }

    /// `n` instructions of `tid` in `loc` (the newest frame is the one they run in).
    fn add_self(&mut self, tid: u32, pid: u32, loc: &Location, n: u32) {
        let n = n as u64;
        // The newest frame's function is open at the current level (every frame but a pending
        // PLT call's entered it there): the common case needs no lookup.
        let own_frame = self.threads.get(&tid).is_some_and(|th| match th.stack.last() {
            Some(top) if top.func == loc.func && !top.plt_pending => true,
            _ => th.runs_in_own_frame(loc.func),
        });
        let f = self.func(loc.func);
        f.self_instructions += n;
        if !own_frame {
            // Not inside a frame of its own (jumped into): its own work is still its inclusive cost.
            f.inclusive += n;
        }
        let th = self.threads.entry(tid).or_default();
        th.pid = pid;
        th.instructions += n;
        if self.record_events {
            // A PLT stub's own instructions are a leaf above its frame (the frame is its target's).
            let framed = th.stack.last().is_some_and(|f| f.func == loc.func && !f.plt_pending);
            self.events.push(StackEvent::Run { tid, func: loc.func, n: n as u32, framed, at: th.instructions });
        }
        if let (Some(t), Some(top)) = (&mut self.tree, th.stack.last()) {
            let leaf = t.leaf(top.node, loc.func);
            t.nodes[leaf as usize].instructions += n;
        }
        if let Some(lines) = &mut self.lines {
            *lines.entry((loc.func, loc.file.clone(), loc.line)).or_default() += n;
        }
    }
}

impl Sink for CallStacks {
    fn block(&mut self, b: &Block, _names: &mut Names, res: &mut Resolver) -> Result<(), PostError> {
        let br = b.branch;
        self.total_branches += 1;
        self.threads.entry(br.tid).or_default().branches += 1;
        match &b.loc {
            Where::User(l) => {
                self.unwind_to(br.tid, l);
                self.ensure_root(br.tid, l.func);
                self.add_self(br.tid, b.pid, l, br.icount);
                match br.kind {
                    // A call from PLT code to PLT code is ppc64 glink's `bcl` that reads its
                    // own address, not a call.
                    BranchKind::Call if l.plt.is_some() && res.resolve(b.pid, br.to).plt.is_some() => {}
                    BranchKind::Call => {
                        let callee = res.resolve(b.pid, br.to);
                        let via_plt = callee.plt.is_some();
                        if !via_plt {
                            self.count_call(br.tid, callee.func, Opened::Call);
                        }
                        let call_line = if self.lines.is_some() { res.resolve(b.pid, br.from).line } else { 0 };
                        self.push(br.tid, callee.func, br.from, call_line, 0, via_plt, None);
                    }
                    BranchKind::Jump => {
                        let pending =
                            self.threads.get(&br.tid).and_then(|th| th.stack.last()).is_some_and(|f| f.plt_pending);
                        if pending {
                            self.follow_plt(br.tid, b.pid, l, br.to, res);
                        } else {
                            let line = if self.lines.is_some() { res.resolve(b.pid, br.from).line } else { 0 };
                            self.tail_call(br.tid, b.pid, l, br.to, line, res);
                        }
                    }
                    BranchKind::Return => {
                        let th = self.threads.entry(br.tid).or_default();
                        let hit = th.stack.iter().rposition(|f| {
                            !f.root
                                && f.call_from != u64::MAX
                                && br.to > f.call_from
                                && br.to - f.call_from <= MAX_CALL_LEN
                        });
                        // The newest frame, and the frames that tail-called it.
                        let newest = th.stack.len().checked_sub(1).map(|i| chain_start(&th.stack, i));
                        if let Some(i) = hit {
                            let i = chain_start(&th.stack, i);
                            self.pop_to(br.tid, i);
                        } else if let Some((i, signal, resume_pc)) =
                            newest.and_then(|i| Some((i, th.stack[i].signal?, th.stack[i].resume_pc)))
                        {
                            // A handler returns to the signal trampoline (`__restore_rt`), which
                            // no call put there: the handler is done, and the trampoline runs
                            // under the signal until the kernel returns to the interrupted code.
                            self.pop_to(br.tid, i);
                            let trampoline = res.resolve(b.pid, br.to).func;
                            self.push_trampoline(br.tid, trampoline, resume_pc, signal);
                        } else if newest == Some(0) && th.stack[0].root {
                            // The root function returns to a caller the trace never saw call it.
                            self.pop_to(br.tid, 0);
                        }
                    }
                    BranchKind::Intrpt if br.flags & branch_flags::SIGNAL != 0 => {
                        self.threads.entry(br.tid).or_default().signal_from = br.from;
                    }
                    _ => {}
                }
            }
            Where::Kernel(kernel_name) => {
                let th = self.threads.entry(br.tid).or_default();
                // Back from the kernel to where a signal interrupted: its handler frames end.
                if let Some(i) = th.stack.iter().rposition(|f| f.call_from == u64::MAX && f.resume_pc == br.to) {
                    let i = chain_start(&th.stack, i);
                    self.pop_to(br.tid, i);
                }
                if br.flags & branch_flags::SIGNAL != 0 {
                    let resume = self.threads.entry(br.tid).or_default().signal_from;
                    let handler = res.resolve(b.pid, br.to).func;
                    let signal = res.kernel_func(kernel_name);
                    self.count_call(br.tid, handler, Opened::SignalHandler);
                    self.push(br.tid, handler, u64::MAX, 0, resume, false, Some(signal));
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
        if let Some(l) = partial {
            self.unwind_to(off.tid, l);
            self.ensure_root(off.tid, l.func);
            self.add_self(off.tid, off.pid, l, off.icount);
        }
        self.pop_to(off.tid, 0);
        Ok(())
    }

    fn lost(&mut self, _cpu: u16, lost: &Lost) -> Result<(), PostError> {
        self.lost = self.lost.saturating_add(lost.count);
        Ok(())
    }

    /// The stack state of `tids` is unknown after a gap: close their frames (counted as cut),
    /// never carry them across it; what they run next opens root frames.
    fn gap(&mut self, _cpu: u16, tids: &[u32], _cause: GapCause) -> Result<(), PostError> {
        for &tid in tids {
            if self.threads.get(&tid).is_some_and(|t| !t.stack.is_empty()) {
                self.pop_to(tid, 0);
                self.cut_at_gaps += 1;
            }
        }
        Ok(())
    }
}

/// The root of the stack tree (no function).
const ROOT: u32 = 0;
/// No node (end of a child or sibling list).
const NONE: u32 = u32::MAX;
/// The function of a detached node: a call to a PLT stub whose target is not known yet.
const PENDING: u32 = u32::MAX;

struct Node {
    func: u32,
    /// Instructions run with exactly this stack.
    instructions: u64,
    /// Calls that made this stack (frames of `func` opened under the parent's stack).
    calls: u64,
    first_child: u32,
    next_sibling: u32,
}

/// Every distinct call stack seen, as a tree of functions, with the instructions run with
/// each stack. The function a block starts in is the leaf under the newest frame when it
/// differs from that frame's (a tail call, a PLT stub's own instructions).
pub struct StackTree {
    nodes: Vec<Node>,
    index: FxHashMap<(u32, u32), u32>,
    free: Vec<u32>,
    /// Per thread ([`Collect::per_thread`]): the threads whose frames are the tree's roots,
    /// the function id of each being [`THREAD_FRAME`] plus its index here.
    threads: Option<Vec<u32>>,
    /// The root node of each thread in `threads`.
    thread_nodes: FxHashMap<u32, u32>,
}

/// Function ids from here up are threads' frames in a per-thread tree (a function id is an
/// index into the resolver's functions, far below).
const THREAD_FRAME: u32 = 1 << 31;

impl StackTree {
    fn new(per_thread: bool) -> Self {
        let root = Node { func: NONE, instructions: 0, calls: 0, first_child: NONE, next_sibling: NONE };
        StackTree {
            nodes: vec![root],
            index: FxHashMap::default(),
            free: Vec::new(),
            threads: per_thread.then(Vec::new),
            thread_nodes: FxHashMap::default(),
        }
    }

    /// The node a thread's outermost frames are children of: the root, or in a per-thread
    /// tree the thread's own frame.
    fn base(&mut self, tid: u32) -> u32 {
        let Some(threads) = &mut self.threads else { return ROOT };
        if let Some(&node) = self.thread_nodes.get(&tid) {
            return node;
        }
        let func = THREAD_FRAME + threads.len() as u32;
        threads.push(tid);
        let node = self.child(ROOT, func);
        self.thread_nodes.insert(tid, node);
        node
    }

    /// [`Self::base`] of a tree that may not be built (the root then).
    fn base_of(tree: &mut Option<StackTree>, tid: u32) -> u32 {
        tree.as_mut().map_or(ROOT, |t| t.base(tid))
    }

    /// The thread whose frame the function id `func` is, in a per-thread tree.
    pub fn thread_of(&self, func: u32) -> Option<u32> {
        let i = func.checked_sub(THREAD_FRAME)?;
        self.threads.as_ref()?.get(i as usize).copied()
    }

    fn alloc(&mut self, func: u32) -> u32 {
        let node = Node { func, instructions: 0, calls: 0, first_child: NONE, next_sibling: NONE };
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// The node of `func` called from `parent`'s stack.
    fn child(&mut self, parent: u32, func: u32) -> u32 {
        if let Some(&c) = self.index.get(&(parent, func)) {
            return c;
        }
        let c = self.alloc(func);
        self.nodes[c as usize].next_sibling = self.nodes[parent as usize].first_child;
        self.nodes[parent as usize].first_child = c;
        self.index.insert((parent, func), c);
        c
    }

    /// A node that no lookup or walk finds, for a frame whose function is not known yet.
    fn detached(&mut self) -> u32 {
        self.alloc(PENDING)
    }

    /// Where instructions of `func` run with `node`'s frame newest.
    fn leaf(&mut self, node: u32, func: u32) -> u32 {
        if self.nodes[node as usize].func == func {
            node
        } else {
            self.child(node, func)
        }
    }

    /// Add the subtree at `src` (a detached node) into `dst`'s, and free it.
    fn merge(&mut self, src: u32, dst: u32) {
        let mut work = vec![(src, dst)];
        while let Some((s, d)) = work.pop() {
            let n = std::mem::take(&mut self.nodes[s as usize].instructions);
            self.nodes[d as usize].instructions += n;
            let calls = std::mem::take(&mut self.nodes[s as usize].calls);
            self.nodes[d as usize].calls += calls;
            let mut c = self.nodes[s as usize].first_child;
            while c != NONE {
                let next = self.nodes[c as usize].next_sibling;
                let func = self.nodes[c as usize].func;
                self.index.remove(&(s, func));
                let dc = self.child(d, func);
                work.push((c, dc));
                c = next;
            }
            self.nodes[s as usize].first_child = NONE;
            self.free.push(s);
        }
    }

    /// Visit every stack that ran instructions (functions from the root) with its
    /// instructions, depth first: memory for one path, not for all of them.
    pub fn walk(&self, visit: &mut dyn FnMut(&[u32], u64) -> std::io::Result<()>) -> std::io::Result<()> {
        let mut path: Vec<u32> = Vec::new();
        let mut failed = None;
        self.visit_nodes(&mut |depth, func, instructions, _calls| {
            if failed.is_some() {
                return;
            }
            // The node's path is `path[..depth]` plus its function.
            path.truncate(depth);
            path.push(func);
            if instructions > 0 {
                if let Err(e) = visit(&path, instructions) {
                    failed = Some(e);
                }
            }
        });
        failed.map_or(Ok(()), Err)
    }

    /// Visit every node (every distinct stack, whether it ran instructions or only called),
    /// depth first, parents before children: (depth from 0, function, instructions run with
    /// exactly this stack, calls that made it).
    pub fn visit_nodes(&self, visit: &mut dyn FnMut(usize, u32, u64, u64)) {
        let mut todo: Vec<(u32, usize)> = Vec::new();
        let mut c = self.nodes[ROOT as usize].first_child;
        while c != NONE {
            todo.push((c, 0));
            c = self.nodes[c as usize].next_sibling;
        }
        while let Some((node, depth)) = todo.pop() {
            let n = &self.nodes[node as usize];
            visit(depth, n.func, n.instructions, n.calls);
            let mut c = n.first_child;
            while c != NONE {
                todo.push((c, depth + 1));
                c = self.nodes[c as usize].next_sibling;
            }
        }
    }

    /// Every stack that ran instructions, root first, with its instructions.
    pub fn stacks(&self) -> Vec<(Vec<u32>, u64)> {
        let mut out = Vec::new();
        let _ = self.walk(&mut |path, n| {
            out.push((path.to_vec(), n));
            Ok(())
        });
        out
    }

    /// Distinct stacks held (nodes in use).
    pub fn len(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lazily bound PLT call: the stub's frame runs the resolver, which calls a helper, then
    /// jumps to the target; the stub's subtree moves under the target, and its nodes are reused.
    #[test]
    fn a_detached_subtree_merges_into_its_target() {
        let mut t = StackTree::new(false);
        let main = t.child(ROOT, 1);
        t.nodes[main as usize].instructions = 5;
        let pending = t.detached();
        let stub = t.leaf(pending, 2);
        t.nodes[stub as usize].instructions = 3;
        let helper = t.child(pending, 3);
        t.nodes[helper as usize].instructions = 7;
        let target = t.child(main, 4);
        t.merge(pending, target);
        let mut stacks = t.stacks();
        stacks.sort();
        assert_eq!(stacks, vec![(vec![1], 5), (vec![1, 4, 2], 3), (vec![1, 4, 3], 7)]);
        assert_eq!(t.len(), 4);
        // A second call reuses the freed nodes.
        let pending = t.detached();
        t.merge(pending, target);
        assert_eq!(t.len(), 4);
    }
}
