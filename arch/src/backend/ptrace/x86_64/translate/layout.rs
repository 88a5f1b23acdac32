//! The per-thread state block a thread in the code cache reaches through its gs base: spill
//! slots, the indirect-branch target, the ring of branch records and the indirect-branch
//! lookup table, and what a thread that encodes its own rings uses (the blob's slots, its
//! encoder, stack and output). Offsets are gs-relative displacements in the generated code and
//! offsets into the block for itrace, which reads and writes it with the thread stopped, and,
//! those the blob reads, `itrace_translate_inproc::block`'s.

/// The application's rcx while a stub uses rcx.
pub(super) const SPILL_RCX: i64 = 0x00;
/// The application's rdx while a stub uses rdx.
pub(super) const SPILL_RDX: i64 = 0x08;
/// The application target of the indirect branch being taken.
pub(super) const TARGET: i64 = 0x10;
/// The cache address an indirect-branch hit jumps to.
pub(super) const JUMP: i64 = 0x18;
/// What a trap's `syscall` clobbers (rax: the call number; rcx and r11: the return address and
/// the flags), spilled before it. itrace puts them back at the stop; with no tracer, the way
/// out of the cache after the `syscall` does.
pub(super) const TRAP_RAX: i64 = 0x28;
pub(super) const TRAP_RCX: i64 = 0x30;
pub(super) const TRAP_R11: i64 = 0x38;
/// The application's own gs base (written by itrace when the thread enters the cache): the way
/// out puts it back when itrace is gone.
pub(super) const APP_GS: i64 = 0x40;
/// The ring, its fill (`RING_OFF`: minus the bytes still free, 0 when full; counting up to
/// zero lets the stubs test "full" with `jrcxz`, which leaves the application's flags alone),
/// the count of its records of no branch (`NO_BRANCH`: their stubs count them, so that the
/// drain knows how many branches the ring holds without reading it all), the indirect-branch
/// lookup table (`[application pc][cache pc]` entries indexed by the low 16 bits of the
/// application pc), and what a thread that encodes its own ring uses: the layout the code in
/// the program shares (`itrace-translate-inproc`).
pub(super) use itrace_translate_inproc::block::*;

/// An empty table entry holds an application pc no branch can have.
pub(super) const TABLE_EMPTY: u64 = u64::MAX;

/// The table entry of application pc `pc` (its offset in the block).
pub(super) fn table_entry(pc: u64) -> u64 {
    TABLE as u64 + (pc & 0xffff) * TABLE_ENTRY_BYTES
}
