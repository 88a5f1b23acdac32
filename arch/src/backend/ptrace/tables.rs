//! Module-table upkeep: process and thread names, executable mappings (re-read when a system
//! call may have changed them; the vDSO's image comes with them), JIT symbol maps, and the
//! decoded-instruction cache those mappings make safe.

use super::arch::{Isa, INSN_READ_LEN};
use super::engine::*;
use crate::procfs::{self};
use crate::Arch;
use itrace_decoders::Insn;
use itrace_format::{now_ns, Mte};

impl Session<'_> {
    /// JIT code symbols the traced processes published in perf map files (read at the end,
    /// when they are complete; the files outlive the processes).
    pub(super) fn save_jit_maps(&mut self) {
        let ts = now_ns();
        for (pid, started) in std::mem::take(&mut self.seen_pids) {
            for (start, size, name) in procfs::perf_map(pid, started) {
                self.emit_mte(Mte::JitSymbol { ts, pid: pid as u32, start, size, name });
            }
        }
    }

    /// Module-table records for a process seen for the first time (attach, exec, fork).
    pub(super) fn new_process(&mut self, pid: i32, ts: u64, ppid: i32) {
        if !self.seen_pids.iter().any(|&(p, _)| p == pid) {
            self.seen_pids.push((pid, procfs::process_start(pid)));
        }
        let name = procfs::comm(pid, pid);
        self.emit_mte(Mte::ProcessName { ts, pid: pid as u32, ppid: ppid as u32, name: name.clone() });
        self.procs.insert(pid, Process::new(Vec::new(), IntMap::default(), name));
        self.refresh_maps(pid, ts);
    }

    pub(super) fn name_thread(&mut self, pid: i32, tid: i32, ts: u64) {
        let name = procfs::comm(pid, tid);
        let changed = match self.threads.get_mut(&tid) {
            Some(t) if t.name != name && !name.is_empty() => {
                t.name = name.clone();
                true
            }
            _ => false,
        };
        if changed {
            self.emit_mte(Mte::ThreadName { ts, pid: pid as u32, tid: tid as u32, name });
        }
    }

    /// Re-read a process's executable mappings; write what changed; forget decoded code that moved.
    pub(super) fn refresh_maps(&mut self, pid: i32, ts: u64) {
        let Ok(mut new) = procfs::exec_mappings(pid) else { return };
        let Some(p) = self.procs.get_mut(&pid) else { return };
        // itrace's own code (the translating recorder's cache) is not the program's.
        new.retain(|m| !p.arch.hides(m.start));
        let records = crate::modules::changes(ts, pid as u32, &p.maps, &new);
        // Decoded code in a range that changed may be stale.
        for r in &records {
            let (Mte::Unmap { start, end, .. } | Mte::Segment { start, end, .. }) = r else { continue };
            p.code.retain(|a, _| *a < *start || *a >= *end);
            p.arch.forget(*start, *end, matches!(r, Mte::Unmap { .. }));
        }
        p.maps = new;
        for r in records {
            self.emit_mte(r);
        }
    }

    /// Decode the instruction at `pc` in `pid` (as it is without our breakpoints and traps),
    /// from the cache when the code cannot change unseen.
    pub(super) fn decode(&mut self, pid: i32, isa: Isa, pc: u64) -> Insn {
        if let Some(i) = self.procs.get(&pid).and_then(|p| p.code.get(&pc)) {
            return *i;
        }
        let mut buf = [0u8; INSN_READ_LEN];
        let n = read_mem(pid, pc, &mut buf);
        if let Some(p) = self.procs.get(&pid) {
            p.region.bps.unpatch(pc, &mut buf[..n]);
            p.arch.unpatch(pc, &mut buf[..n]);
        }
        let insn = isa.decode(pc, &buf[..n]);
        if let Some(p) = self.procs.get_mut(&pid) {
            let i = p.maps.partition_point(|m| m.end <= pc);
            let cacheable = p.maps.get(i).is_some_and(|m| m.start <= pc && !m.writable());
            if cacheable {
                p.code.insert(pc, insn);
                p.arch.cached(pc, &buf[..n]);
            }
        }
        insn
    }
}

/// Read up to `buf.len()` bytes of `pid`'s memory at `addr`; returns how many were read.
pub(super) fn read_mem(pid: i32, addr: u64, buf: &mut [u8]) -> usize {
    // Stop at the page end first so an unmapped next page cannot fail the whole read.
    let page_left = (0x1000 - (addr & 0xfff)) as usize;
    let first = buf.len().min(page_left);
    let mut done = 0;
    for (off, len) in [(0usize, first), (first, buf.len() - first)] {
        if len == 0 {
            continue;
        }
        let local = libc::iovec { iov_base: buf[off..].as_mut_ptr().cast(), iov_len: len };
        let remote = libc::iovec { iov_base: (addr + off as u64) as *mut libc::c_void, iov_len: len };
        // SAFETY: `local` points into `buf` for `len` bytes; the remote range is only read by the kernel.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            break;
        }
        done += n as usize;
        if (n as usize) < len {
            break;
        }
    }
    done
}
