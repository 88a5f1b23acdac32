//! The cross-architecture oracle (ppc64le, ppc64, s390x, i386): instructions
//! from the cross objdump, classified as branches here from each
//! architecture's mnemonics (not by itrace's decoder), qemu's log of the
//! program split into blocks, and per-function self counts from the cross
//! nm.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use crate::oracle::qemu::qemu_log_pcs;
use crate::programs::cross_tool;
use crate::run::run;

/// One instruction as the cross objdump shows it.
#[derive(Clone, Debug)]
pub struct CrossInsn {
    pub len: u64,
    pub mnemonic: String,
    pub operands: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Next,
    Call,
    Return,
    Jump,
    CondJump,
    CondReturn,
    Syscall,
}

/// Branch class from objdump's mnemonic, by each architecture's documented rules
/// (see docs/arc-and-report.md), independent of itrace's decoder.
fn classify(arch: &str, i: &CrossInsn) -> Kind {
    let m = i.mnemonic.trim_end_matches(['+', '-']);
    match arch {
        "ppc64le" | "ppc64" => {
            if m == "sc" || m == "scv" {
                return Kind::Syscall;
            }
            let is_branch = m.starts_with('b') && !matches!(m, "bpermd" | "brd" | "brh" | "brw");
            if !is_branch {
                return Kind::Next;
            }
            let unconditional = matches!(m, "b" | "ba" | "bl" | "bla" | "blr" | "bctr" | "bctrl" | "blrl");
            if m.ends_with("lrl") || m.ends_with("ctrl") || m == "bl" || m == "bla" || m == "bcl" {
                return Kind::Call; // (no conditional calls in these programs)
            }
            if m.ends_with("lr") {
                return if unconditional { Kind::Return } else { Kind::CondReturn };
            }
            if unconditional {
                Kind::Jump
            } else {
                Kind::CondJump
            }
        }
        "s390x" => match m {
            "svc" => Kind::Syscall,
            "nop" | "nopr" | "jnop" | "jgnop" => Kind::Next,
            "brasl" | "bras" | "bas" | "bal" => Kind::Call,
            "basr" | "balr" if i.operands.ends_with(",%r0") => Kind::Next,
            "basr" | "balr" => Kind::Call,
            "br" if i.operands == "%r14" => Kind::Return,
            "br" | "b" | "j" | "jg" => Kind::Jump,
            _ if m.starts_with('b')
                && m.ends_with('r')
                && i.operands == "%r14"
                && is_s390_cond_b(&m[..m.len() - 1]) =>
            {
                Kind::CondReturn
            }
            _ if m.starts_with('j') => Kind::CondJump,
            "bctr" | "bctgr" if i.operands.ends_with(",%r0") => Kind::Next,
            _ if matches!(
                m,
                "brct"
                    | "brctg"
                    | "brcth"
                    | "brxh"
                    | "brxhg"
                    | "brxle"
                    | "brxlg"
                    | "bct"
                    | "bctg"
                    | "bctr"
                    | "bctgr"
                    | "bxh"
                    | "bxle"
                    | "bxhg"
                    | "bxleg"
            ) =>
            {
                Kind::CondJump
            }
            _ if is_s390_cond_b(m) || (m.ends_with('r') && is_s390_cond_b(&m[..m.len() - 1])) => Kind::CondJump,
            _ if is_s390_compare_and_branch(m) => Kind::CondJump,
            _ => Kind::Next,
        },
        "i386" => {
            let m = i.mnemonic.as_str();
            match m {
                "call" => Kind::Call,
                "ret" => Kind::Return,
                "jmp" => Kind::Jump,
                "int" | "sysenter" => Kind::Syscall,
                _ if m.starts_with('j') || m.starts_with("loop") => Kind::CondJump,
                _ => Kind::Next,
            }
        }
        _ => unreachable!(),
    }
}

/// s390x extended mnemonics of `bc` (b + condition: be, bne, bh, ...).
fn is_s390_cond_b(m: &str) -> bool {
    const CONDS: &[&str] = &[
        "o", "h", "p", "nle", "l", "m", "nhe", "lh", "ne", "nz", "e", "z", "nlh", "he", "nl", "nm", "le", "nh", "np",
        "no",
    ];
    m.strip_prefix('b').is_some_and(|c| CONDS.contains(&c))
}

/// s390x compare-and-branch, relative (crj, cgij, clrjne, ...) or to an address (crb, cibe, ...).
fn is_s390_compare_and_branch(m: &str) -> bool {
    [
        "crj", "cgrj", "clrj", "clgrj", "cij", "cgij", "clij", "clgij", "crb", "cgrb", "clrb", "clgrb", "cib", "cgib",
        "clib", "clgib",
    ]
    .iter()
    .any(|b| m.starts_with(b))
}

/// `objdump -d -w` of a cross binary: pc -> instruction.
pub fn cross_objdump(arch: &str, bin: &Path) -> BTreeMap<u64, CrossInsn> {
    let o = run(Command::new(cross_tool(arch, "objdump")).arg("-d").arg("-w").arg(bin));
    o.assert_success();
    parse_cross_objdump(&o.stdout)
}

/// Add the instructions at executed pcs that objdump's linear sweep missed (it can lose step
/// after data in a code section, as at s390x `_exit`): disassemble from each such pc.
pub fn add_missing_insns(arch: &str, bin: &Path, pcs: &[u64], insns: &mut BTreeMap<u64, CrossInsn>) {
    let missing: BTreeSet<u64> = pcs.iter().copied().filter(|pc| !insns.contains_key(pc)).collect();
    for pc in missing {
        let o = run(Command::new(cross_tool(arch, "objdump"))
            .args(["-d", "-w", &format!("--start-address={pc:#x}"), &format!("--stop-address={:#x}", pc + 6)])
            .arg(bin));
        o.assert_success();
        if let Some(i) = parse_cross_objdump(&o.stdout).remove(&pc) {
            insns.insert(pc, i);
        }
    }
}

fn parse_cross_objdump(text: &str) -> BTreeMap<u64, CrossInsn> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some((addr, rest)) = line.split_once(":\t") else { continue };
        let addr = addr.trim();
        if addr.is_empty() || !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let Some((bytes, text)) = rest.split_once('\t') else { continue };
        let len = bytes.split_whitespace().count() as u64;
        let text = text.split('#').next().unwrap_or("").split('<').next().unwrap_or("").trim();
        let mut toks = text.split_whitespace();
        let mut mnemonic = toks.next().unwrap_or("").to_string();
        if matches!(mnemonic.as_str(), "rep" | "repz" | "repnz" | "repe" | "repne" | "lock") {
            mnemonic = format!("{mnemonic} {}", toks.next().unwrap_or(""));
        }
        let operands = toks.collect::<Vec<_>>().join(" ");
        m.insert(u64::from_str_radix(addr, 16).unwrap(), CrossInsn { len, mnemonic, operands });
    }
    m
}

/// One block of the oracle or of itrace's trace: the branch that ends it, where control went
/// (the address after a system call), instructions, and kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossBlock {
    pub from: u64,
    pub to: u64,
    pub count: u64,
    pub kind: &'static str,
}

/// Blocks of an executed pc sequence (a rep string instruction logged once per iteration counts
/// once), as qemu-user ran them: an s390x execute instruction whose instruction qemu ran inside
/// its helper counts one (what qemu's log and its plugin API show), one whose instruction qemu
/// logs after it counts two.
pub fn cross_oracle_blocks(arch: &str, pcs: &[u64], insns: &BTreeMap<u64, CrossInsn>) -> (Vec<CrossBlock>, u64) {
    oracle_blocks(arch, pcs, insns, false)
}

/// [`cross_oracle_blocks`] for a recorder on the machine itself (the native s390x one): an
/// execute instruction always counts two, itself and the instruction it runs, also where qemu
/// ran that one inside the execute's helper.
pub fn cross_oracle_blocks_native(arch: &str, pcs: &[u64], insns: &BTreeMap<u64, CrossInsn>) -> (Vec<CrossBlock>, u64) {
    oracle_blocks(arch, pcs, insns, true)
}

fn oracle_blocks(
    arch: &str,
    pcs: &[u64],
    insns: &BTreeMap<u64, CrossInsn>,
    execute_counts_two: bool,
) -> (Vec<CrossBlock>, u64) {
    let mut out = Vec::new();
    let (mut count, mut total) = (0u64, 0u64);
    let mut i = 0;
    while i < pcs.len() {
        let pc = pcs[i];
        let insn = insns.get(&pc).unwrap_or_else(|| panic!("{arch}: pc {pc:#x} is not an instruction in objdump"));
        let mut j = i + 1;
        if insn.mnemonic.starts_with("rep") {
            while j < pcs.len() && pcs[j] == pc {
                j += 1;
            }
        }
        count += 1;
        total += 1;
        // An s390x execute instruction counts two: itself and the instruction it runs out of
        // line, which qemu logs next at the execute's address and which ends the block if it
        // takes a branch. (qemu runs the storage-to-storage ones, opcodes 0xd0 to 0xdd, inside
        // the execute's helper, HELPER(ex) in target/s390x/tcg/mem_helper.c: no log line.)
        let mut insn = insn;
        let executed;
        if arch == "s390x" && matches!(insn.mnemonic.as_str(), "ex" | "exrl") {
            let logged = pcs.get(j) == Some(&pc);
            if logged {
                j += 1;
            }
            if logged || execute_counts_two {
                count += 1;
                total += 1;
            }
            executed = s390x_executed(insn, insns);
            insn = &executed;
        }
        let next = pcs.get(j).copied().unwrap_or(0);
        let fall = pc + insn.len;
        let kind = match classify(arch, insn) {
            Kind::Call => Some("Call"),
            Kind::Return => Some("Return"),
            Kind::Jump => Some("Jump"),
            Kind::Syscall => Some("Intrpt"),
            Kind::CondJump if next != fall => Some("CondJump"),
            Kind::CondReturn if next != fall => Some("Return"),
            Kind::Next if next != fall && next != 0 => Some("Other"),
            _ => None,
        };
        if let Some(kind) = kind {
            out.push(CrossBlock { from: pc, to: next, count, kind });
            count = 0;
        }
        i = j;
    }
    (out, total)
}

/// What the s390x execute instruction `ex` runs, as it acts at the execute's place (its length
/// the execute's): for `exrl %r0,ADDR`, objdump's instruction at ADDR; otherwise (an address
/// from registers, or R1's byte ORed in) a plain instruction: the test programs run only plain
/// ones that way.
fn s390x_executed(ex: &CrossInsn, insns: &BTreeMap<u64, CrossInsn>) -> CrossInsn {
    let target = (ex.mnemonic == "exrl")
        .then(|| ex.operands.strip_prefix("%r0,"))
        .flatten()
        .and_then(|a| u64::from_str_radix(a.trim(), 16).ok())
        .and_then(|a| insns.get(&a));
    match target {
        Some(t) => CrossInsn { len: ex.len, ..t.clone() },
        None => CrossInsn { len: ex.len, mnemonic: "executed".into(), operands: String::new() },
    }
}

/// itrace's blocks from `itrace dump` (raw records): user records, with a system call's
/// destination taken from the kernel record that follows it.
pub fn itrace_blocks(trace: &Path) -> (Vec<CrossBlock>, u64) {
    let o = crate::run::itrace(["dump".as_ref(), trace.as_os_str()]);
    o.assert_success();
    let mut out: Vec<CrossBlock> = Vec::new();
    let mut total = 0;
    for line in o.stdout.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let Some(off) = f.iter().position(|t| t.starts_with("TraceOff(")) {
            let _ = off;
            if let Some(n) = line.split("icount: ").nth(1).and_then(|s| s.split(',').next()) {
                total += n.trim().parse::<u64>().unwrap();
            }
            continue;
        }
        // "0x... cpu0 TS U Kind flags=.. aux=.. 0xFROM -> 0xTO tid=.. n=N"
        if f.len() < 11 || !f[1].starts_with("cpu") || (f[3] != "U" && f[3] != "K") {
            continue;
        }
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        let (from, to) = (hex(f[7]), hex(f[9]));
        let n: u64 = f[11].trim_start_matches("n=").parse().unwrap();
        total += n;
        if f[3] == "K" {
            if let Some(last) = out.last_mut() {
                last.to = to;
            }
            continue;
        }
        let kind = match f[4] {
            "Call" => "Call",
            "Return" => "Return",
            "Jump" => "Jump",
            "CondJump" => "CondJump",
            "Intrpt" => "Intrpt",
            _ => "Other",
        };
        out.push(CrossBlock { from, to, count: n, kind });
    }
    (out, total)
}

/// Asserts that itrace's blocks equal the oracle's, naming the first difference.
pub fn compare_cross_blocks(what: &str, got: &[CrossBlock], want: &[CrossBlock]) {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g,
            w,
            "{what}: block {k} differs from qemu's log (itrace vs oracle); previous: {:?}",
            &want[k.saturating_sub(3)..k]
        );
    }
    assert_eq!(got.len(), want.len(), "{what}: number of blocks");
}

/// Self instruction counts per function from qemu's pcs and the cross nm (synthetic code symbols
/// on ELFv1, where function symbols point to descriptors).
pub fn cross_function_counts(arch: &str, bin: &Path, pcs: &[u64], names: &[&str]) -> HashMap<String, u64> {
    let syms = cross_code_symbols(arch, bin);
    let mut counts = HashMap::new();
    let mut prev = None;
    for &pc in pcs {
        if prev == Some(pc) {
            continue; // rep iterations (none in these functions)
        }
        prev = Some(pc);
        let i = syms.partition_point(|s| s.0 <= pc);
        if i > 0 && names.contains(&syms[i - 1].1.as_str()) {
            *counts.entry(syms[i - 1].1.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// The code symbols of a cross binary from the cross `nm --defined-only --synthetic`
/// (`T`, `t`, `W`, `w`), as (address, name without ELFv1's leading `.`), sorted by address:
/// on ELFv1 the function symbols point to descriptors, the synthetic dot symbols to the code.
pub fn cross_code_symbols(arch: &str, bin: &Path) -> Vec<(u64, String)> {
    let o = run(Command::new(cross_tool(arch, "nm")).args(["--defined-only", "--synthetic"]).arg(bin));
    o.assert_success();
    let mut syms: Vec<(u64, String)> = o
        .stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && matches!(f[1], "T" | "t" | "W" | "w"))
                .then(|| (u64::from_str_radix(f[0], 16).unwrap(), f[2].trim_start_matches('.').to_string()))
        })
        .collect();
    syms.sort();
    syms
}

/// qemu's log of a cross program in an empty environment: one pc per executed instruction.
pub fn cross_qemu_pcs(arch: &str, bin: &Path) -> Vec<u64> {
    qemu_log_pcs(&format!("qemu-{arch}"), &[], bin, &[])
}
