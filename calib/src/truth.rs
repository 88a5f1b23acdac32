//! The truth from the instruction trace of the profiled run: per thread, the hook events in
//! order and the real work between each two of them; per function, its own instructions.
//!
//! Excluded exactly: every instruction of the hook library (its module; the reads themselves
//! are never traced), the `call` of a hook, the PLT stub it goes through, and the
//! instrumentation's argument set-up before the call (the last writes of `rdi` and `rsi`,
//! decoded from the code). Everything else the thread ran between two hooks is the work of
//! the function on top of the profiled stack, as the profiler sees it.

use crate::CalibError;
use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
use itrace_format::{BranchKind, Lost, TraceOff};
use itrace_post::replay::{replay, Block, Sink, Where};
use itrace_post::resolve::{Location, Resolver};
use itrace_post::{Names, PostError, Trace};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One hook event seen in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TruthEvent {
    pub exit: bool,
    /// The function whose hook it is (its start address).
    pub func: u64,
    /// Real instructions since the previous event of the thread.
    pub work: u64,
}

/// The truth of a run.
#[derive(Default)]
pub struct Truth {
    /// Per thread: (pid, events).
    pub threads: BTreeMap<u32, (u32, Vec<TruthEvent>)>,
    /// Instructions in each function's own code, hooks and glue excluded, by (pid, start).
    pub own: HashMap<(u32, u64), u64>,
    /// Records the trace lost (the truth is incomplete when not 0).
    pub lost: u64,
}

#[derive(Default)]
struct Th {
    pid: u32,
    in_hook: bool,
    exit: bool,
    work: u64,
    /// The last block ending in a call: (start, call address, function start).
    call_block: Option<(u64, u64, u64)>,
    /// Blocks run since that call: (function start, instructions).
    after_call: Vec<(u64, u64)>,
    events: Vec<TruthEvent>,
}

struct TruthSink {
    hook_module: String,
    threads: BTreeMap<u32, Th>,
    own: HashMap<(u32, u64), u64>,
    files: HashMap<Arc<str>, Option<Vec<u8>>>,
    lost: u64,
}

/// The last writes of `rdi` and `rsi` before the call at `from`, in the block starting at
/// `start` (the hook's arguments: this function and the call site): how many there are.
fn arg_setup(files: &mut HashMap<Arc<str>, Option<Vec<u8>>>, res: &Resolver, pid: u32, start: u64, from: u64) -> u64 {
    let Some((path, off)) = res.file_offset(pid, start) else { return 0 };
    let bytes = files.entry(path.clone()).or_insert_with(|| std::fs::read(&*path).ok());
    let Some(bytes) = bytes else { return 0 };
    let len = (from.saturating_sub(start) + 16) as usize;
    let off = off as usize;
    let Some(code) = bytes.get(off..(off + len).min(bytes.len())) else { return 0 };
    let mut dec = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut insns = Vec::new();
    while dec.can_decode() {
        let i = dec.decode();
        if i.ip() > from {
            break;
        }
        insns.push(i);
    }
    let (mut rdi, mut rsi) = (false, false);
    let mut n = 0;
    for i in insns.iter().rev().skip(1) {
        if !matches!(i.mnemonic(), Mnemonic::Mov | Mnemonic::Lea)
            || i.op_count() == 0
            || i.op0_kind() != OpKind::Register
        {
            continue;
        }
        match i.op0_register().full_register() {
            Register::RDI if !rdi => {
                rdi = true;
                n += 1;
            }
            Register::RSI if !rsi => {
                rsi = true;
                n += 1;
            }
            _ => {}
        }
        if rdi && rsi {
            break;
        }
    }
    n
}

impl TruthSink {
    fn is_hook(&self, l: &Location) -> bool {
        l.module.ends_with(&self.hook_module)
    }
}

fn take(own: &mut HashMap<(u32, u64), u64>, key: (u32, u64), n: u64) {
    if let Some(v) = own.get_mut(&key) {
        *v = v.saturating_sub(n);
    }
}

impl Sink for TruthSink {
    fn block(&mut self, b: &Block, _names: &mut Names, res: &mut Resolver) -> Result<(), PostError> {
        let br = b.branch;
        let l = match &b.loc {
            Where::User(l) => l,
            Where::Kernel(_) => {
                let th = self.threads.entry(br.tid).or_default();
                if !th.in_hook {
                    th.work += br.icount as u64;
                }
                return Ok(());
            }
        };
        let hook = self.is_hook(l);
        let th = self.threads.entry(br.tid).or_default();
        th.pid = b.pid;
        if hook {
            if !th.in_hook {
                th.in_hook = true;
                th.exit = &*l.symbol == "__cyg_profile_func_exit";
                if let Some((start, from, f)) = th.call_block.take() {
                    let g = 1 + arg_setup(&mut self.files, res, b.pid, start, from);
                    th.work = th.work.saturating_sub(g);
                    take(&mut self.own, (b.pid, f), g);
                    for (f, n) in th.after_call.drain(..) {
                        th.work = th.work.saturating_sub(n);
                        take(&mut self.own, (b.pid, f), n);
                    }
                }
            }
            return Ok(());
        }
        let f = b.start.wrapping_sub(l.offset);
        if th.in_hook {
            // Back in the program: the hook's event is complete (its function is the one
            // returned to).
            th.in_hook = false;
            th.events.push(TruthEvent { exit: th.exit, func: f, work: th.work });
            th.work = 0;
        }
        let n = br.icount as u64;
        th.work += n;
        *self.own.entry((b.pid, f)).or_default() += n;
        if br.kind == BranchKind::Call {
            th.call_block = Some((b.start, br.from, f));
            th.after_call.clear();
        } else if th.call_block.is_some() {
            th.after_call.push((f, n));
            if th.after_call.len() > 4 {
                th.call_block = None;
                th.after_call.clear();
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
            if !th.in_hook && !l.module.ends_with(&self.hook_module) {
                th.work += off.icount as u64;
            }
        }
        Ok(())
    }

    fn lost(&mut self, _cpu: u16, lost: &Lost) -> Result<(), PostError> {
        self.lost += lost.count;
        Ok(())
    }
}

/// Replay `trace`; `hook_module` is the hook library's file name (`libhookit.so`). Returns the
/// truth and the resolver (as of the end of the trace).
pub fn truth(trace: &Trace, hook_module: &str) -> Result<(Truth, Resolver), CalibError> {
    let mut sink = TruthSink {
        hook_module: format!("/{hook_module}"),
        threads: BTreeMap::new(),
        own: HashMap::new(),
        files: HashMap::new(),
        lost: 0,
    };
    let (_, res) = replay(trace, false, &mut sink, &mut |_| {})?;
    let lost = match trace.summary() {
        Some(s) => s.lost.iter().sum::<u64>().max(sink.lost),
        None => sink.lost,
    };
    let threads = sink.threads.into_iter().map(|(tid, t)| (tid, (t.pid, t.events))).collect();
    Ok((Truth { threads, own: sink.own, lost }, res))
}
