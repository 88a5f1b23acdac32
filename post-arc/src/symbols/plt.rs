//! PLT stubs: their address ranges and the names of the functions they call
//! (`printf@plt`), as binutils' synthetic symbols name them.
//!
//! A stub's name comes from the relocation of the GOT slot its indirect jump
//! reads (x86_64 `jmp *disp(%rip)`, i386 `jmp *disp(%ebx)` or `jmp *abs`); on
//! s390x entry k of `.plt` (after the 32-byte header) is relocation k - 1 of
//! `.rela.plt`. The first entry of x86's `.plt`, which pushes a GOT slot and
//! jumps to the dynamic linker's resolver, is the header. ppc64 (ELFv2) call
//! stubs live among the code and are found by their instructions.

use goblin::elf::header::{EM_386, EM_PPC64, EM_S390, EM_X86_64};
use goblin::elf::section_header::{SHT_REL, SHT_RELA};

use super::elf::{read_u64, ElfFile, RawSym, Section};

/// Executable sections made only of PLT stubs (`.iplt`: static binaries'
/// IFUNC stubs with some linkers; `.glink`: ppc64's PLT call stubs).
pub(crate) const PLT_SECTIONS: [&str; 5] = [".plt", ".plt.sec", ".plt.got", ".iplt", ".glink"];

/// What part of a PLT an address is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PltPart {
    /// The header (PLT0): lazy binding jumps through it to the dynamic linker's resolver.
    Header,
    /// A stub that jumps to one function (through its GOT slot).
    Stub,
}

/// One PLT entry: its range and, for stubs, the called function's name.
#[derive(Debug, Clone)]
pub(crate) struct PltEntry {
    pub start: u64,
    pub end: u64,
    pub part: PltPart,
    /// `printf@plt`; `<plt>` for the header and for stubs whose target is not known.
    pub name: Box<str>,
}

/// The PLT entries of an image, sorted by address, plus whole PLT sections
/// whose entries could not be told apart (each one entry named `<plt>`).
pub(crate) fn plt_entries(elf: &ElfFile, bytes: &[u8]) -> Vec<PltEntry> {
    let dynsyms = elf.symbols(bytes, goblin::elf::section_header::SHT_DYNSYM).unwrap_or_default();
    let relocs = Relocs::read(elf, bytes, &dynsyms);
    let got_plt = elf.section(".got.plt").map(|s| s.addr);
    let mut out = Vec::new();
    for sec in elf.sections.iter().filter(|s| PLT_SECTIONS.contains(&s.name.as_str()) && s.is_exec() && s.size > 0) {
        let end = sec.addr.saturating_add(sec.size);
        let entries = match (elf.machine, sec.data(bytes)) {
            (EM_X86_64 | EM_386, Some(data)) => x86_entries(elf, sec, data, &relocs, got_plt),
            (EM_S390, Some(_)) if sec.name == ".plt" => s390x_entries(sec, &relocs),
            _ => Vec::new(),
        };
        if entries.is_empty() {
            out.push(PltEntry { start: sec.addr, end, part: PltPart::Stub, name: "<plt>".into() });
        } else {
            out.extend(entries);
        }
    }
    if elf.machine == EM_PPC64 && !elf.is_big_endian() {
        out.extend(ppc64_call_stubs(elf, bytes, &relocs));
        out.extend(ppc64_glink(elf, bytes, &relocs));
    }
    out.sort_by_key(|e| e.start);
    out
}

/// DT_PPC64_GLINK: 32 bytes before the first lazy-binding branch of the glink code.
const DT_PPC64_GLINK: u64 = 0x7000_0000;

/// ppc64's lazy-binding code (glink), which ld may put inside `.text`: one `b` per
/// `.rela.plt` entry, in order, each to `__glink_PLTresolve` just before them (the header,
/// which jumps to the dynamic linker's resolver).
fn ppc64_glink(elf: &ElfFile, bytes: &[u8], relocs: &Relocs) -> Vec<PltEntry> {
    let Some(dynamic) = elf.section(".dynamic").and_then(|s| s.data(bytes)) else { return Vec::new() };
    let glink = dynamic
        .chunks_exact(16)
        .map(|e| (read_u64(e, 0, false).unwrap_or(0), read_u64(e, 8, false).unwrap_or(0)))
        .find(|&(tag, _)| tag == DT_PPC64_GLINK)
        .map(|(_, v)| v);
    let Some(first) = glink.map(|g| g + 32) else { return Vec::new() };
    let Some(sec) = elf.sections.iter().find(|s| s.is_exec() && first >= s.addr && first < s.addr + s.size) else {
        return Vec::new();
    };
    let Some(data) = sec.data(bytes) else { return Vec::new() };
    let word = |addr: u64| -> Option<u32> {
        let off = usize::try_from(addr - sec.addr).ok()?;
        Some(u32::from_le_bytes(data.get(off..off + 4)?.try_into().ok()?))
    };
    // `b target`: opcode 18, AA = LK = 0, a signed 26-bit byte offset.
    let branch_target = |addr: u64| -> Option<u64> {
        let w = word(addr)?;
        if w & 0xfc00_0003 != 0x4800_0000 {
            return None;
        }
        let off = ((w & 0x03ff_fffc) << 6) as i32 >> 6;
        Some(addr.wrapping_add(off as i64 as u64))
    };
    let Some(header) = branch_target(first).filter(|&h| h < first && h >= sec.addr) else { return Vec::new() };
    let mut out = vec![PltEntry { start: header, end: first, part: PltPart::Header, name: "<plt>".into() }];
    for (k, name) in relocs.plt.iter().enumerate() {
        let start = first + 4 * k as u64;
        if branch_target(start) != Some(header) {
            break;
        }
        let name = if name.is_empty() { "<plt>".into() } else { stub_name(name) };
        out.push(PltEntry { start, end: start + 4, part: PltPart::Stub, name });
    }
    out
}

/// ppc64 ELFv2 PLT call stubs, which the linker puts among the code (`.text`), each
/// `std r2,24(r1)` (kept when the caller's TOC must be restored), the load of the PLT slot
/// into r12 (`ld r12,D(r2)`, or `addis r12,r2,HI; ld r12,LO(r12)`), `mtctr r12`, `bctr`.
/// The slot is in TOC terms: r2 is `.got` + 0x8000.
fn ppc64_call_stubs(elf: &ElfFile, bytes: &[u8], relocs: &Relocs) -> Vec<PltEntry> {
    const STD_R2: u32 = 0xf841_0018;
    const MTCTR_R12: u32 = 0x7d89_03a6;
    const BCTR: u32 = 0x4e80_0420;
    let Some(toc) = elf.section(".got").map(|g| g.addr.wrapping_add(0x8000)) else { return Vec::new() };
    let mut out = Vec::new();
    for sec in elf.sections.iter().filter(|s| s.is_exec() && s.size > 0) {
        let Some(data) = sec.data(bytes) else { continue };
        let words: Vec<u32> = data.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
        let mut i = 0;
        while i < words.len() {
            let start_at = i;
            let save = words[i] == STD_R2;
            let j = if save { i + 1 } else { i };
            let simm = |w: u32| (w & 0xffff) as u16 as i16 as i64 as u64;
            // (slot, index of the mtctr)
            let found = match words.get(j..j + 2) {
                // ld r12,D(r2)
                Some(&[ld, _]) if ld & 0xffff_0000 == 0xe982_0000 => Some((toc.wrapping_add(simm(ld)), j + 1)),
                // addis r12,r2,HI; ld r12,LO(r12)
                Some(&[addis, ld]) if addis & 0xffff_0000 == 0x3d82_0000 && ld & 0xffff_0000 == 0xe98c_0000 => {
                    Some((toc.wrapping_add(simm(addis) << 16).wrapping_add(simm(ld)), j + 2))
                }
                _ => None,
            };
            match found {
                Some((slot, k)) if words.get(k) == Some(&MTCTR_R12) && words.get(k + 1) == Some(&BCTR) => {
                    if let Some(name) = relocs.slot(slot) {
                        let start = sec.addr + 4 * start_at as u64;
                        let end = sec.addr + 4 * (k as u64 + 2);
                        out.push(PltEntry { start, end, part: PltPart::Stub, name: stub_name(name) });
                    }
                    i = k + 2;
                }
                _ => i += 1,
            }
        }
    }
    out
}

/// The PLT entry covering `addr` in sorted `entries`.
pub(crate) fn lookup(entries: &[PltEntry], addr: u64) -> Option<&PltEntry> {
    let i = entries.partition_point(|e| e.start <= addr).checked_sub(1)?;
    entries.get(i).filter(|e| addr < e.end)
}

/// Relocations of the dynamic symbol table: GOT slot -> name, and `.rela.plt`/`.rel.plt` in order.
struct Relocs {
    by_slot: Vec<(u64, String)>,
    plt: Vec<String>,
}

impl Relocs {
    fn read(elf: &ElfFile, bytes: &[u8], dynsyms: &[RawSym]) -> Relocs {
        let mut by_slot = Vec::new();
        let mut plt = Vec::new();
        let big = elf.is_big_endian();
        let wide = !elf.is_32bit();
        for sec in elf.sections.iter().filter(|s| s.sh_type == SHT_RELA || s.sh_type == SHT_REL) {
            let Some(data) = sec.data(bytes) else { continue };
            let rela = sec.sh_type == SHT_RELA;
            let entsize: usize = match (wide, rela) {
                (true, true) => 24,
                (true, false) => 16,
                (false, true) => 12,
                (false, false) => 8,
            };
            let is_plt = matches!(sec.name.as_str(), ".rela.plt" | ".rel.plt" | ".rela.iplt" | ".rel.iplt");
            for chunk in data.chunks_exact(entsize) {
                let (offset, sym, addend) = if wide {
                    let off = read_u64(chunk, 0, big).unwrap_or(0);
                    let info = read_u64(chunk, 8, big).unwrap_or(0);
                    let addend = if rela { read_u64(chunk, 16, big) } else { None };
                    (off, (info >> 32) as usize, addend)
                } else {
                    let word = |i: usize| {
                        let a: [u8; 4] = chunk[i..i + 4].try_into().unwrap_or_default();
                        if big {
                            u32::from_be_bytes(a)
                        } else {
                            u32::from_le_bytes(a)
                        }
                    };
                    let addend = rela.then(|| u64::from(word(8)));
                    (u64::from(word(0)), (word(4) >> 8) as usize, addend)
                };
                let name = if sym == 0 {
                    // A PLT slot without a symbol is IRELATIVE: named by its resolver's
                    // address, as binutils does.
                    // Static programs have no dynamic symbols, and binutils no names for them.
                    addend.filter(|_| is_plt && !dynsyms.is_empty()).map(|a| format!("*ABS*+{a:#x}"))
                } else {
                    dynsyms.get(sym).map(|s| s.name.clone()).filter(|n| !n.is_empty())
                };
                if is_plt {
                    plt.push(name.clone().unwrap_or_default());
                }
                if let Some(n) = name {
                    by_slot.push((offset, n));
                }
            }
        }
        by_slot.sort();
        Relocs { by_slot, plt }
    }

    fn slot(&self, got: u64) -> Option<&str> {
        let i = self.by_slot.binary_search_by_key(&got, |e| e.0).ok()?;
        Some(&self.by_slot[i].1)
    }
}

fn stub_name(name: &str) -> Box<str> {
    format!("{}@plt", name.split('@').next().unwrap_or(name)).into_boxed_str()
}

/// x86 and x86_64 PLT entries (16 bytes; `.plt.got` 8 or 16), named by decoding their few instructions.
fn x86_entries(elf: &ElfFile, sec: &Section, data: &[u8], relocs: &Relocs, got_plt: Option<u64>) -> Vec<PltEntry> {
    let x64 = elf.machine == EM_X86_64;
    let entsize = match sec.entsize {
        8 | 16 => sec.entsize as usize,
        _ if sec.name == ".plt.got" && data.len() % 16 != 0 => 8,
        _ => 16,
    };
    let mut out = Vec::new();
    for (i, entry) in data.chunks(entsize).enumerate() {
        let start = sec.addr + (i * entsize) as u64;
        let (got, header) = decode_x86(entry, start, x64, got_plt);
        // Lazy-binding entries next to `.plt.sec` (`push index; jmp PLT0`) stay `<plt>`, as
        // binutils leaves them: calls go to the `.plt.sec` stub of the same name.
        let name = got.and_then(|g| relocs.slot(g)).map(stub_name);
        let (part, name) = match name {
            Some(n) => (PltPart::Stub, n),
            None if header => (PltPart::Header, "<plt>".into()),
            None => (PltPart::Stub, "<plt>".into()),
        };
        out.push(PltEntry { start, end: start + entry.len() as u64, part, name });
    }
    out
}

/// The GOT slot an x86 PLT entry jumps through, if it does, and whether it is PLT0 (the
/// header: `push GOT+4/8; jmp *GOT+8/16`, to the dynamic linker's resolver).
fn decode_x86(entry: &[u8], start: u64, x64: bool, got_plt: Option<u64>) -> (Option<u64>, bool) {
    let imm = |at: usize| -> Option<u32> { Some(u32::from_le_bytes(entry.get(at..at + 4)?.try_into().ok()?)) };
    let mut i = 0;
    while i < entry.len() {
        match entry[i..] {
            // endbr64 / endbr32
            [0xf3, 0x0f, 0x1e, 0xfa | 0xfb, ..] => i += 4,
            // bnd prefix
            [0xf2, ..] => i += 1,
            // jmp *disp32(%rip) (x86_64) or jmp *abs32 (i386)
            [0xff, 0x25, ..] => {
                let d = imm(i + 2);
                let got =
                    d.map(
                        |d| {
                            if x64 {
                                (start + i as u64 + 6).wrapping_add(d as i32 as i64 as u64)
                            } else {
                                u64::from(d)
                            }
                        },
                    );
                return (got, false);
            }
            // jmp *disp32(%ebx): %ebx holds the address of .got.plt in PIC i386 code
            [0xff, 0xa3, ..] if !x64 => {
                let got =
                    imm(i + 2).zip(got_plt).map(|(d, base)| base.wrapping_add(d as i32 as i64 as u64) & 0xffff_ffff);
                return (got, false);
            }
            // push imm32: a lazy-binding entry's relocation index
            [0x68, ..] => i += 5,
            // push disp32(%ebx) (i386 PIC), push disp32(%rip) (x86_64) or push abs32 (i386)
            [0xff, 0xb3 | 0x35, ..] => return (None, true),
            _ => break,
        }
    }
    (None, false)
}

/// s390x `.plt`: a 32-byte header, then 32-byte entries in `.rela.plt` order.
fn s390x_entries(sec: &Section, relocs: &Relocs) -> Vec<PltEntry> {
    const ENTRY: u64 = 32;
    let mut out = vec![PltEntry {
        start: sec.addr,
        end: sec.addr + ENTRY.min(sec.size),
        part: PltPart::Header,
        name: "<plt>".into(),
    }];
    let count = sec.size / ENTRY;
    for k in 1..count {
        let start = sec.addr + k * ENTRY;
        let name = relocs
            .plt
            .get((k - 1) as usize)
            .filter(|n| !n.is_empty())
            .map(|n| stub_name(n))
            .unwrap_or_else(|| "<plt>".into());
        out.push(PltEntry { start, end: start + ENTRY, part: PltPart::Stub, name });
    }
    out
}
