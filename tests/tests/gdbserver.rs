//! `itrace record --gdb` against a real gdbserver (Debian's, on this
//! machine's own x86_64 programs): the stub sends registers with its stop
//! replies, has no `p` packet on x86, and reports a breakpoint again
//! instead of stepping from its address. The traces of the freestanding
//! programs equal the qemu oracle's blocks and the hand counts, as the
//! ptrace recorder's do.

use itrace_tests::{
    checked_arc, compare_lines, free_port, listening, program, record_gdb, require_tool, test_dir, wait_until,
    wait_with_guard, without_exit_kernel_line, KillOnDrop, Oracle, COUNT_LOOP_INSTRUCTIONS,
};
use std::process::{Command, Stdio};

/// Start `gdbserver` on `program` at a free port; the recorder connects to it.
fn gdbserver(program: &std::path::Path) -> (KillOnDrop, u16) {
    let gdbserver = require_tool("gdbserver");
    let port = free_port();
    let child = Command::new(gdbserver)
        .env_clear()
        .arg(format!("127.0.0.1:{port}"))
        .arg(program)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gdbserver");
    let guard = KillOnDrop(child);
    wait_until("gdbserver listens", || listening(port));
    (guard, port)
}

fn check(name: &str, hand_count: u64) {
    let bin = program(name);
    let oracle = Oracle::of(&bin, &[]);
    assert_eq!(oracle.instructions, hand_count, "{name}: the oracle against the hand count");
    let dir = test_dir(&format!("gdbserver-{name}"));
    let trace = dir.join("t.itr");
    let (mut server, port) = gdbserver(&bin);
    record_gdb(&trace, port, &bin).assert_success();
    let status = wait_with_guard(&mut server.0, "gdbserver");
    assert!(status.success(), "gdbserver: {status:?}");

    let (_, lines) = checked_arc(&trace, &dir.join("t.arc"));
    let total: u64 = lines.iter().map(|l| l.count).sum();
    assert_eq!(total, hand_count, "{name}: instructions in the arc");
    let module = bin.to_string_lossy().into_owned();
    if let Err(e) = compare_lines(without_exit_kernel_line(&lines), &oracle.expected, &module) {
        panic!("{name}: arc through gdbserver differs from the qemu oracle: {e}");
    }
}

#[test]
fn count_loop_through_gdbserver() {
    check("count_loop", COUNT_LOOP_INSTRUCTIONS);
}

#[test]
fn branches_through_gdbserver() {
    check("branches", 102);
}
