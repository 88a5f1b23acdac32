//! ITraceOn/ITraceOff: region tracing from inside a program.
//!
//! A program brackets the code it wants traced; `itrace record --region`
//! traces only that. Outside itrace the calls return at once.
//!
//! How a tracer takes over: the ptrace backend puts breakpoints on
//! [`ITraceOn`], [`ITraceOff`] and [`ITraceEnabled`] and carries out their
//! effect itself (start or stop stepping the thread, answer whether it is
//! traced) without running their bodies, so these functions must stay real,
//! exported, side-effect-free functions when no recorder runs. Their bodies
//! go to the in-process recorder ([`inproc`], `--backend inproc`) or to the
//! kernel shim's device (`kmod`, `--backend kmod`); see `entry`.
//!
//! ```no_run
//! let result = {
//!     let _traced = itrace::region();
//!     (1..=10u64).product::<u64>()
//! };
//! # let _ = result;
//! ```

// Every unsafe operation sits in its own block with a `// SAFETY:` line saying why it is sound
// (the workspace lints unsafe_op_in_unsafe_fn and clippy::undocumented_unsafe_blocks deny the rest).

mod entry;
pub mod inproc;
mod interpose;
mod kmod;
mod real;
mod ring;
mod sigchain;

// The C entry points are naked stubs: they must clear the trap flag before anything else runs.
pub use entry::{
    ITraceEnabled, ITraceInstructions, ITraceInstructionsPause, ITraceInstructionsResume, ITraceOff, ITraceOn,
};

/// Start tracing the calling thread.
pub fn on() {
    ITraceOn()
}

/// Stop tracing the calling thread (outermost region).
pub fn off() {
    ITraceOff()
}

/// Whether the calling thread is traced now.
pub fn enabled() -> bool {
    ITraceEnabled() != 0
}

/// A traced region that ends when the guard is dropped.
#[must_use = "the region ends when this guard is dropped"]
pub struct Region(());

/// Trace the calling thread until the returned guard is dropped.
pub fn region() -> Region {
    on();
    Region(())
}

impl Drop for Region {
    fn drop(&mut self) {
        off()
    }
}
