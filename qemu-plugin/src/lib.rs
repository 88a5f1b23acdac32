//! The itrace TCG plugin for qemu-user: records every taken branch of an
//! emulated program, with instruction counts, into an itrace trace file.
//!
//! qemu calls [`on_tb_trans`] once per translated block: the block's last
//! instruction is classified there, once, with itrace's decoders. Every
//! execution of a block then calls [`on_tb_exec`], which only compares the
//! block's start with where the previous block of the same vCPU would have
//! fallen through: a block that starts elsewhere (or follows an
//! unconditional transfer) means the previous block ended with a taken
//! branch, which goes into the vCPU's own batch (continuous mode; 40-byte
//! records in the normal and wrap modes). Blocks qemu cut for its own reasons
//! (size limits, page ends) fall through and their counts merge. Full batches
//! go to the writer thread ([`writer`]), which encodes them on the other core
//! while this one runs the program: encoding was the larger half of the work.
//!
//! In qemu-user each guest thread is a vCPU with its own index: the index is
//! the trace stream. System calls come from the plugin API's syscall
//! callbacks (a `U` INTRPT record at the call, a `K` IRET record to where
//! the thread resumes); executable file mappings from the mmap calls seen
//! there, plus the program and its loader from their ELF headers.
//!
//! Why about 900 lines: the plugin is one cdylib whose callbacks share its per-vCPU state
//! through qemu's C API; the trace writer is in `writer.rs`.

mod blocks;
pub mod config;
mod ffi;
pub mod writer;

use blocks::{Packed, TbInfo};
use config::Config;
use itrace_decoders::Flow;
use itrace_format::{
    branch_flags, Arch, Branch, BranchKind, Mode, Mte, Record, StopReason, TraceOff, TraceOn, TraceOnReason,
    BRANCH_RECORD_LEN,
};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::{Path, PathBuf};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering::*};
use std::sync::mpsc::SyncSender;
use std::sync::{Mutex, OnceLock};
use writer::{now_ns, Batch, Msg, Totals};

/// Most vCPUs (guest threads alive at once, in qemu-user) the plugin keeps apart.
pub const MAX_VCPUS: usize = 1024;
/// Bytes of records a vCPU gathers before handing them to the writer.
const SEGMENT: usize = 256 * 1024;
/// A vCPU hands its records to the writer once the oldest is this old, even if its segment is
/// not full (looked at each time it reads the clock: every 64 branch records, every system
/// call); the writer then writes them within its own half second. Together under a second.
const VCPU_FLUSH_NS: u64 = 250_000_000;
/// At a system call (which may block for long, with nothing to wake the vCPU), the records go
/// to the writer once the oldest is this old.
const SYSCALL_FLUSH_NS: u64 = 50_000_000;

/// The plugin API version we need; qemu refuses to load a plugin outside its supported range.
#[no_mangle]
pub static qemu_plugin_version: c_int = ffi::API_VERSION;

/// System call numbers the plugin acts on, per architecture.
struct Syscalls {
    execve: i64,
    /// The old sigreturn, besides rt_sigreturn (i386, s390x).
    sigreturn: Option<i64>,
    /// kill, tkill, tgkill: the signal a thread sends itself is the one delivered on return.
    kill: [i64; 3],
    /// mmap with a byte offset (x86_64, ppc64) or a page offset (i386 mmap2); none on s390x,
    /// whose mmap takes its arguments in memory.
    mmap: Option<(i64, u64)>,
}

fn syscalls(arch: Arch) -> Syscalls {
    match arch {
        Arch::X86_64 => Syscalls { execve: 59, sigreturn: None, kill: [62, 200, 234], mmap: Some((9, 1)) },
        Arch::I386 => Syscalls { execve: 11, sigreturn: Some(119), kill: [37, 238, 270], mmap: Some((192, 4096)) },
        Arch::Ppc64le | Arch::Ppc64 => {
            Syscalls { execve: 11, sigreturn: Some(119), kill: [37, 208, 250], mmap: Some((90, 1)) }
        }
        Arch::S390x => Syscalls { execve: 11, sigreturn: Some(119), kill: [37, 237, 241], mmap: None },
    }
}

struct State {
    cfg: Config,
    arch: Box<dyn itrace_arch::Arch + Send + Sync>,
    nr: Syscalls,
    tx: SyncSender<Msg>,
    writer: Mutex<Option<std::thread::JoinHandle<Totals>>>,
    pid: u32,
    name: String,
    /// The process's module table has been written (at its first block).
    started: AtomicBool,
    finished: AtomicBool,
}

static STATE: OnceLock<State> = OnceLock::new();
/// What the callbacks do: trace, end the trace at the next block, or nothing (a forked child,
/// whose parent owns the trace, and once the trace is finished). One load on the hot path.
static PHASE: AtomicU8 = AtomicU8::new(TRACING);
const TRACING: u8 = 0;
/// itrace asked for the end (or went away): the next block asks qemu for a quiet moment.
const STOP_ASKED: u8 = 1;
/// qemu was asked (`qemu_plugin_reset`); `on_reset` ends the trace.
const STOPPING: u8 = 2;
const OFF: u8 = 3;
/// The id qemu gave the plugin, for `qemu_plugin_reset`.
static PLUGIN_ID: OnceLock<ffi::PluginId> = OnceLock::new();
static VCPUS: [AtomicPtr<Vcpu>; MAX_VCPUS] = [const { AtomicPtr::new(null_mut()) }; MAX_VCPUS];

/// An mmap call waiting for its result.
struct PendingMmap {
    len: u64,
    prot: u32,
    offset: u64,
    path: String,
}

/// Per-vCPU state, touched only by the vCPU's own thread (and at exit, when qemu has stopped
/// the others).
struct Vcpu {
    /// The block callback's fast path may run: the thread is active, not in a system call,
    /// and in continuous mode with a primed batch (its clock reading and thread are the
    /// batch's). Set where the batch gets primed, cleared wherever one of those may change.
    fast: bool,
    stream: u16,
    tid: u32,
    active: bool,
    prev: *const TbInfo,
    /// Instructions since the last record.
    icount: u32,
    /// The system call whose return to user space is recorded at the next block.
    in_syscall: Option<i64>,
    mmap: Option<PendingMmap>,
    /// The signal the pending system call sends (kill, tkill, tgkill), 0 otherwise.
    sending: u16,
    buf: Vec<u8>,
    last_ts: u64,
    /// Records left before the clock is read again (reading it costs more than a block).
    ts_left: u32,
    /// The clock when `buf` got its oldest record.
    buf_since: u64,
    /// Continuous mode: the records as they come, handed to the writer thread a batch at a
    /// time for it to encode (on the other core, while this thread runs the program);
    /// `buf` stays empty. Other modes hand 40-byte records in `buf` to the writer, whose
    /// buffers decide what to keep.
    batch: Option<Batch>,
}

/// Branch records that share one clock reading: their timestamps are those of the first.
const TS_EVERY: u32 = 64;

fn state() -> Option<&'static State> {
    STATE.get()
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// The state of vCPU `idx`, created on first use. Only its own thread calls this.
#[inline(always)]
fn vcpu(idx: c_uint) -> Option<&'static mut Vcpu> {
    let slot = VCPUS.get(idx as usize)?;
    let mut p = slot.load(Relaxed);
    if p.is_null() {
        p = new_vcpu(idx, slot);
    }
    // SAFETY: p comes from Box::into_raw and is never freed; each vCPU's state is used by that
    // vCPU's thread only (callbacks of one vCPU run on its thread, one at a time), except in
    // `finish_all`, which runs when qemu has stopped every vCPU.
    Some(unsafe { &mut *p })
}

/// The state of vCPU `idx` if it has had a callback before. Only its own thread calls this.
#[inline(always)]
fn existing_vcpu(idx: c_uint) -> Option<&'static mut Vcpu> {
    let p = VCPUS.get(idx as usize)?.load(Relaxed);
    // SAFETY: as in `vcpu`.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// A vCPU's first callback: its state, kept in `slot` from then on.
#[cold]
fn new_vcpu(idx: c_uint, slot: &AtomicPtr<Vcpu>) -> *mut Vcpu {
    let continuous = STATE.get().filter(|s| s.cfg.mode == Mode::Continuous);
    let v = Box::new(Vcpu {
        fast: false,
        stream: idx as u16,
        tid: 0,
        active: false,
        prev: std::ptr::null(),
        icount: 0,
        in_syscall: None,
        mmap: None,
        sending: 0,
        buf: Vec::with_capacity(SEGMENT),
        last_ts: 0,
        ts_left: 0,
        buf_since: 0,
        batch: continuous.map(|_| writer::batch()),
    });
    let p = Box::into_raw(v);
    slot.store(p, Release);
    p
}

impl Vcpu {
    /// A fresh reading of the clock (for system calls, thread start and end, MTE records).
    fn ts(&mut self) -> u64 {
        let t = now_ns().max(self.last_ts);
        self.last_ts = t;
        self.ts_left = TS_EVERY;
        if let Some(batch) = &mut self.batch {
            batch.primed = false;
        }
        self.fast = false;
        t
    }

    /// The timestamp of a branch record: the clock is read once every [`TS_EVERY`] records.
    #[inline]
    fn branch_ts(&mut self) -> u64 {
        if self.ts_left == 0 {
            return self.ts();
        }
        self.ts_left -= 1;
        self.last_ts
    }

    /// Nothing waits to be handed over.
    #[inline]
    fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.batch.as_ref().is_none_or(|i| i.is_empty())
    }

    #[inline]
    fn push_branch(&mut self, s: &State, b: Branch) {
        if self.is_empty() {
            self.buf_since = self.last_ts;
        }
        let full = match &mut self.batch {
            Some(batch) => {
                batch.push_branch(&b);
                batch.is_full()
            }
            None => {
                let mut a = [0u8; BRANCH_RECORD_LEN];
                b.encode_into(&mut a);
                self.buf.extend_from_slice(&a);
                self.buf.len() + BRANCH_RECORD_LEN > SEGMENT
            }
        };
        // ts_left is full right after a clock reading: only then is the age worth a look.
        if full || (self.ts_left == TS_EVERY && self.waited(VCPU_FLUSH_NS)) {
            self.flush(s);
        }
    }

    /// Whether the oldest record not handed over is `ns` old, as of the last clock reading.
    #[inline]
    fn waited(&self, ns: u64) -> bool {
        !self.is_empty() && self.last_ts.saturating_sub(self.buf_since) >= ns
    }

    fn push_control(&mut self, s: &State, r: Record) {
        if self.is_empty() {
            self.buf_since = self.last_ts;
        }
        let full = match &mut self.batch {
            Some(batch) => {
                batch.push_control(r);
                batch.is_full()
            }
            None => {
                let _ = r.encode(&mut self.buf);
                self.buf.len() + 64 > SEGMENT
            }
        };
        if full {
            self.flush(s);
        }
    }

    /// [`Vcpu::flush`] from the fast path, which has not looked up the state.
    #[inline(never)]
    fn flush_now(&mut self) {
        if let Some(s) = state() {
            self.flush(s);
        }
    }

    fn flush(&mut self, s: &State) {
        self.fast = false;
        if let Some(pending) = &mut self.batch {
            if !pending.is_empty() {
                let batch = std::mem::replace(pending, writer::batch());
                let _ = s.tx.send(Msg::Batch { stream: self.stream, batch });
            }
            return;
        }
        if self.buf.is_empty() {
            return;
        }
        let data = std::mem::replace(&mut self.buf, writer::segment_buffer(SEGMENT));
        let _ = s.tx.send(Msg::Records { stream: self.stream, data });
    }

    /// A taken branch from the end of block `from` to block `to` off the fast path: the clock
    /// is due, the batch is not primed or is full, the blocks or count do not pack, or the
    /// normal and wrap modes. Primes the batch, which puts the vCPU back on the fast path.
    #[inline(never)]
    fn branch(&mut self, s: &State, from: &'static TbInfo, to: &TbInfo) {
        let ts = self.branch_ts();
        let icount = std::mem::take(&mut self.icount);
        match (&mut self.batch, Packed::new(from, to.start, icount)) {
            (Some(batch), Some(packed)) => {
                if batch.is_empty() {
                    self.buf_since = self.last_ts;
                }
                if !batch.primed {
                    batch.prime(ts, self.tid);
                }
                batch.push_packed(packed);
                if batch.is_full() || (self.ts_left == TS_EVERY && self.waited(VCPU_FLUSH_NS)) {
                    self.flush(s);
                }
            }
            _ => {
                let (kind, from, to, tid) = (from.kind, from.last, to.start, self.tid);
                let b = Branch { ts, kernel: false, kind, flags: 0, aux: 0, from, to, tid, icount };
                self.push_branch(s, b);
            }
        }
        self.fast = self.batch.as_ref().is_some_and(|b| b.primed);
    }

    /// The kernel's return to user space at `to` (after a system call or signal delivery).
    fn kernel_return(&mut self, s: &State, to: u64, flags: u8, aux: i64) {
        let b = Branch::kernel_return(self.ts(), self.tid, to, flags, aux as u16);
        self.push_branch(s, b);
    }

    /// Signal `sig` delivered before the instruction at `at` ran, to its handler at `handler`
    /// (plugins are not told signals: 0 when unknown).
    fn signal(&mut self, s: &State, at: u64, handler: u64, sig: u16) {
        let b = Branch {
            ts: self.ts(),
            kernel: false,
            kind: BranchKind::Intrpt,
            flags: branch_flags::SIGNAL,
            aux: sig,
            from: at,
            to: 0,
            tid: self.tid,
            icount: std::mem::take(&mut self.icount),
        };
        self.push_branch(s, b);
        self.kernel_return(s, handler, branch_flags::SIGNAL, sig as i64);
    }

    /// The thread's first block: trace-on (and, for the process's first thread, its module table).
    fn start(&mut self, s: &State, tb: &TbInfo) {
        self.fast = false;
        self.tid = gettid();
        self.active = true;
        self.icount = 0;
        self.in_syscall = None;
        self.mmap = None;
        let ts = self.ts();
        if !s.started.swap(true, AcqRel) {
            module_table(s, tb.start, ts);
        }
        let name = Mte::ThreadName { ts, pid: s.pid, tid: self.tid, name: s.name.clone() };
        let _ = s.tx.send(Msg::Mte(Record::Mte(name)));
        let on = TraceOn { ts, reason: TraceOnReason::Start, pid: s.pid, tid: self.tid, pc: tb.start };
        self.push_control(s, Record::TraceOn(on));
    }

    /// The thread's last record; its segment goes to the writer.
    fn stop(&mut self, s: &State, reason: StopReason, pc: u64, value: i32) {
        if !self.active {
            return;
        }
        self.active = false;
        self.fast = false;
        let off = TraceOff {
            ts: self.ts(),
            reason,
            pid: s.pid,
            tid: self.tid,
            pc,
            icount: std::mem::take(&mut self.icount),
            value,
        };
        self.push_control(s, Record::TraceOff(off));
        self.prev = std::ptr::null();
        self.flush(s);
    }

    /// Where the thread would go next, as far as known.
    fn next_pc(&self) -> u64 {
        if self.prev.is_null() {
            0
        } else {
            // SAFETY: TbInfo records are leaked, never freed.
            unsafe { (*self.prev).fall }
        }
    }
}

/// Process name, thread name and the program's (and its loader's) segments.
fn module_table(s: &State, first_pc: u64, ts: u64) {
    let send = |m: Mte| {
        let _ = s.tx.send(Msg::Mte(Record::Mte(m)));
    };
    send(Mte::ProcessName { ts, pid: s.pid, ppid: std::os::unix::process::parent_id(), name: s.name.clone() });
    // SAFETY: qemu returns a fresh NUL-terminated copy of the program's path (or NULL).
    let path = unsafe {
        let p = ffi::qemu_plugin_path_to_binary();
        if p.is_null() {
            return;
        }
        PathBuf::from(CStr::from_ptr(p).to_string_lossy().into_owned())
    };
    let Ok(prog) = itrace_arch::elf::Program::read(&path) else { return };
    // SAFETY: no arguments; valid once the program is loaded (it is: a block has run).
    let start_code = unsafe { ffi::qemu_plugin_start_code() };
    // qemu's start_code is the lowest executable segment of the program (its entry_code is the
    // dynamic loader's entry for a dynamically linked program).
    let low = prog.loads.iter().filter(|l| l.prot & 4 != 0).map(|l| l.vaddr).min().unwrap_or(0);
    let bias = if prog.position_independent { start_code.wrapping_sub(low) } else { 0 };
    segments(s, &prog, bias, ts);
    if let Some(interp) = &prog.interpreter {
        let host = match &s.cfg.sysroot {
            Some(root) => root.join(interp.strip_prefix("/").unwrap_or(interp)),
            None => interp.clone(),
        };
        // The first block a dynamically linked program runs is its loader's entry point.
        if let Ok(loader) = itrace_arch::elf::Program::read(&host) {
            segments(s, &loader, first_pc.wrapping_sub(loader.entry), ts);
        }
    }
}

fn segments(s: &State, prog: &itrace_arch::elf::Program, bias: u64, ts: u64) {
    let path = std::fs::canonicalize(&prog.path).unwrap_or_else(|_| prog.path.clone());
    for l in &prog.loads {
        let start = l.vaddr.wrapping_add(bias);
        let seg = Mte::Segment {
            ts,
            pid: s.pid,
            prot: l.prot,
            start,
            end: start.wrapping_add(l.memsz),
            offset: l.offset,
            path: path.display().to_string(),
        };
        let identity = itrace_arch::modules::identity_record(ts, s.pid, start, &path.display().to_string());
        let _ = s.tx.send(Msg::Mte(Record::Mte(seg)));
        if let Some(id) = identity {
            let _ = s.tx.send(Msg::Mte(Record::Mte(id)));
        }
    }
}

/// Classify a newly translated block's last instruction and ask for a callback per execution.
extern "C" fn on_tb_trans(_id: ffi::PluginId, tb: *mut ffi::Tb) {
    let Some(s) = state() else { return };
    // SAFETY: qemu passes a valid block for the duration of this callback; the instruction
    // handles and their bytes stay valid while it runs.
    unsafe {
        let n = ffi::qemu_plugin_tb_n_insns(tb);
        if n == 0 {
            return;
        }
        let last = ffi::qemu_plugin_tb_get_insn(tb, n - 1);
        let pc = ffi::qemu_plugin_insn_vaddr(last);
        let size = ffi::qemu_plugin_insn_size(last);
        let data = ffi::qemu_plugin_insn_data(last) as *const u8;
        let bytes = if data.is_null() { &[][..] } else { std::slice::from_raw_parts(data, size) };
        let insn = s.arch.decode(pc, bytes);
        // Kept for the rest of the process: qemu may run the block until the end, and a batch
        // may name it after qemu dropped it.
        let info: &'static TbInfo = Box::leak(Box::new(TbInfo {
            start: ffi::qemu_plugin_tb_vaddr(tb),
            insns: n as u32,
            last: pc,
            fall: pc.wrapping_add(size as u64),
            flow: insn.flow,
            self_loop: insn.target == Some(pc),
            always: insn.flow.always_branches(),
            kind: insn.flow.branch_kind(),
            target: insn.target,
            can_branch: !matches!(insn.flow, Flow::Next | Flow::RepString),
        }));
        let udata = info as *const TbInfo as *mut c_void;
        ffi::qemu_plugin_register_vcpu_tb_exec_cb(tb, on_tb_exec, ffi::CB_NO_REGS, udata);
    }
}

/// One execution of a block: the hot path, which handles a fall-through and a taken branch
/// that packs into a primed batch with room, and leaves the rest to [`on_tb_exec_slow`].
extern "C" fn on_tb_exec(idx: c_uint, udata: *mut c_void) {
    // SAFETY: udata is the TbInfo on_tb_trans leaked for this block (never freed).
    let tb = unsafe { &*(udata as *const TbInfo) };
    if PHASE.load(Relaxed) == TRACING {
        if let Some(v) = existing_vcpu(idx).filter(|v| v.fast) {
            debug_assert!(v.active && v.in_syscall.is_none() && v.batch.as_ref().is_some_and(|b| b.primed));
            // SAFETY: a fast vCPU is active: its prev is a TbInfo leaked in on_tb_trans.
            let p = unsafe { &*v.prev };
            if tb.start == p.fall && !p.always {
                v.icount = v.icount.saturating_add(tb.insns);
                v.prev = tb;
                return;
            }
            if tb.start != p.last && p.reaches(tb.start) && v.ts_left != 0 {
                if let (Some(batch), Some(b)) = (&mut v.batch, Packed::new(p, tb.start, v.icount)) {
                    batch.push_packed(b);
                    let full = batch.is_full();
                    v.ts_left -= 1;
                    v.icount = tb.insns;
                    v.prev = tb;
                    if full {
                        v.flush_now();
                    }
                    return;
                }
            }
        }
    }
    on_tb_exec_slow(idx, tb);
}

/// A block execution off the fast path.
#[inline(never)]
fn on_tb_exec_slow(idx: c_uint, tb: &'static TbInfo) {
    let phase = PHASE.load(Relaxed);
    if phase != TRACING {
        if phase == STOP_ASKED {
            ask_for_reset();
        }
        return;
    }
    let (Some(s), Some(v)) = (state(), vcpu(idx)) else { return };
    if v.active && v.in_syscall.is_none() {
        // SAFETY: an active vCPU's prev is a leaked TbInfo.
        let p = unsafe { &*v.prev };
        if tb.start != p.last && (tb.start == p.fall || p.reaches(tb.start)) {
            if tb.start != p.fall || p.always {
                v.branch(s, p, tb);
            }
            v.icount = v.icount.saturating_add(tb.insns);
            v.prev = tb;
            return;
        }
    }
    exec_unusual(s, v, tb);
}

/// The rarer cases of a block execution: a thread's first block, the return from a system
/// call, a block starting at the previous block's last instruction, a signal handler.
#[cold]
fn exec_unusual(s: &State, v: &mut Vcpu, tb: &'static TbInfo) {
    if !v.active {
        v.start(s, tb);
    } else {
        // SAFETY: an active vCPU's prev is a leaked TbInfo.
        let p = unsafe { &*v.prev };
        if let Some(nr) = v.in_syscall.take() {
            // A call returns after its instruction, except rt_sigreturn (to the interrupted
            // code) and sigreturn; anywhere else means a signal was delivered on the way out.
            let returns = nr as u64 != s.arch.rt_sigreturn_nr() && s.nr.sigreturn != Some(nr);
            let signal = returns && tb.start != p.fall;
            let to = if signal { p.fall } else { tb.start };
            v.kernel_return(s, to, branch_flags::SYSCALL, nr);
            if signal {
                let sig = std::mem::take(&mut v.sending);
                v.signal(s, p.fall, tb.start, sig);
            }
        } else if tb.start != p.last && !p.reaches(tb.start) {
            // Nothing in the previous block goes here: a signal interrupted the thread
            // before the instruction after it.
            v.signal(s, p.fall, tb.start, 0);
        } else if tb.start == p.last && p.flow == Flow::RepString {
            // Another iteration of a rep string instruction: qemu ends the block after each.
            v.icount = v.icount.saturating_add(tb.insns - 1);
            v.prev = tb;
            return;
        } else if tb.start == p.last && !p.self_loop {
            // qemu 7.2 cut the block before an instruction crossing a page boundary but still
            // listed that instruction to plugins: it did not run in the previous block, it
            // starts this one.
            v.icount = v.icount.saturating_sub(1);
        } else if tb.start != p.fall || p.always {
            v.branch(s, p, tb);
        }
    }
    v.icount = v.icount.saturating_add(tb.insns);
    v.prev = tb;
}

/// A system call: the `U` record now, the `K` record at the block it returns to.
#[allow(clippy::too_many_arguments)]
extern "C" fn on_syscall(
    _id: ffi::PluginId,
    idx: c_uint,
    num: i64,
    a1: u64,
    a2: u64,
    a3: u64,
    _a4: u64,
    a5: u64,
    a6: u64,
    _a7: u64,
    _a8: u64,
) {
    if PHASE.load(Relaxed) != TRACING {
        return;
    }
    let (Some(s), Some(v)) = (state(), vcpu(idx)) else { return };
    if !v.active || v.prev.is_null() {
        return;
    }
    // SAFETY: an active vCPU's prev is a leaked TbInfo: the block holding the system call.
    let p = unsafe { &*v.prev };
    let b = Branch {
        ts: v.ts(),
        kernel: false,
        kind: BranchKind::Intrpt,
        flags: branch_flags::SYSCALL,
        aux: num as u16,
        from: p.last,
        to: 0,
        tid: v.tid,
        icount: std::mem::take(&mut v.icount),
    };
    v.push_branch(s, b);
    if v.waited(SYSCALL_FLUSH_NS) {
        v.flush(s);
    }
    if s.arch.is_exit_syscall(num as u64) {
        v.stop(s, StopReason::Exited, p.fall, a1 as i32);
        return;
    }
    if num == s.nr.execve {
        // qemu-user runs the new program itself (natively, or fails): the trace ends here, and
        // its summary says why (not as if the program had exited).
        v.stop(s, StopReason::Detached, p.fall, 0);
        finish(s, Some((StopReason::Detached, 0)));
        return;
    }
    v.in_syscall = Some(num);
    v.fast = false;
    let k = s.nr.kill;
    v.sending = if num == k[2] {
        a3 as u16
    } else if num == k[0] || num == k[1] {
        a2 as u16
    } else {
        0
    };
    if let Some((nr, unit)) = s.nr.mmap {
        let prot = a3 as u32;
        let fd = a5 as i64 as i32;
        if num == nr && prot & libc::PROT_EXEC as u32 != 0 && fd >= 0 {
            if let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{fd}")) {
                v.mmap = Some(PendingMmap {
                    len: a2,
                    prot,
                    offset: a6.wrapping_mul(unit),
                    path: path.display().to_string(),
                });
            }
        }
    }
}

extern "C" fn on_syscall_ret(_id: ffi::PluginId, idx: c_uint, _num: i64, ret: i64) {
    let Some(s) = state() else { return };
    if PHASE.load(Relaxed) != TRACING {
        return;
    }
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } as u32 != s.pid {
        // A forked child: the parent owns the trace file and the writer.
        PHASE.store(OFF, Relaxed);
        return;
    }
    let Some(v) = vcpu(idx) else { return };
    if let Some(m) = v.mmap.take() {
        if !(-4095..0).contains(&ret) {
            let ts = v.ts();
            let identity = itrace_arch::modules::identity_record(ts, s.pid, ret as u64, &m.path);
            let seg = Mte::Segment {
                ts,
                pid: s.pid,
                prot: m.prot,
                start: ret as u64,
                end: (ret as u64).wrapping_add(m.len),
                offset: m.offset,
                path: m.path,
            };
            let _ = s.tx.send(Msg::Mte(Record::Mte(seg)));
            if let Some(id) = identity {
                let _ = s.tx.send(Msg::Mte(Record::Mte(id)));
            }
        }
    }
}

extern "C" fn on_exit(_id: ffi::PluginId, _udata: *mut c_void) {
    // Before a stop asked for took effect, the program's end is the trace's end.
    if PHASE.load(Relaxed) == OFF {
        return;
    }
    if let Some(s) = state() {
        finish(s, None);
    }
}

/// qemu-user 7.2 ends a program that a signal kills (a guest SIGSEGV, abort) without any
/// plugin callback: it sets the host signal to SIG_DFL and calls `kill(getpid(), sig)`. When
/// itrace preloads the plugin into qemu (LD_PRELOAD, hidden from the guest with `-U`), this
/// definition is the `kill` qemu calls, so the trace ends at the crash, summary included,
/// before the signal is sent. Every other call goes straight to the system call. Loaded by
/// dlopen only, it is not in qemu's symbol scope and never called.
#[no_mangle]
pub extern "C" fn kill(pid: libc::pid_t, sig: c_int) -> c_int {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    if sig > 0 && pid == me && PHASE.load(Relaxed) <= STOP_ASKED {
        if let Some(s) = state() {
            if s.pid == me as u32 {
                crashed(s, sig);
            }
        }
    }
    // SAFETY: the kill system call with the caller's arguments, as libc's kill makes it.
    unsafe { libc::syscall(libc::SYS_kill, pid, sig) as c_int }
}

/// The program dies of signal `sig`: its threads' trace ends here.
fn crashed(s: &State, sig: i32) {
    let tid = gettid();
    for slot in VCPUS.iter() {
        let p = slot.load(Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: qemu has stopped the other vCPUs (stop_all_tasks, before its core dump) and
        // this one is in its signal path, outside any callback.
        let v = unsafe { &mut *p };
        if !v.active || v.tid != tid || v.prev.is_null() {
            continue;
        }
        // SAFETY: an active vCPU's prev is a leaked TbInfo.
        let tb = unsafe { &*v.prev };
        // The fault is somewhere in the block running now, whose instructions were counted
        // when it started: count none of them (a trace never counts what may not have run)
        // and end at its start. After a system call (abort's tgkill), at its return address.
        let pc = if v.in_syscall.is_some() {
            tb.fall
        } else {
            v.icount = v.icount.saturating_sub(tb.insns);
            tb.start
        };
        v.stop(s, StopReason::Signaled, pc, sig);
    }
    finish(s, Some((StopReason::Signaled, sig)));
}

/// On a vCPU thread, in a block callback, once: ask qemu to call `on_reset` when no vCPU runs a
/// callback (qemu_plugin_reset from any other thread would tear the callbacks down under the
/// running vCPUs).
#[cold]
fn ask_for_reset() {
    if PHASE.compare_exchange(STOP_ASKED, STOPPING, AcqRel, Relaxed).is_ok() {
        if let Some(&id) = PLUGIN_ID.get() {
            // SAFETY: the id qemu gave us, from a vCPU thread inside a callback, as the API wants.
            unsafe { ffi::qemu_plugin_reset(id, on_reset) };
        }
    }
}

/// All vCPUs are quiet and the plugin's callbacks are gone: end the trace as a detach. The
/// program runs on under qemu, untraced and at qemu's own speed.
extern "C" fn on_reset(_id: ffi::PluginId) {
    if let Some(s) = state() {
        finish(s, Some((StopReason::Detached, 0)));
    }
}

/// End the trace at the program's next block, as itrace's stop request does (the writer
/// thread, when the trace file cannot take more).
pub(crate) fn stop_tracing() {
    let _ = PHASE.compare_exchange(TRACING, STOP_ASKED, AcqRel, Relaxed);
}

/// A thread that watches for the end itrace asks for: the `ctl` file appearing, or itrace
/// going away (the parent changes), which ends the trace the same way rather than kill the
/// program. It polls (20 times a second): qemu-user gives a plugin no event loop, and a pipe
/// or signal would be visible to the program. A file there already (a stop that came while
/// itrace was starting) ends the trace at the program's first block: the first look is made
/// here, before the program runs, since a short program can end within the first 50 ms.
fn watch_for_stop(ctl: PathBuf) {
    if ctl.exists() {
        stop_tracing();
        return;
    }
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let _ = std::thread::Builder::new().name("itrace-ctl".into()).spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: as above.
        let gone = unsafe { libc::getppid() } != parent;
        if gone || ctl.exists() {
            stop_tracing();
            return;
        }
        if PHASE.load(Relaxed) == OFF {
            return;
        }
    });
}

/// End every thread still traced (`signal`: the process dies of it), write the file's end,
/// and report to itrace.
fn finish(s: &State, signal: Option<(StopReason, i32)>) {
    if s.finished.swap(true, AcqRel) {
        return;
    }
    let (reason, value) = signal.unwrap_or((StopReason::Exited, 0));
    for slot in VCPUS.iter() {
        let p = slot.load(Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: qemu runs the exit callbacks with the other vCPUs stopped (or, at execve, this
        // is the calling vCPU's thread and others have no records in flight worth keeping).
        let v = unsafe { &mut *p };
        let pc = v.next_pc();
        v.stop(s, reason, pc, value);
        v.flush(s);
    }
    PHASE.store(OFF, Relaxed);
    let _ = s.tx.send(Msg::Finish { ts: now_ns(), stop: signal.map(|(r, _)| r) });
    let totals = s.writer.lock().ok().and_then(|mut w| w.take()).and_then(|h| h.join().ok());
    if let Some(t) = totals {
        let stop = t.stop.map(|r| r as u32).unwrap_or(0);
        let mut line = format!(
            "done records={} instructions={} branches={} lost={} bytes={} unwritten={} stop={stop}",
            t.records, t.instructions, t.branches, t.lost, t.bytes, t.unwritten
        );
        if let Some(e) = &t.error {
            line.push_str(&format!(" error={e}"));
        }
        report(&s.cfg.status, &line);
    }
}

/// Append a line to the status file itrace reads (stderr when there is none).
fn report(status: &Option<PathBuf>, line: &str) {
    use std::io::Write;
    let written = status.as_deref().is_some_and(|p: &Path| {
        std::fs::OpenOptions::new().create(true).append(true).open(p).and_then(|mut f| writeln!(f, "{line}")).is_ok()
    });
    if !written {
        eprintln!("itrace plugin: {line}");
    }
}

/// Called by qemu when it loads the plugin.
///
/// # Safety
/// qemu passes a valid `info` and `argc` valid C strings in `argv`.
#[no_mangle]
pub unsafe extern "C" fn qemu_plugin_install(
    id: ffi::PluginId,
    info: *const ffi::QemuInfo,
    argc: c_int,
    argv: *const *const c_char,
) -> c_int {
    let args: Vec<String> = (0..argc.max(0) as usize)
        // SAFETY: qemu passes argc valid NUL-terminated strings.
        .map(|i| unsafe { CStr::from_ptr(*argv.add(i)) }.to_string_lossy().into_owned())
        .collect();
    let cfg = match config::parse(&args) {
        Ok(c) => c,
        Err(e) => {
            let status = args.iter().find_map(|a| a.strip_prefix("status=")).map(PathBuf::from);
            report(&status, &format!("error {e}"));
            return -1;
        }
    };
    // SAFETY: qemu passes a valid info block.
    let info = unsafe { &*info };
    let target = if info.target_name.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string owned by qemu.
        unsafe { CStr::from_ptr(info.target_name) }.to_string_lossy().into_owned()
    };
    let fail = |e: String| {
        report(&cfg.status, &format!("error {e}"));
        -1
    };
    if info.version_cur < ffi::API_VERSION || info.version_min > ffi::API_VERSION {
        return fail(format!(
            "qemu's plugin API is version {} (oldest supported {}); the itrace plugin needs version {}",
            info.version_cur,
            info.version_min,
            ffi::API_VERSION
        ));
    }
    if info.system_emulation {
        return fail("the itrace plugin records programs under qemu-user, not system emulation".into());
    }
    if target != cfg.arch.name() {
        return fail(format!("qemu emulates {target}, but the plugin was told arch={}", cfg.arch));
    }
    if cfg.probe {
        report(&cfg.status, &format!("ok api={} target={target}", info.version_cur));
        return -1; // nothing to run: qemu stops here
    }
    let (tx, handle) = match writer::spawn(&cfg) {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let name = cfg.name.chars().take(15).collect();
    let st = State {
        arch: itrace_arch::for_arch(cfg.arch),
        nr: syscalls(cfg.arch),
        cfg,
        tx,
        writer: Mutex::new(Some(handle)),
        pid: std::process::id(),
        name,
        started: AtomicBool::new(false),
        finished: AtomicBool::new(false),
    };
    let status = st.cfg.status.clone();
    let ctl = st.cfg.ctl.clone();
    if STATE.set(st).is_err() {
        return -1;
    }
    let _ = PLUGIN_ID.set(id);
    if let Some(ctl) = ctl {
        watch_for_stop(ctl);
    }
    // SAFETY: registering callbacks with the id qemu gave us, as the API requires.
    unsafe {
        ffi::qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
        ffi::qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
        ffi::qemu_plugin_register_vcpu_syscall_ret_cb(id, on_syscall_ret);
        ffi::qemu_plugin_register_atexit_cb(id, on_exit, null_mut());
    }
    report(&status, "started");
    0
}
