//! rseq critical sections under the translating recorder: they run at their own addresses.
//!
//! The kernel aborts a restartable sequence (moves the thread to the section's `abort_ip`) only
//! when the thread is preempted, migrated or signalled while its real pc is inside
//! `[start_ip, start_ip + post_commit_offset)` of the `struct rseq_cs` its registered
//! `rseq->rseq_cs` points to. From the cache the pc never is, so a section run there would go
//! on after a preemption and commit a stale update. A ptrace stop is a preemption too, so a
//! thread may not be stepped inside a section either: every step would abort it.
//!
//! **Finding them.** A program enters a section by storing the descriptor's address into
//! `rseq->rseq_cs` just before `start_ip`: `lea desc(%rip), %reg; mov %reg, 8(%rseq)` (librseq's
//! `RSEQ_ASM_STORE_RSEQ_CS`, tcmalloc's, our `xl_rseq`). The translator looks at every
//! RIP-relative `lea` it meets: where its target holds a valid descriptor (version 0, a
//! non-empty section, `abort_ip` outside it and preceded by the x86 rseq signature the kernel
//! checks, 0x53053053) and the code from the `lea` falls straight through the section to its
//! end, that code (from the `lea` to `start_ip + post_commit_offset`) is a **native run**.
//!
//! **Running them.** No unit holds an instruction of a native run (a unit ends before its
//! `lea`; a unit is never started inside one). A thread that reaches its `lea` leaves the cache
//! there and runs natively, at full speed, with execute breakpoints at the section's end (DR0)
//! and at its `abort_ip` (DR1), as block stepping with debug registers does (`hwstep.rs`). The
//! path is straight, so a stop at the end counts every instruction of it; the thread then goes
//! back into the cache. A preemption inside the section aborts it as it would untraced: the
//! thread stops at `abort_ip`, recorded as a transfer (`Other`) from the instruction before
//! `start_ip` to `abort_ip`, and goes on in the cache from there. A signal stops the thread
//! where it is, counted exactly, and is delivered by a step: the kernel aborts the section
//! then as untraced, and the handler returns to `abort_ip`.
//!
//! Limits: the kernel does not say where an abort happened, so the instructions of the section
//! that ran before it are not counted (an abort is recorded as if it came before `start_ip`).
//! A section whose code branches, or whose descriptor is not loaded by a RIP-relative `lea` on
//! the way into it (built elsewhere, loaded from memory), still runs from the cache, where the
//! kernel cannot abort it; itrace warns once for a section it found but cannot run natively.

use super::super::engine::*;
use super::super::hwstep::{set_dr, Run, DR7_DR0_EXEC, DR7_DR1_EXEC, TRAP_HWBKPT};
use iced_x86::{Code, Decoder, DecoderOptions};
use itrace_decoders::Flow;
use nix::sys::ptrace;
use nix::unistd::Pid;

/// The signature that precedes every `abort_ip` (`RSEQ_SIG` of glibc, librseq and tcmalloc on
/// x86); the kernel kills a thread whose abort handler lacks the one it registered.
const RSEQ_SIG: u32 = 0x5305_3053;

/// The longest native run followed (instructions from the `lea` to the section's end).
const MAX_RUN_INSNS: u32 = 4096;

/// A critical section and the straight code from its descriptor's `lea` to its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in super::super) struct NativeRun {
    /// The `lea` of the descriptor: where the thread leaves the cache.
    pub(in super::super) lea: u64,
    /// The section: `[start_ip, end)`; `end` is `start_ip + post_commit_offset`.
    pub(in super::super) start_ip: u64,
    pub(in super::super) end: u64,
    pub(in super::super) abort_ip: u64,
    /// Instructions from the `lea` up to `start_ip`, and the last of them.
    pub(in super::super) before_start: u32,
    pub(in super::super) last_before_start: u64,
}

impl NativeRun {
    /// Whether `pc` is in the code the run covers, `lea` to the section's end.
    pub(super) fn covers(&self, pc: u64) -> bool {
        (self.lea..self.end).contains(&pc)
    }
}

/// What a `lea` at `pc` tells of an rseq critical section.
pub(super) enum Found {
    /// Not a descriptor's `lea`.
    Nothing,
    /// A section that runs natively from here.
    Run(NativeRun),
    /// A section whose code does not fall straight through (its start): it stays in the cache.
    Branchy(u64),
}

/// Whether `bytes` may start a RIP-relative `lea` of a 64-bit register (REX.W, 8D, ModRM with
/// mod 00 and r/m 101, legacy prefixes aside): the cheap test before a decode.
pub(super) fn may_be_lea_rip(bytes: &[u8]) -> bool {
    let mut i = 0;
    while i < bytes.len() && matches!(bytes[i], 0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x66 | 0x67 | 0xf2 | 0xf3) {
        i += 1;
    }
    matches!(bytes.get(i..i + 3), Some([rex, 0x8d, modrm]) if rex & 0xf8 == 0x48 && modrm & 0xc7 == 0x05)
}

/// Look at the instruction at `pc` (`fetch` reads the process's memory): a RIP-relative `lea`
/// of a valid `struct rseq_cs`, followed by straight code through the section?
pub(super) fn find_at(pc: u64, fetch: &mut dyn FnMut(u64, &mut [u8]) -> usize) -> Found {
    let mut bytes = [0u8; itrace_decoders::x86::MAX_INSN_LEN];
    let n = fetch(pc, &mut bytes);
    if !may_be_lea_rip(&bytes[..n]) {
        return Found::Nothing;
    }
    let insn = Decoder::with_ip(64, &bytes[..n], pc, DecoderOptions::NONE).decode();
    if insn.code() != Code::Lea_r64_m || !insn.is_ip_rel_memory_operand() {
        return Found::Nothing;
    }
    let desc_at = insn.ip_rel_memory_address();
    let mut desc = [0u8; 32];
    if fetch(desc_at, &mut desc) != desc.len() {
        return Found::Nothing;
    }
    let word = |n: usize| u64::from_le_bytes(desc[n..n + 8].try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(desc[..4].try_into().expect("4 bytes"));
    let (start_ip, post_commit_offset, abort_ip) = (word(8), word(16), word(24));
    let Some(end) = start_ip.checked_add(post_commit_offset) else { return Found::Nothing };
    if version != 0
        || post_commit_offset == 0
        || start_ip < pc
        || (start_ip..end).contains(&abort_ip)
        || abort_ip < 4
        || end >= 1 << 47
    {
        return Found::Nothing;
    }
    let mut sig = [0u8; 4];
    if fetch(abort_ip - 4, &mut sig) != 4 || u32::from_le_bytes(sig) != RSEQ_SIG {
        return Found::Nothing;
    }
    // The code from the `lea` must fall straight through to the section's end.
    let (mut at, mut count) = (pc, 0u32);
    let (mut before_start, mut last_before_start) = (None, pc);
    while at != end {
        if at == start_ip {
            before_start = Some(count);
        }
        if count >= MAX_RUN_INSNS || at > end {
            return Found::Branchy(start_ip);
        }
        let n = fetch(at, &mut bytes);
        let i = itrace_decoders::x86::decode(64, at, &bytes[..n]);
        if !matches!(i.flow, Flow::Next | Flow::RepString) || i.len == 0 {
            return Found::Branchy(start_ip);
        }
        if before_start.is_none() {
            last_before_start = at;
        }
        count += 1;
        at += i.len as u64;
    }
    match before_start {
        Some(before_start) => {
            Found::Run(NativeRun { lea: pc, start_ip, end, abort_ip, before_start, last_before_start })
        }
        None => Found::Branchy(start_ip),
    }
}

/// `PTRACE_GET_RSEQ_CONFIGURATION` (Linux 5.13).
const PTRACE_GET_RSEQ_CONFIGURATION: libc::c_uint = 0x420f;

/// `struct ptrace_rseq_configuration`.
#[repr(C)]
#[derive(Default)]
struct RseqConfiguration {
    rseq_abi_pointer: u64,
    rseq_abi_size: u32,
    signature: u32,
    flags: u32,
    pad: u32,
}

/// Whether stopped thread `tid` of `pid` is inside an rseq critical section at `pc`: its
/// registered `struct rseq` names a descriptor whose section holds `pc`. Resumed there, the
/// kernel aborts the section (the stop was a preemption); run from the cache, it would not.
pub(super) fn in_critical_section(tid: i32, pid: i32, pc: u64) -> bool {
    let mut conf = RseqConfiguration::default();
    // SAFETY: the kernel writes at most `size_of::<RseqConfiguration>()` bytes (the size
    // argument) into `conf`, a repr(C) struct of that size.
    let r = unsafe {
        libc::ptrace(
            PTRACE_GET_RSEQ_CONFIGURATION,
            tid,
            std::mem::size_of::<RseqConfiguration>(),
            &mut conf as *mut RseqConfiguration as *mut libc::c_void,
        )
    };
    if r <= 0 || conf.rseq_abi_pointer == 0 {
        return false;
    }
    let mut word = [0u8; 8];
    if super::super::tables::read_mem(pid, conf.rseq_abi_pointer + 8, &mut word) != 8 {
        return false;
    }
    let desc_at = u64::from_le_bytes(word);
    let mut desc = [0u8; 32];
    if desc_at == 0 || super::super::tables::read_mem(pid, desc_at, &mut desc) != desc.len() {
        return false;
    }
    let start = u64::from_le_bytes(desc[8..16].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(desc[16..24].try_into().expect("8 bytes"));
    pc.wrapping_sub(start) < len
}

impl Session<'_> {
    /// The native run that starts at `tid`'s next instruction, begun: the thread leaves for it
    /// with breakpoints at the section's end and at its abort handler. False: none starts there.
    pub(in super::super) fn start_native_run(&mut self, tid: i32) -> bool {
        let Some(t) = self.threads.get(&tid) else { return false };
        if self.detaching.is_some() || t.state != ThreadState::Stepping || t.arch.isa().compat {
            return false;
        }
        let Some(p) = t.pending else { return false };
        let pid = t.pid;
        let Some(run) = self.cache_of(pid).and_then(|c| c.native_runs.get(&p.pc).copied()) else { return false };
        let t = &self.threads[&tid];
        let (dr0, dr1, dr7) = (t.arch.dr0, t.arch.dr1, t.arch.dr7);
        let want7 = DR7_DR0_EXEC | DR7_DR1_EXEC;
        // DR7 off first: the addresses change while no breakpoint is enabled.
        let writes = [
            (7, 0, dr7 != 0 && (dr0 != run.end || dr1 != run.abort_ip)),
            (0, run.end, dr0 != run.end),
            (1, run.abort_ip, dr1 != run.abort_ip),
            (7, want7, true),
        ];
        for (n, value, needed) in writes {
            if !needed {
                continue;
            }
            if let Err(e) = set_dr(tid, n, value) {
                self.after_resume(tid, Err(e));
                return true;
            }
            let t = self.threads.get_mut(&tid).expect("thread exists");
            match n {
                0 => t.arch.dr0 = value,
                1 => t.arch.dr1 = value,
                _ => t.arch.dr7 = value,
            }
        }
        self.unblock_trap_for_resume(tid, 0);
        let t = self.threads.get_mut(&tid).expect("thread exists");
        t.arch.hw_run = Some(Run { start: run.lea, stop: run.end, cond: None, rseq: Some(run) });
        t.arch.hw_stepped = false;
        t.injected = None;
        t.stopped = false;
        if let Err(e) = ptrace::cont(Pid::from_raw(tid), None) {
            self.threads.get_mut(&tid).expect("thread exists").arch.hw_run = None;
            self.after_resume(tid, Err(e));
        }
        self.arch.xl_stats.native_runs += 1;
        true
    }

    /// A SIGTRAP stop of a thread with no run in progress, from a debug-register breakpoint:
    /// a native run's, hit while the thread was stopping for something else (a group stop, our
    /// interrupt) that ended the run and counted it. Only itrace sets this thread's debug
    /// registers, and only translate mode's native runs when it does not block step.
    pub(in super::super) fn stale_native_run_hit(&self, tid: i32) -> bool {
        self.opts.step.translate
            && !self.opts.step.hw_step
            && self.threads.get(&tid).is_some_and(|t| t.arch.hw_run.is_none())
            && ptrace::getsiginfo(Pid::from_raw(tid)).is_ok_and(|si| si.si_code == TRAP_HWBKPT)
    }

    /// A native run ended (or was stopped): its breakpoints off, so that nothing of itrace is
    /// left in the thread should itrace die while it runs in the cache.
    pub(in super::super) fn end_native_run(&mut self, tid: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            if t.arch.dr7 != 0 && set_dr(tid, 7, 0).is_ok() {
                t.arch.dr7 = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A section as xl_rseq and librseq write it, at 0x1000, with its descriptor at 0x1100.
    fn memory() -> Vec<u8> {
        let mut m = vec![0u8; 0x120];
        let code: &[u8] = &[
            0x48, 0x8d, 0x05, 0xf9, 0x00, 0x00, 0x00, // 1000 lea rax,[rip+0xf9] (0x1100)
            0x48, 0x89, 0x47, 0x08, // 1007 mov [rdi+8],rax (rseq->rseq_cs)
            0x8b, 0x47, 0x04, // 100b start_ip: mov eax,[rdi+4] (cpu_id)
            0x48, 0x89, 0x02, // 100e mov [rdx],rax (the commit)
            0xeb, 0x06, // 1011 post-commit: jmp 1019
            0x53, 0x30, 0x05, 0x53, // 1013 RSEQ_SIG
            0xeb, 0xe7, // 1017 abort_ip: jmp 1000
        ];
        m[..code.len()].copy_from_slice(code);
        for (n, v) in [0u64, 0x100b, 6, 0x1017].iter().enumerate() {
            m[0x100 + n * 8..0x108 + n * 8].copy_from_slice(&v.to_le_bytes());
        }
        m
    }

    fn find(m: &[u8], pc: u64) -> Found {
        let mut fetch = |a: u64, buf: &mut [u8]| {
            let from = (a - 0x1000) as usize;
            let n = buf.len().min(m.len().saturating_sub(from));
            buf[..n].copy_from_slice(&m[from..from + n]);
            n
        };
        find_at(pc, &mut fetch)
    }

    #[test]
    fn finds_a_straight_section_from_its_descriptors_lea() {
        let m = memory();
        assert!(may_be_lea_rip(&m[..7]));
        assert!(!may_be_lea_rip(&m[7..]));
        let Found::Run(r) = find(&m, 0x1000) else { panic!("not found") };
        let want = NativeRun {
            lea: 0x1000,
            start_ip: 0x100b,
            end: 0x1011,
            abort_ip: 0x1017,
            before_start: 2,
            last_before_start: 0x1007,
        };
        assert_eq!(r, want);
        assert!(r.covers(0x1000) && r.covers(0x100e) && !r.covers(0x1011));
        assert!(matches!(find(&m, 0x1007), Found::Nothing));
    }

    #[test]
    fn a_branch_in_the_section_or_a_wrong_signature_is_no_native_run() {
        let mut m = memory();
        m[0xb..0xe].copy_from_slice(&[0x74, 0x01, 0x90]); // jz +1; nop
        assert!(matches!(find(&m, 0x1000), Found::Branchy(0x100b)));
        let mut m = memory();
        m[0x13] = 0x54;
        assert!(matches!(find(&m, 0x1000), Found::Nothing));
    }
}
