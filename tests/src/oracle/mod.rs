//! The independent oracles, one module each. None of them uses itrace's
//! own code (decoder, symbol tables, trace format): they run external tools
//! and parse their text.

pub mod binutils;
pub mod callgrind;
pub mod cross;
pub mod glibc_pin;
pub mod qemu;
