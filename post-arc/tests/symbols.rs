//! Tests of the symbolization layer against binutils (readelf, nm, addr2line,
//! objdump) run on programs compiled at test time.
//!
//! Tests that need a compiler, binutils or the cross tools fail with the
//! tool's name when it is missing (scripts/install-test-deps.sh installs them).
//!
//! Why over 1,000 lines: one test file per layer keeps its test programs built once; each
//! test is short and stands alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use itrace_post::symbols::{JitSymbols, ModuleSymbols, SymbolCache, SymbolError};

// ---------------------------------------------------------------- helpers

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

macro_rules! require {
    ($($tool:expr),+) => {
        $(
            // scripts/install-test-deps.sh installs every tool these tests use: a missing one is a
            // broken setup, not a reason to pass quietly.
            assert!(have($tool), "{} is not installed: run scripts/install-test-deps.sh", $tool);
        )+
    };
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compile `src` (written to `dir/name.ext`) to `dir/name` with `compiler` and `args`.
fn compile(compiler: &str, dir: &Path, name: &str, ext: &str, src: &str, args: &[&str]) -> PathBuf {
    let src_path = dir.join(format!("{name}.{ext}"));
    fs::write(&src_path, src).unwrap();
    let out = dir.join(name);
    let mut all: Vec<&str> = args.to_vec();
    all.extend([src_path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    run(compiler, &all);
    out
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("bad hex {s:?}"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[derive(Debug, Clone)]
struct Section {
    name: String,
    exec: bool,
}

/// `readelf -SW`, by section index.
fn readelf_sections(readelf: &str, path: &Path) -> BTreeMap<usize, Section> {
    let mut map = BTreeMap::new();
    for line in run(readelf, &["-SW", s(path)]).lines() {
        let Some(rest) = line.trim_start().strip_prefix('[') else { continue };
        let Some((idx, rest)) = rest.split_once(']') else { continue };
        let Ok(idx) = idx.trim().parse::<usize>() else { continue };
        let t: Vec<&str> = rest.split_whitespace().collect();
        if t.len() < 9 {
            continue; // [0], which has no name
        }
        let flags = if t.len() >= 10 { t[6] } else { "" };
        map.insert(idx, Section { name: t[0].to_string(), exec: flags.contains('X') });
    }
    map
}

#[derive(Debug, Clone)]
struct ElfSym {
    addr: u64,
    size: u64,
    bind: String,
    name: String,
}

/// Function-ish symbols of one table (".symtab" or ".dynsym") as `readelf -sW`
/// shows them: FUNC/IFUNC, or untyped globals in executable sections.
fn readelf_funcs(readelf: &str, path: &Path, table: &str) -> Vec<ElfSym> {
    let sections = readelf_sections(readelf, path);
    let mut out = Vec::new();
    let mut in_table = false;
    for line in run(readelf, &["-sW", s(path)]).lines() {
        if line.starts_with("Symbol table") {
            in_table = line.contains(&format!("'{table}'"));
            continue;
        }
        if !in_table {
            continue;
        }
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 8 || !t[0].ends_with(':') {
            continue;
        }
        let (ty, bind, ndx, name) = (t[3], t[4], t[6], t[7]);
        let Ok(ndx) = ndx.parse::<usize>() else { continue }; // UND, ABS, COM
        if ndx == 0 {
            continue;
        }
        let exec = sections.get(&ndx).is_some_and(|s| s.exec);
        let wanted = matches!(ty, "FUNC" | "IFUNC") || (ty == "NOTYPE" && exec && matches!(bind, "GLOBAL" | "WEAK"));
        if !wanted {
            continue;
        }
        let size = if let Some(h) = t[2].strip_prefix("0x") { hex(h) } else { t[2].parse().unwrap() };
        // readelf appends symbol versions to .dynsym names ("time@@LINUX_2.6").
        let name = if table == ".dynsym" { name.split('@').next().unwrap() } else { name };
        out.push(ElfSym { addr: hex(t[1]), size, bind: bind.to_string(), name: name.to_string() });
    }
    out
}

/// Mangled name -> demangled name as `nm -C` prints it (`-D` for .dynsym).
fn nm_demangled(nm: &str, path: &Path, dynamic: bool) -> HashMap<String, String> {
    let mut args = vec!["-p", "--defined-only"];
    if dynamic {
        args.push("-D");
    }
    args.push(s(path));
    let plain = run(nm, &args);
    args.insert(0, "-C");
    let demangled = run(nm, &args);
    // nm -D appends symbol versions, which are not part of .dynsym names.
    let name = |l: &str| {
        let n = l.splitn(3, ' ').nth(2)?;
        let n = if dynamic { n.split('@').next()? } else { n };
        Some(n.to_string())
    };
    plain.lines().zip(demangled.lines()).filter_map(|(a, b)| Some((name(a)?, name(b)?))).collect()
}

/// Check `lookup` at the start and last byte of every function symbol that
/// readelf lists in `table`, with names as `nm -C` prints them. At shared
/// addresses the name must be a global one if there is one (else weak).
/// Returns the number of addresses checked.
fn check_lookups(m: &ModuleSymbols, path: &Path, tools: &Tools, table: &str) -> usize {
    check_lookups_with(m, path, tools, table, false)
}

/// Where cpp_demangle and libiberty (nm -C) are known to differ, on C++
/// standard library instantiations only: cpp_demangle gives up on some
/// expression manglings (`enable_if<is_same<...>::value>`; the raw name is
/// then shown), and writes functions returning a reference to an array as
/// `char const (&) [2] f()` where c++filt writes `char const (&f()) [2]`.
fn known_cpp_demangle_divergence(got: &str, expected: &HashSet<&str>, mangled: &[&str]) -> bool {
    expected.iter().all(|e| e.contains("std::"))
        && (mangled.contains(&got) || got.contains("(&) [") || got.contains("(&&) ["))
}

fn check_lookups_with(m: &ModuleSymbols, path: &Path, tools: &Tools, table: &str, lenient: bool) -> usize {
    let funcs = readelf_funcs(&tools.readelf, path, table);
    let names = nm_demangled(&tools.nm, path, table == ".dynsym");
    let mut by_addr: BTreeMap<u64, Vec<&ElfSym>> = BTreeMap::new();
    for f in &funcs {
        by_addr.entry(f.addr).or_default().push(f);
    }
    let starts: Vec<u64> = by_addr.keys().copied().collect();
    let mut failures = Vec::new();
    let mut tolerated = Vec::new();
    for (i, (&addr, syms)) in by_addr.iter().enumerate() {
        let best_bind =
            ["GLOBAL", "WEAK", "LOCAL"].into_iter().find(|b| syms.iter().any(|s| s.bind == *b)).unwrap_or("LOCAL");
        let best: Vec<&&ElfSym> = syms.iter().filter(|s| s.bind == best_bind).collect();
        // Names as nm prints them, less the symbol version itrace leaves out (`@@GLIBC_2.34`).
        let expected: HashSet<&str> = best
            .iter()
            .map(|s| names.get(&s.name).map_or(s.name.as_str(), String::as_str))
            .map(|n| n.split_once('@').filter(|(base, _)| !base.is_empty()).map_or(n, |(base, _)| base))
            .collect();
        let mangled: Vec<&str> = best.iter().map(|s| s.name.as_str()).collect();
        // A legacy Rust name with an LLVM clone suffix (`_ZN…17h<hash>E.specialized.1`): nm -C
        // drops the suffix, rustc-demangle (and so itrace) keeps it, which tells the clone
        // from the function it was made from.
        let clone_of = |got: &str| {
            mangled.iter().any(|m| {
                let suffix = m.strip_prefix("_ZN").and_then(|r| r.find("E.").map(|i| &r[i + 1..]));
                suffix.is_some_and(|sfx| got.strip_suffix(sfx).is_some_and(|base| expected.contains(base)))
            })
        };
        let mut name_ok = |got: &str| {
            if expected.contains(got) || clone_of(got) {
                true
            } else if lenient && known_cpp_demangle_divergence(got, &expected, &mangled) {
                tolerated.push(format!("{got}\n  nm -C: {expected:?}"));
                true
            } else {
                false
            }
        };
        match m.lookup(addr) {
            Some(hit) if name_ok(hit.name) && hit.offset == 0 && hit.start == addr => {}
            other => failures.push(format!("{addr:#x}: got {other:?}, expected one of {expected:?}")),
        }
        // The last byte, unless another function starts inside the range.
        let size = syms.iter().map(|s| s.size).max().unwrap_or(0);
        let nested = starts.get(i + 1).is_some_and(|&n| n < addr + size);
        if size > 1 && !nested {
            let last = addr + size - 1;
            match m.lookup(last) {
                Some(hit) if name_ok(hit.name) && hit.offset == size - 1 && hit.start == addr => {}
                other => failures.push(format!("{last:#x} (end): got {other:?}, expected {expected:?}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} addresses of {} mismatch, first ones:\n{}",
        failures.len(),
        by_addr.len(),
        path.display(),
        failures[..failures.len().min(20)].join("\n")
    );
    assert!(!by_addr.is_empty(), "no function symbols in {}", path.display());
    if !tolerated.is_empty() {
        eprintln!("known cpp_demangle divergences tolerated:\n{}", tolerated.join("\n"));
        assert!(
            tolerated.len() * 20 <= by_addr.len() * 2,
            "too many demangling divergences: {} for {} addresses",
            tolerated.len(),
            by_addr.len()
        );
    }
    by_addr.len()
}

/// Line numbers `addr2line -e` gives for `addrs` (`None` for `??`/`0`).
fn addr2line_lines(addr2line: &str, path: &Path, addrs: &[u64]) -> Vec<Option<u32>> {
    let mut out = Vec::new();
    for chunk in addrs.chunks(2000) {
        let mut args = vec!["-e".to_string(), s(path).to_string()];
        args.extend(chunk.iter().map(|a| format!("{a:#x}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        for line in run(addr2line, &args).lines() {
            // "file:LINE", "file:LINE (discriminator N)", "??:0", "file:?"
            let loc = line.split(" (").next().unwrap();
            let num = loc.rsplit(':').next().unwrap();
            out.push(num.parse::<u32>().ok().filter(|&n| n != 0));
        }
    }
    assert_eq!(out.len(), addrs.len());
    out
}

fn check_lines(m: &ModuleSymbols, truth_file: &Path, tools: &Tools, addrs: &[u64]) {
    let expected = addr2line_lines(&tools.addr2line, truth_file, addrs);
    let mut failures = Vec::new();
    let mut known = 0;
    for (&a, &e) in addrs.iter().zip(&expected) {
        let got = m.line(a);
        if got != e {
            failures.push(format!("{a:#x}: got {got:?}, addr2line says {e:?}"));
        }
        known += usize::from(e.is_some());
    }
    assert!(
        failures.is_empty(),
        "{} of {} lines mismatch:\n{}",
        failures.len(),
        addrs.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    assert!(known > 0, "addr2line knows no line of the addresses checked");
}

/// Instruction addresses per function, from `objdump -d`, optionally limited to sections.
fn objdump_insns(objdump: &str, path: &Path, sections: &[&str]) -> BTreeMap<String, Vec<u64>> {
    let mut args = vec!["-d", "--no-show-raw-insn"];
    for sec in sections {
        args.extend(["-j", sec]);
    }
    args.push(s(path));
    let mut map: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut current = String::new();
    for line in run(objdump, &args).lines() {
        if let Some((addr, rest)) = line.split_once(" <") {
            if rest.ends_with(">:") && u64::from_str_radix(addr, 16).is_ok() {
                current = rest.trim_end_matches(">:").to_string();
                continue;
            }
        }
        // "    1139:\tpush %rbp" (or unpadded "100000b8:\t..." for 32-bit)
        if let Some((addr, insn)) = line.trim_start().split_once(':') {
            if insn.starts_with('\t') && !insn.trim().is_empty() {
                if let Ok(a) = u64::from_str_radix(addr, 16) {
                    map.entry(current.clone()).or_default().push(a);
                }
            }
        }
    }
    map
}

/// PT_LOAD entries from `readelf -lW`: (offset, vaddr, filesz, executable).
fn readelf_loads(readelf: &str, path: &Path) -> Vec<(u64, u64, u64, bool)> {
    run(readelf, &["-lW", s(path)])
        .lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            if t.first() != Some(&"LOAD") || t.len() < 8 {
                return None;
            }
            let flags = t[6..t.len() - 1].concat();
            Some((hex(t[1]), hex(t[2]), hex(t[4]), flags.contains('E')))
        })
        .collect()
}

/// Pretend the image is mapped at `base` the way ld.so maps it, and check
/// that `file_vaddr` maps each function's runtime address back to it.
fn check_file_vaddr(m: &ModuleSymbols, path: &Path, tools: &Tools, base: u64) {
    let loads = readelf_loads(&tools.readelf, path);
    let funcs = readelf_funcs(&tools.readelf, path, ".symtab");
    let mut checked = 0;
    for &(offset, vaddr, filesz, exec) in &loads {
        if !exec {
            continue;
        }
        let map_start = base + (vaddr & !0xfff);
        let map_off = offset & !0xfff;
        for f in funcs.iter().filter(|f| f.addr >= vaddr && f.addr < vaddr + filesz) {
            let runtime = map_start + (f.addr - (vaddr & !0xfff));
            assert_eq!(m.file_vaddr(map_start, map_off, runtime), Some(f.addr), "{} at runtime {runtime:#x}", f.name);
            checked += 1;
        }
        assert_eq!(m.file_vaddr(map_start, map_off, map_start.wrapping_sub(1)), None);
    }
    assert!(checked > 0);
}

struct Tools {
    readelf: String,
    nm: String,
    addr2line: String,
    objdump: String,
}

impl Tools {
    fn native() -> Self {
        Self::prefixed("")
    }
    fn prefixed(p: &str) -> Self {
        Tools {
            readelf: format!("{p}readelf"),
            nm: format!("{p}nm"),
            addr2line: format!("{p}addr2line"),
            objdump: format!("{p}objdump"),
        }
    }
}

const C_PROG: &str = r#"#include <stdio.h>
#include <stdlib.h>

static int helper(int x)
{
    int y = x * 3;
    if (y > 10)
        y -= 4;
    return y;
}

int compute(int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s += helper(i);
    return s;
}

__attribute__((noinline)) int twice(int v)
{
    return v * 2;
}

int main(int argc, char **argv)
{
    printf("%d\n", compute(argc + 5));
    puts("done");
    return twice(atoi(argc > 1 ? argv[1] : "0"));
}
"#;

const OWN_FUNCS: [&str; 4] = ["helper", "compute", "twice", "main"];

fn own_insns(tools: &Tools, path: &Path) -> Vec<u64> {
    let insns = objdump_insns(&tools.objdump, path, &[".text"]);
    let addrs: Vec<u64> = OWN_FUNCS.iter().flat_map(|f| insns.get(*f).cloned().unwrap_or_default()).collect();
    assert!(addrs.len() > 20, "objdump found too few instructions: {}", addrs.len());
    addrs
}

/// Check every instruction of the PLT sections objdump disassembles has objdump's name for
/// its stub (`printf@plt`, binutils' synthetic symbols), or `<plt>` in the header (`.plt`).
fn check_plt(m: &ModuleSymbols, path: &Path, tools: &Tools) -> usize {
    let secs = readelf_sections(&tools.readelf, path);
    let plts: Vec<&str> = secs
        .values()
        .filter(|s| matches!(s.name.as_str(), ".plt" | ".plt.sec" | ".plt.got") && s.exec)
        .map(|s| s.name.as_str())
        .collect();
    let mut n = 0;
    for sec in plts {
        for (label, addrs) in objdump_insns(&tools.objdump, path, &[sec]) {
            let want = if label.ends_with("@plt") { label.as_str() } else { "<plt>" };
            for a in addrs {
                let hit = m.lookup(a).unwrap_or_else(|| panic!("{sec} {a:#x}: no symbol"));
                assert_eq!(hit.name, want, "{sec} {a:#x}");
                assert!(hit.plt.is_some(), "{sec} {a:#x}");
                n += 1;
            }
        }
    }
    n
}

fn c_program(dir: &Path, name: &str, args: &[&str]) -> (PathBuf, ModuleSymbols) {
    let path = compile("gcc", dir, name, "c", C_PROG, args);
    let m = ModuleSymbols::from_path(&path).unwrap();
    (path, m)
}

// ---------------------------------------------------------------- ELF files

#[test]
fn pie_program_symbols_lines_plt_and_mapping() {
    require!("gcc", "readelf", "nm", "addr2line", "objdump");
    let tools = Tools::native();
    let dir = tempfile::tempdir().unwrap();
    let (path, m) = c_program(dir.path(), "pie", &["-g", "-O0", "-fPIE", "-pie"]);
    assert!(!m.is_32bit());
    assert!(!m.is_big_endian());
    assert_eq!(m.machine(), 62); // EM_X86_64
    check_lookups(&m, &path, &tools, ".symtab");
    check_lines(&m, &path, &tools, &own_insns(&tools, &path));
    assert!(check_plt(&m, &path, &tools) > 0, "no PLT instructions found");
    check_file_vaddr(&m, &path, &tools, 0x5555_5555_4000);
    check_file_vaddr(&m, &path, &tools, 0x7f00_dead_0000);
}

#[test]
fn non_pie_program() {
    require!("gcc", "readelf", "nm", "addr2line", "objdump");
    let tools = Tools::native();
    let dir = tempfile::tempdir().unwrap();
    let (path, m) = c_program(dir.path(), "nopie", &["-g", "-O2", "-fno-inline", "-no-pie"]);
    check_lookups(&m, &path, &tools, ".symtab");
    check_lines(&m, &path, &tools, &own_insns(&tools, &path));
    assert!(check_plt(&m, &path, &tools) > 0);
    // Non-PIE: mapped at its link address.
    check_file_vaddr(&m, &path, &tools, 0);
}

#[test]
fn ibt_plt_sec_and_plt_got() {
    require!("gcc", "readelf", "objdump");
    let tools = Tools::native();
    let dir = tempfile::tempdir().unwrap();
    let args = ["-g", "-fcf-protection=full", "-Wl,-z,ibtplt"];
    let (path, m) = c_program(dir.path(), "ibt", &args);
    let secs: Vec<String> = readelf_sections(&tools.readelf, &path).into_values().map(|s| s.name).collect();
    assert!(secs.iter().any(|s| s == ".plt.sec"), "the linker made no .plt.sec with -z ibtplt");
    assert!(check_plt(&m, &path, &tools) > 0);
}

#[test]
fn static_program() {
    require!("gcc", "readelf", "nm", "addr2line", "objdump");
    let tools = Tools::native();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("probe.c");
    fs::write(&src, "int main(void){return 0;}").unwrap();
    let probe = Command::new("gcc").args(["-static", s(&src), "-o", s(&dir.path().join("probe"))]).output().unwrap();
    assert!(probe.status.success(), "no static libc: install libc6-dev");
    let (path, m) = c_program(dir.path(), "static", &["-g", "-O0", "-static"]);
    // Thousands of glibc functions, many aliases and IFUNCs.
    let n = check_lookups(&m, &path, &tools, ".symtab");
    assert!(n > 500, "only {n} functions");
    check_lines(&m, &path, &tools, &own_insns(&tools, &path));
    check_plt(&m, &path, &tools); // static binaries have an IRELATIVE .plt
    check_file_vaddr(&m, &path, &tools, 0);
}

const CPP_PROG: &str = r#"#include <cstdio>
#include <string>
#include <vector>
#include <map>

namespace geo {
struct Point {
    int x, y;
    int sum() const;
    Point operator+(const Point &o) const { return {x + o.x, y + o.y}; }
};
int Point::sum() const { return x + y; }

template <typename T> T twice(T v) { return v + v; }

struct Box {
    long v;
    template <typename T, typename U> Box(T a, const U &b) : v(long(a) + long(b)) {}
    ~Box() { v = 0; }
};

template <typename T> int local_user(T t)
{
    struct Local {
        int k;
        explicit Local(int n) : k(n) {}
        int get() const { return k * 2; }
    };
    return Local(int(t)).get();
}
} // namespace geo

namespace {
int hidden(int a) { return a * 7; }
}

int over(int a) { return a + 1; }
double over(double a) { return a * 2; }

int main(int argc, char **)
{
    geo::Point p{1, 2}, q{3, 4};
    std::vector<int> v{1, 2, 3};
    std::map<std::string, int> m{{"a", 1}};
    auto f = [&](int k) { return k + argc; };
    geo::Box b(argc, 2.5);
    printf("%d %d %f %d %d %zu %zu %d %ld %d\n", (p + q).sum(), geo::twice(3), over(2.0),
           over(1), hidden(argc), v.size(), m.size(), f(2), b.v, geo::local_user(argc));
    return geo::twice(1.5) > 2 ? 0 : 1;
}
"#;

#[test]
fn cpp_demangling_matches_nm() {
    require!("g++", "readelf", "nm", "addr2line", "objdump");
    let tools = Tools::native();
    let dir = tempfile::tempdir().unwrap();
    let path = compile("g++", dir.path(), "cpp", "cc", CPP_PROG, &["-g", "-O0"]);
    let m = ModuleSymbols::from_path(&path).unwrap();
    // Every function against nm -C, tolerating only the documented
    // cpp_demangle differences on std:: instantiations.
    check_lookups_with(&m, &path, &tools, ".symtab", true);

    // The program's own functions must match nm -C exactly, whatever the
    // standard library's instantiations do.
    let names = nm_demangled(&tools.nm, &path, false);
    let funcs = readelf_funcs(&tools.readelf, &path, ".symtab");
    for want in [
        "geo::Point::sum() const",
        "geo::Point::operator+(geo::Point const&) const",
        "int geo::twice<int>(int)",
        "double geo::twice<double>(double)",
        "geo::Box::Box<int, double>(int, double const&)",
        "geo::Box::~Box()",
        "int geo::local_user<int>(int)",
        "geo::local_user<int>(int)::Local::get() const",
        "(anonymous namespace)::hidden(int)",
        "main::{lambda(int)#1}::operator()(int) const",
        "over(int)",
        "over(double)",
    ] {
        assert!(names.values().any(|n| n == want), "nm -C has no {want:?}");
        let f = funcs.iter().find(|f| names.get(&f.name).is_some_and(|n| n == want)).unwrap();
        assert_eq!(m.lookup(f.addr).unwrap().name, want);
    }
    let insns = objdump_insns(&tools.objdump, &path, &[".text"]);
    let all: Vec<u64> = insns.values().flatten().copied().collect();
    check_lines(&m, &path, &tools, &all);
}

#[test]
fn freestanding_asm_untyped_globals_elf32_and_elf64() {
    require!("as", "ld", "readelf", "nm", "addr2line");
    let tools = Tools::native();
    let dir = tempfile::tempdir().unwrap();
    // _start and loop_top are untyped .globl labels; done is a typed function
    // with a size; skip is a local label that must not split _start.
    let asm = "\
        .text
        .globl _start
        .globl loop_top
_start:
        mov $5, %ecx
skip:
        nop
loop_top:
        dec %ecx
        jnz loop_top
        call done
        jmp _start
        .globl done
        .type done, @function
done:
        nop
        ret
        .size done, .-done
";
    for (bits, as_flag, ld_flag) in [(32, "--32", "elf_i386"), (64, "--64", "elf_x86_64")] {
        let src = dir.path().join(format!("a{bits}.s"));
        let obj = dir.path().join(format!("a{bits}.o"));
        let exe = dir.path().join(format!("a{bits}"));
        fs::write(&src, asm).unwrap();
        run("as", &[as_flag, "-g", s(&src), "-o", s(&obj)]);
        run("ld", &["-m", ld_flag, s(&obj), "-o", s(&exe)]);
        let m = ModuleSymbols::from_path(&exe).unwrap();
        assert_eq!(m.is_32bit(), bits == 32);
        assert_eq!(m.machine(), if bits == 32 { 3 } else { 62 });
        check_lookups(&m, &exe, &tools, ".symtab");
        let nm = run("nm", &[s(&exe)]);
        let addr_of = |n: &str| {
            nm.lines().find(|l| l.ends_with(&format!(" {n}"))).map(|l| hex(l.split(' ').next().unwrap())).unwrap()
        };
        let (start, skip, top, done) = (addr_of("_start"), addr_of("skip"), addr_of("loop_top"), addr_of("done"));
        let hit = m.lookup(skip).unwrap();
        assert_eq!((hit.name, hit.offset), ("_start", skip - start));
        let hit = m.lookup(top + 1).unwrap();
        assert_eq!((hit.name, hit.offset), ("loop_top", 1));
        assert_eq!(m.lookup(done + 1).unwrap().name, "done");
        assert_eq!(m.lookup(done + 2), None, "past the end of done (size 2)");
        check_lines(&m, &exe, &tools, &[start, skip, top, top + 1, done]);
    }
}

// ------------------------------------------------- separate debug information

/// Whether this objcopy can compress debug sections with `kind` (zstd needs binutils 2.40).
fn objcopy_compresses(kind: &str, sample: &Path) -> bool {
    let out = sample.with_extension(format!("probe-{kind}"));
    let ok = Command::new("objcopy")
        .args([&format!("--compress-debug-sections={kind}"), s(sample), s(&out)])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping {kind}: objcopy cannot compress with it");
    }
    ok
}

fn split_debug(path: &Path, debug_root: &Path, compress: Option<&str>) -> PathBuf {
    let id: String = run("readelf", &["-n", s(path)])
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .expect("no build-id");
    let dir = debug_root.join(".build-id").join(&id[..2]);
    fs::create_dir_all(&dir).unwrap();
    let dbg = dir.join(format!("{}.debug", &id[2..]));
    run("objcopy", &["--only-keep-debug", s(path), s(&dbg)]);
    if let Some(c) = compress {
        run("objcopy", &[&format!("--compress-debug-sections={c}"), s(&dbg)]);
    }
    dbg
}

#[test]
fn stripped_program_uses_build_id_debug_file() {
    require!("gcc", "objcopy", "strip", "readelf", "nm", "addr2line", "objdump");
    let tools = Tools::native();
    let dir = tempfile::tempdir().unwrap();
    let (full, _) = c_program(dir.path(), "full", &["-g", "-O0", "-Wl,--build-id"]);
    let addrs = own_insns(&tools, &full);
    for compress in [None, Some("zlib"), Some("zstd")] {
        if compress.is_some_and(|c| !objcopy_compresses(c, &full)) {
            continue;
        }
        let root = dir.path().join(format!("debug-{}", compress.unwrap_or("none")));
        let dbg = split_debug(&full, &root, compress);
        if compress.is_some() {
            let secs = run("readelf", &["-SW", s(&dbg)]);
            let line = secs.lines().find(|l| l.contains(".debug_line ")).unwrap();
            assert!(line.contains(" C "), "objcopy did not compress: {line}");
        }
        let stripped = dir.path().join("stripped");
        fs::copy(&full, &stripped).unwrap();
        run("strip", &["--strip-all", s(&stripped)]);

        let m = ModuleSymbols::from_path_with_debug_dirs(&stripped, std::slice::from_ref(&root)).unwrap();
        assert_eq!(m.debug_file(), Some(dbg.as_path()));
        // Symbols from the debug file's .symtab: the static `helper` is in
        // no dynamic symbol table; compare with the unstripped file.
        check_lookups(&m, &full, &tools, ".symtab");
        check_lines(&m, &full, &tools, &addrs);
        check_plt(&m, &stripped, &tools);

        // Without the debug directory: .dynsym only, no lines.
        let bare = ModuleSymbols::from_path_with_debug_dirs(&stripped, &[]).unwrap();
        assert_eq!(bare.debug_file(), None);
        assert!(addrs.iter().all(|&a| bare.line(a).is_none()));
        let helper = readelf_funcs("readelf", &full, ".symtab").into_iter().find(|f| f.name == "helper").unwrap();
        assert_ne!(bare.lookup(helper.addr).map(|h| h.name), Some("helper"));
    }
}

#[test]
fn compressed_debug_sections_in_the_image() {
    require!("gcc", "objcopy", "readelf", "addr2line", "objdump");
    let tools = Tools::native();
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = c_program(dir.path(), "gz", &["-g", "-O0"]);
    for c in ["zlib", "zstd"] {
        if !objcopy_compresses(c, &path) {
            continue;
        }
        let out = dir.path().join(format!("gz-{c}"));
        run("objcopy", &[&format!("--compress-debug-sections={c}"), s(&path), s(&out)]);
        let m = ModuleSymbols::from_path_with_debug_dirs(&out, &[]).unwrap();
        check_lines(&m, &out, &tools, &own_insns(&tools, &out));
    }
}

#[test]
fn system_libc_with_installed_debug_file() {
    require!("readelf", "nm", "addr2line");
    let tools = Tools::native();
    let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists());
    let libc = libc.expect("no x86_64 libc.so.6: install libc6");
    let m = ModuleSymbols::from_path(libc).unwrap();
    let dbg = m
        .debug_file()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("no debug file for {} under /usr/lib/debug: install libc6-dbg", libc.display()));
    // The full .symtab of the debug file, names as nm -C prints them there.
    check_lookups(&m, &dbg, &tools, ".symtab");
    // Lines at the start and middle of every exported function; binutils
    // addr2line finds the same debug file by build-id.
    let mut addrs = Vec::new();
    for f in readelf_funcs(&tools.readelf, libc, ".dynsym") {
        addrs.push(f.addr);
        addrs.push(f.addr + f.size / 2);
    }
    addrs.sort_unstable();
    addrs.dedup();
    check_lines(&m, libc, &tools, &addrs);
    // libc's PLT: calls into ld.so by name, IFUNCs (IRELATIVE) as `*ABS*+0x...@plt`.
    assert!(check_plt(&m, libc, &tools) > 0);
}

// ---------------------------------------------------------- this process

#[inline(never)]
#[no_mangle]
pub extern "C" fn itrace_symbols_test_marker(x: u64) -> u64 {
    x.wrapping_mul(31).rotate_left(7)
}

#[inline(never)]
fn rust_marker_fn(x: u64) -> u64 {
    x.wrapping_add(0x1234).rotate_right(3)
}

/// (start, end, offset, path) of the mapping of /proc/self/maps containing `addr`.
fn own_mapping(addr: u64) -> (u64, u64, u64, String) {
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let (a, b) = t[0].split_once('-')?;
            let (a, b) = (hex(a), hex(b));
            (addr >= a && addr < b).then(|| (a, b, hex(t[2]), t.get(5).unwrap_or(&"").to_string()))
        })
        .unwrap()
}

#[test]
fn own_executable_mapping_and_rust_demangling() {
    require!("readelf", "nm");
    let tools = Tools::native();
    std::hint::black_box(itrace_symbols_test_marker(std::hint::black_box(3)));
    std::hint::black_box(rust_marker_fn(std::hint::black_box(3)));
    let exe = std::env::current_exe().unwrap();
    let m = ModuleSymbols::from_path(&exe).unwrap();

    for (runtime, name) in [
        (itrace_symbols_test_marker as *const () as u64, "itrace_symbols_test_marker"),
        (rust_marker_fn as *const () as u64, "symbols::rust_marker_fn"),
    ] {
        let (start, _, offset, path) = own_mapping(runtime);
        assert_eq!(fs::canonicalize(&path).unwrap(), fs::canonicalize(&exe).unwrap());
        let vaddr = m.file_vaddr(start, offset, runtime).unwrap();
        let hit = m.lookup(vaddr).unwrap();
        assert_eq!((hit.name, hit.offset), (name, 0));
        // nm agrees on the address.
        let nm = run(&tools.nm, &["-C", "--defined-only", s(&exe)]);
        let line = nm.lines().find(|l| l.ends_with(&format!(" {name}"))).unwrap();
        assert_eq!(hex(line.split(' ').next().unwrap()), vaddr);
    }
    // Every function of this binary (Rust legacy and v0 names, C from
    // libstd's dependencies), against nm -C.
    check_lookups(&m, &exe, &tools, ".symtab");
}

#[test]
fn vdso_from_process_memory() {
    require!("readelf", "nm");
    let tools = Tools::native();
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    let Some(line) = maps.lines().find(|l| l.ends_with("[vdso]")) else {
        panic!("no [vdso] mapping in this process");
    };
    let (a, b) = line.split_whitespace().next().unwrap().split_once('-').unwrap();
    let (start, end) = (hex(a), hex(b));
    let mut mem = fs::File::open("/proc/self/mem").unwrap();
    mem.seek(SeekFrom::Start(start)).unwrap();
    let mut bytes = vec![0u8; (end - start) as usize];
    mem.read_exact(&mut bytes).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vdso.so");
    fs::write(&file, &bytes).unwrap();
    let m = ModuleSymbols::from_bytes("[vdso]", bytes).unwrap();
    let table = if readelf_funcs(&tools.readelf, &file, ".symtab").is_empty() { ".dynsym" } else { ".symtab" };
    check_lookups(&m, &file, &tools, table);

    let nm = run(&tools.nm, &["-D", "--defined-only", s(&file)]);
    // "0000000000000af0 T __vdso_clock_gettime@@LINUX_2.6"
    let addr = |n: &str| {
        nm.lines()
            .find(|l| l.split('@').next().unwrap().ends_with(&format!(" {n}")))
            .map(|l| hex(l.split(' ').next().unwrap()))
    };
    let cg = addr("__vdso_clock_gettime").or_else(|| addr("clock_gettime")).unwrap();
    let hit = m.lookup(cg).unwrap();
    assert!(["__vdso_clock_gettime", "clock_gettime"].contains(&hit.name), "{hit:?}");
    assert_eq!(hit.offset, 0);
    // The vDSO is one mapping of the whole image at file offset 0.
    let loads = readelf_loads(&tools.readelf, &file);
    let (off, vaddr, _, _) = loads[0];
    assert_eq!(m.file_vaddr(start, 0, start + off + (cg - vaddr)), Some(cg));
}

// ------------------------------------------------------ other architectures

const PPC_PROG: &str = r#"
static int helper(int x)
{
    return x * 3 + 1;
}

int compute(int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s += helper(i);
    return s;
}

void _start(void)
{
    compute(5);
    for (;;)
        ;
}
"#;

/// ppc64 big-endian ELFv1: function symbols point at .opd descriptors, and
/// objdump shows the code entry points as `<.name>`.
#[test]
fn ppc64_elfv1_function_descriptors() {
    let gcc = "powerpc64-linux-gnu-gcc";
    require!(gcc, "powerpc64-linux-gnu-objdump", "powerpc64-linux-gnu-addr2line");
    let tools = Tools::prefixed("powerpc64-linux-gnu-");
    let dir = tempfile::tempdir().unwrap();
    let args = ["-g", "-O0", "-nostdlib", "-static", "-fno-inline", "-mabi=elfv1"];
    let path = compile(gcc, dir.path(), "ppc", "c", PPC_PROG, &args);
    let m = ModuleSymbols::from_path(&path).unwrap();
    assert!(m.is_big_endian());
    assert!(!m.is_32bit());
    assert_eq!(m.machine(), 21); // EM_PPC64
    let insns = objdump_insns(&tools.objdump, &path, &[".text"]);
    let mut all = Vec::new();
    for f in ["helper", "compute", "_start"] {
        let addrs = &insns[&format!(".{f}")];
        for &a in addrs {
            let hit = m.lookup(a).unwrap();
            assert_eq!((hit.name, hit.start), (f, addrs[0]), "{a:#x}");
        }
        all.extend_from_slice(addrs);
    }
    check_lines(&m, &path, &tools, &all);
}

/// i386 PLTs, PIC (`jmp *disp(%ebx)`) and not (`jmp *abs32`): stubs named as objdump names them.
#[test]
fn i386_plt_stub_names() {
    let gcc = "i686-linux-gnu-gcc";
    require!(gcc, "i686-linux-gnu-objdump", "i686-linux-gnu-readelf");
    let tools = Tools::prefixed("i686-linux-gnu-");
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("pie32", ["-O1", "-fPIE", "-pie"]), ("nopie32", ["-O1", "-fno-PIE", "-no-pie"])] {
        let path = compile(gcc, dir.path(), name, "c", C_PROG, &args);
        let m = ModuleSymbols::from_path(&path).unwrap();
        assert!(m.is_32bit());
        let named = objdump_insns(&tools.objdump, &path, &[".plt", ".plt.sec"]);
        assert!(named.keys().any(|l| l.ends_with("@plt")), "{name}: objdump names no stub: {named:?}");
        assert!(check_plt(&m, &path, &tools) > 0, "{name}");
    }
}

/// s390x `.plt`: a 32-byte header, then 32-byte stubs in `.rela.plt` order, named as objdump does.
#[test]
fn s390x_plt_stub_names() {
    let gcc = "s390x-linux-gnu-gcc";
    require!(gcc, "s390x-linux-gnu-objdump", "s390x-linux-gnu-readelf");
    let tools = Tools::prefixed("s390x-linux-gnu-");
    let dir = tempfile::tempdir().unwrap();
    let path = compile(gcc, dir.path(), "s390x", "c", C_PROG, &["-O1"]);
    let m = ModuleSymbols::from_path(&path).unwrap();
    let named = objdump_insns(&tools.objdump, &path, &[".plt"]);
    assert!(named.keys().any(|l| l.ends_with("@plt")), "objdump names no stub: {named:?}");
    assert!(check_plt(&m, &path, &tools) > 0);
}

/// ppc64le PLT call stubs and glink entries (in .text): named as objdump's synthetic
/// `NNNNNNNN.plt_call.NAME@@VER` and `NAME@plt` labels say, without prefix and version; the
/// glink header (`__glink_PLTresolve`) is `<plt>`.
#[test]
fn ppc64le_plt_call_stub_names() {
    let gcc = "powerpc64le-linux-gnu-gcc";
    require!(gcc, "powerpc64le-linux-gnu-objdump");
    let tools = Tools::prefixed("powerpc64le-linux-gnu-");
    let dir = tempfile::tempdir().unwrap();
    let path = compile(gcc, dir.path(), "ppc64le", "c", C_PROG, &["-O1"]);
    let m = ModuleSymbols::from_path(&path).unwrap();
    let mut stubs = 0;
    for (label, addrs) in objdump_insns(&tools.objdump, &path, &[".text", ".init"]) {
        // Call stubs, and the lazy-binding glink entries (`NAME@plt`) and their header.
        let want = match label.split_once(".plt_call.") {
            Some((_, name)) => format!("{}@plt", name.split('@').next().unwrap()),
            None if label.ends_with("@plt") => label.clone(),
            None if label == "__glink_PLTresolve" => "<plt>".to_string(),
            None => continue,
        };
        for a in addrs {
            let hit = m.lookup(a).unwrap_or_else(|| panic!("{label} {a:#x}: no symbol"));
            assert_eq!(hit.name, want, "{label} {a:#x}");
            assert!(hit.plt.is_some(), "{label} {a:#x}");
            stubs += 1;
        }
    }
    assert!(stubs >= 8, "only {stubs} stub instructions found");
}

/// 32-bit big-endian (powerpc): ELF32 MSB symbols and lines.
#[test]
fn ppc32_big_endian_elf32() {
    let gcc = "powerpc64-linux-gnu-gcc";
    require!(gcc, "powerpc64-linux-gnu-objdump", "powerpc64-linux-gnu-addr2line");
    let tools = Tools::prefixed("powerpc64-linux-gnu-");
    let dir = tempfile::tempdir().unwrap();
    let args = ["-m32", "-g", "-O0", "-nostdlib", "-static", "-fno-inline"];
    let path = compile(gcc, dir.path(), "ppc32", "c", PPC_PROG, &args);
    let m = ModuleSymbols::from_path(&path).unwrap();
    assert!(m.is_big_endian());
    assert!(m.is_32bit());
    assert_eq!(m.machine(), 20); // EM_PPC
    check_lookups(&m, &path, &tools, ".symtab");
    let insns = objdump_insns(&tools.objdump, &path, &[".text"]);
    let all: Vec<u64> = insns.values().flatten().copied().collect();
    check_lines(&m, &path, &tools, &all);
}

// ---------------------------------------------------------- malformed input

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn malformed_input_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let err = ModuleSymbols::from_path(&empty).unwrap_err();
    assert!(matches!(err, SymbolError::NotElf { .. }), "{err}");
    assert!(err.to_string().contains("empty"), "{err}");

    let missing = dir.path().join("missing.so");
    let err = ModuleSymbols::from_path(&missing).unwrap_err();
    assert!(matches!(err, SymbolError::Io { .. }));
    assert!(err.to_string().contains("missing.so"), "{err}");

    let err = ModuleSymbols::from_path(dir.path()).unwrap_err();
    assert!(err.to_string().contains(s(dir.path())), "{err}");

    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..4096).map(|_| xorshift(&mut rng) as u8).collect();
    assert!(matches!(ModuleSymbols::from_bytes("random", random), Err(SymbolError::NotElf { .. })));
    let err = ModuleSymbols::from_bytes("hdr", b"\x7fELF\x02\x01\x01".to_vec()).unwrap_err();
    assert!(matches!(err, SymbolError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("hdr"));
    let err = ModuleSymbols::from_bytes("class", b"\x7fELF\x07\x01\x01\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0".to_vec()).unwrap_err();
    assert!(matches!(err, SymbolError::Malformed { .. }), "{err}");

    // Truncations and random corruption of a real executable.
    let real = std::env::current_exe().unwrap();
    let exe = if have("gcc") { compile("gcc", dir.path(), "small", "c", C_PROG, &["-g", "-O0"]) } else { real };
    let bytes = fs::read(&exe).unwrap();
    for len in [16, 52, 64, 200, 1000, bytes.len() / 2, bytes.len() - 1] {
        let r = ModuleSymbols::from_bytes("truncated", bytes[..len].to_vec());
        if len <= 1000 {
            assert!(r.is_err(), "truncated to {len} bytes loaded");
        }
        if let Ok(m) = r {
            exercise(&m);
        }
    }
    let mut rng = 0x1234_5678_9abc_def1u64;
    for round in 0..1500 {
        let mut b = bytes.clone();
        let flips = 1 + xorshift(&mut rng) % 16;
        for _ in 0..flips {
            // Mostly the headers, where corruption matters most.
            let limit = if round % 2 == 0 { 4096.min(b.len()) } else { b.len() };
            let i = (xorshift(&mut rng) % limit as u64) as usize;
            b[i] = xorshift(&mut rng) as u8;
        }
        if let Ok(m) = ModuleSymbols::from_bytes_with_debug_dirs("fuzzed", b, &[]) {
            exercise(&m);
        }
    }
}

fn exercise(m: &ModuleSymbols) {
    for a in [0u64, 0x1000, 0x1139, 0x401000, u64::MAX] {
        let _ = m.lookup(a);
        let _ = m.line(a);
        let _ = m.file_vaddr(0x5555_0000_0000, 0, 0x5555_0000_0000 + a % 0x10000);
    }
}

// ---------------------------------------------------------------- JIT maps

#[test]
fn jit_perf_map() {
    let text = "\
7f0000001000 40 LazyCompile:~foo /app/x.js:1
0x7f0000002000 0x10 Builtin: with spaces
not a line
7f0000003000 zz bad size
7f0000004000 8
";
    let jit = JitSymbols::parse(text);
    assert_eq!(jit.len(), 2);
    let h = jit.lookup(0x7f00_0000_1010).unwrap();
    assert_eq!((h.name, h.start, h.offset), ("LazyCompile:~foo /app/x.js:1", 0x7f00_0000_1000, 0x10));
    assert_eq!(jit.lookup(0x7f00_0000_1040), None);
    assert_eq!(jit.lookup(0x7f00_0000_2000 + 0xf).unwrap().name, "Builtin: with spaces");
    assert_eq!(jit.lookup(0x7f00_0000_0fff), None);
    assert_eq!(jit.lookup(0x7f00_0000_4000), None);

    // A later entry replaces the middle of an older one; the older one's
    // pieces keep their offsets from its own start.
    let mut jit = JitSymbols::new();
    jit.add(0x1000, 0x100, "old".into());
    jit.add(0x1040, 0x20, "new".into());
    assert_eq!(jit.lookup(0x103f).map(|h| (h.name, h.offset)), Some(("old", 0x3f)));
    assert_eq!(jit.lookup(0x1040).map(|h| (h.name, h.offset)), Some(("new", 0)));
    assert_eq!(jit.lookup(0x105f).map(|h| (h.name, h.offset)), Some(("new", 0x1f)));
    assert_eq!(jit.lookup(0x1060).map(|h| (h.name, h.offset)), Some(("old", 0x60)));
    assert_eq!(jit.lookup(0x10ff).map(|h| h.name), Some("old"));
    assert_eq!(jit.lookup(0x1100), None);
    // Covering several older ones entirely.
    jit.add(0xf00, 0x300, "big".into());
    assert_eq!(jit.lookup(0x1050).map(|h| (h.name, h.offset)), Some(("big", 0x150)));
    assert_eq!(jit.lookup(0x11ff).map(|h| h.name), Some("big"));
    assert_eq!(jit.lookup(0x1200), None);
}

// ------------------------------------------------------------------ cache

#[test]
fn cache_loads_once_and_remembers_failures() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ModuleSymbols>();
    assert_send_sync::<SymbolCache>();
    assert_send_sync::<JitSymbols>();

    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let mut cache = SymbolCache::with_debug_dirs(vec![]);
    let a = Arc::clone(cache.get(exe).unwrap());
    let b = Arc::clone(cache.get(exe).unwrap());
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.name(), exe);

    assert!(cache.get("/nonexistent/lib.so").is_none());
    assert!(cache.get("/nonexistent/lib.so").is_none());
    let err = cache.error("/nonexistent/lib.so").unwrap().to_string();
    assert!(err.contains("/nonexistent/lib.so"), "{err}");
    assert!(cache.error(exe).is_none());

    assert!(cache.get("[vdso]").is_none());
    let vdso = fs::read(exe).unwrap();
    assert!(cache.insert_bytes("[vdso]", vdso).is_some());
    assert!(cache.get("[vdso]").is_some());
    assert!(cache.insert_bytes("[bad]", vec![1, 2, 3]).is_none());
    assert!(cache.error("[bad]").is_some());
}
