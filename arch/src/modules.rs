//! The module table a backend keeps of the processes it traces: their executable mappings as
//! last seen, and the module-table (MTE) records that say what changed, written once here for
//! every backend that reads mappings from /proc.

use crate::procfs::{self, Mapping};
use itrace_format::Mte;
use std::collections::HashMap;
use std::path::Path;

/// The MTE records for process `pid`, whose executable mappings go from `old` to `new`: an
/// unmap for each mapping gone, a segment for each new one, and the vDSO's image when a
/// `[vdso]` mapping is new (a new process or address space).
pub fn changes(ts: u64, pid: u32, old: &[Mapping], new: &[Mapping]) -> Vec<Mte> {
    let mut records: Vec<Mte> =
        old.iter().filter(|m| !new.contains(m)).map(|m| Mte::Unmap { ts, pid, start: m.start, end: m.end }).collect();
    let added: Vec<&Mapping> = new.iter().filter(|m| !old.contains(m)).collect();
    records.extend(added.iter().map(|m| Mte::Segment {
        ts,
        pid,
        prot: m.prot,
        start: m.start,
        end: m.end,
        offset: m.offset,
        path: m.path.clone(),
    }));
    // What each mapped file is now, so that readers can tell when it has changed since.
    let mut identities: Vec<Mte> = added.iter().filter_map(|m| identity_record(ts, pid, m.start, &m.path)).collect();
    // Each right after its segment record.
    let mut ordered = Vec::with_capacity(records.len() + identities.len());
    for r in records {
        let start = match &r {
            Mte::Segment { start, .. } => Some(*start),
            _ => None,
        };
        ordered.push(r);
        if let Some(i) =
            identities.iter().position(|id| matches!(id, Mte::ModuleId { start: s, .. } if Some(*s) == start))
        {
            ordered.push(identities.swap_remove(i));
        }
    }
    let mut records = ordered;
    if let Some(m) = added.iter().find(|m| m.path == "[vdso]") {
        if let Some(image) = procfs::vdso_image(pid as i32, m) {
            records.push(Mte::VdsoImage { ts, pid, start: m.start, image });
        }
    }
    records
}

/// The module-identity record of the file at `path` mapped at `start`, written right after
/// its segment record; `None` for what is not a file (`[vdso]`, anonymous) or cannot be read.
pub fn identity_record(ts: u64, pid: u32, start: u64, path: &str) -> Option<Mte> {
    if !path.starts_with('/') {
        return None;
    }
    let id = file_identity(Path::new(path))?;
    Some(Mte::ModuleId {
        ts,
        pid,
        start,
        size: id.size,
        mtime_ns: id.mtime_ns,
        build_id: id.build_id,
        path: path.to_string(),
    })
}

/// What a mapped file is: its GNU build-id (empty when it has none), size and mtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileIdentity {
    pub build_id: Vec<u8>,
    pub size: u64,
    pub mtime_ns: u64,
}

/// Bytes read from the start of a file for its ELF and program headers.
const HEADER_BYTES: usize = 4096;
/// Notes larger than this are not read (a build-id note is 36 bytes).
const MAX_NOTES: u64 = 1 << 16;

/// The identity of the file at `path`, if it can be opened; the build-id is read from its
/// PT_NOTE segments (empty for a file that is not ELF or has none).
pub fn file_identity(path: &Path) -> Option<FileIdentity> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let mtime_ns = itrace_format::file_mtime_ns(&meta);
    let mut head = vec![0u8; HEADER_BYTES.min(meta.len() as usize)];
    let build_id = file.read_exact_at(&mut head, 0).ok().and_then(|()| {
        elf_build_id(&head, |off, len| {
            let mut buf = vec![0u8; usize::try_from(len.min(MAX_NOTES)).ok()?];
            file.read_exact_at(&mut buf, off).ok()?;
            Some(buf)
        })
    });
    Some(FileIdentity { build_id: build_id.unwrap_or_default(), size: meta.len(), mtime_ns })
}

/// The GNU build-id of an ELF file whose first bytes are `head`; `read(offset, len)` reads
/// its note segments.
fn elf_build_id(head: &[u8], read: impl Fn(u64, u64) -> Option<Vec<u8>>) -> Option<Vec<u8>> {
    use goblin::container::Ctx;
    use goblin::elf::program_header::{ProgramHeader, PT_NOTE};
    const NT_GNU_BUILD_ID: u32 = 3;
    let header = goblin::elf::Elf::parse_header(head).ok()?;
    let ctx = Ctx::new(header.container().ok()?, header.endianness().ok()?);
    let big = !ctx.le.is_little();
    let phdrs =
        ProgramHeader::parse(head, usize::try_from(header.e_phoff).ok()?, usize::from(header.e_phnum), ctx).ok()?;
    let word = |b: &[u8], at: usize| -> Option<u32> {
        let a: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if big { u32::from_be_bytes(a) } else { u32::from_le_bytes(a) })
    };
    for ph in phdrs.iter().filter(|p| p.p_type == PT_NOTE) {
        let notes = read(ph.p_offset, ph.p_filesz)?;
        let align = if ph.p_align == 8 { 8 } else { 4 };
        let round = |n: usize| n.checked_add(align - 1).map(|v| v & !(align - 1));
        let mut off = 0usize;
        while off.checked_add(12)? <= notes.len() {
            let namesz = word(&notes, off)? as usize;
            let descsz = word(&notes, off + 4)? as usize;
            let kind = word(&notes, off + 8)?;
            let desc_at = round(off + 12 + namesz)?;
            let next = round(desc_at.checked_add(descsz)?)?;
            if kind == NT_GNU_BUILD_ID && notes.get(off + 12..off + 12 + namesz) == Some(b"GNU\0") {
                return notes.get(desc_at..desc_at + descsz).map(<[u8]>::to_vec);
            }
            if next <= off {
                break;
            }
            off = next;
        }
    }
    None
}

/// The mappings of every traced process, for backends that learn them as snapshots.
#[derive(Debug, Default)]
pub struct ModuleTable {
    maps: HashMap<u32, Vec<Mapping>>,
}

impl ModuleTable {
    /// Process `pid`'s mappings are now `new`: the records that say what changed.
    pub fn update(&mut self, ts: u64, pid: u32, new: Vec<Mapping>) -> Vec<Mte> {
        let old = self.maps.remove(&pid).unwrap_or_default();
        let records = changes(ts, pid, &old, &new);
        self.maps.insert(pid, new);
        records
    }

    /// Process `pid` has a new address space (exec): its next snapshot is written whole.
    pub fn forget(&mut self, pid: u32) {
        self.maps.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, path: &str) -> Mapping {
        Mapping { start, end: start + 0x1000, prot: 5, offset: 0, path: path.into() }
    }

    #[test]
    fn changes_are_unmaps_then_segments() {
        let old = [m(0x1000, "/a"), m(0x2000, "/b")];
        let new = [m(0x2000, "/b"), m(0x3000, "/c")];
        let r = changes(7, 42, &old, &new);
        assert_eq!(r.len(), 2);
        assert!(matches!(&r[0], Mte::Unmap { start: 0x1000, end: 0x2000, pid: 42, ts: 7 }));
        assert!(matches!(&r[1], Mte::Segment { start: 0x3000, path, .. } if path == "/c"));
        let mut table = ModuleTable::default();
        assert_eq!(table.update(1, 42, new.to_vec()).len(), 2);
        assert!(table.update(2, 42, new.to_vec()).is_empty(), "nothing changed");
        table.forget(42);
        assert_eq!(table.update(3, 42, new.to_vec()).len(), 2, "after exec the snapshot is written whole");
    }

    /// Our own vDSO, as the kernel maps it: an ELF image.
    #[test]
    fn vdso_image_is_the_kernels_elf() {
        let own = procfs::exec_mappings(std::process::id() as i32).unwrap();
        let vdso = own.iter().find(|m| m.path == "[vdso]").expect("a [vdso] mapping");
        let r = changes(1, std::process::id(), &[], std::slice::from_ref(vdso));
        let image = r.iter().find_map(|r| match r {
            Mte::VdsoImage { image, .. } => Some(image.clone()),
            _ => None,
        });
        assert_eq!(&image.expect("the image")[..4], b"\x7fELF");
    }

    /// The image is the vDSO's ELF file, as long as readelf says it is (section headers last),
    /// not the whole pages of its mapping.
    #[test]
    fn vdso_image_ends_with_its_section_headers() {
        let own = procfs::exec_mappings(std::process::id() as i32).unwrap();
        let vdso = own.iter().find(|m| m.path == "[vdso]").expect("a [vdso] mapping");
        let image = procfs::vdso_image(std::process::id() as i32, vdso).expect("the image");
        let file = std::env::temp_dir().join(format!("itrace-vdso-{}.so", std::process::id()));
        std::fs::write(&file, &image).unwrap();
        let out = std::process::Command::new("readelf").arg("-h").arg(&file).output().expect("readelf (binutils)");
        std::fs::remove_file(&file).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| -> u64 {
            let line =
                text.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_else(|| panic!("{name}: {text}"));
            line.split(':').nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
        };
        let end =
            field("Start of section headers") + field("Size of section headers") * field("Number of section headers");
        assert_eq!(image.len() as u64, end, "{text}");
    }

    /// The build-id read at record time is the one `readelf -n` prints, size and mtime are
    /// stat's; a file that is not ELF has an identity without build-id.
    #[test]
    fn file_identity_matches_readelf_and_stat() {
        use std::os::unix::fs::MetadataExt;
        let ls = Path::new("/usr/bin/ls");
        let out = std::process::Command::new("readelf").arg("-n").arg(ls).output().expect("readelf (binutils)");
        let text = String::from_utf8_lossy(&out.stdout);
        let want = text.lines().find_map(|l| l.trim().strip_prefix("Build ID: ")).expect("ls has a build-id");
        let id = file_identity(ls).expect("identity of ls");
        let got: String = id.build_id.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want.trim());
        let meta = std::fs::metadata(ls).unwrap();
        assert_eq!(id.size, meta.len());
        assert_eq!(id.mtime_ns, meta.mtime() as u64 * 1_000_000_000 + meta.mtime_nsec() as u64);
        let dir = std::env::temp_dir().join(format!("itrace-identity-{}", std::process::id()));
        std::fs::write(&dir, b"#!/bin/sh\n").unwrap();
        let text_file = file_identity(&dir).expect("identity of a text file");
        std::fs::remove_file(&dir).unwrap();
        assert!(text_file.build_id.is_empty());
        assert_eq!(text_file.size, 10);
        assert!(file_identity(Path::new("/nonexistent/file")).is_none());
    }
}
