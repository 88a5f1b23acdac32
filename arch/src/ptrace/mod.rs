//! The Linux ptrace recorder: launches or attaches to a program, steps every
//! thread instruction by instruction (or block by block where the CPU's
//! branch trap works), and writes taken-branch records into per-CPU buffers.
//!
//! CPU numbers: each traced thread is pinned to one CPU of its allowed set
//! (round robin) while traced, so every record carries the CPU the
//! instructions really ran on without a system call per step; the original
//! affinity is restored at detach. The pinning is visible to the program
//! (`sched_getaffinity`) while it is traced.

mod block;
pub mod breakpoints;
mod engine;
mod probe;
pub mod procfs;
mod region;

pub use engine::{now_ns, record, RecordError, RecordOptions, RecordOutcome, Target};
pub use probe::{probe_singleblock, BlockStep};
