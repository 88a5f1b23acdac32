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

use itrace_tests::NativeGuest;
use itrace_tests::{
    arc_text, compare_cross_blocks, cross_code_symbols, cross_function_counts, cross_hand_count, cross_objdump,
    cross_oracle_blocks, cross_qemu_pcs, itrace, itrace_blocks, CrossBlock,
};
use std::collections::HashMap;
use std::path::PathBuf;

const ARCH: &str = "s390x";
const GUEST: NativeGuest =
    NativeGuest { arch: ARCH, env: "ITRACE_S390X_GUEST_OUT", script: "s390x-guest/test-in-guest.sh" };

/// A file the guest run left (trace, report or program).
fn guest_file(name: &str) -> PathBuf {
    GUEST.file(name)
}

/// The guest's `itrace report --json` of trace NAME.
fn guest_report(name: &str) -> serde_json::Value {
    GUEST.report(name)
}

/// Self instructions per function of the guest's program `/t/PROGRAM` in a guest report.
fn guest_self_counts(report: &serde_json::Value, program: &str) -> HashMap<String, u64> {
    GUEST.self_counts(report, program)
}

/// The trace was recorded by block steps: the start-up probe chose them in the guest.
fn assert_block_steps(name: &str) {
    let trace = guest_file(&format!("{name}.itr"));
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    let header = dump.stdout.lines().next().unwrap_or("").to_string();
    assert!(header.contains("arch=s390x"), "{name}: trace header {header}");
    assert!(header.contains("step=ptrace-singleblock "), "{name}: want block steps in the trace header: {header}");
}

#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn asm_program_equals_qemu_and_the_hand_count() {
    let bin = guest_file("s390x-asm");
    let (insns, pcs) = GUEST.qemu_run(&bin);
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

/// One user record of a trace with where its block started: the previous block's destination
/// in the same thread, or a trace-on's pc.
struct StartedBlock {
    start: u64,
    block: CrossBlock,
    /// A signal delivery: the instruction at `block.from` did not run.
    signal: bool,
}

/// The user blocks of a trace, in order, each thread followed on its own (the records of all
/// threads and processes interleave in the trace).
fn blocks_with_starts(trace: &std::path::Path) -> Vec<StartedBlock> {
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    let mut out = Vec::new();
    let mut starts: HashMap<u64, u64> = HashMap::new();
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split(name).nth(1).and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next()).and_then(|s| s.parse().ok())
    };
    for line in dump.stdout.lines() {
        if line.contains("TraceOn(") {
            if let (Some(tid), Some(pc)) = (field(line, "tid: "), field(line, "pc: ")) {
                starts.insert(tid, pc);
            }
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 12 || !f[1].starts_with("cpu") || (f[3] != "U" && f[3] != "K") {
            continue;
        }
        let (from, to) = (hex(f[7]), hex(f[9]));
        let tid: u64 = f[10].trim_start_matches("tid=").parse().unwrap();
        let n: u64 = f[11].trim_start_matches("n=").parse().unwrap();
        if f[3] == "K" {
            // The kernel's return: where the thread's next block starts.
            starts.insert(tid, to);
            continue;
        }
        if let Some(start) = starts.insert(tid, to) {
            let kind = if f[4] == "Intrpt" { "Intrpt" } else { "branch" };
            let signal = kind == "Intrpt" && f[5] == "flags=2";
            out.push(StartedBlock { start, block: CrossBlock { from, to, count: n, kind }, signal });
        }
    }
    out
}

/// Is this objdump mnemonic an execute instruction (two instructions run: itself and the one it
/// runs out of line)?
fn is_execute(mnemonic: &str) -> bool {
    matches!(mnemonic, "ex" | "exrl")
}

/// The guest's trace NAME of `/t/PROGRAM`, whole, against the program's code: every block (in
/// the program's file; the vDSO is not) starts where the previous one of its thread went, runs
/// the objdump path from there to its branch with no `svc` on the way (each system call has its
/// records), its count is that path's (an execute instruction counting two, the one it runs
/// included), and it ends in a branch, `svc` or execute instruction (of a branch); a signal
/// delivery ends a block before its instruction. Returns the number of blocks checked.
fn assert_consistent(name: &str, program: &str) -> usize {
    let bin = guest_file(program);
    let insns = cross_objdump(ARCH, &bin);
    let blocks = blocks_with_starts(&guest_file(&format!("{name}.itr")));
    let mut checked = 0;
    for (k, sb) in blocks.iter().enumerate() {
        let (start, b) = (sb.start, &sb.block);
        let (Some(_), true) = (insns.get(&start), insns.contains_key(&b.from)) else {
            continue; // the vDSO: not in the program's file
        };
        let mut pc = start;
        let mut n = 0;
        while pc != b.from {
            let i = insns.get(&pc).unwrap_or_else(|| {
                panic!("{name} block {k}: no instruction at {pc:#x} on the path from {start:#x} to {:#x}", b.from)
            });
            // Every system call ends its own block (its records): none is run through unseen.
            assert!(
                !i.mnemonic.starts_with("svc"),
                "{name} block {k} ({start:#x} to {:#x}) runs through the svc at {pc:#x} without its records",
                b.from
            );
            pc += i.len;
            n += if is_execute(&i.mnemonic) { 2 } else { 1 };
            assert!(
                n <= b.count,
                "{name} block {k} ({start:#x} to {:#x}): the path is longer than its count {}",
                b.from,
                b.count
            );
        }
        let m = &insns[&b.from].mnemonic;
        if sb.signal {
            assert_eq!(n, b.count, "{name} block {k}: {start:#x} to the signal delivery at {:#x}", b.from);
        } else {
            let last = if is_execute(m) { 2 } else { 1 };
            assert_eq!(n + last, b.count, "{name} block {k}: {start:#x} to the branch at {:#x}", b.from);
            let branchy = m.starts_with('b')
                || m.starts_with('j')
                || m.starts_with("svc")
                || m.contains("rj")
                || m.contains("ij")
                || m.contains("rb")
                || m.contains("ib")
                || is_execute(m);
            assert!(branchy, "{name} block {k} ends at {:#x}, a {m}: not a branch", b.from);
        }
        checked += 1;
    }
    checked
}

/// Static glibc, whole: consistent with its code (`assert_consistent`); the program's own
/// functions as qemu ran them, block for block.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn static_glibc_consistent_and_own_code_equals_qemu() {
    let bin = guest_file("s390x-libc");
    let (insns, pcs) = GUEST.qemu_run(&bin);
    assert_block_steps("libc");
    let checked = assert_consistent("libc", "s390x-libc");
    assert!(checked > 500, "only {checked} blocks in the program's code");
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    GUEST.same_blocks_in("libc", "s390x-libc", &pcs, &insns, &names, &names);
}

/// Execute instructions and compare-and-branch before system calls
/// (tests/programs/cross/s390x_ex.S): qemu's log block for block, and the hand count (59
/// instructions, 14 blocks: the `exrl` of `j` three times, of `jne` taken twice, `cijl` and
/// `brctg` taken, `brct` taken, a `j`, the `cijl` after an `exrl` that starts a block, three
/// system calls).
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn execute_and_compare_and_branch_equal_qemu_and_the_hand_count() {
    let bin = guest_file("s390x-ex");
    let (insns, pcs) = GUEST.qemu_run(&bin);
    let (want, want_total) = itrace_tests::cross_oracle_blocks_native(ARCH, &pcs, &insns);
    let trace = guest_file("ex.itr");
    let (got, total) = itrace_blocks(&trace);
    compare_cross_blocks("native ex", &got, &want);
    assert_eq!(total, want_total, "native ex: instructions, itrace against qemu's log");
    assert_eq!((total, got.len()), (59, 14), "native ex: the hand count");
    assert_block_steps("ex");
    let exrl_jumps = got.iter().filter(|b| insns[&b.from].mnemonic == "exrl").count();
    assert_eq!(exrl_jumps, 5, "branches taken at exrl addresses: {got:?}");
}

/// Every traced program, whole, consistent with its code (`assert_consistent`).
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn every_trace_consistent_with_the_code() {
    for (name, program) in [
        ("asm", "s390x-asm"),
        ("ex", "s390x-ex"),
        ("signal", "s390x-signal"),
        ("threads", "threads"),
        ("forkexec", "forkexec"),
        ("continuous", "s390x-libc"),
        ("region", "s390x-libc"),
        ("itraceon", "region"),
        ("restart", "restart"),
        ("attach", "s390x-loop"),
        ("attachsys", "restart"),
    ] {
        let checked = assert_consistent(name, program);
        assert!(checked > 5, "{name}: only {checked} blocks in the program's code");
    }
}

/// A read interrupted by SIGALRM handlers and restarted (SA_RESTART) until the third writes a
/// byte, a nanosleep ended by EINTR (tests/programs/restart.c; the guest checked what the program
/// saw): deliveries to the handler only, the interrupted reads' records and their restarts' (a
/// block after a handler's sigreturn starts on the `svc` again, counting it alone).
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn restarted_system_calls() {
    assert_block_steps("restart");
    let bin = guest_file("restart");
    let handler = cross_code_symbols(ARCH, &bin).into_iter().find(|(_, n)| n == "on_alarm").expect("on_alarm").0;
    let dump = itrace(["dump".as_ref(), guest_file("restart.itr").as_os_str()]);
    let deliveries: Vec<&str> = dump.stdout.lines().filter(|l| l.contains(" K Iret flags=2 ")).collect();
    assert!(
        deliveries.len() >= 4,
        "signal deliveries (three in the read, one or more in the sleep) in\n{}",
        dump.stdout
    );
    for d in &deliveries {
        assert!(d.contains(" aux=14 "), "not SIGALRM: {d}");
        assert!(d.contains(&format!("-> {handler:#x} ")), "not to on_alarm ({handler:#x}): {d}");
    }
    // read is system call 3 on s390x: interrupted at least twice, then to its end.
    let reads = dump.stdout.lines().filter(|l| l.contains(" U Intrpt flags=1 aux=3 ")).count();
    assert!(reads >= 3, "{reads} read records in\n{}", dump.stdout);
    let blocks = blocks_with_starts(&guest_file("restart.itr"));
    let restarted = blocks.iter().filter(|b| b.block.kind == "Intrpt" && b.start == b.block.from && b.block.count == 1);
    assert!(restarted.count() >= 2, "fewer than two blocks starting on their svc (restarts)");
}

/// Attached to a program sitting in a read (woken by a SIGALRM every 100 ms) for two seconds:
/// the trace begins on the read's `svc` (the kernel restarts the interrupted call there), holds
/// the handler's deliveries and the reads, and is consistent with the code; the guest checked
/// that the program sleeps on after the detach.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn attach_to_a_program_in_a_system_call() {
    let dump = itrace(["dump".as_ref(), guest_file("attachsys.itr").as_os_str()]);
    assert!(dump.stdout.contains("reason: Attach"), "no trace-on by attach");
    let insns = cross_objdump(ARCH, &guest_file("restart"));
    let first = blocks_with_starts(&guest_file("attachsys.itr"));
    let first = first.first().expect("blocks");
    let at = insns.get(&first.start).map(|i| i.mnemonic.clone()).unwrap_or_default();
    assert_eq!(at, "svc", "the trace begins at {:#x}, a {at}, not on the read's svc", first.start);
    let deliveries = dump.stdout.lines().filter(|l| l.contains(" K Iret flags=2 aux=14 ")).count();
    assert!(deliveries >= 5, "only {deliveries} SIGALRM deliveries in two seconds");
    let reads = dump.stdout.lines().filter(|l| l.contains(" U Intrpt flags=1 aux=3 ")).count();
    assert!(reads >= 5, "only {reads} read records in two seconds");
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

/// Four threads: five traced, each worker's computation counted as qemu ran it.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn threads() {
    GUEST.check_threads(&["thr_compute"]);
}

/// fork and exec, followed (-f): two processes, the work of each traced.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn fork_and_exec() {
    GUEST.check_fork_and_exec();
}

/// Attached to a running program for a second: what ran is its loop, nothing else (the
/// program has no other code), and the trace says the tracing began with an attach.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn attach() {
    GUEST.check_attach("s390x-loop");
}

/// Region tracing (`--start sum_list --stop printf`, `0x0001` breakpoints): the trace is qemu's
/// log from sum_list's first instruction to printf's first, for the program's own code block
/// for block, with the self counts of the functions run inside; fib, run before, is not in it.
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn region_start_stop() {
    let bin = guest_file("s390x-libc");
    let (insns, pcs) = GUEST.qemu_run(&bin);
    let sum_list = GUEST.function_ranges(&bin, &["sum_list"])[0];
    let printf = GUEST.function_ranges(&bin, &["printf"])[0].0;
    let first = pcs.iter().position(|&pc| pc >= sum_list.0 && pc < sum_list.1).expect("qemu ran sum_list");
    let last = first + pcs[first..].iter().position(|&pc| pc == printf).expect("qemu ran printf");
    let region = &pcs[first..=last];
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    let got = GUEST.same_blocks_in("region", "s390x-libc", region, &insns, &names, &["twice", "thrice", "sum_list"]);
    assert_eq!(got.get("fib"), None, "fib ran before the region: {got:?}");
}

/// `--region` on tests/programs/region.c (ITraceOn, a nested pair, ITraceEnabled, system calls
/// inside), its libitrace entry points carried out by itrace: its rg_* functions run only inside
/// the region and rg_untraced_* only outside. (The guest checks what ITraceEnabled returned.)
#[test]
#[ignore = "needs the guest's traces: run s390x-guest/test-in-guest.sh"]
fn region_itraceon_itraceoff() {
    GUEST.check_region_itraceon();
}
