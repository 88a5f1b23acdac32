//! A stopped s390x thread's registers: the PSW (mask and address) and the 16 general registers
//! through `PTRACE_GETREGSET` (`NT_PRSTATUS`: `s390_regs`), single words through
//! `PTRACE_PEEKUSR` (the `s390_regs` offsets of arch/s390/include/uapi/asm/ptrace.h).

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;

/// `NT_PRSTATUS`: the general register set.
const NT_PRSTATUS: libc::c_int = 1;

/// `s390_regs` as `NT_PRSTATUS` gives it (the first 216 bytes of `user_regs_struct`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Regs {
    pub(super) psw_mask: u64,
    pub(super) psw_addr: u64,
    pub(super) gprs: [u64; 16],
    pub(super) acrs: [u32; 16],
    /// r2 at system call entry (the kernel restarts a call with it).
    pub(super) orig_gpr2: u64,
}

/// The kernel's "restart this call" returns (-ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND,
/// -ERESTART_RESTARTBLOCK), negative in r2 on s390.
const RESTART_ERRNOS: [i64; 4] = [-512, -513, -514, -516];

impl Regs {
    /// Stopped at the end of a system call that the kernel will restart (or interrupt).
    pub(super) fn restarting(&self) -> bool {
        RESTART_ERRNOS.contains(&(self.gprs[2] as i64))
    }

    /// The condition code (PSW bits 18-19).
    pub(super) fn condition_code(&self) -> u8 {
        ((self.psw_mask >> 44) & 3) as u8
    }
}

pub(super) fn getregs(tid: i32) -> Result<Regs, Errno> {
    let mut r = Regs::default();
    let mut iov = libc::iovec { iov_base: (&mut r as *mut Regs).cast(), iov_len: std::mem::size_of::<Regs>() };
    // SAFETY: PTRACE_GETREGSET writes at most iov_len bytes into `r`, which is that large.
    let rc = unsafe { libc::ptrace(libc::PTRACE_GETREGSET, tid, NT_PRSTATUS, &mut iov as *mut libc::iovec) };
    if rc == -1 {
        Err(Errno::last())
    } else {
        Ok(r)
    }
}

pub(super) fn setregs(tid: i32, r: &Regs) -> Result<(), Errno> {
    let mut copy = *r;
    let mut iov = libc::iovec { iov_base: (&mut copy as *mut Regs).cast(), iov_len: std::mem::size_of::<Regs>() };
    // SAFETY: PTRACE_SETREGSET reads at most iov_len bytes from `copy`, which is that large.
    let rc = unsafe { libc::ptrace(libc::PTRACE_SETREGSET, tid, NT_PRSTATUS, &mut iov as *mut libc::iovec) };
    if rc == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Offset of the PSW address in `s390_regs` (PT_PSWADDR).
const PT_PSWADDR: u64 = 8;

/// Thread `tid`'s pc alone: one `PTRACE_PEEKUSR`, for the stops that need nothing else.
pub(super) fn read_pc(tid: i32) -> Result<u64, Errno> {
    ptrace::read_user(Pid::from_raw(tid), PT_PSWADDR as ptrace::AddressType).map(|w| w as u64)
}

/// Move thread `tid`'s pc (one `PTRACE_POKEUSR`).
pub(super) fn write_pc(tid: i32, pc: u64) -> Result<(), Errno> {
    ptrace::write_user(Pid::from_raw(tid), PT_PSWADDR as ptrace::AddressType, pc as i64)
}
