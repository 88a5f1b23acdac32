//! Symbols, offsets and source lines in the arc agree with nm, objdump and
//! addr2line for the same addresses.

use itrace_tests::{addr2line_locations, checked_arc, objdump_insns, program, record, test_dir, Symbols};
use std::collections::BTreeSet;

fn check(name: &str, expect_funcs: &[&str]) {
    let bin = program(name);
    let module = bin.to_string_lossy().into_owned();
    let dir = test_dir(&format!("symbols_lines-{name}"));
    let trace = dir.join("t.itr");
    record(&trace, &[], &bin, &[]).assert_success();
    let (_, lines) = checked_arc(&trace, &dir.join("t.arc"));

    let syms = Symbols::of(&bin);
    let insns = objdump_insns(&bin);

    // every block of the program's own code: the symbol exists, the offset
    // is inside it and on an instruction boundary, and that address is the
    // one nm says the symbol covers
    let mut addrs = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for l in lines.iter().filter(|l| !l.kernel && l.module == module) {
        if l.symbol == "<plt>" || l.symbol.ends_with("@plt") {
            continue;
        }
        let s = syms
            .by_name(&l.symbol)
            .unwrap_or_else(|| panic!("arc line {}: {} is not a symbol of {module} (nm)", l.lineno, l.symbol));
        assert!(
            s.size == 0 || l.offset < s.size,
            "arc line {}: offset {:#x} beyond {} (size {:#x})",
            l.lineno,
            l.offset,
            s.name,
            s.size
        );
        let addr = s.addr + l.offset;
        assert!(
            insns.contains_key(&addr),
            "arc line {}: {} = {addr:#x} is not an instruction boundary (objdump)",
            l.lineno,
            l.location()
        );
        assert_eq!(syms.describe(addr), l.location(), "arc line {}: nm's symbol for {addr:#x}", l.lineno);
        addrs.insert(addr);
        seen.insert(l.symbol.clone());
    }
    for f in expect_funcs {
        assert!(seen.contains(*f), "{name}: no block in {f}; seen {seen:?}");
    }

    // source file and line: addr2line on the same addresses
    let addrs: Vec<u64> = addrs.into_iter().collect();
    let want = addr2line_locations(&bin, &addrs);
    let mut checked = 0;
    for l in lines.iter().filter(|l| !l.kernel && l.module == module) {
        if l.symbol == "<plt>" || l.symbol.ends_with("@plt") {
            continue;
        }
        let addr = syms.by_name(&l.symbol).unwrap().addr + l.offset;
        let i = addrs.binary_search(&addr).unwrap();
        let got = if l.line == 0 { "0".to_string() } else { format!("{}:{}", l.file, l.line) };
        assert_eq!(got, want[i], "arc line {}: source of {} ({addr:#x}) per addr2line", l.lineno, l.location());
        checked += 1;
    }
    assert!(checked > 0);
    // and -g really gave lines for the program's own functions
    assert!(
        lines.iter().any(|l| l.module == module && l.symbol == "main" && l.line > 0 && l.file.ends_with(".c")),
        "no source file and line for main"
    );
}

#[test]
fn loops_symbols_and_lines() {
    check("loops", &["main", "loops_fill", "loops_sum", "loops_nested", "loops_bits"]);
}

#[test]
fn jumptable_symbols_and_lines() {
    check("jumptable", &["main", "jt_classify"]);
}
