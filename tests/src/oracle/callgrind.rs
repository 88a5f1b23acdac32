//! The callgrind oracle: self Ir per function from valgrind's
//! `--tool=callgrind` output files, parsed here (name compression, relative
//! positions, call costs) and checked against each file's totals.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::oracle::glibc_pin::pinned;
use crate::run::{require_tool, run};

/// Self Ir per (object, function) from one or more callgrind output files.
#[derive(Debug, Default, Clone)]
pub struct CallgrindProfile {
    pub by_object: HashMap<(String, String), u64>,
    /// Calls per (object, function): the sum of the `calls=` counts naming it.
    pub calls: HashMap<(String, String), u64>,
    /// Ir of the calls each (object, function) made to other functions (the cost lines after
    /// its `calls=` lines): its inclusive cost is its self cost plus this.
    pub called_cost: HashMap<(String, String), u64>,
    /// Sum of all costs of all files (checked against each file's
    /// `totals:` line).
    pub summary: u64,
}

impl CallgrindProfile {
    /// Self Ir per function name, over all objects.
    pub fn self_counts(&self) -> HashMap<String, u64> {
        let mut m = HashMap::new();
        for ((_, f), v) in &self.by_object {
            *m.entry(f.clone()).or_insert(0) += v;
        }
        m
    }

    /// (calls, inclusive Ir) of `function` (symbol version dropped) in `object`: what
    /// `callgrind_annotate --inclusive=yes` shows for it, summed over its files.
    pub fn calls_and_inclusive(&self, object: &Path, function: &str) -> (u64, u64) {
        let object = object.to_string_lossy();
        let sum = |m: &HashMap<(String, String), u64>| -> u64 {
            m.iter().filter(|((o, f), _)| *o == *object && f.split('@').next() == Some(function)).map(|(_, v)| v).sum()
        };
        (sum(&self.calls), sum(&self.by_object) + sum(&self.called_cost))
    }

    /// The functions whose self counts differ between an itrace report (`report --json`) and
    /// this profile, the largest differences first, at most `most`: for failure messages, so
    /// that a comparison that fails says where the two runs went apart. The dynamic loader is
    /// left out (its start-up runs differently under valgrind by design), and so are
    /// callgrind's recursion levels (`f'2`) and symbol versions (`f@GLIBC_2.2.5`), folded into
    /// their function.
    pub fn self_differences(&self, report: &serde_json::Value, most: usize) -> Vec<String> {
        let file = |m: &str| Path::new(m).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut counts: HashMap<(String, String), (u64, u64)> = HashMap::new();
        for ((o, f), v) in &self.by_object {
            let name = f.split(['@', '\'']).next().unwrap_or(f).to_string();
            counts.entry((file(o), name)).or_default().1 += v;
        }
        for f in report["functions"].as_array().into_iter().flatten() {
            let (Some(name), Some(module), Some(n)) = (f["name"].as_str(), f["module"].as_str(), f["self"].as_u64())
            else {
                continue;
            };
            counts.entry((file(module), name.to_string())).or_default().0 += n;
        }
        let mut diffs: Vec<((String, String), (u64, u64))> =
            counts.into_iter().filter(|((m, _), (a, b))| a != b && !m.starts_with("ld-linux")).collect();
        diffs.sort_by_key(|(k, (a, b))| (std::cmp::Reverse(a.abs_diff(*b)), k.clone()));
        diffs
            .into_iter()
            .take(most)
            .map(|((m, f), (a, b))| format!("  {f} ({m}): itrace self {a}, callgrind {b} ({:+})", a as i64 - b as i64))
            .collect()
    }

    /// Self Ir per function name of one object (the path as valgrind saw it).
    pub fn self_counts_in(&self, object: &Path) -> HashMap<String, u64> {
        let object = object.to_string_lossy();
        let mut m = HashMap::new();
        for ((o, f), v) in &self.by_object {
            if *o == *object {
                *m.entry(f.clone()).or_insert(0) += v;
            }
        }
        m
    }
}

/// Runs `valgrind --tool=callgrind --collect-jumps=yes --skip-plt=no` on
/// `binary args`
/// (following exec'd children when `trace_children`; forked children are
/// always followed) and returns its self Ir per function name, summed over
/// every output file (every process).
pub fn callgrind_self_counts(binary: &Path, args: &[&str], trace_children: bool) -> HashMap<String, u64> {
    callgrind_profile(binary, args, trace_children).self_counts()
}

/// Like [`callgrind_self_counts`], keeping the objects apart.
pub fn callgrind_profile(binary: &Path, args: &[&str], trace_children: bool) -> CallgrindProfile {
    // the default (yes) charges PLT stubs to their caller; itrace
    // (and qemu with nm) charge them to no function of the program
    run_callgrind(binary, args, trace_children, &["--skip-plt=no"], &[])
}

/// Like [`callgrind_profile`] (`--skip-plt=no`: a PLT stub is a function of its own, called
/// by the caller), with `env` set for the program.
pub fn callgrind_profile_env(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> CallgrindProfile {
    run_callgrind(binary, args, false, &["--skip-plt=no"], env)
}

/// callgrind with its default `--skip-plt=yes`, which charges a call through a PLT stub to
/// the function the stub jumps to (and the stub's instructions to the caller), with `env`
/// set for the program.
pub fn callgrind_profile_through_plt(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> CallgrindProfile {
    run_callgrind(binary, args, false, &[], env)
}

/// `valgrind` with glibc's CPU-dependent choices pinned: valgrind's virtual CPU is not this
/// one, and the pin makes the libc code it runs the code a pinned native run does (see
/// [`crate::oracle::glibc_pin`]). Every valgrind run the tests compare with goes through here.
pub fn valgrind_command() -> Command {
    let mut cmd = Command::new(require_tool("valgrind"));
    pinned(&mut cmd);
    cmd
}

fn run_callgrind(
    binary: &Path,
    args: &[&str],
    trace_children: bool,
    options: &[&str],
    env: &[(&str, &str)],
) -> CallgrindProfile {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = valgrind_command();
    cmd.args(["-q", "--tool=callgrind", "--collect-jumps=yes", "--separate-recs=1"])
        .args(options)
        .envs(env.iter().copied())
        .arg(format!("--trace-children={}", if trace_children { "yes" } else { "no" }))
        .arg(format!("--callgrind-out-file={}/callgrind.out.%p", dir.path().display()))
        .arg(binary)
        .args(args);
    let o = run(&mut cmd);
    o.assert_success();
    let mut profile = CallgrindProfile::default();
    let mut files: Vec<PathBuf> =
        fs::read_dir(dir.path()).expect("read callgrind dir").map(|e| e.expect("dir entry").path()).collect();
    files.sort();
    assert!(!files.is_empty(), "callgrind wrote no output file");
    for f in files {
        let text = fs::read_to_string(&f).expect("read callgrind output");
        parse_callgrind_into(&text, &mut profile).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
    profile
}

/// Parses one callgrind output file (format version 1, with name
/// compression `(id) name`, relative positions, `calls=` lines whose
/// following cost line is an inclusive call cost, and `jump=`/`jcnd=`
/// lines) and adds its self Ir to `profile`. Recursion suffixes (`'2`) are
/// folded into the function name. Checks that the self costs add up to the
/// file's `totals:`.
pub fn parse_callgrind_into(text: &str, profile: &mut CallgrindProfile) -> Result<(), String> {
    let mut positions = 1usize;
    let mut ir_index: Option<usize> = None;
    let mut names: HashMap<(&'static str, String), String> = HashMap::new();
    let mut ob = String::from("???");
    let mut func: Option<String> = None;
    let mut skip_next_cost = false;
    // The callee object and function of the next `calls=` line, and then its count.
    let mut call_ob: Option<String> = None;
    let mut call_fn = String::new();
    let mut call_count = 0u64;
    let mut file_total = 0u64;
    let mut summary: Option<u64> = None;
    let mut totals: Option<u64> = None;

    let resolve = |names: &mut HashMap<(&'static str, String), String>, ns: &'static str, v: &str| -> String {
        let v = v.trim();
        if let Some(rest) = v.strip_prefix('(') {
            let close = rest.find(')').unwrap_or(rest.len());
            let id = rest[..close].to_string();
            let name = rest[(close + 1).min(rest.len())..].trim();
            if name.is_empty() {
                names.get(&(ns, id.clone())).cloned().unwrap_or_else(|| format!("<undefined id {id}>"))
            } else {
                names.insert((ns, id), name.to_string());
                name.to_string()
            }
        } else {
            v.to_string()
        }
    };

    for (lineno, line) in text.lines().enumerate() {
        let lineno = lineno + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let first = line.as_bytes()[0];
        if first.is_ascii_digit() || first == b'+' || first == b'-' || first == b'*' {
            let toks: Vec<&str> = line.split_whitespace().collect();
            let Some(ir) = ir_index else {
                return Err(format!("line {lineno}: cost line before `events:`"));
            };
            let v = match toks.get(positions + ir) {
                Some(t) => t.parse::<u64>().map_err(|e| format!("line {lineno}: bad cost {t:?}: {e}"))?,
                None => 0,
            };
            let Some(f) = &func else {
                return Err(format!("line {lineno}: cost line outside a function"));
            };
            if skip_next_cost {
                // The inclusive cost of the calls just named.
                skip_next_cost = false;
                let callee = (call_ob.take().unwrap_or_else(|| ob.clone()), call_fn.clone());
                *profile.calls.entry(callee.clone()).or_insert(0) += call_count;
                if callee != (ob.clone(), f.clone()) {
                    *profile.called_cost.entry((ob.clone(), f.clone())).or_insert(0) += v;
                }
                continue;
            }
            *profile.by_object.entry((ob.clone(), f.clone())).or_insert(0) += v;
            file_total += v;
            continue;
        }
        let Some((key, value)) = line.split_once(['=', ':']) else {
            continue;
        };
        match key {
            "positions" => positions = value.split_whitespace().count(),
            "events" => {
                ir_index = value.split_whitespace().position(|e| e == "Ir");
                if ir_index.is_none() {
                    return Err("no Ir event".into());
                }
            }
            "summary" => summary = value.trim().parse().ok(),
            "totals" => totals = value.trim().parse().ok(),
            "ob" => ob = resolve(&mut names, "ob", value),
            "cob" => call_ob = Some(resolve(&mut names, "ob", value)),
            "fl" | "fi" | "fe" | "cfi" | "cfl" => {
                resolve(&mut names, "fl", value);
            }
            "fn" => {
                let name = resolve(&mut names, "fn", value);
                func = Some(strip_recursion_suffix(&name).to_string());
            }
            "cfn" => call_fn = strip_recursion_suffix(&resolve(&mut names, "fn", value)).to_string(),
            "calls" => {
                skip_next_cost = true;
                call_count = value.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
            }
            _ => {}
        }
    }
    // `totals:` is the sum of all cost lines; `summary:` can be smaller
    // (callgrind 3.19 leaves out some costs of signal handlers there).
    if let Some(t) = totals.or(summary) {
        if t != file_total {
            return Err(format!("self costs add up to {file_total}, the file's totals say {t}"));
        }
    }
    profile.summary += file_total;
    Ok(())
}

fn strip_recursion_suffix(name: &str) -> &str {
    if let Some(q) = name.rfind('\'') {
        if q + 1 < name.len() && name[q + 1..].bytes().all(|b| b.is_ascii_digit()) {
            return &name[..q];
        }
    }
    name
}

/// `callgrind_annotate` of `file` with `options`: its stdout.
pub fn callgrind_annotate(file: &Path, options: &[&str]) -> String {
    let tool = require_tool("callgrind_annotate");
    // Run where no source is: callgrind_annotate shortens the names of files under its working
    // directory, and then no longer matches a function's callers to it.
    let dir = file.parent().expect("a directory");
    let o = run(Command::new(tool).current_dir(dir).args(["--auto=no", "--threshold=100"]).args(options).arg(file));
    o.assert_success();
    o.stdout
}

/// One entry of callgrind_annotate's function table: `  1,234 ( 5.67%)  [<|*|>]  file:name [module]`
/// (the module is left out for code inlined from another file). Returns (marker, count, name,
/// the caller's call count for `<` lines).
pub fn annotate_entry(line: &str) -> Option<(char, u64, String, u64)> {
    let line = line.trim_start();
    let (count, rest) = line.split_once(' ')?;
    let count: u64 = count.replace(',', "").parse().ok()?;
    let rest = rest.trim_start().strip_prefix('(')?.split_once(')')?.1.trim_start();
    let (marker, rest) = match rest.chars().next()? {
        c @ ('<' | '*' | '>') => (c, rest[1..].trim_start()),
        _ => (' ', rest),
    };
    let rest = rest.rsplit_once(" [").map_or(rest, |(r, _)| r);
    let (rest, calls) = match rest.rsplit_once(" (") {
        Some((r, n)) if n.ends_with("x)") => (r, n.trim_end_matches("x)").replace(',', "").parse().ok()?),
        _ => (rest, 0),
    };
    let name = rest.split_once(':').map_or(rest, |(_, n)| n).to_string();
    Some((marker, count, name, calls))
}

/// Calls per (caller, callee) name from `callgrind_annotate --tree=caller`: each function's
/// `<` lines (its callers, with their call counts) come before its `*` line.
pub fn annotated_calls(text: &str) -> HashMap<(String, String), u64> {
    annotated_edges(text).into_iter().map(|(k, (calls, _))| (k, calls)).collect()
}

/// (calls, cost) per (caller, callee) name from `callgrind_annotate --tree=caller`; the cost
/// is the calls' inclusive Ir with `--inclusive=yes`. Recursion levels (`fib'2`) are one
/// function, as with `--separate-recs=1`.
pub fn annotated_edges(text: &str) -> HashMap<(String, String), (u64, u64)> {
    let mut edges: HashMap<(String, String), (u64, u64)> = HashMap::new();
    let mut callers: Vec<(String, u64, u64)> = Vec::new();
    let level = |name: String| name.split('\'').next().unwrap_or_default().to_string();
    for line in text.lines() {
        match annotate_entry(line) {
            Some(('<', cost, caller, n)) => callers.push((level(caller), n, cost)),
            Some(('*', _, callee, _)) => {
                let callee = level(callee);
                for (caller, n, cost) in callers.drain(..) {
                    let e = edges.entry((caller, callee.clone())).or_default();
                    e.0 += n;
                    e.1 += cost;
                }
            }
            _ => callers.clear(),
        }
    }
    edges
}
