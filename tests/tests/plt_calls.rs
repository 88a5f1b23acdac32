//! Calls through the PLT are calls to the functions the stubs jump to: `report --json` call
//! counts and inclusive counts of printf, malloc, strcpy, strcmp and free (called by
//! pltcalls.c through its PLT) equal callgrind's, which attributes PLT calls to their targets.
//!
//! Both runs get the same environment: glibc's CPU-dependent choices pinned (GLIBC_PIN:
//! valgrind's virtual CPU is not this one, and without the pin the two runs would run other
//! string functions; the pin is checked, see tests/src/oracle/glibc_pin.rs), and LD_BIND_NOW=1
//! binds every stub before main, so that a stub is its own instructions and not, on a first
//! call, the dynamic linker's resolver (which callgrind counts as a call of its own).
//!
//! callgrind charges a stub's instructions to the caller; itrace counts them in the call
//! (the frame opens at the call instruction): itrace's inclusive count is callgrind's plus
//! the stub's instructions (objdump: from the stub's entry to its first jump) per call.

use itrace_tests::{
    callgrind_profile_through_plt, itrace_bin, pinned, program, report_json, require_tool, run, test_dir,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Instructions a bound call runs in each `NAME@plt` stub of `binary`: objdump's count from
/// the stub's label to its first `jmp`, inclusive.
fn stub_lengths(binary: &Path) -> BTreeMap<String, u64> {
    require_tool("objdump");
    let o = run(Command::new("objdump").args(["-d", "-w", "-j", ".plt", "-j", ".plt.sec"]).arg(binary));
    o.assert_success();
    let mut lengths = BTreeMap::new();
    let mut current: Option<(String, u64, bool)> = None;
    for line in o.stdout.lines() {
        if let Some(label) = line.split_once(" <").and_then(|(_, rest)| rest.strip_suffix(">:")) {
            if let Some((name, n, _)) = current.take() {
                lengths.insert(name, n);
            }
            if let Some(name) = label.strip_suffix("@plt") {
                current = Some((name.to_string(), 0, false));
            }
            continue;
        }
        let Some((name, n, done)) = current.as_mut() else { continue };
        let is_insn = line.trim_start().split_once(":\t").is_some();
        if is_insn && !*done {
            *n += 1;
            *done = line.contains("\tjmp ") || line.contains("\tbnd jmp ");
            if *done {
                lengths.insert(name.clone(), *n);
            }
        }
    }
    if let Some((name, n, true)) = current {
        lengths.insert(name, n);
    }
    lengths
}

/// Traces pltcalls with `env` and glibc pinned as under callgrind, and returns its report.
fn traced(name: &str, env: &[(&str, &str)]) -> serde_json::Value {
    let dir = test_dir(name);
    let trace = dir.join("t.itr");
    let mut cmd = Command::new(itrace_bin());
    pinned(&mut cmd).envs(env.iter().copied()).arg("record").arg("-o").arg(&trace).arg("--").arg(program("pltcalls"));
    run(&mut cmd).assert_success();
    report_json(&trace)
}

/// (module, calls, inclusive) of `name` in the report: the one row of that name in a module
/// other than the program.
fn row(report: &serde_json::Value, name: &str) -> (String, u64, u64) {
    let rows: Vec<&serde_json::Value> =
        report["functions"].as_array().unwrap().iter().filter(|f| f["name"] == name).collect();
    assert_eq!(rows.len(), 1, "one row for {name}: {rows:?}");
    let f = rows[0];
    (f["module"].as_str().unwrap().to_string(), f["calls"].as_u64().unwrap(), f["inclusive"].as_u64().unwrap())
}

/// The strcmp implementation the IFUNC chose: the libc row named `__strcmp_*`.
fn strcmp_impl(report: &serde_json::Value) -> String {
    let names: Vec<String> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .filter(|n| n.starts_with("__strcmp_"))
        .map(str::to_string)
        .collect();
    assert_eq!(names.len(), 1, "one strcmp implementation ran: {names:?}");
    names[0].clone()
}

#[test]
fn plt_calls_are_charged_to_their_targets_like_callgrind() {
    let bin = program("pltcalls");
    let env = [("LD_BIND_NOW", "1")];
    let report = traced("plt_calls-bound", &env);
    let cg = callgrind_profile_through_plt(&bin, &[], &env);
    let stubs = stub_lengths(&bin);

    let strcmp = strcmp_impl(&report);
    let mut diffs = Vec::new();
    // (function row, the stub main calls it through)
    for (func, stub) in [("printf", "printf"), ("free", "free"), ("strcmp", "strcmp"), ("malloc", "malloc")] {
        let func = if func == "strcmp" { strcmp.as_str() } else { func };
        let (module, calls, inclusive) = row(&report, func);
        let (cg_calls, cg_inclusive) = cg.calls_and_inclusive(Path::new(&module), func);
        let stub_len = *stubs.get(stub).unwrap_or_else(|| panic!("objdump shows no {stub}@plt: {stubs:?}"));
        assert!(cg_calls >= 6, "oracle: callgrind sees {cg_calls} calls of {func}, main makes 6");
        if calls != cg_calls {
            diffs.push(format!("{func}: {calls} calls, callgrind {cg_calls}"));
        }
        // malloc's first call sets the heap up with brk, whose result valgrind places
        // differently: its inclusive count is compared only as calls.
        if func != "malloc" && inclusive != cg_inclusive + stub_len * cg_calls {
            diffs.push(format!(
                "{func}: inclusive {inclusive}, callgrind {cg_inclusive} + {cg_calls} x {stub_len} stub instructions"
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "itrace and callgrind differ:\n{}\nfunctions whose self counts differ:\n{}",
        diffs.join("\n"),
        cg.self_differences(&report, 12).join("\n")
    );
    // The stubs keep their own instructions under their own names, and no call.
    let stub_row = report["functions"].as_array().unwrap().iter().find(|f| f["name"] == "printf@plt");
    let stub_row = stub_row.unwrap_or_else(|| panic!("no printf@plt row: {}", report["functions"]));
    assert_eq!(stub_row["calls"], 0);
    assert_eq!(stub_row["self"].as_u64(), Some(6 * stubs["printf"]));
}

/// Lazy binding: the first call of each function goes through the dynamic linker's resolver,
/// which then jumps to the function: still one call of the function per call in main.
#[test]
fn lazily_bound_plt_calls_count_like_callgrind() {
    let bin = program("pltcalls");
    let env: [(&str, &str); 0] = [];
    let report = traced("plt_calls-lazy", &env);
    let cg = callgrind_profile_through_plt(&bin, &[], &env);
    let strcmp = strcmp_impl(&report);
    for func in ["printf", "free", strcmp.as_str(), "malloc"] {
        let (module, calls, _) = row(&report, func);
        let (cg_calls, _) = cg.calls_and_inclusive(Path::new(&module), func);
        assert!(cg_calls >= 6, "oracle: callgrind sees {cg_calls} calls of {func}, main makes 6");
        assert_eq!(calls, cg_calls, "{func}: calls (itrace, callgrind)");
    }
}

/// Under qemu, other architectures' PLTs: ppc64le's linker call stubs among the code and,
/// the first time, its glink lazy-binding code; s390x's `.plt` and its header. printf and free
/// are still called 6 times each, as main's loop says (the cross libcs have no symbols for
/// strcpy's and strcmp's implementations to compare by name).
fn cross_plt_calls_count_once_per_call(arch: &str, gcc: &str) {
    let gcc = require_tool(gcc);
    let dir = test_dir(&format!("plt_calls-{arch}"));
    let bin = dir.join("pltcalls");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/pltcalls.c");
    run(Command::new(gcc).args(["-O1", "-o"]).arg(&bin).arg(&src)).assert_success();
    let trace = dir.join("t.itr");
    let o = run(Command::new(itrace_bin()).args(["record", "--qemu", arch, "-o"]).arg(&trace).arg("--").arg(&bin));
    o.assert_success();
    let report = report_json(&trace);
    for func in ["printf", "free"] {
        let (module, calls, _) = row(&report, func);
        assert!(module.ends_with("/libc.so.6"), "{arch}: {func} in {module}");
        assert_eq!(calls, 6, "{arch}: {func}: calls");
    }
    // The stubs keep their instructions and no calls.
    let stub = report["functions"].as_array().unwrap().iter().find(|f| f["name"] == "printf@plt").cloned();
    let stub = stub.unwrap_or_else(|| panic!("{arch}: no printf@plt row: {}", report["functions"]));
    assert_eq!(stub["calls"], 0);
}

#[test]
fn ppc64le_plt_calls_count_once_per_call() {
    cross_plt_calls_count_once_per_call("ppc64le", "powerpc64le-linux-gnu-gcc");
}

#[test]
fn s390x_plt_calls_count_once_per_call() {
    cross_plt_calls_count_once_per_call("s390x", "s390x-linux-gnu-gcc");
}
