//! What the recorders need from a program's ELF file: its architecture (for
//! the trace header) and, for the GDB recorder, which cannot ask the stub
//! for mappings, its loadable segments and interpreter.

use itrace_format::Arch;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not an ELF file itrace can read: {why}")]
    Malformed { path: PathBuf, why: String },
}

/// The architecture an ELF file runs on, from its identification bytes and e_machine
/// (None: not ELF, or an architecture itrace does not trace).
pub fn arch_of_bytes(h: &[u8]) -> Option<Arch> {
    if h.len() < 20 || &h[..4] != b"\x7fELF" {
        return None;
    }
    let (class64, big) = (h[4] == 2, h[5] == 2);
    let machine = if big { u16::from_be_bytes([h[18], h[19]]) } else { u16::from_le_bytes([h[18], h[19]]) };
    // e_machine values from the System V ABI registry (elf.h).
    match (machine, class64) {
        (62, true) => Some(Arch::X86_64),
        (3, false) => Some(Arch::I386),
        (21, true) => Some(if big { Arch::Ppc64 } else { Arch::Ppc64le }),
        (22, true) => Some(Arch::S390x),
        _ => None,
    }
}

/// The architecture of the ELF file at `path` (reads its first 64 bytes only).
pub fn arch_of(path: &Path) -> Option<Arch> {
    use std::io::Read;
    let mut h = [0u8; 64];
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(&mut h).ok()?;
    arch_of_bytes(&h[..n])
}

/// One PT_LOAD segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    /// MTE protection bits: 1 read, 2 write, 4 execute.
    pub prot: u32,
}

/// The parts of a program's ELF file the GDB recorder uses.
#[derive(Clone, Debug)]
pub struct Program {
    pub path: PathBuf,
    pub arch: Option<Arch>,
    /// ET_DYN (position-independent): loaded at a bias the stub's auxv tells.
    pub position_independent: bool,
    pub entry: u64,
    pub loads: Vec<LoadSegment>,
    /// PT_INTERP: the dynamic loader, for dynamically linked programs.
    pub interpreter: Option<PathBuf>,
}

impl Program {
    pub fn read(path: &Path) -> Result<Program, ElfError> {
        let bytes = std::fs::read(path).map_err(|source| ElfError::Io { path: path.to_path_buf(), source })?;
        let elf = goblin::elf::Elf::parse(&bytes)
            .map_err(|e| ElfError::Malformed { path: path.to_path_buf(), why: e.to_string() })?;
        let loads = elf
            .program_headers
            .iter()
            .filter(|ph| ph.p_type == goblin::elf::program_header::PT_LOAD)
            .map(|ph| LoadSegment {
                vaddr: ph.p_vaddr,
                memsz: ph.p_memsz,
                offset: ph.p_offset,
                // ELF p_flags: 1 execute, 2 write, 4 read; MTE: 1 read, 2 write, 4 execute.
                prot: (ph.p_flags & 1) << 2 | (ph.p_flags & 2) | (ph.p_flags & 4) >> 2,
            })
            .collect();
        Ok(Program {
            path: path.to_path_buf(),
            arch: arch_of_bytes(&bytes),
            position_independent: elf.header.e_type == goblin::elf::header::ET_DYN,
            entry: elf.entry,
            loads,
            interpreter: elf.interpreter.map(PathBuf::from),
        })
    }

    /// Whether `addr` (unbiased) lies in a loaded segment that is not writable: code there
    /// cannot change unseen, so its decoding can be cached.
    pub fn read_only_code(&self, addr: u64) -> bool {
        self.loads.iter().any(|l| l.prot & 2 == 0 && addr >= l.vaddr && addr < l.vaddr + l.memsz)
    }
}

/// The program, its dynamic loader and every shared library it links, directly or not, found as the dynamic
/// loader finds them (DT_RUNPATH/DT_RPATH with $ORIGIN, LD_LIBRARY_PATH, /etc/ld.so.conf.d, the
/// system directories). `None` when the program is not a readable ELF file or a library
/// cannot be found here (the loader may still find it, through its cache or a preload).
pub fn linked_objects(program: &Path) -> Option<Vec<PathBuf>> {
    let arch = arch_of(program)?;
    let mut dirs_conf: Vec<PathBuf> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/etc/ld.so.conf.d") {
        let mut confs: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        confs.sort();
        for c in confs {
            let text = std::fs::read_to_string(&c).unwrap_or_default();
            dirs_conf.extend(text.lines().map(str::trim).filter(|l| l.starts_with('/')).map(PathBuf::from));
        }
    }
    let system: &[&str] = match arch {
        Arch::I386 => &["/lib/i386-linux-gnu", "/usr/lib/i386-linux-gnu", "/lib32", "/usr/lib32", "/lib", "/usr/lib"],
        _ => &["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"],
    };
    let env_dirs: Vec<PathBuf> =
        std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    let mut found = vec![program.to_path_buf()];
    let mut next = 0;
    while next < found.len() {
        let object = found[next].clone();
        next += 1;
        let bytes = std::fs::read(&object).ok()?;
        let elf = goblin::elf::Elf::parse(&bytes).ok()?;
        let origin = object.parent().unwrap_or(Path::new("/")).to_string_lossy().into_owned();
        let own: Vec<PathBuf> = elf
            .runpaths
            .iter()
            .chain(&elf.rpaths)
            .flat_map(|p| p.split(':'))
            .map(|d| PathBuf::from(d.replace("$ORIGIN", &origin).replace("${ORIGIN}", &origin)))
            .collect();
        if let Some(interp) = elf.interpreter {
            let path = std::fs::canonicalize(interp).ok()?;
            if !found.contains(&path) {
                found.push(path);
            }
        }
        for lib in &elf.libraries {
            let candidates: Vec<PathBuf> = if lib.contains('/') {
                vec![PathBuf::from(lib)]
            } else {
                own.iter()
                    .chain(&env_dirs)
                    .chain(&dirs_conf)
                    .cloned()
                    .chain(system.iter().map(PathBuf::from))
                    .map(|d| d.join(lib))
                    .collect()
            };
            let path = candidates.into_iter().find(|p| p.is_file() && arch_of(p) == Some(arch))?;
            let path = std::fs::canonicalize(&path).unwrap_or(path);
            if !found.contains(&path) {
                found.push(path);
            }
        }
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_from_headers() {
        let mut h = [0u8; 20];
        h[..4].copy_from_slice(b"\x7fELF");
        let set = |h: &mut [u8; 20], class: u8, data: u8, machine: u16| {
            h[4] = class;
            h[5] = data;
            let m = if data == 2 { machine.to_be_bytes() } else { machine.to_le_bytes() };
            h[18..20].copy_from_slice(&m);
        };
        set(&mut h, 2, 1, 62);
        assert_eq!(arch_of_bytes(&h), Some(Arch::X86_64));
        set(&mut h, 1, 1, 3);
        assert_eq!(arch_of_bytes(&h), Some(Arch::I386));
        set(&mut h, 2, 1, 21);
        assert_eq!(arch_of_bytes(&h), Some(Arch::Ppc64le));
        set(&mut h, 2, 2, 21);
        assert_eq!(arch_of_bytes(&h), Some(Arch::Ppc64));
        set(&mut h, 2, 2, 22);
        assert_eq!(arch_of_bytes(&h), Some(Arch::S390x));
        set(&mut h, 1, 2, 20); // 32-bit PowerPC: not traced
        assert_eq!(arch_of_bytes(&h), None);
        assert_eq!(arch_of_bytes(b"#!/bin/sh\n"), None);
    }

    /// The libraries of /bin/ls and its loader as `ldd` lists them (glibc's loader is the truth).
    #[test]
    fn linked_objects_match_ldd() {
        let ls = Path::new("/bin/ls");
        let ldd = std::process::Command::new("ldd").arg(ls).output().expect("ldd (package libc-bin) runs");
        let mut want: Vec<PathBuf> = String::from_utf8_lossy(&ldd.stdout)
            .lines()
            .filter_map(|l| l.split("=> ").nth(1).or_else(|| Some(l.trim()).filter(|l| l.starts_with('/'))))
            .filter_map(|r| r.split_whitespace().next())
            .map(|p| std::fs::canonicalize(p).unwrap())
            .collect();
        want.sort();
        let mut got = linked_objects(ls).expect("all of ls's libraries found");
        assert_eq!(got.remove(0), ls);
        got.sort();
        assert_eq!(got, want);
    }
}
