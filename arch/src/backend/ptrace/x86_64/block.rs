//! Block stepping (PTRACE_SINGLEBLOCK, x86 BTF) stops only after taken
//! branches, so the instructions in between must be recovered by decoding:
//! walk from the block's first instruction to the instruction that ended
//! it. The trace must come out identical to single-stepping's.

use itrace_decoders::{Flow, Insn};

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkEnd {
    /// The block ends with the instruction at `pc` (a taken branch or a system call): it executed,
    /// and the stop comes after it.
    Branch { pc: u64, insn: Insn },
    /// The walk reached the stop pc without a branch (a signal or interrupt stopped the thread mid-block).
    Reached,
    /// No consistent path (self-modifying code, a decoding gap): counts are unreliable.
    Lost,
}

/// The result of a walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Instructions executed before the end (for `Branch`, excluding the branch itself).
    pub before: u32,
    pub end: WalkEnd,
}

/// Walk from `start` to the stop at `stop_pc`, decoding with `decode`. `branch_stop` says the stop
/// follows a taken branch or a system call (a block-step trap or syscall report); otherwise the
/// thread was stopped mid-block and the walk ends on reaching `stop_pc`.
pub fn walk_block(
    mut decode: impl FnMut(u64) -> Insn,
    start: u64,
    stop_pc: u64,
    branch_stop: bool,
    limit: u32,
) -> Walk {
    let mut pc = start;
    let mut before = 0u32;
    while before < limit {
        if !branch_stop && pc == stop_pc {
            return Walk { before, end: WalkEnd::Reached };
        }
        let insn = decode(pc);
        let next = pc.wrapping_add(insn.len as u64);
        let ends = match insn.flow {
            Flow::Syscall | Flow::Interrupt | Flow::Invalid => true,
            f if f.always_branches() => true,
            // Taken exactly when the stop is at its target; a jump to the next instruction is not seen by BTF.
            Flow::CondJump => insn.target == Some(stop_pc) && stop_pc != next,
            _ => false,
        };
        if ends {
            return Walk { before, end: WalkEnd::Branch { pc, insn } };
        }
        before += 1;
        pc = next;
    }
    Walk { before, end: WalkEnd::Lost }
}

/// What a block holds, for the block stepper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// It must be single-stepped ([`block_is_ambiguous`]).
    pub ambiguous: bool,
    /// Its straight-line path ends with this system call (pc, instruction, instructions before it).
    pub syscall: Option<(u64, Insn, u32)>,
}

/// Ambiguity and the ending system call of the block at `start`.
pub fn block_info(mut decode: impl FnMut(u64) -> Insn, start: u64, limit: u32) -> BlockInfo {
    let ambiguous = block_is_ambiguous(&mut decode, start, limit);
    let mut pc = start;
    let mut before = 0;
    let mut syscall = None;
    while before < limit {
        let insn = decode(pc);
        match insn.flow {
            Flow::Syscall => {
                syscall = Some((pc, insn, before));
                break;
            }
            Flow::Interrupt | Flow::Invalid => break,
            f if f.always_branches() => break,
            _ => {}
        }
        before += 1;
        pc = pc.wrapping_add(insn.len as u64);
    }
    BlockInfo { ambiguous, syscall }
}

/// Could a block-step stop for the block starting at `start` be explained by two different
/// instructions? Then it must be single-stepped. That is the case when two candidate branches
/// (conditional jumps, which are only candidates if taken, and the instruction that surely ends
/// the block) can land on the same pc, or a conditional jump targets its own fall-through (the
/// branch trap fires there but single-stepping sees no branch). An indirect block end (ret,
/// jmp/call through a register) could land anywhere, so with any conditional jump before it
/// the block is ambiguous too.
pub fn block_is_ambiguous(mut decode: impl FnMut(u64) -> Insn, start: u64, limit: u32) -> bool {
    let mut targets: Vec<u64> = Vec::new();
    let mut pc = start;
    for _ in 0..limit {
        let insn = decode(pc);
        let next = pc.wrapping_add(insn.len as u64);
        match insn.flow {
            Flow::CondJump => {
                let Some(t) = insn.target else { return true };
                if t == next || targets.contains(&t) {
                    return true;
                }
                targets.push(t);
            }
            // Execution resumes at the next instruction (after the kernel): a taken jump there looks the same.
            Flow::Syscall | Flow::Interrupt | Flow::Invalid => return targets.contains(&next),
            f if f.always_branches() => {
                return match insn.target {
                    Some(t) => targets.contains(&t),
                    None => !targets.is_empty(),
                };
            }
            _ => {}
        }
        pc = next;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use itrace_decoders::x86;

    // 0x1000: mov $3,%ecx; 0x1005: dec %ecx; 0x1007: jnz 0x1005; 0x1009: call 0x1010;
    // 0x100e: nop; 0x100f: syscall? no: 0x100e: nop; nop; 0x1010: rep movsb; 0x1012: ret
    // Two conditional jumps to one label, and a jump to its own fall-through.
    #[test]
    fn ambiguous_blocks() {
        // 0: je 6; 2: jne 6; 4: nop; 5: nop; 6: ret
        let code = [0x74, 0x04, 0x75, 0x02, 0x90, 0x90, 0xc3];
        let d = |pc: u64| x86::decode(64, pc, &code[pc as usize..]);
        assert!(block_is_ambiguous(d, 0, 10));
        assert!(block_is_ambiguous(d, 2, 10)); // jne then ret (indirect): could both land anywhere
        assert!(!block_is_ambiguous(d, 4, 10)); // nop nop ret
                                                // 0: je 2 (its own fall-through); 2: ret
        let code2 = [0x74, 0x00, 0xc3];
        assert!(block_is_ambiguous(|pc| x86::decode(64, pc, &code2[pc as usize..]), 0, 10));
        // 0: je 4; 2: jmp 4 -> both land on 4
        let code3 = [0x74, 0x02, 0xeb, 0x00, 0x90];
        assert!(block_is_ambiguous(|pc| x86::decode(64, pc, &code3[pc as usize..]), 0, 10));
    }

    const CODE: [u8; 19] = [
        0xb9, 3, 0, 0, 0, // mov $3,%ecx
        0xff, 0xc9, // dec %ecx
        0x75, 0xfc, // jnz 0x1005
        0xe8, 0x02, 0, 0, 0, // call 0x1010
        0x90, 0x90, // nop; nop
        0xf3, 0xa4, // 0x1010: rep movsb
        0xc3, // 0x1012: ret
    ];

    fn dec(pc: u64) -> Insn {
        let off = (pc - 0x1000) as usize;
        x86::decode(64, pc, &CODE[off..])
    }

    /// Single-step pcs of the code above (with rcx=3 then the rep with rcx=0), the truth to rebuild.
    #[test]
    fn block_walks_rebuild_single_step_counts() {
        // The stops a block stepper sees, with what single-stepping records for each block.
        // (start, stop pc, expected instructions before the branch, branch pc)
        let cases = [
            (0x1000, 0x1005, 2, 0x1007), // mov, dec, then jnz taken
            (0x1005, 0x1005, 1, 0x1007), // dec, jnz taken
            (0x1005, 0x1010, 2, 0x1009), // dec, jnz not taken, call
            (0x1010, 0x100e, 1, 0x1012), // rep movsb (once), ret
        ];
        for (start, stop, before, branch_pc) in cases {
            let w = walk_block(dec, start, stop, true, 100);
            assert_eq!(w.before, before, "block at {start:#x}");
            match w.end {
                WalkEnd::Branch { pc, .. } => assert_eq!(pc, branch_pc),
                e => panic!("block at {start:#x} ended {e:?}"),
            }
        }
        // Stopped by a signal at 0x100e after the ret: nothing executed between.
        assert_eq!(walk_block(dec, 0x100e, 0x100e, false, 100), Walk { before: 0, end: WalkEnd::Reached });
        // Mid-block stop: mov and dec ran, stopped before jnz.
        assert_eq!(walk_block(dec, 0x1000, 0x1007, false, 100), Walk { before: 2, end: WalkEnd::Reached });
        // Ambiguity: one conditional jump and a ret (0x1005: dec; jnz; call -> not ambiguous, direct call).
        assert!(!block_is_ambiguous(dec, 0x1000, 100));
        assert!(!block_is_ambiguous(dec, 0x1010, 100)); // rep movsb; ret: no conditional jump
                                                        // Runaway walk gives up.
        assert_eq!(walk_block(dec, 0x100e, 0x1, false, 1).end, WalkEnd::Lost);
    }
}
