//! Cross-architecture tracing: PowerPC64 (little- and big-endian), s390x
//! and 32-bit x86 programs traced through qemu-user's GDB stub
//! (`itrace record --qemu ARCH`), and i386 natively through ptrace.
//!
//! Oracles: qemu's own instruction log of the same program in the same
//! empty environment (`env -i qemu-ARCH -singlestep -d nochain,exec`), the
//! cross objdump (instruction lengths and branch mnemonics, classified here
//! from objdump's text, not by itrace's decoder), the cross nm symbol table,
//! and the hand counts in tests/programs/cross/*.S.

use itrace_tests::{
    add_missing_insns, arc_text, compare_cross_blocks, cross_code_symbols, cross_function_counts, cross_hand_count,
    cross_objdump, cross_oracle_blocks, cross_program, cross_qemu_options, cross_qemu_pcs, cross_sysroot, free_port,
    itrace, itrace_bin, itrace_blocks, listening, program, qemu_log_pcs, record, record_gdb, report_json,
    report_self_counts, require_tool, run, test_dir, wait_until, wait_with_guard, KillOnDrop, LONG_LOOP_INSTRUCTIONS,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn record_qemu(arch: &str, bin: &Path, dir: &Path) -> PathBuf {
    let trace = dir.join("t.itr");
    let o = itrace(["record", "--qemu", arch, "-o"].iter().map(|s| s.as_ref()).chain([
        trace.as_os_str(),
        "--".as_ref(),
        bin.as_os_str(),
    ]));
    o.assert_success();
    trace
}

/// `itrace record --backend qemu` (the TCG plugin), in an empty environment like the oracle's.
fn record_plugin(arch: &str, bin: &Path, dir: &Path) -> PathBuf {
    let trace = dir.join("plugin.itr");
    let o = run(Command::new(itrace_bin())
        .env_clear()
        .args(["record", "--backend", "qemu", "--arch", arch, "-o"])
        .arg(&trace)
        .arg("--")
        .arg(bin));
    o.assert_success();
    trace
}

type Recorder = fn(&str, &Path, &Path) -> PathBuf;

fn check_asm(arch: &str) {
    check_asm_with(arch, record_qemu, "")
}

fn check_asm_with(arch: &str, recorder: Recorder, tag: &str) {
    let bin = cross_program(&format!("{arch}-asm"));
    let dir = test_dir(&format!("cross-asm-{arch}{tag}"));
    let insns = cross_objdump(arch, &bin);
    let pcs = cross_qemu_pcs(arch, &bin);
    let (want, want_total) = cross_oracle_blocks(arch, &pcs, &insns);
    let (hand_total, hand_blocks) = cross_hand_count(arch);
    assert_eq!((want_total, want.len()), (hand_total, hand_blocks), "{arch}: qemu's log against the hand count");
    let trace = recorder(arch, &bin, &dir);
    let (got, total) = itrace_blocks(&trace);
    assert_eq!(total, hand_total, "{arch}: itrace's instruction count against the hand count");
    compare_cross_blocks(arch, &got, &want);
    // The write system call is named after the traced architecture's numbers.
    let arc = arc_text(&trace);
    assert!(arc.contains("sys_write:[kernel]"), "{arch}: no sys_write line in\n{arc}");
}

fn check_libc(arch: &str) {
    check_libc_with(arch, record_qemu, "")
}

fn check_libc_with(arch: &str, recorder: Recorder, tag: &str) {
    let bin = cross_program(&format!("{arch}-libc"));
    let dir = test_dir(&format!("cross-libc-{arch}{tag}"));
    let mut insns = cross_objdump(arch, &bin);
    let pcs = cross_qemu_pcs(arch, &bin);
    add_missing_insns(arch, &bin, &pcs, &mut insns);
    let (want, want_total) = cross_oracle_blocks(arch, &pcs, &insns);
    let trace = recorder(arch, &bin, &dir);
    let (got, total) = itrace_blocks(&trace);
    compare_cross_blocks(arch, &got, &want);
    assert_eq!(total, want_total, "{arch}: instructions, itrace against qemu's log");
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    let want = cross_function_counts(arch, &bin, &pcs, &names);
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(want_total), "{arch}: report total");
    let got = report_self_counts(&report, &bin);
    for n in names {
        assert!(want.get(n).is_some_and(|&c| c > 0), "{arch}: qemu never ran {n}");
        assert_eq!(got.get(n), want.get(n), "{arch}: self instructions of {n}");
    }
    if arch.starts_with("ppc") {
        // malloc's locks: the trace went through (and past) load-reserve/store-conditional sequences.
        let lwarx = pcs.iter().filter(|pc| insns.get(pc).is_some_and(|i| i.mnemonic.ends_with("arx"))).count();
        assert!(lwarx > 0, "{arch}: the program ran no lwarx/ldarx (nothing tested)");
    }
}

/// A dynamically linked program: the libraries the loader maps are learnt from its open and
/// mmap calls (the stub cannot list mappings), so libc's functions resolve, and the count is
/// qemu's with the same cross sysroot.
fn check_dynamic(arch: &str) {
    let bin = cross_program(&format!("{arch}-dynamic"));
    let dir = test_dir(&format!("cross-dynamic-{arch}"));
    let sysroot = cross_sysroot(arch);
    let options = cross_qemu_options(arch);
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let mut pcs = qemu_log_pcs(&format!("qemu-{arch}"), &options, &bin, &[]);
    pcs.dedup(); // rep string iterations count once
    let trace = record_qemu(arch, &bin, &dir);
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(pcs.len() as u64), "{arch}: instructions");
    let libc = format!("{sysroot}/lib/libc.so.6");
    let functions = report["functions"].as_array().unwrap();
    let malloc = functions.iter().find(|f| f["name"] == "malloc" && f["module"] == libc.as_str());
    assert!(malloc.is_some(), "{arch}: malloc not resolved in {libc}:\n{report:#}");
    let unknown: Vec<&serde_json::Value> =
        functions.iter().filter(|f| f["module"].as_str().unwrap_or("").starts_with("0x")).collect();
    assert!(unknown.is_empty(), "{arch}: blocks outside any known module: {unknown:?}");
}

#[test]
fn dynamic_program_ppc64le() {
    check_dynamic("ppc64le");
}

#[test]
fn dynamic_program_s390x() {
    check_dynamic("s390x");
}

#[test]
fn dynamic_program_i386() {
    check_dynamic("i386");
}

/// A handler run by three raise(SIGUSR1) calls: the signals pass through the stub to the
/// program, and the trace counts what qemu's log executed, the handler's instructions included
/// (qemu's own sigreturn trampoline on PowerPC too).
fn check_signals(arch: &str) {
    let bin = cross_program(&format!("{arch}-signal"));
    let dir = test_dir(&format!("cross-signal-{arch}"));
    let pcs = cross_qemu_pcs(arch, &bin);
    let mut executed = pcs.clone();
    executed.dedup(); // a rep string instruction is logged once per iteration and counts once
    let trace = record_qemu(arch, &bin, &dir);
    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(executed.len() as u64), "{arch}: instructions");
    let names = ["main", "on_usr1"];
    let want = cross_function_counts(arch, &bin, &pcs, &names);
    let got = report_self_counts(&report, &bin);
    for n in names {
        assert!(want.get(n).is_some_and(|&c| c > 0), "{arch}: qemu never ran {n}");
        assert_eq!(got.get(n), want.get(n), "{arch}: self instructions of {n}");
    }
    // Three deliveries of SIGUSR1 (10, by Linux's numbers), each to the handler's first
    // instruction (the code symbol, `.on_usr1` on ELFv1).
    let handler = cross_code_symbols(arch, &bin)
        .into_iter()
        .find(|(_, name)| name == "on_usr1")
        .map(|(addr, _)| addr)
        .expect("on_usr1 in nm");
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    let deliveries: Vec<&str> = dump.stdout.lines().filter(|l| l.contains(" K Iret flags=2 ")).collect();
    assert_eq!(deliveries.len(), 3, "{arch}: signal deliveries in\n{}", deliveries.join("\n"));
    for d in &deliveries {
        assert!(d.contains(" aux=10 "), "{arch}: not SIGUSR1: {d}");
        assert!(d.contains(&format!("-> {handler:#x} ")), "{arch}: not to on_usr1 ({handler:#x}): {d}");
    }
}

#[test]
fn signals_through_the_stub_s390x() {
    check_signals("s390x");
}

#[test]
fn signals_through_the_stub_ppc64le() {
    check_signals("ppc64le");
}

#[test]
fn signals_through_the_stub_ppc64_big_endian() {
    check_signals("ppc64");
}

#[test]
fn signals_through_the_stub_i386() {
    check_signals("i386");
}

#[test]
fn ppc64le_asm() {
    check_asm("ppc64le");
}

#[test]
fn ppc64_big_endian_asm() {
    check_asm("ppc64");
}

#[test]
fn s390x_asm() {
    check_asm("s390x");
}

#[test]
fn i386_asm_through_qemu() {
    check_asm("i386");
}

#[test]
fn ppc64le_libc_with_lwarx() {
    check_libc("ppc64le");
}

#[test]
fn ppc64_big_endian_libc_with_lwarx() {
    check_libc("ppc64");
}

#[test]
fn s390x_libc() {
    check_libc("s390x");
}

#[test]
fn i386_libc_through_qemu() {
    check_libc("i386");
}

// The same programs through the qemu TCG plugin (`--backend qemu`): block for block as qemu's
// single-step log, like the GDB-stub stepper above.

#[test]
fn plugin_ppc64le() {
    check_asm_with("ppc64le", record_plugin, "-plugin");
    check_libc_with("ppc64le", record_plugin, "-plugin");
}

#[test]
fn plugin_ppc64_big_endian() {
    check_asm_with("ppc64", record_plugin, "-plugin");
    check_libc_with("ppc64", record_plugin, "-plugin");
}

#[test]
fn plugin_s390x() {
    check_asm_with("s390x", record_plugin, "-plugin");
    check_libc_with("s390x", record_plugin, "-plugin");
}

#[test]
fn plugin_i386() {
    check_asm_with("i386", record_plugin, "-plugin");
    check_libc_with("i386", record_plugin, "-plugin");
}

/// 32-bit x86 natively with ptrace: the asm program exactly as qemu runs it; the glibc program's
/// own functions (glibc's start-up differs natively: vDSO, CPU features).
#[test]
fn i386_native_ptrace() {
    let arch = "i386";
    let bin = cross_program("i386-asm");
    let dir = test_dir("cross-i386-native");
    let insns = cross_objdump(arch, &bin);
    let (want, _) = cross_oracle_blocks(arch, &cross_qemu_pcs(arch, &bin), &insns);
    let trace = dir.join("asm.itr");
    record(&trace, &[], &bin, &[]).assert_success();
    let (got, total) = itrace_blocks(&trace);
    assert_eq!(total, cross_hand_count(arch).0, "i386 native: hand count");
    compare_cross_blocks("i386 native asm", &got, &want);
    let dump = itrace(["dump".as_ref(), trace.as_os_str()]);
    assert!(dump.stdout.lines().next().unwrap_or("").contains("arch=i386"), "trace header: {}", dump.stdout);
    assert!(arc_text(&trace).contains("sys_write:[kernel]"));

    let bin = cross_program("i386-libc");
    let pcs = cross_qemu_pcs(arch, &bin);
    let names = ["main", "fib", "twice", "thrice", "sum_list"];
    let want = cross_function_counts(arch, &bin, &pcs, &names);
    let trace = dir.join("libc.itr");
    record(&trace, &[], &bin, &[]).assert_success();
    let got = report_self_counts(&report_json(&trace), &bin);
    for n in names {
        assert_eq!(got.get(n), want.get(n), "i386 native: self instructions of {n}");
    }
}

#[test]
fn unknown_architecture_is_one_line() {
    let o = itrace(["record", "--qemu", "sparc", "--", "/bin/true"]);
    assert!(!o.success());
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stderr.starts_with("itrace: unknown architecture 'sparc' for --qemu"), "{}", o.stderr);
}

#[test]
fn nothing_listening_is_one_line() {
    let bin = cross_program("ppc64le-asm");
    let port = free_port();
    let dir = test_dir("cross-nothing-listening");
    let trace = dir.join("t.itr");
    let o = record_gdb(&trace, port, &bin);
    assert!(!o.success());
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(
        o.stderr.starts_with(&format!("itrace: cannot connect to the GDB stub at 127.0.0.1:{port}")),
        "{}",
        o.stderr
    );
}

/// qemu killed mid-trace: one error line, non-zero exit, and a readable partial trace.
#[test]
fn stub_killed_mid_trace_leaves_a_valid_trace() {
    let arch = "ppc64le";
    // A loop that runs until killed: the stub dies mid-trace however fast the machine is.
    let bin = cross_program("ppc64le-loop");
    let dir = test_dir("cross-stub-killed");
    let trace = dir.join("t.itr");
    let port = free_port();
    let qemu = Command::new(require_tool(&format!("qemu-{arch}")))
        .env_clear()
        .args(["-g", &port.to_string()])
        .arg(&bin)
        .arg("forever")
        .stdout(Stdio::null())
        .spawn()
        .expect("start qemu");
    let mut qemu = KillOnDrop(qemu);
    // qemu's stub takes one connection: wait until it listens without connecting to it.
    wait_until("qemu's stub listens", || listening(port));
    let mut rec = Command::new(itrace_bin());
    rec.args(["record", "--segment-size", "4K", "--gdb", &format!("127.0.0.1:{port}"), "-o"])
        .arg(&trace)
        .arg("--gdb-program")
        .arg(&bin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = rec.spawn().expect("start itrace");
    // Wait until some chunks are in the file, then kill the stub.
    wait_until("the trace has records", || std::fs::metadata(&trace).map(|m| m.len() > 8192).unwrap_or(false));
    qemu.0.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "itrace succeeded after its stub died: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("itrace: the GDB stub closed the connection"), "{stderr}");
    let report = report_json(&trace);
    assert!(report["total_instructions"].as_u64().unwrap() > 100, "partial trace: {report}");
}

/// Ctrl-C to `itrace record --gdb` in the middle of a long trace: itrace takes its breakpoints
/// out, detaches, and exits with a valid trace; the program runs on untouched to its normal end.
#[test]
fn ctrl_c_detaches_from_the_stub() {
    let bin = program("long_loop");
    let dir = test_dir("cross-ctrl-c");
    let trace = dir.join("t.itr");
    let port = free_port();
    let qemu = Command::new(require_tool("qemu-x86_64"))
        .env_clear()
        .args(["-g", &port.to_string()])
        .arg(&bin)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start qemu");
    let mut qemu = KillOnDrop(qemu);
    wait_until("qemu's stub listens", || listening(port));
    let child = Command::new(itrace_bin())
        .args(["record", "--segment-size", "4K", "--gdb", &format!("127.0.0.1:{port}"), "-o"])
        .arg(&trace)
        .arg("--gdb-program")
        .arg(&bin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start itrace");
    wait_until("the trace has records", || std::fs::metadata(&trace).map(|m| m.len() > 16384).unwrap_or(false));
    // SAFETY: kill(2) on the pid of a child we started and have not waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "itrace after ^C: {stderr}");
    assert!(stderr.contains("tracing ended: detached"), "{stderr}");
    // The program finishes on its own, with its normal output and status.
    let status = wait_with_guard(&mut qemu.0, "qemu after the detach");
    assert!(status.success(), "long_loop after the detach: {status:?}");
    let mut output = String::new();
    std::io::Read::read_to_string(qemu.0.stdout.as_mut().unwrap(), &mut output).unwrap();
    assert_eq!(output, "long_loop: done\n");
    let report = report_json(&trace);
    let traced = report["total_instructions"].as_u64().unwrap();
    assert!(traced > 100 && traced < LONG_LOOP_INSTRUCTIONS, "traced {traced} of {LONG_LOOP_INSTRUCTIONS}");
}

/// The views on a foreign trace (issue 18: every architecture): the libc program traced by the
/// plugin, its flame graph, call graph and Chrome timeline against qemu's own log (fib's self
/// instructions, per function from the log's pcs and nm) and the hand count of the source:
/// fib(10) makes 177 calls (1 from main, 176 recursive) nested 10 deep, and calls nothing, so
/// its inclusive count is its self count; sum_list(8) calls twice and thrice 4 times each
/// through its function pointers.
fn check_views(arch: &str) {
    let bin = cross_program(&format!("{arch}-libc"));
    let dir = test_dir(&format!("cross-views-{arch}"));
    let pcs = cross_qemu_pcs(arch, &bin);
    let want = cross_function_counts(arch, &bin, &pcs, &["fib"]);
    let fib_self = want["fib"];
    let trace = record_plugin(arch, &bin, &dir);

    let folded = itrace(["flamegraph".as_ref(), "--folded".as_ref(), trace.as_os_str()]);
    folded.assert_success();
    let (mut leaf_fib, mut deepest) = (0u64, 0usize);
    for line in folded.stdout.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("folded line: STACK COUNT");
        let frames: Vec<&str> = stack.split(';').collect();
        if frames.last() == Some(&"fib") {
            leaf_fib += count.parse::<u64>().expect("count");
            assert!(stack.contains(";main;fib"), "{arch}: fib below something other than main: {line}");
        }
        let run = frames.iter().rev().take_while(|f| **f == "fib").count();
        deepest = deepest.max(run);
    }
    assert_eq!(leaf_fib, fib_self, "{arch}: fib's instructions in the flame graph against qemu's log");
    assert_eq!(deepest, 10, "{arch}: fib's deepest recursion in the flame graph");

    let graph = itrace(["report".as_ref(), "--json".as_ref(), "--callers".as_ref(), "fib".as_ref(), trace.as_os_str()]);
    graph.assert_success();
    let graph: serde_json::Value = serde_json::from_str(&graph.stdout).expect("report json");
    let fib = &graph["call_graph"][0];
    assert_eq!((fib["calls"].as_u64(), fib["inclusive"].as_u64()), (Some(177), Some(fib_self)), "{arch}: {fib}");
    let callers: Vec<(String, u64)> = fib["callers"]
        .as_array()
        .expect("callers")
        .iter()
        .map(|c| (c["name"].as_str().unwrap_or("").to_string(), c["calls"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(callers, [("fib".to_string(), 176), ("main".to_string(), 1)], "{arch}: fib's callers");
    for f in ["twice", "thrice"] {
        let o = itrace(["report".as_ref(), "--json".as_ref(), "--callers".as_ref(), f.as_ref(), trace.as_os_str()]);
        o.assert_success();
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("report json");
        let callers = &v["call_graph"][0]["callers"];
        assert_eq!(callers[0]["name"], "sum_list", "{arch}: {f}'s callers: {callers}");
        assert_eq!(callers[0]["calls"].as_u64(), Some(4), "{arch}: {f}'s callers: {callers}");
    }

    let json = dir.join("t.json");
    itrace([
        "export".as_ref(),
        trace.as_os_str(),
        "--format".as_ref(),
        "chrome".as_ref(),
        "-o".as_ref(),
        json.as_os_str(),
    ])
    .assert_success();
    let events: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("read chrome json")).expect("chrome json");
    let events = events["traceEvents"].as_array().expect("traceEvents");
    let fib_spans = events.iter().filter(|e| e["ph"] == "B" && e["name"] == "fib").count();
    assert_eq!(fib_spans, 177, "{arch}: fib's spans in the Chrome timeline");
    assert!(
        events.iter().any(|e| e["ph"] == "i" && e["name"] == "sys_write"),
        "{arch}: no sys_write marker in the Chrome timeline"
    );
}

/// `annotate --asm` on each architecture's asm program, against the hand counts in its
/// source: the loop's conditional branch is taken 4 times and falls through once, the
/// conditional branch at `target` falls through its one time, no other instruction has branch
/// counts, and the loop's call names its target (add_two's code, inside `_start`'s symbol)
/// instead of giving an address.
fn check_annotate(arch: &str, loop_branch: &str, target_branch: &str, call: &str) {
    let bin = cross_program(&format!("{arch}-asm"));
    let dir = test_dir(&format!("cross-annotate-{arch}"));
    let trace = record_plugin(arch, &bin, &dir);
    let o = itrace(["annotate".as_ref(), trace.as_os_str(), "_start".as_ref(), "--asm".as_ref(), "--json".as_ref()]);
    o.assert_success();
    let a: serde_json::Value = serde_json::from_str(&o.stdout).expect("annotate json");
    let insns = a["functions"][0]["instructions"].as_array().expect("instructions");
    let mnemonic = |i: &serde_json::Value| i["text"].as_str().unwrap().split_whitespace().next().unwrap().to_string();
    let branches: Vec<(String, u64, u64, u64)> = insns
        .iter()
        .filter(|i| !i["taken"].is_null())
        .map(|i| {
            let n = |k: &str| i[k].as_u64().unwrap_or_else(|| panic!("{k} of {i}"));
            (mnemonic(i), n("executions"), n("taken"), n("not_taken"))
        })
        .collect();
    assert_eq!(
        branches,
        [(loop_branch.to_string(), 5, 4, 1), (target_branch.to_string(), 1, 0, 1)],
        "{arch}: conditional branches (mnemonic, executions, taken, not taken)"
    );
    let calls: Vec<&serde_json::Value> = insns.iter().filter(|i| mnemonic(i) == call).collect();
    assert_eq!(calls.len(), 1, "{arch}: one {call} in {insns:?}");
    let text = calls[0]["text"].as_str().unwrap();
    let target = calls[0]["target"].as_u64().unwrap_or_else(|| panic!("{arch}: {call} has a target: {}", calls[0]));
    let start = insns[0]["address"].as_u64().unwrap();
    assert!(text.ends_with(&format!("_start+{:#x}", target - start)), "{arch}: {text}");
}

#[test]
fn annotate_ppc64le() {
    check_annotate("ppc64le", "bne", "beq", "bl");
}

#[test]
fn annotate_ppc64_big_endian() {
    check_annotate("ppc64", "bne", "beq", "bl");
}

#[test]
fn annotate_s390x() {
    check_annotate("s390x", "brctg", "je", "brasl");
}

#[test]
fn annotate_i386() {
    check_annotate("i386", "jne", "je", "call");
}

#[test]
fn views_ppc64le() {
    check_views("ppc64le");
}

#[test]
fn views_ppc64_big_endian() {
    check_views("ppc64");
}

#[test]
fn views_s390x() {
    check_views("s390x");
}

/// A tail call on 64-bit PowerPC ELFv2: gcc -O2 ends tc_mid with a branch to tc_inner's local
/// entry, 8 bytes past its symbol (the cross objdump shows it), and it is a call of tc_inner
/// from tc_mid as on x86_64 (callgrind's way): 3 calls (the hand count of main's loop), and
/// tc_inner's inclusive count is its own and tc_leaf's instructions from qemu's log.
#[test]
fn tail_call_to_a_local_entry_ppc64le() {
    let arch = "ppc64le";
    let bin = cross_program(&format!("{arch}-tailcall"));
    let dir = test_dir("cross-tailcall-ppc64le");
    let insns = cross_objdump(arch, &bin);
    let inner = cross_code_symbols(arch, &bin).into_iter().find(|(_, n)| n == "tc_inner").expect("nm: tc_inner").0;
    let local_entry = format!("{:x}", inner + 8);
    assert!(
        insns.values().any(|i| i.mnemonic == "b" && i.operands == local_entry),
        "{arch}: no branch to tc_inner's local entry ({local_entry}) in the cross objdump"
    );
    let pcs = cross_qemu_pcs(arch, &bin);
    let want = cross_function_counts(arch, &bin, &pcs, &["tc_inner", "tc_leaf"]);
    let trace = record_plugin(arch, &bin, &dir);
    let o =
        itrace(["report".as_ref(), "--json".as_ref(), "--callers".as_ref(), "tc_inner".as_ref(), trace.as_os_str()]);
    o.assert_success();
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("report json");
    let inner = &v["call_graph"][0];
    assert_eq!(inner["calls"].as_u64(), Some(3), "{arch}: {inner}");
    assert_eq!(inner["inclusive"].as_u64(), Some(want["tc_inner"] + want["tc_leaf"]), "{arch}: {inner}");
    let callers = &inner["callers"];
    assert_eq!(
        (callers[0]["name"].as_str(), callers[0]["calls"].as_u64()),
        (Some("tc_mid"), Some(3)),
        "{arch}: {callers}"
    );
}
