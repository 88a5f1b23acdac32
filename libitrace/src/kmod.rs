//! Regions through the kernel shim (`/dev/itrace`, `itrace record --backend kmod --region`):
//! the module does the tracing; this side only tells it where a region starts, goes on and
//! ends, with ioctls of the calling thread (device ABI in [`itrace_format::kmod`]).
//!
//! - The outermost ITraceOn opens the device and asks for the region to start at the caller's
//!   return address (ITR_IOC_ON): the module sets the trap flag on the way back from the ioctl
//!   and starts recording there, so none of this library's or libc's instructions are traced.
//! - A traced thread that calls into this library (ITraceOff, a nested ITraceOn,
//!   ITraceEnabled, a counter read) stops being recorded at the entry point (the module knows
//!   them from ITR_IOC_ON); the body then either ends the region (ITR_IOC_OFF, outermost
//!   ITraceOff) or lets it go on after the return (ITR_IOC_ON again).
//! - The device stays open only while the thread is in a region, so the module can be unloaded
//!   between regions. When the module is not there at the first ITraceOn, the device is not
//!   tried again in this process (one failed open, then the calls cost nothing).

use itrace_format::kmod::{RegionOn, DEVICE, ENV_KMOD, ITR_IOC_OFF, ITR_IOC_ON, ITR_MAX_ENTRIES};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// The device was not there: do not try again.
static ABSENT: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// (ITraceOn nesting depth, the device while this thread's region goes through it, or -1).
    static REGION: Cell<(u32, i32)> = const { Cell::new((0, -1)) };
}

fn open_device() -> i32 {
    if ABSENT.load(Ordering::Relaxed) {
        return -1;
    }
    let path = std::env::var_os(ENV_KMOD).unwrap_or_else(|| DEVICE.into());
    let Ok(path) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())) else {
        return -1;
    };
    // SAFETY: a NUL-terminated path; the descriptor is ours to close.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0
        && matches!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENOENT | libc::ENXIO | libc::ENODEV))
    {
        ABSENT.store(true, Ordering::Relaxed);
    }
    fd
}

/// ITR_IOC_ON: the region starts or goes on at `resume_pc`. On failure (this thread is not
/// traced, or no longer: the session ended, a buffer filled) the device is closed.
fn region_on(fd: i32, resume_pc: u64) -> i32 {
    let entries = crate::entry::entry_points();
    let mut arg = RegionOn { resume_pc, nentries: entries.len() as u32, ..Default::default() };
    arg.entry[..entries.len()].copy_from_slice(&entries);
    const _: () = assert!(ITR_MAX_ENTRIES >= 6);
    // SAFETY: `arg` is a live `struct itr_on`, the size ITR_IOC_ON encodes.
    if unsafe { libc::ioctl(fd, ITR_IOC_ON as _, &mut arg) } == 0 {
        fd
    } else {
        close(fd);
        -1
    }
}

fn close(fd: i32) {
    // SAFETY: closing the descriptor this thread opened and owns.
    unsafe { libc::close(fd) };
}

/// ITraceOn: the outermost call starts a region; a nested one lets it go on.
pub(crate) fn on(resume_pc: u64) {
    REGION.with(|r| {
        let (depth, fd) = r.get();
        let depth = depth.saturating_add(1);
        let fd = match (depth, fd) {
            (1, _) => match open_device() {
                -1 => -1,
                fd => region_on(fd, resume_pc),
            },
            (_, -1) => -1,
            (_, fd) => region_on(fd, resume_pc),
        };
        r.set((depth, fd));
    })
}

/// ITraceOff: the outermost call ends the region; a nested one lets it go on.
pub(crate) fn off(resume_pc: u64) {
    REGION.with(|r| {
        let (depth, fd) = r.get();
        let Some(depth) = depth.checked_sub(1) else { return };
        let fd = match (depth, fd) {
            (_, -1) => -1,
            (0, fd) => {
                // SAFETY: ITR_IOC_OFF takes no argument.
                unsafe { libc::ioctl(fd, ITR_IOC_OFF as _, 0) };
                close(fd);
                -1
            }
            (_, fd) => region_on(fd, resume_pc),
        };
        r.set((depth, fd));
    })
}

/// ITraceEnabled: whether the thread's region goes on (through the device) after the return.
pub(crate) fn enabled(resume_pc: u64) -> bool {
    carry_on(resume_pc);
    REGION.with(|r| r.get().1 >= 0)
}

/// Any other call from inside a region: it goes on after the return.
pub(crate) fn carry_on(resume_pc: u64) {
    REGION.with(|r| {
        let (depth, fd) = r.get();
        if fd >= 0 {
            r.set((depth, region_on(fd, resume_pc)));
        }
    })
}
