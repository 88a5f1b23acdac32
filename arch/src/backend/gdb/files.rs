//! What the stub cannot list, learned from the system calls that make it: the files a
//! program opens and maps (its libraries) for the module table, and the signal handlers it
//! installs, where a delivered signal continues.

use super::engine::*;
use super::protocol::GdbError;
use super::registers::{self};
use crate::elf::Program;
use itrace_format::{now_ns, Mte};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

impl Session<'_> {
    /// Module-table records: the process, and the segments of the program (and its loader) at the
    /// addresses the auxiliary vector says they were loaded (the stub cannot list mappings).
    pub(super) fn module_table(&mut self) -> Result<(), GdbError> {
        let ts = now_ns();
        let (pid, tid) = (self.pid, self.tid);
        let name = self.opts.process_name.clone();
        self.emit_mte(Mte::ProcessName { ts, pid, ppid: 0, name: name.clone() });
        self.emit_mte(Mte::ThreadName { ts, pid, tid, name });
        let Some(prog) = self.opts.program.clone() else { return Ok(()) };
        let auxv = self.auxv();
        let bias = if prog.position_independent {
            match (auxv.get(&AT_ENTRY), auxv.get(&AT_PHDR)) {
                (Some(&entry), _) => entry.wrapping_sub(prog.entry),
                _ => 0,
            }
        } else {
            0
        };
        self.segments(&prog, bias, ts);
        if let (Some(interp), Some(&base)) = (&prog.interpreter, auxv.get(&AT_BASE)) {
            let host_path = match &self.opts.sysroot {
                Some(root) => root.join(interp.strip_prefix("/").unwrap_or(interp)),
                None => interp.clone(),
            };
            if let Ok(loader) = Program::read(&host_path) {
                let low = loader.loads.iter().map(|l| l.vaddr).min().unwrap_or(0) & !0xfff;
                self.segments(&loader, base.wrapping_sub(low), ts);
            }
        }
        Ok(())
    }

    pub(super) fn segments(&mut self, prog: &Program, bias: u64, ts: u64) {
        let path = std::fs::canonicalize(&prog.path).unwrap_or_else(|_| prog.path.clone());
        for l in &prog.loads {
            let start = l.vaddr.wrapping_add(bias);
            let end = start.wrapping_add(l.memsz);
            if l.prot & 2 == 0 {
                self.read_only.push((start, end));
            }
            let path = path.display().to_string();
            let identity = crate::modules::identity_record(ts, self.pid, start, &path);
            self.emit_mte(Mte::Segment { ts, pid: self.pid, prot: l.prot, start, end, offset: l.offset, path });
            if let Some(id) = identity {
                self.emit_mte(id);
            }
        }
    }

    /// The target's auxiliary vector (empty when the stub does not offer it).
    pub(super) fn auxv(&mut self) -> HashMap<u64, u64> {
        let Ok(data) = self.conn.qxfer("auxv", "") else { return HashMap::new() };
        let word = if self.opts.arch.trace_arch() == itrace_format::Arch::I386 { 4 } else { 8 };
        data.chunks_exact(2 * word)
            .filter_map(|e| {
                let k = registers::value(&e[..word], self.info.big_endian).ok()?;
                let v = registers::value(&e[word..], self.info.big_endian).ok()?;
                Some((k, v))
            })
            .collect()
    }

    /// Before a system call runs: what to note when it returns, for the calls that open, close
    /// and map files (the stub cannot list mappings; libraries the loader maps come this way).
    pub(super) fn mapping_call(&mut self, nr: u64) -> Result<Option<MappingCall>, GdbError> {
        let calls = self.info.mapping_calls;
        let arg = |s: &mut Self, i: usize| s.read_reg(s.arg_regs[i]);
        Ok(Some(if nr == calls.open || nr == calls.openat {
            let ptr = arg(self, if nr == calls.openat { 1 } else { 0 })?;
            MappingCall::Open(self.read_c_string(ptr)?)
        } else if nr == calls.close {
            MappingCall::Close(arg(self, 0)?)
        } else if nr == calls.mmap {
            let mut args = [0u64; 6];
            if calls.mmap_args_in_memory {
                let base = arg(self, 0)?;
                for (i, a) in args.iter_mut().enumerate() {
                    // An unreadable block makes the call fail (EFAULT): nothing to note.
                    let Some(v) = self.read_word(base + 8 * i as u64, 8)? else { return Ok(None) };
                    *a = v;
                }
            } else {
                for (i, a) in args.iter_mut().enumerate() {
                    *a = arg(self, i)?;
                }
            }
            let [_, len, prot, _, fd, offset] = args;
            MappingCall::Mmap { len, prot, fd, offset: offset.wrapping_mul(calls.mmap_offset_unit) }
        } else {
            return Ok(None);
        }))
    }

    /// After a call of [`Session::mapping_call`] returned: remember the descriptor, or write the
    /// mapped file's segment to the module table.
    pub(super) fn mapping_call_returned(&mut self, call: MappingCall) -> Result<(), GdbError> {
        let word = if self.opts.arch.trace_arch() == itrace_format::Arch::I386 { 32 } else { 64 };
        let ret = self.read_reg(self.ret_reg)?;
        // Sign-extend a 32-bit result; -4095..-1 are errors.
        let ret = if word == 32 { ret as u32 as i32 as i64 } else { ret as i64 };
        if (-4095..0).contains(&ret) {
            return Ok(());
        }
        match call {
            MappingCall::Open(path) => {
                self.fds.insert(ret as u64, path);
            }
            MappingCall::Close(fd) => {
                self.fds.remove(&fd);
            }
            MappingCall::Mmap { len, prot, fd, offset } => {
                let fd = if word == 32 { fd as u32 as i32 as i64 } else { fd as i64 };
                // An executable file mapping (as the ptrace recorder's module table has), at a page
                // address (PowerPC reports errors as small positive numbers).
                let Some(path) =
                    self.fds.get(&(fd as u64)).filter(|_| prot & 4 != 0 && fd >= 0 && ret & 0xfff == 0 && ret > 0)
                else {
                    return Ok(());
                };
                let host = match &self.opts.sysroot {
                    Some(root) if Path::new(path).is_absolute() => {
                        let p = root.join(path.trim_start_matches('/'));
                        if p.exists() {
                            p
                        } else {
                            PathBuf::from(path)
                        }
                    }
                    _ => PathBuf::from(path),
                };
                let path = std::fs::canonicalize(&host).unwrap_or(host).display().to_string();
                let start = ret as u64;
                if prot & 2 == 0 {
                    // Read-only code of a library: decoded once, run in straight runs.
                    self.read_only.push((start, start.wrapping_add(len)));
                }
                let ts = now_ns();
                let identity = crate::modules::identity_record(ts, self.pid, start, &path);
                self.emit_mte(Mte::Segment {
                    ts,
                    pid: self.pid,
                    prot: (prot & 7) as u32,
                    start,
                    end: start.wrapping_add(len),
                    offset,
                    path,
                });
                if let Some(id) = identity {
                    self.emit_mte(id);
                }
            }
        }
        Ok(())
    }

    /// A NUL-terminated string of the program's (up to 4 KiB), read in small pieces so that
    /// the end of its page does not fail the read.
    pub(super) fn read_c_string(&mut self, mut addr: u64) -> Result<String, GdbError> {
        let mut out = Vec::new();
        while out.len() < 4096 {
            let piece = self.conn.read_memory(addr, 64 - (addr % 64) as usize)?;
            if piece.is_empty() {
                break;
            }
            if let Some(end) = piece.iter().position(|&b| b == 0) {
                out.extend_from_slice(&piece[..end]);
                break;
            }
            addr += piece.len() as u64;
            out.extend_from_slice(&piece);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Before a sigaction call runs: remember the handler it installs.
    pub(super) fn note_sigaction(&mut self) -> Result<(), GdbError> {
        let sig = self.read_reg(self.arg_regs[0])?;
        let act = self.read_reg(self.arg_regs[1])?;
        if act == 0 {
            return Ok(()); // a query
        }
        let word = if self.opts.arch.trace_arch() == itrace_format::Arch::I386 { 4 } else { 8 };
        // A bad pointer makes the call fail (EFAULT): nothing to note.
        let Some(mut handler) = self.read_word(act, word)? else { return Ok(()) };
        if self.info.function_descriptors && handler > 1 {
            let Some(code) = self.read_word(handler, word)? else { return Ok(()) };
            handler = code;
        }
        self.handlers.insert(sig, handler);
        Ok(())
    }

    /// A word of the program's memory; `None` where it cannot be read.
    pub(super) fn read_word(&mut self, addr: u64, word: usize) -> Result<Option<u64>, GdbError> {
        let bytes = self.conn.read_memory(addr, word)?;
        if bytes.len() != word {
            return Ok(None);
        }
        registers::value(&bytes, self.info.big_endian).map(Some)
    }
}
