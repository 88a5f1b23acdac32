//! What `itrace flamegraph` and `itrace export` write, read by independent readers and
//! checked against `itrace report` and callgrind.
//!
//! Flame graphs:
//! On a recursive program (fib), a longjmp out of a recursion (longjmp), a signal handler
//! (signal), threads and a tail call (tailcall): summed over the folded lines whose stack
//! holds a function, the instructions are the report's inclusive count of that function (and over the lines ending in it, its self
//! count), and for the program's own functions they are callgrind's inclusive Ir (main's
//! apart from stdout's buffer allocation, which runs differently under valgrind). The SVG
//! parses as XML (roxmltree, not inferno's writer), and the drawn width of each function's
//! outermost frames is its inclusive count's share of all instructions.
//!
//! The callgrind export: valgrind's `callgrind_annotate` reads it; its total and its self
//! count per function are the report's, the calls it shows into each function add up to the
//! report's calls, and the calls between the program's functions are those valgrind's
//! callgrind counts when it runs the program.

use itrace_tests::{
    annotate_entry, annotated_calls, callgrind_annotate, callgrind_profile_env, itrace, itrace_bin, pinned, program,
    report_json, require_tool, run, test_dir, unique_functions, valgrind_command,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment of both runs, with glibc's CPU-dependent choices pinned in both (valgrind's
/// virtual CPU is not this one; see tests/src/oracle/glibc_pin.rs): every PLT slot bound
/// before main (the lazy resolver differs under valgrind).
const ENV: &[(&str, &str)] = &[("LD_BIND_NOW", "1")];

/// Where printf allocates stdout's buffer.
const STDOUT_BUFFER: &str = "_IO_file_doallocate";

/// The program's own functions whose inclusive counts are compared with callgrind's.
const CASES: &[(&str, &[&str])] = &[
    ("fib", &["main", "fib", "fib_asm"]),
    ("longjmp", &["main", "lj_round", "lj_dive"]),
    ("signal", &["main", "sig_handler", "sig_compute"]),
    // Five threads, each with a stack of its own (main is left out: pthread_create's stacks and
    // clone3 run differently under valgrind, which runs one thread at a time).
    ("threads", &["thr_main", "thr_compute"]),
    // tc_mid tail-calls tc_inner (`jmp`), which calls tc_leaf: callgrind counts the jump as a call.
    ("tailcall", &["main", "tc_top", "tc_mid", "tc_inner", "tc_leaf"]),
];

/// Traces `name` (with the tunables) into a fresh directory of test `test`; returns the
/// trace's path.
fn traced(test: &str, name: &str) -> PathBuf {
    traced_with(test, name, &[])
}

/// [`traced`] with record `options`.
fn traced_with(test: &str, name: &str, options: &[&str]) -> PathBuf {
    let dir = test_dir(&format!("views-{test}-{name}"));
    let trace = dir.join("t.itr");
    let mut cmd = Command::new(itrace_bin());
    pinned(&mut cmd)
        .envs(ENV.iter().copied())
        .arg("record")
        .arg("-o")
        .arg(&trace)
        .args(options)
        .arg("--")
        .arg(program(name));
    run(&mut cmd).assert_success();
    trace
}

/// (inclusive, self) per function name from folded stacks `main;f;g 12`.
fn folded_counts(text: &str) -> (HashMap<String, u64>, HashMap<String, u64>) {
    let (mut inclusive, mut self_) = (HashMap::new(), HashMap::new());
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap_or_else(|| panic!("folded line without a count: {line:?}"));
        let n: u64 = n.parse().unwrap_or_else(|e| panic!("folded count {n:?}: {e}"));
        let frames: Vec<&str> = stack.split(';').collect();
        for f in frames.iter().collect::<HashSet<_>>() {
            *inclusive.entry(f.to_string()).or_default() += n;
        }
        *self_.entry(frames.last().expect("a frame").to_string()).or_default() += n;
    }
    (inclusive, self_)
}

/// The report's functions whose name is in one module only: name -> (self, inclusive).
fn report_rows(report: &serde_json::Value) -> BTreeMap<String, (u64, u64)> {
    unique_functions(report)
        .into_iter()
        .map(|(name, f)| {
            let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k} of {f}"));
            let row = (n("self"), n("inclusive"));
            (name, row)
        })
        .collect()
}

fn flamegraph(trace: &Path, options: &[&str], out: &Path) {
    let mut args = vec![OsStr::new("flamegraph"), trace.as_os_str(), OsStr::new("-o"), out.as_os_str()];
    args.extend(options.iter().map(OsStr::new));
    itrace(args).assert_success();
}

#[test]
fn folded_stacks_add_up_to_the_report_and_callgrind() {
    let mut diffs = Vec::new();
    let mut explained = None;
    for (name, own) in CASES {
        let trace = traced("folded", name);
        let folded_path = trace.with_extension("folded");
        flamegraph(&trace, &["--folded"], &folded_path);
        let text = std::fs::read_to_string(&folded_path).expect("read folded");
        let (inclusive, self_) = folded_counts(&text);
        let report = report_json(&trace);
        let rows = report_rows(&report);
        assert!(rows.len() > 50, "{name}: the report has {} functions", rows.len());
        for (f, (rs, ri)) in &rows {
            let (fi, fs) = (inclusive.get(f).copied().unwrap_or(0), self_.get(f).copied().unwrap_or(0));
            if (fi, fs) != (*ri, *rs) {
                diffs.push(format!("{name}: {f}: folded inclusive {fi} self {fs}, report inclusive {ri} self {rs}"));
            }
        }
        let total: u64 = self_.values().sum();
        assert_eq!(Some(total), report["total_instructions"].as_u64(), "{name}: folded total vs report");

        let bin = program(name);
        let cg = callgrind_profile_env(&bin, &[], ENV);
        // main's printf allocates stdout's buffer (fstat, the heap's first brk), which runs
        // differently under valgrind: main is compared without that call, on both sides.
        let doalloc = report["functions"].as_array().unwrap().iter().find(|f| f["name"] == STDOUT_BUFFER);
        let doalloc = doalloc.unwrap_or_else(|| panic!("{name}: no {STDOUT_BUFFER} in the report"));
        let (_, cg_doalloc) = cg.calls_and_inclusive(Path::new(doalloc["module"].as_str().unwrap()), STDOUT_BUFFER);
        let doalloc = inclusive[STDOUT_BUFFER];
        assert!(cg_doalloc > 0 && doalloc > 0, "{name}: {STDOUT_BUFFER}: callgrind {cg_doalloc}, folded {doalloc}");
        for f in *own {
            let (_, mut cg_inclusive) = cg.calls_and_inclusive(&bin, f);
            assert!(cg_inclusive > 0, "oracle: callgrind has no {f} in {name}");
            let mut fi = inclusive.get(*f).copied().unwrap_or(0);
            if *f == "main" {
                (fi, cg_inclusive) = (fi - doalloc, cg_inclusive - cg_doalloc);
            }
            if fi != cg_inclusive {
                diffs.push(format!("{name}: {f}: folded inclusive {fi}, callgrind {cg_inclusive}"));
                explained.get_or_insert_with(|| {
                    format!(
                        "{name}: functions whose self counts differ:\n{}",
                        cg.self_differences(&report, 12).join("\n")
                    )
                });
            }
        }
    }
    diffs.extend(explained);
    assert!(diffs.is_empty(), "differences:\n{}", diffs.join("\n"));
}

/// A region starts in the middle of a stack (in ITraceOn, called from main) and the threads
/// of region_threads each start in theirs: the folded stacks still add up to the report's
/// counts for every function.
#[test]
fn folded_stacks_of_regions_add_up_to_the_report() {
    for name in ["region", "region_threads"] {
        let trace = traced_with("region", name, &["--region"]);
        let folded_path = trace.with_extension("folded");
        flamegraph(&trace, &["--folded"], &folded_path);
        let (inclusive, self_) = folded_counts(&std::fs::read_to_string(&folded_path).expect("read folded"));
        let rows = report_rows(&report_json(&trace));
        assert!(rows.len() >= 3, "{name}: the report has {} functions", rows.len());
        for (f, (rs, ri)) in &rows {
            let (fi, fs) = (inclusive.get(f).copied().unwrap_or(0), self_.get(f).copied().unwrap_or(0));
            assert_eq!((fi, fs), (*ri, *rs), "{name}: {f}: folded (inclusive, self) vs the report's");
        }
    }
}

/// One drawn frame of the SVG.
struct Frame {
    name: String,
    /// Drawn width, in percent of the whole graph.
    width: f64,
    y: f64,
    /// inferno's exact position and width in instructions (`fg:x`, `fg:w`), used to tell
    /// which frames of a function sit inside another of its frames (recursion).
    x_count: u64,
    w_count: u64,
    /// The rectangle's fill (`rgb(r,g,b)`).
    fill: String,
}

fn svg_frames(svg: &str) -> Vec<Frame> {
    let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    let doc =
        roxmltree::Document::parse_with_options(svg, options).unwrap_or_else(|e| panic!("the SVG is not XML: {e}"));
    const FG: &str = "http://github.com/jonhoo/inferno";
    let mut frames = Vec::new();
    for g in doc.descendants().filter(|n| n.has_tag_name("g")) {
        let Some(title) = g.children().find(|n| n.has_tag_name("title")).and_then(|t| t.text()) else { continue };
        let Some(rect) = g.children().find(|n| n.has_tag_name("rect")) else { continue };
        let attr = |ns: Option<&str>, k: &str| -> &str {
            match ns {
                Some(ns) => rect.attribute((ns, k)),
                None => rect.attribute(k),
            }
            .unwrap_or_else(|| panic!("frame {title:?} has no {k}"))
        };
        let name = title.rsplit_once(" (").map_or(title, |(n, _)| n).to_string();
        let width: f64 = attr(None, "width").trim_end_matches('%').parse().expect("width in percent");
        let y: f64 = attr(None, "y").parse().expect("y");
        let x_count: u64 = attr(Some(FG), "x").parse().expect("fg:x");
        let w_count: u64 = attr(Some(FG), "w").parse().expect("fg:w");
        let fill = attr(None, "fill").to_string();
        frames.push(Frame { name, width, y, x_count, w_count, fill });
    }
    frames
}

#[test]
fn svg_frame_widths_are_inclusive_shares() {
    for (name, _) in CASES {
        let trace = traced("svg", name);
        let svg_path = trace.with_extension("svg");
        flamegraph(&trace, &["--min-width", "0"], &svg_path);
        let svg = std::fs::read_to_string(&svg_path).expect("read svg");
        let frames = svg_frames(&svg);
        let report = report_json(&trace);
        let total = report["total_instructions"].as_u64().expect("total") as f64;
        let mut by_name: HashMap<&str, Vec<&Frame>> = HashMap::new();
        for f in &frames {
            by_name.entry(&f.name).or_default().push(f);
        }
        let rows = report_rows(&report);
        let mut checked = 0;
        for (f, (_, inclusive)) in &rows {
            let Some(mine) = by_name.get(f.as_str()) else {
                panic!("{name}: no frame for {f} (inclusive {inclusive})");
            };
            // The outermost frames: not inside another frame of the same function.
            let outer: Vec<&&Frame> = mine
                .iter()
                .filter(|a| {
                    !mine
                        .iter()
                        .any(|b| b.y != a.y && b.x_count <= a.x_count && a.x_count + a.w_count <= b.x_count + b.w_count)
                })
                .collect();
            let width: f64 = outer.iter().map(|fr| fr.width).sum();
            let share = 100.0 * *inclusive as f64 / total;
            // Widths are written with 4 decimals: each frame is within 0.00005 of its share.
            let tolerance = 0.00005 * outer.len() as f64 + 1e-9;
            assert!(
                (width - share).abs() <= tolerance,
                "{name}: {f}: frames {width}% wide, inclusive {inclusive} of {total} is {share}%"
            );
            checked += 1;
        }
        assert!(checked > 50, "{name}: checked {checked} functions");
    }
}

/// `--per-thread`: one root frame per thread, named `name-pid/tid` after the report's thread
/// rows, holding exactly that thread's instructions (the report's per-thread totals, which
/// `report --tid` replays alone); without the thread frames, the stacks are the merged ones.
#[test]
fn per_thread_folded_stacks_are_the_report_threads() {
    let trace = traced("per-thread", "threads");
    let merged_path = trace.with_extension("folded");
    flamegraph(&trace, &["--folded"], &merged_path);
    let per_thread_path = trace.with_extension("per-thread.folded");
    flamegraph(&trace, &["--folded", "--per-thread"], &per_thread_path);
    let per_thread = std::fs::read_to_string(&per_thread_path).expect("read folded");
    let report = report_json(&trace);
    let threads = report["threads"].as_array().expect("threads");
    assert_eq!(threads.len(), 5, "threads.c: main and four workers");

    let mut by_root: BTreeMap<String, u64> = BTreeMap::new();
    let mut without_root: BTreeMap<String, u64> = BTreeMap::new();
    let mut compute: BTreeMap<String, u64> = BTreeMap::new();
    for line in per_thread.lines() {
        let (stack, n) = line.rsplit_once(' ').expect("folded line");
        let n: u64 = n.parse().expect("count");
        let (root, rest) = stack.split_once(';').unwrap_or((stack, ""));
        *by_root.entry(root.to_string()).or_default() += n;
        if rest.split(';').any(|f| f == "thr_compute") {
            *compute.entry(root.to_string()).or_default() += n;
        }
        if !rest.is_empty() {
            *without_root.entry(rest.to_string()).or_default() += n;
        }
    }
    let want: BTreeMap<String, u64> = threads
        .iter()
        .map(|t| {
            let n = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{k} of {t}"));
            (format!("{}-{}/{}", t["name"].as_str().unwrap(), n("pid"), n("tid")), n("instructions"))
        })
        .collect();
    assert_eq!(by_root, want, "per-thread folded totals vs the report's threads");

    // Each worker's thr_compute, as `report --tid` (that thread's records alone) counts it.
    for t in threads.iter().filter(|t| t["name"].as_str().unwrap().starts_with("worker")) {
        let tid = t["tid"].as_u64().unwrap().to_string();
        let o = itrace([
            OsStr::new("report"),
            trace.as_os_str(),
            OsStr::new("--json"),
            OsStr::new("--tid"),
            OsStr::new(&tid),
        ]);
        o.assert_success();
        let alone: serde_json::Value = serde_json::from_str(&o.stdout).expect("JSON");
        let row =
            alone["functions"].as_array().unwrap().iter().find(|f| f["name"] == "thr_compute").expect("thr_compute");
        let root = format!("{}-{}/{}", t["name"].as_str().unwrap(), t["pid"], tid);
        assert_eq!(compute.get(&root).copied(), row["inclusive"].as_u64(), "{root}: thr_compute");
    }

    // The thread frames taken off, the stacks add up to the merged graph's.
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for line in std::fs::read_to_string(&merged_path).expect("read folded").lines() {
        let (stack, n) = line.rsplit_once(' ').expect("folded line");
        *merged.entry(stack.to_string()).or_default() += n.parse::<u64>().expect("count");
    }
    assert_eq!(without_root, merged, "per-thread stacks without their thread frame vs the merged stacks");
}

/// `--colors module`: every frame of a module has the module's one colour, different modules
/// have different colours, and a module's colour is the same in the graph of another program.
#[test]
fn module_colours_are_one_per_module_and_stable() {
    let mut colour_of: HashMap<String, String> = HashMap::new();
    for name in ["fib", "threads"] {
        let trace = traced("colours", name);
        let svg_path = trace.with_extension("svg");
        flamegraph(&trace, &["--min-width", "0", "--colors", "module"], &svg_path);
        let frames = svg_frames(&std::fs::read_to_string(&svg_path).expect("read svg"));
        let report = report_json(&trace);
        let module_of: HashMap<String, String> = unique_functions(&report)
            .into_iter()
            .map(|(f, row)| (f, row["module"].as_str().unwrap().rsplit('/').next().unwrap().to_string()))
            .collect();
        let mut fills: BTreeMap<String, HashSet<String>> = BTreeMap::new();
        for f in &frames {
            if let Some(m) = module_of.get(&f.name) {
                fills.entry(m.clone()).or_default().insert(f.fill.clone());
            }
        }
        assert!(fills.len() >= 3, "{name}: the program, libc and the loader: {fills:?}");
        for (m, f) in &fills {
            assert_eq!(f.len(), 1, "{name}: the frames of {m} have colours {f:?}");
            let fill = f.iter().next().unwrap().clone();
            if let Some(before) = colour_of.insert(m.clone(), fill.clone()) {
                assert_eq!(before, fill, "{m}: one colour in both graphs");
            }
        }
        let distinct: HashSet<&String> = fills.values().flatten().collect();
        assert_eq!(distinct.len(), fills.len(), "{name}: one colour per module: {fills:?}");
    }
}

/// Chromium's flags for a headless run as root on a machine without a network: no sandbox (root),
/// no GPU, and none of its background connections.
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// The distinct colours of a PNG's pixels (decoded by the png crate, not by Chromium).
fn png_colours(path: &Path) -> (u32, u32, usize) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().unwrap_or_else(|e| panic!("{} is not a PNG: {e}", path.display()));
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let bytes_per_pixel = info.color_type.samples() * if info.bit_depth == png::BitDepth::Sixteen { 2 } else { 1 };
    let colours: HashSet<&[u8]> = buf[..info.buffer_size()].chunks(bytes_per_pixel).collect();
    (info.width, info.height, colours.len())
}

/// The texts of the `<text>` elements in Chromium's dump of a page's DOM.
fn dom_texts(dom: &str) -> Vec<&str> {
    let mut texts = Vec::new();
    let mut rest = dom;
    while let Some(at) = rest.find("<text") {
        let Some(open_end) = rest[at..].find('>') else { break };
        let body = &rest[at + open_end + 1..];
        let Some(close) = body.find("</text>") else { break };
        texts.push(body[..close].trim());
        rest = &body[close..];
    }
    texts
}

/// Headless Chromium renders fib's flame graph: its screenshot (kept at
/// target/test-output/views-chromium-fib/flame.png) is a picture of many colours, not a blank
/// page, and after the page's script has fitted each frame's label to the frame's drawn width
/// (in a window as wide as the screenshot's), the labels of the frames of main, fib, fib_asm
/// and __libc_start_main are those names whole (Chromium's DOM dump says what the labels are).
#[test]
fn svg_renders_in_headless_chromium() {
    let chromium = require_tool("chromium");
    let trace = traced("chromium", "fib");
    let dir = trace.parent().expect("test dir").to_path_buf();
    let svg = dir.join("flame.svg");
    flamegraph(&trace, &[], &svg);
    let url = format!("file://{}", svg.display());
    let browse = |what: &str, options: &[&str]| {
        let mut cmd = Command::new(&chromium);
        cmd.args(CHROMIUM_FLAGS).arg(format!("--user-data-dir={}", dir.join(format!("chromium-{what}")).display()));
        cmd.arg("--window-size=1200,400").args(options).arg(&url);
        run(&mut cmd).assert_success().stdout.clone()
    };
    let png = dir.join("flame.png");
    browse("screenshot", &[&format!("--screenshot={}", png.display())]);
    eprintln!("the screenshot of the flame graph: {}", png.display());
    let (width, height, colours) = png_colours(&png);
    assert_eq!((width, height), (1200, 400), "the screenshot's size");
    // The background's gradient and the frames' colours: a blank or one-colour page has few.
    assert!(colours >= 20, "the screenshot {} has {colours} colours: nothing was drawn", png.display());
    let dom = browse("dom", &["--dump-dom"]);
    std::fs::write(dir.join("flame.dom"), &dom).expect("save the DOM dump");
    let labels: HashSet<&str> = dom_texts(&dom).into_iter().collect();
    for name in ["main", "fib", "fib_asm", "__libc_start_main"] {
        assert!(labels.contains(name), "no frame is labelled {name} in Chromium's DOM ({labels:?})");
    }
}

/// Bad input: one line on stderr, a non-zero exit, no output file.
#[test]
fn bad_input_is_one_line() {
    let dir = test_dir("views-bad_input");
    let out = dir.join("out");
    let missing = dir.join("missing.itr");
    for args in [
        vec![OsStr::new("flamegraph"), missing.as_os_str(), OsStr::new("-o"), out.as_os_str()],
        vec![OsStr::new("export"), missing.as_os_str(), OsStr::new("--format"), OsStr::new("callgrind")],
        vec![OsStr::new("export"), missing.as_os_str(), OsStr::new("--format"), OsStr::new("pdf")],
        vec![OsStr::new("flamegraph"), missing.as_os_str(), OsStr::new("--min-width"), OsStr::new("-1")],
    ] {
        let o = itrace(&args);
        let err = o.assert_clean_error();
        assert!(!out.exists(), "{args:?} created {}", out.display());
        assert!(err.starts_with("itrace: "), "{args:?}: {err}");
    }
}

/// (total, self per function name) from callgrind_annotate's tables.
fn annotated_self(text: &str) -> (u64, HashMap<String, u64>) {
    let mut total = None;
    let mut self_ = HashMap::new();
    for line in text.lines() {
        if line.ends_with("PROGRAM TOTALS") {
            total = line.split_whitespace().next().and_then(|n| n.replace(',', "").parse::<u64>().ok());
            continue;
        }
        if let Some((' ', n, name, _)) = annotate_entry(line) {
            // An inlined file's lines are an entry of their own: add them up.
            *self_.entry(name).or_default() += n;
        }
    }
    (total.expect("callgrind_annotate prints PROGRAM TOTALS"), self_)
}

/// The report's (self, calls) summed per function name over modules.
fn report_by_name(report: &serde_json::Value) -> HashMap<String, (u64, u64)> {
    let mut m: HashMap<String, (u64, u64)> = HashMap::new();
    for f in report["functions"].as_array().expect("functions") {
        let e = m.entry(f["name"].as_str().unwrap().to_string()).or_default();
        e.0 += f["self"].as_u64().unwrap();
        e.1 += f["calls"].as_u64().unwrap();
    }
    m
}

#[test]
fn callgrind_export_reads_in_callgrind_annotate_like_the_report() {
    let mut diffs = Vec::new();
    for (name, own) in CASES {
        let trace = traced("callgrind", name);
        let out = trace.with_file_name("callgrind.out.1");
        let args = [OsStr::new("export"), trace.as_os_str(), OsStr::new("--format"), OsStr::new("callgrind")];
        itrace(args.iter().copied().chain([OsStr::new("-o"), out.as_os_str()])).assert_success();
        let report = report_json(&trace);
        let by_name = report_by_name(&report);

        let (total, self_) = annotated_self(&callgrind_annotate(&out, &[]));
        assert_eq!(Some(total), report["total_instructions"].as_u64(), "{name}: PROGRAM TOTALS vs the report");
        for (f, (rs, _)) in &by_name {
            let a = self_.get(f).copied().unwrap_or(0);
            if a != *rs {
                diffs.push(format!("{name}: {f}: callgrind_annotate self {a}, report {rs}"));
            }
        }
        for (f, a) in &self_ {
            if !by_name.contains_key(f) && *a != 0 {
                diffs.push(format!("{name}: {f}: callgrind_annotate self {a}, not in the report"));
            }
        }

        let calls = annotated_calls(&callgrind_annotate(&out, &["--tree=caller"]));
        let mut into: HashMap<&str, u64> = HashMap::new();
        for ((_, callee), n) in &calls {
            *into.entry(callee).or_default() += n;
        }
        for (f, (_, rc)) in &by_name {
            let a = into.get(f.as_str()).copied().unwrap_or(0);
            if a != *rc {
                diffs.push(format!("{name}: {f}: {a} calls in callgrind_annotate, report {rc}"));
            }
        }

        // The same calls as valgrind's callgrind sees, between the program's own functions.
        let dir = trace.parent().expect("trace dir");
        let cg_out = dir.join("valgrind.callgrind.out");
        let mut cmd = valgrind_command();
        cmd.envs(ENV.iter().copied())
            .args(["-q", "--tool=callgrind", "--skip-plt=no"])
            .arg(format!("--callgrind-out-file={}", cg_out.display()))
            .arg(program(name));
        run(&mut cmd).assert_success();
        let truth = annotated_calls(&callgrind_annotate(&cg_out, &["--tree=caller"]));
        let mut compared = 0;
        for ((caller, callee), n) in &truth {
            if own.contains(&caller.as_str()) && own.contains(&callee.as_str()) {
                let mine = calls.get(&(caller.clone(), callee.clone())).copied().unwrap_or(0);
                if mine != *n {
                    diffs.push(format!("{name}: {caller} -> {callee}: {mine} calls exported, callgrind {n}"));
                }
                compared += 1;
            }
        }
        assert!(compared >= 1, "{name}: callgrind shows no calls between {own:?}: {truth:?}");
    }
    assert!(diffs.is_empty(), "differences:\n{}", diffs.join("\n"));
}

#[test]
fn annotate_lines_parse() {
    let caller = " 2,367 ( 1.39%)  < /src/signal.c:sig_handler (3x) [/bin/signal]";
    assert_eq!(annotate_entry(caller), Some(('<', 2367, "sig_handler".to_string(), 3)));
    let recursive = "271,254 (127.1%)  < /src/fib.c:fib (1,972x) [/bin/fib]";
    assert_eq!(annotate_entry(recursive), Some(('<', 271254, "fib".to_string(), 1972)));
    let callee = " 2,367 ( 1.39%)  *  /src/signal.c:sig_compute [/bin/signal]";
    assert_eq!(annotate_entry(callee), Some(('*', 2367, "sig_compute".to_string(), 0)));
    let text = format!("\n{caller}\n{callee}\n\n");
    let calls = annotated_calls(&text);
    assert_eq!(calls.get(&("sig_handler".to_string(), "sig_compute".to_string())), Some(&3), "{calls:?}");
}
