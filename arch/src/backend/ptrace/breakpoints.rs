//! Software breakpoints in a traced process, for region tracing: triggers that start or stop
//! stepping a thread, and the library entry points the tracer carries out itself. The
//! breakpoint instruction is the architecture's (`arch::BREAKPOINT`: x86 `int3`, PowerPC
//! `trap`); the rest is the same everywhere.
//!
//! The original bytes are kept so decoding never sees a breakpoint of ours, and
//! so every breakpoint can be taken out before detaching (a breakpoint left
//! behind would kill the program with SIGTRAP).

use super::arch::BREAKPOINT;
use super::engine::{Trigger, TriggerKind};
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::unistd::Pid;
use std::collections::HashMap;

/// The bytes a breakpoint replaced (the first `BREAKPOINT.len()` of them).
type Saved = [u8; 4];

/// The breakpoints of one process.
#[derive(Clone, Debug, Default)]
pub struct Breakpoints {
    /// Inserted breakpoints: address -> (original byte, kind).
    active: HashMap<u64, (Saved, TriggerKind)>,
    /// Taken out to step over them; put back after the step.
    lifted: HashMap<u64, (Saved, TriggerKind)>,
}

fn word_at(tid: i32, addr: u64) -> Result<u64, Errno> {
    ptrace::read(Pid::from_raw(tid), addr as ptrace::AddressType).map(|w| w as u64)
}

/// Write `bytes` (at most 4) at `addr` through stopped thread `tid`; returns what they replaced.
fn write_bytes(tid: i32, addr: u64, bytes: &[u8]) -> Result<Saved, Errno> {
    let mut word = word_at(tid, addr)?.to_ne_bytes();
    let mut old: Saved = [0; 4];
    old[..bytes.len()].copy_from_slice(&word[..bytes.len()]);
    word[..bytes.len()].copy_from_slice(bytes);
    // PTRACE_POKEDATA: one word of the stopped tracee's memory, passed by value.
    ptrace::write(Pid::from_raw(tid), addr as ptrace::AddressType, i64::from_ne_bytes(word))?;
    Ok(old)
}

impl Breakpoints {
    /// Insert a breakpoint through stopped thread `tid` (no-op if one is there).
    pub fn insert(&mut self, tid: i32, t: Trigger) -> Result<(), Errno> {
        if self.active.contains_key(&t.addr) || self.lifted.contains_key(&t.addr) {
            return Ok(());
        }
        let orig = write_bytes(tid, t.addr, BREAKPOINT)?;
        self.active.insert(t.addr, (orig, t.kind));
        Ok(())
    }

    /// The trigger at `addr`, inserted or lifted.
    pub fn kind_at(&self, addr: u64) -> Option<TriggerKind> {
        self.active.get(&addr).or_else(|| self.lifted.get(&addr)).map(|&(_, k)| k)
    }

    /// Whether a breakpoint of ours is in memory at `addr`.
    pub fn is_inserted(&self, addr: u64) -> bool {
        self.active.contains_key(&addr)
    }

    /// Take a breakpoint out for one step over its instruction.
    pub fn lift(&mut self, tid: i32, addr: u64) -> Result<(), Errno> {
        if let Some((orig, kind)) = self.active.remove(&addr) {
            write_bytes(tid, addr, &orig[..BREAKPOINT.len()])?;
            self.lifted.insert(addr, (orig, kind));
        }
        Ok(())
    }

    /// Put back every lifted breakpoint.
    pub fn reinsert_lifted(&mut self, tid: i32) -> Result<(), Errno> {
        for (addr, (orig, kind)) in std::mem::take(&mut self.lifted) {
            write_bytes(tid, addr, BREAKPOINT)?;
            self.active.insert(addr, (orig, kind));
        }
        Ok(())
    }

    /// Remove one breakpoint for good.
    pub fn remove(&mut self, tid: i32, addr: u64) -> Result<(), Errno> {
        if let Some((orig, _)) = self.active.remove(&addr) {
            write_bytes(tid, addr, &orig[..BREAKPOINT.len()])?;
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

    /// Replace our breakpoint bytes in `buf` (memory read at `addr`) with the original bytes.
    pub fn unpatch(&self, addr: u64, buf: &mut [u8]) {
        let end = addr + buf.len() as u64;
        for (&a, (orig, _)) in &self.active {
            for (i, &b) in orig[..BREAKPOINT.len()].iter().enumerate() {
                let at = a + i as u64;
                if at >= addr && at < end {
                    buf[(at - addr) as usize] = b;
                }
            }
        }
    }
}
