//! The harness of itrace's end-to-end tests (the test files are in
//! `tests/tests/`, one binary each): building the test programs, running
//! `itrace` under a hang guard, reading its arc and report output, and the
//! independent oracles the traces are checked against (qemu-user's
//! execution log, objdump, nm, addr2line, valgrind's callgrind, and the
//! cross-architecture binutils). See tests/README.md.
//!
//! None of the oracles uses itrace's own code (decoder, symbol tables, trace
//! format): they only use external tools and the documented text formats.
//!
//! Everything is re-exported at the top, so a test file names what it uses:
//! `use itrace_tests::{program, record, test_dir, Oracle};`.

pub mod arc;
pub mod dump;
pub mod gen_x86;
pub mod guest;
pub mod oracle;
pub mod programs;
pub mod report;
pub mod run;

pub use arc::*;
pub use dump::*;
pub use guest::*;
pub use oracle::binutils::*;
pub use oracle::callgrind::*;
pub use oracle::cross::*;
pub use oracle::glibc_pin::*;
pub use oracle::qemu::*;
pub use programs::*;
pub use report::*;
pub use run::*;
