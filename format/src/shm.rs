//! The memory shared between `itrace record --backend inproc` and the
//! in-process recorder (libitrace): a header, one control block per CPU, and per-CPU
//! rings of fixed-size slots. Traced threads write slots from their SIGTRAP
//! handler (reserving with an atomic add, publishing with a sequence
//! number); `itrace` drains them into the trace file's records.
//!
//! Layout: [Header, 4096 bytes][CpuCtl x ncpu, padded to 4096][Slot x slots x ncpu].

use std::sync::atomic::{AtomicU32, AtomicU64};

/// First 8 bytes of the shared file.
pub const MAGIC: u64 = u64::from_le_bytes(*b"ITRSHM01");
/// Environment variable through which `itrace` gives the program the shared file's path.
pub const ENV_SHM: &str = "ITRACE_SHM";

/// Collection modes (the trace file's codes).
pub const MODE_NORMAL: u32 = 0;
pub const MODE_WRAP: u32 = 1;
pub const MODE_CONTINUOUS: u32 = 2;

/// Slot kinds.
pub const SLOT_BRANCH_USER: u16 = 1;
pub const SLOT_BRANCH_KERNEL: u16 = 2;
/// `to` is the pc tracing starts at; `code` 0 start, 2 resume.
pub const SLOT_TRACE_ON: u16 = 3;
/// `from` is the pc, `code` the stop reason, `to` the exit status or signal.
pub const SLOT_TRACE_OFF: u16 = 4;
/// A mapping system call ran: re-read /proc/PID/maps.
pub const SLOT_MAPS_CHANGED: u16 = 5;

/// The shared header.
#[repr(C)]
pub struct Header {
    pub magic: u64,
    pub ncpu: u32,
    pub mode: u32,
    /// Slots per CPU.
    pub slots: u64,
    /// Set by itrace: every traced thread stops tracing at its next step.
    pub stop: AtomicU32,
    /// Set by a writer in normal mode: a ring is full, tracing stops everywhere.
    pub full: AtomicU32,
    /// Process id of the recording program (0 before the first region).
    pub pid: AtomicU32,
    /// Set by itrace to `pid` once it has read the process's mappings: the first region waits
    /// for it, so even a program that dies at once leaves a trace that resolves.
    pub maps_ack: AtomicU32,
}

/// Per-CPU ring control, one cache line.
#[repr(C)]
pub struct CpuCtl {
    /// Next slot index to reserve (counts up forever; the ring index is head % slots).
    pub head: AtomicU64,
    /// Continuous mode: first slot index itrace has not consumed.
    pub tail: AtomicU64,
    /// Records that could not be written (normal mode full, continuous mode stopped).
    pub lost: AtomicU64,
    pub _pad: [u64; 5],
}

/// One record as written by a traced thread.
#[repr(C)]
pub struct Slot {
    /// Index + 1 once the slot is complete (0: being written).
    pub seq: AtomicU64,
    pub ts: u64,
    pub from: u64,
    pub to: u64,
    pub tid: u32,
    pub icount: u32,
    /// One of the SLOT_* kinds.
    pub kind: u16,
    /// Branch: kind | flags << 8 (the trace file's minor code, low 16 bits); trace off: reason.
    pub code: u16,
    /// Branch: system call or signal number; trace on/off: pid.
    pub aux: u32,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 48);
const _: () = assert!(std::mem::size_of::<CpuCtl>() == 64);

/// Normal mode: the slots at the end of each ring kept for trace-on and trace-off records
/// (branches are refused once only these are left), so that a thread stopped by a full ring
/// can record why. A few threads may race into them at the moment the ring fills.
pub fn normal_reserve(slots: u64) -> u64 {
    (slots / 16).clamp(2, 64).min(slots / 2)
}

/// Where the parts are, for `ncpu` CPUs of `slots` slots.
pub fn layout(ncpu: usize, slots: usize) -> (usize, usize, usize) {
    let ctl = 4096;
    let slots_at = ctl + (ncpu * 64).div_ceil(4096) * 4096;
    let total = slots_at + ncpu * slots * std::mem::size_of::<Slot>();
    (ctl, slots_at, total)
}
