//! `itrace replay` (the call flow) and the range every view takes (`--from`, `--to`,
//! `--after`), issue 30 item 4, against hand counts and the disassembly:
//! - fib.c's `fib_asm` (assembly: 4 instructions for n < 2, 14 otherwise): the flow of
//!   fib_asm(15) is its recursion tree, each call with inclusive = its hand-computed count,
//!   self 4 or 14, children n-1 then n-2; 1973 calls;
//! - calls_loop.c with 3 rounds: 3 cl_top calls, each calling cl_mid twice, each calling
//!   cl_leaf once; cl_leaf is straight-line code, so each call runs as many instructions as
//!   objdump lists in it;
//! - tailcall.c: tc_mid (assembly: `add`, `jmp tc_inner`) tail-calls tc_inner, which calls
//!   tc_leaf: three times, nested as the report's call tree nests them, tc_mid's self 2;
//! - ranges: the same totals with and without a range that covers everything, in report,
//!   flamegraph and replay; `--after main` leaves the start-up out and keeps main's and
//!   fib_asm's counts; bad range input is one line and a non-zero exit, in every view.

use itrace_tests::{itrace, objdump_insns, program, record, test_dir, Flow, Symbols};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn traced(test: &str, name: &str, args: &[&str]) -> PathBuf {
    let trace = test_dir(&format!("replay-{test}")).join("t.itr");
    record(&trace, &[], &program(name), args).assert_success();
    trace
}

/// One call of the flow.
#[derive(Debug)]
struct Call {
    name: String,
    inclusive: u64,
    self_instructions: u64,
    note: String,
    children: Vec<Call>,
}

/// The flow `itrace replay TRACE ARGS` prints, as trees of calls (the outermost ones).
fn flow(trace: &Path, args: &[&str]) -> Vec<Call> {
    let mut all = vec!["replay", trace.to_str().unwrap()];
    all.extend(args);
    let o = itrace(&all);
    o.assert_success();
    parse_flow(&o.stdout)
}

/// Lines: `  INCL SELF  [TID]  INDENT name() {`, `INCL SELF [TID] INDENT } /* name */`,
/// `INCL SELF [TID] INDENT name();`; the header starts with `#`.
fn parse_flow(text: &str) -> Vec<Call> {
    let mut roots: Vec<Call> = Vec::new();
    let mut open: Vec<Call> = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (numbers, rest) = line.split_once('[').unwrap_or_else(|| panic!("no tid in {line:?}"));
        let (_tid, body) = rest.split_once("]  ").unwrap_or_else(|| panic!("no function in {line:?}"));
        let n: Vec<u64> = numbers.split_whitespace().map(|x| x.parse().expect("a count")).collect();
        let body = body.trim_start();
        let (text, note) = match body.split_once("  /* ") {
            Some((t, note)) if !t.starts_with('}') => (t, note.trim_end_matches(" */").to_string()),
            _ => (body, String::new()),
        };
        // `main()`, or a C++ signature as it is (`geo::Rect::area() const`).
        let unparen = |t: &str| t.strip_suffix("()").unwrap_or(t).to_string();
        if let Some(name) = text.strip_suffix(" {").map(unparen) {
            assert!(n.is_empty(), "an opening line has no counts: {line:?}");
            open.push(Call { name, inclusive: 0, self_instructions: 0, note, children: Vec::new() });
            continue;
        }
        let call = if let Some(name) = text.strip_prefix("} /* ").and_then(|t| t.strip_suffix(" */")) {
            let mut c = open.pop().unwrap_or_else(|| panic!("a return without its call: {line:?}"));
            assert_eq!(c.name, name, "{line:?}");
            (c.inclusive, c.self_instructions) = (n[0], n[1]);
            c
        } else {
            let name = unparen(text.strip_suffix(';').unwrap_or_else(|| panic!("not a call line: {line:?}")));
            Call { name, inclusive: n[0], self_instructions: n[1], note, children: Vec::new() }
        };
        match open.last_mut() {
            Some(parent) => parent.children.push(call),
            None => roots.push(call),
        }
    }
    assert!(open.is_empty(), "calls left open: {:?}", open.iter().map(|c| &c.name).collect::<Vec<_>>());
    roots
}

fn count(calls: &[Call], name: &str) -> usize {
    calls.iter().map(|c| usize::from(c.name == name) + count(&c.children, name)).sum()
}

/// Instructions of a call fib_asm(n), its own and its calls'.
fn fib_asm_inclusive(n: i64) -> u64 {
    if n < 2 {
        4
    } else {
        14 + fib_asm_inclusive(n - 1) + fib_asm_inclusive(n - 2)
    }
}

/// The flow of a call fib_asm(n) is its recursion, counted by hand.
fn check_fib_asm(c: &Call, n: i64) {
    assert_eq!(c.name, "fib_asm");
    assert_eq!(c.inclusive, fib_asm_inclusive(n), "fib_asm({n}) inclusive");
    assert_eq!(c.self_instructions, if n < 2 { 4 } else { 14 }, "fib_asm({n}) self");
    if n < 2 {
        assert!(c.children.is_empty());
    } else {
        assert_eq!(c.children.len(), 2, "fib_asm({n}) makes two calls");
        check_fib_asm(&c.children[0], n - 1);
        check_fib_asm(&c.children[1], n - 2);
    }
}

#[test]
fn fib_asm_flow_is_its_recursion() {
    let trace = traced("fib", "fib", &[]);
    let roots = flow(&trace, &["-F", "fib_asm"]);
    assert_eq!(roots.len(), 1, "one outermost call of fib_asm");
    check_fib_asm(&roots[0], 15);
    assert_eq!(count(&roots, "fib_asm"), 1973);
    // --depth 2: fib_asm(15) and its two calls, with the same counts.
    let shallow = flow(&trace, &["-F", "fib_asm", "--depth", "2"]);
    assert_eq!(shallow[0].inclusive, fib_asm_inclusive(15));
    let kids: Vec<u64> = shallow[0].children.iter().map(|c| c.inclusive).collect();
    assert_eq!(kids, [fib_asm_inclusive(14), fib_asm_inclusive(13)]);
    assert!(shallow[0].children.iter().all(|c| c.children.is_empty()));
    // Inside main: fib_asm is one call of main's, and main is not inside fib_asm.
    let main = flow(&trace, &["-F", "main", "--depth", "2"]);
    assert_eq!(main.len(), 1);
    assert_eq!(main[0].children.iter().filter(|c| c.name == "fib_asm").count(), 1);
    // --tid of a thread that is not there.
    let o = itrace(["replay", trace.to_str().unwrap(), "--tid", "999999999"]);
    assert!(o.assert_clean_error().contains("no thread 999999999"), "{}", o.stderr);
}

#[test]
fn calls_loop_flow_by_hand_and_disassembly() {
    let prog = program("calls_loop");
    // cl_leaf runs all of its instructions at each call when it has no branch but its ret.
    let syms = Symbols::of(&prog);
    let leaf = syms.by_name("cl_leaf").expect("cl_leaf in nm");
    let insns = objdump_insns(&prog);
    let body: Vec<_> = insns.range(leaf.addr..leaf.addr + leaf.size).map(|(_, i)| i).collect();
    assert!(
        body[..body.len() - 1].iter().all(|i| i.flow() == Flow::Next) && body.last().unwrap().flow() == Flow::Return,
        "cl_leaf is straight-line code: {body:?}"
    );
    let trace = traced("calls_loop", "calls_loop", &["3"]);
    let tops = flow(&trace, &["-F", "cl_top"]);
    assert_eq!(tops.len(), 3, "3 rounds");
    for top in &tops {
        assert_eq!(top.children.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["cl_mid", "cl_mid"]);
        for mid in &top.children {
            assert_eq!(mid.children.len(), 1);
            let leaf = &mid.children[0];
            assert_eq!(leaf.name, "cl_leaf");
            assert_eq!((leaf.inclusive, leaf.self_instructions), (body.len() as u64, body.len() as u64));
            assert_eq!(mid.inclusive, mid.self_instructions + leaf.inclusive);
        }
        let kids: u64 = top.children.iter().map(|c| c.inclusive).sum();
        assert_eq!(top.inclusive, top.self_instructions + kids);
    }
}

#[test]
fn tail_calls_nest_as_in_the_call_tree() {
    let trace = traced("tailcall", "tailcall", &[]);
    let tops = flow(&trace, &["-F", "tc_top"]);
    assert_eq!(tops.len(), 3);
    for top in &tops {
        assert_eq!(top.children.len(), 1);
        let mid = &top.children[0];
        assert_eq!(mid.name, "tc_mid");
        // add, jmp: tc_mid's own instructions.
        assert_eq!(mid.self_instructions, 2);
        let inner = &mid.children[0];
        assert_eq!((inner.name.as_str(), inner.note.as_str()), ("tc_inner", "tail call"));
        assert_eq!(inner.children.len(), 1);
        assert_eq!(inner.children[0].name, "tc_leaf");
        assert_eq!(mid.inclusive, 2 + inner.inclusive);
    }
    // The report counts the same: tc_inner's calls and inclusive instructions.
    let o = itrace(["report", trace.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    let inner = v["functions"].as_array().unwrap().iter().find(|f| f["name"] == "tc_inner").unwrap().clone();
    assert_eq!(inner["calls"], 3);
    let flowed: u64 = tops.iter().map(|t| t.children[0].children[0].inclusive).sum();
    assert_eq!(inner["inclusive"].as_u64().unwrap(), flowed);
}

fn total(trace: &Path, args: &[&str]) -> u64 {
    let mut all = vec!["report", trace.to_str().unwrap(), "--json"];
    all.extend(args);
    let o = itrace(&all);
    o.assert_success();
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    v["total_instructions"].as_u64().unwrap()
}

fn folded_total(trace: &Path, args: &[&str]) -> u64 {
    let mut all = vec!["flamegraph", trace.to_str().unwrap(), "--folded"];
    all.extend(args);
    let o = itrace(&all);
    o.assert_success();
    o.stdout.lines().map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap()).sum()
}

fn function(trace: &Path, args: &[&str], name: &str) -> Value {
    let mut all = vec!["report", trace.to_str().unwrap(), "--json"];
    all.extend(args);
    let o = itrace(&all);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    v["functions"].as_array().unwrap().iter().find(|f| f["name"] == name).cloned().unwrap_or(Value::Null)
}

#[test]
fn ranges_keep_the_totals() {
    let trace = traced("ranges", "fib", &[]);
    let all = total(&trace, &[]);
    // A range that covers everything changes nothing, in any view.
    for range in [&[][..], &["--from", "0"], &["--to", "1G"], &["--from", "0", "--to", "100s"]] {
        assert_eq!(total(&trace, range), all, "report {range:?}");
        assert_eq!(folded_total(&trace, range), all, "flamegraph {range:?}");
        let mut args = vec!["--depth", "1"];
        args.extend(range);
        let roots = flow(&trace, &args);
        assert_eq!(roots.iter().map(|c| c.inclusive).sum::<u64>(), all, "replay {range:?}");
    }
    // A range of instructions inside fib's recursion (fib runs its 29,592 instructions first
    // thing after its first call): every view adds up to the same, about what was asked.
    let before_fib = all - total(&trace, &["--after", "fib"]);
    let (from, to) = ((before_fib + 1000).to_string(), (before_fib + 21000).to_string());
    let part = &["--from", from.as_str(), "--to", to.as_str()][..];
    let t = total(&trace, part);
    assert!((19_990..=20_010).contains(&t), "{t}: blocks starting in a range of 20000");
    assert_eq!(folded_total(&trace, part), t);
    // The callgrind export's summary and annotate's self count of fib are the report's.
    let mut args = vec!["export", trace.to_str().unwrap(), "-f", "callgrind"];
    args.extend(part);
    let o = itrace(&args);
    o.assert_success();
    let summary = o.stdout.lines().find_map(|l| l.strip_prefix("summary: ")).expect("a summary line");
    assert_eq!(summary.trim().parse::<u64>().unwrap(), t);
    let mut args = vec!["annotate", trace.to_str().unwrap(), "fib", "--json"];
    args.extend(part);
    let o = itrace(&args);
    o.assert_success();
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["total_instructions"].as_u64().unwrap(), t);
    assert_eq!(v["functions"][0]["self"], function(&trace, part, "fib")["self"]);

    // A range of time: the same in every view, and less than the whole trace. (Which blocks
    // fall in it depends on the run's timing, so only the views' agreement is checked.)
    let span = itrace(["info", trace.to_str().unwrap()]);
    let line = span.stdout.lines().find(|l| l.starts_with("time span:")).expect("info says the time span");
    // `time span: S s (records from A s to B s after the trace started)`
    let words: Vec<&str> = line.split_whitespace().collect();
    let (a, b): (f64, f64) = (words[6].parse().unwrap(), words[9].parse().unwrap());
    let mid = format!("{}us", ((a + b) / 2.0 * 1e6) as u64);
    let first_half = total(&trace, &["--to", &mid]);
    let second_half = total(&trace, &["--from", &mid]);
    assert_eq!(first_half + second_half, all, "--to {mid} and --from {mid} split the trace");
    assert_eq!(folded_total(&trace, &["--from", &mid]), second_half);

    // --after main: the start-up is left out; main's and fib_asm's counts are the same.
    let main_all = function(&trace, &[], "main");
    let main_after = function(&trace, &["--after", "main"], "main");
    assert_eq!(main_after["inclusive"], main_all["inclusive"]);
    assert_eq!(function(&trace, &["--after", "main"], "fib_asm")["self"], 17752);
    assert!(function(&trace, &["--after", "main"], "_dl_start").is_null(), "the dynamic linker's start-up is out");
    let after = total(&trace, &["--after", "main"]);
    let o = itrace(["report", trace.to_str().unwrap(), "--json", "--after", "main"]);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["range"], "after the first call of main");
    assert!(after < all);
    assert_eq!(folded_total(&trace, &["--after", "main"]), after);
    // The flow of the range starts with main, as if a trace started there, and what ran
    // after main returned (exit) follows it.
    let roots = flow(&trace, &["--after", "main", "--depth", "1"]);
    assert_eq!((roots[0].name.as_str(), roots[0].note.as_str()), ("main", "not seen called"));
    assert_eq!(roots[0].inclusive, main_all["inclusive"].as_u64().unwrap());
    assert_eq!(roots.iter().map(|c| c.inclusive).sum::<u64>(), after);
}

#[test]
fn bad_ranges_are_one_line_errors() {
    let trace = traced("bad", "count_loop", &[]);
    let t = trace.to_str().unwrap();
    let views: &[&[&str]] = &[
        &["report", t],
        &["replay", t],
        &["flamegraph", t],
        &["annotate", t, "_start"],
        &["export", t, "-f", "callgrind"],
        &["arc", t],
    ];
    for view in views {
        for (range, says) in [
            (&["--from", "5x"][..], "'5x' is not a place in a trace"),
            (&["--to=-3"], "is not a place in a trace"),
            (&["--from", "10", "--to", "5"], "the range is empty"),
            (&["--after", "no_such_function"], "no function named no_such_function"),
        ] {
            let mut args = view.to_vec();
            args.extend(range);
            let o = itrace(&args);
            let line = o.assert_clean_error();
            assert!(line.contains(says), "{args:?}: {line}");
        }
    }
}

/// Every call of `calls` (recursively) with its name.
fn each<'a>(calls: &'a [Call], out: &mut Vec<&'a Call>) {
    for c in calls {
        out.push(c);
        each(&c.children, out);
    }
}

/// The outermost calls of `name` (those with no call of `name` above them).
fn outermost<'a>(calls: &'a [Call], name: &str, out: &mut Vec<&'a Call>) {
    for c in calls {
        if c.name == name {
            out.push(c);
        } else {
            outermost(&c.children, name, out);
        }
    }
}

/// longjmp out of a recursion, a signal handler, calls through the PLT: the flow has as many
/// calls of each of the program's functions as the report (whose calls and inclusive counts
/// tests/calltree.rs checks against callgrind), and their outermost calls add up to its
/// inclusive instructions.
#[test]
fn longjmp_signals_and_plt_as_in_the_report() {
    for (name, functions) in [
        ("longjmp", &["lj_round", "lj_dive", "main"][..]),
        ("signal", &["sig_handler", "sig_compute", "main"]),
        ("pltcalls", &["main"]),
    ] {
        let trace = traced(name, name, &[]);
        let roots = flow(&trace, &[]);
        let mut all = Vec::new();
        each(&roots, &mut all);
        for f in functions {
            let row = function(&trace, &[], f);
            let lines = all.iter().filter(|c| c.name == *f).count() as u64;
            let not_seen_called = all.iter().filter(|c| c.name == *f && c.note == "not seen called").count() as u64;
            assert_eq!(lines - not_seen_called, row["calls"].as_u64().unwrap(), "{name}: calls of {f}");
            let mut outer = Vec::new();
            outermost(&roots, f, &mut outer);
            let inclusive: u64 = outer.iter().map(|c| c.inclusive).sum();
            assert_eq!(inclusive, row["inclusive"].as_u64().unwrap(), "{name}: inclusive of {f}");
        }
        if name == "signal" {
            assert!(all.iter().any(|c| c.name == "sig_handler" && c.note == "signal handler"));
        }
    }
}

/// Threads: `--tid T` shows T's calls alone, and its outermost calls add up to T's
/// instructions in the report's thread table (the main thread and four workers).
#[test]
fn each_thread_alone() {
    let trace = traced("threads", "threads", &[]);
    let o = itrace(["report", trace.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    let threads = v["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 5);
    for th in threads {
        let tid = th["tid"].as_u64().unwrap().to_string();
        let o = itrace(["replay", trace.to_str().unwrap(), "--tid", &tid, "--depth", "1"]);
        o.assert_success();
        let tag = format!("[{tid:>5}]");
        assert!(o.stdout.lines().skip(1).all(|l| l.contains(&tag)), "only thread {tid}: {}", o.stdout);
        let roots = parse_flow(&o.stdout);
        assert_eq!(
            roots.iter().map(|c| c.inclusive).sum::<u64>(),
            th["instructions"].as_u64().unwrap(),
            "thread {tid}"
        );
    }
}
