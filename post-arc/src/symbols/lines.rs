//! Source lines from DWARF, through addr2line.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use gimli::{EndianArcSlice, RunTimeEndian, SectionId};

use super::elf::ElfFile;
use super::guarded;

type Reader = EndianArcSlice<RunTimeEndian>;

/// The DWARF line lookup state of one image.
pub(crate) struct Lines {
    /// addr2line parses units lazily through interior mutability that is not
    /// `Sync`; the mutex lets `ModuleSymbols` be shared across threads.
    ctx: Mutex<addr2line::Context<Reader>>,
    /// Source file names, one allocation each.
    files: Mutex<HashSet<Arc<str>>>,
}

impl Lines {
    /// Build the addr2line context from the DWARF sections of `elf`. The
    /// sections are copied (and decompressed) so the context owns its data.
    pub fn load(elf: &ElfFile, bytes: &[u8]) -> Option<Lines> {
        let endian = if elf.is_big_endian() { RunTimeEndian::Big } else { RunTimeEndian::Little };
        let section = |id: SectionId| -> Result<Reader, gimli::Error> {
            let name = id.name();
            let zname = name.replacen(".debug_", ".zdebug_", 1);
            let data: Arc<[u8]> = elf
                .section(name)
                .or_else(|| elf.section(&zname))
                .and_then(|s| elf.section_contents(bytes, s))
                .map(|c| Arc::from(c.as_ref()))
                .unwrap_or_else(|| Arc::from(&[][..]));
            Ok(EndianArcSlice::new(data, endian))
        };
        let ctx = guarded(|| {
            let dwarf = gimli::Dwarf::load(section).ok()?;
            addr2line::Context::from_dwarf(dwarf).ok()
        })?;
        Some(Lines { ctx: Mutex::new(ctx), files: Mutex::new(HashSet::new()) })
    }

    /// The line of `addr`, if the line table has a nonzero one.
    pub fn line(&self, addr: u64) -> Option<u32> {
        // addr2line probes the range [addr, addr + 1).
        if addr == u64::MAX {
            return None;
        }
        // A panic while holding the lock leaves addr2line's caches in a
        // usable state (they are fill-once), so a poisoned lock is still fine.
        let ctx = self.ctx.lock().unwrap_or_else(|e| e.into_inner());
        guarded(|| ctx.find_location(addr).ok()??.line.filter(|&l| l != 0))
    }

    /// The source file (as the line table names it, joined to its compilation directory, as
    /// binutils' addr2line prints it) and line of `addr`, if the line is nonzero.
    pub fn location(&self, addr: u64) -> Option<(Arc<str>, u32)> {
        if addr == u64::MAX {
            return None;
        }
        let ctx = self.ctx.lock().unwrap_or_else(|e| e.into_inner());
        let (file, line) = guarded(|| {
            let loc = ctx.find_location(addr).ok()??;
            Some((loc.file?.to_string(), loc.line.filter(|&l| l != 0)?))
        })?;
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let file = match files.get(file.as_str()) {
            Some(f) => f.clone(),
            None => {
                let f: Arc<str> = Arc::from(file);
                files.insert(f.clone());
                f
            }
        };
        Some((file, line))
    }
}
