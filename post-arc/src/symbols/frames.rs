//! Function starts from call-frame information: every FDE of `.eh_frame` and
//! `.debug_frame` covers one function (or one part of one), and stripping
//! keeps `.eh_frame` (it is needed to unwind), so a stripped image still says
//! where its functions are.

use gimli::{BaseAddresses, CieOrFde, EhFrame, EndianSlice, RunTimeEndian, UnwindSection};

use super::elf::{read_u64, ElfFile};
use super::guarded;

/// Upper bound on FDEs read from one image, so a corrupt section cannot run without limit.
const MAX_FDES: usize = 1 << 22;

/// (start, length) of every FDE in `elf`'s `.eh_frame` and `.debug_frame`, in the image's
/// own addresses, sorted and without duplicates; length 0 where only the start is known.
pub(crate) fn function_starts(elf: &ElfFile, bytes: &[u8]) -> Vec<(u64, u64)> {
    let endian = if elf.is_big_endian() { RunTimeEndian::Big } else { RunTimeEndian::Little };
    let address_size = if elf.is_32bit() { 4 } else { 8 };
    let mut out = Vec::new();
    let mut bases = BaseAddresses::default();
    if let Some(text) = elf.section(".text") {
        bases = bases.set_text(text.addr);
    }
    if let Some(got) = elf.section(".got.plt").or_else(|| elf.section(".got")) {
        bases = bases.set_got(got.addr);
    }
    if let Some(hdr) = elf.section(".eh_frame_hdr") {
        bases = bases.set_eh_frame_hdr(hdr.addr);
    }
    if let Some(sec) = elf.section(".eh_frame") {
        if let Some(data) = sec.data(bytes) {
            let bases = bases.clone().set_eh_frame(sec.addr);
            let mut frame = EhFrame::new(data, endian);
            frame.set_address_size(address_size);
            guarded(|| {
                collect(&frame, &bases, &mut out);
                Some(())
            });
        }
    }
    if let Some(sec) = elf.section(".debug_frame") {
        if let Some(data) = elf.section_contents(bytes, sec) {
            let mut frame = gimli::DebugFrame::new(&data, endian);
            frame.set_address_size(address_size);
            guarded(|| {
                collect(&frame, &bases, &mut out);
                Some(())
            });
        }
    }
    // Code without call-frame information (C runtime start files): the entry point, .init
    // and .fini, and what the init and fini arrays point at are function starts too (of
    // unknown length: the next start ends them).
    let exec = |a: u64| elf.sections.iter().any(|s| s.is_exec() && a >= s.addr && a - s.addr < s.size);
    let mut starts = vec![elf.entry];
    starts.extend([".init", ".fini"].iter().filter_map(|n| elf.section(n)).map(|s| s.addr));
    for name in [".init_array", ".fini_array", ".preinit_array"] {
        let Some(data) = elf.section(name).and_then(|s| s.data(bytes)) else { continue };
        let big = elf.is_big_endian();
        for word in data.chunks_exact(address_size as usize) {
            let v = if address_size == 8 {
                read_u64(word, 0, big).unwrap_or(0)
            } else {
                let a: [u8; 4] = word.try_into().unwrap_or_default();
                u64::from(if big { u32::from_be_bytes(a) } else { u32::from_le_bytes(a) })
            };
            starts.push(v);
        }
    }
    out.extend(starts.into_iter().filter(|&a| exec(a)).map(|a| (a, 0)));
    out.retain(|&(start, _)| start != 0);
    normalize(&mut out);
    out
}

/// Sort by start and keep one entry per start, the one with the known (longest) length.
pub(crate) fn normalize(starts: &mut Vec<(u64, u64)>) {
    starts.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    starts.dedup_by_key(|e| e.0);
}

fn collect<'a, S>(frame: &S, bases: &BaseAddresses, out: &mut Vec<(u64, u64)>)
where
    S: UnwindSection<EndianSlice<'a, RunTimeEndian>>,
{
    let mut entries = frame.entries(bases);
    // A malformed entry ends the walk: what was read before it stays.
    while let Ok(Some(entry)) = entries.next() {
        if out.len() >= MAX_FDES {
            return;
        }
        if let CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(S::cie_from_offset) {
                out.push((fde.initial_address(), fde.len()));
            }
        }
    }
}
