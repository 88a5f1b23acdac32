//! The writing side of the memory shared with `itrace record --backend inproc` (layout and
//! protocol in [`itrace_format::shm`]): the in-process recorder ([`crate::inproc`]) maps the
//! file once and writes its records into the ring of the CPU it runs on.

use itrace_format::shm::{self, CpuCtl, Header, Slot};
use std::sync::atomic::{AtomicPtr, Ordering};

/// The mapping (null until [`map`] succeeds); never unmapped.
static SHARED: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

/// Map the file itrace named in $ITRACE_SHM, for the life of the process; whether it is there
/// and is a ring file.
pub(crate) fn map() -> bool {
    let Some(path) = std::env::var_os(shm::ENV_SHM) else { return false };
    let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(&path) else { return false };
    let Ok(len) = file.metadata().map(|m| m.len() as usize) else { return false };
    if len < 4096 {
        return false;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: mapping a file we opened, shared, for its whole length; the result is checked.
    let base = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if base == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the mapping is at least 4096 bytes, more than a header, and page-aligned.
    let hdr = unsafe { &*(base as *const Header) };
    // The rings must lie inside the file: `emit` relies on it.
    if hdr.magic != shm::MAGIC
        || hdr.ncpu == 0
        || hdr.slots == 0
        || shm::layout(hdr.ncpu as usize, hdr.slots as usize).2 > len
    {
        return false;
    }
    SHARED.store(base.cast(), Ordering::Release);
    true
}

fn header() -> Option<&'static Header> {
    let p = SHARED.load(Ordering::Acquire);
    // SAFETY: set once, by `map`, to a live mapping with a header, never unmapped.
    (!p.is_null()).then(|| unsafe { &*(p as *const Header) })
}

/// Whether itrace asked every thread to stop, or a ring filled in normal mode; `None` when
/// nothing is mapped.
pub(crate) fn stopped() -> Option<bool> {
    header().map(|h| h.stop.load(Ordering::Relaxed) != 0 || h.full.load(Ordering::Relaxed) != 0)
}

/// Whether a ring filled in normal mode.
pub(crate) fn full() -> bool {
    header().is_some_and(|h| h.full.load(Ordering::Relaxed) != 0)
}

/// The first region of process `pid`: let itrace read its mappings first (a bounded wait, a
/// second at most). At once when itrace has read them already.
pub(crate) fn wait_for_maps(pid: u32) {
    let Some(h) = header() else { return };
    if h.maps_ack.load(Ordering::Acquire) == pid {
        return;
    }
    h.pid.store(pid, Ordering::Release);
    for _ in 0..1000 {
        if h.maps_ack.load(Ordering::Acquire) == pid {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Write one slot into this CPU's ring. Async-signal-safe: atomics and the vDSO only.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit(kind: u16, code: u16, aux: u32, from: u64, to: u64, tid: u32, icount: u32) {
    let base = SHARED.load(Ordering::Acquire);
    let Some(hdr) = header() else { return };
    let ncpu = hdr.ncpu as usize;
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = (unsafe { libc::sched_getcpu() }.max(0) as usize).min(ncpu - 1);
    let (ctl_at, slots_at, _) = shm::layout(ncpu, hdr.slots as usize);
    // SAFETY: `cpu` < ncpu, and the file holds the whole layout for the header's ncpu and slots
    // (checked by `map`).
    let ctl = unsafe { &*(base.add(ctl_at + cpu * std::mem::size_of::<CpuCtl>()) as *const CpuCtl) };
    let slots = hdr.slots;
    // Normal mode: branches stop short of the ring's end, whose last slots are kept for region
    // starts and ends. A thread that a full ring stops says so in a trace-off record; without
    // the reserve that record was refused like the branch that filled the ring, and a ring that
    // filled at a region's start left no trace of why tracing stopped.
    let control = kind == shm::SLOT_TRACE_ON || kind == shm::SLOT_TRACE_OFF;
    if hdr.mode == shm::MODE_NORMAL
        && !control
        && ctl.head.load(Ordering::Acquire) >= slots - shm::normal_reserve(slots)
    {
        hdr.full.store(1, Ordering::Release);
        ctl.lost.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let idx = ctl.head.fetch_add(1, Ordering::AcqRel);
    match hdr.mode {
        shm::MODE_NORMAL if idx >= slots => {
            hdr.full.store(1, Ordering::Release);
            ctl.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        shm::MODE_CONTINUOUS => {
            // Wait for itrace to drain; give up only if it asks everyone to stop.
            while idx - ctl.tail.load(Ordering::Acquire) >= slots {
                if hdr.stop.load(Ordering::Acquire) != 0 {
                    ctl.lost.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
        _ => {}
    }
    let at = slots_at + (cpu * slots as usize + (idx % slots) as usize) * std::mem::size_of::<Slot>();
    // SAFETY: `at` is inside this CPU's ring (checked by `map`), and this thread reserved slot
    // `idx` alone: no other writer touches it until the ring comes round again.
    let slot = unsafe { &mut *(base.add(at) as *mut Slot) };
    slot.ts = itrace_format::now_ns();
    slot.from = from;
    slot.to = to;
    slot.tid = tid;
    slot.icount = icount;
    slot.kind = kind;
    slot.code = code;
    slot.aux = aux;
    slot.seq.store(idx + 1, Ordering::Release);
}
