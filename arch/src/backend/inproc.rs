//! `itrace record --region --backend inproc`: the traced program records
//! itself (libitrace's in-process recorder, see libitrace/src/inproc.rs)
//! into per-CPU slot rings in a shared file; this side creates the file,
//! launches the program, drains the rings into the trace file's buffers,
//! and keeps the module table from /proc.

use super::BackendError;
type Result<T, E = BackendError> = std::result::Result<T, E>;
use super::sink::Sink;
use super::RecordOutcome;
use crate::modules::ModuleTable;
use crate::procfs;
use itrace_format::now_ns;
use itrace_format::shm::{self, CpuCtl, Header, Slot};
use itrace_format::{
    Branch, BranchKind, Buffers, LiveCounts, Mode, Mte, Record, StopReason, TraceOff, TraceOn, TraceOnReason,
};
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The shared file, mapped.
struct Shared {
    base: *mut u8,
    len: usize,
    path: std::path::PathBuf,
    ncpu: usize,
    slots: u64,
}

impl Shared {
    fn create(ncpu: usize, slots: usize, mode: Mode) -> Result<Shared> {
        let (_, _, len) = shm::layout(ncpu, slots);
        let path = std::path::PathBuf::from(format!("/dev/shm/itrace-{}-{}", std::process::id(), now_ns()));
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).map_err(|e| {
                BackendError::io(format!("cannot create the shared trace buffer {}", path.display()), e)
            })?;
        file.set_len(len as u64)
            .map_err(|e| BackendError::io(format!("cannot size {} to {len} bytes", path.display()), e))?;
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file we own, its whole length.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let _ = std::fs::remove_file(&path);
            fail!("cannot map the shared trace buffer: {}", std::io::Error::last_os_error());
        }
        let s = Shared { base: base.cast(), len, path, ncpu, slots: slots as u64 };
        // SAFETY: the mapping starts with room for the header; nobody else has it yet.
        let h = unsafe { &mut *(s.base as *mut Header) };
        h.ncpu = ncpu as u32;
        h.mode = mode.code() as u32;
        h.slots = slots as u64;
        h.magic = shm::MAGIC;
        Ok(s)
    }

    fn header(&self) -> &Header {
        // SAFETY: mapped for the life of self, starting with a header.
        unsafe { &*(self.base as *const Header) }
    }

    fn ctl(&self, cpu: usize) -> &CpuCtl {
        let (ctl, _, _) = shm::layout(self.ncpu, self.slots as usize);
        // SAFETY: inside the mapping: one control block per CPU at `ctl`.
        unsafe { &*(self.base.add(ctl + cpu * 64) as *const CpuCtl) }
    }

    fn slot(&self, cpu: usize, idx: u64) -> &Slot {
        let (_, at, _) = shm::layout(self.ncpu, self.slots as usize);
        let off = at + (cpu * self.slots as usize + (idx % self.slots) as usize) * std::mem::size_of::<Slot>();
        // SAFETY: inside the mapping: `idx % slots` is within this CPU's ring.
        unsafe { &*(self.base.add(off) as *const Slot) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the drain keeps between slots.
struct Drain<'a> {
    sink: Sink<'a>,
    out: RecordOutcome,
    last_ts: Vec<u64>,
    /// Threads whose region is open (tid -> pid, cpu, last pc, start time).
    open: HashMap<u32, (u32, usize, u64, u64)>,
    /// When each thread's last region ended: rings are drained one at a time, so an end may be
    /// seen before the start it follows.
    closed: HashMap<u32, u64>,
    modules: ModuleTable,
    named: HashSet<u32>,
    /// Processes seen, with their start times (for their JIT maps, read at the end).
    pids: HashMap<u32, Option<std::time::SystemTime>>,
    /// The MTE stream must not go back in time either.
    last_mte_ts: u64,
    /// Thread names read while the program ran (normal and wrap modes turn slots into
    /// records only after it is gone).
    thread_names: HashMap<u32, String>,
}

impl Drain<'_> {
    // A full buffer (normal mode) is the shared header's business: the library stops writing.
    fn control(&mut self, cpu: usize, r: Record) {
        let _ = self.sink.control(cpu, &r);
    }

    fn mte(&mut self, m: Mte) {
        let _ = self.sink.mte(m);
    }

    /// Module-table records for a process: names at first sight, mappings that changed. They
    /// are stamped just before `at`, the slot that asked for them, so they apply to it.
    fn refresh(&mut self, pid: u32, at: u64) {
        let ts = at.saturating_sub(1).max(self.last_mte_ts);
        self.last_mte_ts = ts;
        if let std::collections::hash_map::Entry::Vacant(e) = self.pids.entry(pid) {
            e.insert(procfs::process_start(pid as i32));
            let name = procfs::comm(pid as i32, pid as i32);
            let ppid = procfs::ppid(pid as i32).unwrap_or(0) as u32;
            self.mte(Mte::ProcessName { ts, pid, ppid, name });
        }
        let Ok(new) = procfs::exec_mappings(pid as i32) else { return };
        for r in self.modules.update(ts, pid, new) {
            self.mte(r);
        }
    }

    /// Remember the names of the threads of `pid` now.
    fn read_thread_names(&mut self, pid: u32) {
        for tid in procfs::tasks(pid as i32).unwrap_or_default() {
            let name = procfs::comm(pid as i32, tid);
            if !name.is_empty() {
                self.thread_names.insert(tid as u32, name);
            }
        }
    }

    fn slot(&mut self, cpu: usize, s: &Slot) {
        let ts = s.ts.max(self.last_ts[cpu]);
        self.last_ts[cpu] = ts;
        match s.kind {
            shm::SLOT_BRANCH_USER | shm::SLOT_BRANCH_KERNEL => {
                let Some(kind) = BranchKind::from_code((s.code & 0xff) as u8) else { return };
                let b = Branch {
                    ts,
                    kernel: s.kind == shm::SLOT_BRANCH_KERNEL,
                    kind,
                    flags: (s.code >> 8) as u8,
                    aux: s.aux as u16,
                    from: s.from,
                    to: s.to,
                    tid: s.tid,
                    icount: s.icount,
                };
                if let Some(o) = self.open.get_mut(&s.tid) {
                    o.2 = b.to;
                }
                let _ = self.sink.branch(cpu, b);
            }
            shm::SLOT_TRACE_ON => {
                let pid = s.aux;
                if !self.pids.contains_key(&pid) {
                    self.refresh(pid, ts);
                }
                if self.named.insert(s.tid) {
                    let live = procfs::comm(pid as i32, s.tid as i32);
                    let name =
                        if live.is_empty() { self.thread_names.get(&s.tid).cloned().unwrap_or_default() } else { live };
                    let mts = ts.saturating_sub(1).max(self.last_mte_ts);
                    self.mte(Mte::ThreadName { ts: mts, pid, tid: s.tid, name });
                }
                if s.code == 0 {
                    self.out.threads += 1;
                }
                if self.closed.get(&s.tid).is_none_or(|&end| end < ts) {
                    self.open.insert(s.tid, (pid, cpu, s.to, ts));
                }
                let reason = if s.code == 0 { TraceOnReason::Start } else { TraceOnReason::Resume };
                self.control(cpu, Record::TraceOn(TraceOn { ts, reason, pid, tid: s.tid, pc: s.to }));
            }
            shm::SLOT_TRACE_OFF => {
                if self.open.get(&s.tid).is_some_and(|o| o.3 <= ts) {
                    self.open.remove(&s.tid);
                }
                self.closed.insert(s.tid, ts);
                let reason = StopReason::from_code(s.code as u32).unwrap_or(StopReason::RegionEnd);
                self.out.instructions += s.icount as u64;
                let off =
                    TraceOff { ts, reason, pid: s.aux, tid: s.tid, pc: s.from, icount: s.icount, value: s.to as i32 };
                self.control(cpu, Record::TraceOff(off));
            }
            shm::SLOT_MAPS_CHANGED => self.refresh(s.aux, ts),
            _ => {}
        }
    }
}

/// Drain the committed slots of every CPU (continuous mode, while the program runs).
fn drain_committed(sh: &Shared, d: &mut Drain) -> bool {
    let mut any = false;
    for cpu in 0..sh.ncpu {
        let ctl = sh.ctl(cpu);
        let mut tail = ctl.tail.load(Ordering::Acquire);
        loop {
            let s = sh.slot(cpu, tail);
            if s.seq.load(Ordering::Acquire) != tail + 1 {
                break;
            }
            d.slot(cpu, s);
            tail += 1;
            any = true;
        }
        ctl.tail.store(tail, Ordering::Release);
    }
    any
}

/// `itrace record --region` of a launched program by the in-process recorder.
pub struct InprocRecorder(pub super::Native);

impl super::Recorder for InprocRecorder {
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<super::Recorded> {
        let super::Native { settings: s, program, arch } = &self.0;
        let (super::Target::Launch { command, aslr }, Some(program)) = (&s.target, program) else {
            unreachable!("choose() gives the in-process recorder launched programs only")
        };
        let step = itrace_format::StepMethod::InProcess;
        let buffers = super::output::open(s, *arch, step, super::output::ncpu(), !aslr, live)?;
        let launch = Launch { program, argv: command, aslr: *aslr, env: &s.env };
        let ring = s.ring_size();
        super::output::record_into(s, buffers, *arch, step.to_string(), |b| record(&launch, s.mode, ring, stop, b))
    }
}

/// The program to launch.
pub struct Launch<'a> {
    pub program: &'a Path,
    /// argv, argv[0] included.
    pub argv: &'a [OsString],
    pub aslr: bool,
    /// Added to our environment.
    pub env: &'a [(OsString, OsString)],
}

/// Launch a program with the in-process recorder switched on and record its regions.
pub fn record(
    launch: &Launch,
    mode: Mode,
    ring_bytes: usize,
    stop: &AtomicBool,
    buffers: &mut Buffers,
) -> Result<RecordOutcome> {
    let Launch { program, argv, aslr, env } = *launch;
    // SAFETY: sysconf has no preconditions.
    let ncpu = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
    let slots = (ring_bytes / std::mem::size_of::<Slot>()).max(64);
    let sh = Shared::create(ncpu, slots, mode)?;
    let mut cmd = std::process::Command::new(program);
    cmd.arg0(&argv[0]).args(&argv[1..]);
    // Our environment in its order (Command would sort it), with `env` and the recorder's
    // shared memory (which libitrace finds there) set over it.
    let mut set = env.to_vec();
    set.push((shm::ENV_SHM.into(), sh.path.clone().into()));
    let envp = crate::inherit::Environment::inherited_with(&set)
        .map_err(|e| BackendError::io(format!("cannot run {}", program.display()), std::io::Error::other(e)))?;
    // SAFETY: only async-signal-safe calls between fork and exec (sigaction, sigprocmask,
    // personality, a store to the child's `environ`); envp lives in the closure until the exec.
    unsafe {
        cmd.pre_exec(move || {
            procfs::prepare_child_for_exec(aslr);
            envp.install_in_child();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| BackendError::io(format!("cannot run {}", program.display()), e))?;
    let mut d = Drain {
        sink: Sink::new(buffers),
        out: RecordOutcome::default(),
        last_ts: vec![0; ncpu],
        open: HashMap::new(),
        closed: HashMap::new(),
        modules: ModuleTable::default(),
        named: HashSet::new(),
        pids: HashMap::new(),
        last_mte_ts: 0,
        thread_names: HashMap::new(),
    };
    d.out.processes = 1;
    let mut detached = false;
    let mut polls = 0u64;
    let status = loop {
        let pid = sh.header().pid.load(Ordering::Acquire);
        if pid != 0 && sh.header().maps_ack.load(Ordering::Acquire) != pid {
            // A process starts its first region: read its mappings while it waits.
            d.refresh(pid, now_ns());
            d.read_thread_names(pid);
            sh.header().maps_ack.store(pid, Ordering::Release);
        }
        polls += 1;
        if pid != 0 && polls % 100 == 0 {
            d.read_thread_names(pid);
        }
        // Drain a round, then sleep: on a machine with few cores, a consumer that spins while
        // data flows takes CPU time from the traced threads. The rings hold far more than a
        // millisecond of records.
        if mode == Mode::Continuous {
            drain_committed(&sh, &mut d);
            // A failed write is kept in the sink and stops the loop below.
            let _ = d.sink.tick();
        }
        if let Some(st) = child.try_wait().map_err(|e| BackendError::io("waiting for the program", e))? {
            break Some(st);
        }
        if stop.load(Ordering::Relaxed) || d.sink.failed() {
            // Every traced thread turns its trap flag off at its next step; give them a moment.
            sh.header().stop.store(1, Ordering::Release);
            std::thread::sleep(std::time::Duration::from_millis(50));
            detached = true;
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    // What is left: the whole ring (normal), its last `slots` (wrap), the rest (continuous).
    // Threads move between CPUs, so the rings are merged by time: a region's start and end
    // may sit in different rings.
    let mut left: Vec<(u64, usize, u64)> = Vec::new();
    for cpu in 0..ncpu {
        let ctl = sh.ctl(cpu);
        let head = ctl.head.load(Ordering::Acquire);
        let (from, lost) = match mode {
            Mode::Continuous => (ctl.tail.load(Ordering::Acquire), 0),
            Mode::Normal => (0, 0),
            Mode::Wrap => (head.saturating_sub(sh.slots), head.saturating_sub(sh.slots)),
        };
        let to = if mode == Mode::Normal { head.min(sh.slots) } else { head };
        for idx in from..to {
            let s = sh.slot(cpu, idx);
            if s.seq.load(Ordering::Acquire) == idx + 1 {
                left.push((s.ts, cpu, idx));
            }
        }
        // (The buffers write the Lost record for these, ahead of the surviving records.)
        d.sink.add_lost(cpu, lost + ctl.lost.load(Ordering::Relaxed));
    }
    left.sort_unstable();
    for (_, cpu, idx) in left {
        d.slot(cpu, sh.slot(cpu, idx));
    }
    // Regions still open: the program died in them (or tracing stopped, or a buffer filled).
    let full = sh.header().full.load(Ordering::Relaxed) != 0;
    let (reason, value) = super::stop_reason(status, detached, full);
    let open: Vec<_> = d.open.drain().collect();
    for (tid, (pid, cpu, pc, _)) in open {
        let off = TraceOff { ts: now_ns(), reason, pid, tid, pc, icount: 0, value };
        d.control(cpu, Record::TraceOff(off));
    }
    let pids: Vec<(u32, Option<std::time::SystemTime>)> = d.pids.iter().map(|(&p, &s)| (p, s)).collect();
    for (pid, started) in pids {
        for (start, size, name) in procfs::perf_map(pid as i32, started) {
            d.mte(Mte::JitSymbol { ts: now_ns(), pid, start, size, name });
        }
    }
    d.out.stop_reason = Some(if full { StopReason::BufferFull } else { reason });
    d.out.exit_status = status.map(super::exit_status);
    d.out.branches += d.sink.branches;
    d.out.instructions += d.sink.instructions;
    d.out.write_error = d.sink.write_error();
    if d.pids.is_empty() && !detached {
        eprintln!("itrace: warning: {} ran no traced region (ITraceOn was never called)", program.display());
    }
    Ok(d.out)
}

/// Whether `program` can use the in-process recorder: it links libitrace (or defines ITraceOn
/// itself, statically), or libitrace is preloaded.
pub fn uses_libitrace(program: &Path) -> bool {
    if std::env::var("LD_PRELOAD").is_ok_and(|v| v.contains("libitrace")) {
        return true;
    }
    let Ok(bytes) = std::fs::read(program) else { return false };
    let Ok(elf) = goblin::elf::Elf::parse(&bytes) else { return false };
    elf.libraries.iter().any(|l| l.starts_with("libitrace.") || l.starts_with("libhookit."))
        || elf.syms.iter().chain(elf.dynsyms.iter()).any(|s| {
            s.st_shndx != 0
                && elf.strtab.get_at(s.st_name).or_else(|| elf.dynstrtab.get_at(s.st_name)) == Some("ITraceOn")
        })
}
