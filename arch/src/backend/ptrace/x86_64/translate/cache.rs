//! The code cache of one traced process, as itrace keeps it: the cache's regions in the
//! process, its units by cache address and by application address, what each exit record and
//! each `int3` means, the links between units, and the thread-state blocks mapped in the
//! process. The process's memory is written through `/proc/PID/mem`, which writes through the
//! cache's read-only protection as a debugger's breakpoints do.

use super::layout::*;
use super::rseq::NativeRun;
use super::unit::{Exit, Trap, Unit};
use itrace_format::{BranchKind, Hop};
use itrace_translate_inproc::RingExit;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// The size of one region of cache, mapped near the code it translates (RIP-relative operands
/// must reach their data from it).
pub(super) const REGION_BYTES: u64 = 8 << 20;
/// The most a unit can take (`unit::MAX_UNIT_INSNS` instructions and their stubs, with room).
pub(super) const MAX_UNIT_BYTES: u64 = 96 << 10;
/// Regions per process: the cache's bound (the cache is flushed when it is full).
pub(super) const MAX_REGIONS: usize = 128;

/// Units translated ahead at most per unit translated for a stop (`Session::translate_ahead`).
pub(super) const AHEAD_UNITS: usize = 16;
/// The most `ITRACE_TRANSLATE_AHEAD` may ask for.
const MAX_AHEAD_UNITS: usize = 1024;

/// The cache's bounds: regions per process and the size of one, and how many units are
/// translated ahead per stop. `REGION_BYTES`, `MAX_REGIONS` and `AHEAD_UNITS` unless a test or a
/// debugging session makes the cache tiny (`ITRACE_CACHE_REGIONS`, `ITRACE_CACHE_REGION_KB`), so
/// that it fills and is flushed often, or changes what is translated ahead
/// (`ITRACE_TRANSLATE_AHEAD`, 0: nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    pub regions: usize,
    pub region_bytes: u64,
    pub ahead_units: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits { regions: MAX_REGIONS, region_bytes: REGION_BYTES, ahead_units: AHEAD_UNITS }
    }
}

/// The smallest region: room for the largest unit and the cache's own `syscall` gadget.
const MIN_REGION_BYTES: u64 = 128 << 10;

static LIMITS: std::sync::OnceLock<CacheLimits> = std::sync::OnceLock::new();

impl CacheLimits {
    /// The limits the environment asks for (test and debug knobs, docs/translate.md); an error
    /// names the variable and what it takes.
    pub fn from_env() -> Result<CacheLimits, String> {
        let mut l = CacheLimits::default();
        if let Some(v) = std::env::var_os("ITRACE_CACHE_REGIONS").filter(|v| !v.is_empty()) {
            let v = v.to_string_lossy();
            l.regions = v.parse().ok().filter(|n| (1..=MAX_REGIONS).contains(n)).ok_or_else(|| {
                format!("ITRACE_CACHE_REGIONS={v}: expected a number of code cache regions from 1 to {MAX_REGIONS}")
            })?;
        }
        if let Some(v) = std::env::var_os("ITRACE_CACHE_REGION_KB").filter(|v| !v.is_empty()) {
            let v = v.to_string_lossy();
            let (lo, hi) = (MIN_REGION_BYTES >> 10, REGION_BYTES >> 10);
            l.region_bytes = v
                .parse::<u64>()
                .ok()
                .filter(|kb| kb.is_power_of_two() && (lo..=hi).contains(kb))
                .map(|kb| kb << 10)
                .ok_or_else(|| {
                    format!("ITRACE_CACHE_REGION_KB={v}: expected a code cache region size in KB, a power of two from {lo} to {hi}")
                })?;
        }
        if let Some(v) = std::env::var_os("ITRACE_TRANSLATE_AHEAD").filter(|v| !v.is_empty()) {
            let v = v.to_string_lossy();
            l.ahead_units = v.parse().ok().filter(|n| *n <= MAX_AHEAD_UNITS).ok_or_else(|| {
                format!("ITRACE_TRANSLATE_AHEAD={v}: expected a number of units to translate ahead per stop, from 0 to {MAX_AHEAD_UNITS}")
            })?;
        }
        Ok(l)
    }

    /// The limits of this recording (once; the first call's win).
    pub fn set(limits: CacheLimits) {
        let _ = LIMITS.set(limits);
    }
}

/// The cache's bounds for this recording.
pub(super) fn limits() -> CacheLimits {
    *LIMITS.get_or_init(CacheLimits::default)
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Region {
    pub(super) base: u64,
    pub(super) used: u64,
    /// What stays at its start through a flush: in the first region the cache's own `syscall`
    /// gadget and the record a clean detach leaves (`reuse.rs`), in the others their tag.
    pub(super) floor: u64,
}

/// Where a cache address is, for a thread stopped there.
#[derive(Clone, Copy, Debug)]
pub(super) enum Loc {
    /// Before application instruction `app_pc`, the unit's `count`-th.
    Boundary { app_pc: u64, count: u32 },
    /// On one of the cache's `int3`s (not yet run).
    Trap(Trap),
    /// Inside a stub or an expansion; `fault` is the application instruction whose state it
    /// still is, for a fault raised there.
    Inside { fault: Option<(u64, u32)> },
    /// Inside the check of a unit's source bytes, before its first instruction `app_pc`, with
    /// the application's rcx and rdx in the spill slots (`unit::Check::spilled`).
    Check { app_pc: u64 },
    /// In the blob a thread encodes its full ring with, or in the routine that calls it
    /// (`unit::self_encode`): it goes on to the full ring's trap or back to its stub.
    Encoding,
    /// Not in the cache.
    Outside,
}

#[derive(Default)]
pub(in super::super) struct Cache {
    pub(super) regions: Vec<Region>,
    /// Units by cache address (dead ones too: a thread may still be inside one).
    units: BTreeMap<u64, Unit>,
    /// Live units by application address: their cache start (ordered: a change of the code in
    /// a range finds its units without looking at the others).
    entries: BTreeMap<u64, u64>,
    /// Every exit of every unit, by exit id.
    pub(super) exits: Exits,
    traps: rustc_hash::FxHashMap<u64, Trap>,
    /// Direct exits by target: (slot, miss `int3`).
    links: rustc_hash::FxHashMap<u64, Vec<(u64, u64)>>,
    /// Every thread-state block mapped in the process, and those no thread uses now.
    pub(super) states: Vec<u64>,
    pub(super) free_states: Vec<u64>,
    /// State blocks an earlier session left (`reuse.rs`), not used yet: a thread that takes
    /// one gets its ring and lookup table reset first (then it is in `states`).
    pub(super) idle_states: Vec<u64>,
    /// What an earlier session left was looked for (before the first region is mapped).
    pub(super) looked_for_leftovers: bool,
    /// What was reused of it: regions, state blocks.
    pub(super) reused: Option<(usize, usize)>,
    /// A thread was let go with a pc in the cache or its gs base on a state block: the detach
    /// is not clean, and no record says the cache may be reused.
    pub(in super::super) let_go_inside: bool,
    /// The record that says a later session may reuse it was written at the detach.
    pub(super) left_reusable: bool,
    /// A `syscall` instruction in the process (in its vDSO), for the calls itrace makes there.
    pub(super) gadget: Option<u64>,
    /// The cache's own `syscall` for those calls, with its save area and a way back should
    /// itrace die during a call (`unit::remote_call_gadget`): (save area, `syscall`).
    pub(super) remote_gadget: Option<(u64, u64)>,
    mem: Option<(i32, File)>,
    /// Threads encode their own rings (`unit::self_encode`): the blob's place in the process.
    pub(super) xl_blob: Option<XlBlob>,
    /// Why this process's code is no longer translated (said once).
    pub(in super::super) disabled: Option<String>,
    /// rseq critical sections that run at their own addresses, by their descriptor's `lea`
    /// (`rseq.rs`); no unit holds their code.
    pub(in super::super) native_runs: BTreeMap<u64, NativeRun>,
    /// Sections found that cannot run natively (their start), warned about once.
    pub(super) branchy_sections: std::collections::BTreeSet<u64>,
    /// The cache is full and waits to be flushed: nothing is translated and no thread enters
    /// it until every thread of the process is out of it (`Session::try_flush`).
    pub(super) flush_pending: bool,
    /// Code no region can be placed near was met (said once).
    pub(super) said_out_of_reach: bool,
    /// The lookup-table entries itrace filled in each thread-state block (offsets from the
    /// block), so that a detach can empty them (`forget_table`) without writing the whole table.
    table_filled: rustc_hash::FxHashMap<u64, rustc_hash::FxHashSet<u64>>,
    /// Pages of read-only executable code as the program has them, read once for the
    /// translator (`CodePages`).
    pub(super) code_pages: CodePages,
}

/// The bytes of pages of the program's read-only executable mappings, as the translator read
/// them (region triggers' breakpoints taken out): a unit's instructions were read one by one, a
/// system call each, most of the translator's time after the encoder. Such code changes only by
/// a system call that changes its mapping (`mmap`, `mprotect`, `munmap`: `Cache::invalidate`
/// forgets the pages of the range, as it drops their units), so a page is read once; the
/// stepping engine keeps decoded instructions of the same mappings on the same terms.
#[derive(Default)]
pub(super) struct CodePages {
    pages: rustc_hash::FxHashMap<u64, Box<[u8]>>,
}

const PAGE: u64 = 4096;

impl CodePages {
    /// Read `buf.len()` bytes of code at `addr` (fewer where the memory ends), as the program
    /// has them: `unpatch` takes itrace's breakpoints out of bytes read from the process. Pages
    /// of read-only mappings in `maps` (executable, in address order) come from here, read
    /// whole the first time; other code is read each time (`read`).
    pub(super) fn fetch(
        &mut self,
        maps: &[crate::procfs::Mapping],
        read: &mut dyn FnMut(u64, &mut [u8]) -> usize,
        unpatch: &dyn Fn(u64, &mut [u8]),
        addr: u64,
        buf: &mut [u8],
    ) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let at = addr + done as u64;
            let page = at & !(PAGE - 1);
            let i = maps.partition_point(|m| m.end <= at);
            let read_only = maps.get(i).is_some_and(|m| m.start <= page && page + PAGE <= m.end && !m.writable());
            let want = (buf.len() - done).min((page + PAGE - at) as usize);
            let out = &mut buf[done..done + want];
            if !read_only {
                let n = read(at, out);
                unpatch(at, &mut out[..n]);
                return done + n;
            }
            let bytes = match self.pages.entry(page) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let mut bytes = vec![0u8; PAGE as usize].into_boxed_slice();
                    if read(page, &mut bytes) != PAGE as usize {
                        let n = read(at, out);
                        unpatch(at, &mut out[..n]);
                        return done + n;
                    }
                    unpatch(page, &mut bytes);
                    v.insert(bytes)
                }
            };
            let o = (at - page) as usize;
            out.copy_from_slice(&bytes[o..o + want]);
            done += want;
        }
        done
    }

    /// Code in `start..end` changed: its pages are read again.
    fn forget(&mut self, start: u64, end: u64) {
        if end - start < 64 * PAGE {
            let mut page = start & !(PAGE - 1);
            while page < end {
                self.pages.remove(&page);
                page += PAGE;
            }
        } else {
            self.pages.retain(|&page, _| page + PAGE <= start || page >= end);
        }
    }
}

impl Cache {
    /// A forked child's copy: its memory holds the parent's cache and thread-state blocks at
    /// the same addresses; none of the blocks is in use by its one thread yet.
    pub(in super::super) fn copy_for_child(&self) -> Cache {
        Cache {
            regions: self.regions.clone(),
            units: self.units.iter().map(|(k, u)| (*k, u.clone())).collect(),
            entries: self.entries.clone(),
            exits: self.exits.copy(),
            traps: self.traps.clone(),
            links: self.links.clone(),
            states: self.states.clone(),
            free_states: self.states.clone(),
            idle_states: self.idle_states.clone(),
            looked_for_leftovers: self.looked_for_leftovers,
            reused: None,
            let_go_inside: false,
            left_reusable: false,
            gadget: self.gadget,
            remote_gadget: self.remote_gadget,
            xl_blob: self.xl_blob,
            mem: None,
            disabled: self.disabled.clone(),
            native_runs: self.native_runs.clone(),
            branchy_sections: self.branchy_sections.clone(),
            flush_pending: self.flush_pending,
            said_out_of_reach: self.said_out_of_reach,
            table_filled: self.table_filled.clone(),
            code_pages: CodePages::default(),
        }
    }

    fn mem(&mut self, pid: i32) -> std::io::Result<&File> {
        if !matches!(&self.mem, Some((p, _)) if *p == pid) {
            let f = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/mem"))?;
            self.mem = Some((pid, f));
        }
        Ok(&self.mem.as_ref().expect("opened above").1)
    }

    pub(super) fn read(&mut self, pid: i32, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.mem(pid)?.read_exact_at(buf, addr)
    }

    /// `read` of readable memory (a ring): one copy from the process's pages with
    /// `process_vm_readv`, where a `/proc/PID/mem` read copies each page twice (through a kernel
    /// page): 2.2-2.5 ns per 16-byte record against 4.2-4.5 (a megabyte, measured on the
    /// 2-vCPU VM). `/proc/PID/mem` when that fails or falls short.
    pub(super) fn read_readable(&mut self, pid: i32, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: `local` is `buf`, writable for its length; the kernel only reads the remote range.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n == buf.len() as isize {
            return Ok(());
        }
        self.read(pid, addr, buf)
    }

    pub(super) fn write(&mut self, pid: i32, addr: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.mem(pid)?.write_all_at(bytes, addr)
    }

    /// Empty the ring of the thread state block at `state`: its fill and its count of records
    /// of no branch.
    /// Write the exits not yet in the process's table there, then its count (the blob reads
    /// no more than that).
    pub(super) fn sync_exits(&mut self, pid: i32) -> std::io::Result<()> {
        let Some(x) = self.xl_blob else { return Ok(()) };
        let bytes: Vec<u8> = {
            let table = self.exits.read();
            if table.len() <= x.synced {
                return Ok(());
            }
            table[x.synced..].iter().flat_map(|e| e.to_bytes()).collect()
        };
        let len = self.exits.len();
        self.write(pid, x.exits + EXITS_FIRST + 32 * x.synced as u64, &bytes)?;
        self.write(pid, x.exits, &(len as u64).to_le_bytes())?;
        if let Some(x) = &mut self.xl_blob {
            x.synced = len;
        }
        Ok(())
    }

    pub(super) fn empty_ring(&mut self, pid: i32, state: u64) -> std::io::Result<()> {
        self.write(pid, state + RING_OFF as u64, &(-RING_BYTES).to_le_bytes())?;
        self.write(pid, state + NO_BRANCH as u64, &0u64.to_le_bytes())
    }

    pub(super) fn read_u64(&mut self, pid: i32, addr: u64) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(pid, addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The live unit of application address `pc`: its entry.
    pub(super) fn entry(&self, pc: u64) -> Option<u64> {
        self.entries.get(&pc).and_then(|c| self.units.get(c)).map(Unit::entry)
    }

    /// The live unit of application address `pc`: its first instruction, past its check.
    pub(super) fn first_instruction(&self, pc: u64) -> Option<u64> {
        self.entries.get(&pc).and_then(|c| self.units.get(c)).map(Unit::first_instruction)
    }

    /// The unit at cache address `unit` found its source bytes rewritten: the application
    /// address it was translated from and the end of the bytes that differ now (the unit's
    /// end if none differ any more, or its code cannot be read).
    pub(super) fn rewritten(&mut self, pid: i32, unit: u64) -> Option<(u64, u64)> {
        let u = self.units.get(&unit)?;
        let (start, end) = (u.app_start, u.app_end);
        let source = u.check.as_ref()?.source.clone();
        let mut now = vec![0u8; source.len()];
        if self.read(pid, start, &mut now).is_err() {
            return Some((start, end));
        }
        let last_changed = source.iter().zip(&now).rposition(|(a, b)| a != b);
        Some((start, last_changed.map_or(end, |n| start + n as u64 + 1)))
    }

    /// The native run (rseq critical section) whose code holds `pc`.
    pub(super) fn native_run_covering(&self, pc: u64) -> Option<&NativeRun> {
        // Runs do not overlap: the one starting last at or before `pc` is the only candidate.
        self.native_runs.range(..=pc).next_back().map(|(_, r)| r).filter(|r| r.covers(pc))
    }

    /// Whether `addr` is in one of the cache's regions (or the blob threads encode with).
    pub(in super::super) fn owns(&self, addr: u64) -> bool {
        let size = limits().region_bytes;
        self.regions.iter().any(|r| addr >= r.base && addr < r.base + size)
            || self.xl_blob.is_some_and(|x| (x.start..x.end).contains(&addr))
    }

    /// A region near `pc` with room for a unit.
    pub(super) fn region_for(&self, pc: u64) -> Option<usize> {
        let size = limits().region_bytes;
        self.regions.iter().position(|r| r.base.abs_diff(pc) < 0x4000_0000 && r.used + MAX_UNIT_BYTES <= size)
    }

    /// The first region's base: it holds the cache's own `syscall` gadget (and the record a
    /// clean detach leaves), and never moves.
    pub(super) fn first_region(&self) -> Option<u64> {
        self.remote_gadget.map(|(save, _)| save)
    }

    /// Whether any unit is in the cache (a flush would free something).
    pub(super) fn has_units(&self) -> bool {
        self.regions.iter().any(|r| r.used > r.floor)
    }

    /// Drop every unit, exit, trap and link, make the regions empty (their code is overwritten
    /// by the next units) and the threads' lookup tables too. Only when no thread of the process
    /// is in the cache and every thread's ring is drained: the code goes, and the exit ids start
    /// again from 0.
    pub(super) fn flush(&mut self, pid: i32) -> std::io::Result<()> {
        self.units.clear();
        self.entries.clear();
        self.exits = Exits::default();
        if let Some(x) = &mut self.xl_blob {
            x.synced = 0;
        }
        self.traps.clear();
        self.links.clear();
        for r in &mut self.regions {
            r.used = r.floor;
        }
        self.flush_pending = false;
        self.table_filled.clear();
        let empty = vec![0xffu8; (TABLE_ENTRIES * TABLE_ENTRY_BYTES) as usize];
        for s in self.states.clone() {
            self.write(pid, s + TABLE as u64, &empty)?;
        }
        Ok(())
    }

    /// Where the next unit of region `r` goes (16-byte aligned).
    pub(super) fn next_at(&self, r: usize) -> u64 {
        let reg = self.regions[r];
        (reg.base + reg.used + 15) & !15
    }

    pub(super) fn trap_at(&self, addr: u64) -> Option<Trap> {
        self.traps.get(&addr).copied()
    }

    fn unit_at(&self, addr: u64) -> Option<&Unit> {
        self.units.range(..=addr).next_back().map(|(_, u)| u).filter(|u| addr < u.cache_end())
    }

    pub(super) fn locate(&self, rip: u64) -> Loc {
        if self.xl_blob.is_some_and(|x| (x.start..x.end).contains(&rip)) {
            return Loc::Encoding;
        }
        if let Some(t) = self.trap_at(rip) {
            return Loc::Trap(t);
        }
        let Some(u) = self.unit_at(rip) else { return Loc::Outside };
        if rip == u.entry() {
            return Loc::Boundary { app_pc: u.app_start, count: 0 };
        }
        if u.check.as_ref().is_some_and(|c| rip >= c.spilled.0 && rip < c.spilled.1) {
            return Loc::Check { app_pc: u.app_start };
        }
        if let Ok(n) = u.spans.binary_search_by_key(&rip, |s| s.start) {
            return Loc::Boundary { app_pc: u.spans[n].app_pc, count: n as u32 };
        }
        let fault = u.spans.iter().position(|s| rip > s.start && rip < s.commit).map(|n| (u.spans[n].app_pc, n as u32));
        Loc::Inside { fault }
    }

    /// Put `unit` (built with `first_exit == self.exits.len()`) in the process and in the
    /// tables; link its direct exits to units that exist and the exits waiting for it.
    pub(super) fn insert(&mut self, pid: i32, region: usize, mut unit: Unit) -> std::io::Result<u64> {
        for &(slot, _miss, target) in &unit.links {
            if let Some(e) = self.entry(target) {
                let o = (slot - unit.cache_start) as usize;
                unit.code[o..o + 8].copy_from_slice(&e.to_le_bytes());
            }
        }
        self.write(pid, unit.cache_start, &unit.code)?;
        let entry = unit.entry();
        if let Some(waiting) = self.links.get(&unit.app_start).cloned() {
            for (slot, _) in waiting {
                self.write(pid, slot, &entry.to_le_bytes())?;
            }
        }
        for &(slot, miss, target) in &unit.links {
            self.links.entry(target).or_default().push((slot, miss));
        }
        for &(addr, t) in &unit.traps {
            self.traps.insert(addr, t);
        }
        self.exits.extend(&unit.exits);
        let reg = &mut self.regions[region];
        reg.used = unit.cache_end() - reg.base;
        self.entries.insert(unit.app_start, unit.cache_start);
        self.units.insert(unit.cache_start, unit);
        Ok(entry)
    }

    /// Fill the lookup-table entry of application address `target` in the thread-state block
    /// `state`: the indirect branches of its thread to `target` go to `entry`.
    pub(super) fn fill_table(&mut self, pid: i32, state: u64, target: u64, entry: u64) -> std::io::Result<()> {
        let mut e = [0u8; 16];
        e[..8].copy_from_slice(&target.to_le_bytes());
        e[8..].copy_from_slice(&entry.to_le_bytes());
        self.table_filled.entry(state).or_default().insert(table_entry(target));
        self.write(pid, state + table_entry(target), &e)
    }

    /// Whether the lookup-table entry of `target` in thread-state block `state` holds nothing
    /// itrace put there (since the last flush or detach): filling it evicts no other target.
    pub(super) fn table_free(&self, state: u64, target: u64) -> bool {
        self.table_filled.get(&state).is_none_or(|filled| !filled.contains(&table_entry(target)))
    }

    /// Tracing ends: every direct exit of the unit holding cache address `addr` goes to its miss
    /// trap again, so that a thread inside the unit stops at whichever exit it takes (the
    /// others are let go meanwhile and never come back). False: no unit holds `addr`.
    pub(super) fn unlink_unit_at(&mut self, pid: i32, addr: u64) -> std::io::Result<bool> {
        let Some(u) = self.unit_at(addr) else { return Ok(false) };
        let slots: Vec<(u64, u64)> = u.links.iter().map(|&(slot, miss, _)| (slot, miss)).collect();
        for (slot, miss) in slots {
            self.write(pid, slot, &miss.to_le_bytes())?;
        }
        Ok(true)
    }

    /// Tracing ends: every entry itrace filled in the lookup table of thread-state block `state`
    /// is emptied, so that its thread's indirect exits all stop at their miss trap (the whole
    /// table in one write when most of it was filled).
    pub(super) fn forget_table(&mut self, pid: i32, state: u64) -> std::io::Result<()> {
        let Some(filled) = self.table_filled.remove(&state) else { return Ok(()) };
        if filled.len() as u64 * 16 > TABLE_ENTRIES {
            let empty = vec![0xffu8; (TABLE_ENTRIES * TABLE_ENTRY_BYTES) as usize];
            return self.write(pid, state + TABLE as u64, &empty);
        }
        for at in filled {
            self.write(pid, state + at, &TABLE_EMPTY.to_le_bytes())?;
        }
        Ok(())
    }

    /// Link the direct exit whose slot is `slot` to `entry`.
    pub(super) fn link(&mut self, pid: i32, slot: u64, entry: u64) -> std::io::Result<()> {
        self.write(pid, slot, &entry.to_le_bytes())
    }

    /// Code in `start..end` changed: its units are dead (their code stays, a thread may be in
    /// it), links to them go back to their miss traps, the threads' tables forget them.
    pub(in super::super) fn invalidate(&mut self, start: u64, end: u64) {
        // The code of a native run changed: it is looked for again.
        self.native_runs.retain(|_, r| r.end <= start || r.lea >= end);
        self.code_pages.forget(start, end);
        // Nothing was written to a process whose memory was never opened.
        let Some(pid) = self.mem.as_ref().map(|(p, _)| *p) else { return };
        // A unit holds at most MAX_UNIT_INSNS instructions of at most 15 bytes.
        let reach = super::unit::MAX_UNIT_INSNS as u64 * 15;
        let dead: Vec<u64> = self
            .entries
            .range(start.saturating_sub(reach)..end)
            .filter(|(_, c)| self.units.get(c).is_some_and(|u| u.app_end > start))
            .map(|(&app, _)| app)
            .collect();
        for app in dead {
            self.entries.remove(&app);
            if let Some(slots) = self.links.get(&app).cloned() {
                for (slot, miss) in slots {
                    let _ = self.write(pid, slot, &miss.to_le_bytes());
                }
            }
            for s in self.states.clone() {
                let at = s + table_entry(app);
                if self.read_u64(pid, at).is_ok_and(|v| v == app) {
                    let _ = self.write(pid, at, &TABLE_EMPTY.to_le_bytes());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::Mapping;
    use itrace_format::prot;

    fn mapping(start: u64, end: u64, prot: u32) -> Mapping {
        Mapping { start, end, prot, offset: 0, path: String::new() }
    }

    /// A process's memory for `CodePages::fetch`: byte `a` holds `a as u8` (plus `bump` after a
    /// "rewrite"), up to `end`; every read is counted.
    struct Memory {
        end: u64,
        bump: u8,
        reads: std::cell::Cell<usize>,
    }

    impl Memory {
        fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
            self.reads.set(self.reads.get() + 1);
            let n = (self.end.saturating_sub(addr) as usize).min(buf.len());
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = (addr + k as u64) as u8 ^ self.bump;
            }
            n
        }
    }

    #[test]
    fn code_pages_are_read_once_and_again_after_a_change() {
        // Read-only code at 0x1000..0x3000, writable code at 0x3000..0x4000; a breakpoint (0xcc
        // in memory) at 0x1ffe that `unpatch` takes out.
        let maps = [
            mapping(0x1000, 0x3000, prot::READ | prot::EXEC),
            mapping(0x3000, 0x4000, prot::READ | prot::WRITE | prot::EXEC),
        ];
        let mut mem = Memory { end: 0x4000, bump: 0, reads: Default::default() };
        let unpatch = |a: u64, buf: &mut [u8]| {
            if (a..a + buf.len() as u64).contains(&0x1ffe) {
                buf[(0x1ffe - a) as usize] = 0x90;
            }
        };
        let mut pages = CodePages::default();
        let want = |at: u64, n: usize, bump: u8| -> Vec<u8> {
            (at..at + n as u64).map(|a| if a == 0x1ffe { 0x90 } else { a as u8 ^ bump }).collect()
        };
        let fetch = |pages: &mut CodePages, mem: &Memory, at: u64, n: usize| -> Vec<u8> {
            let mut buf = vec![0u8; n];
            let got = pages.fetch(&maps, &mut |a, b| mem.read(a, b), &unpatch, at, &mut buf);
            buf.truncate(got);
            buf
        };
        // Straddling the two read-only pages: each read whole, once.
        assert_eq!(fetch(&mut pages, &mem, 0x1ff8, 15), want(0x1ff8, 15, 0));
        assert_eq!(mem.reads.get(), 2);
        assert_eq!(fetch(&mut pages, &mem, 0x1010, 15), want(0x1010, 15, 0));
        assert_eq!(fetch(&mut pages, &mem, 0x2ff1, 15), want(0x2ff1, 15, 0));
        assert_eq!(mem.reads.get(), 2, "cached pages are not read again");
        // Writable code is read each time.
        assert_eq!(fetch(&mut pages, &mem, 0x3010, 15), want(0x3010, 15, 0));
        assert_eq!(fetch(&mut pages, &mem, 0x3010, 15), want(0x3010, 15, 0));
        assert_eq!(mem.reads.get(), 4);
        // From read-only into writable code: the rest is read, not kept.
        assert_eq!(fetch(&mut pages, &mem, 0x2ffc, 8), want(0x2ffc, 8, 0));
        assert_eq!(mem.reads.get(), 5);
        // The code changes (an mprotect, say, of the second page): that page is read again.
        mem.bump = 0x5a;
        pages.forget(0x2000, 0x3000);
        assert_eq!(fetch(&mut pages, &mem, 0x2100, 15), want(0x2100, 15, 0x5a));
        assert_eq!(fetch(&mut pages, &mem, 0x1100, 15), want(0x1100, 15, 0), "the other page is kept");
        assert_eq!(mem.reads.get(), 6);
        // A large range forgets by walking the pages kept.
        pages.forget(0, 1 << 40);
        assert_eq!(fetch(&mut pages, &mem, 0x1100, 15), want(0x1100, 15, 0x5a));
        assert_eq!(mem.reads.get(), 7);
        // Memory that ends inside a read-only page: what is there, nothing kept.
        mem.end = 0x1800;
        pages.forget(0x1000, 0x2000);
        assert_eq!(fetch(&mut pages, &mem, 0x17fc, 15), want(0x17fc, 4, 0x5a));
        assert!(pages.pages.is_empty());
    }
}

/// Every exit of a process's units, by exit id, as the drain reads them ([`RingExit`]): shared
/// with the writer thread, which makes the branch records of a drained ring from them
/// (`RingBatch`). Exits are only added until a flush, which starts a new table: a ring drained
/// before it keeps the table its ids are of.
#[derive(Default)]
pub(super) struct Exits(Arc<RwLock<Vec<RingExit>>>);

/// Where the blob a thread encodes its ring with is, in a process (`unit::self_encode`).
#[derive(Clone, Copy, Debug)]
pub(super) struct XlBlob {
    /// `itrace_self_encode`, the routine that calls it, and the exit table the blob reads.
    pub(super) entry: u64,
    pub(super) routine: u64,
    pub(super) exits: u64,
    /// The blob's and the routine's addresses.
    pub(super) start: u64,
    pub(super) end: u64,
    /// Exits written to the process's table.
    pub(super) synced: usize,
}

/// The ring exit of `e` ([`RingExit`], shared with the code the threads run).
pub(super) fn ring_exit_of(e: &Exit) -> RingExit {
    let hop = Hop::new(e.from, e.to, e.count, e.kind.unwrap_or(BranchKind::Jump), e.key);
    RingExit { hop, branch: e.kind.is_some(), indirect: e.indirect }
}

impl Exits {
    /// The table (a lock poisoned by a panicking reader is taken as it is: exits are only
    /// added, whole, under the write lock).
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Vec<RingExit>> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn len(&self) -> usize {
        self.read().len()
    }

    /// Exit `id`'s target, for a direct exit.
    pub(super) fn target(&self, id: usize) -> Option<u64> {
        self.read().get(id).map(|e| e.hop.to)
    }

    /// Add a new unit's exits, each with a key of its own.
    fn extend(&mut self, exits: &[Exit]) {
        let mut table = self.0.write().unwrap_or_else(|e| e.into_inner());
        table.extend(exits.iter().map(|e| ring_exit_of(&Exit { key: next_exit_key(), ..*e })));
    }

    /// A table of its own with the same exits (a forked child's).
    fn copy(&self) -> Exits {
        Exits(Arc::new(RwLock::new(self.read().clone())))
    }

    /// The table, for a drained ring's records.
    pub(super) fn shared(&self) -> Arc<RwLock<Vec<RingExit>>> {
        Arc::clone(&self.0)
    }
}

/// A key for a new exit (`Exit::key`): one counter for every process this itrace translates,
/// so that no two exits share one, though a flush starts the exit ids again and a forked child
/// copies its parent's exits (with their keys: the copies stand for the same branches). 0, the
/// hop without a key, once the keys have run out (`Hop::MAX_KEY`: 16 M exits).
fn next_exit_key() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |k| (k <= Hop::MAX_KEY).then_some(k + 1)).unwrap_or(0)
}
