//! Stripped code: the same program stripped and unstripped gives the same report, with
//! every function the unstripped build names (nm) shown in the stripped one as
//! `program+0xADDRESS`, its nm address, and the same self, inclusive and call counts.
//! The report hints at what to install for names.

use itrace_tests::{itrace, program, record, report_json, require_tool, run, test_dir, Symbols};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// (self, inclusive, calls) per function name of `module` in a report.
fn rows(report: &serde_json::Value, module: &Path) -> BTreeMap<String, (u64, u64, u64)> {
    let module = module.to_string_lossy();
    report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["module"].as_str() == Some(&*module))
        .map(|f| {
            let n = |k: &str| f[k].as_u64().unwrap();
            (f["name"].as_str().unwrap().to_string(), (n("self"), n("inclusive"), n("calls")))
        })
        .collect()
}

#[test]
fn stripped_program_has_a_row_per_function_at_its_nm_address() {
    require_tool("strip");
    let unstripped = program("funcptr");
    let dir = test_dir("stripped-funcptr");
    // Same directory depth and name length, so that the process starts the same way.
    let stripped = dir.join("funcptr");
    let o = run(Command::new("strip").arg("--strip-all").arg("-o").arg(&stripped).arg(&unstripped));
    o.assert_success();
    assert!(Symbols::of(&stripped).syms.is_empty(), "strip left symbols in {}", stripped.display());

    let t_plain = dir.join("plain.itr");
    let t_stripped = dir.join("stripped.itr");
    record(&t_plain, &[], &unstripped, &[]).assert_success();
    record(&t_stripped, &[], &stripped, &[]).assert_success();
    let plain = rows(&report_json(&t_plain), &unstripped);
    let report = report_json(&t_stripped);
    let got = rows(&report, &stripped);

    let nm = Symbols::of(&unstripped);
    let base = stripped.file_name().unwrap().to_string_lossy().into_owned();
    let mut missing = Vec::new();
    let mut checked = 0;
    for (name, counts) in &plain {
        let want = if name.ends_with("@plt") || name == "<plt>" {
            name.clone()
        } else {
            let sym = nm.by_name(name).unwrap_or_else(|| panic!("{name} of the unstripped report is not in nm"));
            format!("{base}+{:#x}", sym.addr)
        };
        match got.get(&want) {
            Some(c) if c == counts => checked += 1,
            other => missing.push(format!("{name}: want {want} {counts:?}, got {other:?}")),
        }
    }
    assert!(missing.is_empty(), "stripped report differs:\n{}\nstripped rows: {got:?}", missing.join("\n"));
    assert!(checked >= 8, "only {checked} functions compared: {plain:?}");
    assert!(!got.contains_key("<unknown>"), "code left <unknown>: {got:?}");

    // One hint for the stripped program, naming its build-id's debug file.
    let out = itrace([OsStr::new("report"), t_stripped.as_os_str()]);
    out.assert_success();
    let hints: Vec<&str> = out.stderr.lines().filter(|l| l.contains(&*stripped.to_string_lossy())).collect();
    assert_eq!(hints.len(), 1, "one hint for {}: {}", stripped.display(), out.stderr);
    assert!(hints[0].contains("hint:") && hints[0].contains("/usr/lib/debug/.build-id/"), "{}", hints[0]);
}
