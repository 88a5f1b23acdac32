//! The freestanding programs traced by itrace: the arc's blocks (start as
//! symbol+offset, instruction count, type of the last instruction) and the
//! total instruction count equal the qemu-user oracle's, and the hand
//! counts in the .S files.

use itrace_tests::{
    checked_arc, compare_lines, program, record, report_calls, report_json, report_self_counts, test_dir,
    without_exit_kernel_line, ArcLine, Oracle, COUNT_LOOP_BLOCKS, COUNT_LOOP_INSTRUCTIONS, LONG_LOOP_BLOCKS,
    LONG_LOOP_INSTRUCTIONS,
};

/// Records `name`, writes its arc, and compares it with the oracle.
fn check_program(name: &str) -> (Oracle, Vec<ArcLine>, serde_json::Value) {
    check_program_with(name, &[])
}

/// The same, with extra `itrace record` options.
fn check_program_with(name: &str, options: &[&str]) -> (Oracle, Vec<ArcLine>, serde_json::Value) {
    let bin = program(name);
    let oracle = Oracle::of(&bin, &[]);
    let dir = test_dir(&format!("exact_counts-{name}{}", options.join("")));
    let trace = dir.join("t.itr");
    let rec = record(&trace, options, &bin, &[]);
    rec.assert_success();

    let (_, lines) = checked_arc(&trace, &dir.join("t.arc"));

    // one process, one thread, named after the program
    let first = lines.first().expect("the arc has no block lines");
    for l in &lines {
        assert_eq!((l.pid, l.tid), (first.pid, first.tid), "arc line {}", l.lineno);
        assert_eq!(l.pid, l.tid, "single-threaded: pid == tid");
        assert_eq!(l.pname, name, "arc line {}: process name", l.lineno);
    }

    let total: u64 = lines.iter().map(|l| l.count).sum();
    assert_eq!(total, oracle.instructions, "{name}: total instructions (sum of field 4)");

    let module = bin.to_string_lossy().into_owned();
    let cmp = without_exit_kernel_line(&lines);
    if let Err(e) = compare_lines(cmp, &oracle.expected, &module) {
        panic!("{name}: arc differs from the qemu oracle: {e}");
    }

    let report = report_json(&trace);
    assert_eq!(report["total_instructions"].as_u64(), Some(oracle.instructions), "{name}: report total_instructions");
    assert_eq!(report["lost_records"].as_u64(), Some(0), "{name}: lost_records");
    (oracle, lines, report)
}

#[test]
fn count_loop() {
    let (oracle, lines, report) = check_program("count_loop");
    assert_eq!(oracle.instructions, COUNT_LOOP_INSTRUCTIONS);
    assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), COUNT_LOOP_INSTRUCTIONS, "hand count (count_loop.S)");
    assert_eq!(lines.iter().filter(|l| !l.kernel).count(), COUNT_LOOP_BLOCKS, "hand count of blocks (count_loop.S)");
    let bin = program("count_loop");
    let own = report_self_counts(&report, &bin);
    assert_eq!(own.get("check"), Some(&4), "check: xor cmp je ret");
    assert_eq!(own.get("_start"), Some(&(COUNT_LOOP_INSTRUCTIONS - 4)));
    assert_eq!(report_calls(&report, &bin).get("check"), Some(&1));
}

#[test]
fn branches() {
    let (oracle, lines, _) = check_program("branches");
    assert_eq!(oracle.instructions, 102, "hand count (branches.S)");
    // the write system call, and nothing else, returned to user space
    let k: Vec<&str> =
        without_exit_kernel_line(&lines).iter().filter(|l| l.kernel).map(|l| l.symbol.as_str()).collect();
    assert_eq!(k, vec!["sys_write"]);
}

#[test]
fn long_loop() {
    let (oracle, lines, _) = check_program("long_loop");
    assert_eq!(oracle.instructions, LONG_LOOP_INSTRUCTIONS);
    assert_eq!(lines.iter().filter(|l| !l.kernel).count(), LONG_LOOP_BLOCKS, "hand count of blocks (long_loop.S)");
}

// Block stepping (PTRACE_SINGLEBLOCK) cannot run on our VMs (the hypervisor
// ignores the branch-trap flag), so `--emulate-block-step` feeds the block
// decoder only the stops a working branch trap would give. The trace must
// still equal the qemu oracle exactly.

#[test]
fn count_loop_block_step() {
    let (oracle, _, _) = check_program_with("count_loop", &["--emulate-block-step"]);
    assert_eq!(oracle.instructions, COUNT_LOOP_INSTRUCTIONS);
}

#[test]
fn branches_block_step() {
    check_program_with("branches", &["--emulate-block-step"]);
}

#[test]
fn long_loop_block_step() {
    check_program_with("long_loop", &["--emulate-block-step"]);
}
