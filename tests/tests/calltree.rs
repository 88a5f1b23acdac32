//! `itrace report --tree/--callers/--callees/--tid/--module/--grep/--sort` and `itrace
//! annotate`, against hand counts and valgrind's callgrind.
//!
//! Hand counts: fib.c's `fib_asm` is written in assembly, so what each call of it runs is
//! known from its source (4 instructions for n < 2, 14 otherwise): the test walks
//! fib_asm(15)'s recursion itself to get the calls, self and inclusive instructions at each
//! depth of the call tree, the inclusive instructions of its recursive calls, and the
//! executions of each of its 16 instructions.
//!
//! callgrind: on a recursive program (fib), a longjmp out of a recursion (longjmp) and a
//! signal handler (signal), the calls and inclusive instructions per caller and callee of the
//! program's own functions are those of `callgrind_annotate --tree=caller --inclusive=yes`
//! on valgrind's run (`--separate-recs=1`: one function per recursion), and so are the
//! calls and inclusive instructions of each function summed over its call tree nodes. The
//! per-line counts of `itrace annotate` are callgrind_annotate's `--auto=yes` source
//! annotation.

use itrace_tests::{
    annotated_edges, callgrind_annotate, callgrind_profile_env, itrace, itrace_bin, pinned, program, report_json,
    require_tool, run, test_dir, valgrind_command,
};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Both runs with glibc's CPU-dependent choices pinned (tests/src/oracle/glibc_pin.rs) and
/// every PLT slot bound before main (see tests/views.rs).
const ENV: &[(&str, &str)] = &[("LD_BIND_NOW", "1")];

/// The program's own functions compared with callgrind (main is left out: printf's stdout
/// buffer allocation runs differently under valgrind, see tests/views.rs).
const CASES: &[(&str, &[&str])] =
    &[("fib", &["fib", "fib_asm"]), ("longjmp", &["lj_round", "lj_dive"]), ("signal", &["sig_handler", "sig_compute"])];

fn traced(test: &str, name: &str) -> PathBuf {
    let dir = test_dir(&format!("calltree-{test}-{name}"));
    let trace = dir.join("t.itr");
    let mut cmd = Command::new(itrace_bin());
    pinned(&mut cmd).envs(ENV.iter().copied()).arg("record").arg("-o").arg(&trace).arg("--").arg(program(name));
    run(&mut cmd).assert_success();
    trace
}

/// `itrace ARGS` (the trace first) with `--json`, parsed.
fn json(trace: &Path, args: &[&str], command: &str) -> Value {
    let mut all = vec![OsStr::new(command), trace.as_os_str(), OsStr::new("--json")];
    all.extend(args.iter().map(OsStr::new));
    let o = itrace(&all);
    o.assert_success();
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e})"))
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

fn name_in(v: &Value) -> &str {
    v["name"].as_str().unwrap_or_else(|| panic!("no name in {v}"))
}

/// fib_asm(n)'s recursion: per depth (0 = main's call), (calls, self instructions).
fn fib_asm_levels(n: i64, depth: usize, levels: &mut Vec<(u64, u64)>) {
    if levels.len() <= depth {
        levels.resize(depth + 1, (0, 0));
    }
    levels[depth].0 += 1;
    if n < 2 {
        levels[depth].1 += 4;
        return;
    }
    levels[depth].1 += 14;
    fib_asm_levels(n - 1, depth + 1, levels);
    fib_asm_levels(n - 2, depth + 1, levels);
}

/// Instructions of a call fib_asm(n), its own and those of the calls it makes.
fn fib_asm_inclusive(n: i64) -> u64 {
    if n < 2 {
        4
    } else {
        14 + fib_asm_inclusive(n - 1) + fib_asm_inclusive(n - 2)
    }
}

/// The inclusive instructions of every call fib_asm(n) makes, summed over its recursion.
fn fib_asm_recursive_inclusive(n: i64) -> u64 {
    if n < 2 {
        return 0;
    }
    fib_asm_inclusive(n - 1)
        + fib_asm_inclusive(n - 2)
        + fib_asm_recursive_inclusive(n - 1)
        + fib_asm_recursive_inclusive(n - 2)
}

/// Every node of the tree, depth first, with its path of names from a root.
fn nodes(tree: &Value) -> Vec<(Vec<String>, &Value)> {
    let mut out = Vec::new();
    let mut todo: Vec<(Vec<String>, &Value)> =
        tree.as_array().expect("tree array").iter().map(|n| (vec![name_in(n).to_string()], n)).collect();
    while let Some((path, n)) = todo.pop() {
        for c in n["children"].as_array().expect("children") {
            let mut p = path.clone();
            p.push(name_in(c).to_string());
            todo.push((p, c));
        }
        out.push((path, n));
    }
    out
}

#[test]
fn fib_asm_tree_and_call_graph_are_the_hand_counts() {
    let trace = traced("hand", "fib");
    let report = json(&trace, &["--tree", "--min-percent", "0"], "report");
    let all = nodes(&report["tree"]);
    let mains: Vec<&Value> =
        all.iter().filter(|(p, _)| p.last().map(String::as_str) == Some("main")).map(|(_, n)| *n).collect();
    assert_eq!(mains.len(), 1, "one main node");
    let mut levels = Vec::new();
    fib_asm_levels(15, 0, &mut levels);
    assert_eq!(levels.iter().map(|l| l.0).sum::<u64>(), 1973, "oracle: fib.c's header says 1973 calls");
    let mut node = mains[0]["children"].as_array().unwrap().iter().find(|c| name_in(c) == "fib_asm");
    for (depth, (calls, self_)) in levels.iter().enumerate() {
        let n = node.unwrap_or_else(|| panic!("no fib_asm node at depth {depth}"));
        let inclusive: u64 = levels[depth..].iter().map(|l| l.1).sum();
        assert_eq!(
            (u(n, "calls"), u(n, "self"), u(n, "inclusive")),
            (*calls, *self_, inclusive),
            "fib_asm at depth {depth}"
        );
        let children = n["children"].as_array().unwrap();
        assert!(children.iter().all(|c| name_in(c) == "fib_asm"), "fib_asm calls only itself: {children:?}");
        node = children.first();
    }
    assert!(node.is_none(), "deeper than fib_asm(15) goes");

    let graph = json(&trace, &["--callers", "fib_asm", "--callees", "fib_asm"], "report");
    let entries = graph["call_graph"].as_array().expect("call_graph");
    assert_eq!(entries.len(), 1, "{entries:?}");
    let e = &entries[0];
    assert_eq!((u(e, "calls"), u(e, "self"), u(e, "inclusive")), (1973, 17752, 17752));
    let pairs = |k: &str| -> BTreeMap<String, (u64, u64)> {
        e[k].as_array().unwrap().iter().map(|r| (name_in(r).to_string(), (u(r, "calls"), u(r, "inclusive")))).collect()
    };
    let recursive = (1972, fib_asm_recursive_inclusive(15));
    assert_eq!(
        pairs("callers"),
        BTreeMap::from([("main".to_string(), (1, 17752)), ("fib_asm".to_string(), recursive)])
    );
    assert_eq!(pairs("callees"), BTreeMap::from([("fib_asm".to_string(), recursive)]));
}

/// callgrind_annotate's caller edges of valgrind's run of `name`: (caller, callee) -> (calls, inclusive).
fn callgrind_edges(name: &str, dir: &Path) -> HashMap<(String, String), (u64, u64)> {
    let out = dir.join("valgrind.callgrind.out");
    let mut cmd = valgrind_command();
    cmd.envs(ENV.iter().copied())
        .args(["-q", "--tool=callgrind", "--skip-plt=no", "--separate-recs=1"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(program(name));
    run(&mut cmd).assert_success();
    annotated_edges(&callgrind_annotate(&out, &["--tree=caller", "--inclusive=yes"]))
}

#[test]
fn callers_callees_and_tree_match_callgrind() {
    let mut diffs = Vec::new();
    for (name, own) in CASES {
        let trace = traced("callgrind", name);
        let truth = callgrind_edges(name, trace.parent().unwrap());
        let mut compared = 0;
        for f in *own {
            let graph = json(&trace, &["--callers", f, "--callees", f], "report");
            let e = &graph["call_graph"][0];
            for (list, mine_is_caller) in [("callers", false), ("callees", true)] {
                for r in e[list].as_array().unwrap() {
                    let other = name_of(r);
                    if !own.contains(&other.as_str()) {
                        continue;
                    }
                    let key =
                        if mine_is_caller { (f.to_string(), other.clone()) } else { (other.clone(), f.to_string()) };
                    let want = truth.get(&key).copied().unwrap_or_default();
                    let got = (u(r, "calls"), u(r, "inclusive"));
                    if got != want {
                        diffs.push(format!("{name}: {} -> {}: itrace {got:?}, callgrind {want:?}", key.0, key.1));
                    }
                    compared += 1;
                }
            }
            // No call between own functions that callgrind sees is missing.
            for ((caller, callee), want) in &truth {
                if caller == f && own.contains(&callee.as_str()) {
                    let seen = e["callees"].as_array().unwrap().iter().any(|r| name_of(r) == *callee);
                    if !seen {
                        diffs
                            .push(format!("{name}: {caller} -> {callee}: callgrind {want:?}, not in itrace's callees"));
                    }
                }
            }
        }
        assert!(compared >= 1, "{name}: no calls between {own:?} compared");

        // The tree: a function's calls summed over its nodes, and its inclusive instructions
        // summed over its outermost nodes, are callgrind's.
        let report = json(&trace, &["--tree", "--min-percent", "0"], "report");
        let cg = callgrind_profile_env(&program(name), &[], ENV);
        for f in *own {
            let (mut cg_calls, cg_inclusive) = cg.calls_and_inclusive(&program(name), f);
            if *f == "sig_handler" {
                // callgrind sees no call instruction for a signal delivery; itrace counts each
                // as a call from its signal (signal.c raises SIGUSR1 3 times).
                cg_calls += 3;
            }
            let (mut calls, mut inclusive) = (0, 0);
            for (path, n) in nodes(&report["tree"]) {
                if path.last().map(String::as_str) != Some(*f) {
                    continue;
                }
                calls += u(n, "calls");
                if !path[..path.len() - 1].iter().any(|p| p == f) {
                    inclusive += u(n, "inclusive");
                }
            }
            if (calls, inclusive) != (cg_calls, cg_inclusive) {
                diffs.push(format!(
                    "{name}: {f}: tree calls {calls} inclusive {inclusive}, callgrind {cg_calls} {cg_inclusive}"
                ));
            }
        }
        if *name == "signal" {
            // The handler runs under its signal, a root of its own.
            let roots = report["tree"].as_array().unwrap();
            let signal = roots.iter().find(|r| name_in(r) == "signal_SIGUSR1").expect("a signal_SIGUSR1 root");
            let handler = &signal["children"][0];
            assert_eq!((name_in(handler), u(handler, "calls")), ("sig_handler", 3), "signal.c raises SIGUSR1 3 times");
        }
    }
    assert!(diffs.is_empty(), "differences:\n{}", diffs.join("\n"));
}

fn name_of(v: &Value) -> String {
    name_in(v).to_string()
}

/// `--tid`: each thread's report is its row of the whole report, and the per-thread function
/// counts add up to the whole report's; `--module`, `--grep` and `--sort` keep and order rows
/// as the test filters and sorts the whole report's, with the totals unchanged.
#[test]
fn thread_module_grep_and_sort() {
    let trace = traced("filters", "threads");
    let whole = report_json(&trace);
    let threads = whole["threads"].as_array().unwrap();
    assert!(threads.len() >= 5, "threads.c runs 5 threads and main");
    let mut summed: HashMap<(String, String), u64> = HashMap::new();
    for t in threads {
        let tid = u(t, "tid").to_string();
        let one = json(&trace, &["--tid", &tid], "report");
        assert_eq!(one["tid"].as_u64(), Some(u(t, "tid")));
        assert_eq!(u(&one, "total_instructions"), u(t, "instructions"), "thread {tid}'s total");
        assert_eq!(one["threads"].as_array().unwrap().len(), 1, "thread {tid} alone");
        for f in one["functions"].as_array().unwrap() {
            *summed.entry((name_of(f), f["module"].as_str().unwrap().to_string())).or_default() += u(f, "self");
        }
    }
    for f in whole["functions"].as_array().unwrap() {
        let key = (name_of(f), f["module"].as_str().unwrap().to_string());
        assert_eq!(summed.get(&key).copied().unwrap_or(0), u(f, "self"), "{key:?}: self over threads");
    }

    let filtered = json(&trace, &["--module", "threads", "--grep", "^thr_", "--sort", "name"], "report");
    assert_eq!(u(&filtered, "total_instructions"), u(&whole, "total_instructions"), "totals stay the trace's");
    let mut want: Vec<(String, u64)> = whole["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| name_in(f).starts_with("thr_") && f["module"].as_str().unwrap().ends_with("/threads"))
        .map(|f| (name_of(f), u(f, "self")))
        .collect();
    want.sort();
    let got: Vec<(String, u64)> =
        filtered["functions"].as_array().unwrap().iter().map(|f| (name_of(f), u(f, "self"))).collect();
    assert!(want.len() >= 2, "threads.c has thr_main and thr_compute: {want:?}");
    assert_eq!(got, want);

    let by_calls = json(&trace, &["--sort", "calls"], "report");
    let calls: Vec<u64> = by_calls["functions"].as_array().unwrap().iter().map(|f| u(f, "calls")).collect();
    assert!(calls.windows(2).all(|w| w[0] >= w[1]), "--sort calls: most first");
}

/// callgrind_annotate `--auto=yes`'s counts per line of the file ending in `/file`.
fn annotated_source(text: &str, file: &str) -> BTreeMap<u32, u64> {
    let mut counts = BTreeMap::new();
    let (mut inside, mut line) = (false, 0u32);
    for l in text.lines() {
        if let Some(path) = l.strip_prefix("-- Auto-annotated source: ") {
            inside = path.trim().ends_with(&format!("/{file}"));
            line = 0;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(rest) = l.strip_prefix("-- line ") {
            line = rest.split_whitespace().next().and_then(|n| n.parse().ok()).expect("-- line N");
            continue;
        }
        if l.starts_with("----") {
            if line > 0 {
                inside = false;
            }
            continue;
        }
        // A source line is never empty here (no cost is `.`): the blank line ends the file's lines.
        if line == 0 || l.trim().is_empty() {
            continue;
        }
        let t = l.trim_start();
        let (count, rest) = t.split_once(' ').unwrap_or((t, ""));
        let rest = rest.trim_start();
        let rest = match rest.strip_prefix('(') {
            Some(r) => r.split_once(')').map_or("", |(_, r)| r).trim_start(),
            None => rest,
        };
        if rest.starts_with("=>") {
            // A call's inclusive cost, not a line.
            continue;
        }
        if count != "." {
            let n: u64 = count.replace(',', "").parse().unwrap_or_else(|e| panic!("count in {l:?}: {e}"));
            counts.insert(line, n);
        }
        line += 1;
    }
    counts
}

#[test]
fn annotate_matches_callgrind_lines_and_hand_counts() {
    let mut diffs = Vec::new();
    for (name, source, func) in [("fib", "fib.c", "fib"), ("signal", "signal.c", "sig_compute")] {
        let trace = traced("annotate", name);
        let a = json(&trace, &[func, "--asm"], "annotate");
        let f = &a["functions"][0];
        let mine: BTreeMap<u32, u64> = f["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["file"].as_str().is_some_and(|p| p.ends_with(&format!("/{source}"))))
            .map(|l| (u(l, "line") as u32, u(l, "instructions")))
            .collect();
        assert!(mine.len() >= 3, "{name}: {func} ran on {mine:?}");

        let out = trace.with_file_name("valgrind.callgrind.out");
        let mut cmd = valgrind_command();
        cmd.envs(ENV.iter().copied())
            .args(["-q", "--tool=callgrind"])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(program(name));
        run(&mut cmd).assert_success();
        let truth = annotated_source(&callgrind_annotate(&out, &["--auto=yes"]), source);
        let (first, last) = (*mine.keys().next().unwrap(), *mine.keys().next_back().unwrap());
        let truth: BTreeMap<u32, u64> = truth.into_iter().filter(|(l, _)| (first..=last).contains(l)).collect();
        if mine != truth {
            diffs.push(format!("{name}: {func} per line: itrace {mine:?}, callgrind {truth:?}"));
        }

        // Every instruction's executions add up to the report's self count.
        let report = report_json(&trace);
        let row = report["functions"].as_array().unwrap().iter().find(|r| name_in(r) == func).expect("report row");
        let executions: u64 = f["instructions"].as_array().unwrap().iter().map(|i| u(i, "executions")).sum();
        assert_eq!((executions, u(f, "self"), u(f, "unplaced")), (u(row, "self"), u(row, "self"), 0), "{name}: {func}");
    }
    assert!(diffs.is_empty(), "differences:\n{}", diffs.join("\n"));

    // fib_asm's instructions, as fib.c writes them, and how often each runs: the test and
    // branch of every call, the internal calls' body 986 times, the leaves' 987.
    let trace = traced("annotate-asm", "fib");
    let a = json(&trace, &["fib_asm", "--asm"], "annotate");
    let insns: Vec<(String, u64)> = a["functions"][0]["instructions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let text = i["text"].as_str().unwrap();
            (text.split_whitespace().next().unwrap().to_string(), u(i, "executions"))
        })
        .collect();
    let mnemonics = [
        "cmp", "jl", "push", "push", "mov", "lea", "call", "mov", "lea", "call", "add", "pop", "pop", "ret", "mov",
        "ret",
    ];
    let want: Vec<(String, u64)> = mnemonics
        .iter()
        .enumerate()
        .map(|(i, m)| {
            (
                m.to_string(),
                if i < 2 {
                    1973
                } else if i < 14 {
                    986
                } else {
                    987
                },
            )
        })
        .collect();
    assert_eq!(insns, want);
    // Its conditional branch, `jl 1f`, is taken by the 987 leaf calls and falls through in
    // the 986 internal ones; no other instruction has branch counts; both calls are to itself.
    let all = a["functions"][0]["instructions"].as_array().unwrap();
    let branches: Vec<(&str, u64, u64)> = all
        .iter()
        .filter(|i| !i["taken"].is_null() || !i["not_taken"].is_null())
        .map(|i| (i["text"].as_str().unwrap(), u(i, "taken"), u(i, "not_taken")))
        .collect();
    assert_eq!(branches, [("jl fib_asm+0x26", 987, 986)]);
    let calls: Vec<&str> = all.iter().filter_map(|i| i["text"].as_str().filter(|t| t.starts_with("call"))).collect();
    assert_eq!(calls, ["call fib_asm", "call fib_asm"]);
}

/// count_loop.S's hand counts: `_start`'s loop runs its three instructions 1000 times and
/// its `jnz` branches back 999 times (not on the last iteration); `check`'s `je` is taken its
/// one time. The percentages are of the function's 3007 self instructions and the trace's
/// 3011; `--hot 30` keeps only the loop (1000 of 3007 is 33.26%, every other instruction 1).
#[test]
fn annotate_counts_branches_and_percentages_by_hand() {
    let trace = traced("annotate-branches", "count_loop");
    let a = json(&trace, &["_start", "--asm"], "annotate");
    let f = &a["functions"][0];
    assert_eq!((u(&a, "total_instructions"), u(f, "self")), (3011, 3007));
    let insns = f["instructions"].as_array().unwrap();
    let texts: Vec<&str> = insns.iter().map(|i| i["text"].as_str().unwrap()).collect();
    assert_eq!(
        texts,
        [
            "mov ecx, 0x3e8",
            "xor eax, eax",
            "add eax, ecx",
            "dec ecx",
            "jne _start+0x7",
            "mov edi, eax",
            "call check",
            "mov edi, eax",
            "mov eax, 0x3c",
            "syscall"
        ]
    );
    let jne = &insns[4];
    assert_eq!((u(jne, "executions"), u(jne, "taken"), u(jne, "not_taken")), (1000, 999, 1));
    assert_eq!(u(jne, "target"), u(&insns[2], "address"), "jnz goes back to the add");
    assert!(insns.iter().enumerate().all(|(k, i)| k == 4 || i["taken"].is_null()), "only jnz is conditional");

    let check = json(&trace, &["check", "--asm"], "annotate");
    let je = &check["functions"][0]["instructions"][2];
    assert_eq!(je["text"].as_str().unwrap().split_whitespace().next(), Some("je"));
    assert_eq!((u(je, "executions"), u(je, "taken"), u(je, "not_taken")), (1, 1, 0));

    // --hot 30: the loop's three instructions alone.
    let hot = json(&trace, &["_start", "--asm", "--hot", "30"], "annotate");
    let kept: Vec<(&str, u64)> = hot["functions"][0]["instructions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["text"].as_str().unwrap(), u(i, "executions")))
        .collect();
    assert_eq!(kept, [("add eax, ecx", 1000), ("dec ecx", 1000), ("jne _start+0x7", 1000)]);

    // The text: each count with its share of the function (%func) and of the trace (%all),
    // and the branch counts after the conditional branch.
    let o = itrace([OsStr::new("annotate"), trace.as_os_str(), OsStr::new("_start"), OsStr::new("--asm")]);
    o.assert_success();
    assert!(
        o.stdout.lines().next().unwrap().contains("%func is of the function's self instructions, %all of the trace's"),
        "{}",
        o.stdout
    );
    let line = o.stdout.lines().find(|l| l.contains("jne")).unwrap_or_else(|| panic!("{}", o.stdout));
    let words: Vec<&str> = line.split_whitespace().collect();
    // 1000 / 3007 = 33.256%.
    assert_eq!(&words[..2], ["1000", "33.26"], "{line}");
    assert!(line.ends_with("jne _start+0x7  [taken 999, not taken 1]"), "{line}");
    let source_row =
        o.stdout.lines().find(|l| l.trim_start().starts_with("3007 ")).unwrap_or_else(|| panic!("{}", o.stdout));
    // 3007 / 3007 and 3007 / 3011 = 99.867%.
    assert_eq!(&source_row.split_whitespace().collect::<Vec<_>>()[..3], ["3007", "100.00", "99.87"], "{source_row}");
}

/// objdump's name of each direct call and jump target (`call 1030 <printf@plt>`,
/// `jmp 1169 <tc_inner>`, `jl 115f <fib_asm+0x26>`) is annotate's, at the same offset in
/// the function, for every branch with a target that ran.
#[test]
fn annotate_names_targets_as_objdump() {
    require_tool("objdump");
    let mut named = 0;
    for (name, funcs) in [("fib", &["main", "fib", "fib_asm"][..]), ("tailcall", &["tc_mid", "tc_leaf", "main"][..])] {
        let bin = program(name);
        let o = Command::new("objdump").args(["-d", "--no-show-raw-insn"]).arg(&bin).output().expect("objdump");
        let listing = String::from_utf8_lossy(&o.stdout).into_owned();
        let trace = traced("annotate-targets", name);
        for func in funcs {
            // objdump's lines of the function: address -> (mnemonic, `<target>` when it names one).
            let header = format!("<{func}>:");
            let start_line = listing.lines().find(|l| l.ends_with(&header)).unwrap_or_else(|| panic!("{name}: {func}"));
            let start = u64::from_str_radix(start_line.split_whitespace().next().unwrap(), 16).unwrap();
            let mut theirs: BTreeMap<u64, String> = BTreeMap::new();
            for l in listing.lines().skip_while(|l| !l.ends_with(&header)).skip(1).take_while(|l| !l.trim().is_empty())
            {
                let Some((addr, insn)) = l.trim_start().split_once(":\t") else { continue };
                let addr = u64::from_str_radix(addr, 16).unwrap();
                if let (Some(open), true) = (insn.rfind('<'), insn.ends_with('>')) {
                    let mnemonic = insn.split_whitespace().next().unwrap();
                    if mnemonic.starts_with('j') || mnemonic.starts_with("call") {
                        theirs.insert(addr - start, insn[open + 1..insn.len() - 1].to_string());
                    }
                }
            }
            let a = json(&trace, &[func, "--asm"], "annotate");
            let mut mine: BTreeMap<u64, String> = BTreeMap::new();
            for i in a["functions"][0]["instructions"].as_array().unwrap() {
                if !i["target"].is_null() {
                    let text = i["text"].as_str().unwrap();
                    mine.insert(u(i, "offset"), text.rsplit(' ').next().unwrap().to_string());
                }
            }
            // objdump's branches of the instructions that ran (annotate lists only those).
            let ran: std::collections::HashSet<u64> =
                a["functions"][0]["instructions"].as_array().unwrap().iter().map(|i| u(i, "offset")).collect();
            theirs.retain(|off, _| ran.contains(off));
            assert!(!theirs.is_empty() || *func == "fib", "{name}: {func} has branches");
            assert_eq!(mine, theirs, "{name}: {func}: annotate's targets (by offset) vs objdump's");
            named += mine.len();
        }
    }
    assert!(named >= 8, "targets compared: {named}");
}

/// A missing function, thread or binary is a one-line error.
#[test]
fn bad_requests_are_one_line() {
    let trace = traced("bad", "fib");
    for args in [
        vec!["annotate", "no_such_function"],
        vec!["report", "--callers", "no_such_function"],
        vec!["report", "--tid", "1"],
        vec!["report", "--grep", "("],
    ] {
        let mut all: Vec<&OsStr> = vec![OsStr::new(args[0]), trace.as_os_str()];
        all.extend(args[1..].iter().map(OsStr::new));
        let err = itrace(&all).assert_clean_error();
        assert!(err.starts_with("itrace: "), "{args:?}: {err}");
    }
    // The binary gone: a copy traced, then removed.
    let dir = trace.parent().unwrap();
    let copy = dir.join("fib-copy");
    std::fs::copy(program("fib"), &copy).expect("copy fib");
    let t2 = dir.join("copy.itr");
    itrace([OsStr::new("record"), OsStr::new("-o"), t2.as_os_str(), copy.as_os_str()]).assert_success();
    std::fs::remove_file(&copy).expect("remove the copy");
    let err =
        itrace([OsStr::new("annotate"), t2.as_os_str(), OsStr::new("main"), OsStr::new("--asm")]).assert_clean_error();
    assert!(err.contains("fib-copy is missing") && err.contains("itrace archive"), "{err}");
}
