//! The module table a backend keeps of the processes it traces: their executable mappings as
//! last seen, and the module-table (MTE) records that say what changed, written once here for
//! every backend that reads mappings from /proc.

use crate::procfs::{self, Mapping};
use itrace_format::Mte;
use std::collections::HashMap;

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
    if let Some(m) = added.iter().find(|m| m.path == "[vdso]") {
        if let Some(image) = procfs::vdso_image(pid as i32, m) {
            records.push(Mte::VdsoImage { ts, pid, start: m.start, image });
        }
    }
    records
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
}
