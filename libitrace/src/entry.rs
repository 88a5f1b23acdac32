//! The C entry points (ITraceOn, ITraceOff, ITraceEnabled and the counter reads) and where
//! they go: to the in-process recorder when `itrace record --backend inproc` started the
//! program, else to the kernel shim's device when it is there, else nowhere (they return).
//!
//! Each is a small naked stub that clears the trap flag first thing, calls its body, and sets
//! the flag again just before returning when the body says so: no instruction of the library
//! is stepped by the in-process recorder. The kernel shim is told the stubs' addresses, and
//! the return address, so that it records neither.

use crate::{inproc, kmod};

// The entry points: clear TF, call the Rust body with the caller's return address (where a
// kernel-shim region goes on), set TF again if it says so (`eax` non-zero; for the counter entry
// points, which return (count, set trap flag) in rax:rdx, `rdx`). Naked, so no compiler-made
// prologue runs before the trap flag is off.
//
// Sound as a C function: the stack is 16-byte aligned at the call (it is 8 off on entry, past
// the return address, and `subq $8` makes up for it), and besides the body's own (SysV-ABI)
// effects only the flags and `rdi`, both caller-saved, change.
macro_rules! stub {
    ($body:path) => {
        stub!($body, "testl %eax, %eax")
    };
    ($body:path, $test:literal) => {
        std::arch::naked_asm!(
            "pushfq",
            "andq $-257, (%rsp)",
            "popfq",
            "movq (%rsp), %rdi",
            "subq $8, %rsp",
            "call {body}",
            "addq $8, %rsp",
            $test,
            "jz 2f",
            "pushfq",
            "orq $256, (%rsp)",
            "popfq",
            "2: ret",
            // One byte of padding marks the end of the stub for `in_stubs`.
            "int3",
            body = sym $body,
            options(att_syntax)
        )
    };
}

/// Start tracing the calling thread; pairs nest (C: `ITraceOn()`).
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn ITraceOn() {
    stub!(itrace_on_body)
}

/// Stop tracing the calling thread once the outermost region ends (C: `ITraceOff()`).
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn ITraceOff() {
    stub!(itrace_off_body)
}

/// Whether the calling thread is traced now (C: `ITraceEnabled()`).
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn ITraceEnabled() -> i32 {
    stub!(itrace_enabled_body)
}

/// The virtual instruction counter of the calling thread (C: `ITraceInstructions()`).
///
/// While the in-process recorder traces the thread: the number of its instructions since its
/// outermost `ITraceOn()` returned, counting the `call` of this function and none of this
/// function's own instructions (its `ret` neither); 0 when the thread is not traced. Exact:
/// the same count as the trace's. The thread stays traced.
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn ITraceInstructions() -> u64 {
    stub!(itrace_count_body, "testq %rdx, %rdx")
}

/// As [`ITraceInstructions`], then stop stepping the calling thread until
/// [`ITraceInstructionsResume`]: what runs in between is neither traced nor counted (a
/// profiler's Early Read; its work until the Late Read costs nothing to trace).
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn ITraceInstructionsPause() -> u64 {
    stub!(itrace_pause_body, "testq %rdx, %rdx")
}

/// The counter (unchanged since the pause), and stepping resumes after this function returns
/// (a profiler's Late Read). The trace shows the pause as a gap closed by a resume record.
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn ITraceInstructionsResume() -> u64 {
    stub!(itrace_resume_body, "testq %rdx, %rdx")
}

/// Length of each counter stub (as [`STUB_LEN`], with `testq %rdx,%rdx` one byte longer).
const COUNT_STUB_LEN: u64 = 44;

/// Length of each stub (pushfq 1, andq 8, popfq 1, movq 4, subq 4, call 5, addq 4, testl 2,
/// jz 2, pushfq 1, orq 8, popfq 1, ret 1, int3 1): its bytes are library code, never recorded.
const STUB_LEN: u64 = 43;

/// The entry points, where a thread traced by the kernel shim stops being recorded.
pub(crate) fn entry_points() -> [u64; 6] {
    [
        ITraceOn as *const () as u64,
        ITraceOff as *const () as u64,
        ITraceEnabled as *const () as u64,
        ITraceInstructions as *const () as u64,
        ITraceInstructionsPause as *const () as u64,
        ITraceInstructionsResume as *const () as u64,
    ]
}

/// Whether `pc` is inside one of the entry stubs (library code, never recorded).
pub(crate) fn in_stubs(pc: u64) -> bool {
    [ITraceOn as *const () as u64, ITraceOff as *const () as u64, ITraceEnabled as *const () as u64]
        .iter()
        .any(|&a| pc >= a && pc < a + STUB_LEN)
        || [
            ITraceInstructions as *const () as u64,
            ITraceInstructionsPause as *const () as u64,
            ITraceInstructionsResume as *const () as u64,
        ]
        .iter()
        .any(|&a| pc >= a && pc < a + COUNT_STUB_LEN)
}

extern "C" fn itrace_on_body(ret: u64) -> u32 {
    if inproc::ensure_init() {
        return inproc::on();
    }
    kmod::on(ret);
    0
}

extern "C" fn itrace_off_body(ret: u64) -> u32 {
    if inproc::running() {
        return inproc::off();
    }
    kmod::off(ret);
    0
}

extern "C" fn itrace_enabled_body(ret: u64) -> u32 {
    if inproc::running() {
        return inproc::enabled();
    }
    // The module set the trap flag itself: setting it again in the stub changes nothing.
    kmod::enabled(ret) as u32
}

/// The counter reads: the in-process recorder's virtual counter; 0 through the kernel shim
/// (which counts in the trace only), whose region goes on after the return.
fn count(ret: u64, pause: bool) -> inproc::CountRet {
    if inproc::running() {
        return inproc::count_now(pause);
    }
    kmod::carry_on(ret);
    inproc::CountRet { count: 0, step: 0 }
}

extern "C" fn itrace_count_body(ret: u64) -> inproc::CountRet {
    count(ret, false)
}

extern "C" fn itrace_pause_body(ret: u64) -> inproc::CountRet {
    count(ret, true)
}

extern "C" fn itrace_resume_body(ret: u64) -> inproc::CountRet {
    count(ret, false)
}
