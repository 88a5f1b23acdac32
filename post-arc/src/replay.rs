//! The one pass over a trace that arc and report share: records in time
//! order, module-table state applied as it comes, each branch record turned
//! into a block (the instructions from the previous branch target of the
//! same thread up to this branch) with its location resolved.

use crate::funcname::{FunctionQuery, NameError};
use crate::names;
use crate::range::RangeState;
use crate::resolve::{Location, Resolver};
use crate::threads::Names;
use crate::{PostError, Trace, PROGRESS_EVERY};
use itrace_format::Mte;
use itrace_format::{branch_flags, Branch, BranchKind, Lost, Record, TraceOff};
use rustc_hash::{FxHashMap, FxHashSet};
use std::rc::Rc;
use std::sync::Arc;

/// One block of a thread.
pub struct Block<'a> {
    pub cpu: u16,
    pub pid: u32,
    pub branch: &'a Branch,
    /// Address of the block's first instruction (0 for kernel blocks).
    pub start: u64,
    /// Where the block is: a resolved user location, or a kernel name (`sys_write`, `signal_SIGSEGV`).
    pub loc: Where,
}

/// Location of a block.
pub enum Where {
    User(Rc<Location>),
    Kernel(String),
}

/// Receives the replayed trace.
pub trait Sink {
    /// A block ending in a taken branch or kernel transition.
    fn block(&mut self, b: &Block, names: &mut Names, res: &mut Resolver) -> Result<(), PostError>;
    /// Tracing of a thread ended; `partial` is its last, unfinished block (if it ran
    /// instructions), `at` where the thread stood (the next instruction, or a crash's).
    fn trace_off(
        &mut self,
        off: &TraceOff,
        partial: Option<&Location>,
        at: &Location,
        names: &mut Names,
    ) -> Result<(), PostError>;
    /// Records were lost on `cpu` (wrap mode overwrote them).
    fn lost(&mut self, cpu: u16, lost: &Lost) -> Result<(), PostError>;
    /// Records of `cpu` were lost here (`cause` says how): what threads `tids` did in them is
    /// unknown (their stacks, where their next block starts). Nothing by default.
    fn gap(&mut self, _cpu: u16, _tids: &[u32], _cause: GapCause) -> Result<(), PostError> {
        Ok(())
    }
}

/// Why records of a CPU stream are missing at a [`Sink::gap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GapCause {
    /// A damaged chunk of the stream was skipped.
    Damaged,
    /// The file's end cuts the stream's last chunk, and a thread last seen on it goes on on
    /// another CPU after its last readable record: what it did in between may be lost.
    StreamCut,
}

/// Replay `trace` into `sink`; `progress` gets the file offset reached now and then.
pub fn replay(
    trace: &Trace,
    lines: bool,
    sink: &mut dyn Sink,
    progress: &mut dyn FnMut(u64),
) -> Result<(Names, Resolver), PostError> {
    let arch = trace.header().arch;
    let mut names = Names::default();
    let mut res = Resolver::new(lines);
    let archive = crate::archive::archive_dir(trace.path());
    if archive.is_dir() {
        res.use_archive(&archive);
    }
    for r in trace.stream(itrace_format::STREAM_MTE) {
        if let (_, Record::Mte(m)) = r? {
            res.preload(&m);
        }
    }
    let range = trace.range();
    let mut at = RangeState::new(range);
    // The functions `--after` names (from the symbol tables of every file the trace mapped).
    let after = match &range.after {
        Some(name) => match functions_named(trace, &FunctionQuery::new(name)) {
            Err(PostError::Name(NameError::NotFound(_))) => return Err(crate::no_such_function(name, res.notes())),
            found => Some(found?),
        },
        None => None,
    };
    let start_ns = trace.header().start_monotonic_ns;
    // Start of each thread's current block.
    let mut block_start: FxHashMap<u32, u64> = FxHashMap::default();
    // With damaged chunks: the CPU stream each thread was last seen on, so that a gap in a
    // stream cuts the threads that may have run in what was lost (kept only then: a lookup
    // per record otherwise spent for nothing).
    let damaged = !trace.damage().is_empty();
    // In a file cut inside a CPU chunk: that stream and where its records end. A thread last
    // seen on it that goes on on another CPU after that end may have run on it in what is
    // lost, so its records there do not continue its block (that would join two blocks a hole
    // apart); one moving before the end moved for real, as the stream's records up to its end
    // are all there. (Other streams may have lost whole chunks after the cut too: nothing in
    // the file says so, and a lone thread moves between CPUs at every start under the
    // translating recorder, so they are not suspected.)
    let cut_stream = trace.cut_stream_end();
    let follow_threads = damaged || cut_stream.is_some();
    let mut thread_stream: FxHashMap<u32, u16> = FxHashMap::default();
    let ncpu = trace.header().ncpu;
    let mut n = 0u64;
    // Chunks decode on a second thread while this one walks the records (ITRACE_READ_THREADS=1: here).
    trace.read_merged(itrace_format::decode_ahead_default(), |merged| -> Result<(), PostError> {
        while let Some(ev) = merged.next_ref() {
            let ev = ev?;
            n += 1;
            if follow_threads && ev.stream < ncpu {
                let tid = match ev.record {
                    Record::Branch(b) => Some(b.tid),
                    Record::TraceOn(on) => Some(on.tid),
                    Record::TraceOff(off) => Some(off.tid),
                    _ => None,
                };
                let mut cut_here = false;
                if ev.after_gap {
                    let mut tids: Vec<u32> =
                        thread_stream.iter().filter(|&(_, &s)| s == ev.stream).map(|(&t, _)| t).collect();
                    tids.extend(tid.filter(|t| !tids.contains(t)));
                    tids.sort_unstable();
                    for t in &tids {
                        block_start.remove(t);
                    }
                    cut_here = tid.is_some();
                    sink.gap(ev.stream, &tids, GapCause::Damaged)?;
                }
                if let Some(t) = tid {
                    if let (Some((cut, end)), Some(&was), false) = (cut_stream, thread_stream.get(&t), cut_here) {
                        // Past the end of the cut stream it was last seen on: see `cut_stream`.
                        if was == cut && ev.stream != cut && end < ev.record.ts() {
                            block_start.remove(&t);
                            sink.gap(was, &[t], GapCause::StreamCut)?;
                        }
                    }
                    thread_stream.insert(t, ev.stream);
                }
            }
            if n % PROGRESS_EVERY == 0 {
                progress(ev.offset);
            }
            if let (Record::TraceOff(off), false, None) = (ev.record, at.started, &after) {
                // A thread's last, partial block starts the range as a block would.
                at.started = range.from.is_none_or(|f| at.reached(f, off.ts.saturating_sub(start_ns)));
            }
            match ev.record {
                Record::Branch(b) => {
                    let in_range = at.started;
                    let pid = names.pid_of(b.tid);
                    // The thread's block start: looked up once, and updated in place after the block.
                    let known_start = block_start.get_mut(&b.tid);
                    let (start, loc) = if b.kernel {
                        let name = if b.flags & branch_flags::SIGNAL != 0 {
                            names::signal(b.aux)
                        } else if b.flags & branch_flags::SYSCALL != 0 {
                            names::syscall(arch, b.aux)
                        } else {
                            "kernel".to_string()
                        };
                        (0, Where::Kernel(name))
                    } else {
                        // Without a known start (wrap mode cut it off), the block is placed at its branch.
                        let start = known_start.as_deref().copied().unwrap_or(b.from);
                        let loc = res.resolve(pid, start);
                        // A call, or a jump out of a function, into code no symbol covers starts a
                        // function there (stripped code without call-frame information).
                        match b.kind {
                            BranchKind::Call => res.learn_function_start(pid, None, b.to),
                            BranchKind::Jump => res.learn_function_start(pid, Some(loc.func), b.to),
                            _ => {}
                        }
                        (start, Where::User(loc))
                    };
                    let ns = b.ts.saturating_sub(start_ns);
                    if !in_range {
                        let from_reached = range.from.is_none_or(|f| at.reached(f, ns));
                        let after_reached = match (&after, &loc) {
                            (None, _) => true,
                            (Some(names), Where::User(l)) => names.contains(&l.symbol),
                            (Some(_), Where::Kernel(_)) => false,
                        };
                        at.started = from_reached && after_reached;
                    }
                    if at.started && range.to.is_some_and(|t| at.reached(t, ns)) {
                        break;
                    }
                    at.instructions += u64::from(b.icount);
                    if at.started {
                        sink.block(&Block { cpu: ev.stream, pid, branch: b, start, loc }, &mut names, &mut res)?;
                    }
                    match known_start {
                        Some(s) if b.to != 0 => *s = b.to,
                        None if b.to != 0 => {
                            block_start.insert(b.tid, b.to);
                        }
                        _ => {
                            block_start.remove(&b.tid);
                        }
                    }
                }
                Record::TraceOn(on) => {
                    // pid 0: a wrap-mode resume point; the thread's process comes from the MTE stream.
                    if on.pid != 0 {
                        names.trace_on(on.pid, on.tid);
                    }
                    block_start.insert(on.tid, on.pc);
                }
                Record::TraceOff(off) if !at.started => {
                    // Outside the range: only where the thread stands changes.
                    at.instructions += u64::from(off.icount);
                    block_start.remove(&off.tid);
                }
                Record::TraceOff(off) => {
                    let ns = off.ts.saturating_sub(start_ns);
                    if range.to.is_some_and(|t| at.reached(t, ns)) {
                        break;
                    }
                    at.instructions += u64::from(off.icount);
                    let partial = if off.icount > 0 {
                        let start = block_start.get(&off.tid).copied().unwrap_or(off.pc);
                        Some(res.resolve(off.pid, start))
                    } else {
                        None
                    };
                    let at = res.resolve(off.pid, off.pc);
                    sink.trace_off(off, partial.as_deref(), &at, &mut names)?;
                    block_start.remove(&off.tid);
                }
                Record::Lost(l) => {
                    sink.lost(ev.stream, l)?;
                }
                Record::Mte(m) => {
                    names.apply(m);
                    res.apply(m);
                }
                Record::Summary(_) | Record::Unknown { .. } => {}
            }
        }
        Ok(())
    })?;
    Ok((names, res))
}

/// The names of the functions `query` selects among those of every file `trace` mapped (their
/// symbol tables): for a name given before the replay (`-F`).
pub fn functions_named(trace: &Trace, query: &FunctionQuery) -> Result<FxHashSet<Arc<str>>, PostError> {
    let mut res = Resolver::new(false);
    let archive = crate::archive::archive_dir(trace.path());
    if archive.is_dir() {
        res.use_archive(&archive);
    }
    let mut mapped: Vec<Arc<str>> = Vec::new();
    for r in trace.stream(itrace_format::STREAM_MTE) {
        match r? {
            (_, Record::Mte(m @ Mte::ModuleId { .. })) => res.apply(&m),
            (_, Record::Mte(Mte::Segment { path, .. })) if !mapped.iter().any(|p| **p == *path) => {
                mapped.push(Arc::from(path.as_str()))
            }
            _ => {}
        }
    }
    res.functions_named(query, &mapped).map_err(PostError::Name)
}
