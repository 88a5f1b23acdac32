//! `itrace record --backend kmod`: the kernel shim (kmod-shim/itrace.ko) traces the program in
//! the kernel and writes records, in the trace file's layout, into per-CPU rings and an MTE ring
//! that this side maps read-only (/dev/itrace, ABI in kmod-shim/itrace_kmod.h and docs/kmod.md).
//! This side checks each record, turns the module's mapping snapshots into segment and unmap
//! records, and hands everything to the trace file's buffers.
//!
//! Why one file of about 650 lines: the device ABI mirror, the ring reader and the consumer
//! change together with the module, and the tests at the end check the mirror against the C
//! header.

use super::BackendError;
type Result<T, E = BackendError> = std::result::Result<T, E>;
use super::sink::Sink;
use super::RecordOutcome;
use crate::modules::ModuleTable;
use crate::procfs::{self, Mapping};
pub use itrace_format::kmod::*;
use itrace_format::{major, raw_records, Buffers, Endian, LiveCounts, Mode, Mte, Record, TraceOnReason};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether the module is loaded.
pub fn available() -> bool {
    Path::new(DEVICE).exists()
}

/// The consumer's longest wait between two looks at the rings (milliseconds).
const CONSUMER_POLL_MS: i32 = 20;

fn ioctl<T>(fd: i32, req: u64, arg: *mut T) -> std::io::Result<()> {
    // SAFETY: `arg` points to a live value of the size encoded in `req` (or is null for _IO
    // requests, which take no argument); the module validates everything it reads.
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The open device with its rings mapped.
struct Device {
    fd: OwnedFd,
    base: *const u8,
    len: usize,
    ncpu: usize,
}

impl Device {
    fn open(mode: Mode, ring: usize, mte: usize, flags: u32) -> Result<Device> {
        let f = match std::fs::OpenOptions::new().read(true).write(true).open(DEVICE) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => fail!(
                "--backend kmod: the itrace kernel module is not loaded ({DEVICE} does not exist): build and load \
                 kmod-shim/itrace.ko (see docs/kmod.md), or use --backend ptrace"
            ),
            Err(e) => return Err(BackendError::io(format!("cannot open {DEVICE}"), e)),
        };
        let fd: OwnedFd = f.into();
        let mut cfg = Config { mode: mode.code() as u32, flags, buffer_size: ring as u64, mte_size: mte as u64 };
        ioctl(fd.as_raw_fd(), ITR_IOC_INSTALL, &mut cfg).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => {
                BackendError::Failed("the itrace kernel module is busy: another recording is using it".into())
            }
            _ => BackendError::Failed(format!("cannot set up the kernel trace buffers ({ring} bytes per CPU): {e}")),
        })?;
        let mut st = Status::default();
        ioctl(fd.as_raw_fd(), ITR_IOC_STATUS, &mut st)
            .map_err(|e| BackendError::io("cannot query the itrace kernel module", e))?;
        let len = st.map_size as usize;
        // SAFETY: a fresh read-only shared mapping of the device's rings, of the size it reported.
        let base =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if base == libc::MAP_FAILED {
            fail!("cannot map the kernel trace buffers: {}", std::io::Error::last_os_error());
        }
        let dev = Device { fd, base: base as *const u8, len, ncpu: st.ncpu as usize };
        let ctl = dev.ctl();
        if ctl.magic != ITR_MAGIC || ctl.version != ITR_VERSION || ctl.ncpu as usize != dev.ncpu {
            fail!("the itrace kernel module speaks another version of the device ABI (rebuild it)");
        }
        Ok(dev)
    }

    fn ctl(&self) -> Ctl {
        // SAFETY: the mapping starts with the control block; the kernel updates it concurrently,
        // so it is read as a volatile copy.
        unsafe { std::ptr::read_volatile(self.base as *const Ctl) }
    }

    fn stream(&self, i: usize) -> Stream {
        // SAFETY: stream i (0..=ncpu) lies in the control block's array at offset 64.
        let s = unsafe { std::ptr::read_volatile((self.base.add(64) as *const Stream).add(i)) };
        std::sync::atomic::fence(Ordering::Acquire);
        s
    }

    /// The bytes of stream `i` from `from` to `to` (positions), copied out of the ring.
    fn bytes(&self, s: &Stream, from: u64, to: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity((to - from) as usize);
        let mut pos = from;
        while pos < to {
            let off = (pos % s.size) as usize;
            let n = ((to - pos) as usize).min(s.size as usize - off);
            let at = s.offset as usize + off;
            if at + n > self.len {
                break;
            }
            // SAFETY: `at..at + n` is inside the mapping (checked above).
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(self.base.add(at), n) });
            pos += n as u64;
        }
        out
    }

    fn consume(&self, stream: usize, tail: u64) {
        let mut c = Consume { stream: stream as u32, pad: 0, tail };
        let _ = ioctl(self.fd.as_raw_fd(), ITR_IOC_CONSUME, &mut c);
    }

    fn stop(&self) {
        let _ = ioctl(self.fd.as_raw_fd(), ITR_IOC_STOP, std::ptr::null_mut::<u8>());
    }

    /// Wait up to `ms` milliseconds, less when the module says a ring is half full
    /// (continuous mode: threads that fill a ring to three quarters wait for the drain).
    fn wait(&self, ms: i32) {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

/// What the drain keeps between rounds.
struct Drain<'a> {
    sink: Sink<'a>,
    out: RecordOutcome,
    /// Executable mappings per process, as of the last snapshot.
    modules: ModuleTable,
    /// A snapshot being read: pid, its time, the segments so far.
    snapshot: Option<(u32, u64, Vec<Mapping>)>,
    /// Per stream: the next position to read (the module's tail in wrap mode).
    pos: Vec<u64>,
    last_mte_ts: u64,
}

impl Drain<'_> {
    fn fail(&mut self, e: impl ToString) {
        self.sink.fail(e);
    }

    // A full buffer (normal mode) is the module's business: it stops writing.
    fn mte(&mut self, m: Mte) {
        let _ = self.sink.mte(m);
    }

    /// A snapshot is complete: write what changed.
    fn end_snapshot(&mut self) {
        let Some((pid, ts, new)) = self.snapshot.take() else { return };
        for r in self.modules.update(ts, pid, new) {
            self.mte(r);
        }
    }

    fn mte_record(&mut self, r: Record) {
        let Record::Mte(m) = r else { return };
        match m {
            Mte::Segment { ts, pid, prot, start, end, offset, path } => match &mut self.snapshot {
                Some((p, _, v)) if *p == pid => v.push(Mapping { start, end, prot, offset, path }),
                _ => {
                    // A segment outside a snapshot: take it as is.
                    self.end_snapshot();
                    self.mte(Mte::Segment { ts, pid, prot, start, end, offset, path });
                }
            },
            Mte::Unmap { ts, pid, start: 0, end: 0 } => {
                self.end_snapshot();
                let ts = ts.max(self.last_mte_ts);
                self.snapshot = Some((pid, ts, Vec::new()));
            }
            m => {
                self.end_snapshot();
                if let Mte::Exec { pid, .. } = m {
                    // A new address space (the reader starts the process's afresh): the
                    // snapshot that follows is written whole, even where it equals the old one.
                    self.modules.forget(pid);
                }
                self.last_mte_ts = self.last_mte_ts.max(m.ts());
                self.mte(m);
            }
        }
    }

    /// A record of the module's stream `stream` (its CPU), onto that CPU's buffer.
    fn trace_record(&mut self, stream: usize, r: &Record) {
        let cpu = stream % self.sink.streams();
        let _ = match r {
            Record::Branch(b) => self.sink.branch(cpu, *b),
            Record::TraceOn(on) => {
                if on.reason != TraceOnReason::Resume {
                    self.out.threads += 1;
                }
                self.sink.control(cpu, r)
            }
            Record::TraceOff(off) => {
                self.out.instructions += off.icount as u64;
                self.sink.control(cpu, r)
            }
            Record::Lost(_) => self.sink.control(cpu, r),
            _ => super::sink::Stored::Yes,
        };
    }

    /// Read stream `i` from where the last round stopped up to its head; returns the records read.
    fn drain_stream(&mut self, dev: &Device, i: usize, consume: bool) -> u64 {
        let s = dev.stream(i);
        let from = self.pos[i].max(s.tail);
        if s.head <= from {
            return 0;
        }
        let bytes = dev.bytes(&s, from, s.head);
        let mut n = 0;
        let e = Endian::native();
        let mut records = raw_records(e, &bytes);
        for rec in records.by_ref() {
            let rec = match rec {
                Ok(rec) => rec,
                Err(at) => {
                    self.fail(format!(
                        "the kernel module wrote a corrupt record in stream {i} at {}",
                        from + at as u64
                    ));
                    break;
                }
            };
            if rec.major == ITR_MAJOR_PAD {
                continue;
            }
            match Record::decode(e, rec.bytes, 0) {
                Ok(r) if rec.major == major::MTE => self.mte_record(r),
                Ok(r) if i < dev.ncpu => self.trace_record(i, &r),
                Ok(_) => {}
                Err(err) => {
                    self.fail(format!("the kernel module wrote a bad record: {err}"));
                    break;
                }
            }
            n += 1;
        }
        let at = records.offset();
        self.pos[i] = from + at as u64;
        if consume {
            dev.consume(i, self.pos[i]);
        }
        n
    }
}

/// Whether a recording uses the kernel module: always for `Backend::Kmod` (which refuses
/// what the module cannot do), for `Auto` when the module is loaded, the program is a 64-bit
/// one and there is no `--start`/`--stop`.
pub fn chosen(backend: super::Backend, start_stop: bool, arch: itrace_format::Arch) -> Result<bool> {
    use super::Backend;
    let bits64 = arch == itrace_format::Arch::X86_64;
    let refuse = |m: String| Err(BackendError::Settings(m));
    match backend {
        Backend::Kmod if start_stop => refuse(
            "--backend kmod traces whole programs or libitrace's regions (--region): --start and --stop need \
             --backend inproc or ptrace"
                .into(),
        ),
        Backend::Kmod if !bits64 => {
            refuse(format!("--backend kmod traces 64-bit programs only: this is an {arch} one, use --backend ptrace"))
        }
        Backend::Kmod if !available() => refuse(format!(
            "--backend kmod: the itrace kernel module is not loaded ({DEVICE} does not exist): build and load \
             kmod-shim/itrace.ko (see docs/kmod.md), or use --backend ptrace"
        )),
        Backend::Kmod => Ok(true),
        Backend::Auto => Ok(available() && !start_stop && bits64),
        _ => Ok(false),
    }
}

/// `itrace record` through the kernel module.
pub struct KmodRecorder(pub super::Native);

impl super::Recorder for KmodRecorder {
    fn record(&mut self, live: Arc<LiveCounts>, stop: &AtomicBool) -> Result<super::Recorded> {
        use super::{output, Target};
        let super::Native { settings, program, arch } = &self.0;
        let start = match (&settings.target, program) {
            (Target::Launch { command, aslr }, Some(program)) => {
                Start::Launch { program, argv: command, aslr: *aslr, env: &settings.env }
            }
            (Target::Attach { pid }, _) => Start::Attach { pid: *pid },
            _ => unreachable!("choose() gives the kernel module a launched program or a pid"),
        };
        let no_aslr = matches!(settings.target, Target::Launch { aslr: false, .. });
        let step = itrace_format::StepMethod::Kernel;
        let buffers = output::open(settings, *arch, step, output::ncpu(), no_aslr, live)?;
        let opts = Options {
            mode: settings.mode,
            ring: settings.ring_size(),
            mte: settings.mte_size,
            follow_forks: settings.follow_forks,
            follow_threads: settings.follow_threads,
            region: settings.region,
        };
        output::record_into(settings, buffers, *arch, step.to_string(), |b| record(start, &opts, stop, b))
    }
}

/// How the module records.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub mode: Mode,
    /// Bytes per CPU ring.
    pub ring: usize,
    /// Bytes of module-table ring.
    pub mte: usize,
    pub follow_forks: bool,
    pub follow_threads: bool,
    /// libitrace's regions only.
    pub region: bool,
}

/// How to start tracing.
pub enum Start<'a> {
    Launch { program: &'a Path, argv: &'a [OsString], aslr: bool, env: &'a [(OsString, OsString)] },
    Attach { pid: i32 },
}

/// Record with the kernel module until the program ends (or `stop`).
pub fn record(start: Start, opts: &Options, stop: &AtomicBool, buffers: &mut Buffers) -> Result<RecordOutcome> {
    let Options { mode, ring, mte, follow_forks, follow_threads, region } = *opts;
    let flags = if follow_forks { ITR_CFG_FOLLOW_FORKS } else { 0 }
        | if follow_threads { 0 } else { ITR_CFG_NO_FOLLOW_THREADS };
    let ring = ring.clamp(64 << 10, 1 << 30);
    let dev = Device::open(mode, ring, mte.clamp(64 << 10, 1 << 30), flags)?;
    let fd = dev.fd.as_raw_fd();
    let mut child = None;
    match start {
        Start::Launch { program, argv, aslr, env } => {
            let mut cmd = std::process::Command::new(program);
            cmd.arg0(&argv[0]).args(&argv[1..]);
            // Our environment in its order (Command would sort it), with `env` and, for
            // regions, the device libitrace opens set over it.
            let mut set = env.to_vec();
            if region {
                set.push((ENV_KMOD.into(), DEVICE.into()));
            }
            let envp = crate::inherit::Environment::inherited_with(&set)
                .map_err(|e| BackendError::io(format!("cannot run {}", program.display()), std::io::Error::other(e)))?;
            let en_flags = ITR_EN_ON_EXEC | if region { ITR_EN_REGION } else { 0 };
            // SAFETY: only async-signal-safe calls (sigaction, sigprocmask, personality, a
            // store to the child's `environ`, ioctl) between fork and exec; envp lives in the
            // closure until the exec.
            unsafe {
                cmd.pre_exec(move || {
                    procfs::prepare_child_for_exec(aslr);
                    envp.install_in_child();
                    let mut t = TargetArg { pid: 0, flags: en_flags };
                    ioctl(fd, ITR_IOC_ENABLE, &mut t)
                });
            }
            child = Some(cmd.spawn().map_err(|e| BackendError::io(format!("cannot run {}", program.display()), e))?);
        }
        Start::Attach { pid } => {
            let mut t = TargetArg { pid, flags: if region { ITR_EN_REGION } else { 0 } };
            if let Err(e) = ioctl(fd, ITR_IOC_ENABLE, &mut t) {
                match e.raw_os_error() {
                    Some(libc::EPERM) => fail!(
                        "not permitted to trace pid {pid}: the kernel module allows only what ptrace would \
                         (another user's process, or a protected one)"
                    ),
                    Some(libc::ESRCH) => fail!("no process with pid {pid}"),
                    _ => fail!("cannot trace pid {pid} with the kernel module: {e}"),
                }
            }
        }
    }
    let nstreams = dev.ncpu + 1;
    let mut d = Drain {
        sink: Sink::new(buffers),
        out: RecordOutcome::default(),
        modules: ModuleTable::default(),
        snapshot: None,
        pos: vec![0; nstreams],
        last_mte_ts: 0,
    };
    d.out.processes = 1;
    let attached_pid = match start {
        Start::Attach { pid } => Some(pid),
        Start::Launch { .. } => None,
    };
    let mut detached = false;
    let status = loop {
        // The MTE stream always streams; trace streams in continuous mode only (normal and
        // wrap keep theirs in the kernel until the end).
        d.drain_stream(&dev, dev.ncpu, true);
        if mode == Mode::Continuous {
            for i in 0..dev.ncpu {
                d.drain_stream(&dev, i, true);
            }
        }
        // Write what has waited too long; a failed write is kept in the sink and stops below.
        let _ = d.sink.tick();
        if let Some(c) = child.as_mut() {
            if let Some(st) = c.try_wait().map_err(|e| BackendError::io("waiting for the program", e))? {
                break Some(st);
            }
        }
        if let Some(pid) = attached_pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break None;
            }
        }
        if stop.load(Ordering::Relaxed) || d.sink.failed() {
            detached = true;
            break None;
        }
        // The module wakes the poll when a ring is half full and a stop signal interrupts it, so
        // the timeout only bounds how late a program's exit or a module-table event is seen. At
        // 1 ms the wake-ups alone (drain, wait, /proc check) took 43% of a CPU under TCG.
        dev.wait(CONSUMER_POLL_MS);
    };
    // Threads still traced (followed children, an attached process) stop at their next trap.
    dev.stop();
    for _ in 0..200 {
        if dev.ctl().threads == 0 {
            break;
        }
        d.drain_stream(&dev, dev.ncpu, true);
        if mode == Mode::Continuous {
            for i in 0..dev.ncpu {
                d.drain_stream(&dev, i, true);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    d.drain_stream(&dev, dev.ncpu, true);
    d.end_snapshot();
    for i in 0..dev.ncpu {
        let s = dev.stream(i);
        let ncpu_out = d.sink.streams();
        if mode == Mode::Wrap && s.lost > 0 {
            // The oldest records were overwritten (the buffers write the lost record ahead of
            // the survivors).
            wrap_resume(&dev, &mut d, i, &s);
        }
        d.drain_stream(&dev, i, mode != Mode::Wrap);
        d.sink.add_lost(i % ncpu_out, s.lost);
    }
    let mte_lost = dev.stream(dev.ncpu).lost;
    if mte_lost > 0 {
        d.sink.add_lost(0, mte_lost);
    }
    let full = dev.ctl().full != 0;
    let (reason, _) = super::stop_reason(status, detached, full);
    d.out.stop_reason = Some(reason);
    d.out.exit_status = status.map(super::exit_status);
    d.out.branches += d.sink.branches;
    d.out.instructions += d.sink.instructions;
    d.out.write_error = d.sink.write_error();
    Ok(d.out)
}

/// Wrap mode: the first surviving record of each thread may be a branch whose block started in
/// an overwritten record. Those threads resume, for the reader, at that branch's target: the
/// branch itself is dropped and a trace-on (resume) record says where the thread is.
fn wrap_resume(dev: &Device, d: &mut Drain, i: usize, s: &Stream) {
    let from = d.pos[i].max(s.tail);
    let bytes = dev.bytes(s, from, s.head);
    let e = Endian::native();
    let mut seen = std::collections::HashSet::new();
    let mut skip = std::collections::HashSet::new();
    let mut first_ts = None;
    for rec in raw_records(e, &bytes).map_while(Result::ok) {
        if let Ok(r) = Record::decode(e, rec.bytes, 0) {
            first_ts.get_or_insert(r.ts());
            match r {
                Record::Branch(b) if seen.insert(b.tid) => {
                    skip.insert(rec.offset);
                    let on = itrace_format::TraceOn {
                        ts: first_ts.unwrap_or(b.ts),
                        reason: TraceOnReason::Resume,
                        pid: 0,
                        tid: b.tid,
                        pc: b.to,
                    };
                    d.trace_record(i, &Record::TraceOn(on));
                }
                Record::TraceOn(on) => {
                    seen.insert(on.tid);
                }
                Record::TraceOff(off) => {
                    seen.insert(off.tid);
                }
                _ => {}
            }
        }
    }
    // Drop the skipped branches: read the stream record by record, skipping them.
    for rec in raw_records(e, &bytes).map_while(Result::ok) {
        if rec.major == ITR_MAJOR_PAD {
            continue;
        }
        if skip.contains(&rec.offset) {
            // The block's instructions before the gap are unknown: count it as lost.
            let n = d.sink.streams();
            d.sink.add_lost(i % n, 1);
            continue;
        }
        if let Ok(r) = Record::decode(e, rec.bytes, 0) {
            d.trace_record(i, &r);
        }
    }
    d.pos[i] = s.head;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C header and these definitions agree: compile a C program that prints the header's
    /// sizes, offsets and ioctl numbers, and compare.
    #[test]
    fn c_header_matches() {
        let dir = tempfile_dir();
        let src = dir.join("layout.c");
        let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kmod-shim");
        std::fs::write(
            &src,
            r#"#include <stdio.h>
#include <stddef.h>
#include "itrace_kmod.h"
#define P(x) printf(#x " %lu\n", (unsigned long)(x))
int main(void) {
P(sizeof(struct itr_rec_hdr)); P(sizeof(struct itr_rec_branch)); P(offsetof(struct itr_rec_branch, from));
P(offsetof(struct itr_rec_branch, to)); P(offsetof(struct itr_rec_branch, tid)); P(offsetof(struct itr_rec_branch, icount));
P(sizeof(struct itr_rec_on)); P(offsetof(struct itr_rec_on, pc)); P(sizeof(struct itr_rec_off));
P(offsetof(struct itr_rec_off, icount)); P(offsetof(struct itr_rec_off, value)); P(sizeof(struct itr_rec_lost));
P(sizeof(struct itr_rec_segment)); P(ITR_REC_CLONE_LEN); P(offsetof(struct itr_rec_clone, thread)); P(sizeof(struct itr_stream));
P(sizeof(struct itr_ctl)); P(offsetof(struct itr_ctl, stream)); P(offsetof(struct itr_ctl, full));
P(offsetof(struct itr_ctl, threads)); P(offsetof(struct itr_stream, size));
P(sizeof(struct itr_config)); P(sizeof(struct itr_target)); P(sizeof(struct itr_consume)); P(sizeof(struct itr_status));
P(sizeof(struct itr_on)); P(offsetof(struct itr_on, entry)); P(ITR_MAX_ENTRIES); P(ITR_VERSION);
P(ITR_IOC_STATUS); P(ITR_IOC_INSTALL); P(ITR_IOC_REMOVE); P(ITR_IOC_ENABLE); P(ITR_IOC_ON); P(ITR_IOC_OFF);
P(ITR_IOC_STOP); P(ITR_IOC_CONSUME); P(ITR_MAGIC); P(ITR_MAJOR_PAD); P(ITR_MAJOR_BRANCH_USER); P(ITR_MAJOR_TRACE_OFF);
return 0; }
"#,
        )
        .unwrap();
        let exe = dir.join("layout");
        let st = std::process::Command::new("gcc")
            .arg("-I")
            .arg(&header)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .status()
            .expect("gcc runs");
        assert!(st.success());
        let out = std::process::Command::new(&exe).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let got: Vec<u64> = text.lines().map(|l| l.rsplit(' ').next().unwrap().parse().unwrap()).collect();
        use std::mem::{offset_of, size_of};
        let want: Vec<u64> = vec![
            itrace_format::RECORD_HEADER_LEN as u64,
            itrace_format::BRANCH_RECORD_LEN as u64,
            16,
            24,
            32,
            36,
            32,
            24,
            40,
            32,
            36,
            24,
            48,
            36,
            32,
            size_of::<Stream>() as u64,
            size_of::<Ctl>() as u64,
            64,
            offset_of!(Ctl, full) as u64,
            offset_of!(Ctl, threads) as u64,
            offset_of!(Stream, size) as u64,
            size_of::<Config>() as u64,
            size_of::<TargetArg>() as u64,
            size_of::<Consume>() as u64,
            size_of::<Status>() as u64,
            size_of::<RegionOn>() as u64,
            offset_of!(RegionOn, entry) as u64,
            ITR_MAX_ENTRIES as u64,
            ITR_VERSION as u64,
            ITR_IOC_STATUS,
            ITR_IOC_INSTALL,
            ITR_IOC_REMOVE,
            ITR_IOC_ENABLE,
            ITR_IOC_ON,
            ITR_IOC_OFF,
            ITR_IOC_STOP,
            ITR_IOC_CONSUME,
            ITR_MAGIC as u64,
            ITR_MAJOR_PAD as u64,
            major::BRANCH_USER as u64,
            major::TRACE_OFF as u64,
        ];
        assert_eq!(got, want, "C header vs Rust:\n{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Records encoded by the format crate have the offsets the C structs use.
    #[test]
    fn format_layout_matches_c_offsets() {
        let b = itrace_format::Branch {
            ts: 1,
            kernel: false,
            kind: itrace_format::BranchKind::Call,
            flags: 0,
            aux: 0,
            from: 0x1111,
            to: 0x2222,
            tid: 7,
            icount: 9,
        };
        let mut a = [0u8; itrace_format::BRANCH_RECORD_LEN];
        b.encode_into(&mut a);
        assert_eq!(u64::from_ne_bytes(a[16..24].try_into().unwrap()), 0x1111);
        assert_eq!(u64::from_ne_bytes(a[24..32].try_into().unwrap()), 0x2222);
        assert_eq!(u32::from_ne_bytes(a[32..36].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(a[36..40].try_into().unwrap()), 9);
        let mut v = Vec::new();
        let off = itrace_format::TraceOff {
            ts: 1,
            reason: itrace_format::StopReason::Exited,
            pid: 1,
            tid: 2,
            pc: 3,
            icount: 4,
            value: 5,
        };
        Record::TraceOff(off).encode(&mut v).unwrap();
        assert_eq!(v.len(), 40);
        assert_eq!(u32::from_ne_bytes(v[32..36].try_into().unwrap()), 4);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let now = itrace_format::now_ns();
        let d = std::env::temp_dir().join(format!("itrace-kmod-layout-{}-{now}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
