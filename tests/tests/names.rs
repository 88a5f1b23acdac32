//! C++ function names as a person types them (issue 30, item 1), in every command that takes
//! one: `report --callers/--callees`, `annotate`, `record --start`, against the demangler's
//! own output (`nm -C` of binutils: the names, and which are overloads of which) and the
//! symbol table (`nm`: the mangled names).
//!
//! tests/programs/cpp_names.cpp: `geo::Rect::area() const` and `geo::Tri::area() const`
//! (so `area` is ambiguous, `Rect::area` is not), `geo::scale(int)` and `geo::scale(double)`
//! (overloads), `geo::biggest<int>` and `geo::biggest<double>` (a template's instances),
//! `geo::V::operator+` and `operator()`, `geo::Box<int>::get() const`, `geo::total`, and a
//! global `square(int)`. Each runs; the area methods twice (Rect) and once (Tri), hand-counted
//! from main.

use itrace_tests::{itrace, program, record, require_tool, run, test_dir};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The program's function symbols: demangled name (`nm -C`) -> mangled name (`nm`), by address.
fn symbols(prog: &Path) -> BTreeMap<String, String> {
    require_tool("nm");
    let table = |demangle: bool| -> BTreeMap<String, String> {
        let mut cmd = Command::new("nm");
        cmd.arg("--defined-only");
        if demangle {
            cmd.arg("-C");
        }
        let o = run(cmd.arg(prog));
        o.assert_success();
        o.stdout
            .lines()
            .filter_map(|l| {
                let (addr, rest) = l.split_once(' ')?;
                let (kind, name) = rest.split_once(' ')?;
                matches!(kind, "T" | "W" | "t").then(|| (addr.to_string(), name.to_string()))
            })
            .collect()
    };
    let (demangled, mangled) = (table(true), table(false));
    demangled.into_iter().map(|(addr, name)| (name, mangled[&addr].clone())).collect()
}

fn traced(test: &str) -> (PathBuf, BTreeMap<String, String>) {
    let prog = program("cpp_names");
    let trace = test_dir(&format!("names-{test}")).join("t.itr");
    record(&trace, &[], &prog, &[]).assert_success();
    (trace, symbols(&prog))
}

/// The call graph entries of `report ARGS --json`: name -> calls.
fn entries(trace: &Path, args: &[&str]) -> BTreeMap<String, u64> {
    let mut all = vec!["report", trace.to_str().unwrap(), "--json"];
    all.extend(args);
    let o = itrace(&all);
    o.assert_success();
    let v: Value = serde_json::from_str(&o.stdout).expect("JSON");
    v["call_graph"]
        .as_array()
        .expect("call_graph")
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["calls"].as_u64().unwrap()))
        .collect()
}

#[test]
fn names_match_as_in_gdb_and_perf() {
    let (trace, syms) = traced("names_match");
    let rect = "geo::Rect::area() const";
    let tri = "geo::Tri::area() const";
    for name in [rect, tri, "geo::scale(int)", "geo::scale(double)", "int geo::biggest<int>(int, int)"] {
        assert!(syms.contains_key(name), "nm -C has no {name}: {syms:?}");
    }
    // (typed, the nm -C names it must select, calls of each by main's source)
    let cases: &[(&str, &[(&str, u64)])] = &[
        // The qualified name without parameters or qualifiers.
        ("geo::Rect::area", &[(rect, 2)]),
        // A unique trailing part.
        ("Rect::area", &[(rect, 2)]),
        ("Tri::area", &[(tri, 1)]),
        ("total", &[("geo::total(geo::Shape const* const*, int)", 1)]),
        // The full signature, as nm -C writes it.
        (rect, &[(rect, 2)]),
        // Every overload.
        ("geo::scale", &[("geo::scale(int)", 1), ("geo::scale(double)", 1)]),
        ("scale", &[("geo::scale(int)", 1), ("geo::scale(double)", 1)]),
        // Every instance of a template, or one.
        ("biggest", &[("int geo::biggest<int>(int, int)", 1), ("double geo::biggest<double>(double, double)", 1)]),
        ("geo::biggest<int>", &[("int geo::biggest<int>(int, int)", 1)]),
        // A template function's signature without the return type nm -C writes first.
        ("geo::biggest<int>(int, int)", &[("int geo::biggest<int>(int, int)", 1)]),
        // Operators and a class template's method.
        ("V::operator+", &[("geo::V::operator+(geo::V const&) const", 1)]),
        ("operator()", &[("geo::V::operator()(int) const", 1)]),
        ("Box::get", &[("geo::Box<int>::get() const", 1)]),
        ("square", &[("square(int)", 1)]),
    ];
    for (typed, want) in cases {
        let want: BTreeMap<String, u64> = want.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        for name in want.keys() {
            assert!(syms.contains_key(name), "{typed}: nm -C has no {name}");
        }
        assert_eq!(entries(&trace, &["--callers", typed]), want, "--callers {typed}");
        assert_eq!(entries(&trace, &["--callees", typed]), want, "--callees {typed}");
    }
    // The mangled name, from the symbol table.
    let mangled = &syms[rect];
    assert!(mangled.starts_with("_Z"), "{mangled}");
    assert_eq!(entries(&trace, &["--callers", mangled]), BTreeMap::from([(rect.to_string(), 2)]));
}

#[test]
fn an_ambiguous_name_lists_its_candidates() {
    let (trace, syms) = traced("ambiguous");
    // The candidates: the qualified names of the nm -C names that end in ::area(.
    let mut candidates: Vec<String> = syms
        .keys()
        .filter_map(|n| n.split_once('(').map(|(q, _)| q.rsplit(' ').next().unwrap().to_string()))
        .filter(|q| q.ends_with("::area"))
        .collect();
    candidates.sort();
    candidates.dedup();
    assert_eq!(candidates, ["geo::Rect::area", "geo::Tri::area"]);
    let line = format!("area is ambiguous: it names {} (give one of these)", candidates.join(", "));
    let o = itrace(["report", trace.to_str().unwrap(), "--callers", "area"]);
    assert!(o.assert_clean_error().ends_with(&line), "{}", o.stderr);
    let o = itrace(["annotate", trace.to_str().unwrap(), "area"]);
    assert!(o.assert_clean_error().ends_with(&line), "{}", o.stderr);
    // replay -F and --after too (chosen among the symbols of the files the trace mapped).
    let o = itrace(["replay", trace.to_str().unwrap(), "-F", "area"]);
    assert!(o.assert_clean_error().ends_with(&line), "{}", o.stderr);
    let o = itrace(["report", trace.to_str().unwrap(), "--after", "area"]);
    assert!(o.assert_clean_error().ends_with(&line), "{}", o.stderr);
    // record --start resolves names the same way, before running anything.
    let o = record(&test_dir("names-start-ambiguous").join("t.itr"), &["--start", "area"], &program("cpp_names"), &[]);
    assert!(o.assert_clean_error().contains(&line), "{}", o.stderr);
}

/// `--callers A --callees B` with B missing: B is named in a warning, A's entry is reported
/// (perf's symbol filters that match nothing show nothing, and fail nothing); with both
/// missing, the report fails on the first.
#[test]
fn a_missing_name_is_a_warning_when_another_is_found() {
    let (trace, _) = traced("missing");
    let t = trace.to_str().unwrap();
    let o = itrace(["report", t, "--json", "--callers", "Rect::area", "--callees", "geo::nosuch"]);
    o.assert_success();
    assert!(o.stderr.contains("warning: no function named geo::nosuch ran in the trace"), "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["call_graph"].as_array().unwrap().len(), 1);
    assert_eq!(v["call_graph"][0]["name"], "geo::Rect::area() const");
    let o = itrace(["report", t, "--callers", "nosuch1", "--callees", "nosuch2"]);
    assert!(o.assert_clean_error().contains("no function named nosuch1"), "{}", o.stderr);
}

/// annotate and record --start take the short names too.
#[test]
fn annotate_and_start_take_short_names() {
    let (trace, _) = traced("annotate");
    let o = itrace(["annotate", trace.to_str().unwrap(), "--json", "Tri::area"]);
    o.assert_success();
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["functions"].as_array().unwrap().len(), 1);
    assert_eq!(v["functions"][0]["name"], "geo::Tri::area() const");

    // replay -F total: geo::total calls the area methods of {&r, &t, &r} in that order
    // (main's source), each named as nm -C names it.
    let o = itrace(["replay", trace.to_str().unwrap(), "-F", "total"]);
    o.assert_success();
    let calls: Vec<&str> = o.stdout.lines().filter_map(|l| l.split("]  ").nth(1)).map(str::trim).collect();
    assert_eq!(
        calls,
        [
            "geo::total(geo::Shape const* const*, int) {",
            "geo::Rect::area() const;",
            "geo::Tri::area() const;",
            "geo::Rect::area() const;",
            "} /* geo::total(geo::Shape const* const*, int) */"
        ],
        "{}",
        o.stdout
    );

    // Tracing starts at geo::total (and goes on to the end): Rect::area runs twice inside it.
    let started = test_dir("names-start").join("t.itr");
    record(&started, &["--start", "total"], &program("cpp_names"), &[]).assert_success();
    assert_eq!(
        entries(&started, &["--callers", "Rect::area"]),
        BTreeMap::from([("geo::Rect::area() const".into(), 2)])
    );
    let o = itrace(["report", started.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    let names: Vec<&str> = v["functions"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    // What ran before geo::total (the dynamic linker's start-up) is not in the trace.
    assert!(names.contains(&"main") && !names.contains(&"_dl_start"), "the trace starts in geo::total: {names:?}");
}
