//! Sorted, non-overlapping address ranges of function symbols for fast lookup.

use std::sync::OnceLock;

use goblin::elf::sym::{STB_GLOBAL, STB_LOCAL, STB_WEAK, STT_FUNC, STT_GNU_IFUNC, STT_NOTYPE};

use super::demangle::demangle;
use super::elf::{read_u64, ElfFile, RawSym};
use super::SymbolHit;

/// Marks an address range that no symbol covers.
const NONE: u32 = u32::MAX;
/// Section indices from SHN_LORESERVE up are special (ABS, COMMON, XINDEX).
const SHN_LORESERVE: usize = 0xff00;

/// The contents of a ppc64 ELFv1 `.opd` section: function symbols point at
/// descriptors there, whose first doubleword is the code address.
pub(crate) struct Opd {
    pub addr: u64,
    pub data: Vec<u8>,
    pub big_endian: bool,
}

impl Opd {
    /// The code address of the descriptor at `value`, if `value` is inside `.opd`.
    fn resolve(&self, value: u64) -> Option<u64> {
        let off = usize::try_from(value.checked_sub(self.addr)?).ok()?;
        read_u64(&self.data, off, self.big_endian)
    }

    fn contains(&self, value: u64) -> bool {
        value >= self.addr && value - self.addr < self.data.len() as u64
    }
}

struct Entry {
    addr: u64,
    /// The local entry point's offset (64-bit PowerPC ELFv2), else 0.
    local_entry: u8,
    raw: Box<str>,
    /// Filled on first lookup: demangling every symbol of a large C++
    /// library up front would cost seconds for names nobody asks for.
    demangled: OnceLock<Option<Box<str>>>,
}

impl Entry {
    /// The demangled name, without a symbol version (`@@GLIBC_2.34`, `@GLIBC_2.2.5`): which
    /// version of a symbol ran is not what a profile is read for.
    fn name(&self) -> &str {
        self.demangled
            .get_or_init(|| {
                let unversioned = without_version(&self.raw);
                match demangle(unversioned) {
                    Some(d) => Some(d.into_boxed_str()),
                    None if unversioned.len() != self.raw.len() => Some(unversioned.into()),
                    None => None,
                }
            })
            .as_deref()
            .unwrap_or(&self.raw)
    }
}

/// Function symbols of one image, flattened into disjoint intervals.
#[derive(Default)]
pub(crate) struct SymbolTable {
    entries: Vec<Entry>,
    /// Interval starts, sorted; interval `i` covers `starts[i]..starts[i + 1]`
    /// and belongs to `entries[owners[i]]` (or to nobody when `NONE`).
    starts: Vec<u64>,
    owners: Vec<u32>,
}

struct Candidate {
    addr: u64,
    local_entry: u8,
    size: u64,
    name: String,
    rank: (u8, u8),
}

impl SymbolTable {
    /// Build the table from raw symbols of `elf` (the file the symbol table
    /// came from, for its section headers); `opd` resolves ppc64 descriptors.
    /// `frames` are function (start, length) pairs from call-frame information: those no
    /// symbol covers become functions named `{prefix}+0x{start:x}`.
    pub fn build(elf: &ElfFile, syms: Vec<RawSym>, opd: Option<&Opd>, frames: &[(u64, u64)], prefix: &str) -> Self {
        let mut cands: Vec<Candidate> = Vec::new();
        // ELFv2 has no function descriptors (.opd): its symbols point at the global entry.
        let ppc64_elfv2 = elf.machine == goblin::elf::header::EM_PPC64 && opd.is_none();
        for s in syms {
            if s.name.is_empty() || s.shndx == 0 || s.shndx >= SHN_LORESERVE {
                continue;
            }
            let exec = elf.sections.get(s.shndx).is_some_and(|sec| sec.is_exec());
            let type_rank = match s.st_type {
                STT_FUNC | STT_GNU_IFUNC => 0,
                // Freestanding assembly marks entry points and labels only
                // with .globl, leaving them untyped.
                STT_NOTYPE if exec && (s.bind == STB_GLOBAL || s.bind == STB_WEAK) => 1,
                _ => continue,
            };
            let bind_rank = match s.bind {
                STB_GLOBAL => 0,
                STB_WEAK => 1,
                STB_LOCAL => 2,
                _ => 3,
            };
            let addr = match opd {
                Some(opd) if opd.contains(s.value) => match opd.resolve(s.value) {
                    Some(code) => code,
                    None => continue,
                },
                _ => s.value,
            };
            let local_entry = if ppc64_elfv2 { ppc64_local_entry(s.other) } else { 0 };
            cands.push(Candidate { addr, local_entry, size: s.size, name: s.name, rank: (bind_rank, type_rank) });
        }
        add_unnamed_frames(&mut cands, frames, prefix);
        // Best name first at each address: global over weak over local,
        // typed over untyped, fewer leading underscores (`malloc` over
        // `__libc_malloc`), shorter, then alphabetical for determinism.
        cands.sort_unstable_by(|a, b| {
            let key = |c: &Candidate| {
                let unders = c.name.bytes().take_while(|&b| b == b'_').count();
                (c.addr, c.rank, unders, c.name.len())
            };
            key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
        });

        // One entry per address; the size is the largest any alias declares.
        let mut uniq: Vec<(u64, u64, String, u8)> = Vec::with_capacity(cands.len());
        for c in cands {
            match uniq.last_mut() {
                Some(last) if last.0 == c.addr => {
                    last.1 = last.1.max(c.size);
                    last.3 = last.3.max(c.local_entry);
                }
                _ => uniq.push((c.addr, c.size, c.name, c.local_entry)),
            }
        }

        // Allocated sections by address, to bound symbols of size 0.
        let mut secs: Vec<(u64, u64)> = elf
            .sections
            .iter()
            .filter(|s| s.is_alloc() && s.size > 0)
            .map(|s| (s.addr, s.addr.saturating_add(s.size)))
            .collect();
        secs.sort_unstable();
        let section_end = |addr: u64| -> Option<u64> {
            let i = secs.partition_point(|s| s.0 <= addr);
            let (start, end) = *secs.get(i.checked_sub(1)?)?;
            (addr >= start && addr < end).then_some(end)
        };

        let mut ends = Vec::with_capacity(uniq.len());
        for (i, &(addr, size, _, _)) in uniq.iter().enumerate() {
            let end = if size > 0 {
                addr.saturating_add(size)
            } else {
                let next = uniq.get(i + 1).map(|n| n.0);
                match (next, section_end(addr)) {
                    (Some(n), Some(e)) => n.min(e),
                    (Some(n), None) => n,
                    (None, Some(e)) => e,
                    (None, None) => addr.saturating_add(1),
                }
            };
            ends.push(end.max(addr.saturating_add(1)));
        }

        let entries: Vec<Entry> = uniq
            .into_iter()
            .map(|(addr, _, name, local_entry)| Entry {
                addr,
                local_entry,
                raw: name.into_boxed_str(),
                demangled: OnceLock::new(),
            })
            .collect();
        let (starts, owners) = flatten(&entries, &ends);
        SymbolTable { entries, starts, owners }
    }

    /// The symbol covering `addr`.
    #[inline]
    pub fn lookup(&self, addr: u64) -> Option<SymbolHit<'_>> {
        let i = self.starts.partition_point(|&s| s <= addr).checked_sub(1)?;
        let owner = self.owners[i];
        let e = self.entries.get(owner as usize)?;
        Some(SymbolHit { name: e.name(), start: e.addr, offset: addr - e.addr, plt: None, local_entry: e.local_entry })
    }

    /// The functions: address, demangled name.
    pub fn functions(&self) -> impl Iterator<Item = (u64, &str)> {
        self.entries.iter().map(|e| (e.addr, e.name()))
    }

    /// The demangled names of the functions (each demangled now if not yet).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Address of the symbol named `name` (as written in the ELF, or demangled).
    pub fn find(&self, name: &str) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| &*e.raw == name)
            .or_else(|| self.entries.iter().find(|e| e.name() == name))
            .map(|e| e.addr)
    }
}

/// The local entry point's offset in bytes from a 64-bit PowerPC ELFv2 symbol's `st_other`
/// (PPC64_LOCAL_ENTRY_OFFSET of the ABI: bits 5-7; 0 and 1 mean one entry point).
fn ppc64_local_entry(other: u8) -> u8 {
    match other >> 5 {
        v @ 2..=6 => 1 << v >> 2 << 2,
        _ => 0,
    }
}

/// Functions from call-frame information where no symbol is: an FDE that starts inside a
/// symbol's range is part of that function (a `.cold` part, a nested label) and adds nothing.
fn add_unnamed_frames(cands: &mut Vec<Candidate>, frames: &[(u64, u64)], prefix: &str) {
    if frames.is_empty() {
        return;
    }
    let mut ranges: Vec<(u64, u64)> = cands.iter().map(|c| (c.addr, c.addr.saturating_add(c.size.max(1)))).collect();
    ranges.sort_unstable();
    // Furthest end among ranges starting at or before each one.
    let mut reach = Vec::with_capacity(ranges.len());
    let mut furthest = 0;
    for r in &ranges {
        furthest = furthest.max(r.1);
        reach.push(furthest);
    }
    for &(start, len) in frames {
        let i = ranges.partition_point(|r| r.0 <= start);
        if i > 0 && reach[i - 1] > start {
            continue;
        }
        cands.push(Candidate {
            addr: start,
            local_entry: 0,
            size: len,
            name: format!("{prefix}+{start:#x}"),
            rank: (4, 2),
        });
    }
}

/// `name` without its symbol-version suffix (`memcpy@GLIBC_2.2.5`, `main@@V1`); a name that
/// starts with `@` is kept.
fn without_version(name: &str) -> &str {
    match name.find('@') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    }
}

/// Turn possibly nested ranges (sorted by start) into disjoint intervals:
/// inside a range, a later-starting (inner) symbol wins until it ends, then
/// the enclosing one resumes.
fn flatten(entries: &[Entry], ends: &[u64]) -> (Vec<u64>, Vec<u32>) {
    let mut starts: Vec<u64> = Vec::with_capacity(entries.len() * 2);
    let mut owners: Vec<u32> = Vec::with_capacity(entries.len() * 2);
    let mut emit = |at: u64, owner: u32| {
        if starts.last() == Some(&at) {
            if let Some(o) = owners.last_mut() {
                *o = owner;
            }
        } else if owners.last() != Some(&owner) {
            starts.push(at);
            owners.push(owner);
        }
    };
    // Open ranges, ends strictly decreasing from bottom to top.
    let mut stack: Vec<(u64, u32)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let idx = u32::try_from(i).unwrap_or(NONE);
        let end = ends[i];
        while let Some(&(top_end, _)) = stack.last() {
            if top_end > e.addr {
                break;
            }
            stack.pop();
            emit(top_end, stack.last().map_or(NONE, |t| t.1));
        }
        emit(e.addr, idx);
        // Ranges ending no later than this one are hidden by it from here on.
        while stack.last().is_some_and(|t| t.0 <= end) {
            stack.pop();
        }
        stack.push((end, idx));
    }
    while let Some((top_end, _)) = stack.pop() {
        emit(top_end, stack.last().map_or(NONE, |t| t.1));
    }
    (starts, owners)
}

#[cfg(test)]
mod tests {
    use super::ppc64_local_entry;

    /// The ELFv2 ABI's table for st_other bits 5-7: 0 and 1 one entry point, 2..6 an offset of
    /// 4, 8, 16, 32, 64 bytes, 7 reserved; the other bits (visibility) do not count.
    #[test]
    fn local_entry_offsets_of_the_elfv2_abi() {
        let got: Vec<u8> = (0..8u8).map(|v| ppc64_local_entry(v << 5)).collect();
        assert_eq!(got, [0, 0, 4, 8, 16, 32, 64, 0]);
        assert_eq!(ppc64_local_entry((3 << 5) | 2), 8, "STV_HIDDEN beside a local entry of 8");
    }
}
