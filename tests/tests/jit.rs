//! JIT code named in /tmp/perf-PID.map resolves in the arc and the report
//! (`name:JITCODE`), with the instruction and call counts worked out by hand
//! in tests/programs/jit.c: 3 calls of a 3-instruction function.

use itrace_tests::{arc_lines, arc_text, program, record, report_json, test_dir};

#[test]
fn perf_map_symbols_name_jit_code() {
    let bin = program("jit");
    let dir = test_dir("jit");
    let trace = dir.join("t.itr");
    let rec = record(&trace, &[], &bin, &[]);
    rec.assert_success();
    assert!(rec.stdout.contains("jit: 12"), "the program did not run right: {}", rec.stdout);

    let text = arc_text(&trace);
    std::fs::write(dir.join("t.arc"), &text).unwrap();
    // The program's pid is in every arc line's pid_tid field; its map file is left behind.
    let lines = arc_lines(&text);
    let jit: Vec<_> = lines.iter().filter(|l| l.module == "JITCODE").collect();
    let pid = lines.last().expect("no blocks").pid;
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    assert_eq!(jit.len(), 3, "one block per call of jit_double: {jit:?}");
    for l in &jit {
        assert_eq!((l.symbol.as_str(), l.offset, l.count, l.type_str.as_str()), ("jit_double", 0, 3, "RETURN"));
    }

    let report = report_json(&trace);
    let f = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "jit_double")
        .unwrap_or_else(|| panic!("jit_double not in the report"));
    assert_eq!((f["module"].as_str(), f["self"].as_u64(), f["calls"].as_u64()), (Some("JITCODE"), Some(9), Some(3)));
}
