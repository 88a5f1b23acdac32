//! The per-thread state block a thread in the code cache reaches through its gs base: spill
//! slots, the indirect-branch target, the ring of branch records and the indirect-branch
//! lookup table. Offsets are gs-relative displacements in the generated code and offsets into
//! the block for itrace, which reads and writes it with the thread stopped.

/// The application's rcx while a stub uses rcx.
pub(super) const SPILL_RCX: i64 = 0x00;
/// The application's rdx while a stub uses rdx.
pub(super) const SPILL_RDX: i64 = 0x08;
/// The application target of the indirect branch being taken.
pub(super) const TARGET: i64 = 0x10;
/// The cache address an indirect-branch hit jumps to.
pub(super) const JUMP: i64 = 0x18;
/// The ring's fill: minus the bytes still free (0 when full). Counting up to zero lets the
/// stubs test "full" with `jrcxz`, which leaves the application's flags alone.
pub(super) const RING_OFF: i64 = 0x20;
/// What a trap's `syscall` clobbers (rax: the call number; rcx and r11: the return address and
/// the flags), spilled before it. itrace puts them back at the stop; with no tracer, the way
/// out of the cache after the `syscall` does.
pub(super) const TRAP_RAX: i64 = 0x28;
pub(super) const TRAP_RCX: i64 = 0x30;
pub(super) const TRAP_R11: i64 = 0x38;
/// The application's own gs base (written by itrace when the thread enters the cache): the way
/// out puts it back when itrace is gone.
pub(super) const APP_GS: i64 = 0x40;
/// The ring's records of exits of no branch (a unit's size limit): their stubs count them, so
/// that the drain knows how many branches the ring holds without reading it all (reading it
/// was a twentieth of a recording's time).
pub(super) const NO_BRANCH: i64 = 0x48;

/// The ring of records: `[exit id: u64][target: u64]` each (the target only for indirect exits).
pub(super) const RING: i64 = 0x1000;
pub(super) const RECORD_BYTES: i64 = 16;
pub(super) const RING_RECORDS: i64 = 1 << 16;
pub(super) const RING_BYTES: i64 = RING_RECORDS * RECORD_BYTES;
pub(super) const RING_END: i64 = RING + RING_BYTES;

/// The indirect-branch lookup table: `[application pc][cache pc]` entries indexed by the low 16
/// bits of the application pc. An empty entry holds an application pc no branch can have.
pub(super) const TABLE: i64 = RING_END;
pub(super) const TABLE_ENTRIES: u64 = 1 << 16;
pub(super) const TABLE_ENTRY_BYTES: u64 = 16;
pub(super) const TABLE_EMPTY: u64 = u64::MAX;

/// The whole block, a multiple of the page size.
pub(super) const STATE_BYTES: u64 = TABLE as u64 + TABLE_ENTRIES * TABLE_ENTRY_BYTES;

/// The table entry of application pc `pc` (its offset in the block).
pub(super) fn table_entry(pc: u64) -> u64 {
    TABLE as u64 + (pc & 0xffff) * TABLE_ENTRY_BYTES
}
