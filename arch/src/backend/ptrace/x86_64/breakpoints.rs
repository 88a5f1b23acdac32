//! Software breakpoints (x86 `int3`) in a traced process, for region
//! tracing: triggers that start or stop stepping a thread, and the library
//! entry points the tracer carries out itself.
//!
//! The original bytes are kept so decoding never sees an `int3` of ours, and
//! so every breakpoint can be taken out before detaching (a breakpoint left
//! behind would kill the program with SIGTRAP).

use super::engine::{Trigger, TriggerKind};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;
use std::collections::HashMap;

/// The x86 breakpoint instruction.
pub const INT3: u8 = 0xcc;

/// The breakpoints of one process.
#[derive(Clone, Debug, Default)]
pub struct Breakpoints {
    /// Inserted breakpoints: address -> (original byte, kind).
    active: HashMap<u64, (u8, TriggerKind)>,
    /// Taken out to step over them; put back after the step.
    lifted: HashMap<u64, (u8, TriggerKind)>,
}

fn word_at(tid: i32, addr: u64) -> Result<u64, Errno> {
    ptrace::read(Pid::from_raw(tid), addr as ptrace::AddressType).map(|w| w as u64)
}

fn write_byte(tid: i32, addr: u64, byte: u8) -> Result<u8, Errno> {
    let w = word_at(tid, addr)?;
    let old = (w & 0xff) as u8;
    let new = (w & !0xff) | byte as u64;
    // PTRACE_POKEDATA: one word of the stopped tracee's memory, passed by value.
    ptrace::write(Pid::from_raw(tid), addr as ptrace::AddressType, new as i64)?;
    Ok(old)
}

impl Breakpoints {
    /// Insert a breakpoint through stopped thread `tid` (no-op if one is there).
    pub fn insert(&mut self, tid: i32, t: Trigger) -> Result<(), Errno> {
        if self.active.contains_key(&t.addr) || self.lifted.contains_key(&t.addr) {
            return Ok(());
        }
        let orig = write_byte(tid, t.addr, INT3)?;
        self.active.insert(t.addr, (orig, t.kind));
        Ok(())
    }

    /// The trigger at `addr`, inserted or lifted.
    pub fn kind_at(&self, addr: u64) -> Option<TriggerKind> {
        self.active.get(&addr).or_else(|| self.lifted.get(&addr)).map(|&(_, k)| k)
    }

    /// Whether an `int3` of ours is in memory at `addr`.
    pub fn is_inserted(&self, addr: u64) -> bool {
        self.active.contains_key(&addr)
    }

    /// Take a breakpoint out for one step over its instruction.
    pub fn lift(&mut self, tid: i32, addr: u64) -> Result<(), Errno> {
        if let Some((orig, kind)) = self.active.remove(&addr) {
            write_byte(tid, addr, orig)?;
            self.lifted.insert(addr, (orig, kind));
        }
        Ok(())
    }

    /// Put back every lifted breakpoint.
    pub fn reinsert_lifted(&mut self, tid: i32) -> Result<(), Errno> {
        for (addr, (orig, kind)) in std::mem::take(&mut self.lifted) {
            write_byte(tid, addr, INT3)?;
            self.active.insert(addr, (orig, kind));
        }
        Ok(())
    }

    /// Remove one breakpoint for good.
    pub fn remove(&mut self, tid: i32, addr: u64) -> Result<(), Errno> {
        if let Some((orig, _)) = self.active.remove(&addr) {
            write_byte(tid, addr, orig)?;
        }
        self.lifted.remove(&addr);
        Ok(())
    }

    /// Restore every original byte (before detaching, or in a child that is not followed).
    pub fn remove_all(&mut self, tid: i32) -> Result<(), Errno> {
        let all: Vec<u64> = self.active.keys().copied().collect();
        for addr in all {
            self.remove(tid, addr)?;
        }
        self.lifted.clear();
        Ok(())
    }

    /// Addresses of all breakpoints, inserted or lifted.
    pub fn addresses(&self) -> Vec<u64> {
        self.active.keys().chain(self.lifted.keys()).copied().collect()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty() && self.lifted.is_empty()
    }

    /// Replace our `int3` bytes in `buf` (memory read at `addr`) with the original bytes.
    pub fn unpatch(&self, addr: u64, buf: &mut [u8]) {
        for (&a, &(orig, _)) in &self.active {
            if a >= addr && a < addr + buf.len() as u64 {
                buf[(a - addr) as usize] = orig;
            }
        }
    }
}
