//! itrace's recording side: per-architecture knowledge and the backends that record.
//!
//! - [`isa`]: one module per instruction-set architecture behind the small [`Arch`] trait.
//! - [`backend`]: the recorders (ptrace, GDB remote, in-process, kernel shim, qemu plugin)
//!   behind one [`backend::Recorder`] interface, chosen from plain [`backend::RecordSettings`].
//! - [`modules`]: the module table of traced processes, one diff of their mappings for all.
//! - [`procfs`] and [`elf`]: what the backends read of processes and program files.
//!
//! Data flows one way: a backend pushes records into the per-CPU buffers of
//! `itrace-format`, which write the trace file; `itrace-post` reads it.

pub mod backend;
pub mod elf;
pub mod inherit;
pub mod isa;
pub mod modules;
pub mod procfs;

pub use isa::{for_arch, Arch, MappingCalls, RemoteInfo, Reservation};
