//! The branch records the compact encoding works on: a taken branch (`Branch`), the hop of a
//! batch of one thread's branches (`Hop`), the batch's timestamps (`BatchStamp`), and the record
//! codes a branch record's 40-byte layout uses.

/// Size of a branch record in the 16-byte-header layout (header included).
pub const BRANCH_RECORD_LEN: usize = 40;

/// Major codes (PI's where PI had one).
pub mod major {
    /// Module table entry: processes, threads, mappings, symbols.
    pub const MTE: u16 = 0x19;
    /// Taken branch whose source is in the kernel (return to user space).
    pub const BRANCH_KERNEL: u16 = 0x20;
    /// Taken branch whose source is in user space.
    pub const BRANCH_USER: u16 = 0x21;
    /// Tracing of a thread starts.
    pub const TRACE_ON: u16 = 0x2e;
    /// Tracing of a thread ends.
    pub const TRACE_OFF: u16 = 0x2f;
    /// Records were lost (overwritten in wrap mode, or could not be written).
    pub const LOST: u16 = 0x31;
    /// End-of-trace summary (only in the end chunk).
    pub const SUMMARY: u16 = 0x3f;
}

/// Flag bits of a branch record (bits 8-15 of its minor code).
pub mod branch_flags {
    /// A system call: `aux` is the system call number.
    pub const SYSCALL: u8 = 1;
    /// A signal delivery: `aux` is the signal number.
    pub const SIGNAL: u8 = 2;
}

/// Type of the instruction that ends a block. Codes 0-7 are PI's arc codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BranchKind {
    /// Interrupt, system call or signal into the kernel.
    Intrpt = 0,
    Call = 1,
    Return = 2,
    /// Unconditional jump (direct or indirect).
    Jump = 3,
    /// Return from the kernel to user space.
    Iret = 4,
    Other = 5,
    Undefd = 6,
    Alloc = 7,
    /// Conditional jump, taken. PI's arc shows it as JUMP.
    CondJump = 8,
}

impl BranchKind {
    /// Decode a stored kind code.
    pub fn from_code(c: u8) -> Option<Self> {
        use BranchKind::*;
        Some(match c {
            0 => Intrpt,
            1 => Call,
            2 => Return,
            3 => Jump,
            4 => Iret,
            5 => Other,
            6 => Undefd,
            7 => Alloc,
            8 => CondJump,
            _ => return None,
        })
    }
    /// PI's arc type code (field 3).
    pub fn arc_code(self) -> u8 {
        match self {
            BranchKind::CondJump => 3,
            k => k as u8,
        }
    }
    /// PI's arc type string (field 9).
    pub fn arc_name(self) -> &'static str {
        match self {
            BranchKind::Intrpt => "INTRPT",
            BranchKind::Call => "CALL",
            BranchKind::Return => "RETURN",
            BranchKind::Jump | BranchKind::CondJump => "JUMP",
            BranchKind::Iret => "IRET",
            BranchKind::Other => "OTHER",
            BranchKind::Undefd => "UNDEFD",
            BranchKind::Alloc => "ALLOC",
        }
    }
}

/// One taken branch: the block of `icount` instructions that ended with the
/// instruction at `from` went to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Branch {
    pub ts: u64,
    /// Source is in the kernel (a return to user space).
    pub kernel: bool,
    pub kind: BranchKind,
    /// [`branch_flags`] bits.
    pub flags: u8,
    /// System call or signal number, per `flags`.
    pub aux: u16,
    pub from: u64,
    pub to: u64,
    pub tid: u32,
    /// Instructions executed since the previous record of this thread, this one included.
    pub icount: u32,
}

impl Branch {
    /// A taken branch in user space from `from` to `to` by thread `tid`; `flags` and `aux` as
    /// in [`Branch`]. Its instruction count is set by the caller (0 here).
    pub fn user(ts: u64, tid: u32, from: u64, to: u64, kind: BranchKind, flags: u8, aux: u16) -> Branch {
        Branch { ts, kernel: false, kind, flags, aux, from, to, tid, icount: 0 }
    }

    /// The kernel's return to user space at `to` after a system call or signal delivery
    /// (`flags` says which, `aux` its number): a `K` IRET record with no instructions.
    pub fn kernel_return(ts: u64, tid: u32, to: u64, flags: u8, aux: u16) -> Branch {
        Branch { ts, kernel: true, kind: BranchKind::Iret, flags, aux, from: 0, to, tid, icount: 0 }
    }
}

/// A taken user-mode branch of a batch of one thread's branches
/// (`Buffers::push_hops` of the trace file crate): a [`Branch`] without what the batch shares (its thread and,
/// through a [`BatchStamp`], its timestamps), no flags, no aux, and with a key. 24 bytes against
/// a `Branch`'s 40: the translating recorder's drain writes a ring's worth of these on one CPU
/// and the writer thread reads them on the other, and that traffic was as much of each side's
/// time per record as their work (32 bytes, with the key a field of its own, cost 10 % of a
/// recording's time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Hop {
    pub from: u64,
    pub to: u64,
    /// As [`Branch::icount`].
    pub icount: u32,
    /// The kind's code (bits 0-7) and the key (bits 8-31).
    kind_key: u32,
}

impl Hop {
    /// The largest key ([`Hop::key`]).
    pub const MAX_KEY: u32 = (1 << 24) - 1;

    /// The hop of a branch of `kind` from `from` to `to`, `icount` instructions. `key`: 0, or
    /// a key that stands for `from`, `icount` and `kind` (in the translating recorder, the exit
    /// that made the hop): hops with one key have those three the same, so the encoder finds a
    /// keyed hop's edge without hashing it. A key over [`Hop::MAX_KEY`] is taken as 0.
    #[inline(always)]
    pub fn new(from: u64, to: u64, icount: u32, kind: BranchKind, key: u32) -> Hop {
        let key = if key > Self::MAX_KEY { 0 } else { key };
        Hop { from, to, icount, kind_key: key << 8 | kind as u32 }
    }

    #[inline(always)]
    pub fn kind(&self) -> BranchKind {
        BranchKind::from_code(self.kind_key as u8).expect("made from a BranchKind")
    }

    /// The kind's code ([`BranchKind`] as a number).
    #[inline(always)]
    pub fn kind_code(&self) -> u8 {
        self.kind_key as u8
    }

    /// Its key, 0 for none.
    #[inline(always)]
    pub fn key(&self) -> u32 {
        self.kind_key >> 8
    }

    /// The same branch with `icount` instructions (a count carried into it from before), its key
    /// dropped: a key stands for the count it was given with.
    #[inline(always)]
    pub fn carried(self, icount: u32) -> Hop {
        Hop { icount, kind_key: self.kind_key & 0xff, ..self }
    }

    /// The branch record it stands for, of thread `tid` at `ts`.
    #[inline]
    pub fn branch(&self, ts: u64, tid: u32) -> Branch {
        Branch { icount: self.icount, ..Branch::user(ts, tid, self.from, self.to, self.kind(), 0, 0) }
    }
}

/// The timestamps of a batch of one thread's records read at one clock reading: the first
/// `first_n` take `first` (the thread's earlier reading, as far as it is shared), the rest
/// `rest`. A recorder works it out before it makes the batch (`Sink::batch_stamp` in the
/// recorders), so that no pass over the batch sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchStamp {
    pub first: u64,
    pub first_n: usize,
    pub rest: u64,
}

impl BatchStamp {
    /// The timestamp of the batch's record `i`.
    #[inline(always)]
    pub fn ts(&self, i: usize) -> u64 {
        if i < self.first_n {
            self.first
        } else {
            self.rest
        }
    }

    /// The stamp of the batch's records from record `i` on (a piece of it stored apart).
    #[inline]
    pub fn from(&self, i: usize) -> BatchStamp {
        BatchStamp { first_n: self.first_n.saturating_sub(i), ..*self }
    }
}

impl Branch {
    /// Encode into a fixed-size array (the recorder's hot path).
    #[inline]
    pub fn encode_into(&self, a: &mut [u8; BRANCH_RECORD_LEN]) {
        let maj = if self.kernel { major::BRANCH_KERNEL } else { major::BRANCH_USER };
        let minor = self.kind as u32 | (self.flags as u32) << 8 | (self.aux as u32) << 16;
        a[0..2].copy_from_slice(&(BRANCH_RECORD_LEN as u16).to_ne_bytes());
        a[2..4].copy_from_slice(&maj.to_ne_bytes());
        a[4..8].copy_from_slice(&minor.to_ne_bytes());
        a[8..16].copy_from_slice(&self.ts.to_ne_bytes());
        a[16..24].copy_from_slice(&self.from.to_ne_bytes());
        a[24..32].copy_from_slice(&self.to.to_ne_bytes());
        a[32..36].copy_from_slice(&self.tid.to_ne_bytes());
        a[36..40].copy_from_slice(&self.icount.to_ne_bytes());
    }
}
