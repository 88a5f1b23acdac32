//! Cross-architecture tracing: PowerPC64 (little- and big-endian), s390x
//! and 32-bit x86 programs traced through qemu-user's GDB stub
//! (`itrace record --qemu ARCH`), and i386 natively through ptrace.
//!
//! Oracles: qemu's own instruction log of the same program in the same
//! empty environment (`env -i qemu-ARCH -singlestep -d nochain,exec`), the
//! cross objdump (instruction lengths and branch mnemonics, classified here
//! from objdump's text, not by itrace's decoder), the cross nm symbol table,
//! and the hand counts in tests/programs/cross/*.S.

mod common;

use common::*;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// (itrace/qemu architecture name, cross tool prefix, Debian package of the cross compiler).
const ARCHES: &[(&str, &str, &str)] = &[
    ("ppc64le", "powerpc64le-linux-gnu-", "gcc-powerpc64le-linux-gnu"),
    ("ppc64", "powerpc64-linux-gnu-", "gcc-powerpc64-linux-gnu"),
    ("s390x", "s390x-linux-gnu-", "gcc-s390x-linux-gnu"),
    ("i386", "i686-linux-gnu-", "gcc-i686-linux-gnu"),
];

/// Hand counts from the comments in tests/programs/cross/*.S: (instructions, user blocks).
fn hand_count(arch: &str) -> (u64, usize) {
    match arch {
        "ppc64le" | "ppc64" => (47, 17),
        "s390x" => (38, 17),
        "i386" => (44, 17),
        _ => unreachable!(),
    }
}

/// A cross tool (`powerpc64le-linux-gnu-objdump`), or a failure naming its package.
fn cross_tool(arch: &str, tool: &str) -> String {
    let (_, prefix, package) = ARCHES.iter().find(|a| a.0 == arch).expect("known arch");
    let name = format!("{prefix}{tool}");
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join(&name).is_file());
    assert!(
        found,
        "required tool `{name}` is not installed: install the Debian package `{package}` \
         (its binutils come with it; or run scripts/install-test-deps.sh)"
    );
    name
}

fn qemu_for(arch: &str) -> String {
    let name = format!("qemu-{arch}");
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join(&name).is_file());
    assert!(found, "required tool `{name}` is not installed: install the Debian package `qemu-user`");
    name
}

static CROSS: OnceLock<PathBuf> = OnceLock::new();

/// Builds tests/programs/cross into target/test-programs/cross (once per test binary).
fn cross_program(name: &str) -> PathBuf {
    let dir = CROSS.get_or_init(|| {
        require_tool("make");
        for (arch, _, _) in ARCHES {
            cross_tool(arch, "gcc");
        }
        let out = target_dir().join("test-programs").join("cross");
        std::fs::create_dir_all(&out).expect("create cross dir");
        let out = out.canonicalize().expect("canonicalize");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs").join("cross");
        let o = run(Command::new("make").arg("-C").arg(&src).arg(format!("OUT={}", out.display())));
        assert!(o.success(), "building the cross test programs failed:\n{}\n{}", o.stdout, o.stderr);
        out
    });
    let p = dir.join(name);
    assert!(p.is_file(), "cross test program {} missing", p.display());
    p
}

/// One instruction as the cross objdump shows it.
#[derive(Clone, Debug)]
struct CrossInsn {
    len: u64,
    mnemonic: String,
    operands: String,
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
            _ if matches!(
                m,
                "brct" | "brctg" | "brxh" | "brxhg" | "brxle" | "brxlg" | "bct" | "bctg" | "bxh" | "bxle"
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

/// s390x compare-and-branch relative (crj, cgij, clrjne, ...).
fn is_s390_compare_and_branch(m: &str) -> bool {
    ["crj", "cgrj", "clrj", "clgrj", "cij", "cgij", "clij", "clgij"].iter().any(|b| m.starts_with(b))
}

/// `objdump -d -w` of a cross binary: pc -> instruction.
fn cross_objdump(arch: &str, bin: &Path) -> BTreeMap<u64, CrossInsn> {
    let o = run(Command::new(cross_tool(arch, "objdump")).arg("-d").arg("-w").arg(bin));
    o.assert_success();
    parse_cross_objdump(&o.stdout)
}

/// Add the instructions at executed pcs that objdump's linear sweep missed (it can lose step
/// after data in a code section, as at s390x `_exit`): disassemble from each such pc.
fn add_missing(arch: &str, bin: &Path, pcs: &[u64], insns: &mut BTreeMap<u64, CrossInsn>) {
    let missing: std::collections::BTreeSet<u64> = pcs.iter().copied().filter(|pc| !insns.contains_key(pc)).collect();
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

/// qemu's log of the program: one pc per executed instruction.
fn qemu_pcs(arch: &str, bin: &Path) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("qemu.log");
    let o = run(Command::new("env")
        .arg("-i")
        .arg(qemu_for(arch))
        .args(["-singlestep", "-d", "nochain,exec", "-D"])
        .arg(&log)
        .arg(bin));
    o.assert_success();
    let pcs = parse_qemu_log(std::io::BufReader::new(std::fs::File::open(&log).unwrap()));
    assert!(!pcs.is_empty(), "qemu logged nothing for {}", bin.display());
    pcs
}

/// One block of the oracle or of itrace's trace: the branch that ends it, where control went
/// (the address after a system call), instructions, and kind.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Block {
    from: u64,
    to: u64,
    count: u64,
    kind: &'static str,
}

/// Blocks of an executed pc sequence (a rep string instruction logged once per iteration counts once).
fn oracle_blocks(arch: &str, pcs: &[u64], insns: &BTreeMap<u64, CrossInsn>) -> (Vec<Block>, u64) {
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
            out.push(Block { from: pc, to: next, count, kind });
            count = 0;
        }
        i = j;
    }
    (out, total)
}

/// itrace's blocks from `itrace dump` (raw records): user records, with a system call's
/// destination taken from the kernel record that follows it.
fn itrace_blocks(trace: &Path) -> (Vec<Block>, u64) {
    let o = itrace(["dump".as_ref(), trace.as_os_str()]);
    o.assert_success();
    let mut out: Vec<Block> = Vec::new();
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
        out.push(Block { from, to, count: n, kind });
    }
    (out, total)
}

fn compare_blocks(what: &str, got: &[Block], want: &[Block]) {
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
fn oracle_function_counts(arch: &str, bin: &Path, pcs: &[u64], names: &[&str]) -> HashMap<String, u64> {
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

fn record_qemu(arch: &str, bin: &Path, dir: &Path) -> PathBuf {
    let trace = dir.join("t.itr");
    let o = itrace(["record", "--qemu", arch, "-o"].iter().map(|s| s.as_ref()).chain([
        trace.as_os_str(),
        "--".as_ref(),
        bin.as_os_str(),
    ]));
    o.assert_success();
    trace
}

/// `itrace record --backend qemu` (the TCG plugin), in an empty environment like the oracle's.
fn record_plugin(arch: &str, bin: &Path, dir: &Path) -> PathBuf {
    let trace = dir.join("plugin.itr");
    let o = run(Command::new(itrace_bin())
        .env_clear()
        .args(["record", "--backend", "qemu", "--arch", arch, "-o"])
        .arg(&trace)
        .arg("--")
        .arg(bin));
    o.assert_success();
    trace
}

type Recorder = fn(&str, &Path, &Path) -> PathBuf;

fn check_asm(arch: &str) {
    check_asm_with(arch, record_qemu, "")
}

fn check_asm_with(arch: &str, recorder: Recorder, tag: &str) {
    let bin = cross_program(&format!("{arch}-asm"));
    let dir = test_dir(&format!("cross-asm-{arch}{tag}"));
    let insns = cross_objdump(arch, &bin);
    let pcs = qemu_pcs(arch, &bin);
    let (want, want_total) = oracle_blocks(arch, &pcs, &insns);
    let (hand_total, hand_blocks) = hand_count(arch);
    assert_eq!((want_total, want.len()), (hand_total, hand_blocks), "{arch}: qemu's log against the hand count");
    let trace = recorder(arch, &bin, &dir);
    let (got, total) = itrace_blocks(&trace);
    assert_eq!(total, hand_total, "{arch}: itrace's instruction count against the hand count");
    compare_blocks(arch, &got, &want);
    // The write system call is named after the traced architecture's numbers.
    let arc = arc_text(&trace);
    assert!(arc.contains("sys_write:[kernel]"), "{arch}: no sys_write line in\n{arc}");
}

fn check_libc(arch: &str) {
    check_libc_with(arch, record_qemu, "")
}

fn check_libc_with(arch: &str, recorder: Recorder, tag: &str) {
    let bin = cross_program(&format!("{arch}-libc"));
    let dir = test_dir(&format!("cross-libc-{arch}{tag}"));
    let mut insns = cross_objdump(arch, &bin);
    let pcs = qemu_pcs(arch, &bin);
    add_missing(arch, &bin, &pcs, &mut insns);
    let (want, want_total) = oracle_blocks(arch, &pcs, &insns);
    let trace = recorder(arch, &bin, &dir);
    let (got, total) = itrace_blocks(&trace);
    compare_blocks(arch, &got, &want);
    assert_eq!(total, want_total, "{arch}: instructions, itrace against qemu's log");
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    let want = oracle_function_counts(arch, &bin, &pcs, &names);
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(want_total), "{arch}: report total");
    let got = report_self_counts(&report, &bin);
    for n in names {
        assert!(want.get(n).is_some_and(|&c| c > 0), "{arch}: qemu never ran {n}");
        assert_eq!(got.get(n), want.get(n), "{arch}: self instructions of {n}");
    }
    if arch.starts_with("ppc") {
        // malloc's locks: the trace went through (and past) load-reserve/store-conditional sequences.
        let lwarx = pcs.iter().filter(|pc| insns.get(pc).is_some_and(|i| i.mnemonic.ends_with("arx"))).count();
        assert!(lwarx > 0, "{arch}: the program ran no lwarx/ldarx (nothing tested)");
    }
}

/// A dynamically linked program: the libraries the loader maps are learnt from its open and
/// mmap calls (the stub cannot list mappings), so libc's functions resolve, and the count is
/// qemu's with the same cross sysroot.
fn check_dynamic(arch: &str) {
    let bin = cross_program(&format!("{arch}-dynamic"));
    let dir = test_dir(&format!("cross-dynamic-{arch}"));
    let (_, prefix, _) = ARCHES.iter().find(|a| a.0 == arch).unwrap();
    let sysroot = format!("/usr/{}", prefix.trim_end_matches('-'));
    let log = dir.join("qemu.log");
    let o = run(Command::new("env")
        .arg("-i")
        .arg(qemu_for(arch))
        .args(["-L", &sysroot, "-singlestep", "-d", "nochain,exec", "-D"])
        .arg(&log)
        .arg(&bin));
    o.assert_success();
    let mut pcs = parse_qemu_log(std::io::BufReader::new(std::fs::File::open(&log).unwrap()));
    pcs.dedup(); // rep string iterations count once
    let trace = record_qemu(arch, &bin, &dir);
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(pcs.len() as u64), "{arch}: instructions");
    let libc = format!("{sysroot}/lib/libc.so.6");
    let functions = report["functions"].as_array().unwrap();
    let malloc = functions.iter().find(|f| f["name"] == "malloc" && f["module"] == libc.as_str());
    assert!(malloc.is_some(), "{arch}: malloc not resolved in {libc}:\n{report:#}");
    let unknown: Vec<&serde_json::Value> =
        functions.iter().filter(|f| f["module"].as_str().unwrap_or("").starts_with("0x")).collect();
    assert!(unknown.is_empty(), "{arch}: blocks outside any known module: {unknown:?}");
}

#[test]
fn dynamic_program_ppc64le() {
    check_dynamic("ppc64le");
}

#[test]
fn dynamic_program_s390x() {
    check_dynamic("s390x");
}

#[test]
fn dynamic_program_i386() {
    check_dynamic("i386");
}

/// A handler run by three raise(SIGUSR1) calls: the signals pass through the stub to the
/// program, and the trace counts what qemu's log executed, the handler's instructions included
/// (qemu's own sigreturn trampoline on PowerPC too).
fn check_signals(arch: &str) {
    let bin = cross_program(&format!("{arch}-signal"));
    let dir = test_dir(&format!("cross-signal-{arch}"));
    let pcs = qemu_pcs(arch, &bin);
    let mut executed = pcs.clone();
    executed.dedup(); // a rep string instruction is logged once per iteration and counts once
    let trace = record_qemu(arch, &bin, &dir);
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(executed.len() as u64), "{arch}: instructions");
    let names = ["main", "on_usr1"];
    let want = oracle_function_counts(arch, &bin, &pcs, &names);
    let got = report_self_counts(&report, &bin);
    for n in names {
        assert!(want.get(n).is_some_and(|&c| c > 0), "{arch}: qemu never ran {n}");
        assert_eq!(got.get(n), want.get(n), "{arch}: self instructions of {n}");
    }
    // Three deliveries of SIGUSR1 (10, by Linux's numbers), each to the handler's first
    // instruction (the code symbol, `.on_usr1` on ELFv1).
    let o = run(Command::new(cross_tool(arch, "nm")).args(["--defined-only", "--synthetic"]).arg(&bin));
    let handler = o
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().collect::<Vec<_>>().try_into().ok())
        .find(|[_, kind, name]: &[&str; 3]| matches!(*kind, "t" | "T") && name.trim_start_matches('.') == "on_usr1")
        .map(|[addr, _, _]| u64::from_str_radix(addr, 16).unwrap())
        .expect("on_usr1 in nm");
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    let deliveries: Vec<&str> = dump.stdout.lines().filter(|l| l.contains(" K Iret flags=2 ")).collect();
    assert_eq!(deliveries.len(), 3, "{arch}: signal deliveries in\n{}", deliveries.join("\n"));
    for d in &deliveries {
        assert!(d.contains(" aux=10 "), "{arch}: not SIGUSR1: {d}");
        assert!(d.contains(&format!("-> {handler:#x} ")), "{arch}: not to on_usr1 ({handler:#x}): {d}");
    }
}

#[test]
fn signals_through_the_stub_s390x() {
    check_signals("s390x");
}

#[test]
fn signals_through_the_stub_ppc64le() {
    check_signals("ppc64le");
}

#[test]
fn signals_through_the_stub_ppc64_big_endian() {
    check_signals("ppc64");
}

#[test]
fn signals_through_the_stub_i386() {
    check_signals("i386");
}

#[test]
fn ppc64le_asm() {
    check_asm("ppc64le");
}

#[test]
fn ppc64_big_endian_asm() {
    check_asm("ppc64");
}

#[test]
fn s390x_asm() {
    check_asm("s390x");
}

#[test]
fn i386_asm_through_qemu() {
    check_asm("i386");
}

#[test]
fn ppc64le_libc_with_lwarx() {
    check_libc("ppc64le");
}

#[test]
fn ppc64_big_endian_libc_with_lwarx() {
    check_libc("ppc64");
}

#[test]
fn s390x_libc() {
    check_libc("s390x");
}

#[test]
fn i386_libc_through_qemu() {
    check_libc("i386");
}

// The same programs through the qemu TCG plugin (`--backend qemu`): block for block as qemu's
// single-step log, like the GDB-stub stepper above.

#[test]
fn plugin_ppc64le() {
    check_asm_with("ppc64le", record_plugin, "-plugin");
    check_libc_with("ppc64le", record_plugin, "-plugin");
}

#[test]
fn plugin_ppc64_big_endian() {
    check_asm_with("ppc64", record_plugin, "-plugin");
    check_libc_with("ppc64", record_plugin, "-plugin");
}

#[test]
fn plugin_s390x() {
    check_asm_with("s390x", record_plugin, "-plugin");
    check_libc_with("s390x", record_plugin, "-plugin");
}

#[test]
fn plugin_i386() {
    check_asm_with("i386", record_plugin, "-plugin");
    check_libc_with("i386", record_plugin, "-plugin");
}

/// 32-bit x86 natively with ptrace: the asm program exactly as qemu runs it; the glibc program's
/// own functions (glibc's start-up differs natively: vDSO, CPU features).
#[test]
fn i386_native_ptrace() {
    let arch = "i386";
    let bin = cross_program("i386-asm");
    let dir = test_dir("cross-i386-native");
    let insns = cross_objdump(arch, &bin);
    let (want, _) = oracle_blocks(arch, &qemu_pcs(arch, &bin), &insns);
    let trace = dir.join("asm.itr");
    record(&trace, &[], &bin, &[]).assert_success();
    let (got, total) = itrace_blocks(&trace);
    assert_eq!(total, hand_count(arch).0, "i386 native: hand count");
    compare_blocks("i386 native asm", &got, &want);
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    assert!(dump.stdout.lines().next().unwrap_or("").contains("arch=i386"), "trace header: {}", dump.stdout);
    assert!(arc_text(&trace).contains("sys_write:[kernel]"));

    let bin = cross_program("i386-libc");
    let pcs = qemu_pcs(arch, &bin);
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    let want = oracle_function_counts(arch, &bin, &pcs, &names);
    let trace = dir.join("libc.itr");
    record(&trace, &[], &bin, &[]).assert_success();
    let got = report_self_counts(&report_json(&trace), &bin);
    for n in names {
        assert_eq!(got.get(n), want.get(n), "i386 native: self instructions of {n}");
    }
}

#[test]
fn unknown_architecture_is_one_line() {
    let o = itrace(["record", "--qemu", "sparc", "--", "/bin/true"]);
    assert!(!o.success());
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stderr.starts_with("itrace: unknown architecture 'sparc' for --qemu"), "{}", o.stderr);
}

#[test]
fn nothing_listening_is_one_line() {
    let bin = cross_program("ppc64le-asm");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = test_dir("cross-nothing-listening");
    let trace = dir.join("t.itr");
    let o = itrace(
        ["record", "--gdb", &format!("127.0.0.1:{port}"), "-o", trace.to_str().unwrap(), "--gdb-program"]
            .iter()
            .map(|s| s.as_ref())
            .chain([bin.as_os_str()]),
    );
    assert!(!o.success());
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(
        o.stderr.starts_with(&format!("itrace: cannot connect to the GDB stub at 127.0.0.1:{port}")),
        "{}",
        o.stderr
    );
}

/// qemu killed mid-trace: one error line, non-zero exit, and a readable partial trace.
#[test]
fn stub_killed_mid_trace_leaves_a_valid_trace() {
    let arch = "ppc64le";
    let bin = cross_program("ppc64le-libc");
    let dir = test_dir("cross-stub-killed");
    let trace = dir.join("t.itr");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let qemu = Command::new(qemu_for(arch))
        .env_clear()
        .args(["-g", &port.to_string()])
        .arg(&bin)
        .stdout(Stdio::null())
        .spawn()
        .expect("start qemu");
    let mut qemu = KillOnDrop(qemu);
    // qemu's stub takes one connection: wait until it listens without connecting to it.
    wait_until("qemu's stub listens", || listening(port));
    let mut rec = Command::new(itrace_bin());
    rec.args(["record", "--segment-size", "4K", "--gdb", &format!("127.0.0.1:{port}"), "-o"])
        .arg(&trace)
        .arg("--gdb-program")
        .arg(&bin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = rec.spawn().expect("start itrace");
    // Wait until some chunks are in the file, then kill the stub.
    wait_until("the trace has records", || std::fs::metadata(&trace).map(|m| m.len() > 8192).unwrap_or(false));
    qemu.0.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "itrace succeeded after its stub died: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("itrace: the GDB stub closed the connection"), "{stderr}");
    let report = report_json(&trace);
    assert!(report["total_instructions"].as_u64().unwrap() > 100, "partial trace: {report}");
}

/// Ctrl-C to `itrace record --gdb` in the middle of a long trace: itrace takes its breakpoints
/// out, detaches, and exits with a valid trace; the program runs on untouched to its normal end.
#[test]
fn ctrl_c_detaches_from_the_stub() {
    let bin = program("long_loop");
    let dir = test_dir("cross-ctrl-c");
    let trace = dir.join("t.itr");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let qemu = Command::new(qemu_for("x86_64"))
        .env_clear()
        .args(["-g", &port.to_string()])
        .arg(&bin)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start qemu");
    let mut qemu = KillOnDrop(qemu);
    wait_until("qemu's stub listens", || listening(port));
    let child = Command::new(itrace_bin())
        .args(["record", "--segment-size", "4K", "--gdb", &format!("127.0.0.1:{port}"), "-o"])
        .arg(&trace)
        .arg("--gdb-program")
        .arg(&bin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start itrace");
    wait_until("the trace has records", || std::fs::metadata(&trace).map(|m| m.len() > 16384).unwrap_or(false));
    // SAFETY: kill(2) on the pid of a child we started and have not waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "itrace after ^C: {stderr}");
    assert!(stderr.contains("tracing ended: detached"), "{stderr}");
    // The program finishes on its own, with its normal output and status.
    let status = wait_with_guard(&mut qemu.0, "qemu after the detach");
    assert!(status.success(), "long_loop after the detach: {status:?}");
    let mut output = String::new();
    std::io::Read::read_to_string(qemu.0.stdout.as_mut().unwrap(), &mut output).unwrap();
    assert_eq!(output, "long_loop: done\n");
    let report = report_json(&trace);
    let traced = report["total_instructions"].as_u64().unwrap();
    assert!(traced > 100 && traced < LONG_LOOP_INSTRUCTIONS, "traced {traced} of {LONG_LOOP_INSTRUCTIONS}");
}
