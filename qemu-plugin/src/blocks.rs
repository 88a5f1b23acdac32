//! The translated blocks, each described once ([`TbInfo`], kept for the rest of the process),
//! and the taken branch between two of them as a vCPU hands it to the writer ([`Packed`]).

use itrace_decoders::Flow;
use itrace_format::BranchKind;

/// One translated block, as its executions need it.
pub struct TbInfo {
    pub start: u64,
    pub insns: u32,
    /// Address of the last instruction.
    pub last: u64,
    /// Where execution continues when the last instruction does not branch.
    pub fall: u64,
    pub flow: Flow,
    /// The last instruction is a branch to itself (`jmp .`, `loop .`).
    pub self_loop: bool,
    /// It always transfers control (a branch even to the next instruction).
    pub always: bool,
    /// The record kind when control does not fall through.
    pub kind: BranchKind,
    /// Where a direct branch goes (jump, call, conditional jump).
    pub target: Option<u64>,
    /// The last instruction can send control somewhere other than the next instruction.
    pub can_branch: bool,
}

impl TbInfo {
    /// Whether the block's last instruction can have sent control to `to`; when it cannot, a
    /// signal was delivered between the blocks.
    #[inline]
    pub fn reaches(&self, to: u64) -> bool {
        match self.target {
            Some(t) => to == t || to == self.fall,
            None => self.can_branch,
        }
    }
}

/// A user-space taken branch without flags, as a vCPU hands it to the writer: the block it
/// leaves (whose last instruction and kind the writer reads there), and where it goes with the
/// instructions before it in one word (its timestamp and thread are those of its batch).
#[derive(Clone, Copy)]
pub struct Packed {
    pub from: &'static TbInfo,
    to_icount: u64,
}

/// Bits of a packed branch's target address: 48, as user space has on the hosts and guests
/// seen (a higher one travels as a whole branch).
const TO_BITS: u32 = 48;

impl Packed {
    /// `None` when the target or the count does not fit.
    #[inline(always)]
    pub fn new(from: &'static TbInfo, to: u64, icount: u32) -> Option<Packed> {
        let fits = (to >> TO_BITS) | (icount as u64 >> (64 - TO_BITS)) == 0;
        fits.then_some(Packed { from, to_icount: to | (icount as u64) << TO_BITS })
    }

    #[inline(always)]
    pub fn to(&self) -> u64 {
        self.to_icount & ((1 << TO_BITS) - 1)
    }

    #[inline(always)]
    pub fn icount(&self) -> u32 {
        (self.to_icount >> TO_BITS) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(start: u64) -> TbInfo {
        TbInfo {
            start,
            insns: 3,
            last: start + 8,
            fall: start + 10,
            flow: Flow::Next,
            self_loop: false,
            always: false,
            kind: BranchKind::Jump,
            target: None,
            can_branch: false,
        }
    }

    #[test]
    fn packing_round_trips_and_refuses_what_does_not_fit() {
        let from: &'static TbInfo = Box::leak(Box::new(block(0x1000)));
        let p = Packed::new(from, (1 << TO_BITS) - 1, u16::MAX as u32).unwrap();
        assert_eq!((p.from.start, p.to(), p.icount()), (0x1000, (1 << TO_BITS) - 1, u16::MAX as u32));
        let p = Packed::new(from, 0x40_1000, 0).unwrap();
        assert_eq!((p.to(), p.icount()), (0x40_1000, 0));
        assert!(Packed::new(from, 1 << TO_BITS, 1).is_none());
        assert!(Packed::new(from, 0x1000, 1 << 16).is_none());
    }
}
