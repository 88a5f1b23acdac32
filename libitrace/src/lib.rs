//! ITraceOn/ITraceOff: region tracing from inside a program.
//!
//! A program brackets the code it wants traced; `itrace record --region`
//! traces only that. Outside itrace the calls return at once.
//!
//! How a tracer takes over: the ptrace backend puts breakpoints on
//! [`ITraceOn`], [`ITraceOff`] and [`ITraceEnabled`] and carries out their
//! effect itself (start or stop stepping the thread, answer whether it is
//! traced) without running their bodies, so these functions must stay real,
//! exported, side-effect-free functions when no in-process recorder runs.
//!
//! ```no_run
//! let result = {
//!     let _traced = itrace::region();
//!     (1..=10u64).product::<u64>()
//! };
//! # let _ = result;
//! ```

// The three entry points must keep distinct addresses (a tracer tells them apart by address):
// their bodies differ, so no identical-code folding can merge them.

/// Start tracing the calling thread; pairs nest (C: `ITraceOn()`).
#[no_mangle]
#[inline(never)]
pub extern "C" fn ITraceOn() {
    std::hint::black_box(1u8);
}

/// Stop tracing the calling thread once the outermost region ends (C: `ITraceOff()`).
#[no_mangle]
#[inline(never)]
pub extern "C" fn ITraceOff() {
    std::hint::black_box(2u8);
}

/// Whether the calling thread is traced now (C: `ITraceEnabled()`): a tracer that takes the
/// region over answers this itself; without one it is always 0.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ITraceEnabled() -> i32 {
    std::hint::black_box(0)
}

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
    ITraceOn();
    Region(())
}

impl Drop for Region {
    fn drop(&mut self) {
        ITraceOff()
    }
}
