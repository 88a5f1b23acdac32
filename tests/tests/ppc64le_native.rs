//! The native PowerPC64 recorder (`arch/src/backend/ptrace/ppc64/`), checked on traces made in a
//! booted ppc64le guest by `ppc64le-guest/test-in-guest.sh`, which runs these tests with
//! `--ignored` and `ITRACE_PPC64LE_GUEST_OUT` naming the directory of the guest's traces
//! (`NAME.itr`), its reports (`NAME.json`, made in the guest, where the program files are) and
//! the programs it ran (in the guest at `/t/NAME`).
//!
//! Oracles: qemu-ppc64le's single-step log of the same program in an empty environment (`env -i
//! qemu-ppc64le -singlestep -d nochain,exec`), the cross objdump and nm, and the hand counts in
//! tests/programs/cross/ppc64.S. itrace on this x86_64 machine reads the guest's traces
//! (`dump`, `arc`, `report`) as they are.

use itrace_tests::{
    add_missing_insns, arc_text, compare_cross_blocks, cross_code_symbols, cross_function_counts, cross_hand_count,
    cross_objdump, cross_oracle_blocks, cross_qemu_pcs, itrace, itrace_blocks, report_json, CrossBlock,
};
use itrace_tests::{CrossInsn, NativeGuest};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

const ARCH: &str = "ppc64le";
const GUEST: NativeGuest =
    NativeGuest { arch: ARCH, env: "ITRACE_PPC64LE_GUEST_OUT", script: "ppc64le-guest/test-in-guest.sh" };

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

/// The guest's trace against qemu's log, block for block (the trace is read by this machine's itrace).
fn check_blocks(name: &str, program: &str) -> (Vec<CrossBlock>, u64) {
    let bin = guest_file(program);
    let mut insns = cross_objdump(ARCH, &bin);
    let pcs = cross_qemu_pcs(ARCH, &bin);
    add_missing_insns(ARCH, &bin, &pcs, &mut insns);
    let (want, want_total) = cross_oracle_blocks(ARCH, &pcs, &insns);
    let trace = guest_file(&format!("{name}.itr"));
    let (got, total) = itrace_blocks(&trace);
    compare_cross_blocks(&format!("native {name}"), &got, &want);
    assert_eq!(total, want_total, "native {name}: instructions, itrace against qemu's log");
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    assert!(dump.stdout.lines().next().unwrap_or("").contains("arch=ppc64le"), "trace header: {}", dump.stdout);
    assert_step_method(name);
    (got, total)
}

/// The guest records each program twice: NAME with itrace's default step method, which must be
/// block steps there (the guest's POWER9 under QEMU has the branch trace), and NAME-step with
/// `--step instruction` (single steps). The trace header says which ran.
fn assert_step_method(name: &str) {
    let trace = guest_file(&format!("{name}.itr"));
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    let header = dump.stdout.lines().next().unwrap_or("").to_string();
    let want = if name.ends_with("-step") { "step=ptrace-singlestep " } else { "step=ptrace-singleblock " };
    assert!(header.contains(want), "{name}: want {want}in the trace header: {header}");
}

#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn asm_program_equals_qemu_and_the_hand_count() {
    for name in ["asm", "asm-step"] {
        let (got, total) = check_blocks(name, "ppc64le-asm");
        assert_eq!((total, got.len()), cross_hand_count(ARCH), "native {name}: the hand count");
        // The write system call is named after PowerPC's numbers, here on x86_64.
        let arc = arc_text(&guest_file(&format!("{name}.itr")));
        assert!(arc.contains("sys_write:[kernel]"), "no sys_write line in\n{arc}");
    }
}

/// Static glibc. Its start-up depends on what the kernel gives the process, which qemu-user
/// gives otherwise: the auxiliary vector's order (the first difference, in
/// `__libc_start_main`'s AT_HWCAP scan), the vDSO (qemu 7.2 has none for PowerPC: natively
/// `_dl_non_dynamic_init` looks up its symbols) and the pipe's st_blksize (64K pages here), so
/// whole traces cannot be equal. The program's own code must be, block for block: every block
/// ending in its functions, in order, with its instructions; and the trace went through glibc's
/// load-reserve/store-conditional sequences, whose runs to a breakpoint count like steps.
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn static_glibc_own_code_equals_qemu_block_for_block() {
    let bin = guest_file("ppc64le-libc");
    let (insns, pcs) = GUEST.qemu_run(&bin);
    for name in ["libc", "libc-step"] {
        static_glibc(name, &insns, &pcs);
    }
    // (Not compared record for record with each other: a stop of ours between a load-reserve
    // and its store-conditional, which a signal can cause, makes the program retry, so two runs
    // may differ there. Each is compared with qemu's log.)
}

/// One trace of the static glibc program (see above).
fn static_glibc(name: &str, insns: &BTreeMap<u64, CrossInsn>, pcs: &[u64]) {
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    GUEST.same_blocks_in(name, "ppc64le-libc", pcs, insns, &names, &names);
    assert_step_method(name);
    let trace = guest_file(&format!("{name}.itr"));
    let (_, total) = itrace_blocks(&trace);
    // Load-reserve instructions inside the traced blocks: the atomic sequences were run.
    let lwarx: Vec<u64> = insns.iter().filter(|(_, i)| i.mnemonic.ends_with("arx")).map(|(&a, _)| a).collect();
    let mut start = None;
    let mut through = 0;
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    for line in dump.stdout.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 12 || !f[1].starts_with("cpu") || f[3] != "U" {
            continue;
        }
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        let (from, to) = (hex(f[7]), hex(f[9]));
        if let Some(s) = start {
            through += lwarx.iter().filter(|&&a| a >= s && a <= from).count();
        }
        start = Some(to);
    }
    assert!(through > 0, "{name}: no traced block ran through an lwarx/ldarx");
    // This machine's report reads the guest's trace.
    let here = report_json(&trace);
    assert_eq!(here["total_instructions"].as_u64(), Some(total), "{name}: the x86_64 report of the guest's trace");
}

/// The three modes on the same program: continuous (segments written as it goes) records what
/// normal mode does; wrap with a 4K buffer keeps only the end, and says what it lost.
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn modes_continuous_and_wrap() {
    // The two runs are two executions of the program: a store-conditional (`stwcx.`) whose
    // reservation a trap or interrupt took away fails and its loop runs again, as it would on
    // hardware. So functions with a store-conditional may differ; every other function of the
    // program must have the same self count in both, and nothing may be lost.
    let normal = guest_report("libc");
    let continuous = guest_report("continuous");
    assert_eq!(continuous["lost_records"].as_u64(), Some(0), "continuous mode lost records: {continuous:#}");
    let bin = guest_file("ppc64le-libc");
    let dis = itrace_tests::run(
        std::process::Command::new(itrace_tests::cross_tool(ARCH, "objdump")).arg("-d").arg("-w").arg(&bin),
    );
    dis.assert_success();
    let mut with_reservation = std::collections::HashSet::new();
    let mut function = String::new();
    for line in dis.stdout.lines() {
        if let Some(label) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")) {
            function = label.1.trim_start_matches('.').to_string();
        } else if ["stwcx.", "stdcx.", "stbcx.", "sthcx.", "stqcx."].iter().any(|m| line.contains(m)) {
            with_reservation.insert(function.clone());
        }
    }
    assert!(!with_reservation.is_empty(), "no store-conditional in the static glibc program");
    let (n, c) = (guest_self_counts(&normal, "ppc64le-libc"), guest_self_counts(&continuous, "ppc64le-libc"));
    assert!(n.len() > 20, "only {} functions in the normal run", n.len());
    let mut differ = Vec::new();
    for name in n.keys().chain(c.keys()).collect::<std::collections::BTreeSet<_>>() {
        let base = name.split('@').next().unwrap_or(name);
        if n.get(name) != c.get(name) && !with_reservation.contains(base) {
            differ.push(format!("{name}: normal {:?}, continuous {:?}", n.get(name), c.get(name)));
        }
    }
    assert!(differ.is_empty(), "continuous against normal:\n{}", differ.join("\n"));
    let wrap = guest_report("wrap");
    let lost = wrap["lost_records"].as_u64().or_else(|| wrap["lost"].as_u64()).unwrap_or(0);
    assert!(lost > 0, "wrap mode with a 4K buffer lost nothing: {wrap:#}");
}

/// A dynamically linked program: the loader and libc from the guest's files, the program's own
/// functions as qemu ran them (the loader's own work differs natively: vDSO, hardware caps).
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn dynamic_program() {
    let bin = guest_file("ppc64le-dynamic");
    let sysroot = itrace_tests::cross_sysroot(ARCH);
    let logged = itrace_tests::qemu_log_pcs("qemu-ppc64le", &["-L", &sysroot], &bin, &[]);
    // A position-independent program: qemu loaded it at some base, below its interpreter. That
    // base is where the entry point ran: the lowest logged pc that, less a page-aligned base, is
    // the entry and is followed by seven more of the file's instructions.
    let insns = cross_objdump(ARCH, &bin);
    let readelf = itrace_tests::run(std::process::Command::new("readelf").arg("-h").arg(&bin));
    let entry = readelf
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Entry point address:"))
        .and_then(|v| u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
        .expect("readelf's entry point");
    let base = logged
        .windows(8)
        .filter_map(|w| {
            let base = w[0].wrapping_sub(entry);
            (base % 0x1000 == 0 && w[1..].iter().all(|pc| insns.contains_key(&pc.wrapping_sub(base)))).then_some(base)
        })
        .min()
        .expect("the program's entry point in qemu's log");
    let pcs: Vec<u64> = logged.iter().map(|pc| pc.wrapping_sub(base)).collect();
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    let want = cross_function_counts(ARCH, &bin, &pcs, &names);
    let report = guest_report("dynamic");
    let got = guest_self_counts(&report, "ppc64le-dynamic");
    for n in names {
        assert!(want.get(n).is_some_and(|&c| c > 0), "qemu never ran {n}");
        assert_eq!(got.get(n), want.get(n), "self instructions of {n}");
    }
    let functions = report["functions"].as_array().expect("functions");
    let libc = "/lib/powerpc64le-linux-gnu/libc.so.6";
    assert!(
        functions.iter().any(|f| f["name"] == "malloc" && f["module"] == libc),
        "malloc not resolved in {libc}:\n{report:#}"
    );
}

/// Three raise(SIGUSR1): three deliveries to the handler's first instruction, and the handler's
/// and main's instructions as qemu ran them.
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn signal_handler() {
    for name in ["signal", "signal-step"] {
        signal_trace(name);
    }
}

/// One trace of the signal program (see above).
fn signal_trace(name: &str) {
    assert_step_method(name);
    let bin = guest_file("ppc64le-signal");
    let pcs = cross_qemu_pcs(ARCH, &bin);
    let names = ["main", "on_usr1"];
    let want = cross_function_counts(ARCH, &bin, &pcs, &names);
    let got = guest_self_counts(&guest_report(name), "ppc64le-signal");
    for n in names {
        assert!(want.get(n).is_some_and(|&c| c > 0), "qemu never ran {n}");
        assert_eq!(got.get(n), want.get(n), "{name}: self instructions of {n}");
    }
    let handler = cross_code_symbols(ARCH, &bin).into_iter().find(|(_, n)| n == "on_usr1").expect("on_usr1").0;
    let trace = guest_file(&format!("{name}.itr"));
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    let lines: Vec<&str> = dump.stdout.lines().filter(|l| l.contains(" U ") || l.contains(" K ")).collect();
    let deliveries: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains(" K Iret flags=2 ")).collect();
    assert_eq!(deliveries.len(), 3, "signal deliveries in\n{}", dump.stdout);
    for i in deliveries {
        // Linux enters the handler through the vDSO's trampoline, which calls it (`bctrl`,
        // balancing the return predictor): the next block is that call, to on_usr1.
        let d = lines[i];
        assert!(d.contains(" aux=10 "), "not SIGUSR1: {d}");
        let call = lines.get(i + 1).copied().unwrap_or("");
        assert!(
            call.contains(" U Call ") && call.contains(&format!("-> {handler:#x} ")),
            "not to on_usr1 ({handler:#x}): {d}\n{call}"
        );
    }
}

/// Four threads: five traced, each worker's computation counted as qemu ran it.
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn threads() {
    GUEST.check_threads(&["main", "thr_main", "thr_compute"]);
}

/// fork and exec, followed (-f): two processes, the work of each as qemu ran it.
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn fork_and_exec() {
    GUEST.check_fork_and_exec();
}

/// Attached to a running program for a second: what ran is its loop, nothing else (the
/// program has no other code), and the trace says the tracing began with an attach.
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn attach() {
    GUEST.check_attach("loop");
}

/// Region tracing (`--start sum_list --stop printf`, `trap` breakpoints): the trace is qemu's
/// log from sum_list's first instruction to printf's first, for the program's own code block
/// for block (malloc's internals depend on what the kernel gives, see above), with the self
/// counts of the functions run inside; fib, run before the region, is not in it.
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn region_start_stop() {
    let bin = guest_file("ppc64le-libc");
    let (insns, pcs) = GUEST.qemu_run(&bin);
    let sum_list = GUEST.function_ranges(&bin, &["sum_list"])[0];
    // (printf's aliases start where it does: its first instructions, not its range)
    let printf = GUEST.function_ranges(&bin, &["printf"])[0].0;
    let first = pcs.iter().position(|&pc| pc >= sum_list.0 && pc < sum_list.1).expect("qemu ran sum_list");
    let last =
        first + pcs[first..].iter().position(|&pc| (printf..printf + 12).contains(&pc)).expect("qemu ran printf");
    // Up to printf's first instruction: the call to it ends the region's last block.
    let region = &pcs[first..=last];
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    let got = GUEST.same_blocks_in("region", "ppc64le-libc", region, &insns, &names, &["twice", "thrice", "sum_list"]);
    assert_eq!(got.get("fib"), None, "fib ran before the region: {got:?}");
    let dump = itrace(["dump".as_ref(), guest_file("region.itr").as_os_str()]);
    let on = dump.stdout.lines().find(|l| l.contains("TraceOn(")).expect("a trace-on record");
    assert!(
        on.contains(&format!("pc: {} }}", pcs[first])),
        "the region starts at sum_list's first pc {:#x}: {on}",
        pcs[first]
    );
}

/// `--region` on tests/programs/region.c (ITraceOn, a nested pair, ITraceEnabled, system calls
/// inside), its libitrace entry points carried out by itrace: its rg_* functions run only inside
/// the region and rg_untraced_* only outside, so the trace's rg_* blocks are qemu's, block for
/// block, and rg_untraced_sum is not in it. (The guest checks what ITraceEnabled returned.)
#[test]
#[ignore = "needs the guest's traces: run ppc64le-guest/test-in-guest.sh"]
fn region_itraceon_itraceoff() {
    GUEST.check_region_itraceon();
}
