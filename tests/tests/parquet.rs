//! `itrace export --format parquet`, read by DuckDB (its Python package, a reader that shares
//! no code with itrace's writer):
//! - count_loop.S: the rows are its hand count (3011 instructions in 1003 blocks: 1000 taken
//!   conditional jumps, a call, a return, the exit system call), `check` runs 4 of them and
//!   `_start` the rest, the call goes to nm's address of `check` and the return to the
//!   instruction after the call; the column types are those docs/arc-and-report.md lists.
//! - long_loop.S in row groups of 65,536 rows: its hand count across the groups' bounds.
//! - threads, signal handlers, a crash: row by row the table is the arc (cpu, K/U, kind,
//!   instructions, symbol, offset, module, pid, tid, names, source line); its totals are the
//!   report's (instructions, taken branches, per thread), and grouped by function its
//!   instructions are the report's self count of every function.
//! - the rows with a `call_kind`, grouped by `called_function`, are the report's calls of every
//!   function: with lazily bound PLT calls, tail calls, recursion, threads, signal handlers.

use itrace_tests::{
    arc_text, itrace, parse_arc, program, record, report_json, run, test_dir, ArcLine, Symbols, COUNT_LOOP_BLOCKS,
    COUNT_LOOP_INSTRUCTIONS, LONG_LOOP_BLOCKS, LONG_LOOP_INSTRUCTIONS,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The DuckDB Python package scripts/install-test-deps.sh installs.
const DUCKDB_VERSION: &str = "1.4.4";

/// Runs each named SQL query on the Parquet file at `table` (as view `t`) with DuckDB: its
/// rows, as JSON arrays. Fails naming what to install when DuckDB is missing.
fn duckdb(table: &Path, queries: &[(&str, &str)]) -> BTreeMap<String, Vec<Vec<Value>>> {
    const SCRIPT: &str = r#"
import json, sys
try:
    import duckdb
except ImportError:
    sys.exit("no-duckdb")
con = duckdb.connect()
path = sys.argv[1].replace("'", "''")
con.execute("CREATE VIEW t AS SELECT * FROM read_parquet('%s')" % path)
con.execute("SET VARIABLE parquet_file = '%s'" % path)
out = {name: [list(r) for r in con.execute(sql).fetchall()] for name, sql in json.loads(sys.argv[2]).items()}
print(json.dumps(out, default=str))
"#;
    let install = format!(
        "install DuckDB's Python package: python3 -m pip install duckdb=={DUCKDB_VERSION} \
         (scripts/install-test-deps.sh does)"
    );
    let queries: serde_json::Map<String, Value> = queries.iter().map(|(k, q)| (k.to_string(), json!(q))).collect();
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(SCRIPT).arg(table).arg(Value::Object(queries).to_string());
    if Command::new("python3").arg("--version").output().is_err() {
        panic!("python3 is not installed: install the Debian package python3, then {install}");
    }
    let out = run(&mut cmd);
    assert!(!out.stderr.contains("no-duckdb"), "DuckDB is missing: {install}");
    assert!(out.success(), "DuckDB failed on {}:\n{}", table.display(), out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("DuckDB's answer is not JSON ({e}): {}", out.stdout))
}

/// Records `name` and exports its table: (trace, table).
fn traced_table(name: &str) -> (PathBuf, PathBuf) {
    traced_table_with(name, &[])
}

/// [`traced_table`] with export `options`.
fn traced_table_with(name: &str, options: &[&str]) -> (PathBuf, PathBuf) {
    let dir = test_dir(&format!("parquet-{name}"));
    let trace = dir.join("t.itr");
    let rec = record(&trace, &[], &program(name), &[]);
    // A crash is the program's exit status, not a failure to trace it.
    assert!(trace.is_file(), "no trace of {name}: {}", rec.stderr);
    let table = dir.join("t.parquet");
    let mut args = vec![
        OsStr::new("export"),
        trace.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("parquet"),
        OsStr::new("-o"),
        table.as_os_str(),
    ];
    args.extend(options.iter().map(OsStr::new));
    let out = itrace(args);
    out.assert_success();
    (trace, table)
}

fn int(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

/// Query results of one integer each, by name.
fn ints(rows: &BTreeMap<String, Vec<Vec<Value>>>, name: &str) -> u64 {
    int(&rows[name][0][0])
}

#[test]
fn count_loop_rows_are_the_hand_count() {
    let bin = program("count_loop");
    let (_, table) = traced_table("count_loop");
    let r = duckdb(
        &table,
        &[
            ("rows", "SELECT count(*) FROM t"),
            ("instructions", "SELECT sum(instructions) FROM t"),
            ("seq", "SELECT min(seq), max(seq), count(DISTINCT seq) FROM t"),
            ("kinds", "SELECT kind, mode, count(*) FROM t GROUP BY ALL ORDER BY kind"),
            ("functions", "SELECT function, module, sum(instructions) FROM t WHERE mode = 'U' GROUP BY ALL ORDER BY function"),
            ("call", "SELECT from_address, to_address, to_function, to_function_offset, to_module FROM t WHERE kind = 'call'"),
            ("counted", "SELECT kind, call_kind, called_function, called_module FROM t WHERE call_kind IS NOT NULL"),
            ("return", "SELECT address, function, function_offset, to_address, to_function, to_function_offset FROM t WHERE kind = 'return'"),
            ("threads", "SELECT DISTINCT pid, tid, process FROM t"),
            ("schema", "SELECT column_name, column_type FROM (DESCRIBE t)"),
        ],
    );
    assert_eq!(ints(&r, "rows"), COUNT_LOOP_BLOCKS as u64, "one row per block (count_loop.S)");
    assert_eq!(ints(&r, "instructions"), COUNT_LOOP_INSTRUCTIONS, "hand count (count_loop.S)");
    let n = COUNT_LOOP_BLOCKS as u64;
    assert_eq!(r["seq"][0], vec![json!(0), json!(n - 1), json!(n)], "seq numbers the rows from 0");
    let kinds: Vec<(String, String, u64)> = r["kinds"]
        .iter()
        .map(|row| (row[0].as_str().unwrap().to_string(), row[1].as_str().unwrap().to_string(), int(&row[2])))
        .collect();
    let want = [("call", "U", 1), ("cond_jump", "U", 1000), ("intrpt", "U", 1), ("return", "U", 1)];
    assert_eq!(kinds, want.map(|(k, m, n)| (k.to_string(), m.to_string(), n)), "jnz 999 times, je, call, ret, exit");
    let module = bin.to_string_lossy();
    assert_eq!(
        r["functions"],
        vec![
            vec![json!("_start"), json!(module), json!(COUNT_LOOP_INSTRUCTIONS - 4)],
            vec![json!("check"), json!(module), json!(4)]
        ],
        "check: xor cmp je ret; _start the rest"
    );
    let nm = Symbols::of(&bin);
    let check = nm.by_name("check").expect("nm: check").addr;
    let start = nm.by_name("_start").expect("nm: _start").addr;
    let call = &r["call"][0];
    assert_eq!(int(&call[1]), check, "the call goes to check (nm)");
    assert_eq!((&call[2], &call[3], &call[4]), (&json!("check"), &json!(0), &json!(module)));
    assert_eq!(
        r["counted"],
        vec![vec![json!("call"), json!("call"), json!("check"), json!(module)]],
        "one call, of check"
    );
    let ret = &r["return"][0];
    assert_eq!(int(&ret[0]), check + 0xf, "the ret's block is the ret alone, at check+0xf");
    assert_eq!((&ret[1], int(&ret[2])), (&json!("check"), 0xf));
    assert_eq!(int(&ret[3]), int(&call[0]) + 5, "ret returns after the 5-byte call");
    assert_eq!(int(&ret[3]), start + 0x14, "to _start+0x14 (count_loop.S)");
    assert_eq!((&ret[4], int(&ret[5])), (&json!("_start"), 0x14));
    let threads = &r["threads"];
    assert_eq!(threads.len(), 1, "one thread: {threads:?}");
    assert_eq!(threads[0][0], threads[0][1], "pid = tid");
    assert_eq!(threads[0][2], json!("count_loop"));

    // The types docs/arc-and-report.md documents.
    let schema: Vec<(String, String)> = r["schema"]
        .iter()
        .map(|row| (row[0].as_str().unwrap().to_string(), row[1].as_str().unwrap().to_string()))
        .collect();
    let documented = [
        ("seq", "UBIGINT"),
        ("timestamp_ns", "UBIGINT"),
        ("cpu", "USMALLINT"),
        ("pid", "UINTEGER"),
        ("tid", "UINTEGER"),
        ("process", "VARCHAR"),
        ("thread", "VARCHAR"),
        ("mode", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("instructions", "UINTEGER"),
        ("address", "UBIGINT"),
        ("function", "VARCHAR"),
        ("function_offset", "UBIGINT"),
        ("module", "VARCHAR"),
        ("file", "VARCHAR"),
        ("line", "UINTEGER"),
        ("from_address", "UBIGINT"),
        ("to_address", "UBIGINT"),
        ("to_function", "VARCHAR"),
        ("to_function_offset", "UBIGINT"),
        ("to_module", "VARCHAR"),
        ("call_kind", "VARCHAR"),
        ("called_function", "VARCHAR"),
        ("called_module", "VARCHAR"),
    ];
    assert_eq!(schema, documented.map(|(c, t)| (c.to_string(), t.to_string())));
}

/// long_loop.S in row groups of 65,536 rows: its 201,501 blocks and the write system call's
/// return (a K row) make 4 groups (3 full), and across their bounds the rows are still the
/// hand count, numbered without a gap.
#[test]
fn long_loop_rows_span_row_groups() {
    let (_, table) = traced_table_with("long_loop", &["--row-group-size", "65536"]);
    let r = duckdb(
        &table,
        &[
            ("instructions", "SELECT sum(instructions) FROM t"),
            ("modes", "SELECT count(*) FILTER (mode = 'U'), count(*) FILTER (mode = 'K') FROM t"),
            ("seq", "SELECT min(seq), max(seq), count(DISTINCT seq), count(*) FROM t"),
            (
                "groups",
                "SELECT row_group_id, row_group_num_rows FROM parquet_metadata(getvariable('parquet_file')) \
                 GROUP BY ALL ORDER BY row_group_id",
            ),
        ],
    );
    assert_eq!(ints(&r, "instructions"), LONG_LOOP_INSTRUCTIONS, "hand count (long_loop.S)");
    let blocks = LONG_LOOP_BLOCKS as u64;
    assert_eq!(r["modes"][0], vec![json!(blocks), json!(1)], "U blocks (long_loop.S), the return from write");
    let n = blocks + 1;
    assert_eq!(r["seq"][0], vec![json!(0), json!(n - 1), json!(n), json!(n)], "rows numbered 0..{n}");
    let groups: Vec<u64> = r["groups"].iter().map(|g| int(&g[1])).collect();
    assert_eq!(groups, vec![65536, 65536, 65536, n - 3 * 65536], "rows per row group");
}

/// The arc's field 9 for a `kind`.
fn arc_kind(kind: &str) -> String {
    match kind {
        "cond_jump" => "JUMP".to_string(),
        "end" => "OTHER".to_string(),
        k => k.to_uppercase(),
    }
}

/// A name as the arc's field 8 writes it: `-` when empty, whitespace as `-`.
fn arc_name(s: &str) -> String {
    if s.is_empty() {
        return "-".to_string();
    }
    s.chars().map(|c| if c.is_whitespace() { '-' } else { c }).collect()
}

/// Row by row the table of `name` is its arc, and its totals the report's. Returns the
/// number of `end` rows.
fn check_against_arc_and_report(name: &str) -> u64 {
    let (trace, table) = traced_table(name);
    let r = duckdb(
        &table,
        &[
            (
                "rows",
                "SELECT cpu, mode, kind, instructions, function_offset, function, module, pid, tid, process, thread, \
                 file, line FROM t ORDER BY seq",
            ),
            ("totals", "SELECT count(*) FILTER (kind <> 'end'), sum(instructions) FROM t"),
            (
                "functions",
                "SELECT function, module, sum(instructions) FROM t GROUP BY ALL HAVING sum(instructions) > 0",
            ),
            ("threads", "SELECT tid, sum(instructions), count(*) FILTER (kind <> 'end') FROM t GROUP BY tid"),
            ("ends", "SELECT count(*) FROM t WHERE kind = 'end'"),
            (
                "end_last",
                "SELECT count(*) FROM t WHERE kind = 'end' AND seq <> (SELECT max(seq) FROM t AS u WHERE u.tid = t.tid)",
            ),
        ],
    );

    // Row by row: the arc.
    let arc: Vec<ArcLine> = parse_arc(&arc_text(&trace)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let rows = &r["rows"];
    assert_eq!(rows.len(), arc.len(), "{name}: one row per arc line");
    for (row, l) in rows.iter().zip(&arc) {
        let s = |i: usize| row[i].as_str().unwrap_or_else(|| panic!("column {i} of {row:?}: not a string"));
        let (file, line) = match (&row[11], &row[12]) {
            (Value::Null, Value::Null) => (String::new(), 0),
            (f, n) => (f.as_str().expect("file").to_string(), int(n)),
        };
        let got = (
            row[0].as_u64().unwrap_or(0) as u32,
            s(1) == "K",
            arc_kind(s(2)),
            int(&row[3]),
            int(&row[4]),
            s(5).to_string(),
            s(6).to_string(),
            int(&row[7]),
            int(&row[8]),
            format!("{}_{}", arc_name(s(9)), arc_name(s(10))),
            file,
            line,
        );
        let want = (
            l.cpu,
            l.kernel,
            l.type_str.clone(),
            l.count,
            l.offset,
            l.symbol.clone(),
            l.module.clone(),
            l.pid,
            l.tid,
            l.names.clone(),
            l.file.clone(),
            l.line,
        );
        assert_eq!(got, want, "{name}: row of arc line {}", l.lineno);
    }

    // Totals: the report's.
    let report = report_json(&trace);
    let totals = &r["totals"][0];
    assert_eq!(int(&totals[0]), int(&report["total_branches"]), "{name}: taken branches");
    assert_eq!(int(&totals[1]), int(&report["total_instructions"]), "{name}: instructions");
    let table_threads: BTreeMap<u64, (u64, u64)> =
        r["threads"].iter().map(|t| (int(&t[0]), (int(&t[1]), int(&t[2])))).collect();
    let report_threads: BTreeMap<u64, (u64, u64)> = report["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .map(|t| (int(&t["tid"]), (int(&t["instructions"]), int(&t["branches"]))))
        .collect();
    assert_eq!(table_threads, report_threads, "{name}: (instructions, branches) per thread");
    let table_functions: BTreeMap<(String, String), u64> = r["functions"]
        .iter()
        .map(|f| ((f[0].as_str().unwrap().to_string(), f[1].as_str().unwrap().to_string()), int(&f[2])))
        .collect();
    let report_functions: BTreeMap<(String, String), u64> = report["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .filter(|f| int(&f["self"]) > 0)
        .map(|f| {
            let key = (f["name"].as_str().unwrap().to_string(), f["module"].as_str().unwrap().to_string());
            (key, int(&f["self"]))
        })
        .collect();
    assert!(table_functions.len() > 10, "{name}: {} functions", table_functions.len());
    assert_eq!(table_functions, report_functions, "{name}: instructions per function = the report's self counts");
    check_calls(name, &table, &report);
    assert_eq!(ints(&r, "end_last"), 0, "{name}: an end row is its thread's last");
    ints(&r, "ends")
}

/// Calls per function, (name, module), from the report (summed over its entries).
fn report_calls(report: &Value) -> BTreeMap<(String, String), u64> {
    let mut calls = BTreeMap::new();
    for f in report["functions"].as_array().expect("functions") {
        let key = (f["name"].as_str().unwrap().to_string(), f["module"].as_str().unwrap().to_string());
        *calls.entry(key).or_default() += int(&f["calls"]);
    }
    calls.retain(|_, n| *n > 0);
    calls
}

/// The rows with a `call_kind`, counted per `called_function` and `called_module`, are the
/// report's calls per function; returns the calls per kind.
fn check_calls(name: &str, table: &Path, report: &Value) -> BTreeMap<String, u64> {
    let r = duckdb(
        table,
        &[
            (
                "calls",
                "SELECT called_function, called_module, count(*) FROM t WHERE call_kind IS NOT NULL GROUP BY ALL",
            ),
            ("kinds", "SELECT call_kind, count(*) FROM t WHERE call_kind IS NOT NULL GROUP BY ALL"),
        ],
    );
    let table_calls: BTreeMap<(String, String), u64> = r["calls"]
        .iter()
        .map(|f| ((f[0].as_str().unwrap().to_string(), f[1].as_str().unwrap().to_string()), int(&f[2])))
        .collect();
    assert_eq!(table_calls, report_calls(report), "{name}: rows with a call_kind per function = the report's calls");
    r["kinds"].iter().map(|k| (k[0].as_str().unwrap().to_string(), int(&k[1]))).collect()
}

/// Calls through the PLT (lazily bound: the resolver runs inside the first call of each) and
/// tail calls: the rows the report counts as calls are not the rows of kind `call` (a call to
/// a stub is a call of the stub's target, a tail call is a jump), but `call_kind` gives them.
#[test]
fn call_kind_rows_are_the_reports_calls() {
    for (name, kind) in [("pltcalls", "plt_call"), ("tailcall", "tail_call"), ("fib", "call")] {
        let dir = test_dir(&format!("parquet-calls-{name}"));
        let trace = dir.join("t.itr");
        let rec = run(Command::new(itrace_tests::itrace_bin())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(program(name))
            .env_remove("LD_BIND_NOW"));
        rec.assert_success();
        let table = dir.join("t.parquet");
        itrace([
            OsStr::new("export"),
            trace.as_os_str(),
            "--format".as_ref(),
            "parquet".as_ref(),
            "-o".as_ref(),
            table.as_os_str(),
        ])
        .assert_success();
        let kinds = check_calls(name, &table, &report_json(&trace));
        assert!(kinds.get(kind).is_some_and(|&n| n > 0), "{name}: no {kind} rows: {kinds:?}");
    }
}

#[test]
fn threads_table_is_the_arc_and_the_report() {
    assert_eq!(check_against_arc_and_report("threads"), 0);
}

#[test]
fn signal_table_is_the_arc_and_the_report() {
    assert_eq!(check_against_arc_and_report("signal"), 0);
}

/// A crash ends the thread inside a block: the table's `end` row, as the arc's OTHER line.
#[test]
fn crash_table_is_the_arc_and_the_report() {
    assert_eq!(check_against_arc_and_report("segv"), 1);
}

/// A missing trace, an output that cannot be created, no rows per group: one `itrace:` line,
/// and no table.
#[test]
fn bad_input_is_one_line_and_no_table() {
    let dir = test_dir("parquet-bad-input");
    let missing = dir.join("missing.itr");
    let table = dir.join("t.parquet");
    let (trace, _) = traced_table("branches");
    let no_dir = dir.join("no-such-dir").join("t.parquet");
    let cases: [(&Path, &Path, &str, &str); 3] = [
        (&missing, &table, "1", "missing.itr"),
        (&trace, &no_dir, "1", "cannot create"),
        (&trace, &table, "0", "--row-group-size"),
    ];
    for (input, output, rows, says) in cases {
        let out = itrace([
            OsStr::new("export"),
            input.as_os_str(),
            OsStr::new("--format"),
            OsStr::new("parquet"),
            OsStr::new("-o"),
            output.as_os_str(),
            OsStr::new("--row-group-size"),
            OsStr::new(rows),
        ]);
        let line = out.assert_clean_error();
        assert!(line.contains(says), "{}: the error should name {says:?}: {line}", out.command);
        assert!(!output.exists(), "{}: wrote {}", out.command, output.display());
    }
}
