//! Translating one unit: the application's instructions from an entry address, through
//! conditional branches not taken, up to an unconditional control transfer (or an instruction
//! the cache does not run, or a size limit), rewritten to run from the code cache.
//!
//! What a unit is made of (iced-x86's block encoder lays it out and relocates RIP-relative
//! operands and branch displacements; nothing here encodes x86 by hand):
//! - the link slots of its direct exits (8-byte aligned data, at the start);
//! - the application's instructions, copied; a conditional branch's taken side jumps to an
//!   out-of-line stub; calls push the *application's* return address and returns pop it, so the
//!   stack holds application addresses only;
//! - at each taken exit a record stub appends `[exit id][target]` to the thread's ring
//!   (`layout.rs`) without touching the flags (`lea`, `jrcxz`, `not`, `movzx`), then goes on:
//!   direct exits through their link slot (a miss trap until the target is translated),
//!   indirect ones through the thread's lookup table (a miss trap when the target is not in it);
//! - a trap (a stop for itrace) is a system call: what `syscall` clobbers is spilled, then a
//!   `getpid` that itrace, tracing the thread under `PTRACE_SYSEMU`, sees as a syscall-entry
//!   stop and never lets run. The code after it is the way out of the cache when itrace is gone
//!   (the call then really runs): registers, flags and gs base back, on to the application
//!   address the trap stands for. A tracer that dies leaves no thread stopped at a signal it
//!   would then take (an `int3`'s SIGTRAP killed the program).
//!
//! A unit translated from code that may change without a system call (a writable mapping:
//! JITs, self-modifying code) starts with a **check** of its source bytes (`Check`): the
//! application's code, read 8 bytes at a time by RIP-relative loads, compared with the bytes
//! the unit was translated from, without touching the flags (`lea`, `jrcxz`); on a mismatch a
//! trap (`Trap::Rewritten`) has itrace drop the units of the changed bytes and translate the
//! code again. Links and lookup-table entries go to a unit's entry, so every way into a unit
//! runs its check. Units from read-only code have none.
//!
//! Every instruction that can fault runs when the application's state is the one before the
//! application instruction it stands for (the `Span`'s `start..commit`), so a fault maps back
//! to that instruction exactly, with nothing to undo (the check's loads: with the
//! application's rcx and rdx in the spill slots, `Check::spilled`).

use super::layout::*;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, Instruction, InstructionBlock, MemoryOperand,
    Mnemonic, OpKind, Register,
};
use itrace_decoders::Flow;
use itrace_format::BranchKind;

/// At most this many application instructions in one unit; longer straight-line code continues
/// in the next unit (a fall-through record carries the count).
pub(super) const MAX_UNIT_INSNS: u32 = 256;

/// Instruction pointers of the builder's own instructions and labels: non-canonical, so that no
/// application address (a RIP-relative operand's target) can be taken for one of them.
const FAKE_BASE: u64 = 0x8000_0000_0000_0000;

/// RIP-relative operands must reach their data from the cache (the block encoder's limit is
/// 2 GB; keep a margin for the unit's own size).
const RIP_REACH: u64 = 0x7000_0000;

/// What a record in the ring means.
#[derive(Clone, Copy, Debug)]
pub(super) struct Exit {
    /// The branch instruction.
    pub(super) from: u64,
    /// A direct exit's target (an indirect exit's is in the record).
    pub(super) to: u64,
    /// `None`: no branch (the size limit); its count carries on to the next record.
    pub(super) kind: Option<BranchKind>,
    /// Application instructions of the unit up to and including the branch.
    pub(super) count: u32,
    /// The target is in the record.
    pub(super) indirect: bool,
    /// The key its hops carry (`Hop::key`), given when its unit goes into the cache: no other
    /// exit of this itrace has it, so that it stands for `from`, `count` and `kind`.
    pub(super) key: u32,
}

/// What a trap of the cache asks of itrace.
#[derive(Clone, Copy, Debug)]
pub(super) enum Trap {
    /// A direct exit whose target has no unit yet: translate it, link the slot.
    Link { exit: u32, slot: u64 },
    /// An indirect branch whose target is not in the thread's table (target in `TARGET`).
    IndirectMiss,
    /// The ring is full: drain it, resume at `resume`. Its way out goes to `to`, the exit's
    /// target (`None`: an indirect exit's, in `TARGET`), with the application's rcx (and an
    /// indirect exit's rdx) in the record stub's spill slots.
    RingFull { resume: u64, to: Option<u64> },
    /// The next instruction (at `pc`) is not run from the cache: leave it, with `count`
    /// instructions of the unit done.
    Leave { pc: u64, count: u32 },
    /// The check at the entry of the unit at cache address `unit` found its source bytes
    /// rewritten: translate them again (nothing of the unit ran).
    Rewritten { unit: u64 },
}

/// Where application instruction `app_pc` is in the cache: its copy (or expansion) starts at
/// `start`; until `commit` the application's state is the one before it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) app_pc: u64,
    pub(super) start: u64,
    pub(super) commit: u64,
}

/// The check at the entry of a unit translated from code that may change without a system
/// call: it compares the application's code bytes with `source` and traps on a mismatch.
#[derive(Clone, Debug)]
pub(super) struct Check {
    /// The check's first instruction: the unit's entry.
    pub(super) start: u64,
    /// `start..end` of the check's code where the application's rcx and rdx are in the spill
    /// slots (`SPILL_RCX`, `SPILL_RDX`) and the registers hold the check's values: the loads of
    /// the code bytes, the only instructions of the check that can fault, are there.
    pub(super) spilled: (u64, u64),
    /// The application bytes the unit was translated from (`app_start..app_end`).
    pub(super) source: Vec<u8>,
}

/// A translated unit, encoded for its cache address.
#[derive(Clone)]
pub(super) struct Unit {
    pub(super) app_start: u64,
    /// Application bytes translated: `app_start..app_end`.
    pub(super) app_end: u64,
    pub(super) cache_start: u64,
    pub(super) code: Vec<u8>,
    /// One per application instruction, in order (the first one's `start` is the entry).
    pub(super) spans: Vec<Span>,
    /// The traps' `syscall` addresses and what they mean.
    pub(super) traps: Vec<(u64, Trap)>,
    /// The unit's exits, numbered from the `first_exit` it was built with.
    pub(super) exits: Vec<Exit>,
    /// Direct exits: (link slot address, the start of its miss trap, target).
    pub(super) links: Vec<(u64, u64, u64)>,
    /// The check of its source bytes, for a unit from code that may change unseen.
    pub(super) check: Option<Check>,
}

impl Unit {
    /// Where every way into the unit goes: its check, if it has one, else its first
    /// instruction.
    pub(super) fn entry(&self) -> u64 {
        self.check.as_ref().map_or(self.spans[0].start, |c| c.start)
    }

    /// The unit's first application instruction, past its check.
    pub(super) fn first_instruction(&self) -> u64 {
        self.spans[0].start
    }

    pub(super) fn cache_end(&self) -> u64 {
        self.cache_start + self.code.len() as u64
    }

    /// Where its last instruction goes, if it is a direct jump or call (or the size limit's
    /// fall-through): where a thread that runs the unit through goes next.
    pub(super) fn goes_on_to(&self) -> Option<u64> {
        self.exits
            .last()
            .filter(|e| !e.indirect && matches!(e.kind, None | Some(BranchKind::Jump | BranchKind::Call)))
            .map(|e| e.to)
    }

    /// Where a return from the call that ends the unit goes: the instruction after the call
    /// (the unit's last), if a call ends it.
    pub(super) fn returns_to(&self) -> Option<u64> {
        // A call is the unit's last instruction and its last exit (the taken sides of its
        // conditional branches come before it).
        self.exits.last().filter(|e| e.kind == Some(BranchKind::Call)).map(|_| self.app_end)
    }
}

/// Why a unit could not be made (the thread is stepped there instead).
#[derive(Debug, thiserror::Error)]
pub(super) enum TranslateError {
    #[error("the first instruction is not run from the cache")]
    NotTranslatable,
    #[error("encoding failed: {0}")]
    Encode(String),
}

/// How the cache runs one application instruction.
enum Kind {
    /// Not from the cache: the thread leaves before it (system calls, interrupts, far
    /// transfers, gs, transactions, undecodable bytes, data out of reach).
    Special,
    /// Copied as it is (the block encoder relocates a RIP-relative operand).
    Copy,
    /// Runs as a `nop` (a conditional branch to the next instruction).
    Nop,
    /// `jcc`, `loop*`, `jrcxz` to `target`.
    CondJump {
        target: u64,
    },
    DirectJump {
        target: u64,
    },
    DirectCall {
        target: u64,
    },
    /// `jmp`/`call` through a register or memory.
    IndirectJump,
    IndirectCall,
    /// `ret` / `ret imm16`.
    Return {
        pop: u16,
    },
}

fn classify(i: &Instruction, flow: Flow, cache_at: u64) -> Kind {
    let next = i.next_ip();
    let uses_gs = i.segment_prefix() == Register::GS
        || (0..i.op_count()).any(|n| i.op_kind(n) == OpKind::Register && i.op_register(n) == Register::GS)
        || matches!(i.mnemonic(), Mnemonic::Rdgsbase | Mnemonic::Wrgsbase | Mnemonic::Swapgs | Mnemonic::Lgs);
    if uses_gs {
        return Kind::Special;
    }
    if i.is_ip_rel_memory_operand() && i.ip_rel_memory_address().abs_diff(cache_at) > RIP_REACH {
        return Kind::Special;
    }
    match flow {
        Flow::Next | Flow::RepString => match i.mnemonic() {
            // The abort path is a relative address: it would leave the cache natively.
            Mnemonic::Xbegin => Kind::Special,
            _ => Kind::Copy,
        },
        Flow::CondJump if i.is_jcc_short_or_near() || i.is_loop() || i.is_loopcc() || i.is_jcx_short() => {
            let target = i.near_branch_target();
            if target == next {
                // Taken or not, it lands on the next instruction: never a taken branch to
                // record, and nothing else happens (a copy would keep its absolute target).
                Kind::Nop
            } else {
                Kind::CondJump { target }
            }
        }
        Flow::Jump => match i.code() {
            Code::Jmp_rel8_64 | Code::Jmp_rel32_64 => Kind::DirectJump { target: i.near_branch_target() },
            Code::Jmp_rm64 => Kind::IndirectJump,
            _ => Kind::Special,
        },
        Flow::Call => match i.code() {
            Code::Call_rel32_64 => Kind::DirectCall { target: i.near_branch_target() },
            Code::Call_rm64 => Kind::IndirectCall,
            _ => Kind::Special,
        },
        Flow::Return => match i.code() {
            Code::Retnq => Kind::Return { pop: 0 },
            Code::Retnq_imm16 => Kind::Return { pop: i.immediate16() },
            _ => Kind::Special,
        },
        _ => Kind::Special,
    }
}

/// A gs-relative absolute operand (`gs:[disp]`).
fn gs(disp: i64) -> MemoryOperand {
    MemoryOperand::new(Register::None, Register::None, 1, disp, 4, false, Register::GS)
}

/// `gs:[base + index*scale + disp]`.
fn gs_at(base: Register, index: Register, scale: u32, disp: i64) -> MemoryOperand {
    MemoryOperand::new(base, index, scale, disp, displ_size(base, disp), false, Register::GS)
}

fn mem(base: Register, index: Register, scale: u32, disp: i64) -> MemoryOperand {
    MemoryOperand::new(base, index, scale, disp, displ_size(base, disp), false, Register::None)
}

/// The displacement size to ask of the encoder: none, the smallest that fits (1), or 32 bits
/// where there is no base register.
fn displ_size(base: Register, disp: i64) -> u32 {
    match (base, disp) {
        (Register::None, _) => 4,
        (_, 0) => 0,
        _ => 1,
    }
}

/// The instruction list of a unit, with labels: every instruction gets a fake ip, a label is the
/// fake ip of the instruction bound to it.
struct Builder {
    insns: Vec<Instruction>,
    next_fake: u64,
    bound: Option<u64>,
    /// Slots first (they are moved to the front), kept apart.
    slots: Vec<Instruction>,
    error: Option<String>,
    /// The label of the unit's way out (`emit_way_out`), once a trap needs it.
    way_out: Option<u64>,
}

/// Where a trap goes when its `syscall` really runs (itrace is gone): out of the cache, to
/// the application address it stands for.
enum WayOut {
    /// To this address.
    To(u64),
    /// To the indirect branch's target (`TARGET`).
    Target,
    /// A full ring's, after the record of a direct exit to this address: the record stub has
    /// the application's rcx spilled.
    FullTo(u64),
    /// A full ring's, after an indirect exit's record (rcx and rdx spilled).
    FullTarget,
}

/// How far below the application's rsp the way out puts what it pushes: past the red zone.
const WAY_OUT_STACK: i64 = 256;
/// `arch_prctl`'s code to set the gs base.
const ARCH_SET_GS: u32 = 0x1001;

impl Builder {
    fn label(&mut self) -> u64 {
        self.next_fake += 1;
        FAKE_BASE + self.next_fake
    }

    fn bind(&mut self, label: u64) {
        debug_assert!(self.bound.is_none(), "two labels on one instruction");
        self.bound = Some(label);
    }

    /// Append; returns the instruction's index.
    fn push(&mut self, i: Result<Instruction, iced_x86::IcedError>) -> usize {
        let mut i = match i {
            Ok(i) => i,
            Err(e) => {
                self.error.get_or_insert_with(|| e.to_string());
                Instruction::with(Code::Nopd)
            }
        };
        let ip = match self.bound.take() {
            Some(l) => l,
            None => self.label(),
        };
        i.set_ip(ip);
        self.insns.push(i);
        self.insns.len() - 1
    }

    /// A stop for itrace: spill what `syscall` clobbers, then `getpid`, which the thread's
    /// tracer sees as a syscall-entry stop and skips (`PTRACE_SYSEMU`). After it, the way out
    /// of the cache for when the call really ran: itrace is gone. Returns the index of the
    /// trap's first instruction (where a jump to the trap goes) and of its `syscall`.
    fn trap(&mut self, out: WayOut) -> (usize, usize) {
        use Register::*;
        let first = self.push(Instruction::with2(Code::Mov_rm64_r64, gs(TRAP_RAX), RAX));
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(TRAP_RCX), RCX));
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(TRAP_R11), R11));
        self.push(Instruction::with2(Code::Mov_r32_imm32, EAX, libc::SYS_getpid as u32));
        let syscall = self.push(Ok(Instruction::with(Code::Syscall)));
        if let WayOut::FullTo(_) | WayOut::FullTarget = out {
            // A record stub's: the application's rcx (and an indirect one's rdx) is spilled.
            self.push(Instruction::with2(Code::Mov_r64_rm64, RCX, gs(SPILL_RCX)));
            self.push(Instruction::with2(Code::Mov_rm64_r64, gs(TRAP_RCX), RCX));
            if let WayOut::FullTarget = out {
                self.push(Instruction::with2(Code::Mov_r64_rm64, RDX, gs(SPILL_RDX)));
            }
        }
        // Below the red zone: the application's data there stays as it is.
        let below = mem(RSP, None, 1, -WAY_OUT_STACK);
        self.push(Instruction::with2(Code::Lea_r64_m, RSP, below));
        match out {
            WayOut::To(pc) | WayOut::FullTo(pc) => self.push_address(pc),
            WayOut::Target | WayOut::FullTarget => {
                self.push(Instruction::with1(Code::Push_rm64, gs(TARGET)));
            }
        }
        let way_out = match self.way_out {
            Some(l) => l,
            Option::None => {
                let l = self.label();
                self.way_out = Some(l);
                l
            }
        };
        self.push(Instruction::with_branch(Code::Jmp_rel32_64, way_out));
        (first, syscall)
    }

    /// The unit's way out of the cache (if a trap jumps to it): the application's target is on
    /// the stack, `WAY_OUT_STACK` bytes below its rsp. Put back the registers a trap spilled
    /// and the application's gs base (`arch_prctl`: `syscall` keeps the flags), and return to
    /// the target, the stack as it was.
    fn emit_way_out(&mut self) {
        use Register::*;
        let Some(label) = self.way_out else { return };
        self.bind(label);
        self.push(Instruction::with1(Code::Push_rm64, gs(TRAP_RCX)));
        self.push(Instruction::with1(Code::Push_rm64, gs(TRAP_R11)));
        self.push(Instruction::with1(Code::Push_rm64, gs(TRAP_RAX)));
        self.push(Instruction::with1(Code::Push_r64, RDI));
        self.push(Instruction::with1(Code::Push_r64, RSI));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RSI, gs(APP_GS)));
        self.push(Instruction::with2(Code::Mov_r32_imm32, EDI, ARCH_SET_GS));
        self.push(Instruction::with2(Code::Mov_r32_imm32, EAX, libc::SYS_arch_prctl as u32));
        self.push(Ok(Instruction::with(Code::Syscall)));
        self.push(Instruction::with1(Code::Pop_r64, RSI));
        self.push(Instruction::with1(Code::Pop_r64, RDI));
        self.push(Instruction::with1(Code::Pop_r64, RAX));
        self.push(Instruction::with1(Code::Pop_r64, R11));
        self.push(Instruction::with1(Code::Pop_r64, RCX));
        self.push(Instruction::with1(Code::Retnq_imm16, WAY_OUT_STACK as u32));
    }

    /// A link slot (8-byte data at the unit's start); returns its label.
    fn slot(&mut self) -> u64 {
        let l = self.label();
        let mut q = Instruction::with_declare_qword_1(0);
        q.set_ip(l);
        self.slots.push(q);
        l
    }

    /// Append `[exit]` to the ring; rcx is the application's again after it. Returns the
    /// label of the resume point of a full ring and the label of its `int3`. For an exit of no
    /// `branch`, `NO_BRANCH` counts the record too (first: a full ring's stop must find both).
    fn record_direct(&mut self, exit: u32, branch: bool) -> (u64, u64) {
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(SPILL_RCX), Register::RCX));
        if !branch {
            self.push(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, gs(NO_BRANCH)));
            self.push(Instruction::with2(Code::Lea_r64_m, Register::RCX, mem(Register::RCX, Register::None, 1, 1)));
            self.push(Instruction::with2(Code::Mov_rm64_r64, gs(NO_BRANCH), Register::RCX));
        }
        self.push(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, gs(RING_OFF)));
        self.push(Instruction::with2(Code::Mov_rm64_imm32, gs_at(Register::RCX, Register::None, 1, RING_END), exit));
        self.push(Instruction::with2(
            Code::Lea_r64_m,
            Register::RCX,
            mem(Register::RCX, Register::None, 1, RECORD_BYTES),
        ));
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(RING_OFF), Register::RCX));
        let (full, back) = (self.label(), self.label());
        self.push(Instruction::with_branch(Code::Jrcxz_rel8_64, full));
        self.bind(back);
        self.push(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, gs(SPILL_RCX)));
        (back, full)
    }

    /// Go to the unit of application address `target` through a link slot. Returns (slot label,
    /// the miss trap's first instruction and `syscall` indexes).
    fn direct_jump(&mut self, target: u64) -> (u64, usize, usize) {
        let slot = self.slot();
        self.push(Instruction::with1(Code::Jmp_rm64, MemoryOperand::with_base_displ(Register::RIP, slot as i64)));
        let (miss, syscall) = self.trap(WayOut::To(target));
        (slot, miss, syscall)
    }

    /// The full-ring trap of a record stub, bound to `full`; its `syscall` index. `out` is
    /// `FullTo` the exit's target or `FullTarget`. When threads encode their own rings
    /// (`self_encode`), `full` first goes to the cache's routine (`self_encode_routine`),
    /// which goes on at `back` (the ring encoded and emptied) or at the trap.
    fn full_trap(&mut self, full: u64, back: u64, out: WayOut) -> usize {
        use Register::*;
        self.bind(full);
        if self_encode() {
            let trap = self.label();
            self.push(Instruction::with2(Code::Lea_r64_m, RCX, MemoryOperand::with_base_displ(RIP, back as i64)));
            self.push(Instruction::with2(Code::Mov_rm64_r64, gs(XL_BACK), RCX));
            self.push(Instruction::with2(Code::Lea_r64_m, RCX, MemoryOperand::with_base_displ(RIP, trap as i64)));
            self.push(Instruction::with2(Code::Mov_rm64_r64, gs(XL_TRAP), RCX));
            self.push(Instruction::with1(Code::Jmp_rm64, gs(XL_ROUTINE)));
            self.bind(trap);
        }
        self.trap(out).1
    }

    /// Append `[exit][gs:TARGET]` to the ring and go to the target's unit through the thread's
    /// table. Returns (resume label, full label, the miss trap's `syscall` index).
    fn record_indirect_and_lookup(&mut self, exit: u32) -> (u64, u64, usize) {
        use Register::*;
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(SPILL_RCX), RCX));
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(SPILL_RDX), RDX));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RCX, gs(RING_OFF)));
        self.push(Instruction::with2(Code::Mov_rm64_imm32, gs_at(RCX, None, 1, RING_END), exit));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RDX, gs(TARGET)));
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs_at(RCX, None, 1, RING_END + 8), RDX));
        self.push(Instruction::with2(Code::Lea_r64_m, RCX, mem(RCX, None, 1, RECORD_BYTES)));
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(RING_OFF), RCX));
        let (full, back, hit) = (self.label(), self.label(), self.label());
        self.push(Instruction::with_branch(Code::Jrcxz_rel8_64, full));
        // rcx = table[target & 0xffff].pc - target, without flags.
        self.bind(back);
        self.push(Instruction::with2(Code::Movzx_r32_rm16, ECX, DX));
        self.push(Instruction::with2(Code::Lea_r64_m, RCX, mem(RCX, RCX, 1, 0)));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RCX, gs_at(None, RCX, 8, TABLE)));
        self.push(Instruction::with1(Code::Not_rm64, RDX));
        self.push(Instruction::with2(Code::Lea_r64_m, RCX, mem(RCX, RDX, 1, 1)));
        self.push(Instruction::with_branch(Code::Jrcxz_rel8_64, hit));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RCX, gs(SPILL_RCX)));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RDX, gs(SPILL_RDX)));
        let miss = self.trap(WayOut::Target).1;
        self.bind(hit);
        self.push(Instruction::with2(Code::Mov_r64_rm64, RDX, gs(TARGET)));
        self.push(Instruction::with2(Code::Movzx_r32_rm16, ECX, DX));
        self.push(Instruction::with2(Code::Lea_r64_m, RCX, mem(RCX, RCX, 1, 0)));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RCX, gs_at(None, RCX, 8, TABLE + 8)));
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(JUMP), RCX));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RCX, gs(SPILL_RCX)));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RDX, gs(SPILL_RDX)));
        self.push(Instruction::with1(Code::Jmp_rm64, gs(JUMP)));
        (back, full, miss)
    }

    /// Put the branch target of `i` (a register or memory operand) in `gs:TARGET`, reading it
    /// as the application instruction would.
    fn fetch_target(&mut self, i: &Instruction) {
        match i.op0_kind() {
            OpKind::Register => {
                self.push(Instruction::with2(Code::Mov_rm64_r64, gs(TARGET), i.op0_register()));
            }
            _ => {
                let m = MemoryOperand::new(
                    i.memory_base(),
                    i.memory_index(),
                    i.memory_index_scale(),
                    i.memory_displacement64() as i64,
                    i.memory_displ_size(),
                    false,
                    i.segment_prefix(),
                );
                self.push(Instruction::with2(Code::Mov_rm64_r64, gs(SPILL_RCX), Register::RCX));
                self.push(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, m));
                self.push(Instruction::with2(Code::Mov_rm64_r64, gs(TARGET), Register::RCX));
                self.push(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, gs(SPILL_RCX)));
            }
        }
    }

    /// Push the application address `ret` (faults, if at all, on its first instruction).
    fn push_address(&mut self, ret: u64) {
        self.push(Instruction::with1(Code::Pushq_imm32, ret as u32 as i32));
        if (ret as i64) != (ret as u32 as i32 as i64) {
            let hi = MemoryOperand::with_base_displ(Register::RSP, 4);
            self.push(Instruction::with2(Code::Mov_rm32_imm32, hi, (ret >> 32) as u32));
        }
    }

    /// The check of a unit's source bytes (`source`, translated from application address
    /// `start`): each piece of the application's code is loaded into rcx (RIP-relative: the
    /// cache is within reach of the code) and compared with the bytes translated, without
    /// touching the flags: `rcx - expected` by `lea`, then `jrcxz` over the jump to `mismatch`.
    /// rcx and rdx are spilled first and put back after. Returns the labels of the check's
    /// first instruction, of its first load and of the restore after its last comparison.
    fn check_source(&mut self, start: u64, source: &[u8], mismatch: u64) -> (u64, u64, u64) {
        use Register::*;
        let (entry, spilled, restore) = (self.label(), self.label(), self.label());
        self.bind(entry);
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(SPILL_RCX), RCX));
        self.push(Instruction::with2(Code::Mov_rm64_r64, gs(SPILL_RDX), RDX));
        let pieces = check_pieces(source.len());
        for (n, &(offset, size)) in pieces.iter().enumerate() {
            if n == 0 {
                self.bind(spilled);
            }
            let code = MemoryOperand::with_base_displ(RIP, (start + offset as u64) as i64);
            let mut bytes = [0u8; 8];
            bytes[..size].copy_from_slice(&source[offset..offset + size]);
            let expected = u64::from_le_bytes(bytes);
            match size {
                8 => {
                    self.push(Instruction::with2(Code::Mov_r64_rm64, RCX, code));
                    // rcx + !expected + 1 = rcx - expected.
                    self.push(Instruction::with2(Code::Mov_r64_imm64, RDX, !expected));
                    self.push(Instruction::with2(Code::Lea_r64_m, RCX, mem(RCX, RDX, 1, 1)));
                }
                _ => {
                    let load = match size {
                        4 => Code::Mov_r32_rm32,
                        2 => Code::Movzx_r32_rm16,
                        _ => Code::Movzx_r32_rm8,
                    };
                    self.push(Instruction::with2(load, ECX, code));
                    // A 32-bit `lea`: (ecx - expected) mod 2^32, zero-extended into rcx.
                    let minus = (expected as u32).wrapping_neg() as i32 as i64;
                    self.push(Instruction::with2(Code::Lea_r32_m, ECX, mem(RCX, None, 1, minus)));
                }
            }
            let same = if n + 1 == pieces.len() { restore } else { self.label() };
            self.push(Instruction::with_branch(Code::Jrcxz_rel8_64, same));
            self.push(Instruction::with_branch(Code::Jmp_rel32_64, mismatch));
            if n + 1 < pieces.len() {
                self.bind(same);
            }
        }
        self.bind(restore);
        self.push(Instruction::with2(Code::Mov_r64_rm64, RCX, gs(SPILL_RCX)));
        self.push(Instruction::with2(Code::Mov_r64_rm64, RDX, gs(SPILL_RDX)));
        (entry, spilled, restore)
    }
}

/// The pieces (offset, size) a check loads to compare `len` bytes: 8 bytes each (4, 2 or 1 for
/// fewer than 8), the last one overlapping the one before rather than reading past the end
/// (the byte after a unit may be on a page that is not mapped).
fn check_pieces(len: usize) -> Vec<(usize, usize)> {
    let Some(size) = [8, 4, 2, 1].into_iter().find(|&s| s <= len) else { return Vec::new() };
    let mut pieces: Vec<(usize, usize)> = (0..len / size).map(|k| (k * size, size)).collect();
    if len % size != 0 {
        pieces.push((len - size, size));
    }
    pieces
}

/// A stub to emit after the main path: a conditional branch's taken side.
struct TakenStub {
    label: u64,
    exit: u32,
    target: u64,
}

/// Where things are, as instruction indexes, until the layout gives addresses.
struct Pending {
    /// (app pc, start index, commit index)
    spans: Vec<(u64, usize, usize)>,
    /// (trap's `syscall` index, what it means; labels for RingFull's resume)
    traps: Vec<(usize, PendingTrap)>,
    /// (slot label, miss trap's first instruction index, target)
    links: Vec<(u64, usize, u64)>,
}

enum PendingTrap {
    Link { exit: u32, slot: u64 },
    IndirectMiss,
    RingFull { resume: u64, to: Option<u64> },
    Leave { pc: u64, count: u32 },
    Rewritten,
}

/// Translate the unit at application address `start` for cache address `cache_at` (8-byte
/// aligned). `fetch` reads application code (up to the buffer's length; fewer bytes where the
/// mapping ends); `stop_before` says where a unit must end before an instruction (region
/// triggers, an rseq critical section's way in), given its address and bytes, unless it is the
/// first; `may_change` says whether the code in `start..end` may be rewritten without a system
/// call (the unit then starts with a check of its bytes). Exits are numbered from `first_exit`.
pub(super) fn translate(
    start: u64,
    cache_at: u64,
    first_exit: u32,
    fetch: &mut dyn FnMut(u64, &mut [u8]) -> usize,
    stop_before: &dyn Fn(u64, &[u8]) -> bool,
    may_change: &dyn Fn(u64, u64) -> bool,
) -> Result<Unit, TranslateError> {
    let mut b = Builder { insns: Vec::new(), next_fake: 0, bound: None, slots: Vec::new(), error: None, way_out: None };
    let mut p = Pending { spans: Vec::new(), traps: Vec::new(), links: Vec::new() };
    let mut exits: Vec<Exit> = Vec::new();
    let mut taken: Vec<TakenStub> = Vec::new();
    let mut pc = start;
    // The end of the last application instruction the unit holds.
    let mut end = start;
    let mut count: u32 = 0;
    // The bytes of the instructions the unit holds, as decoded (`start..end`).
    let mut source: Vec<u8> = Vec::new();
    let new_exit = |exits: &mut Vec<Exit>, e: Exit| {
        exits.push(e);
        first_exit + exits.len() as u32 - 1
    };
    loop {
        let mut bytes = [0u8; itrace_decoders::x86::MAX_INSN_LEN];
        let n = fetch(pc, &mut bytes);
        if count > 0 && stop_before(pc, &bytes[..n]) {
            let (_, i) = b.trap(WayOut::To(pc));
            p.traps.push((i, PendingTrap::Leave { pc, count }));
            break;
        }
        if count >= MAX_UNIT_INSNS {
            let exit = new_exit(&mut exits, Exit { from: pc, to: pc, kind: None, count, indirect: false, key: 0 });
            let (back, full) = b.record_direct(exit, false);
            let (slot, miss, sc) = b.direct_jump(pc);
            p.links.push((slot, miss, pc));
            p.traps.push((sc, PendingTrap::Link { exit, slot }));
            let f = b.full_trap(full, back, WayOut::FullTo(pc));
            p.traps.push((f, PendingTrap::RingFull { resume: back, to: Some(pc) }));
            break;
        }
        let flow = itrace_decoders::x86::decode(64, pc, &bytes[..n]).flow;
        let mut decoder = Decoder::with_ip(64, &bytes[..n], pc, DecoderOptions::NONE);
        let insn = decoder.decode();
        let kind = if insn.is_invalid() { Kind::Special } else { classify(&insn, flow, cache_at) };
        let next = insn.next_ip();
        let span_start = b.insns.len();
        if !matches!(kind, Kind::Special) {
            end = next;
            source.extend_from_slice(&bytes[..insn.len()]);
        }
        match kind {
            Kind::Special => {
                if count == 0 {
                    return Err(TranslateError::NotTranslatable);
                }
                let (_, i) = b.trap(WayOut::To(pc));
                p.traps.push((i, PendingTrap::Leave { pc, count }));
                break;
            }
            Kind::Copy | Kind::Nop => {
                b.push(Ok(if matches!(kind, Kind::Nop) { Instruction::with(Code::Nopd) } else { insn }));
                count += 1;
                p.spans.push((pc, span_start, span_start + 1));
                pc = next;
            }
            Kind::CondJump { target } => {
                count += 1;
                let exit = new_exit(
                    &mut exits,
                    Exit { from: pc, to: target, kind: Some(BranchKind::CondJump), count, indirect: false, key: 0 },
                );
                let label = b.label();
                let mut j = insn;
                if insn.is_jcc_short_or_near() {
                    j.set_near_branch64(label);
                    b.push(Ok(j));
                } else {
                    // loop*/jrcxz have only a short form: hop through a near jump.
                    let (far, over) = (b.label(), b.label());
                    j.set_near_branch64(far);
                    b.push(Ok(j));
                    b.push(Instruction::with_branch(Code::Jmp_rel8_64, over));
                    b.bind(far);
                    b.push(Instruction::with_branch(Code::Jmp_rel32_64, label));
                    b.bind(over);
                }
                p.spans.push((pc, span_start, span_start + 1));
                taken.push(TakenStub { label, exit, target });
                pc = next;
            }
            Kind::DirectJump { target } | Kind::DirectCall { target } => {
                let call = matches!(kind, Kind::DirectCall { .. });
                if call {
                    b.push_address(next);
                }
                count += 1;
                let bk = if call { BranchKind::Call } else { BranchKind::Jump };
                let exit =
                    new_exit(&mut exits, Exit { from: pc, to: target, kind: Some(bk), count, indirect: false, key: 0 });
                let commit = b.insns.len();
                p.spans.push((pc, span_start, if call { span_start + 1 } else { commit.max(span_start) }));
                let (back, full) = b.record_direct(exit, true);
                let (slot, miss, sc) = b.direct_jump(target);
                p.links.push((slot, miss, target));
                p.traps.push((sc, PendingTrap::Link { exit, slot }));
                let f = b.full_trap(full, back, WayOut::FullTo(target));
                p.traps.push((f, PendingTrap::RingFull { resume: back, to: Some(target) }));
                break;
            }
            Kind::IndirectJump | Kind::IndirectCall | Kind::Return { .. } => {
                let bk = match kind {
                    Kind::IndirectJump => {
                        b.fetch_target(&insn);
                        BranchKind::Jump
                    }
                    Kind::IndirectCall => {
                        b.fetch_target(&insn);
                        b.push_address(next);
                        BranchKind::Call
                    }
                    Kind::Return { pop } => {
                        b.push(Instruction::with1(Code::Pop_rm64, gs(TARGET)));
                        if pop != 0 {
                            let m = MemoryOperand::with_base_displ(Register::RSP, pop as i64);
                            b.push(Instruction::with2(Code::Lea_r64_m, Register::RSP, m));
                        }
                        BranchKind::Return
                    }
                    _ => unreachable!("indirect kinds only"),
                };
                count += 1;
                // Faults are possible up to the return address push (or the pop): the state is
                // the one before the instruction until then.
                let commit = match kind {
                    Kind::Return { .. } => span_start + 1,
                    Kind::IndirectJump => b.insns.len(),
                    _ => b.insns.len() - if (next as i64) != (next as u32 as i32 as i64) { 1 } else { 0 },
                };
                p.spans.push((pc, span_start, commit));
                let exit =
                    new_exit(&mut exits, Exit { from: pc, to: 0, kind: Some(bk), count, indirect: true, key: 0 });
                let (back, full, miss) = b.record_indirect_and_lookup(exit);
                p.traps.push((miss, PendingTrap::IndirectMiss));
                let f = b.full_trap(full, back, WayOut::FullTarget);
                p.traps.push((f, PendingTrap::RingFull { resume: back, to: None }));
                break;
            }
        }
    }
    for s in taken {
        b.bind(s.label);
        let (back, full) = b.record_direct(s.exit, true);
        let (slot, miss, sc) = b.direct_jump(s.target);
        p.links.push((slot, miss, s.target));
        p.traps.push((sc, PendingTrap::Link { exit: s.exit, slot }));
        let f = b.full_trap(full, back, WayOut::FullTo(s.target));
        p.traps.push((f, PendingTrap::RingFull { resume: back, to: Some(s.target) }));
    }
    // The check, for code that may change unseen: its mismatch trap goes at the end, the
    // check itself before the unit's first instruction (`check_insns`).
    let mut check_insns = Vec::new();
    let mut check_labels = None;
    if !source.is_empty() && may_change(start, end) {
        let mismatch = b.label();
        b.bind(mismatch);
        // The application's rcx and rdx back: the trap spills what it needs itself.
        b.push(Instruction::with2(Code::Mov_r64_rm64, Register::RCX, gs(SPILL_RCX)));
        b.push(Instruction::with2(Code::Mov_r64_rm64, Register::RDX, gs(SPILL_RDX)));
        let (_, sc) = b.trap(WayOut::To(start));
        p.traps.push((sc, PendingTrap::Rewritten));
        let main = std::mem::take(&mut b.insns);
        check_labels = Some(b.check_source(start, &source, mismatch));
        check_insns = std::mem::replace(&mut b.insns, main);
    }
    b.emit_way_out();
    if let Some(e) = b.error.take() {
        return Err(TranslateError::Encode(e));
    }
    // Slots first, so that they are 8-byte aligned at the (aligned) unit start; the check
    // next, falling through to the first instruction.
    let before = b.slots.len() + check_insns.len();
    let mut all = std::mem::take(&mut b.slots);
    all.extend(check_insns);
    all.extend(b.insns.iter().copied());
    let block = InstructionBlock::new(&all, cache_at);
    let out = BlockEncoder::encode(64, block, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .map_err(|e| TranslateError::Encode(e.to_string()))?;
    let mut code = out.code_buffer;
    let offsets = out.new_instruction_offsets;
    let at = |index: usize| -> Result<u64, TranslateError> {
        match offsets.get(index + before) {
            Some(&o) if o != u32::MAX => Ok(cache_at + o as u64),
            _ => Err(TranslateError::Encode(format!("instruction {index} was rewritten"))),
        }
    };
    // Labels (fake ips) to addresses.
    let by_ip: rustc_hash::FxHashMap<u64, usize> = all.iter().enumerate().map(|(n, i)| (i.ip(), n)).collect();
    let label_at = |label: u64| -> Result<u64, TranslateError> {
        let n = by_ip.get(&label).ok_or_else(|| TranslateError::Encode("unbound label".into()))?;
        match offsets.get(*n) {
            Some(&o) if o != u32::MAX => Ok(cache_at + o as u64),
            _ => Err(TranslateError::Encode("label on a rewritten instruction".into())),
        }
    };
    let mut spans = Vec::with_capacity(p.spans.len());
    for (app_pc, s, c) in p.spans {
        spans.push(Span { app_pc, start: at(s)?, commit: at(c)? });
    }
    let mut traps = Vec::with_capacity(p.traps.len());
    for (i, t) in p.traps {
        let t = match t {
            PendingTrap::Link { exit, slot } => Trap::Link { exit, slot: label_at(slot)? },
            PendingTrap::IndirectMiss => Trap::IndirectMiss,
            PendingTrap::RingFull { resume, to } => Trap::RingFull { resume: label_at(resume)?, to },
            PendingTrap::Leave { pc, count } => Trap::Leave { pc, count },
            PendingTrap::Rewritten => Trap::Rewritten { unit: cache_at },
        };
        traps.push((at(i)?, t));
    }
    let mut links = Vec::with_capacity(p.links.len());
    for (slot, miss, target) in p.links {
        let (slot, miss) = (label_at(slot)?, at(miss)?);
        // Until linked, a slot sends its exit to the miss trap.
        let o = (slot - cache_at) as usize;
        code[o..o + 8].copy_from_slice(&miss.to_le_bytes());
        links.push((slot, miss, target));
    }
    if spans.is_empty() {
        return Err(TranslateError::NotTranslatable);
    }
    let check = match check_labels {
        Some((entry, spilled, restore)) => {
            Some(Check { start: label_at(entry)?, spilled: (label_at(spilled)?, label_at(restore)?), source })
        }
        None => None,
    };
    Ok(Unit { app_start: start, app_end: end, cache_start: cache_at, code, spans, traps, exits, links, check })
}

/// The registers a system call itrace makes in a thread changes, in the order of the remote
/// gadget's save area (then the pc to go back to).
pub(super) const REMOTE_SAVED: [Register; 9] = [
    Register::RAX,
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::R10,
    Register::R8,
    Register::R9,
    Register::RCX,
    Register::R11,
];
/// The save area's size: the registers and the pc.
pub(super) const REMOTE_SAVE_BYTES: u64 = (REMOTE_SAVED.len() as u64 + 1) * 8;

/// The `syscall` itrace makes its own system calls with in a thread (mmap of the cache and of
/// state blocks), for `at` in the cache: a save area of the thread's registers and pc (written
/// by itrace before each call), then `syscall`, then the way back should itrace die during the
/// call: the registers from the save area, a jump to the saved pc. Returns the bytes and the
/// address of the `syscall`.
pub(super) fn remote_call_gadget(at: u64) -> Result<(Vec<u8>, u64), TranslateError> {
    let encode = |e: iced_x86::IcedError| TranslateError::Encode(e.to_string());
    let code_at = at + REMOTE_SAVE_BYTES;
    let mut insns = vec![Instruction::with(Code::Syscall)];
    for (n, &r) in REMOTE_SAVED.iter().enumerate() {
        let slot = MemoryOperand::with_base_displ(Register::RIP, (at + 8 * n as u64) as i64);
        insns.push(Instruction::with2(Code::Mov_r64_rm64, r, slot).map_err(encode)?);
    }
    let pc = MemoryOperand::with_base_displ(Register::RIP, (at + 8 * REMOTE_SAVED.len() as u64) as i64);
    insns.push(Instruction::with1(Code::Jmp_rm64, pc).map_err(encode)?);
    let out = BlockEncoder::encode(64, InstructionBlock::new(&insns, code_at), BlockEncoderOptions::NONE)
        .map_err(|e| TranslateError::Encode(e.to_string()))?;
    let mut bytes = vec![0u8; REMOTE_SAVE_BYTES as usize];
    bytes.extend_from_slice(&out.code_buffer);
    Ok((bytes, code_at))
}

/// When threads encode their own full rings (docs/translate.md, "Threads that encode their own
/// rings"; an experiment, off by default: with it an 8-thread detach took 25-77 ms against
/// 12-44): `ITRACE_XL_SELF_ENCODE=1` always, `threads` when two threads or more of the process
/// run in the cache, otherwise never (the stubs then have no path to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SelfEncode {
    Never,
    Always,
    Threads,
}

pub(super) fn self_encode_mode() -> SelfEncode {
    static MODE: std::sync::OnceLock<SelfEncode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("ITRACE_XL_SELF_ENCODE").as_deref() {
        Ok("1") => SelfEncode::Always,
        Ok("threads") => SelfEncode::Threads,
        _ => SelfEncode::Never,
    })
}

/// Whether threads may encode their own rings: their stubs have the path, and their blocks
/// the slots.
pub(super) fn self_encode() -> bool {
    self_encode_mode() != SelfEncode::Never
}

/// Bytes `fxsave64` writes.
const FXSAVE_BYTES: i64 = 512;

/// The routine a full ring's path jumps to when threads encode their own rings, for `at`: onto
/// the block's stack (the application's, red zone included, is left alone), the registers the
/// C calling convention lets the blob change saved (the flags, the general ones, the x87 and
/// SSE state: the blob is built for x86-64's baseline, so the upper halves of the vector
/// registers stay as they are), the blob's `itrace_self_encode(block)` called, everything put
/// back, and on to `gs:XL_BACK` if it encoded the ring, `gs:XL_TRAP` if not.
pub(super) fn self_encode_routine(at: u64) -> Result<Vec<u8>, TranslateError> {
    use Register::*;
    let encode = |e: iced_x86::IcedError| TranslateError::Encode(e.to_string());
    let saved = [RAX, RDX, RSI, RDI, R8, R9, R10, R11];
    let mut insns = vec![
        Instruction::with2(Code::Mov_rm64_r64, gs(XL_APP_RSP), RSP).map_err(encode)?,
        Instruction::with2(Code::Mov_r64_rm64, RSP, gs(XL_STACK_TOP)).map_err(encode)?,
        Instruction::with(Code::Pushfq),
    ];
    for &r in &saved {
        insns.push(Instruction::with1(Code::Push_r64, r).map_err(encode)?);
    }
    // 9 pushes from a 16-aligned top: 8 more bytes below the save area align the call.
    insns.push(Instruction::with2(Code::Lea_r64_m, RSP, mem(RSP, None, 1, -(FXSAVE_BYTES + 8))).map_err(encode)?);
    insns.push(Instruction::with1(Code::Fxsave64_m512byte, mem(RSP, None, 1, 0)).map_err(encode)?);
    insns.push(Instruction::with2(Code::Mov_r64_rm64, RDI, gs(XL_SELF)).map_err(encode)?);
    insns.push(Instruction::with1(Code::Call_rm64, gs(XL_ENTRY)).map_err(encode)?);
    insns.push(Instruction::with1(Code::Fxrstor64_m512byte, mem(RSP, None, 1, 0)).map_err(encode)?);
    insns.push(Instruction::with2(Code::Lea_r64_m, RSP, mem(RSP, None, 1, FXSAVE_BYTES + 8)).map_err(encode)?);
    // The flags are put back below: free to use here.
    insns.push(Instruction::with2(Code::Test_rm64_r64, RAX, RAX).map_err(encode)?);
    insns.push(Instruction::with2(Code::Mov_r64_rm64, RAX, gs(XL_TRAP)).map_err(encode)?);
    insns.push(Instruction::with2(Code::Cmovne_r64_rm64, RAX, gs(XL_BACK)).map_err(encode)?);
    insns.push(Instruction::with2(Code::Mov_rm64_r64, gs(XL_GO), RAX).map_err(encode)?);
    for &r in saved.iter().rev() {
        insns.push(Instruction::with1(Code::Pop_r64, r).map_err(encode)?);
    }
    insns.push(Instruction::with(Code::Popfq));
    insns.push(Instruction::with2(Code::Mov_r64_rm64, RSP, gs(XL_APP_RSP)).map_err(encode)?);
    insns.push(Instruction::with1(Code::Jmp_rm64, gs(XL_GO)).map_err(encode)?);
    let out = BlockEncoder::encode(64, InstructionBlock::new(&insns, at), BlockEncoderOptions::NONE)
        .map_err(|e| TranslateError::Encode(e.to_string()))?;
    Ok(out.code_buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode `code` (placed at `at`) and return its instructions' text, for reading.
    fn disasm(code: &[u8], at: u64) -> Vec<String> {
        use iced_x86::{Formatter, IntelFormatter};
        let mut d = Decoder::with_ip(64, code, at, DecoderOptions::NONE);
        let mut f = IntelFormatter::new();
        let mut out = Vec::new();
        for i in &mut d {
            let mut s = String::new();
            f.format(&i, &mut s);
            out.push(format!("{:x} {s}", i.ip()));
        }
        out
    }

    fn fetch_from(code: &'static [u8], base: u64) -> impl FnMut(u64, &mut [u8]) -> usize {
        move |pc, buf| {
            let o = (pc - base) as usize;
            let n = buf.len().min(code.len().saturating_sub(o));
            buf[..n].copy_from_slice(&code[o..o + n]);
            n
        }
    }

    #[test]
    fn loop_with_conditional_branch_and_return() {
        // 0x1000: mov eax, 3 ; 0x1005: dec eax ; 0x1007: jnz 0x1005 ; 0x1009: lea rbx,[rip+0x10]; 0x1010: ret
        static CODE: [u8; 17] = [0xb8, 3, 0, 0, 0, 0xff, 0xc8, 0x75, 0xfc, 0x48, 0x8d, 0x1d, 0x10, 0, 0, 0, 0xc3];
        let mut fetch = fetch_from(&CODE, 0x1000);
        let u = translate(0x1000, 0x10_0000, 7, &mut fetch, &|_, _| false, &|_, _| false).expect("translates");
        assert_eq!(u.spans.len(), 5, "{:#?}", disasm(&u.code, u.cache_start));
        assert_eq!(u.app_end, 0x1011);
        // Exits: the jnz taken (7, count 3) and the return (8, count 5, indirect).
        assert_eq!(u.exits.len(), 2);
        assert_eq!((u.exits[0].from, u.exits[0].to, u.exits[0].count), (0x1007, 0x1005, 3));
        assert!(u.exits[1].indirect && u.exits[1].count == 5 && u.exits[1].kind == Some(BranchKind::Return));
        // The RIP-relative lea still addresses 0x1020 from its new place.
        let lea = u.spans[3].start;
        let o = (lea - u.cache_start) as usize;
        let i = Decoder::with_ip(64, &u.code[o..], lea, DecoderOptions::NONE).decode();
        assert_eq!(i.ip_rel_memory_address(), 0x1020);
        // The jnz's taken side goes to a stub, not to the application.
        let o = (u.spans[2].start - u.cache_start) as usize;
        let j = Decoder::with_ip(64, &u.code[o..], u.spans[2].start, DecoderOptions::NONE).decode();
        assert!(j.near_branch_target() >= u.cache_start && j.near_branch_target() < u.cache_end());
    }

    #[test]
    fn system_call_leaves_and_first_special_refuses() {
        // nop ; syscall
        static CODE: [u8; 3] = [0x90, 0x0f, 0x05];
        let mut fetch = fetch_from(&CODE, 0x2000);
        let u = translate(0x2000, 0x10_0000, 0, &mut fetch, &|_, _| false, &|_, _| false).expect("translates");
        assert!(matches!(u.traps[0].1, Trap::Leave { pc: 0x2001, count: 1 }));
        let mut fetch = fetch_from(&CODE, 0x2000);
        assert!(matches!(
            translate(0x2001, 0x10_0000, 0, &mut fetch, &|_, _| false, &|_, _| false),
            Err(TranslateError::NotTranslatable)
        ));
    }

    #[test]
    fn traps_are_system_calls_with_a_way_out() {
        // 0x1000: dec eax ; jnz 0x1000 ; call [rip+0x10] ; (next unit) -- every kind of trap:
        // link misses, a full ring, an indirect miss, the check's (the code may change).
        static CODE: [u8; 10] = [0xff, 0xc8, 0x75, 0xfc, 0xff, 0x15, 0x10, 0, 0, 0];
        let mut fetch = fetch_from(&CODE, 0x1000);
        let u = translate(0x1000, 0x10_0000, 0, &mut fetch, &|_, _| false, &|_, _| true).expect("translates");
        let entry = u.entry();
        let code = &u.code[(entry - u.cache_start) as usize..];
        let insns: Vec<Instruction> = Decoder::with_ip(64, code, entry, DecoderOptions::NONE).into_iter().collect();
        let text = disasm(code, entry);
        assert!(insns.iter().all(|i| i.code() != Code::Int3), "an int3 in the unit: {text:#?}");
        assert!(u.traps.iter().any(|t| matches!(t.1, Trap::IndirectMiss)), "{:?}", u.traps);
        assert!(u.traps.iter().any(|t| matches!(t.1, Trap::RingFull { .. })), "{:?}", u.traps);
        assert!(u.traps.iter().any(|t| matches!(t.1, Trap::Rewritten { .. })), "{:?}", u.traps);
        for &(at, trap) in &u.traps {
            // A trap is `mov eax, getpid ; syscall`; the way out follows.
            let n = insns.iter().position(|i| i.ip() == at).unwrap_or_else(|| panic!("{trap:?} at {at:#x}: {text:#?}"));
            assert_eq!(insns[n].code(), Code::Syscall, "{trap:?}: {text:#?}");
            assert_eq!(
                (insns[n - 1].code(), insns[n - 1].immediate32()),
                (Code::Mov_r32_imm32, libc::SYS_getpid as u32)
            );
            // It leaves below the red zone and jumps to the way out.
            assert!(insns[n + 1..n + 6]
                .iter()
                .any(|i| i.code() == Code::Lea_r64_m && i.memory_displacement64() as i64 == -WAY_OUT_STACK));
        }
        // The way out: the gs base back with arch_prctl(ARCH_SET_GS), then `ret 256`.
        let ret = insns.iter().position(|i| i.code() == Code::Retnq_imm16).expect("a way out");
        assert_eq!(insns[ret].immediate16() as i64, WAY_OUT_STACK);
        assert!(insns[..ret]
            .iter()
            .any(|i| i.code() == Code::Mov_r32_imm32 && i.immediate32() == libc::SYS_arch_prctl as u32));
        assert!(insns[..ret].iter().any(|i| i.code() == Code::Mov_r32_imm32 && i.immediate32() == ARCH_SET_GS));
    }

    #[test]
    fn remote_call_gadget_goes_back_to_the_saved_registers_and_pc() {
        let at = 0x7000_0000u64;
        let (bytes, syscall) = remote_call_gadget(at).expect("encodes");
        assert_eq!(syscall, at + REMOTE_SAVE_BYTES);
        let code = &bytes[REMOTE_SAVE_BYTES as usize..];
        let insns: Vec<Instruction> = Decoder::with_ip(64, code, syscall, DecoderOptions::NONE).into_iter().collect();
        assert_eq!(insns[0].code(), Code::Syscall);
        // Each register from its slot, in order, then a jump through the saved pc.
        for (n, r) in REMOTE_SAVED.iter().enumerate() {
            let i = &insns[1 + n];
            assert_eq!((i.code(), i.op0_register()), (Code::Mov_r64_rm64, *r), "{i}");
            assert_eq!(i.ip_rel_memory_address(), at + 8 * n as u64, "{i}");
        }
        let jmp = &insns[1 + REMOTE_SAVED.len()];
        assert_eq!(jmp.code(), Code::Jmp_rm64);
        assert_eq!(jmp.ip_rel_memory_address(), at + 8 * REMOTE_SAVED.len() as u64);
    }

    /// Run the check of `u` on application memory `app` (bytes from `base`), as the CPU would,
    /// for the instruction forms the check is made of. `Ok(true)`: it reached the unit's first
    /// instruction with rcx and rdx the application's; `Ok(false)`: it went to the unit's
    /// `Rewritten` trap (checked to be there, with rcx and rdx put back first).
    fn run_check(u: &Unit, app: &[u8], base: u64) -> Result<bool, String> {
        let check = u.check.as_ref().ok_or("no check")?;
        let (app_rcx, app_rdx) = (0x1111_2222_3333_4444u64, 0x5555_6666_7777_8888u64);
        let (mut rcx, mut rdx) = (app_rcx, app_rdx);
        let mut spill = std::collections::HashMap::new();
        let read = |addr: u64, size: usize| -> Result<u64, String> {
            let o = addr.checked_sub(base).ok_or(format!("a load at {addr:#x}, before the code"))? as usize;
            let bytes = app.get(o..o + size).ok_or(format!("a load of {size} at {addr:#x}, past the code"))?;
            let mut v = [0u8; 8];
            v[..size].copy_from_slice(bytes);
            Ok(u64::from_le_bytes(v))
        };
        let decode = |rip: u64| {
            let o = (rip - u.cache_start) as usize;
            Decoder::with_ip(64, &u.code[o..], rip, DecoderOptions::NONE).decode()
        };
        let mut rip = check.start;
        for _ in 0..10_000 {
            if rip == u.first_instruction() {
                if (rcx, rdx) != (app_rcx, app_rdx) {
                    return Err("rcx or rdx not the application's after the check".into());
                }
                return Ok(true);
            }
            let i = decode(rip);
            if i.rflags_modified() != 0 {
                return Err(format!("{i} changes the flags"));
            }
            let gs_slot = || i.memory_displacement64() as i64;
            match i.code() {
                Code::Mov_rm64_r64 if i.segment_prefix() == Register::GS => {
                    let v = if i.op1_register() == Register::RCX { rcx } else { rdx };
                    spill.insert(gs_slot(), v);
                }
                Code::Mov_r64_rm64 | Code::Mov_r32_rm32 | Code::Movzx_r32_rm16 | Code::Movzx_r32_rm8 => {
                    let v = if i.segment_prefix() == Register::GS {
                        *spill.get(&gs_slot()).ok_or(format!("{i}: nothing spilled there"))?
                    } else if i.is_ip_rel_memory_operand() {
                        let size = match i.code() {
                            Code::Mov_r64_rm64 => 8,
                            Code::Mov_r32_rm32 => 4,
                            Code::Movzx_r32_rm16 => 2,
                            _ => 1,
                        };
                        read(i.ip_rel_memory_address(), size)?
                    } else {
                        return Err(format!("{i}: an unexpected load"));
                    };
                    match i.op0_register() {
                        Register::RCX | Register::ECX => rcx = v,
                        Register::RDX => rdx = v,
                        r => return Err(format!("{i}: {r:?}")),
                    }
                }
                Code::Mov_r64_imm64 if i.op0_register() == Register::RDX => rdx = i.immediate64(),
                Code::Lea_r64_m if i.memory_base() == Register::RCX && i.memory_index() == Register::RDX => {
                    rcx = rcx.wrapping_add(rdx).wrapping_add(i.memory_displacement64());
                }
                Code::Lea_r32_m if i.memory_base() == Register::RCX && i.memory_index() == Register::None => {
                    rcx = rcx.wrapping_add(i.memory_displacement64()) as u32 as u64;
                }
                Code::Jrcxz_rel8_64 if rcx == 0 => {
                    rip = i.near_branch_target();
                    continue;
                }
                Code::Jrcxz_rel8_64 => {}
                Code::Jmp_rel32_64 | Code::Jmp_rel8_64 => {
                    // The mismatch: rcx and rdx back, then straight to the Rewritten trap.
                    let mut at = i.near_branch_target();
                    let mut restored = Vec::new();
                    loop {
                        let j = decode(at);
                        if j.code() == Code::Syscall {
                            break;
                        }
                        if j.code() == Code::Mov_r64_rm64 && j.segment_prefix() == Register::GS {
                            restored.push((j.op0_register(), j.memory_displacement64() as i64));
                        }
                        if j.flow_control() != iced_x86::FlowControl::Next {
                            return Err(format!("{j} on the way to the trap"));
                        }
                        at = j.next_ip();
                    }
                    let trap = u.traps.iter().find(|t| t.0 == at).map(|t| t.1);
                    if !matches!(trap, Some(Trap::Rewritten { unit }) if unit == u.cache_start) {
                        return Err(format!("the mismatch goes to {trap:?}"));
                    }
                    if restored[..2] != [(Register::RCX, SPILL_RCX), (Register::RDX, SPILL_RDX)] {
                        return Err(format!("rcx and rdx not put back before the trap: {restored:?}"));
                    }
                    return Ok(false);
                }
                _ => return Err(format!("{i}: not an instruction of the check")),
            }
            rip = i.next_ip();
        }
        Err("the check does not end".into())
    }

    #[test]
    fn a_unit_from_code_that_may_change_checks_each_of_its_bytes_first() {
        // 0x4000: mov eax,0x11223344 ; mov ecx,5 ; add eax,7 ; dec ecx ; jnz 0x400a ; ret
        static LOOP: [u8; 20] =
            [0xb8, 0x44, 0x33, 0x22, 0x11, 0xb9, 5, 0, 0, 0, 0x05, 7, 0, 0, 0, 0xff, 0xc9, 0x75, 0xf7, 0xc3];
        // Units of 20, 10, 6, 3 and 1 bytes (pieces of 8, overlapping; of 4, 2 and 1).
        for (start, len) in [(0u64, 20usize), (10, 10), (14, 6), (17, 3), (19, 1)] {
            let base = 0x4000u64;
            let mut fetch = fetch_from(&LOOP, base);
            let asked = std::cell::Cell::new(None);
            let may_change = |s: u64, e: u64| {
                asked.set(Some((s, e)));
                true
            };
            let u = translate(base + start, 0x10_0000, 0, &mut fetch, &|_, _| false, &may_change).expect("translates");
            assert_eq!(asked.get(), Some((base + start, base + start + len as u64)), "the unit's bytes asked about");
            let check = u.check.as_ref().expect("a check");
            assert_eq!(check.source, LOOP[start as usize..start as usize + len]);
            assert_eq!(u.entry(), check.start);
            assert!(u.entry() < u.first_instruction());
            let text = disasm(&u.code, u.cache_start);
            // The code as translated: the check passes.
            assert_eq!(run_check(&u, &LOOP, base), Ok(true), "{text:#?}");
            // Any byte of the unit changed: the check traps. A byte outside it: it does not.
            for at in 0..LOOP.len() {
                let mut changed = LOOP;
                changed[at] ^= 0x40;
                let inside = at >= start as usize && at < start as usize + len;
                assert_eq!(run_check(&u, &changed, base), Ok(!inside), "byte {at} of unit {start}+{len}: {text:#?}");
            }
            // A fault in the check's loads maps to the unit's first instruction.
            let first_load = check.spilled.0;
            assert!(first_load > check.start && first_load < check.spilled.1);
        }
    }

    #[test]
    fn a_unit_from_code_that_cannot_change_has_no_check() {
        static CODE: [u8; 3] = [0x71, 0x00, 0xc3];
        let mut fetch = fetch_from(&CODE, 0x3000);
        let u = translate(0x3000, 0x10_0000, 0, &mut fetch, &|_, _| false, &|_, _| false).expect("translates");
        assert!(u.check.is_none());
        assert_eq!(u.entry(), u.first_instruction());
        assert!(!u.traps.iter().any(|t| matches!(t.1, Trap::Rewritten { .. })));
    }

    #[test]
    fn check_pieces_cover_every_byte_and_no_other() {
        for len in 1..=64 {
            let mut seen = vec![0u32; len];
            for (o, size) in check_pieces(len) {
                assert!([1, 2, 4, 8].contains(&size) && o + size <= len, "{len}: ({o}, {size})");
                for b in &mut seen[o..o + size] {
                    *b += 1;
                }
            }
            assert!(seen.iter().all(|&n| n >= 1), "{len}: {seen:?}");
        }
        assert_eq!(check_pieces(6), [(0, 4), (2, 4)]);
        assert_eq!(check_pieces(13), [(0, 8), (5, 8)]);
    }

    #[test]
    fn conditional_branch_to_the_next_instruction_stays_in_the_cache() {
        // jno +0 ; ret: a copy would keep its absolute target (0x3002) and leave the cache.
        static CODE: [u8; 3] = [0x71, 0x00, 0xc3];
        let mut fetch = fetch_from(&CODE, 0x3000);
        let u = translate(0x3000, 0x10_0000, 0, &mut fetch, &|_, _| false, &|_, _| false).expect("translates");
        assert_eq!(u.spans.len(), 2);
        assert_eq!(u.exits.len(), 1, "only the return exits");
        let mut d = Decoder::with_ip(64, &u.code, u.cache_start, DecoderOptions::NONE);
        for i in &mut d {
            if i.is_jcc_short_or_near() || i.is_jmp_short_or_near() {
                let t = i.near_branch_target();
                assert!(t >= u.cache_start && t < u.cache_end(), "{i} leaves the cache");
            }
        }
    }
}
