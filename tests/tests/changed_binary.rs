//! A program rebuilt with different code, or deleted, after it was recorded: the report and
//! the arc warn once and name none of its functions: its code shows as `small2+0xOFFSET`,
//! one row per file offset where calls and jumps entered it (as perf shows code without
//! symbols), and what ran before any such entry as `small2`; with `itrace archive` taken
//! before, both cases resolve as if nothing had changed.
//!
//! Truth: the source, and the recorded build's symbols (nm and objdump on a copy of it).
//! `f` is called 60 times by main's loop; the rebuilt program has `g` and `h` and no `f`.

use itrace_tests::{arc_text, itrace, record, report_json, require_tool, run, test_dir, Symbols};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

const V1: &str = "int f(int x) { return x * 3; }\nint main(void) { int s = 0; for (int i = 0; i < 60; i++) s += f(i); return s & 1; }\n";
const V2: &str = "int g(int x) { return x + 1; }\nint h(int x) { return x - 1; }\n\
                  int main(void) { int s = 0; for (int i = 0; i < 61; i++) s += g(i) + h(i); return s & 1; }\n";

fn build(dir: &Path, src: &str) -> PathBuf {
    require_tool("gcc");
    let c = dir.join("small2.c");
    std::fs::write(&c, src).unwrap();
    let bin = dir.join("small2");
    run(Command::new("gcc").args(["-O0", "-g", "-o"]).arg(&bin).arg(&c)).assert_success();
    bin
}

/// (name, self, calls) of the report's rows in `module`, and the report's stderr.
fn rows(trace: &Path, module: &Path) -> (Vec<(String, u64, u64)>, String) {
    let report = report_json(trace);
    let module = module.to_string_lossy();
    let rows = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["module"].as_str() == Some(&*module))
        .map(|f| (f["name"].as_str().unwrap().to_string(), f["self"].as_u64().unwrap(), f["calls"].as_u64().unwrap()))
        .collect();
    let out = itrace([OsStr::new("report"), trace.as_os_str()]);
    out.assert_success();
    (rows, out.stderr)
}

fn calls_of(rows: &[(String, u64, u64)], name: &str) -> Option<u64> {
    rows.iter().find(|r| r.0 == name).map(|r| r.2)
}

fn total(rows: &[(String, u64, u64)]) -> u64 {
    rows.iter().map(|r| r.1).sum()
}

/// The warnings about `bin` in `stderr`: exactly one, containing `what`.
fn one_warning(stderr: &str, bin: &Path, what: &str) {
    let path = bin.to_string_lossy();
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning:") && l.contains(&*path)).collect();
    assert_eq!(warnings.len(), 1, "one warning about {path}:\n{stderr}");
    assert!(warnings[0].contains(what), "warning says {what}: {}", warnings[0]);
}

/// The file offset of `name` in `bin`, from nm's address and objdump's section headers.
fn file_offset(bin: &Path, name: &str) -> u64 {
    let addr = Symbols::of(bin).by_name(name).unwrap_or_else(|| panic!("nm: no {name}")).addr;
    let h = run(Command::new("objdump").arg("-h").arg("-w").arg(bin));
    h.assert_success();
    // `Idx Name Size VMA LMA File-off Algn Flags`.
    for line in h.stdout.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        let hex = |i: usize| t.get(i).and_then(|v| u64::from_str_radix(v, 16).ok());
        if let (Some(size), Some(vma), Some(off)) = (hex(2), hex(3), hex(5)) {
            if t[0].parse::<u32>().is_ok() && (vma..vma + size).contains(&addr) {
                return addr - vma + off;
            }
        }
    }
    panic!("objdump: no section holds {name} at {addr:#x}");
}

/// No function name of any build: the rows are the file (`small2`) and its entry points
/// (`small2+0xOFFSET`), which add up to the program's instructions; `f` and `main` of the
/// recorded build (`v1`, a copy) are rows of their own, with their calls.
fn no_names(rows: &[(String, u64, u64)], total_before: u64, v1: &Path) {
    assert!(
        rows.iter().all(|r| r.0 == "small2" || r.0.starts_with("small2+0x")),
        "function names on a changed file: {rows:?}"
    );
    assert_eq!(total(rows), total_before, "instructions in the program");
    for (name, calls) in [("f", 60), ("main", 1)] {
        let row = format!("small2+{:#x}", file_offset(v1, name));
        assert_eq!(calls_of(rows, &row), Some(calls), "{name} of the recorded build is {row}: {rows:?}");
    }
}

#[test]
fn changed_and_deleted_programs_warn_and_name_nothing_wrongly() {
    changed_and_deleted("changed_binary", &[]);
}

/// The same through the GDB-remote recorder (qemu-x86_64's stub), which learns the program's
/// files from its ELF headers and mmap calls instead of /proc.
#[test]
fn changed_and_deleted_programs_through_a_gdb_stub() {
    changed_and_deleted("changed_binary-gdb", &["--qemu", "x86_64"]);
}

/// The same through the qemu plugin (`--backend qemu`), which learns them from qemu and the
/// program's mmap calls.
#[test]
fn changed_and_deleted_programs_under_the_qemu_plugin() {
    changed_and_deleted("changed_binary-plugin", &["--backend", "qemu"]);
}

fn changed_and_deleted(name: &str, options: &[&str]) {
    let dir = test_dir(name);
    let bin = build(&dir, V1);
    let v1 = dir.join("small2.v1");
    std::fs::copy(&bin, &v1).unwrap();
    let trace = dir.join("t.itr");
    record(&trace, options, &bin, &[]).assert_success();
    let (before, _) = rows(&trace, &bin);
    assert_eq!(calls_of(&before, "f"), Some(60), "{before:?}");
    let n = total(&before);

    build(&dir, V2);
    let (changed, stderr) = rows(&trace, &bin);
    one_warning(&stderr, &bin, "changed");
    no_names(&changed, n, &v1);
    let arc = arc_text(&trace);
    for f in ["f:", "g:", "h:", "main:"] {
        assert!(
            !arc.lines().any(|l| l.contains(&format!(" {f}{}", bin.display()))),
            "arc names {f} in {}",
            bin.display()
        );
    }

    std::fs::remove_file(&bin).unwrap();
    let (deleted, stderr) = rows(&trace, &bin);
    one_warning(&stderr, &bin, "missing");
    no_names(&deleted, n, &v1);
}

#[test]
fn an_archived_trace_resolves_after_the_program_changed_or_went() {
    let dir = test_dir("changed_binary-archive");
    let bin = build(&dir, V1);
    let trace = dir.join("t.itr");
    record(&trace, &[], &bin, &[]).assert_success();
    let out = itrace([OsStr::new("archive"), trace.as_os_str()]);
    out.assert_success();
    let (before, _) = rows(&trace, &bin);
    assert_eq!(calls_of(&before, "f"), Some(60), "{before:?}");

    build(&dir, V2);
    let (changed, stderr) = rows(&trace, &bin);
    assert!(!stderr.contains("warning"), "{stderr}");
    assert_eq!(changed, before);

    std::fs::remove_file(&bin).unwrap();
    let (deleted, stderr) = rows(&trace, &bin);
    assert!(!stderr.contains("warning"), "{stderr}");
    assert_eq!(deleted, before);
}
