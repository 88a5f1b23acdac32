//! Symbols, PLT ranges and lines of one ELF image.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use goblin::elf::header::EM_PPC64;
use goblin::elf::section_header::{SHT_DYNSYM, SHT_SYMTAB};

use super::elf::{Bytes, ElfFile};
use super::frames;
use super::lines::Lines;
use super::plt::{self, PltEntry};
use super::table::{Opd, SymbolTable};
use super::{SymbolError, SymbolHit};

/// Where distributions install separate debug files (`.build-id/xx/yyyy.debug`).
pub const DEFAULT_DEBUG_DIR: &str = "/usr/lib/debug";

/// Symbols, PLT ranges and source lines of one ELF image (a file on disk, or bytes such as a saved vDSO).
pub struct ModuleSymbols {
    name: String,
    bytes: Bytes,
    elf: ElfFile,
    table: SymbolTable,
    /// PLT entries, sorted by address.
    plt: Vec<PltEntry>,
    debug_file: Option<PathBuf>,
    /// True when function names came from a full symbol table (`.symtab` of the image or of
    /// its debug file), false when only from `.dynsym` (a stripped image).
    full_symtab: bool,
    /// Built on the first `line` call: most modules of a trace never need
    /// lines, and parsing DWARF is the expensive part of loading.
    lines: OnceLock<Option<Lines>>,
}

impl std::fmt::Debug for ModuleSymbols {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleSymbols")
            .field("name", &self.name)
            .field("machine", &self.elf.machine)
            .field("symbols", &self.table.len())
            .field("debug_file", &self.debug_file)
            .finish_non_exhaustive()
    }
}

impl ModuleSymbols {
    /// Load the ELF file at `path`, looking for separate debug info under [`DEFAULT_DEBUG_DIR`].
    pub fn from_path(path: &Path) -> Result<Self, SymbolError> {
        Self::from_path_with_debug_dirs(path, &[PathBuf::from(DEFAULT_DEBUG_DIR)])
    }

    /// Load the ELF file at `path`, looking for separate debug info under `debug_dirs`.
    pub fn from_path_with_debug_dirs(path: &Path, debug_dirs: &[PathBuf]) -> Result<Self, SymbolError> {
        let bytes = map_file(path)?;
        Self::new(path.display().to_string(), bytes, debug_dirs)
    }

    /// Load the ELF file at `file`, a copy of the image at `name` (a trace's archive): names
    /// of functions without symbols are made from `name`.
    pub fn from_copy(file: &Path, name: &str, debug_dirs: &[PathBuf]) -> Result<Self, SymbolError> {
        let bytes = map_file(file)?;
        let mut m = Self::new(name.to_string(), bytes, debug_dirs)?;
        m.name = file.display().to_string();
        Ok(m)
    }

    /// Load an ELF image held in memory (a vDSO saved in the trace); `name` is used in errors.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self, SymbolError> {
        Self::from_bytes_with_debug_dirs(name, bytes, &[PathBuf::from(DEFAULT_DEBUG_DIR)])
    }

    /// Load an ELF image held in memory, looking for separate debug info under `debug_dirs`.
    pub fn from_bytes_with_debug_dirs(name: &str, bytes: Vec<u8>, debug_dirs: &[PathBuf]) -> Result<Self, SymbolError> {
        Self::new(name.to_string(), Bytes::Owned(bytes), debug_dirs)
    }

    fn new(name: String, bytes: Bytes, debug_dirs: &[PathBuf]) -> Result<Self, SymbolError> {
        let elf = ElfFile::parse(&name, &bytes)?;
        let debug_file = elf
            .build_id
            .as_deref()
            .and_then(|id| find_debug_file(id, debug_dirs))
            .or_else(|| find_debuglink_file(&name, &elf, &bytes, debug_dirs))
            .or_else(|| {
                // A stripped image of a file (not a saved vDSO): elfutils' client cache, then
                // the debuginfod servers of DEBUGINFOD_URLS.
                let stripped = elf.section(".symtab").is_none();
                let file = name.starts_with('/');
                stripped
                    .then_some(())
                    .filter(|_| file)
                    .and(elf.build_id.as_deref())
                    .and_then(|id| super::debuginfod::find_debuginfo(id, &name))
            });

        // A debug file's .opd is NOBITS, so descriptors are always read from
        // the image itself.
        let opd = (elf.machine == EM_PPC64)
            .then(|| elf.section(".opd"))
            .flatten()
            .and_then(|s| Some(Opd { addr: s.addr, data: s.data(&bytes)?.to_vec(), big_endian: elf.is_big_endian() }));

        // Stripping keeps .eh_frame: its FDEs say where the functions no symbol names are.
        let mut frames = frames::function_starts(&elf, &bytes);
        let debug = debug_file.as_deref().and_then(|p| open_debug_file(p, elf.build_id.as_deref()));
        if let Some((dbytes, delf)) = &debug {
            frames.extend(frames::function_starts(delf, dbytes));
            frames::normalize(&mut frames);
        }
        let prefix = name.rsplit('/').next().unwrap_or(&name).to_string();
        let mut full_symtab = true;
        let table = match elf.symbols(&bytes, SHT_SYMTAB) {
            Some(syms) => SymbolTable::build(&elf, syms, opd.as_ref(), &frames, &prefix),
            None => {
                // Stripped image: the debug file keeps the full .symtab,
                // including static functions .dynsym lacks.
                let from_debug = debug.as_ref().and_then(|(dbytes, delf)| {
                    let syms = delf.symbols(dbytes, SHT_SYMTAB)?;
                    Some(SymbolTable::build(delf, syms, opd.as_ref(), &frames, &prefix))
                });
                match from_debug {
                    Some(t) => t,
                    None => {
                        full_symtab = false;
                        let syms = elf.symbols(&bytes, SHT_DYNSYM).unwrap_or_default();
                        SymbolTable::build(&elf, syms, opd.as_ref(), &frames, &prefix)
                    }
                }
            }
        };

        let plt = plt::plt_entries(&elf, &bytes);

        Ok(ModuleSymbols { name, bytes, elf, table, plt, debug_file, full_symtab, lines: OnceLock::new() })
    }

    /// Translate a runtime address inside a mapping (start address, file offset of the mapping) to the
    /// ELF's own virtual address (st_value terms), using the PT_LOAD program headers.
    pub fn file_vaddr(&self, map_start: u64, map_file_offset: u64, runtime_addr: u64) -> Option<u64> {
        let file_off = runtime_addr.checked_sub(map_start)?.checked_add(map_file_offset)?;
        let seg = self.elf.loads.iter().find(|s| file_off >= s.offset && file_off - s.offset < s.filesz)?;
        seg.vaddr.checked_add(file_off - seg.offset)
    }

    /// Where `vaddr` of this image is in a process that mapped the image's file offset
    /// `map_file_offset` at `map_start` (the inverse of [`Self::file_vaddr`]); `None` when that
    /// mapping does not hold it.
    pub fn runtime_addr(&self, map_start: u64, map_file_offset: u64, map_len: u64, vaddr: u64) -> Option<u64> {
        let seg = self.elf.loads.iter().find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)?;
        let file_off = seg.offset + (vaddr - seg.vaddr);
        let rel = file_off.checked_sub(map_file_offset)?;
        (rel < map_len).then(|| map_start + rel)
    }

    /// Address (in the image's own terms) of the function named `name`, mangled or demangled.
    pub fn find_function(&self, name: &str) -> Option<u64> {
        self.table.find(name)
    }

    /// The image's functions (symbols and call-frame information): address, demangled name.
    pub fn functions(&self) -> impl Iterator<Item = (u64, &str)> {
        self.table.functions()
    }

    /// The demangled names of the image's functions (symbols and call-frame information).
    pub fn function_names(&self) -> impl Iterator<Item = &str> {
        self.table.names()
    }

    /// Function symbol covering `vaddr`: demangled name and offset from the symbol start.
    /// PLT stubs (.plt, .plt.sec, .plt.got) give `name@plt`, PLT headers `<plt>`.
    #[inline]
    pub fn lookup(&self, vaddr: u64) -> Option<SymbolHit<'_>> {
        if let Some(e) = plt::lookup(&self.plt, vaddr) {
            return Some(SymbolHit {
                name: &e.name,
                start: e.start,
                offset: vaddr - e.start,
                plt: Some(e.part),
                local_entry: 0,
            });
        }
        self.table.lookup(vaddr)
    }

    /// Source line (DWARF, via the addr2line crate) of `vaddr`, if the image or its separate debug file has line info.
    pub fn line(&self, vaddr: u64) -> Option<u32> {
        self.lines.get_or_init(|| self.load_lines()).as_ref()?.line(vaddr)
    }

    /// Source file and line of `vaddr` (DWARF), if the image or its debug file has them.
    pub fn source(&self, vaddr: u64) -> Option<(std::sync::Arc<str>, u32)> {
        self.lines.get_or_init(|| self.load_lines()).as_ref()?.location(vaddr)
    }

    fn load_lines(&self) -> Option<Lines> {
        if self.elf.has_dwarf_lines() {
            return Lines::load(&self.elf, &self.bytes);
        }
        let (dbytes, delf) = open_debug_file(self.debug_file.as_deref()?, self.elf.build_id.as_deref())?;
        if !delf.has_dwarf_lines() {
            return None;
        }
        Lines::load(&delf, &dbytes)
    }

    /// The path or name the image was loaded from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for ELFCLASS32 images.
    pub fn is_32bit(&self) -> bool {
        self.elf.is_32bit()
    }

    /// True for ELFDATA2MSB images.
    pub fn is_big_endian(&self) -> bool {
        self.elf.is_big_endian()
    }

    /// The ELF header's e_machine.
    pub fn machine(&self) -> u16 {
        self.elf.machine
    }

    /// The GNU build-id note, if the image has one.
    pub fn build_id(&self) -> Option<&[u8]> {
        self.elf.build_id.as_deref()
    }

    /// The separate debug file found by build-id, if any.
    pub fn debug_file(&self) -> Option<&Path> {
        self.debug_file.as_deref()
    }

    /// False for a stripped image without a debug file: only its exported functions have
    /// names, the others are named `module+0xOFFSET` from call-frame information.
    pub fn has_full_symbols(&self) -> bool {
        self.full_symtab
    }

    /// Number of distinct function symbol addresses.
    pub fn symbol_count(&self) -> usize {
        self.table.len()
    }
}

fn map_file(path: &Path) -> Result<Bytes, SymbolError> {
    let io = |source| SymbolError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(SymbolError::NotElf { name: path.display().to_string(), reason: "not a regular file".into() });
    }
    if meta.len() == 0 {
        // mmap rejects empty files; the parser reports the empty image.
        return Ok(Bytes::Owned(Vec::new()));
    }
    // SAFETY: the map is read-only and this process never writes the file.
    // Another process truncating or rewriting it while it is mapped would
    // change bytes under a `&[u8]`, which no Rust code can rule out for a
    // file mapping; the files are installed binaries, libraries and debug
    // files, which package managers and linkers replace by rename rather
    // than rewrite in place, and every read of the map is bounds-checked.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Bytes::Map(map))
}

/// `<dir>/.build-id/xx/yyyy.debug` for the first debug dir that has it.
fn find_debug_file(build_id: &[u8], debug_dirs: &[PathBuf]) -> Option<PathBuf> {
    build_id_debug_files(build_id, debug_dirs).into_iter().find(|p| p.is_file())
}

/// Where the debug file of `build_id` is looked for under `debug_dirs`, in order:
/// `<dir>/.build-id/xx/yyyy.debug` (none for a build-id too short to split).
pub fn build_id_debug_files(build_id: &[u8], debug_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let Some((first, rest)) = build_id.split_first().filter(|(_, rest)| !rest.is_empty()) else {
        return Vec::new();
    };
    let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    debug_dirs.iter().map(|d| d.join(".build-id").join(format!("{first:02x}")).join(format!("{rest}.debug"))).collect()
}

/// The debug file `.gnu_debuglink` names, where GDB looks for it: next to the image, in
/// `.debug/` there, and under each debug dir followed by the image's directory; its CRC-32
/// must match the link's.
fn find_debuglink_file(name: &str, elf: &ElfFile, bytes: &[u8], debug_dirs: &[PathBuf]) -> Option<PathBuf> {
    let image = Path::new(name);
    if !image.is_absolute() {
        return None;
    }
    let link = elf.section(".gnu_debuglink")?.data(bytes)?;
    let len = link.iter().position(|&b| b == 0)?;
    let file = std::str::from_utf8(&link[..len]).ok()?;
    let crc_at = (len + 1).next_multiple_of(4);
    let crc: [u8; 4] = link.get(crc_at..crc_at + 4)?.try_into().ok()?;
    let crc = if elf.is_big_endian() { u32::from_be_bytes(crc) } else { u32::from_le_bytes(crc) };
    let dir = image.parent()?;
    let mut candidates = vec![dir.join(file), dir.join(".debug").join(file)];
    let relative = dir.strip_prefix("/").ok()?;
    candidates.extend(debug_dirs.iter().map(|d| d.join(relative).join(file)));
    candidates.into_iter().find(|p| p.as_path() != image && p.is_file() && file_crc32(p) == Some(crc))
}

fn file_crc32(path: &Path) -> Option<u32> {
    let bytes = map_file(path).ok()?;
    let mut crc = flate2::Crc::new();
    crc.update(&bytes);
    Some(crc.sum())
}

/// Map and parse a debug file, checking it carries the image's build-id.
fn open_debug_file(path: &Path, build_id: Option<&[u8]>) -> Option<(Bytes, ElfFile)> {
    let bytes = map_file(path).ok()?;
    let elf = ElfFile::parse(&path.display().to_string(), &bytes).ok()?;
    (elf.build_id.as_deref() == build_id).then_some((bytes, elf))
}
