//! The native s390x recorder (`arch/src/backend/ptrace/s390x/`), checked on traces made in a
//! booted s390x guest (qemu-system-s390x 10, TCG) by `s390x-guest/test-in-guest.sh`, which runs
//! these tests with `--ignored` and `ITRACE_S390X_GUEST_OUT` naming the directory of the guest's
//! traces (`NAME.itr`), its reports (`NAME.json`, made in the guest, where the program files
//! are) and the programs it ran (in the guest at `/t/NAME`).
//!
//! Oracles: qemu-s390x's single-step log of the same program in an empty environment (`env -i
//! qemu-s390x -singlestep -d nochain,exec`), the cross objdump and nm, and the hand counts in
//! tests/programs/cross/s390x.S. Static glibc's start-up reads the auxiliary vector, which
//! qemu-user gives otherwise than the kernel, so glibc programs are compared with qemu's log in
//! their own functions only, and checked whole for consistency with their code: each block
//! starts where the previous one's branch went, and its count is the objdump path to its branch.

use itrace_tests::CrossInsn;
use itrace_tests::{
    add_missing_insns, arc_text, compare_cross_blocks, cross_code_symbols, cross_function_counts, cross_hand_count,
    cross_objdump, cross_oracle_blocks, cross_qemu_pcs, itrace, itrace_blocks, CrossBlock,
};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

const ARCH: &str = "s390x";
const WHY: &str = "needs the guest's traces: run s390x-guest/test-in-guest.sh";

/// A file the guest run left (trace, report or program).
fn guest_file(name: &str) -> PathBuf {
    let dir = std::env::var_os("ITRACE_S390X_GUEST_OUT")
        .unwrap_or_else(|| panic!("ITRACE_S390X_GUEST_OUT is not set: {WHY}"));
    let p = PathBuf::from(dir).join(name);
    assert!(p.exists(), "{} is missing: the guest did not record it (see its console log)", p.display());
    p
}

/// The guest's `itrace report --json` of trace NAME.
fn guest_report(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(guest_file(&format!("{name}.json"))).expect("read the guest's report");
    serde_json::from_str(&text).expect("the guest's report is JSON")
}

/// Self instructions per function of the guest's program `/t/PROGRAM` in a guest report.
fn guest_self_counts(report: &serde_json::Value, program: &str) -> HashMap<String, u64> {
    itrace_tests::report_self_counts(report, std::path::Path::new(&format!("/t/{program}")))
}

/// The trace was recorded by block steps: the start-up probe chose them in the guest.
fn assert_block_steps(name: &str) {
    let trace = guest_file(&format!("{name}.itr"));
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    let header = dump.stdout.lines().next().unwrap_or("").to_string();
    assert!(header.contains("arch=s390x"), "{name}: trace header {header}");
    assert!(header.contains("step=ptrace-singleblock "), "{name}: want block steps in the trace header: {header}");
}

/// A cross program's instructions (objdump, and those only qemu's log shows) and qemu's
/// single-step log of it (its pcs).
fn qemu_run(bin: &std::path::Path) -> (BTreeMap<u64, CrossInsn>, Vec<u64>) {
    let mut insns = cross_objdump(ARCH, bin);
    let pcs = cross_qemu_pcs(ARCH, bin);
    add_missing_insns(ARCH, bin, &pcs, &mut insns);
    (insns, pcs)
}

#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn asm_program_equals_qemu_and_the_hand_count() {
    let bin = guest_file("s390x-asm");
    let (insns, pcs) = qemu_run(&bin);
    let (want, want_total) = cross_oracle_blocks(ARCH, &pcs, &insns);
    let trace = guest_file("asm.itr");
    let (got, total) = itrace_blocks(&trace);
    compare_cross_blocks("native asm", &got, &want);
    assert_eq!(total, want_total, "native asm: instructions, itrace against qemu's log");
    assert_eq!((total, got.len()), cross_hand_count(ARCH), "native asm: the hand count");
    assert_block_steps("asm");
    // The write system call is named after s390x's numbers, here on x86_64.
    let arc = arc_text(&trace);
    assert!(arc.contains("sys_write:[kernel]"), "no sys_write line in\n{arc}");
}

/// The user blocks of a trace, in order, with where tracing (re)started before each: (start,
/// block). A block's start is the previous block's destination, or a trace-on's pc.
fn blocks_with_starts(trace: &std::path::Path) -> Vec<(u64, CrossBlock)> {
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    let mut out = Vec::new();
    let mut start: Option<u64> = None;
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    for line in dump.stdout.lines() {
        if line.contains("TraceOn(") {
            start = line
                .split("pc: ")
                .nth(1)
                .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
                .map(|s| s.parse().unwrap());
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 12 || !f[1].starts_with("cpu") || (f[3] != "U" && f[3] != "K") {
            continue;
        }
        let (from, to) = (hex(f[7]), hex(f[9]));
        let n: u64 = f[11].trim_start_matches("n=").parse().unwrap();
        if f[3] == "K" {
            // The kernel's return: where the next block starts.
            start = Some(to);
            continue;
        }
        if let Some(s) = start {
            out.push((s, CrossBlock { from, to, count: n, kind: if f[4] == "Intrpt" { "Intrpt" } else { "branch" } }));
        }
        start = Some(to);
    }
    out
}

/// Static glibc, whole: every block starts where the previous one went, runs the objdump path
/// from there to its branch (the count) with no `svc` on the way (each system call has its
/// records), and that branch is a branch or `svc`. The program's own functions as qemu ran them, block for block.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn static_glibc_consistent_and_own_code_equals_qemu() {
    let bin = guest_file("s390x-libc");
    let (insns, pcs) = qemu_run(&bin);
    assert_block_steps("libc");
    let trace = guest_file("libc.itr");
    let blocks = blocks_with_starts(&trace);
    assert!(blocks.len() > 500, "only {} blocks", blocks.len());
    let mut checked = 0;
    for (k, (start, b)) in blocks.iter().enumerate() {
        let (Some(_), true) = (insns.get(start), insns.contains_key(&b.from)) else {
            continue; // the vDSO: not in the program's file
        };
        let mut pc = *start;
        let mut n = 0;
        while pc != b.from {
            let i = insns.get(&pc).unwrap_or_else(|| {
                panic!("block {k}: no instruction at {pc:#x} on the path from {start:#x} to {:#x}", b.from)
            });
            // Every system call ends its own block (its records): none is run through unseen.
            assert!(
                !i.mnemonic.starts_with("svc"),
                "block {k} ({start:#x} to {:#x}) runs through the svc at {pc:#x} without its records",
                b.from
            );
            pc += i.len;
            n += 1;
            assert!(
                n <= b.count,
                "block {k} ({start:#x} to {:#x}): the path is longer than its count {}",
                b.from,
                b.count
            );
        }
        assert_eq!(n + 1, b.count, "block {k}: {start:#x} to the branch at {:#x}", b.from);
        let m = &insns[&b.from].mnemonic;
        let branchy = m.starts_with('b')
            || m.starts_with('j')
            || m.starts_with("svc")
            || m.starts_with("br")
            || m.contains("rj")
            || m.contains("ij")
            || m.starts_with("ex");
        assert!(branchy, "block {k} ends at {:#x}, a {m}: not a branch", b.from);
        checked += 1;
    }
    assert!(checked > 500, "only {checked} blocks in the program's code");
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    same_blocks_in("libc", "s390x-libc", &pcs, &insns, &names, &names);
}

/// The guest's trace NAME of `/t/PROGRAM` against qemu's log `pcs`: the blocks ending in the
/// functions `names`, block for block, and the self instructions of `counted` (which qemu must
/// have run) in the guest's report. Returns the report's self counts.
fn same_blocks_in(
    name: &str,
    program: &str,
    pcs: &[u64],
    insns: &BTreeMap<u64, CrossInsn>,
    names: &[&str],
    counted: &[&str],
) -> HashMap<String, u64> {
    let bin = guest_file(program);
    let (want, _) = cross_oracle_blocks(ARCH, pcs, insns);
    let (got, _) = itrace_blocks(&guest_file(&format!("{name}.itr")));
    let ranges = function_ranges(&bin, names);
    let inside = |b: &&CrossBlock| ranges.iter().any(|&(lo, hi)| b.from >= lo && b.from < hi);
    let got_in: Vec<CrossBlock> = got.iter().filter(inside).cloned().collect();
    let want_in: Vec<CrossBlock> = want.iter().filter(inside).cloned().collect();
    assert!(want_in.len() > 10, "qemu ran few blocks of {names:?}: {want_in:?}");
    compare_cross_blocks(&format!("native {name}, the blocks of {names:?}"), &got_in, &want_in);
    let want = cross_function_counts(ARCH, &bin, pcs, counted);
    let got = guest_self_counts(&guest_report(name), program);
    for n in counted {
        assert!(want.get(*n).is_some_and(|&c| c > 0), "qemu never ran {n}");
        assert_eq!(got.get(*n), want.get(*n), "native {name}: self instructions of {n}");
    }
    got
}

/// [start, end) of the named functions of a cross binary (to the next code symbol).
fn function_ranges(bin: &std::path::Path, names: &[&str]) -> Vec<(u64, u64)> {
    let syms = cross_code_symbols(ARCH, bin);
    syms.iter()
        .enumerate()
        .filter(|(_, (_, n))| names.contains(&n.as_str()))
        .map(|(i, &(a, _))| (a, syms.get(i + 1).map(|s| s.0).unwrap_or(u64::MAX)))
        .collect()
}

/// The three modes on the same program: continuous (segments written as it goes) records what
/// normal mode does, function for function; wrap with a 4K buffer keeps only the end, and says
/// what it lost.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn modes_continuous_and_wrap() {
    let normal = guest_report("libc");
    let continuous = guest_report("continuous");
    assert_eq!(continuous["lost_records"].as_u64(), Some(0), "continuous mode lost records: {continuous:#}");
    let (n, c) = (guest_self_counts(&normal, "s390x-libc"), guest_self_counts(&continuous, "s390x-libc"));
    assert!(n.len() > 20, "only {} functions in the normal run", n.len());
    assert_eq!(n, c, "continuous against normal, self instructions per function");
    let wrap = guest_report("wrap");
    let lost = wrap["lost_records"].as_u64().or_else(|| wrap["lost"].as_u64()).unwrap_or(0);
    assert!(lost > 0, "wrap mode with a 4K buffer lost nothing: {wrap:#}");
}

/// Three raise(SIGUSR1): three deliveries to the handler's first instruction, and the handler's
/// and main's instructions as qemu ran them.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn signal_handler() {
    assert_block_steps("signal");
    let bin = guest_file("s390x-signal");
    let pcs = cross_qemu_pcs(ARCH, &bin);
    let names = ["main", "on_usr1"];
    let want = cross_function_counts(ARCH, &bin, &pcs, &names);
    let got = guest_self_counts(&guest_report("signal"), "s390x-signal");
    for n in names {
        assert!(want.get(n).is_some_and(|&c| c > 0), "qemu never ran {n}");
        assert_eq!(got.get(n), want.get(n), "self instructions of {n}");
    }
    let handler = cross_code_symbols(ARCH, &bin).into_iter().find(|(_, n)| n == "on_usr1").expect("on_usr1").0;
    let dump = itrace(["dump".as_ref(), guest_file("signal.itr").as_os_str()]);
    let deliveries: Vec<&str> = dump.stdout.lines().filter(|l| l.contains(" K Iret flags=2 ")).collect();
    assert_eq!(deliveries.len(), 3, "signal deliveries in\n{}", dump.stdout);
    for d in deliveries {
        // s390x Linux enters the handler itself (r14 the vDSO's sigreturn trampoline).
        assert!(d.contains(" aux=10 "), "not SIGUSR1: {d}");
        assert!(d.contains(&format!("-> {handler:#x} ")), "not to on_usr1 ({handler:#x}): {d}");
    }
}

/// Instructions per named function in a pc sequence, every pc counted (two threads logged one
/// after the other can be at the same pc).
fn counts_every_pc(bin: &std::path::Path, pcs: &[u64], names: &[&str]) -> HashMap<String, u64> {
    let syms = cross_code_symbols(ARCH, bin);
    let mut counts = HashMap::new();
    for &pc in pcs {
        let i = syms.partition_point(|s| s.0 <= pc);
        if i > 0 && names.contains(&syms[i - 1].1.as_str()) {
            *counts.entry(syms[i - 1].1.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// Four threads: five traced, each worker's computation counted as qemu ran it.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn threads() {
    let bin = guest_file("threads");
    let pcs = cross_qemu_pcs(ARCH, &bin);
    let names = ["thr_compute"];
    let want = counts_every_pc(&bin, &pcs, &names);
    let report = guest_report("threads");
    let got = guest_self_counts(&report, "threads");
    for n in names {
        assert_eq!(got.get(n), want.get(n), "self instructions of {n}");
    }
    let tids = itrace_tests::report_thread_ids(&report, "tid");
    assert_eq!(tids.len(), 5, "threads in the report: {tids:?}");
}

/// fork and exec, followed (-f): two processes, the work of each traced.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn fork_and_exec() {
    let report = guest_report("forkexec");
    let pids = itrace_tests::report_thread_ids(&report, "pid");
    assert_eq!(pids.len(), 2, "processes in the report: {pids:?}");
    let got = guest_self_counts(&report, "forkexec");
    for n in ["fe_parent_work", "fe_child_work", "fe_exec_work"] {
        assert!(got.get(n).is_some_and(|&c| c > 0), "{n} not traced: {got:?}");
    }
}

/// Attached to a running program for a second: what ran is its loop, nothing else (the
/// program has no other code), and the trace says the tracing began with an attach.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn attach() {
    let report = guest_report("attach");
    let modules = report["modules"].as_array().expect("modules");
    assert_eq!(modules.len(), 1, "modules: {modules:?}");
    assert_eq!(modules[0]["module"], "/t/s390x-loop", "modules: {modules:?}");
    assert!(modules[0]["self"].as_u64().unwrap_or(0) > 100, "modules: {modules:?}");
    let dump = itrace(["dump".as_ref(), guest_file("attach.itr").as_os_str()]);
    assert!(
        dump.stdout.contains("reason: Attach"),
        "no trace-on by attach in\n{}",
        &dump.stdout[..2000.min(dump.stdout.len())]
    );
}

/// Region tracing (`--start sum_list --stop printf`, `0x0001` breakpoints): the trace is qemu's
/// log from sum_list's first instruction to printf's first, for the program's own code block
/// for block, with the self counts of the functions run inside; fib, run before, is not in it.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn region_start_stop() {
    let bin = guest_file("s390x-libc");
    let (insns, pcs) = qemu_run(&bin);
    let sum_list = function_ranges(&bin, &["sum_list"])[0];
    let printf = function_ranges(&bin, &["printf"])[0].0;
    let first = pcs.iter().position(|&pc| pc >= sum_list.0 && pc < sum_list.1).expect("qemu ran sum_list");
    let last = first + pcs[first..].iter().position(|&pc| pc == printf).expect("qemu ran printf");
    let region = &pcs[first..=last];
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    let got = same_blocks_in("region", "s390x-libc", region, &insns, &names, &["twice", "thrice", "sum_list"]);
    assert_eq!(got.get("fib"), None, "fib ran before the region: {got:?}");
}

/// `--region` on tests/programs/region.c (ITraceOn, a nested pair, ITraceEnabled, system calls
/// inside), its libitrace entry points carried out by itrace: its rg_* functions run only inside
/// the region and rg_untraced_* only outside. (The guest checks what ITraceEnabled returned.)
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn region_itraceon_itraceoff() {
    let (insns, pcs) = qemu_run(&guest_file("region"));
    let names = ["rg_work", "rg_leaf", "rg_nested"];
    let got = same_blocks_in("itraceon", "region", &pcs, &insns, &names, &names);
    assert_eq!(got.get("rg_untraced_sum"), None, "rg_untraced_sum ran outside the region: {got:?}");
}
