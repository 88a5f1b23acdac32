//! A stopped thread's registers and memory: `struct pt_regs` through `PTRACE_GETREGS`, and the
//! temporary trap instructions an atomic sequence runs to.

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;

/// `PTRACE_GETREGS` and `PTRACE_SETREGS` on PowerPC (arch/powerpc/include/uapi/asm/ptrace.h).
const PTRACE_GETREGS: libc::c_uint = 12;
const PTRACE_SETREGS: libc::c_uint = 13;

/// `struct pt_regs` (user_pt_regs) of a 64-bit PowerPC thread, as ptrace gives it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Regs {
    pub(super) gpr: [u64; 32],
    pub(super) nip: u64,
    pub(super) msr: u64,
    /// r3 at system call entry (the kernel restarts a call with it).
    pub(super) orig_gpr3: u64,
    pub(super) ctr: u64,
    pub(super) link: u64,
    pub(super) xer: u64,
    pub(super) ccr: u64,
    pub(super) softe: u64,
    /// The interrupt that entered the kernel (0xc00: a system call).
    pub(super) trap: u64,
    pub(super) dar: u64,
    pub(super) dsisr: u64,
    pub(super) result: u64,
    /// ELF_NGREG is 48: the kernel may copy up to that many words.
    _pad: [u64; 4],
}

/// CR0[SO]: set by the kernel when a system call returns an error (r3 is then a positive errno).
const CR0_SO: u64 = 1 << 28;

/// The kernel's "restart this call" returns (ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND,
/// ERESTART_RESTARTBLOCK), positive in r3 with CR0[SO] set on PowerPC.
const RESTART_ERRNOS: [u64; 4] = [512, 513, 514, 516];

impl Regs {
    pub(super) fn syscall_nr(&self) -> u64 {
        self.gpr[0]
    }

    /// Stopped at the end of a system call that the kernel will restart (or interrupt).
    pub(super) fn restarting(&self) -> bool {
        self.ccr & CR0_SO != 0 && RESTART_ERRNOS.contains(&self.gpr[3])
    }
}

pub(super) fn getregs(tid: i32) -> Result<Regs, Errno> {
    let mut r = Regs::default();
    // SAFETY: PTRACE_GETREGS writes at most ELF_NGREG (48) words into `r`, which has 48.
    let rc = unsafe { libc::ptrace(PTRACE_GETREGS, tid, 0, &mut r as *mut Regs) };
    if rc == -1 {
        Err(Errno::last())
    } else {
        Ok(r)
    }
}

/// Index of `nip` in `struct pt_regs` (PT_NIP in arch/powerpc/include/uapi/asm/ptrace.h).
const PT_NIP: u64 = 32;

/// Thread `tid`'s pc alone: `PTRACE_PEEKUSER` of one word, for the stops that need nothing else
/// (most steps). Cheaper than `PTRACE_GETREGS`, which copies all 48 words.
pub(super) fn read_nip(tid: i32) -> Result<u64, Errno> {
    ptrace::read_user(Pid::from_raw(tid), (PT_NIP * 8) as ptrace::AddressType).map(|w| w as u64)
}

pub(super) fn setregs(tid: i32, r: &Regs) -> Result<(), Errno> {
    // SAFETY: PTRACE_SETREGS reads at most ELF_NGREG (48) words from `r`, which has 48.
    let rc = unsafe { libc::ptrace(PTRACE_SETREGS, tid, 0, r as *const Regs) };
    if rc == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `tw 31,0,0` ("trap"): raises SIGTRAP with the pc left on it.
pub(super) const TRAP: u32 = 0x7fe0_0008;

/// Write the 4-byte instruction `insn` at `addr` of stopped thread `tid`'s process (little-endian:
/// the low half of the 8-byte word at `addr`); returns the instruction it replaced.
pub(super) fn poke_insn(tid: i32, addr: u64, insn: u32) -> Result<u32, Errno> {
    let pid = Pid::from_raw(tid);
    let word = ptrace::read(pid, addr as ptrace::AddressType)? as u64;
    let old = word as u32;
    let new = (word & !0xffff_ffff) | insn as u64;
    ptrace::write(pid, addr as ptrace::AddressType, new as i64)?;
    Ok(old)
}

/// Whether thread `tid` has a handler for signal `sig` (SigCgt of /proc/TID/status).
pub(super) fn handled(tid: i32, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    (1..=64).contains(&sig) && caught & (1 << (sig - 1)) != 0
}
