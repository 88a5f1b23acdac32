//! `itrace calib`: the hookit profiler's calibrated per-function counts against the truth of
//! the instruction trace of the same run, and that truth against callgrind (the instrumented
//! program less the glue objdump shows; the uninstrumented program where objdump shows the
//! same function bodies) and hand counts.

use itrace_tests::{callgrind_profile, itrace, program, programs_dir, require_tool, run, target_dir, test_dir, Output};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static CALIBRATION: OnceLock<PathBuf> = OnceLock::new();

/// The trained calibration file (trained once per test binary).
fn calibration() -> PathBuf {
    CALIBRATION
        .get_or_init(|| {
            let dir = test_dir("calib-train");
            let f = dir.join("itrace.calib");
            let o = itrace(["calib", "train", "-o", f.to_str().unwrap()]);
            o.assert_success();
            assert!(o.stderr.contains("trained"), "{}", o.stderr);
            f
        })
        .clone()
}

/// `itrace calib validate --json` of a test program; the per-function rows by name.
fn validate(name: &str) -> (Output, HashMap<String, serde_json::Value>) {
    let cal = calibration();
    let dir = test_dir(&format!("calib-{name}"));
    let o = itrace([
        "calib",
        "validate",
        "-c",
        cal.to_str().unwrap(),
        "--json",
        "--min-calls",
        "100",
        "--logs",
        dir.to_str().unwrap(),
        "--",
        program(name).to_str().unwrap(),
    ]);
    o.assert_no_panic();
    let v: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{name}: no JSON ({e}): {}\n{}", o.stdout, o.stderr));
    let rows = v["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["function"].as_str().unwrap().to_string(), r.clone()))
        .collect();
    (o, rows)
}

/// Calibrated within 1% of the truth for every function with at least 100 calls; the
/// uncalibrated counts of the tiny functions far off. Returns the rows.
fn check_program(name: &str, tiny: &[&str]) -> HashMap<String, serde_json::Value> {
    let (o, rows) = validate(name);
    let busy: Vec<&serde_json::Value> = rows.values().filter(|r| r["calls"].as_u64().unwrap() >= 100).collect();
    assert!(!busy.is_empty(), "{name}: no function with 100 calls: {rows:?}");
    let mut worst = 0.0f64;
    for r in &busy {
        let e = r["error_pct"].as_f64().unwrap_or(f64::INFINITY).abs();
        assert!(e <= 1.0, "{name}: {} calibrated error {e}% > 1%: {r}", r["function"]);
        worst = worst.max(e);
    }
    assert!(o.success(), "{name}: validate failed: {}\n{}", o.stdout, o.stderr);
    for f in tiny {
        let r = &rows[*f];
        let (t, u) = (r["truth"].as_u64().unwrap(), r["uncalibrated"].as_u64().unwrap());
        assert!(u >= t * 2 + 100, "{name}: {f}: uncalibrated {u} should be far above the truth {t}");
    }
    let raw = busy
        .iter()
        .filter(|r| r["truth"].as_u64() != Some(0))
        .map(|r| r["uncalibrated_error_pct"].as_f64().unwrap())
        .fold(0.0, f64::max);
    let zero: Vec<String> = busy
        .iter()
        .filter(|r| r["truth"].as_u64() == Some(0))
        .map(|r| format!("{} {}/{}", r["function"], r["uncalibrated"], r["calls"]))
        .collect();
    eprintln!(
        "{name}: {} functions with >= 100 calls: max calibrated error {worst:.3}%, max uncalibrated error {raw:.0}% \
         (where the truth is not 0); truth 0, uncalibrated/calls: {zero:?}",
        busy.len()
    );
    rows
}

#[test]
fn recursion() {
    let rows = check_program("calib_recursion", &["depth", "fib"]);
    assert_eq!(rows["depth"]["calls"], 602);
    assert_eq!(rows["fib"]["calls"], 287);
    // Hand count of depth's own code (objdump of the instrumented build), per call: prologue 5
    // (push, mov, push, sub, mov), test+jne 2, then either the recursion (lea+call 2, lea+jmp 2
    // after it) or nothing, epilogue 4 (mov, mov, leave, ret); the hooks' glue (3 per hook)
    // excluded. 600 recursing calls and 2 at the bottom.
    assert_eq!(rows["depth"]["own"].as_u64(), Some(600 * 15 + 2 * 11));
    // The reports: log-gen has one line per event, its calibrated deltas add up to the trace's
    // truth of all functions; log-rt's BASE of the depth nodes adds up to depth's truth, one
    // level deeper each.
    let dir = target_dir().join("test-output").join("calib-calib_recursion");
    let gen = std::fs::read_to_string(dir.join("log-gen")).unwrap();
    let lines: Vec<Vec<&str>> = gen.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.len(), 2 * (602 + 287 + 1));
    let truth_all: u64 = rows.values().map(|r| r["truth"].as_u64().unwrap()).sum();
    assert_eq!(lines.iter().map(|l| l[3].parse::<u64>().unwrap()).sum::<u64>(), truth_all);
    let rt = std::fs::read_to_string(dir.join("log-rt")).unwrap();
    let depth_nodes: Vec<Vec<&str>> =
        rt.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).filter(|f| f.last() == Some(&"depth")).collect();
    assert_eq!(depth_nodes.len(), 301);
    assert!(depth_nodes.iter().enumerate().all(|(i, f)| f[0] == (i + 1).to_string()));
    let base: u64 = depth_nodes.iter().map(|f| f[3].parse::<u64>().unwrap()).sum();
    assert_eq!(base, rows["depth"]["truth"].as_u64().unwrap());
    let same = truth_against_callgrind("calib_recursion", &rows, &["main"]);
    assert!(same.contains(&"fib".to_string()), "fib's body should match the uninstrumented build: {same:?}");
}

#[test]
fn tiny_leaves() {
    let rows = check_program("calib_tiny", &["t0", "t1", "t2", "t3", "t4"]);
    // Hand count: t3 is empty; every instruction between its hooks is instrumentation.
    assert_eq!((rows["t3"]["calls"].as_u64(), rows["t3"]["truth"].as_u64()), (Some(400), Some(0)));
    assert_eq!(rows["t3"]["calibrated"].as_u64(), Some(0));
    let _ = truth_against_callgrind("calib_tiny", &rows, &["main"]);
}

#[test]
fn pointers_and_plt() {
    let rows = check_program("calib_pointers", &["add1", "shlib_square"]);
    assert_eq!(rows["shlib_square"]["calls"], 600);
    assert_eq!(rows["add1"]["calls"], 100);
    let _ = truth_against_callgrind("calib_pointers", &rows, &["main"]);
}

#[test]
fn cpp_methods() {
    let rows = check_program("calib_cpp", &["Counter::get() const"]);
    assert_eq!(rows["Counter::add(int)"]["calls"], 200);
    // bump is inlined into add: its hooks run in add's code (with bump's address), so neither
    // function's code maps to its own events; only get is compared.
    let _ = truth_against_callgrind("calib_cpp", &rows, &["main", "Counter::bump()", "Counter::add(int)"]);
}

#[test]
fn two_threads() {
    let rows = check_program("calib_threads", &["work"]);
    assert_eq!(rows["work"]["calls"], 600);
    assert_eq!(rows["step2"]["calls"], 300);
    let _ = truth_against_callgrind("calib_threads", &rows, &["thread_main"]);
}

/// Each function's instructions as objdump shows them: (mnemonic, operands).
fn bodies(bin: &Path) -> HashMap<String, Vec<(String, String)>> {
    let o = run(std::process::Command::new(require_tool("objdump")).args(["-d", "--no-show-raw-insn", "-C"]).arg(bin));
    assert!(o.success());
    let mut out: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let mut cur: Option<String> = None;
    for line in o.stdout.lines() {
        if let Some(name) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")).map(|(_, n)| n.to_string()) {
            cur = Some(name);
            continue;
        }
        let (Some(f), Some((_, ins))) = (&cur, line.split_once(":\t")) else { continue };
        // Operands without objdump's `# address <symbol>` comment.
        let ins = ins.split('#').next().unwrap_or("");
        let mut p = ins.split_whitespace();
        let m = p.next().unwrap_or("").to_string();
        out.entry(f.clone()).or_default().push((m, p.collect::<Vec<_>>().join(" ")));
    }
    out
}

/// An instrumented body without the instrumentation glue (each call of a hook and the last
/// writes of %rdi and %rsi before it): its mnemonics, and the glue instructions of each hook
/// call site (entries, exits).
fn strip_glue(body: &[(String, String)]) -> (Vec<String>, Vec<u64>, Vec<u64>) {
    let mut drop = vec![false; body.len()];
    let (mut enter, mut exit) = (Vec::new(), Vec::new());
    for (i, (m, ops)) in body.iter().enumerate() {
        if m == "call" && ops.contains("__cyg_profile_func_") {
            drop[i] = true;
            let mut n = 1;
            let (mut di, mut si) = (false, false);
            for j in (0..i).rev() {
                let (m, ops) = &body[j];
                if !(m.starts_with("mov") || m.starts_with("lea")) {
                    continue;
                }
                if !di && (ops.ends_with(",%rdi") || ops.ends_with(",%edi")) {
                    di = true;
                    drop[j] = true;
                    n += 1;
                } else if !si && (ops.ends_with(",%rsi") || ops.ends_with(",%esi")) {
                    si = true;
                    drop[j] = true;
                    n += 1;
                }
                if di && si {
                    break;
                }
            }
            if ops.contains("_enter") {
                enter.push(n);
            } else {
                exit.push(n);
            }
        }
    }
    (body.iter().zip(drop).filter(|(_, d)| !d).map(|((m, _), _)| m.clone()).collect(), enter, exit)
}

/// Self counts per (module file name, function) of a callgrind run.
fn callgrind_by_module(bin: &Path) -> HashMap<(String, String), u64> {
    let mut out = HashMap::new();
    for ((o, f), v) in callgrind_profile(bin, &[], false).by_object {
        let m = Path::new(&o).file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or(o);
        *out.entry((m, f)).or_insert(0) += v;
    }
    out
}

/// The truth checked, for every function of the program and its library (but the first
/// function of each thread, whose start precedes tracing), against callgrind:
/// - its own-code count in the trace (hooks and glue excluded) equals callgrind's self count of
///   the same instrumented program less the glue objdump shows (per call: one entry site and
///   one exit site);
/// - where the body without glue is the uninstrumented build's body, mnemonic for mnemonic,
///   it equals callgrind's self count of the uninstrumented program.
fn truth_against_callgrind(name: &str, rows: &HashMap<String, serde_json::Value>, firsts: &[&str]) -> Vec<String> {
    let inst = program(name);
    let plain = programs_dir().join("plain").join(name);
    let cg_inst = callgrind_by_module(&inst);
    let cg_plain = callgrind_by_module(&plain);
    let mut bodies_i = bodies(&inst);
    let mut bodies_p = bodies(&plain);
    if name == "calib_pointers" {
        bodies_i.extend(bodies(&programs_dir().join("libcalib_shlib.so")));
        bodies_p.extend(bodies(&programs_dir().join("plain").join("libcalib_shlib.so")));
    }
    let (mut glue_checked, mut same_body) = (Vec::new(), Vec::new());
    for (f, r) in rows {
        if firsts.contains(&f.as_str()) {
            continue;
        }
        let module = r["module"].as_str().unwrap().to_string();
        let own = r["own"].as_u64().unwrap();
        let calls = r["calls"].as_u64().unwrap();
        let body = bodies_i.get(f).unwrap_or_else(|| panic!("{name}: no objdump body for {f}"));
        let (stripped, enter, exit) = strip_glue(body);
        assert!(enter.len() == 1 && !exit.is_empty() && exit.iter().all(|&n| n == exit[0]), "{name}: {f}: sites");
        let glue = enter[0] + exit[0];
        let cg = cg_inst.get(&(module.clone(), f.clone())).copied().unwrap_or(0);
        assert_eq!(own + calls * glue, cg, "{name}: {f}: trace (hooks and glue excluded) vs callgrind less glue");
        glue_checked.push(f.clone());
        let plain_m: Option<Vec<String>> = bodies_p.get(f).map(|b| b.iter().map(|(m, _)| m.clone()).collect());
        if plain_m.as_ref() == Some(&stripped) {
            assert_eq!(Some(own), cg_plain.get(&(module, f.clone())).copied(), "{name}: {f}: uninstrumented");
            same_body.push(f.clone());
        }
    }
    assert!(!glue_checked.is_empty());
    eprintln!("{name}: truth = callgrind - glue for {glue_checked:?}; = uninstrumented callgrind for {same_body:?}");
    same_body
}

#[test]
fn bad_calibration_files_and_programs() {
    let cal = calibration();
    let dir = test_dir("calib-bad");
    let prog = program("calib_tiny");
    let text = std::fs::read_to_string(&cal).unwrap();
    let validate = |c: &Path, p: &Path| {
        itrace(["calib", "validate", "-c", c.to_str().unwrap(), "--", p.to_str().unwrap()]).assert_clean_error()
    };
    // Corrupted: one minimum changed, checksum left.
    let corrupt = dir.join("corrupt.calib");
    let at = text.find("\"delta\": ").unwrap() + 9;
    let mut bytes = text.clone().into_bytes();
    bytes[at] = if bytes[at] == b'9' { b'8' } else { b'9' };
    std::fs::write(&corrupt, &bytes).unwrap();
    assert!(validate(&corrupt, &prog).contains("corrupted"));
    // Not a calibration file at all.
    let junk = dir.join("junk.calib");
    std::fs::write(&junk, "hello").unwrap();
    assert!(validate(&junk, &prog).contains("not a calibration file"));
    // Another machine kind: a well-formed file trained on another CPU.
    let mut c = itrace_calib::model::Calibration::from_text(&text, "f").unwrap();
    c.machine.cpu = "OtherVendor Other CPU @ 1GHz".into();
    let other = dir.join("other.calib");
    std::fs::write(&other, c.to_text()).unwrap();
    let e = validate(&other, &prog);
    assert!(e.contains("another machine kind") && e.contains("OtherVendor"), "{e}");
    // An uninstrumented program.
    let e = validate(&cal, &programs_dir().join("plain").join("calib_tiny"));
    assert!(e.contains("not instrumented"), "{e}");
    // A missing calibration file.
    assert!(validate(&dir.join("missing.calib"), &prog).contains("cannot read calibration file"));
}

#[test]
fn hardware_source_is_detected() {
    // The hardware counter: missing here (no PMU), so the program stops with a clear message;
    // where it exists the profile is written.
    let dir = test_dir("calib-hw");
    let o = run(std::process::Command::new(program("calib_tiny"))
        .env("ITRACE_HOOKIT_OUT", &dir)
        .env("ITRACE_HOOKIT_METRIC", "hw"));
    if o.success() {
        assert!(std::fs::read_dir(&dir).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".events")));
    } else {
        assert_eq!(o.status.code(), Some(1));
        assert!(o.stderr.contains("no hardware instructions counter"), "{}", o.stderr);
    }
}
