//! Module-table upkeep: process and thread names, executable mappings (re-read when a system
//! call may have changed them; the vDSO's image comes with them), JIT symbol maps, and the
//! decoded-instruction cache those mappings make safe.

use super::engine::*;
use crate::isa::ppc64::Ppc64;
use crate::procfs::{self};
use crate::{Arch, Reservation};
use itrace_decoders::Insn;
use itrace_format::{now_ns, Mte};

/// The traced machine's byte order.
pub(super) const PPC64LE: Ppc64 = Ppc64 { big_endian: false };

impl Session<'_> {
    /// JIT code symbols the traced processes published in perf map files (read at the end,
    /// when they are complete; the files outlive the processes).
    pub(super) fn save_jit_maps(&mut self) {
        let ts = now_ns();
        for pid in std::mem::take(&mut self.seen_pids) {
            for (start, size, name) in procfs::perf_map(pid) {
                self.emit_mte(Mte::JitSymbol { ts, pid: pid as u32, start, size, name });
            }
        }
    }

    /// Module-table records for a process seen for the first time (attach, exec, fork).
    pub(super) fn new_process(&mut self, pid: i32, ts: u64, ppid: i32) {
        if !self.seen_pids.contains(&pid) {
            self.seen_pids.push(pid);
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
        let Ok(new) = procfs::exec_mappings(pid) else { return };
        let Some(p) = self.procs.get_mut(&pid) else { return };
        let records = crate::modules::changes(ts, pid as u32, &p.maps, &new);
        for r in &records {
            let (Mte::Unmap { start, end, .. } | Mte::Segment { start, end, .. }) = r else { continue };
            p.code.retain(|a, _| *a < *start || *a >= *end);
            p.load_reserve.retain(|a, _| *a < *start || *a >= *end);
        }
        p.maps = new;
        for r in records {
            self.emit_mte(r);
        }
    }

    /// Decode the instruction at `pc` in `pid` (as it is without our temporary traps), from the
    /// cache when the code cannot change unseen.
    pub(super) fn decode(&mut self, pid: i32, pc: u64) -> Insn {
        if let Some(i) = self.procs.get(&pid).and_then(|p| p.code.get(&pc)) {
            return *i;
        }
        let mut buf = [0u8; 4];
        let n = read_mem(pid, pc, &mut buf);
        if let Some(old) = self.procs.get(&pid).and_then(|p| p.traps.get(&pc)) {
            buf = old.to_le_bytes();
        }
        let insn = PPC64LE.decode(pc, &buf[..n]);
        if let Some(p) = self.procs.get_mut(&pid) {
            let i = p.maps.partition_point(|m| m.end <= pc);
            let cacheable = p.maps.get(i).is_some_and(|m| m.start <= pc && !m.writable());
            if cacheable {
                p.code.insert(pc, insn);
                p.load_reserve.insert(pc, PPC64LE.reservation(&buf[..n]) == Reservation::Load);
            }
        }
        insn
    }

    /// Whether the instruction at `pc` starts a load-reserve/store-conditional sequence.
    pub(super) fn is_load_reserve(&self, pid: i32, pc: u64) -> bool {
        match self.procs.get(&pid).and_then(|p| p.load_reserve.get(&pc)) {
            Some(&known) => known,
            None => PPC64LE.reservation(&self.insn_bytes(pid, pc)) == Reservation::Load,
        }
    }

    /// The 4 bytes at `pc` (our traps taken out), for the atomic-sequence check.
    pub(super) fn insn_bytes(&self, pid: i32, pc: u64) -> [u8; 4] {
        if let Some(old) = self.procs.get(&pid).and_then(|p| p.traps.get(&pc)) {
            return old.to_le_bytes();
        }
        let mut buf = [0u8; 4];
        read_mem(pid, pc, &mut buf);
        buf
    }
}

/// Read up to `buf.len()` bytes of `pid`'s memory at `addr` (an instruction: never across a
/// page); returns how many were read.
pub(super) fn read_mem(pid: i32, addr: u64, buf: &mut [u8]) -> usize {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: `local` points into `buf` for its length; the remote range is only read by the kernel.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    n.max(0) as usize
}
