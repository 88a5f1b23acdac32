//! The binutils oracles of x86_64 programs: instruction boundaries and
//! mnemonics from `objdump -d`, code symbols from `nm` and sections from
//! `objdump -h`, source lines from `addr2line`, and the ELF header's type
//! and entry point.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use crate::run::{require_tool, run};

/// One instruction as objdump disassembles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insn {
    pub len: u64,
    /// The opcode mnemonic without prefixes (`call`, `jne`, `movsb`, `ret`).
    pub mnemonic: String,
    /// A `rep`/`repz`/`repnz` prefix is present.
    pub rep: bool,
    /// objdump's full text (`rep movsb %ds:(%rsi),%es:(%rdi)`).
    pub text: String,
}

/// How an instruction transfers control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    Call,
    Return,
    /// Unconditional jump (direct or indirect).
    Jump,
    /// Conditional jump (`jcc`, `loop*`, `jrcxz`): taken iff next != pc+len.
    CondJump,
    /// `syscall`, `sysenter`, `int`: a transition to the kernel.
    Syscall,
}

const PREFIXES: &[&str] = &[
    "rep", "repz", "repe", "repnz", "repne", "lock", "notrack", "bnd", "data16", "data32", "addr32", "cs", "ds", "es",
    "fs", "gs", "ss", "rex", "rex.w", "xacquire", "xrelease",
];

impl Insn {
    /// A string instruction with a rep prefix: qemu logs it once per
    /// iteration; it is one instruction.
    pub fn is_rep_string(&self) -> bool {
        if !self.rep {
            return false;
        }
        let m = self.mnemonic.as_str();
        ["movs", "stos", "lods", "cmps", "scas", "ins", "outs"].iter().any(|base| {
            m.strip_prefix(base).is_some_and(|sfx| sfx.is_empty() || matches!(sfx, "b" | "w" | "l" | "d" | "q"))
        })
    }

    pub fn flow(&self) -> Flow {
        let m = self.mnemonic.as_str();
        match m {
            "call" | "callq" | "lcall" => Flow::Call,
            "ret" | "retq" | "lret" | "lretq" | "retf" => Flow::Return,
            "jmp" | "jmpq" | "ljmp" => Flow::Jump,
            "syscall" | "sysenter" | "int" | "int3" | "into" | "int1" => Flow::Syscall,
            "loop" | "loope" | "loopz" | "loopne" | "loopnz" | "jrcxz" | "jecxz" | "jcxz" => Flow::CondJump,
            _ if m.starts_with('j') => Flow::CondJump,
            _ => Flow::Next,
        }
    }
}

/// Disassembles every executable section of `binary` with `objdump -d -w`
/// and returns pc -> instruction.
pub fn objdump_insns(binary: &Path) -> BTreeMap<u64, Insn> {
    require_tool("objdump");
    let o = run(Command::new("objdump").arg("-d").arg("-w").arg(binary));
    o.assert_success();
    parse_objdump(&o.stdout)
}

/// Parses `objdump -d -w` output.
pub fn parse_objdump(text: &str) -> BTreeMap<u64, Insn> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        // "  401000:\tb9 e8 03 00 00       \tmov    $0x3e8,%ecx"
        let Some((addr, rest)) = line.split_once(":\t") else {
            continue;
        };
        let addr = addr.trim();
        if addr.is_empty() || !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let pc = u64::from_str_radix(addr, 16).expect("hex address");
        let (bytes, text) = match rest.split_once('\t') {
            Some((b, t)) => (b, t.trim()),
            None => (rest, ""),
        };
        let len = bytes.split_whitespace().count() as u64;
        if len == 0 {
            continue;
        }
        if text.is_empty() {
            // continuation line of a long instruction (not produced with -w,
            // handled anyway): belongs to the previous instruction
            if let Some((_, last)) = m.iter_mut().next_back() {
                let last: &mut Insn = last;
                last.len += len;
            }
            continue;
        }
        let text = text.split('#').next().unwrap_or("").trim().to_string();
        let mut rep = false;
        let mut mnemonic = String::new();
        for tok in text.split_whitespace() {
            if PREFIXES.contains(&tok) {
                rep |= tok.starts_with("rep");
                continue;
            }
            mnemonic = tok.to_string();
            break;
        }
        m.insert(pc, Insn { len, mnemonic, rep, text });
    }
    m
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub addr: u64,
    pub size: u64,
    /// nm's type letter (`T`, `t`, `W`, ...).
    pub kind: char,
}

/// Code symbols of `binary` from `nm -S --defined-only`, sorted by address,
/// and its sections from `objdump -h`.
pub struct Symbols {
    pub syms: Vec<Symbol>,
    /// (name, start, end) of every section.
    pub sections: Vec<(String, u64, u64)>,
}

impl Symbols {
    pub fn of(binary: &Path) -> Symbols {
        require_tool("nm");
        require_tool("objdump");
        let o = run(Command::new("nm").arg("-S").arg("--defined-only").arg(binary));
        o.assert_success();
        let mut s = Symbols::parse(&o.stdout);
        let h = run(Command::new("objdump").arg("-h").arg("-w").arg(binary));
        h.assert_success();
        s.sections = parse_sections(&h.stdout);
        s
    }

    /// Parses nm output (no section information: zero-size symbols then
    /// extend to the next symbol).
    pub fn parse(text: &str) -> Symbols {
        let mut v = Vec::new();
        for line in text.lines() {
            let t: Vec<&str> = line.split_whitespace().collect();
            let (addr, size, kind, name) = match t.len() {
                4 => (t[0], Some(t[1]), t[2], t[3]),
                3 => (t[0], None, t[1], t[2]),
                _ => continue,
            };
            let kind = kind.chars().next().unwrap_or('?');
            if !matches!(kind, 'T' | 't' | 'W' | 'w' | 'i') {
                continue;
            }
            v.push(Symbol {
                name: name.to_string(),
                addr: u64::from_str_radix(addr, 16).expect("nm address"),
                size: size.map_or(0, |s| u64::from_str_radix(s, 16).expect("nm size")),
                kind,
            });
        }
        v.sort_by_key(|s| (s.addr, s.kind.is_ascii_lowercase()));
        Symbols { syms: v, sections: Vec::new() }
    }

    pub fn by_name(&self, name: &str) -> Option<&Symbol> {
        self.syms.iter().find(|s| s.name == name)
    }

    fn section_of(&self, addr: u64) -> Option<&(String, u64, u64)> {
        self.sections.iter().find(|(_, lo, hi)| *lo <= addr && addr < *hi)
    }

    /// The symbol covering `addr`, and the offset: a symbol with a size
    /// covers [addr, addr+size); one without (crt code such as `_init`,
    /// `frame_dummy`) covers up to the next symbol, within its section.
    pub fn lookup(&self, addr: u64) -> Option<(&Symbol, u64)> {
        if let Some(s) = self
            .syms
            .iter()
            .filter(|s| s.addr <= addr && addr < s.addr + s.size)
            .min_by_key(|s| (s.kind.is_ascii_lowercase(), s.size))
        {
            return Some((s, addr - s.addr));
        }
        let s = self.syms.iter().rev().find(|s| s.addr <= addr)?;
        if s.size != 0 {
            return None; // after the end of a sized symbol
        }
        if !self.sections.is_empty() && self.section_of(s.addr) != self.section_of(addr) {
            return None;
        }
        Some((s, addr - s.addr))
    }

    /// `symbol+0xoff` (or `<unknown>`), as used in comparisons.
    pub fn describe(&self, addr: u64) -> String {
        match self.lookup(addr) {
            Some((s, off)) => format!("{}+{off:#x}", s.name),
            None => "<unknown>".to_string(),
        }
    }
}

/// Parses `objdump -h -w`: (name, start, end) of each section.
pub fn parse_sections(text: &str) -> Vec<(String, u64, u64)> {
    let mut v = Vec::new();
    for line in text.lines() {
        // "  0 .interp  0000001c  0000000000000318  0000000000000318  00000318  2**0  CONTENTS, ..."
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 6 || t[0].parse::<u32>().is_err() {
            continue;
        }
        let (Ok(size), Ok(vma)) = (u64::from_str_radix(t[2], 16), u64::from_str_radix(t[3], 16)) else {
            continue;
        };
        v.push((t[1].to_string(), vma, vma + size));
    }
    v
}

/// `addr2line -e binary` on `addrs`: one `FILE:LINE` per address, discriminators left out
/// (`??:0`, `FILE:?` where it knows nothing).
fn addr2line_raw(binary: &Path, addrs: &[u64]) -> Vec<String> {
    require_tool("addr2line");
    if addrs.is_empty() {
        return Vec::new();
    }
    let mut cmd = Command::new("addr2line");
    cmd.arg("-e").arg(binary);
    for a in addrs {
        cmd.arg(format!("{a:#x}"));
    }
    let o = run(&mut cmd);
    o.assert_success();
    let out: Vec<String> = o.stdout.lines().map(|l| l.split(" (").next().unwrap_or(l).trim().to_string()).collect();
    assert_eq!(out.len(), addrs.len(), "addr2line output:\n{}", o.stdout);
    out
}

/// Source line of each address from `addr2line -e binary`; 0 when unknown.
pub fn addr2line_lines(binary: &Path, addrs: &[u64]) -> Vec<u64> {
    addr2line_raw(binary, addrs)
        .iter()
        .map(|loc| loc.rsplit(':').next().unwrap_or("0").trim().parse().unwrap_or(0))
        .collect()
}

/// `FILE:LINE` of each address from `addr2line -e binary`; `0` where addr2line knows no line
/// (`??:0`, `FILE:?`, `FILE:0`).
pub fn addr2line_locations(binary: &Path, addrs: &[u64]) -> Vec<String> {
    addr2line_raw(binary, addrs)
        .into_iter()
        .map(|loc| match loc.rsplit_once(':') {
            Some((file, line)) if file != "??" && line.parse::<u64>().is_ok_and(|n| n > 0) => loc,
            _ => "0".to_string(),
        })
        .collect()
}

/// (e_type, e_entry) of a 64-bit little-endian ELF file.
pub fn elf_type_entry(binary: &Path) -> (u16, u64) {
    let b = fs::read(binary).expect("read ELF");
    assert!(b.len() >= 64 && &b[..4] == b"\x7fELF", "not an ELF file");
    assert_eq!(b[4], 2, "not ELF64");
    let e_type = u16::from_le_bytes([b[16], b[17]]);
    let e_entry = u64::from_le_bytes(b[24..32].try_into().unwrap());
    (e_type, e_entry)
}
