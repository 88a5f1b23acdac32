//! Tests of the oracles themselves, against the test programs and hand
//! counts. These do not run itrace.

use itrace_tests::{
    callgrind_profile, callgrind_self_counts, check_arc_consistency, objdump_insns, parse_arc, parse_callgrind_into,
    parse_objdump, parse_qemu_log, parse_sections, program, qemu_exec_pcs, qemu_self_counts, split_names,
    trailing_comments, BranchKind, CallgrindProfile, Expected, Flow, Oracle, Symbols, COUNT_LOOP_BLOCKS,
    COUNT_LOOP_INSTRUCTIONS, FIB_ASM_SELF, LONG_LOOP_BLOCKS, LONG_LOOP_INSTRUCTIONS,
};
use std::collections::HashMap;
use std::path::Path;

/// Functions written in the libc test programs' sources (the "own"
/// functions whose counts the tests compare).
const OWN_FUNCTIONS: &[(&str, &[&str])] = &[
    ("loops", &["main", "loops_fill", "loops_sum", "loops_nested", "loops_bits"]),
    ("fib", &["main", "fib", "fib_asm"]),
    ("funcptr", &["main", "fp_add", "fp_sub", "fp_mul", "fp_xor", "fp_fold"]),
    ("jumptable", &["main", "jt_classify"]),
    ("longjmp", &["main", "lj_dive", "lj_round"]),
    ("signal", &["main", "sig_handler", "sig_compute"]),
    ("threads", &["main", "thr_main", "thr_compute"]),
];

#[test]
fn qemu_log_parser() {
    let log = "Trace 0: 0x7fcaf4a00100 [0000000000000000/0000000000401000/1040c0b3/00000201] \n\
               Linking TBs 0x1 [0000000000401000] index 0 -> 0x2 [0000000000401005]\n\
               Trace 1: 0x7fcaf4a00200 [0000000000000000/0000004002820b73/1040c0b3/00000201] \n";
    assert_eq!(parse_qemu_log(log.as_bytes()), vec![0x401000, 0x4002820b73]);
}

#[test]
fn objdump_parser() {
    let text = "\n\
0000000000401000 <_start>:\n\
  401000:\tb9 e8 03 00 00       \tmov    $0x3e8,%ecx\n\
  40101c:\tf3 a4                \trep movsb %ds:(%rsi),%es:(%rdi)\n\
  401020:\tf3 c3                \trepz ret\n\
  401022:\t3e ff e0             \tnotrack jmp *%rax\n\
  401025:\t0f 05                \tsyscall\n\
  401027:\te2 fe                \tloop   401027 <_start+0x27>\n\
  401029:\t48 b8 88 77 66 55 44 \tmovabs $0x1122334455667788,%rax\n\
  401030:\t33 22 11 \n\
  401033:\tff 15 1c 20 00 00    \tcall   *0x201c(%rip)        # 403030 <fptr>\n";
    let m = parse_objdump(text);
    assert_eq!(m.len(), 8);
    assert_eq!(m[&0x401000].len, 5);
    assert_eq!(m[&0x401000].flow(), Flow::Next);
    assert!(m[&0x40101c].is_rep_string());
    assert_eq!(m[&0x40101c].mnemonic, "movsb");
    assert!(!m[&0x401020].is_rep_string(), "repz ret is not a string insn");
    assert_eq!(m[&0x401020].flow(), Flow::Return);
    assert_eq!(m[&0x401022].flow(), Flow::Jump);
    assert_eq!(m[&0x401025].flow(), Flow::Syscall);
    assert_eq!(m[&0x401027].flow(), Flow::CondJump);
    assert_eq!(m[&0x401029].len, 10, "continuation line joined");
    assert_eq!(m[&0x401033].flow(), Flow::Call);
}

#[test]
fn arc_parser() {
    let text = "# header\n\
#  1 cpu\n\
  0 U 3      5 @    0 _start:/work/p/count_loop   1a2b_1a2b_count_loop_count_loop JUMP 0\n\
  1 U 1     12 @   1f std::vector<int, std::allocator<int> >::push_back(int const&):/usr/lib/libx.so   10_11_my_prog_worker_1 CALL /src/x.cc:42\n\
  1 K 4      0 @    0 sys_write:[kernel]   10_11_a_b IRET 0\n\
\n\
# tracing ended: buffer full\n";
    let v = parse_arc(text).expect("parse");
    assert_eq!(v.len(), 3);
    assert_eq!(v[0].cpu, 0);
    assert!(!v[0].kernel);
    assert_eq!(v[0].type_code, 3);
    assert_eq!(v[0].count, 5);
    assert_eq!(v[0].symbol, "_start");
    assert_eq!(v[0].module, "/work/p/count_loop");
    assert_eq!((v[0].pid, v[0].tid), (0x1a2b, 0x1a2b));
    assert_eq!(v[0].pname, "count_loop");
    assert_eq!(v[0].tname, "count_loop");
    assert_eq!(v[0].type_str, "JUMP");
    assert_eq!(v[0].lineno, 3);
    assert_eq!(v[1].symbol, "std::vector<int, std::allocator<int> >::push_back(int const&)");
    assert_eq!(v[1].module, "/usr/lib/libx.so");
    assert_eq!(v[1].offset, 0x1f);
    assert_eq!(v[1].names, "my_prog_worker_1");
    assert_eq!((v[1].file.as_str(), v[1].line), ("/src/x.cc", 42));
    assert_eq!((v[0].file.as_str(), v[0].line), ("", 0));
    assert!(v[2].kernel);
    assert_eq!(v[2].module, "[kernel]");
    check_arc_consistency(&v);
    assert_eq!(trailing_comments(text), vec!["# tracing ended: buffer full".to_string()]);
    assert!(parse_arc("  0 U 3 5 @ 0 x:y 1_1_a_a\n").is_err());
}

#[test]
fn callgrind_parser() {
    let text = "# callgrind format\nversion: 1\npositions: line\nevents: Ir\nsummary: 40\n\n\
ob=(1) /bin/prog\nfl=(1) ???\nfn=(2) leaf\n0 6\n\n\
fn=(3) fib'2\n0 4\ncfn=(3)\ncalls=2 0\n0 100\n+2 5\njump=1 +3\njcnd=1/2 -1\n* 1\n\n\
ob=(2) /lib/libc.so.6\nfn=(4) printf\n0 20\nfn=(3)\n0 4\n\ntotals: 40\n";
    let mut p = CallgrindProfile::default();
    parse_callgrind_into(text, &mut p).expect("parse");
    assert_eq!(p.summary, 40);
    let c = p.self_counts_in(Path::new("/bin/prog"));
    assert_eq!(c["leaf"], 6);
    assert_eq!(c["fib"], 10, "recursion suffix folded, call cost excluded");
    assert_eq!(p.self_counts()["fib"], 14);
    assert_eq!(p.self_counts()["printf"], 20);
    let mut bad = CallgrindProfile::default();
    assert!(parse_callgrind_into(&text.replace("totals: 40", "totals: 41"), &mut bad).is_err());
}

#[test]
fn symbol_lookup() {
    let nm = "0000000000001000 T _init\n\
0000000000001050 0000000000000022 T _start\n\
0000000000001080 t deregister_tm_clones\n\
00000000000010b0 t register_tm_clones\n\
00000000000011f2 0000000000000099 T main\n\
0000000000004040 0000000000000100 b data\n";
    let sections = "  9 .init 0000001b  0000000000001000  0000000000001000  00001000  2**2  CONTENTS\n\
 10 .plt 00000030  0000000000001020  0000000000001020  00001020  2**4  CONTENTS\n\
 11 .text 00000233  0000000000001050  0000000000001050  00001050  2**4  CONTENTS\n";
    let mut s = Symbols::parse(nm);
    s.sections = parse_sections(sections);
    assert_eq!(s.syms.len(), 5, "data symbols are left out");
    assert_eq!(s.describe(0x1000), "_init+0x0");
    assert_eq!(s.describe(0x1012), "_init+0x12", "zero size: up to the next symbol");
    assert_eq!(s.describe(0x1030), "<unknown>", ".plt is not _init's section");
    assert_eq!(s.describe(0x1071), "_start+0x21");
    assert_eq!(s.describe(0x1072), "<unknown>", "past _start's size");
    assert_eq!(s.describe(0x10c0), "register_tm_clones+0x10");
    assert_eq!(s.describe(0x11f2 + 0x98), "main+0x98");
    assert_eq!(s.describe(0x11f2 + 0x99), "<unknown>");
}

#[test]
fn name_splitting() {
    assert_eq!(split_names("a_b_a_b"), ("a_b".into(), "a_b".into()));
    assert_eq!(split_names("prog_worker"), ("prog".into(), "worker".into()));
}

#[test]
fn count_loop_hand_count_matches_qemu() {
    let bin = program("count_loop");
    let o = Oracle::of(&bin, &[]);
    assert_eq!(o.pcs.len() as u64, COUNT_LOOP_INSTRUCTIONS, "no rep: one line each");
    assert_eq!(o.instructions, COUNT_LOOP_INSTRUCTIONS);
    assert_eq!(o.branches.len(), COUNT_LOOP_BLOCKS);
    assert_eq!(o.branches.iter().map(|b| b.count).sum::<u64>(), COUNT_LOOP_INSTRUCTIONS);
    // the block list worked out in count_loop.S
    let u = |loc: &str, count, type_code| Expected::User { location: loc.to_string(), count, type_code };
    let mut want = vec![u("_start+0x0", 5, 3)];
    for _ in 0..998 {
        want.push(u("_start+0x7", 3, 3)); // iterations 2 .. N-1
    }
    want.extend([u("_start+0x7", 5, 1), u("check+0x0", 3, 3), u("check+0xf", 1, 2), u("_start+0x14", 3, 0)]);
    assert_eq!(o.expected, want);
    assert_eq!(o.branches.last().unwrap().to, 0, "the exit syscall ends the trace");
}

#[test]
fn branches_oracle_details() {
    let bin = program("branches");
    let o = Oracle::of(&bin, &[]);
    assert_eq!(o.pcs.len(), 114, "13 qemu lines for the 13-byte rep movsb");
    assert_eq!(o.instructions, 102, "hand count in branches.S");
    assert_eq!(o.branches.len(), 33, "hand count in branches.S");
    assert_eq!(o.branches.iter().map(|b| b.count).sum::<u64>(), 102);
    // the rep movsb with 13 iterations: 13 consecutive log lines, one insn
    let rep: Vec<u64> = o.insns.iter().filter(|(_, i)| i.is_rep_string()).map(|(pc, _)| *pc).collect();
    assert_eq!(rep.len(), 2);
    let runs: Vec<usize> = rep.iter().map(|pc| o.pcs.iter().filter(|p| *p == pc).count()).collect();
    assert_eq!(runs, vec![13, 1], "rep movsb 13 bytes / 0 bytes");
    // jmp and call to the next instruction are taken branches
    let to_next: Vec<BranchKind> =
        o.branches.iter().filter(|b| b.to == b.from + o.insns[&b.from].len).map(|b| b.kind).collect();
    assert_eq!(
        to_next,
        vec![
            BranchKind::Jump, // jmp *table to case 0, right after it
            BranchKind::Jump,
            BranchKind::Call,
            BranchKind::Intrpt // write returns to the next instruction
        ]
    );
    // the loop instruction jumps to itself twice
    let self_loops = o.branches.iter().filter(|b| b.to == b.from).count();
    assert_eq!(self_loops, 2);
    // 4 jumps through the table, 1 jmp *%rdx, 2 indirect calls
    let indirect = o.branches.iter().filter(|b| o.insns[&b.from].text.contains('*')).count();
    assert_eq!(indirect, 4 + 1 + 2);
    assert_eq!(o.expected.iter().filter(|e| **e == Expected::Kernel).count(), 1);
}

#[test]
fn long_loop_hand_count_matches_qemu() {
    let bin = program("long_loop");
    let o = Oracle::of(&bin, &[]);
    assert_eq!(o.instructions, LONG_LOOP_INSTRUCTIONS);
    assert_eq!(o.branches.len(), LONG_LOOP_BLOCKS);
}

/// callgrind and qemu agree on the freestanding programs (where there is
/// no rep string instruction: callgrind counts rep iterations its own way).
#[test]
fn callgrind_matches_qemu_on_freestanding_programs() {
    // callgrind calls a program's entry function "(below main)", and never
    // counts the basic block that ends with the exit system call (3
    // instructions in count_loop and long_loop).
    for (name, funcs) in [
        ("count_loop", &["_start", "check"][..]),
        ("long_loop", &["_start", "inner"][..]),
        ("branches", &["leaf", "dispatch"][..]),
    ] {
        let bin = program(name);
        let pcs = qemu_exec_pcs(&bin, &[]);
        let q = qemu_self_counts(&bin, &pcs);
        let c = callgrind_profile(&bin, &[], false).self_counts_in(&bin);
        for f in funcs {
            if *f == "_start" {
                assert_eq!(c["(below main)"] + 3, q["_start"], "{name}: _start");
            } else {
                assert_eq!(c.get(*f), q.get(*f), "{name}: {f}: callgrind vs qemu");
            }
        }
    }
    let c = callgrind_self_counts(&program("count_loop"), &[], false);
    assert_eq!(c["(below main)"] + c["check"] + 3, COUNT_LOOP_INSTRUCTIONS);
}

#[test]
fn callgrind_fib_matches_formula() {
    let bin = program("fib");
    let c = callgrind_profile(&bin, &[], false).self_counts_in(&bin);
    assert_eq!(c["fib_asm"], FIB_ASM_SELF, "4 F(16) + 14 (F(16) - 1)");
}

/// The two oracles for the libc programs' own functions, callgrind and
/// qemu (which loads the PIE elsewhere), give the same counts; and two
/// callgrind runs agree (the counts are deterministic).
#[test]
fn callgrind_matches_qemu_on_libc_programs() {
    for (name, funcs) in OWN_FUNCTIONS {
        let bin = program(name);
        let pcs = qemu_exec_pcs(&bin, &[]);
        let q = qemu_self_counts(&bin, &pcs);
        let c1 = callgrind_profile(&bin, &[], false).self_counts_in(&bin);
        let c2 = callgrind_profile(&bin, &[], false).self_counts_in(&bin);
        for f in *funcs {
            let cv = c1.get(*f).copied();
            assert!(cv.unwrap_or(0) > 0, "{name}: callgrind has no {f}");
            assert_eq!(cv, q.get(*f).copied(), "{name}: {f}: callgrind vs qemu");
            assert_eq!(cv, c2.get(*f).copied(), "{name}: {f}: two callgrind runs");
        }
    }
}

/// The forked child's counts before its exec reach callgrind (thanks to the
/// client requests in forkexec.c), and nothing is counted twice.
#[test]
fn callgrind_follows_fork_and_exec() {
    let bin = program("forkexec");
    let p = callgrind_profile(&bin, &[], true);
    let c = p.self_counts_in(&bin);
    for f in ["main", "fe_parent_work", "fe_child_work", "fe_child_main", "fe_exec_work", "fe_mix"] {
        assert!(c.get(f).copied().unwrap_or(0) > 0, "callgrind has no {f}");
    }
    // each *_work function runs once (same code shape, same count)
    assert_eq!(c["fe_parent_work"], c["fe_child_work"]);
    assert_eq!(c["fe_parent_work"], c["fe_exec_work"]);
    // fe_mix's count is linear in its iterations: parent 300, child 500,
    // exec'd child 700. qemu gives fe_mix(700) from `forkexec child`.
    let pcs = qemu_exec_pcs(&bin, &["child"]);
    let q = qemu_self_counts(&bin, &pcs);
    let exec_child = callgrind_profile(&bin, &["child"], false).self_counts_in(&bin);
    assert_eq!(exec_child.get("fe_mix"), q.get("fe_mix"));
    let per_call = q["fe_mix"] % 700; // a + b n with n = 700, a < 700
    let per_iter = (q["fe_mix"] - per_call) / 700;
    assert_eq!(c["fe_mix"], 3 * per_call + 1500 * per_iter);
}

/// The libc programs' own functions contain no rep string instruction
/// (itrace counts one per execution, callgrind one per iteration), and the
/// switch in jumptable.c is an indirect jump through a table.
#[test]
fn libc_programs_are_suitable_oracles() {
    let mut all: Vec<(&str, Vec<&str>)> = OWN_FUNCTIONS.iter().map(|(p, f)| (*p, f.to_vec())).collect();
    all.push((
        "forkexec",
        vec![
            "main",
            "fe_mix",
            "fe_parent_work",
            "fe_child_work",
            "fe_exec_work",
            "fe_child_main",
            "fe_spawn",
            "fe_exec_self",
        ],
    ));
    all.push(("spinner", vec!["main", "spin_round", "spin_sleep"]));
    all.push(("crash", vec!["main", "crash_level1", "crash_level2", "crash_level3"]));
    for (name, funcs) in &all {
        let bin = program(name);
        let insns = objdump_insns(&bin);
        let syms = Symbols::of(&bin);
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (pc, insn) in &insns {
            if let Some((s, _)) = syms.lookup(*pc) {
                if let Some(f) = funcs.iter().find(|f| **f == s.name) {
                    *seen.entry(f).or_insert(0) += 1;
                    assert!(
                        !insn.is_rep_string(),
                        "{name}: {f} has a rep string instruction at {pc:#x}: {}",
                        insn.text
                    );
                }
            }
        }
        for f in funcs {
            // static helpers may be inlined away; the exported ones may not
            if *f != "spin_sleep" {
                assert!(seen.contains_key(f), "{name}: no code for {f}");
            }
        }
    }
    let bin = program("jumptable");
    let insns = objdump_insns(&bin);
    let syms = Symbols::of(&bin);
    let jt = syms.by_name("jt_classify").expect("jt_classify");
    let indirect =
        insns.range(jt.addr..jt.addr + jt.size).filter(|(_, i)| i.flow() == Flow::Jump && i.text.contains('*')).count();
    assert_eq!(indirect, 1, "jt_classify must use a jump table");
}
