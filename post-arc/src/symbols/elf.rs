//! Minimal, bounds-checked reading of the ELF parts symbolization needs.
//!
//! goblin's `Elf::parse` also parses relocations, the dynamic section and
//! symbol versions, and fails on separate debug files whose PT_DYNAMIC
//! points at stripped (NOBITS) data; so only the pieces used here are parsed.

use std::borrow::Cow;
use std::io::Read;
use std::ops::Deref;

use goblin::container::{Container, Ctx};
use goblin::elf::program_header::{ProgramHeader, PT_LOAD, PT_NOTE};
use goblin::elf::section_header::{SectionHeader, SHF_ALLOC, SHF_COMPRESSED, SHF_EXECINSTR, SHT_NOBITS, SHT_NOTE};
use goblin::elf::sym::{Sym, Symtab};
use goblin::elf::Elf;

use super::SymbolError;

/// Upper bound for one decompressed debug section, so a corrupt header
/// cannot make us allocate without limit.
const MAX_DECOMPRESSED: u64 = 1 << 32;

const NT_GNU_BUILD_ID: u32 = 3;
const SHN_XINDEX: u16 = 0xffff;
const ELFCOMPRESS_ZLIB: u32 = 1;
const ELFCOMPRESS_ZSTD: u32 = 2;

/// The bytes of an image: a read-only file mapping or an owned buffer.
pub(crate) enum Bytes {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// One section header, with its name resolved.
#[derive(Debug, Clone)]
pub(crate) struct Section {
    pub name: String,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    pub entsize: u64,
}

impl Section {
    pub fn is_exec(&self) -> bool {
        self.flags & u64::from(SHF_EXECINSTR) != 0
    }

    pub fn is_alloc(&self) -> bool {
        self.flags & u64::from(SHF_ALLOC) != 0
    }

    /// The section's bytes in the file; `None` for NOBITS or out-of-range sections.
    pub fn data<'a>(&self, bytes: &'a [u8]) -> Option<&'a [u8]> {
        if self.sh_type == SHT_NOBITS {
            return None;
        }
        slice(bytes, self.offset, self.size)
    }
}

/// One PT_LOAD program header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
}

/// A symbol as read from a symbol table, name resolved.
pub(crate) struct RawSym {
    pub name: String,
    pub value: u64,
    pub size: u64,
    pub st_type: u8,
    pub bind: u8,
    /// st_other: visibility, and on 64-bit PowerPC ELFv2 the local entry point's offset.
    pub other: u8,
    pub shndx: usize,
}

/// The parsed metadata of an ELF image (no borrow of its bytes).
pub(crate) struct ElfFile {
    pub ctx: Ctx,
    pub machine: u16,
    /// The entry point (e_entry).
    pub entry: u64,
    pub sections: Vec<Section>,
    pub loads: Vec<Segment>,
    pub build_id: Option<Vec<u8>>,
}

/// `len` bytes at `offset`, if entirely inside `bytes`.
pub(crate) fn slice(bytes: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    bytes.get(start..end)
}

/// The NUL-terminated string at `offset` of a string table.
fn c_str(table: &[u8], offset: usize) -> Option<&[u8]> {
    let rest = table.get(offset..)?;
    let len = rest.iter().position(|&b| b == 0)?;
    Some(&rest[..len])
}

fn read_u32(b: &[u8], off: usize, big: bool) -> Option<u32> {
    let a: [u8; 4] = b.get(off..off.checked_add(4)?)?.try_into().ok()?;
    Some(if big { u32::from_be_bytes(a) } else { u32::from_le_bytes(a) })
}

pub(crate) fn read_u64(b: &[u8], off: usize, big: bool) -> Option<u64> {
    let a: [u8; 8] = b.get(off..off.checked_add(8)?)?.try_into().ok()?;
    Some(if big { u64::from_be_bytes(a) } else { u64::from_le_bytes(a) })
}

impl ElfFile {
    /// Parse the header, program headers, section headers and build-id of `bytes`.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Self, SymbolError> {
        let malformed = |reason: String| SymbolError::Malformed { name: name.to_string(), reason };
        if bytes.is_empty() {
            return Err(SymbolError::NotElf { name: name.to_string(), reason: "empty file".into() });
        }
        if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
            return Err(SymbolError::NotElf { name: name.to_string(), reason: "no ELF magic".into() });
        }
        let header = Elf::parse_header(bytes).map_err(|e| malformed(format!("ELF header: {e}")))?;
        let container = header.container().map_err(|e| malformed(format!("ELF header: {e}")))?;
        let endian = header.endianness().map_err(|e| malformed(format!("ELF header: {e}")))?;
        let ctx = Ctx::new(container, endian);

        let phdrs = if header.e_phoff != 0 && header.e_phnum != 0 {
            let off =
                usize::try_from(header.e_phoff).map_err(|_| malformed("program header offset too large".into()))?;
            ProgramHeader::parse(bytes, off, usize::from(header.e_phnum), ctx)
                .map_err(|e| malformed(format!("program headers: {e}")))?
        } else {
            Vec::new()
        };
        let shdrs = if header.e_shoff != 0 {
            let off =
                usize::try_from(header.e_shoff).map_err(|_| malformed("section header offset too large".into()))?;
            SectionHeader::parse(bytes, off, usize::from(header.e_shnum), ctx)
                .map_err(|e| malformed(format!("section headers: {e}")))?
        } else {
            Vec::new()
        };

        let shstrndx = if header.e_shstrndx == SHN_XINDEX {
            shdrs.first().map_or(0, |s| s.sh_link as usize)
        } else {
            usize::from(header.e_shstrndx)
        };
        let shstrtab = shdrs
            .get(shstrndx)
            .filter(|s| s.sh_type != SHT_NOBITS)
            .and_then(|s| slice(bytes, s.sh_offset, s.sh_size))
            .unwrap_or(&[]);
        let sections: Vec<Section> = shdrs
            .iter()
            .map(|s| Section {
                name: c_str(shstrtab, s.sh_name).map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default(),
                sh_type: s.sh_type,
                flags: s.sh_flags,
                addr: s.sh_addr,
                offset: s.sh_offset,
                size: s.sh_size,
                link: s.sh_link,
                entsize: s.sh_entsize,
            })
            .collect();

        let loads = phdrs
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .map(|p| Segment { offset: p.p_offset, vaddr: p.p_vaddr, filesz: p.p_filesz })
            .collect();

        let big = !endian.is_little();
        // Notes from sections when there are any (they survive in debug
        // files), else from PT_NOTE segments (images without section headers).
        let mut note_areas: Vec<(&[u8], u64)> =
            sections.iter().filter(|s| s.sh_type == SHT_NOTE).filter_map(|s| Some((s.data(bytes)?, 0))).collect();
        if note_areas.is_empty() {
            note_areas = phdrs
                .iter()
                .filter(|p| p.p_type == PT_NOTE)
                .filter_map(|p| Some((slice(bytes, p.p_offset, p.p_filesz)?, p.p_align)))
                .collect();
        }
        let build_id = note_areas.iter().find_map(|(area, align)| find_build_id(area, *align, big));

        Ok(ElfFile { ctx, machine: header.e_machine, entry: header.e_entry, sections, loads, build_id })
    }

    pub fn is_big_endian(&self) -> bool {
        !self.ctx.le.is_little()
    }

    pub fn is_32bit(&self) -> bool {
        self.ctx.container == Container::Little
    }

    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// True when the image has a DWARF line table with contents.
    pub fn has_dwarf_lines(&self) -> bool {
        [".debug_line", ".zdebug_line"]
            .iter()
            .any(|n| self.section(n).is_some_and(|s| s.sh_type != SHT_NOBITS && s.size > 0))
    }

    /// The symbols of the first section of type `sh_type` (SHT_SYMTAB or SHT_DYNSYM),
    /// or `None` when there is no such section with contents.
    pub fn symbols(&self, bytes: &[u8], sh_type: u32) -> Option<Vec<RawSym>> {
        let sec = self.sections.iter().find(|s| s.sh_type == sh_type && s.size > 0)?;
        sec.data(bytes)?;
        let entsize = Sym::size(self.ctx.container) as u64;
        if sec.entsize != 0 && sec.entsize != entsize {
            return None;
        }
        let count = usize::try_from(sec.size / entsize).ok()?;
        let offset = usize::try_from(sec.offset).ok()?;
        let table = Symtab::parse(bytes, offset, count, self.ctx).ok()?;
        let strtab = self.sections.get(sec.link as usize).and_then(|s| s.data(bytes)).unwrap_or(&[]);
        let syms = table
            .iter()
            .map(|s| RawSym {
                name: c_str(strtab, s.st_name).map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default(),
                value: s.st_value,
                size: s.st_size,
                st_type: s.st_type(),
                bind: s.st_bind(),
                other: s.st_other,
                shndx: s.st_shndx,
            })
            .collect();
        Some(syms)
    }

    /// The contents of a (possibly compressed) section: SHF_COMPRESSED with
    /// zlib or zstd, or a legacy `.zdebug_*` section.
    pub fn section_contents<'a>(&self, bytes: &'a [u8], sec: &Section) -> Option<Cow<'a, [u8]>> {
        let data = sec.data(bytes)?;
        let big = self.is_big_endian();
        if sec.flags & u64::from(SHF_COMPRESSED) != 0 {
            // Elf32_Chdr: type, size, align (4 bytes each); Elf64_Chdr: type,
            // reserved, size, align.
            let (ch_type, ch_size, hdr_len) = if self.is_32bit() {
                (read_u32(data, 0, big)?, u64::from(read_u32(data, 4, big)?), 12)
            } else {
                (read_u32(data, 0, big)?, read_u64(data, 8, big)?, 24)
            };
            let payload = data.get(hdr_len..)?;
            return decompress(ch_type, payload, ch_size).map(Cow::Owned);
        }
        if sec.name.starts_with(".zdebug") {
            if data.get(..4)? != b"ZLIB" {
                return Some(Cow::Borrowed(data));
            }
            let size = read_u64(data, 4, true)?;
            return decompress(ELFCOMPRESS_ZLIB, data.get(12..)?, size).map(Cow::Owned);
        }
        Some(Cow::Borrowed(data))
    }
}

fn decompress(ch_type: u32, payload: &[u8], size: u64) -> Option<Vec<u8>> {
    let limit = size.min(MAX_DECOMPRESSED);
    let mut out = Vec::new();
    match ch_type {
        ELFCOMPRESS_ZLIB => {
            flate2::read::ZlibDecoder::new(payload).take(limit).read_to_end(&mut out).ok()?;
        }
        ELFCOMPRESS_ZSTD => {
            let mut src = payload;
            let dec = ruzstd::StreamingDecoder::new(&mut src).ok()?;
            dec.take(limit).read_to_end(&mut out).ok()?;
        }
        _ => return None,
    }
    (out.len() as u64 == size).then_some(out)
}

/// The descriptor of the first NT_GNU_BUILD_ID note with owner "GNU" in a note area.
fn find_build_id(area: &[u8], align: u64, big: bool) -> Option<Vec<u8>> {
    // Notes are 4-byte aligned on Linux; 8-byte alignment only where the
    // segment says so.
    let align = if align == 8 { 8 } else { 4 };
    let round = |n: usize| n.checked_add(align - 1).map(|v| v & !(align - 1));
    let mut off = 0usize;
    while off.checked_add(12)? <= area.len() {
        let namesz = read_u32(area, off, big)? as usize;
        let descsz = read_u32(area, off + 4, big)? as usize;
        let n_type = read_u32(area, off + 8, big)?;
        let name_off = off + 12;
        let desc_off = round(name_off.checked_add(namesz)?)?;
        let next = round(desc_off.checked_add(descsz)?)?;
        let name = area.get(name_off..name_off + namesz)?;
        let desc = area.get(desc_off..desc_off + descsz)?;
        if n_type == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() {
            return Some(desc.to_vec());
        }
        if next <= off {
            return None;
        }
        off = next;
    }
    None
}
