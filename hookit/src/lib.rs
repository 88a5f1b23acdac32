//! hookit: the profiler's hooks for C and C++ programs compiled with `-finstrument-functions`.
//!
//! `__cyg_profile_func_enter` and `__cyg_profile_func_exit` read the thread's instruction
//! metric first thing (Early Read) and last thing (Late Read); between the two they append an
//! event (kind, function, call site, both reads) to the thread's log. Outside the reads the
//! hooks are straight-line assembly (no conditional branch), so the unmeasured path is constant
//! and calibration can remove it. At exit the logs go to `$ITRACE_HOOKIT_OUT/hookit-PID.events`;
//! `itrace calib` calibrates them and writes the reports (log-rt, log-gen).
//!
//! Metric sources (`ITRACE_HOOKIT_METRIC`, read at start):
//! - `hw`: the hardware instructions counter, per thread and user only (`perf_event_open`); a
//!   clear error and exit status 1 where the machine has none.
//! - `sw`: the virtual counter of itrace's in-process recorder ([`itrace::ITraceInstructions`]):
//!   each thread is traced from its first event; the reads pause stepping between them.
//! - `auto` (default): `hw` where it opens, else `sw` under itrace.
//!
//! Without `ITRACE_HOOKIT_OUT` the hooks record nothing (and cost a few instructions).

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::Mutex;

/// The log of one thread.
struct ThreadLog {
    tid: u32,
    /// (flags, function, call site, early read, late read).
    events: Vec<[u64; 5]>,
}

/// Event flag bits (first word).
const EXIT: u64 = 1;
/// The call site's instruction is not a direct `call rel32`.
const INDIRECT: u64 = 2;

const SOURCE_OFF: u8 = 0;
const SOURCE_SW: u8 = 1;
const SOURCE_HW: u8 = 2;
static SOURCE: AtomicU8 = AtomicU8::new(SOURCE_OFF);

/// The read functions the hooks call (indirect calls: one path whatever the source).
static READ_EARLY: AtomicPtr<()> = AtomicPtr::new(zero as *mut ());
static READ_LATE: AtomicPtr<()> = AtomicPtr::new(zero as *mut ());

/// Every thread's log (leaked: written out at exit).
static LOGS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

thread_local! {
    static LOG: Cell<*mut ThreadLog> = const { Cell::new(std::ptr::null_mut()) };
    static PERF_FD: Cell<i32> = const { Cell::new(-1) };
}

/// Where a late read goes when nothing is recorded.
static mut SINK: u64 = 0;

extern "C" fn zero() -> u64 {
    0
}

/// The hardware source's read: the thread's counter (user instructions).
extern "C" fn hw_read() -> u64 {
    let fd = PERF_FD.with(|f| f.get());
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a local from the thread's counter descriptor.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    v
}

/// Open a per-thread, user-only hardware instructions counter (perf_event_open).
fn open_hw_counter() -> Result<i32, std::io::Error> {
    use perf_event_open_sys::bindings::{perf_event_attr, PERF_COUNT_HW_INSTRUCTIONS, PERF_TYPE_HARDWARE};
    let mut attr = perf_event_attr {
        type_: PERF_TYPE_HARDWARE,
        size: std::mem::size_of::<perf_event_attr>() as u32,
        config: PERF_COUNT_HW_INSTRUCTIONS as u64,
        ..Default::default()
    };
    attr.set_exclude_kernel(1);
    attr.set_exclude_hv(1);
    // SAFETY: attr is a valid perf_event_attr whose size field is its own size; pid 0 = this
    // thread, cpu -1 = any, no group, no flags.
    let fd = unsafe { perf_event_open_sys::perf_event_open(&mut attr, 0, -1, -1, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd as i32)
}

fn fail(msg: &str) -> ! {
    eprintln!("hookit: {msg}");
    // SAFETY: leaving the process at once, as a constructor that cannot go on.
    unsafe { libc::_exit(1) }
}

/// Choose the metric source, once, before main.
extern "C" fn init() {
    if std::env::var_os("ITRACE_HOOKIT_OUT").is_none() {
        return;
    }
    let want = std::env::var("ITRACE_HOOKIT_METRIC").unwrap_or_else(|_| "auto".into());
    let under_itrace = std::env::var_os("ITRACE_SHM").is_some();
    let source = match want.as_str() {
        "hw" => match open_hw_counter() {
            Ok(fd) => {
                // SAFETY: closing the probe descriptor we opened.
                unsafe { libc::close(fd) };
                SOURCE_HW
            }
            Err(e) => fail(&format!(
                "metric hw: this machine has no hardware instructions counter (perf_event_open: {e}); \
                 use ITRACE_HOOKIT_METRIC=sw under itrace"
            )),
        },
        "sw" if under_itrace => SOURCE_SW,
        "sw" => fail(
            "metric sw: the software instruction counter needs itrace's in-process recorder; run the \
                      program under `itrace calib validate`",
        ),
        "auto" => match open_hw_counter() {
            Ok(fd) => {
                // SAFETY: as above.
                unsafe { libc::close(fd) };
                SOURCE_HW
            }
            Err(_) if under_itrace => SOURCE_SW,
            Err(e) => fail(&format!(
                "no metric: no hardware instructions counter (perf_event_open: {e}) and not under itrace"
            )),
        },
        other => fail(&format!("ITRACE_HOOKIT_METRIC={other}: expected hw, sw or auto")),
    };
    let (early, late): (*mut (), *mut ()) = match source {
        SOURCE_HW => (hw_read as *mut (), hw_read as *mut ()),
        _ => (itrace::ITraceInstructionsPause as *mut (), itrace::ITraceInstructionsResume as *mut ()),
    };
    READ_EARLY.store(early, Ordering::Release);
    READ_LATE.store(late, Ordering::Release);
    SOURCE.store(source, Ordering::Release);
}

/// Stop tracing this thread and write every thread's log.
extern "C" fn fini() {
    let source = SOURCE.swap(SOURCE_OFF, Ordering::AcqRel);
    if source == SOURCE_OFF {
        return;
    }
    if source == SOURCE_SW {
        itrace::off();
    }
    let Some(dir) = std::env::var_os("ITRACE_HOOKIT_OUT") else { return };
    let pid = std::process::id();
    let mut text = format!("hookit 1 metric={} pid={pid}\n", if source == SOURCE_HW { "hw" } else { "sw" });
    let logs = LOGS.lock().unwrap_or_else(|e| e.into_inner());
    for &p in logs.iter() {
        // SAFETY: registered logs are leaked boxes, never freed.
        let log = unsafe { &*(p as *const ThreadLog) };
        text.push_str(&format!("T {}\n", log.tid));
        for e in &log.events {
            let k = if e[0] & EXIT != 0 { 'X' } else { 'E' };
            text.push_str(&format!("{k} {:#x} {:#x} {} {} {}\n", e[1], e[2], e[3], e[4], e[0] & !EXIT));
        }
    }
    let path = std::path::Path::new(&dir).join(format!("hookit-{pid}.events"));
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("hookit: cannot write {}: {e}", path.display());
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

/// The work between the reads: append the event; returns where the Late Read goes.
extern "C" fn record(func: u64, site: u64, early: u64, exit: u64) -> *mut u64 {
    let source = SOURCE.load(Ordering::Acquire);
    if source == SOURCE_OFF {
        return &raw mut SINK;
    }
    let mut log = LOG.with(|l| l.get());
    if log.is_null() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        log = Box::into_raw(Box::new(ThreadLog { tid, events: Vec::with_capacity(4096) }));
        LOG.with(|l| l.set(log));
        LOGS.lock().unwrap_or_else(|e| e.into_inner()).push(log as usize);
        match source {
            SOURCE_HW => match open_hw_counter() {
                Ok(fd) => PERF_FD.with(|f| f.set(fd)),
                Err(e) => fail(&format!("metric hw: cannot open this thread's counter: {e}")),
            },
            // The thread is traced (and counted) from here: its first event.
            _ => itrace::on(),
        }
    }
    // A direct call is `call rel32` (0xe8) just before the return address.
    // SAFETY: `site` is a return address in mapped code, at least 5 bytes into it.
    let indirect = if site >= 5 && unsafe { *((site - 5) as *const u8) } != 0xe8 { INDIRECT } else { 0 };
    // SAFETY: the thread's own log, reached only by this thread until exit.
    let log = unsafe { &mut *log };
    log.events.push([exit | indirect, func, site, early, 0]);
    &mut log.events.last_mut().expect("just pushed")[4]
}

// The hooks. Straight-line: save the arguments, Early Read, record, Late Read into the slot
// `record` returned, return. 16-byte stack alignment at each call (entry rsp is 8 mod 16).
macro_rules! hook {
    ($exit:literal) => {
        std::arch::naked_asm!(
            "pushq %rdi",
            "pushq %rsi",
            "subq $8, %rsp",
            "call *{early}(%rip)",
            "movq %rax, %rdx",
            "movq 8(%rsp), %rsi",
            "movq 16(%rsp), %rdi",
            concat!("movl $", $exit, ", %ecx"),
            "call {record}",
            "movq %rax, (%rsp)",
            "call *{late}(%rip)",
            "movq (%rsp), %rcx",
            "movq %rax, (%rcx)",
            "addq $24, %rsp",
            "ret",
            early = sym READ_EARLY,
            late = sym READ_LATE,
            record = sym record,
            options(att_syntax)
        )
    };
}

/// Function entry hook (gcc/clang `-finstrument-functions`).
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn __cyg_profile_func_enter(_this_fn: *const (), _call_site: *const ()) {
    hook!("0")
}

/// Function exit hook (gcc/clang `-finstrument-functions`).
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn __cyg_profile_func_exit(_this_fn: *const (), _call_site: *const ()) {
    hook!("1")
}
