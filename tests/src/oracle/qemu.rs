//! The qemu-user oracle: the guest pc of every executed instruction from
//! `qemu-ARCH -singlestep -d nochain,exec`, split into blocks at the taken
//! branches with objdump's instruction lengths and mnemonics, and the arc
//! lines and per-function self counts those blocks predict.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;

use crate::arc::Expected;
use crate::oracle::binutils::{elf_type_entry, objdump_insns, Flow, Insn, Symbols};
use crate::run::{require_tool, run};

/// Runs `env -i qemu-x86_64 -singlestep -d nochain,exec -D LOG binary args`
/// and returns the guest pc of every `Trace` line: one line per executed
/// instruction, except that a `rep` string instruction is logged once per
/// iteration (see [`oracle_branches`]). The program must exit 0.
pub fn qemu_exec_pcs(binary: &Path, args: &[&str]) -> Vec<u64> {
    qemu_log_pcs("qemu-x86_64", &[], binary, args)
}

/// Runs `env -i QEMU OPTIONS -singlestep -d nochain,exec -D LOG binary args`, where QEMU is a
/// qemu-user binary (`qemu-x86_64`, `qemu-ppc64le`, ...) and OPTIONS come before the logging
/// ones (`-L SYSROOT`), and returns the guest pc of every `Trace` line of the log. The program
/// must exit 0.
pub fn qemu_log_pcs(qemu: &str, options: &[&str], binary: &Path, args: &[&str]) -> Vec<u64> {
    let qemu = require_tool(qemu);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("qemu.log");
    let o = run(Command::new("env")
        .arg("-i")
        .arg(qemu)
        .args(options)
        .args(["-singlestep", "-d", "nochain,exec", "-D"])
        .arg(&log)
        .arg(binary)
        .args(args));
    o.assert_success();
    let f = fs::File::open(&log).unwrap_or_else(|e| panic!("qemu log {}: {e}", log.display()));
    let pcs = parse_qemu_log(BufReader::new(f));
    assert!(!pcs.is_empty(), "qemu logged no instructions for {}", binary.display());
    pcs
}

/// Parses qemu 7.2's `-d exec` log. A line looks like
/// `Trace 0: 0x7fcaf4a00100 [0000000000000000/0000000000401000/1040c0b3/00000201] `
/// (cpu index, host address of the translated block, then
/// cs_base/pc/flags/cflags); the second bracketed field is the guest pc.
///
/// A block is logged before it runs, and may then not run: another guest thread asked every
/// CPU to stop (a new thread, a flush of the translations) and the block's entry check saw it.
/// qemu then logs `Stopped execution of TB chain before 0x7f376d519300 [0000000001000a12]`,
/// and runs that pc again later (logged again). So such a line takes back the newest entry of
/// its pc (the same CPU logged it just before; other threads' lines may come in between).
/// Seen with tests/programs/threads.c under load: one instruction of 120,052 counted twice.
pub fn parse_qemu_log(r: impl BufRead) -> Vec<u64> {
    let mut pcs = Vec::new();
    for line in r.lines() {
        let line = line.expect("read qemu log");
        if let Some(rest) = line.strip_prefix("Stopped execution of TB chain before ") {
            let pc = rest
                .split_once('[')
                .and_then(|(_, r)| r.split_once(']'))
                .and_then(|(pc, _)| u64::from_str_radix(pc, 16).ok())
                .unwrap_or_else(|| panic!("unexpected qemu log line: {line}"));
            let at = pcs.iter().rposition(|&p| p == pc).unwrap_or_else(|| panic!("{line}: no block of that pc before"));
            pcs.remove(at);
            continue;
        }
        let Some(rest) = line.strip_prefix("Trace ") else {
            continue;
        };
        let Some(open) = rest.find('[') else {
            panic!("unexpected qemu log line: {line}");
        };
        let inner = &rest[open + 1..];
        let inner = &inner[..inner.find(']').expect("closing ]")];
        let pc = inner.split('/').nth(1).unwrap_or_else(|| panic!("unexpected qemu log line: {line}"));
        pcs.push(u64::from_str_radix(pc, 16).expect("hex pc"));
    }
    pcs
}

/// Kind of a block's last instruction, as in the arc's field 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BranchKind {
    /// A system call (`U` line of type 0, INTRPT).
    Intrpt,
    Call,
    Return,
    /// Any jump, conditional or not.
    Jump,
    /// A non-branch instruction after which control went elsewhere (or the
    /// end of the trace after a non-branch instruction).
    Other,
}

impl BranchKind {
    pub fn type_code(self) -> u8 {
        match self {
            BranchKind::Intrpt => 0,
            BranchKind::Call => 1,
            BranchKind::Return => 2,
            BranchKind::Jump => 3,
            BranchKind::Other => 5,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            BranchKind::Intrpt => "INTRPT",
            BranchKind::Call => "CALL",
            BranchKind::Return => "RETURN",
            BranchKind::Jump => "JUMP",
            BranchKind::Other => "OTHER",
        }
    }
}

/// One taken branch (end of a block) found in an executed pc sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OracleBranch {
    /// pc of the branch instruction (the block's last instruction).
    pub from: u64,
    /// pc executed next; 0 when the trace ends here.
    pub to: u64,
    pub kind: BranchKind,
    /// First instruction of the block (the previous branch's target).
    pub start: u64,
    /// Instructions in the block, including the branch; a rep string
    /// instruction counts once.
    pub count: u64,
}

/// Splits an executed pc sequence into blocks. A block ends at a taken
/// branch: wherever the next pc is not pc + length, and at every
/// unconditional control transfer (call, jmp, ret, syscall) even when its
/// target is the next instruction. A system call ends a block of kind
/// [`BranchKind::Intrpt`] (itrace writes it as a `U` INTRPT line followed
/// by a `K` IRET line). Consecutive repetitions of the pc of a rep string
/// instruction are iterations of one instruction. The last instruction of
/// the sequence ends the last block (`to` = 0).
pub fn oracle_branches(pcs: &[u64], insns: &BTreeMap<u64, Insn>) -> Vec<OracleBranch> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut start = match pcs.first() {
        Some(&p) => p,
        None => return out,
    };
    let mut count = 0u64;
    while i < pcs.len() {
        let pc = pcs[i];
        let insn = insns
            .get(&pc)
            .unwrap_or_else(|| panic!("pc {pc:#x} (step {i}) is not an instruction start in objdump's output"));
        let mut j = i + 1;
        if insn.is_rep_string() {
            while j < pcs.len() && pcs[j] == pc {
                j += 1;
            }
        }
        count += 1;
        let next = pcs.get(j).copied();
        let flow = insn.flow();
        let fallthrough = pc + insn.len;
        let kind = match flow {
            Flow::Call => Some(BranchKind::Call),
            Flow::Return => Some(BranchKind::Return),
            Flow::Jump => Some(BranchKind::Jump),
            Flow::Syscall => Some(BranchKind::Intrpt),
            Flow::CondJump => match next {
                Some(n) if n == fallthrough => None,
                _ => Some(BranchKind::Jump),
            },
            Flow::Next => match next {
                Some(n) if n == fallthrough => None,
                _ => Some(BranchKind::Other),
            },
        };
        if let Some(kind) = kind {
            out.push(OracleBranch { from: pc, to: next.unwrap_or(0), kind, start, count });
            count = 0;
            if let Some(n) = next {
                start = n;
            }
        }
        i = j;
    }
    out
}

/// Number of executed instructions (rep string iterations collapsed).
pub fn oracle_instruction_count(pcs: &[u64], insns: &BTreeMap<u64, Insn>) -> u64 {
    let mut n = 0;
    let mut i = 0;
    while i < pcs.len() {
        let pc = pcs[i];
        let mut j = i + 1;
        if insns.get(&pc).is_some_and(Insn::is_rep_string) {
            while j < pcs.len() && pcs[j] == pc {
                j += 1;
            }
        }
        n += 1;
        i = j;
    }
    n
}

/// Self instruction counts per function of `binary` from a qemu pc sequence
/// of a run of `binary` (rep iterations collapsed). Works for static and for
/// position-independent executables: the load bias is found by locating
/// the entry point's first instructions in the sequence.
pub fn qemu_self_counts(binary: &Path, pcs: &[u64]) -> HashMap<String, u64> {
    let insns = objdump_insns(binary);
    let syms = Symbols::of(binary);
    let (e_type, entry) = elf_type_entry(binary);
    let bias = if e_type == 3 { find_load_bias(pcs, &insns, entry) } else { 0 };
    let mut counts = HashMap::new();
    let mut i = 0;
    while i < pcs.len() {
        let pc = pcs[i].wrapping_sub(bias);
        let mut j = i + 1;
        if let Some(insn) = insns.get(&pc) {
            if insn.is_rep_string() {
                while j < pcs.len() && pcs[j] == pcs[i] {
                    j += 1;
                }
            }
            if let Some((s, _)) = syms.lookup(pc) {
                *counts.entry(s.name.clone()).or_insert(0) += 1;
            }
        }
        i = j;
    }
    counts
}

fn find_load_bias(pcs: &[u64], insns: &BTreeMap<u64, Insn>, entry: u64) -> u64 {
    // the straight-line start of _start: its first instructions in order
    let mut seq = vec![entry];
    while seq.len() < 6 {
        let last = *seq.last().unwrap();
        match insns.get(&last) {
            Some(i) if i.flow() == Flow::Next => seq.push(last + i.len),
            _ => break,
        }
    }
    for (k, &p) in pcs.iter().enumerate() {
        let bias = p.wrapping_sub(entry);
        if bias % 4096 != 0 {
            continue;
        }
        if seq.iter().enumerate().all(|(n, &a)| pcs.get(k + n) == Some(&a.wrapping_add(bias))) {
            return bias;
        }
    }
    panic!("could not find the entry point {entry:#x} in the qemu trace");
}

/// The arc lines the oracle predicts for a program whose code is all in
/// `syms`. The `K` line after the final system call (exit) is not
/// predicted: tracing ends inside it.
pub fn expected_lines(branches: &[OracleBranch], syms: &Symbols) -> Vec<Expected> {
    let mut v = Vec::new();
    for b in branches {
        v.push(Expected::User { location: syms.describe(b.start), count: b.count, type_code: b.kind.type_code() });
        if b.kind == BranchKind::Intrpt && b.to != 0 {
            v.push(Expected::Kernel);
        }
    }
    v
}

/// Everything the oracle knows about one run of a freestanding program.
pub struct Oracle {
    pub pcs: Vec<u64>,
    pub insns: BTreeMap<u64, Insn>,
    pub branches: Vec<OracleBranch>,
    pub instructions: u64,
    pub syms: Symbols,
    pub expected: Vec<Expected>,
}

impl Oracle {
    pub fn of(binary: &Path, args: &[&str]) -> Oracle {
        let pcs = qemu_exec_pcs(binary, args);
        let insns = objdump_insns(binary);
        let branches = oracle_branches(&pcs, &insns);
        let instructions = oracle_instruction_count(&pcs, &insns);
        let syms = Symbols::of(binary);
        let expected = expected_lines(&branches, &syms);
        Oracle { pcs, insns, branches, instructions, syms, expected }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_qemu_log;

    /// Lines of a real log (qemu-s390x 7.2, tests/programs/threads.c under load): the block
    /// at 0x1000a12 was logged, then stopped before it ran, and ran (logged) again later.
    #[test]
    fn a_block_stopped_before_it_ran_is_not_counted() {
        let log = "\
Trace 1: 0x7f376d5191c0 [0000000000000000/0000000001000a0c/60000003/00080201] thr_compute
Trace 1: 0x7f376d519300 [0000000000000000/0000000001000a12/60000003/00080201] thr_compute
Trace 0: 0x7f376d400100 [0000000000000000/000000000104dc28/60000003/00080201] __clone
Stopped execution of TB chain before 0x7f376d519300 [0000000001000a12] thr_compute
Trace 0: 0x7f376d400240 [0000000000000000/000000000104dc2c/60000003/00080201] __clone
Trace 1: 0x7f376d519300 [0000000000000000/0000000001000a12/60000003/00080201] thr_compute
";
        assert_eq!(parse_qemu_log(log.as_bytes()), [0x1000a0c, 0x104dc28, 0x104dc2c, 0x1000a12]);
    }
}
