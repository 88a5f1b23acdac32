//! Region tracing (`--region` with ITraceOn/ITraceOff from libitrace, and
//! `--start`/`--stop` on plain programs) on the ptrace backend. The region's
//! functions are called only inside regions, so callgrind's self counts of a
//! whole run are the truth for them; functions called only outside must be
//! absent, and so must the library's own code.

use itrace_tests::{
    arc_lines, arc_text, callgrind_profile, checked_arc, itrace, objdump_insns, program, record, report_calls,
    report_json, report_self_counts, require_tool, run, test_dir, trailing_comments, wait_with_guard, KillOnDrop,
    Output, Symbols,
};
use std::collections::HashMap;

/// Records `name` with `options`, checks it ran, and returns the report and the arc text.
fn trace(name: &str, options: &[&str]) -> (serde_json::Value, String, Output) {
    let bin = program(name);
    let dir = test_dir(&format!("region-{name}{}", options.join("").replace('-', "")));
    let trace = dir.join("t.itr");
    let rec = record(&trace, options, &bin, &[]);
    let report = report_json(&trace);
    let (text, _) = checked_arc(&trace, &dir.join("t.arc"));
    (report, text, rec)
}

/// The self counts of `funcs` equal callgrind's.
fn same_as_callgrind(name: &str, report: &serde_json::Value, funcs: &[&str]) -> HashMap<String, u64> {
    let bin = program(name);
    let traced = report_self_counts(report, &bin);
    let oracle = callgrind_profile(&bin, &[], false).self_counts_in(&bin);
    for f in funcs {
        assert!(oracle.get(*f).copied().unwrap_or(0) > 0, "oracle: callgrind has nothing for {f}");
        assert_eq!(traced.get(*f), oracle.get(*f), "{name}: self instructions of {f} (itrace, callgrind)");
    }
    traced
}

/// No function of libitrace, and none of `absent`, in the trace.
fn nothing_else(report: &serde_json::Value, absent: &[&str]) {
    for f in report["functions"].as_array().unwrap() {
        let (name, module) = (f["name"].as_str().unwrap(), f["module"].as_str().unwrap());
        // (A call into such a function from inside a region counts as a call, with no
        // instructions: a call through the PLT is a call to ITraceOff, not to its stub.)
        let ran = f["self"].as_u64().unwrap_or(0) > 0;
        assert!(!(module.contains("libitrace") && ran), "the library's own code is in the trace: {f}");
        assert!(!(absent.contains(&name) && ran), "{name} runs only outside regions but is in the trace: {f}");
    }
}

fn nested_regions_with_system_calls(backend: &str) {
    let (report, text, rec) = trace("region", &["--region", "--backend", backend]);
    rec.assert_success();
    // ITraceEnabled: answered by the tracer inside the region, 0 outside.
    assert!(rec.stdout.contains("enabled before 0 inside 1 after 0"), "program output: {}", rec.stdout);
    same_as_callgrind("region", &report, &["rg_work", "rg_leaf", "rg_nested"]);
    nothing_else(&report, &["rg_untraced_sum"]);
    // The region spans write and nanosleep.
    let kernel: Vec<String> = arc_lines(&text).iter().filter(|l| l.kernel).map(|l| l.symbol.clone()).collect();
    assert!(kernel.iter().any(|s| s == "sys_write"), "no write in the region: {kernel:?}");
    assert!(kernel.iter().any(|s| s.contains("nanosleep")), "no nanosleep in the region: {kernel:?}");
    // One region: it ends once, at the outer ITraceOff.
    let ends = text.lines().filter(|l| l.starts_with("# end of trace") && l.contains("region ended")).count();
    assert_eq!(ends, 1, "region ends in:\n{}", trailing_comments(&text).join("\n"));
}

fn regions_in_two_threads_at_once(backend: &str) {
    let (report, _, rec) = trace("region_threads", &["--region", "--backend", backend]);
    rec.assert_success();
    same_as_callgrind("region_threads", &report, &["rt_work"]);
    nothing_else(&report, &["rt_untraced", "main"]);
    let threads = report["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 2, "the two region threads, not main: {threads:?}");
}

fn fork_inside_a_region(backend: &str) {
    let (report, _, rec) = trace("region_fork", &["--region", "--backend", backend]);
    rec.assert_success();
    assert!(rec.stdout.contains("region_fork: child ok"), "the child did not run normally: {}", rec.stdout);
    same_as_callgrind("region_fork", &report, &["rf_parent_work"]);
    // The child is not followed (no --follow-forks).
    nothing_else(&report, &["rf_child_work"]);
}

fn region_ending_in_sigsegv(backend: &str) {
    let (report, text, rec) = trace("region_segv", &["--region", "--backend", backend]);
    assert!(rec.stdout.contains("about to crash"), "{}", rec.stdout);
    // The store is rs_store's first instruction: the last block is the call into it, and the
    // end comment names the faulting instruction.
    let lines = arc_lines(&text);
    let last = lines.iter().rev().find(|l| !l.kernel).expect("no user blocks");
    assert_eq!((last.symbol.as_str(), last.type_str.as_str()), ("rs_outer", "CALL"), "the last block calls rs_store");
    let crash = objdump_insns(&program("region_segv"));
    let store = Symbols::of(&program("region_segv")).by_name("rs_store").expect("rs_store").addr;
    assert!(crash.get(&store).is_some_and(|i| i.text.contains("movl")), "rs_store should start with the store");
    assert!(
        text.contains("killed by SIGSEGV at rs_store+0x0:"),
        "no crash comment naming rs_store:\n{}",
        trailing_comments(&text).join("\n")
    );
    // callgrind cannot profile a crashing run: count rs_outer by hand from objdump, its
    // instructions up to and including the call to rs_store.
    let bin = program("region_segv");
    let outer = Symbols::of(&bin).by_name("rs_outer").expect("rs_outer").addr;
    let upto_call = crash
        .range(outer..)
        .position(|(_, i)| i.mnemonic == "call")
        .map(|n| n as u64 + 1)
        .expect("rs_outer calls rs_store");
    assert_eq!(report_self_counts(&report, &bin).get("rs_outer"), Some(&upto_call), "rs_outer (objdump count)");
}

fn program_with_its_own_sigtrap_handler(backend: &str) {
    let (report, _, rec) = trace("region_sigtrap", &["--region", "--backend", backend]);
    rec.assert_success();
    assert!(rec.stdout.contains("traps 2"), "the program's SIGTRAPs were not all delivered: {}", rec.stdout);
    same_as_callgrind("region_sigtrap", &report, &["rq_work"]);
}

#[test]
fn start_and_stop_symbols_without_the_library() {
    let (report, text, rec) = trace("startstop", &["--start", "ss_target", "--stop", "ss_marker"]);
    rec.assert_success();
    // Two traced stretches: ss_target's entry to ss_marker's entry, twice.
    same_as_callgrind("startstop", &report, &["ss_target", "ss_after"]);
    nothing_else(&report, &["ss_before", "ss_between", "ss_marker"]);
    let calls = report_calls(&report, &program("startstop"));
    assert_eq!(calls.get("ss_after"), Some(&2));
    let ends = text.lines().filter(|l| l.contains("region ended")).count();
    assert_eq!(ends, 2);
}

#[test]
fn region_without_the_library_is_a_clear_error() {
    let bin = program("loops");
    let dir = test_dir("region-nolib");
    let out = record(&dir.join("t.itr"), &["--region"], &bin, &[]);
    let line = out.assert_clean_error();
    assert!(line.contains("libitrace"), "the error should say what to link: {line}");
    let out = record(&dir.join("t2.itr"), &["--start", "no_such_function"], &bin, &[]);
    let line = out.assert_clean_error();
    assert!(line.contains("no_such_function"), "{line}");
}

fn sigtrap_handler_installed_and_blocked_inside_a_region(backend: &str) {
    let (report, _, rec) = trace("region_sigtrap2", &["--region", "--backend", backend]);
    rec.assert_success();
    assert!(rec.stdout.contains("traps 1 "), "the program's SIGTRAP was lost or doubled: {}", rec.stdout);
    same_as_callgrind("region_sigtrap2", &report, &["rq2_work"]);
}

// Each scenario on both backends: ptrace stepping (breakpoints on the library's entry points)
// and the in-process recorder (the program steps itself).
macro_rules! both_backends {
    ($($name:ident),*) => {
        mod ptrace_backend {
            $(#[test] fn $name() { super::$name("ptrace") })*
        }
        mod inproc_backend {
            $(#[test] fn $name() { super::$name("inproc") })*
        }
    };
}
both_backends!(
    nested_regions_with_system_calls,
    regions_in_two_threads_at_once,
    fork_inside_a_region,
    region_ending_in_sigsegv,
    program_with_its_own_sigtrap_handler,
    sigtrap_handler_installed_and_blocked_inside_a_region
);

/// The two backends record the same branch sequence per thread for the same region (signal
/// handlers aside: the in-process recorder does not step them, see libitrace/src/inproc.rs).
#[test]
fn both_backends_record_the_same_branches() {
    for name in ["region", "region_threads", "region_fork", "region_segv"] {
        let per_thread = |backend: &str| {
            let (_, text, _) = trace(name, &["--region", "--backend", backend]);
            let mut seqs: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
            for l in arc_lines(&text) {
                let key = format!("{} {} {} {:x} {} {}", l.kernel, l.type_code, l.count, l.offset, l.symbol, l.line);
                seqs.entry(l.tid).or_default().push(key);
            }
            let mut v: Vec<Vec<String>> = seqs.into_values().collect();
            v.sort();
            v
        };
        let (a, b) = (per_thread("ptrace"), per_thread("inproc"));
        assert_eq!(a.len(), b.len(), "{name}: threads traced");
        for (ta, tb) in a.iter().zip(&b) {
            if let Some(i) = (0..ta.len().max(tb.len())).find(|&i| ta.get(i) != tb.get(i)) {
                panic!("{name}: block {i} differs: ptrace {:?} / inproc {:?}", ta.get(i), tb.get(i));
            }
        }
    }
}

/// `--region -p PID`: attach to a running program that uses the library; the regions it runs
/// while attached are traced, nothing else, and it finishes with the right result.
#[test]
fn attach_to_a_program_with_regions() {
    attach_with_regions("region-attach", &[]);
}

/// The same with the translating recorder (issue 29): ITraceOn/ITraceOff of the running
/// program move its thread into and out of the code cache; every whole region is exact
/// against callgrind's count per call.
#[test]
fn attach_to_a_program_with_regions_translated() {
    attach_with_regions("region-attach-translate", &["--backend", "translate"]);
}

fn attach_with_regions(dir_name: &str, options: &[&str]) {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let bin = program("region_loop");
    // 400 regions 10 ms apart, and 1.5 s attached: --duration counts from itrace's start, so a
    // loaded machine (start-up, the step probe) must still leave whole regions inside it.
    let reference = run(Command::new(&bin).args(["400", "0"]));
    reference.assert_success();
    let want = reference.stdout.lines().find(|l| l.contains("result=")).expect("result line").to_string();
    let child = Command::new(&bin).args(["400", "10000"]).stdout(Stdio::piped()).spawn().expect("start region_loop");
    let mut child = KillOnDrop(child);
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.contains("started"), "{first}");
    let dir = test_dir(dir_name);
    let trace = dir.join("t.itr");
    let pid = child.0.id().to_string();
    let mut args = vec!["record", "--region", "-p", &pid, "--duration", "1.5", "-o", trace.to_str().unwrap()];
    args.extend_from_slice(options);
    let rec = itrace(args);
    rec.assert_success();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = wait_with_guard(&mut child.0, "region_loop");
    assert!(status.success(), "region_loop exited with {status}");
    assert_eq!(rest.lines().find(|l| l.contains("result=")), Some(want.as_str()), "output:\n{rest}");
    let report = report_json(&trace);
    let own = report_self_counts(&report, &bin);
    // Regions run while attached are traced whole; the one running at detach may be cut short.
    let work = own.get("rl_work").copied().unwrap_or(0);
    let per_call = callgrind_profile(&bin, &["1", "0"], false).self_counts_in(&bin)["rl_work"];
    assert!(work >= per_call, "rl_work {work}: not even one whole region of {per_call} instructions");
    let text = arc_text(&trace);
    let whole = text.lines().filter(|l| l.contains("region ended")).count() as u64;
    // The region running at detach may also be whole, when the detach came at its ITraceOff
    // (its end is then written as the detach, not as `region ended`).
    assert!(work >= whole * per_call && work <= (whole + 1) * per_call, "rl_work {work} for {whole} whole regions");
    nothing_else(&report, &["rl_untraced"]);
}

/// The in-process recorder's rings in each collection mode, with buffers far smaller than
/// the trace: continuous loses nothing, normal stops where the buffer filled, wrap keeps the end.
#[test]
fn inproc_modes_with_small_buffers() {
    let bin = program("region_loop");
    let per_call = callgrind_profile(&bin, &["1", "0"], false).self_counts_in(&bin)["rl_work"];
    let run_mode = |mode: &str| {
        let opts = ["--region", "--backend", "inproc", "--mode", mode, "--buffer-size", "8K", "--segment-size", "4K"];
        let dir = test_dir(&format!("region-inproc-{mode}"));
        let trace = dir.join("t.itr");
        let rec = record(&trace, &opts, &bin, &["100", "0"]);
        rec.assert_success();
        assert!(rec.stdout.contains("result="), "{mode}: the program did not finish: {}", rec.stdout);
        let report = report_json(&trace);
        let work = report_self_counts(&report, &bin).get("rl_work").copied().unwrap_or(0);
        (work, report["lost_records"].as_u64().unwrap_or(0), arc_text(&trace))
    };
    let (work, lost, _) = run_mode("continuous");
    assert_eq!((work, lost), (100 * per_call, 0), "continuous: every region, nothing lost");
    let (work, _, text) = run_mode("normal");
    assert!(work > 0 && work < 100 * per_call, "normal: tracing stopped early ({work})");
    // The record the full buffer refused is one of the region's: rl_work's loop at every run
    // on an idle machine, but where the 8K fill up varies (a record's size depends on its
    // timestamp delta), and one fresh-clone run of the suite found no "full at rl_work": it may
    // be another of the region's records, main's call into rl_work or to ITraceOff, or
    // ITraceOff's PLT jump. Anything else fails, with where it was.
    let full_at = text.lines().find_map(|l| l.split_once("trace buffer full at ")).map(|(_, at)| at);
    let full_at = full_at.unwrap_or_else(|| panic!("normal: no buffer-full comment"));
    assert!(
        ["rl_work+", "main+", "ITraceOff"].iter().any(|f| full_at.starts_with(f)),
        "normal: the buffer filled outside the region: {full_at}"
    );
    let (work, lost, text) = run_mode("wrap");
    assert!(lost > 0 && work > 0 && work < 100 * per_call, "wrap: lost {lost}, rl_work {work}");
    let last_end = text.lines().rev().find(|l| l.starts_with("# end of trace")).unwrap_or("");
    // The run's last event in a region is the last ITraceOff: wrap mode kept it.
    assert!(last_end.contains("region ended at ITraceOff"), "wrap keeps the end of the run: {last_end}");
}

/// Normal mode, wherever the in-process recorder's ring fills (a sweep of ring sizes, in slots
/// of 48 bytes, over more than one region's worth of records, so that the refused record is in
/// turn every record of a region: its start, its branches, its end, the next region's start),
/// the arc says that the buffer filled and where, and the program runs on to its end. The
/// program and itrace are pinned to one CPU, so that one ring fills. Before the ring kept slots
/// for region starts and ends, a ring that filled at a region's start left no record of why
/// tracing stopped (a fresh-clone run of `inproc_modes_with_small_buffers` found no buffer-full
/// comment once).
#[test]
fn inproc_normal_mode_says_where_the_buffer_filled_wherever_it_fills() {
    let bin = program("region_loop");
    let per_call = callgrind_profile(&bin, &["1", "0"], false).self_counts_in(&bin)["rl_work"];
    let dir = test_dir("region-inproc-fill-sweep");
    // A region is about 55 records (rl_work's 50 loops and its calls); 64 sizes cover them all.
    for slots in 300..364usize {
        let trace = dir.join(format!("t{slots}.itr"));
        let size = (slots * 48).to_string();
        let mut cmd = std::process::Command::new(require_tool("taskset"));
        cmd.args(["-c", "0"]).arg(itrace_tests::itrace_bin()).arg("record").arg("-o").arg(&trace);
        cmd.args(["--region", "--backend", "inproc", "--mode", "normal", "--buffer-size", &size]);
        cmd.arg("--").arg(&bin).args(["20", "0"]);
        let rec = run(&mut cmd);
        rec.assert_success();
        assert!(rec.stdout.contains("result="), "{slots} slots: the program did not finish: {}", rec.stdout);
        let work = report_self_counts(&report_json(&trace), &bin).get("rl_work").copied().unwrap_or(0);
        assert!(work > 0 && work < 20 * per_call, "{slots} slots: tracing did not stop early ({work})");
        let text = arc_text(&trace);
        let fulls: Vec<&str> =
            text.lines().filter_map(|l| l.split_once("trace buffer full at ")).map(|(_, at)| at).collect();
        assert_eq!(fulls.len(), 1, "{slots} slots: one thread, one buffer-full end: {fulls:?}");
        assert!(
            ["rl_work+", "main+", "ITraceOff"].iter().any(|f| fulls[0].starts_with(f)),
            "{slots} slots: the buffer filled outside the region: {}",
            fulls[0]
        );
    }
}

/// exec inside a region ends it; the new image runs untraced and normally. A thread that exits
/// inside its region ends it (the in-process recorder stops at the raw rt_sigprocmask glibc makes
/// on the way out, which would otherwise kill the process). Both backends count the same.
#[test]
fn exec_and_thread_exit_inside_regions() {
    let count = |name: &str, backend: &str, func: &str| {
        let (report, text, rec) = trace(name, &["--region", "--backend", backend]);
        rec.assert_success();
        assert!(!rec.stderr.contains("killed"), "{name} ({backend}) was killed: {}", rec.stderr);
        assert!(text.contains("# end of trace"), "{name} ({backend}): no end of region");
        (report_self_counts(&report, &program(name)).get(func).copied().unwrap_or(0), rec.stdout.clone())
    };
    for backend in ["ptrace", "inproc"] {
        let (n, out) = count("region_exec", backend, "rx_before");
        assert!(out.contains("before exec 900") && out.contains("new image ok"), "region_exec ({backend}): {out}");
        assert!(n > 0, "region_exec ({backend}): rx_before not traced");
        let (m, out) = count("region_thread_exit", backend, "rte_work");
        assert!(out.starts_with("region_thread_exit: "), "region_thread_exit ({backend}): {out}");
        assert!(m > 0, "region_thread_exit ({backend}): rte_work not traced");
    }
    assert_eq!(count("region_exec", "ptrace", "rx_before").0, count("region_exec", "inproc", "rx_before").0);
    assert_eq!(
        count("region_thread_exit", "ptrace", "rte_work").0,
        count("region_thread_exit", "inproc", "rte_work").0
    );
}
