//! The stepping loop. One tracer thread waits for every traced thread and
//! turns each stop into records.
//!
//! At each stop the thread's next instruction is decoded (from a cache for
//! read-only code) and kept as `pending`; at the following stop, the new pc
//! tells whether `pending` was a taken branch. Kernel transitions are
//! recognised from the instruction itself (a system call) or from the stop
//! (signal delivery), so no syscall-stops are needed.

use super::breakpoints::{Breakpoints, Trigger};
use crate::backend::sink::{Sink, Stored};
use crate::backend::RecordOutcome;
use crate::isa::x86_64::{RESTART_CODES, X86};
use crate::procfs::{self, Mapping};
use crate::Arch;
use itrace_decoders::{Flow, Insn};
use itrace_format::{
    branch_flags, Branch, BranchKind, Buffers, FormatError, Mte, Record, StopReason, TraceOff, TraceOn, TraceOnReason,
};
use nix::errno::Errno;
use nix::sys::ptrace::{self, Options};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// si_code of a step report from the kernel rather than the debug trap.
const TRAP_BRKPT: i32 = 1;

/// What to trace.
#[derive(Clone, Debug)]
pub enum Target {
    /// Start `program` with `args` (argv[0] included), our environment plus `env`, and trace
    /// it from its first instruction.
    Launch { program: PathBuf, args: Vec<OsString>, aslr: bool, env: Vec<(OsString, OsString)> },
    /// Attach to every thread of a running process.
    Attach { pid: i32 },
}

/// Finds the region triggers of process `pid` among its executable mappings.
pub type TriggerResolver<'a> = dyn Fn(i32, &[Mapping]) -> Result<Vec<Trigger>, String> + 'a;

/// How to record.
pub struct RecordOptions<'a> {
    pub target: Target,
    /// Trace child processes (fork, vfork, clone without CLONE_THREAD).
    pub follow_forks: bool,
    /// Trace threads created after the start.
    pub follow_threads: bool,
    /// Set (by a signal handler or timer) to stop tracing, detach and finish.
    pub stop: &'a AtomicBool,
    /// Step by taken branch (PTRACE_SINGLEBLOCK) instead of by instruction: only where
    /// [`super::probe_singleblock`] found that it works.
    pub block_step: bool,
    /// Test hook: single-step, but hand only the stops that follow a taken branch or a system
    /// call to the block-step logic, as a working branch trap would. With `block_step` set, this
    /// exercises block decoding on machines whose hypervisor ignores BTF.
    pub emulate_block_step: bool,
    /// Region tracing: threads run untraced until a trigger starts them. Called with a process's
    /// executable mappings (once its program and libraries are loaded, or at attach), it returns
    /// the trigger addresses. `None` traces everything.
    /// An error (say, the library is not in the program) stops tracing and is reported.
    pub triggers: Option<&'a TriggerResolver<'a>>,
}

/// Errors that stop a recording before it starts.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot execute {program}: {source}")]
    Exec { program: String, source: std::io::Error },
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),
    #[error(
        "not permitted to trace pid {pid} ({errno}): it may be traced already (gdb, strace), belong to another user, \
         or be protected by Yama (see /proc/sys/kernel/yama/ptrace_scope; run as root or set it to 0)"
    )]
    NotPermitted { pid: i32, errno: Errno },
    #[error("ptrace {what} failed: {errno}")]
    Ptrace { what: &'static str, errno: Errno },
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// Maps keyed by addresses and thread ids: Fx hashing, as SipHash costs more than the lookups.
pub(super) type IntMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// The instruction a stopped thread will execute next.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    pub(super) pc: u64,
    pub(super) insn: Insn,
    /// For a system call: its number at entry (rax), for calls that never return.
    pub(super) entry_nr: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ThreadState {
    /// Seized (or auto-attached) but not yet stopped for the first time.
    New,
    /// Launched program waiting for its exec.
    Launching,
    Stepping,
    /// Region tracing: traced by ptrace but running at full speed until a trigger.
    Running,
    /// Tracing ended for it (trace-off written); waiting for it to go.
    Finished,
}

pub(super) struct Thread {
    pub(super) tid: i32,
    pub(super) pid: i32,
    pub(super) cpu: usize,
    pub(super) state: ThreadState,
    pub(super) pending: Option<Pending>,
    /// Instructions since this thread's last record.
    pub(super) icount: u32,
    pub(super) arch: X86,
    /// Signal passed on the last resume; the next stop may be a handler entry.
    injected: Option<i32>,
    /// The pending system call returned a restart code: it will run again.
    syscall_interrupted: bool,
    /// Time the pending system call was entered.
    syscall_ts: u64,
    /// Skip counting at the next stop if it is at this pc (the report at the end of exec).
    skip_report_at: Option<u64>,
    original_affinity: Option<libc::cpu_set_t>,
    name: String,
    /// Stopped and not yet resumed: detach it directly.
    stopped: bool,
    /// Block-step emulation: pc of the instruction the last single step ran.
    emu_prev: u64,
    /// Seized by `-p` (not created while traced).
    attached: bool,
    /// Region tracing: nesting depth of ITraceOn calls.
    pub(super) region_depth: u32,
    /// Breakpoints were lifted for this thread's step: put them back at its next stop.
    pub(super) lifted_bps: bool,
    /// Running thread stepping once over a lifted breakpoint, then running on.
    pub(super) step_once: bool,
    /// That step was started: the SIGTRAP it ends with is ours.
    pub(super) in_step_once: bool,
    /// A vfork child we do not follow, sharing its parent's memory (and breakpoints): let it go
    /// once it has its own memory (exec).
    pub(super) release_at_exec: bool,
    /// Block mode: this resume single-steps (the block is ambiguous for the branch trap).
    single_step_now: bool,
    /// Block mode: the system call that ends the running block and the instructions before it,
    /// known before it runs (an exec replaces the code a later walk would need).
    planned_syscall: Option<(u64, Insn, u32)>,
}

pub(super) struct Process {
    /// Block mode: what is known of the block starting at an address.
    ambiguous: IntMap<u64, super::block::BlockInfo>,
    pub(super) maps: Vec<Mapping>,
    code: IntMap<u64, Insn>,
    name: String,
    /// Region tracing: our breakpoints in this process.
    pub(super) bps: Breakpoints,
    /// Breakpoints taken out: a thread stopped by one just before must be moved back onto it.
    pub(super) retired: Vec<u64>,
    /// Whether the triggers have been resolved and inserted.
    pub(super) triggers_set: bool,
}

impl Process {
    fn new(maps: Vec<Mapping>, code: IntMap<u64, Insn>, name: String) -> Self {
        Process {
            ambiguous: IntMap::default(),
            maps,
            code,
            name,
            bps: Breakpoints::default(),
            retired: Vec::new(),
            triggers_set: false,
        }
    }
}

pub(super) struct Session<'a> {
    pub(super) opts: &'a RecordOptions<'a>,
    sink: Sink<'a>,
    pub(super) threads: IntMap<i32, Thread>,
    pub(super) procs: IntMap<i32, Process>,
    cpus: Vec<usize>,
    next_cpu: usize,
    pub(super) out: RecordOutcome,
    pub(super) detaching: Option<StopReason>,
    launched: Option<i32>,
    /// Every process traced, for the JIT symbol maps read at the end.
    seen_pids: Vec<i32>,
}

use itrace_format::now_ns;

fn ptrace_options(o: &RecordOptions) -> Options {
    let mut opts = Options::PTRACE_O_TRACEEXEC | Options::PTRACE_O_TRACEEXIT | Options::PTRACE_O_EXITKILL;
    if matches!(o.target, Target::Attach { .. }) {
        // Never kill an attached program if itrace dies.
        opts.remove(Options::PTRACE_O_EXITKILL);
    }
    if o.follow_threads {
        opts |= Options::PTRACE_O_TRACECLONE;
    }
    // With breakpoints in memory, children must be caught even when not followed: their copy
    // of our int3s has to be taken out before they run on their own.
    if o.follow_forks || o.triggers.is_some() {
        opts |= Options::PTRACE_O_TRACEFORK | Options::PTRACE_O_TRACEVFORK;
    }
    opts
}

/// Record `opts.target` into `buffers` until it exits, `opts.stop` is set, or a buffer fills (normal mode).
pub fn record(opts: &RecordOptions, buffers: &mut Buffers) -> Result<RecordOutcome, RecordError> {
    let mut s = Session {
        opts,
        sink: Sink::new(buffers),
        threads: IntMap::default(),
        procs: IntMap::default(),
        cpus: allowed_cpus(0),
        next_cpu: 0,
        out: RecordOutcome::default(),
        detaching: None,
        launched: None,
        seen_pids: Vec::new(),
    };
    match &opts.target {
        Target::Launch { program, args, aslr, env } => s.launch(program, args, *aslr, env)?,
        Target::Attach { pid } => s.attach(*pid)?,
    }
    s.run();
    s.save_jit_maps();
    s.out.stop_reason.get_or_insert(StopReason::Exited);
    // out counts the partial blocks of trace-off records; the sink, the branches stored.
    s.out.branches += s.sink.branches;
    s.out.instructions += s.sink.instructions;
    s.out.write_error = s.sink.write_error();
    Ok(s.out)
}

fn allowed_cpus(pid: i32) -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    let v: Vec<usize> = if r == 0 {
        // SAFETY: CPU_ISSET reads the set only, with an in-range index.
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
    } else {
        Vec::new()
    };
    if v.is_empty() {
        vec![0]
    } else {
        v
    }
}

fn get_affinity(tid: i32) -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is a plain bit array: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (r == 0).then_some(set)
}

fn set_affinity(tid: i32, set: &libc::cpu_set_t) -> bool {
    // SAFETY: set is a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) == 0 }
}

fn pin(tid: i32, cpu: usize) -> bool {
    // SAFETY: cpu_set_t is a plain bit array: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu < CPU_SETSIZE (it came from an affinity mask); set is valid.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set_affinity(tid, &set)
}

/// Read up to `buf.len()` bytes of `pid`'s memory at `addr`; returns how many were read.
fn read_mem(pid: i32, addr: u64, buf: &mut [u8]) -> usize {
    // Stop at the page end first so an unmapped next page cannot fail the whole read.
    let page_left = (0x1000 - (addr & 0xfff)) as usize;
    let first = buf.len().min(page_left);
    let mut done = 0;
    for (off, len) in [(0usize, first), (first, buf.len() - first)] {
        if len == 0 {
            continue;
        }
        let local = libc::iovec { iov_base: buf[off..].as_mut_ptr().cast(), iov_len: len };
        let remote = libc::iovec { iov_base: (addr + off as u64) as *mut libc::c_void, iov_len: len };
        // SAFETY: `local` points into `buf` for `len` bytes; the remote range is only read by the kernel.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            break;
        }
        done += n as usize;
        if (n as usize) < len {
            break;
        }
    }
    done
}

pub(super) fn getregs(tid: i32) -> Result<libc::user_regs_struct, Errno> {
    ptrace::getregs(Pid::from_raw(tid))
}

impl Session<'_> {
    fn launch(
        &mut self,
        program: &std::path::Path,
        args: &[OsString],
        aslr: bool,
        env: &[(OsString, OsString)],
    ) -> Result<(), RecordError> {
        let exec_err = |source| RecordError::Exec { program: program.display().to_string(), source };
        let prog = CString::new(program.as_os_str().as_bytes()).map_err(|e| exec_err(std::io::Error::other(e)))?;
        let argv: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|e| exec_err(std::io::Error::other(e)))?;
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        // Our environment with `env` set over it.
        let mut vars: Vec<(OsString, OsString)> =
            std::env::vars_os().filter(|(k, _)| !env.iter().any(|(e, _)| e == k)).collect();
        vars.extend(env.iter().cloned());
        let envp: Vec<CString> = vars
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv)
            })
            .collect::<Result<_, _>>()
            .map_err(|e| exec_err(std::io::Error::other(e)))?;
        let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        let (go_r, go_w) = nix::unistd::pipe().map_err(|e| exec_err(e.into()))?;
        let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| exec_err(e.into()))?;
        use std::os::fd::AsRawFd;
        let (go_r_fd, go_w_fd, err_r_fd, err_w_fd) =
            (go_r.as_raw_fd(), go_w.as_raw_fd(), err_r.as_raw_fd(), err_w.as_raw_fd());
        // SAFETY: the child only calls async-signal-safe functions (read, close, signal,
        // personality, execve, write, _exit) on memory prepared before the fork.
        let pid = match unsafe { libc::fork() } {
            -1 => return Err(exec_err(std::io::Error::last_os_error())),
            // SAFETY: in the child, as above: only async-signal-safe calls on memory (the
            // pipes' descriptors, prog, argv, envp) prepared before the fork.
            0 => unsafe {
                libc::close(go_w_fd);
                libc::close(err_r_fd);
                let mut b = 0u8;
                // Wait until the parent has seized us, so the exec is seen.
                libc::read(go_r_fd, (&mut b as *mut u8).cast(), 1);
                libc::close(go_r_fd);
                procfs::prepare_child_for_exec(aslr);
                libc::execve(prog.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr());
                let e = *libc::__errno_location();
                libc::write(err_w_fd, (&e as *const i32).cast(), 4);
                libc::_exit(127);
            },
            pid => pid,
        };
        drop(go_r);
        drop(err_w);
        let seized = ptrace::seize(Pid::from_raw(pid), ptrace_options(self.opts));
        // Let the child go on either way; if seizing failed it must not be left blocked.
        let _ = nix::unistd::write(&go_w, &[1]);
        drop(go_w);
        if let Err(errno) = seized {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(pid), None);
            return Err(RecordError::Ptrace { what: "PTRACE_SEIZE of the launched program", errno });
        }
        let mut e = [0u8; 4];
        let n = nix::unistd::read(err_r.as_raw_fd(), &mut e).unwrap_or(0);
        if n == 4 {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::__WALL));
            return Err(exec_err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(e))));
        }
        self.launched = Some(pid);
        let cpu = self.assign_cpu();
        let mut t = self.new_thread(pid, pid, cpu);
        t.state = ThreadState::Launching;
        self.threads.insert(pid, t);
        self.out.processes = 1;
        Ok(())
    }

    fn attach(&mut self, pid: i32) -> Result<(), RecordError> {
        if pid <= 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(RecordError::NoSuchProcess(pid));
        }
        let pid = procfs::tgid(pid).unwrap_or(pid);
        self.cpus = allowed_cpus(pid);
        let opts = ptrace_options(self.opts);
        // Threads may be created while we seize: repeat until no new one appears.
        loop {
            let tasks = procfs::tasks(pid).map_err(|_| RecordError::NoSuchProcess(pid))?;
            let mut new = 0;
            for tid in tasks {
                if self.threads.contains_key(&tid) {
                    continue;
                }
                match ptrace::seize(Pid::from_raw(tid), opts) {
                    Ok(()) => {}
                    Err(Errno::ESRCH) if tid != pid => continue, // exited meanwhile
                    Err(Errno::ESRCH) => return Err(RecordError::NoSuchProcess(pid)),
                    Err(errno @ Errno::EPERM) => {
                        self.release_all();
                        return Err(RecordError::NotPermitted { pid, errno });
                    }
                    Err(errno) => {
                        self.release_all();
                        return Err(RecordError::Ptrace { what: "PTRACE_SEIZE", errno });
                    }
                }
                let _ = ptrace::interrupt(Pid::from_raw(tid));
                let cpu = self.assign_cpu();
                let mut t = self.new_thread(tid, pid, cpu);
                t.attached = true;
                self.threads.insert(tid, t);
                new += 1;
            }
            if new == 0 {
                break;
            }
        }
        let ts = now_ns();
        self.new_process(pid, ts, procfs::ppid(pid).unwrap_or(0));
        for tid in self.threads.keys().copied().collect::<Vec<_>>() {
            self.name_thread(pid, tid, ts);
        }
        self.out.processes = 1;
        Ok(())
    }

    /// Undo a partial attach.
    fn release_all(&mut self) {
        for tid in self.threads.keys() {
            let _ = ptrace::detach(Pid::from_raw(*tid), None);
        }
        self.threads.clear();
    }

    fn assign_cpu(&mut self) -> usize {
        let c = self.cpus[self.next_cpu % self.cpus.len()];
        self.next_cpu += 1;
        c
    }

    fn new_thread(&self, tid: i32, pid: i32, cpu: usize) -> Thread {
        Thread {
            tid,
            pid,
            cpu,
            state: ThreadState::New,
            pending: None,
            icount: 0,
            arch: X86 { compat: false },
            injected: None,
            syscall_interrupted: false,
            syscall_ts: 0,
            skip_report_at: None,
            original_affinity: None,
            name: String::new(),
            stopped: false,
            emu_prev: 0,
            attached: false,
            region_depth: 0,
            lifted_bps: false,
            step_once: false,
            in_step_once: false,
            release_at_exec: false,
            single_step_now: false,
            planned_syscall: None,
        }
    }

    /// Pin a thread to its CPU, remembering its affinity to restore later.
    pub(super) fn pin_thread(&mut self, tid: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            if t.original_affinity.is_none() {
                t.original_affinity = get_affinity(tid);
            }
            if !pin(tid, t.cpu) {
                // Cannot pin (cpuset rules): report the CPU the tracer sees; mostly right for a ping-pong.
                // SAFETY: sched_getcpu has no preconditions.
                let c = unsafe { libc::sched_getcpu() };
                t.cpu = c.max(0) as usize;
            }
        }
    }

    fn emit_mte(&mut self, m: Mte) {
        let stored = self.sink.mte(m);
        self.after_store(stored);
    }

    /// A full buffer or a failed write stops tracing everything.
    fn after_store(&mut self, stored: Stored) {
        match stored {
            Stored::Yes => {}
            Stored::Full => self.begin_detach(StopReason::BufferFull),
            Stored::Failed => self.begin_detach(StopReason::WriteError),
        }
    }

    /// JIT code symbols the traced processes published in perf map files (read at the end,
    /// when they are complete; the files outlive the processes).
    fn save_jit_maps(&mut self) {
        let ts = now_ns();
        for pid in std::mem::take(&mut self.seen_pids) {
            for (start, size, name) in procfs::perf_map(pid) {
                self.emit_mte(Mte::JitSymbol { ts, pid: pid as u32, start, size, name });
            }
        }
    }

    /// Module-table records for a process seen for the first time (attach, exec, fork).
    fn new_process(&mut self, pid: i32, ts: u64, ppid: i32) {
        if !self.seen_pids.contains(&pid) {
            self.seen_pids.push(pid);
        }
        let name = procfs::comm(pid, pid);
        self.emit_mte(Mte::ProcessName { ts, pid: pid as u32, ppid: ppid as u32, name: name.clone() });
        self.procs.insert(pid, Process::new(Vec::new(), IntMap::default(), name));
        self.refresh_maps(pid, ts);
    }

    fn name_thread(&mut self, pid: i32, tid: i32, ts: u64) {
        let name = procfs::comm(pid, tid);
        let changed = match self.threads.get_mut(&tid) {
            Some(t) if t.name != name && !name.is_empty() => {
                t.name = name.clone();
                true
            }
            _ => false,
        };
        if changed {
            self.emit_mte(Mte::ThreadName { ts, pid: pid as u32, tid: tid as u32, name });
        }
    }

    /// Re-read a process's executable mappings; write what changed; forget decoded code that moved.
    pub(super) fn refresh_maps(&mut self, pid: i32, ts: u64) {
        let Ok(new) = procfs::exec_mappings(pid) else { return };
        let Some(p) = self.procs.get_mut(&pid) else { return };
        let records = crate::modules::changes(ts, pid as u32, &p.maps, &new);
        // Decoded code in a range that changed may be stale.
        for r in &records {
            let (Mte::Unmap { start, end, .. } | Mte::Segment { start, end, .. }) = r else { continue };
            p.code.retain(|a, _| *a < *start || *a >= *end);
            if matches!(r, Mte::Unmap { .. }) {
                p.ambiguous.clear();
            }
        }
        p.maps = new;
        for r in records {
            self.emit_mte(r);
        }
    }

    /// Decode the instruction at `pc` in `pid`, from the cache when the code cannot change unseen.
    pub(super) fn decode(&mut self, pid: i32, arch: X86, pc: u64) -> Insn {
        if let Some(i) = self.procs.get(&pid).and_then(|p| p.code.get(&pc)) {
            return *i;
        }
        let mut buf = [0u8; 16];
        let n = read_mem(pid, pc, &mut buf[..arch.max_insn_len()]);
        if let Some(p) = self.procs.get(&pid) {
            p.bps.unpatch(pc, &mut buf[..n]);
        }
        let insn = arch.decode(pc, &buf[..n]);
        if let Some(p) = self.procs.get_mut(&pid) {
            let i = p.maps.partition_point(|m| m.end <= pc);
            let cacheable = p.maps.get(i).is_some_and(|m| m.start <= pc && !m.writable());
            if cacheable {
                p.code.insert(pc, insn);
            }
        }
        insn
    }

    fn push_branch(&mut self, cpu: usize, b: Branch) {
        let stored = self.sink.branch(cpu, b);
        if stored == Stored::Full {
            // Not stored: its instructions go to the trace-off record's partial block.
            if let Some(t) = self.threads.get_mut(&(b.tid as i32)) {
                t.icount += b.icount;
            }
        }
        self.after_store(stored);
    }

    pub(super) fn push_control(&mut self, cpu: usize, r: Record) {
        let stored = self.sink.control(cpu, &r);
        self.after_store(stored);
    }

    /// Stop tracing everything: threads are detached as they stop.
    pub(super) fn begin_detach(&mut self, reason: StopReason) {
        if self.detaching.is_some() {
            return;
        }
        self.detaching = Some(reason);
        self.out.stop_reason = Some(reason);
        for t in self.threads.values() {
            if !t.stopped && t.state != ThreadState::Finished {
                let _ = ptrace::interrupt(Pid::from_raw(t.tid));
            }
        }
    }

    fn run(&mut self) {
        while !self.threads.is_empty() {
            if self.detaching.is_none() && self.opts.stop.load(Ordering::Relaxed) {
                self.begin_detach(StopReason::Detached);
            }
            let status = match waitpid(None, Some(WaitPidFlag::__WALL)) {
                Ok(s) => s,
                Err(Errno::EINTR) => continue,
                Err(_) => break, // ECHILD: nothing left
            };
            match status {
                WaitStatus::Exited(pid, code) => self.gone(pid.as_raw(), StopReason::Exited, code),
                WaitStatus::Signaled(pid, sig, _) => self.gone(pid.as_raw(), StopReason::Signaled, sig as i32),
                WaitStatus::Stopped(pid, sig) => self.on_signal_stop(pid.as_raw(), sig as i32),
                WaitStatus::PtraceEvent(pid, sig, ev) => self.on_event(pid.as_raw(), sig as i32, ev),
                WaitStatus::PtraceSyscall(pid) => self.resume(pid.as_raw(), 0),
                WaitStatus::Continued(_) | WaitStatus::StillAlive => {}
            }
        }
    }

    /// Resume a thread: one more step while tracing, or detach it once tracing is ending.
    pub(super) fn resume(&mut self, tid: i32, sig: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = false;
        let pid = Pid::from_raw(tid);
        let sig_opt = Signal::try_from(sig).ok();
        if self.detaching.is_some() || t.state == ThreadState::Finished {
            self.detach_thread(tid, sig);
            return;
        }
        if t.state == ThreadState::Running {
            let once = std::mem::take(&mut t.step_once);
            t.in_step_once = once;
            t.injected = None;
            let r = if once { ptrace::step(pid, sig_opt) } else { ptrace::cont(pid, sig_opt) };
            if let Err(e) = r {
                if e != Errno::ESRCH {
                    self.finish_thread(tid, StopReason::TracerError, e as i32);
                }
            }
            return;
        }
        t.injected = (sig != 0).then_some(sig);
        if self.opts.triggers.is_some() {
            // Our breakpoint where the thread steps next: take it out for this one step.
            self.lift_breakpoint_at_pending(tid);
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if self.opts.block_step {
            let info = match t.pending {
                Some(p) => self.block_info(tid, p.pc),
                None => super::block::BlockInfo { ambiguous: true, syscall: None },
            };
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.single_step_now = info.ambiguous;
            t.planned_syscall = info.syscall;
        }
        let t = &self.threads[&tid];
        let r = if self.opts.block_step && !self.opts.emulate_block_step && !t.single_step_now {
            // SAFETY: plain ptrace request on our stopped tracee; the data argument is a signal number.
            let r = unsafe { libc::ptrace(super::probe::PTRACE_SINGLEBLOCK, tid, 0, sig as libc::c_long) };
            if r == 0 {
                Ok(())
            } else {
                Err(Errno::last())
            }
        } else {
            ptrace::step(pid, sig_opt)
        };
        if let Err(e) = r {
            if e != Errno::ESRCH {
                self.finish_thread(tid, StopReason::TracerError, e as i32);
            }
        }
    }

    fn detach_thread(&mut self, tid: i32, sig: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if t.state != ThreadState::Finished {
            let reason = self.detaching.unwrap_or(StopReason::Detached);
            self.finish_thread(tid, reason, 0);
        }
        // Never leave an int3 of ours behind in a process we let go.
        self.remove_breakpoints_via(tid);
        let Some(t) = self.threads.get(&tid) else { return };
        if let Some(set) = t.original_affinity {
            set_affinity(tid, &set);
        }
        let _ = ptrace::detach(Pid::from_raw(tid), Signal::try_from(sig).ok());
        self.threads.remove(&tid);
    }

    /// Write the thread's trace-off record (once).
    pub(super) fn finish_thread(&mut self, tid: i32, reason: StopReason, value: i32) {
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if t.state == ThreadState::Finished {
            return;
        }
        let was_tracing = t.state == ThreadState::Stepping;
        t.state = ThreadState::Finished;
        if !was_tracing {
            return;
        }
        let (cpu, pid, icount) = (t.cpu, t.pid, t.icount);
        let pc = t.pending.map(|p| p.pc).unwrap_or(0);
        t.icount = 0;
        self.out.instructions += icount as u64;
        let ts = now_ns();
        let r = TraceOff { ts, reason, pid: pid as u32, tid: tid as u32, pc, icount, value };
        self.push_control(cpu, Record::TraceOff(r));
    }

    /// A thread is gone (wait reported its exit).
    fn gone(&mut self, tid: i32, reason: StopReason, value: i32) {
        if Some(tid) == self.launched {
            self.out.exit_status = Some(if reason == StopReason::Signaled { -value } else { value });
        }
        if let Some(t) = self.threads.get(&tid) {
            if t.state == ThreadState::Stepping {
                // No exit event was seen (killed by exec of another thread, or SIGKILL).
                let r = if reason == StopReason::Exited { StopReason::Vanished } else { reason };
                self.finish_thread(tid, r, value);
            }
        }
        self.threads.remove(&tid);
    }

    fn on_event(&mut self, tid: i32, sig: i32, ev: i32) {
        if !self.threads.contains_key(&tid) {
            self.adopt(tid);
        }
        self.put_back_lifted(tid);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.stopped = true;
        }
        match ev {
            libc::PTRACE_EVENT_STOP => self.on_interrupt_stop(tid, sig),
            libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                let child = ptrace::getevent(Pid::from_raw(tid)).unwrap_or(0) as i32;
                self.on_clone(tid, child, ev);
                self.resume(tid, 0);
            }
            libc::PTRACE_EVENT_EXEC => {
                let former = ptrace::getevent(Pid::from_raw(tid)).unwrap_or(tid as i64) as i32;
                self.on_exec(tid, former);
                self.resume(tid, 0);
            }
            libc::PTRACE_EVENT_EXIT => {
                let status = ptrace::getevent(Pid::from_raw(tid)).unwrap_or(0) as i32;
                self.on_exit_event(tid, status);
                // Let it exit; it is no longer ours to step.
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.stopped = false;
                }
                let _ = ptrace::cont(Pid::from_raw(tid), None);
            }
            _ => self.resume(tid, 0),
        }
    }

    /// A stopped tid we did not know: a new thread or child reported before its parent's event.
    fn adopt(&mut self, tid: i32) {
        let pid = procfs::tgid(tid).unwrap_or(tid);
        let cpu = self.assign_cpu();
        let t = self.new_thread(tid, pid, cpu);
        self.threads.insert(tid, t);
    }

    fn on_clone(&mut self, parent: i32, child: i32, ev: i32) {
        let Some(p) = self.threads.get(&parent) else { return };
        let parent_pid = p.pid;
        let child_pid = procfs::tgid(child).unwrap_or(if ev == libc::PTRACE_EVENT_CLONE { parent_pid } else { child });
        let thread = child_pid == parent_pid;
        let ts = now_ns();
        self.emit_mte(Mte::Clone {
            ts,
            parent_pid: parent_pid as u32,
            parent_tid: parent as u32,
            child_pid: child_pid as u32,
            child_tid: child as u32,
            thread,
        });
        if !self.threads.contains_key(&child) {
            let cpu = self.assign_cpu();
            let t = self.new_thread(child, child_pid, cpu);
            self.threads.insert(child, t);
        }
        if let Some(t) = self.threads.get_mut(&child) {
            t.pid = child_pid;
        }
        if !thread && self.opts.follow_forks {
            self.out.processes += 1;
            // The child starts with a copy of the parent's address space.
            let (maps, code, name) = match self.procs.get(&parent_pid) {
                Some(pp) => (pp.maps.clone(), pp.code.clone(), pp.name.clone()),
                None => (Vec::new(), IntMap::default(), String::new()),
            };
            self.emit_mte(Mte::ProcessName { ts, pid: child_pid as u32, ppid: parent_pid as u32, name: name.clone() });
            for m in &maps {
                self.emit_mte(Mte::Segment {
                    ts,
                    pid: child_pid as u32,
                    prot: m.prot,
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    path: m.path.clone(),
                });
            }
            self.seen_pids.push(child_pid);
            let mut p = Process::new(maps, code, name);
            if let Some(pp) = self.procs.get(&parent_pid) {
                // The child's memory is a copy, our int3s included.
                p.bps = pp.bps.clone();
                p.triggers_set = pp.triggers_set;
            }
            self.procs.insert(child_pid, p);
        }
    }

    fn on_exec(&mut self, tid: i32, former: i32) {
        let ts = now_ns();
        if former != tid {
            // A non-leader thread called exec and took over the leader's tid.
            if let Some(mut t) = self.threads.remove(&former) {
                self.finish_thread(tid, StopReason::Vanished, 0);
                self.threads.remove(&tid);
                t.tid = tid;
                self.threads.insert(tid, t);
            }
        }
        if self.opts.block_step {
            // The old image is gone: account for the block up to execve from the plan made before it ran.
            if let Some(t) = self.threads.get_mut(&tid) {
                if let (Some((pc, insn, before)), Some(p)) = (t.planned_syscall.take(), t.pending) {
                    if p.pc != pc || !t.single_step_now {
                        t.icount += before;
                    }
                    t.pending = Some(Pending { pc, insn, entry_nr: p.entry_nr });
                }
                // The next stop is the end of execve: classify it as one step of the system call.
                t.single_step_now = true;
            }
        }
        let Some(t) = self.threads.get(&tid) else { return };
        let pid = t.pid;
        let launching = t.state == ThreadState::Launching;
        let path = procfs::exe(pid);
        self.emit_mte(Mte::Exec { ts, pid: pid as u32, tid: tid as u32, path });
        self.procs.remove(&pid);
        let ppid = procfs::ppid(pid).unwrap_or(0);
        self.new_process(pid, ts, ppid);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.name.clear();
        }
        self.name_thread(pid, tid, ts);
        if self.opts.triggers.is_some() {
            self.region_exec(tid, pid, launching);
            return;
        }
        if launching {
            // The launched program's first instruction: start stepping here.
            self.pin_thread(tid);
            self.pin_tracer(tid);
            let Ok(regs) = getregs(tid) else { return };
            let arch = X86::from_cs(regs.cs);
            let insn = self.decode(pid, arch, regs.rip);
            let t = self.threads.get_mut(&tid).expect("thread exists");
            t.arch = arch;
            t.state = ThreadState::Stepping;
            t.pending = Some(Pending { pc: regs.rip, insn, entry_nr: regs.rax });
            t.emu_prev = regs.rip;
            // Resuming with a step makes the kernel report the end of execve before the first instruction.
            t.skip_report_at = Some(regs.rip);
            let (cpu, pc) = (t.cpu, regs.rip);
            self.out.threads += 1;
            let on = TraceOn { ts, reason: TraceOnReason::Start, pid: pid as u32, tid: tid as u32, pc };
            self.push_control(cpu, Record::TraceOn(on));
        }
    }

    /// Keep the tracer on the CPU of the (first) traced thread: a step is a ping-pong between
    /// the two, cheaper without a cross-CPU wake-up.
    pub(super) fn pin_tracer(&mut self, tid: i32) {
        if let Some(t) = self.threads.get(&tid) {
            pin(0, t.cpu);
        }
    }

    fn on_exit_event(&mut self, tid: i32, status: i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        if t.state != ThreadState::Stepping {
            return;
        }
        let (pid, cpu) = (t.pid, t.cpu);
        self.name_thread(pid, tid, now_ns());
        let signaled = libc::WIFSIGNALED(status);
        // Inside the exit system call orig_rax holds its number (in block mode nothing else does).
        let nr = getregs(tid).map(|r| r.orig_rax).unwrap_or(u64::MAX);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        if let Some(p) = t.pending {
            if self.opts.block_step && !signaled && t.arch.is_exit_syscall(nr) {
                let (pid, arch) = (t.pid, t.arch);
                // The block ran up to the system call instruction, which the walk finds.
                let rip = getregs(tid).map(|r| r.rip).unwrap_or(0);
                let w = super::block::walk_block(|pc| self.decode(pid, arch, pc), p.pc, rip, true, 1 << 24);
                let t = self.threads.get_mut(&tid).expect("thread exists");
                if let super::block::WalkEnd::Branch { pc, insn } = w.end {
                    t.icount += w.before;
                    t.pending = Some(Pending { pc, insn, entry_nr: nr });
                }
            }
        }
        let t = self.threads.get_mut(&tid).expect("thread exists");
        if let Some(p) = t.pending {
            if p.insn.flow == Flow::Syscall && !signaled && t.arch.is_exit_syscall(nr) {
                // The exit system call ran and never returns.
                let b = Branch {
                    ts: t.syscall_ts,
                    kernel: false,
                    kind: BranchKind::Intrpt,
                    flags: branch_flags::SYSCALL,
                    aux: nr as u16,
                    from: p.pc,
                    to: 0,
                    tid: tid as u32,
                    icount: t.icount + 1,
                };
                t.icount = 0;
                t.pending = Some(Pending { pc: p.pc + p.insn.len as u64, ..p });
                self.push_branch(cpu, b);
            }
        }
        if signaled {
            self.finish_thread(tid, StopReason::Signaled, libc::WTERMSIG(status));
        } else {
            self.finish_thread(tid, StopReason::Exited, libc::WEXITSTATUS(status));
        }
    }

    /// PTRACE_EVENT_STOP: our interrupt, a new thread's first stop, or a group-stop.
    fn on_interrupt_stop(&mut self, tid: i32, sig: i32) {
        let group_stop = matches!(sig, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU);
        let state = self.threads.get(&tid).map(|t| t.state);
        if self.detaching.is_some() {
            let traced = matches!(state, Some(ThreadState::Stepping | ThreadState::Running));
            if traced && procfs::thread_pending_signals(tid) & (1 << (libc::SIGTRAP - 1)) != 0 {
                // A step trap (or one of our breakpoints, hit by a running thread) is queued behind
                // this stop: detaching now would deliver it untraced and kill the program. Let it
                // surface as a signal stop, handle it there (moving the pc back onto a
                // breakpoint's instruction), then detach.
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.stopped = false;
                }
                let _ = ptrace::cont(Pid::from_raw(tid), None);
                return;
            }
            self.detach_thread(tid, 0);
            return;
        }
        if group_stop {
            // Stay stopped like an untraced process until SIGCONT.
            if let Some(t) = self.threads.get_mut(&tid) {
                t.stopped = false;
            }
            // SAFETY: plain ptrace request on a tracee in group-stop; no pointers are passed.
            unsafe { libc::ptrace(libc::PTRACE_LISTEN, tid, 0, 0) };
            return;
        }
        match state {
            Some(ThreadState::New) => self.start_thread(tid),
            Some(ThreadState::Launching) => {
                let _ = ptrace::cont(Pid::from_raw(tid), None);
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.stopped = false;
                }
            }
            _ => self.resume(tid, 0),
        }
    }

    /// First stop of an attached thread or a new thread/process: start stepping it.
    fn start_thread(&mut self, tid: i32) {
        let Some(t) = self.threads.get(&tid) else { return };
        let (pid, attach) = (t.pid, t.attached);
        if !self.procs.contains_key(&pid) {
            // A new process whose fork event has not been seen, or one we must not follow.
            if !self.opts.follow_forks {
                self.release_unfollowed(tid, pid);
                return;
            }
            self.new_process(pid, now_ns(), procfs::ppid(pid).unwrap_or(0));
        }
        if !self.opts.follow_forks && Some(pid) != self.root_pid() {
            self.release_unfollowed(tid, pid);
            return;
        }
        self.pin_thread(tid);
        if self.opts.triggers.is_some() {
            // Region tracing: run at full speed until a trigger.
            self.start_running(tid, pid);
            return;
        }
        let Ok(regs) = getregs(tid) else {
            self.threads.remove(&tid);
            return;
        };
        let arch = X86::from_cs(regs.cs);
        // Stopped inside a system call that will be restarted: the kernel moves the pc back
        // onto the system call instruction when it resumes, so that is what runs next.
        let in_syscall = regs.orig_rax as i64 >= 0;
        let mut pc = regs.rip;
        if in_syscall && RESTART_CODES.contains(&(regs.rax as i64)) {
            pc -= 2;
        }
        let insn = self.decode(pid, arch, pc);
        let ts = now_ns();
        self.name_thread(pid, tid, ts);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch = arch;
        t.state = ThreadState::Stepping;
        t.pending = Some(Pending { pc, insn, entry_nr: regs.orig_rax });
        t.emu_prev = pc;
        t.syscall_ts = ts;
        let cpu = t.cpu;
        if self.out.threads == 0 {
            self.pin_tracer(tid);
        }
        self.out.threads += 1;
        let reason = if attach { TraceOnReason::Attach } else { TraceOnReason::Start };
        self.push_control(cpu, Record::TraceOn(TraceOn { ts, reason, pid: pid as u32, tid: tid as u32, pc }));
        self.resume(tid, 0);
    }

    fn root_pid(&self) -> Option<i32> {
        match self.opts.target {
            Target::Attach { pid } => Some(procfs::tgid(pid).unwrap_or(pid)),
            Target::Launch { .. } => self.launched,
        }
    }

    /// A signal-delivery stop (or a step trap, which is SIGTRAP).
    fn on_signal_stop(&mut self, tid: i32, sig: i32) {
        if !self.threads.contains_key(&tid) {
            self.adopt(tid);
        }
        self.put_back_lifted(tid);
        let Some(t) = self.threads.get_mut(&tid) else { return };
        t.stopped = true;
        if t.state == ThreadState::Running {
            self.on_running_stop(tid, sig);
            return;
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        if t.state != ThreadState::Stepping {
            // Not stepping yet (or finished): pass the signal on.
            let state = t.state;
            if state == ThreadState::New && sig == libc::SIGSTOP {
                // A new child's initial stop when not seized (older kernels): start it.
                self.start_thread(tid);
                return;
            }
            self.resume(tid, sig);
            return;
        }
        if sig != libc::SIGTRAP {
            // The program gets a signal: deliver it on the next step; the stop after shows the handler.
            if self.opts.block_step {
                if let Ok(regs) = getregs(tid) {
                    self.fast_forward(tid, regs.rip, false);
                }
            }
            self.resume(tid, sig);
            return;
        }
        let Ok(regs) = getregs(tid) else {
            self.resume(tid, 0);
            return;
        };
        if self.opts.emulate_block_step && !self.emulated_block_ended(tid, &regs) {
            self.resume(tid, 0);
            return;
        }
        let mut inject = 0;
        self.on_step(tid, &regs, &mut inject);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.emu_prev = regs.rip;
        }
        if self.opts.triggers.is_some() && inject == 0 {
            // A region trigger where the thread goes next (ITraceOff, --stop, ...)?
            self.before_step(tid);
        }
        self.resume(tid, inject);
    }

    /// The core: a thread stopped after a step. Classify what ran, write records, decode what runs next.
    fn on_step(&mut self, tid: i32, regs: &libc::user_regs_struct, inject: &mut i32) {
        let rip = regs.rip;
        if self.opts.block_step {
            let t = &self.threads[&tid];
            let report = t.single_step_now || t.skip_report_at == Some(rip) || t.injected.is_some();
            if !report && !self.fast_forward(tid, rip, true) {
                self.update_pending_after(tid, rip, regs, false);
                return;
            }
        }
        let t = self.threads.get_mut(&tid).expect("stepping thread exists");
        let (cpu, pid) = (t.cpu, t.pid);
        let mut out: [Option<Branch>; 2] = [None, None];
        let mut syscall_done: Option<u64> = None;
        if let Some(p) = t.pending {
            let next = p.pc.wrapping_add(p.insn.len as u64);
            let injected = t.injected.take();
            let handler_entry = injected.is_some() && !(p.insn.flow == Flow::Syscall && rip == next) && {
                // A signal was delivered: the kernel reports the handler's first instruction, before
                // it runs, with ptrace_notify(SIGTRAP) (si_code SIGTRAP); older kernels used
                // TRAP_BRKPT. A real step after an ignored signal says TRAP_TRACE.
                ptrace::getsiginfo(Pid::from_raw(tid))
                    .map(|si| si.si_code == libc::SIGTRAP || si.si_code == TRAP_BRKPT)
                    .unwrap_or(false)
            };
            if t.skip_report_at == Some(rip) {
                t.skip_report_at = None;
            } else if handler_entry {
                let signo = injected.unwrap_or(0) as u16;
                let now = now_ns();
                if t.syscall_interrupted && p.insn.flow == Flow::Syscall {
                    // The system call ran and was interrupted by this signal.
                    t.syscall_interrupted = false;
                    out[0] = Some(branch(t, true, p.pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, regs.orig_rax));
                    t.syscall_ts = now;
                } else {
                    out[0] = Some(branch(t, false, p.pc, 0, BranchKind::Intrpt, branch_flags::SIGNAL, signo as u64));
                }
                t.syscall_ts = now;
                out[1] = Some(branch(t, false, 0, rip, BranchKind::Iret, branch_flags::SIGNAL, signo as u64));
                out[1].as_mut().expect("set").kernel = true;
            } else {
                t.skip_report_at = None;
                match p.insn.flow {
                    Flow::Syscall => {
                        if RESTART_CODES.contains(&(regs.rax as i64)) && rip == next {
                            // Interrupted; the kernel will run it again (or deliver a signal first).
                            t.syscall_interrupted = true;
                            self.update_pending_after(tid, rip, regs, true);
                            return;
                        }
                        t.syscall_interrupted = false;
                        if t.arch.sends_signal(regs.orig_rax) {
                            // A SIGTRAP the program sent itself merges with the kernel's step report
                            // (one pending SIGTRAP): tell them apart by who sent it, and deliver it.
                            let own = ptrace::getsiginfo(Pid::from_raw(tid)).map(|si| si.si_code <= 0).unwrap_or(false);
                            if own {
                                *inject = libc::SIGTRAP;
                            }
                        }
                        // rt_sigreturn sets orig_rax to -1 (no restart). (i386's old sigreturn, 119, also
                        // does; it is told apart only when single-stepping saw eax at the call.)
                        let nr = match regs.orig_rax as i64 {
                            -1 if p.entry_nr == 119 && t.arch.compat && !self.opts.block_step => 119,
                            -1 => t.arch.rt_sigreturn_nr(),
                            _ => regs.orig_rax,
                        };
                        out[0] = Some(branch(t, true, p.pc, 0, BranchKind::Intrpt, branch_flags::SYSCALL, nr));
                        t.syscall_ts = now_ns();
                        let mut k = branch(t, false, 0, rip, BranchKind::Iret, branch_flags::SYSCALL, nr);
                        k.kernel = true;
                        out[1] = Some(k);
                        syscall_done = Some(nr);
                    }
                    Flow::RepString if rip == p.pc => {} // one more iteration of the same instruction
                    Flow::Interrupt => {
                        // int3 and friends: the program's own SIGTRAP (or other signal); deliver it.
                        t.icount += 1;
                        out[0] = Some(branch(
                            t,
                            false,
                            p.pc,
                            0,
                            BranchKind::Intrpt,
                            branch_flags::SIGNAL,
                            libc::SIGTRAP as u64,
                        ));
                        *inject = libc::SIGTRAP;
                    }
                    flow => {
                        t.icount += 1;
                        if flow.always_branches() || rip != next {
                            let kind = if flow == Flow::Next || flow == Flow::RepString {
                                BranchKind::Other
                            } else {
                                flow.branch_kind()
                            };
                            out[0] = Some(branch(t, false, p.pc, rip, kind, 0, 0));
                        }
                    }
                }
            }
        }
        for b in out.into_iter().flatten() {
            self.push_branch(cpu, b);
        }
        if let Some(nr) = syscall_done {
            let arch = self.threads[&tid].arch;
            if arch.changes_mappings(nr) {
                self.refresh_maps(pid, now_ns());
            }
            if arch.may_rename(nr) {
                self.name_thread(pid, tid, now_ns());
            }
        }
        self.update_pending_after(tid, rip, regs, false);
    }

    /// Block mode: what the block starting at `pc` holds (cached per address).
    fn block_info(&mut self, tid: i32, pc: u64) -> super::block::BlockInfo {
        let t = &self.threads[&tid];
        let (pid, arch) = (t.pid, t.arch);
        if let Some(&a) = self.procs.get(&pid).and_then(|p| p.ambiguous.get(&pc)) {
            return a;
        }
        let a = super::block::block_info(|a| self.decode(pid, arch, a), pc, 4096);
        if let Some(p) = self.procs.get_mut(&pid) {
            p.ambiguous.insert(pc, a);
        }
        a
    }

    /// Block-step emulation: would a branch trap have stopped here? (After a taken branch, a
    /// system call or interrupt, and for the kernel's own reports.)
    fn emulated_block_ended(&mut self, tid: i32, regs: &libc::user_regs_struct) -> bool {
        let t = &self.threads[&tid];
        if t.single_step_now || t.injected.is_some() || t.skip_report_at == Some(regs.rip) || t.emu_prev == 0 {
            return true;
        }
        let (pid, arch, prev) = (t.pid, t.arch, t.emu_prev);
        let insn = self.decode(pid, arch, prev);
        let ended = match insn.flow {
            Flow::Syscall | Flow::Interrupt | Flow::Invalid => true,
            Flow::CondJump => regs.rip != prev.wrapping_add(insn.len as u64),
            f => f.always_branches(),
        };
        if !ended {
            self.threads.get_mut(&tid).expect("thread exists").emu_prev = regs.rip;
        }
        ended
    }

    /// Block stepping: account for the instructions from `pending` up to the one that ended the
    /// block (which becomes `pending`, to be classified like a single step), or up to `rip` when
    /// the thread was stopped mid-block. Returns whether a block-ending instruction was found.
    fn fast_forward(&mut self, tid: i32, rip: u64, branch_stop: bool) -> bool {
        let Some(t) = self.threads.get(&tid) else { return false };
        let Some(p) = t.pending else { return false };
        let (pid, arch) = (t.pid, t.arch);
        let w = super::block::walk_block(|pc| self.decode(pid, arch, pc), p.pc, rip, branch_stop, 1 << 24);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.icount += w.before;
        match w.end {
            super::block::WalkEnd::Branch { pc, insn } => {
                t.pending = Some(Pending { pc, insn, entry_nr: p.entry_nr });
                true
            }
            super::block::WalkEnd::Reached | super::block::WalkEnd::Lost => {
                let insn = self.decode(pid, arch, rip);
                let t = self.threads.get_mut(&tid).expect("thread exists");
                t.pending = Some(Pending { pc: rip, insn, entry_nr: p.entry_nr });
                false
            }
        }
    }

    /// Decode the thread's next instruction (unless it is an interrupted system call that runs again).
    fn update_pending_after(&mut self, tid: i32, rip: u64, regs: &libc::user_regs_struct, keep: bool) {
        if keep {
            return;
        }
        let t = &self.threads[&tid];
        let (pid, mut arch) = (t.pid, t.arch);
        if regs.cs != 0 {
            arch = X86::from_cs(regs.cs);
        }
        let insn = self.decode(pid, arch, rip);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch = arch;
        t.pending = Some(Pending { pc: rip, insn, entry_nr: regs.rax });
        if insn.flow == Flow::Syscall {
            t.syscall_ts = now_ns();
        }
    }
}

/// A branch record for thread `t` ending its current block; resets its count.
/// `counts_insn`: the instruction at `from` executed and belongs to the block.
fn branch(t: &mut Thread, counts_insn: bool, from: u64, to: u64, kind: BranchKind, flags: u8, aux: u64) -> Branch {
    if counts_insn {
        t.icount += 1;
    }
    let b = Branch {
        ts: if kind == BranchKind::Intrpt && flags == branch_flags::SYSCALL { t.syscall_ts } else { now_ns() },
        kernel: false,
        kind,
        flags,
        aux: aux as u16,
        from,
        to,
        tid: t.tid as u32,
        icount: t.icount,
    };
    t.icount = 0;
    b
}
