//! `itrace report --json`, parsed, and the per-function numbers the tests
//! compare with the oracles (the JSON fields of docs/arc-and-report.md).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::Path;

use crate::run::{itrace, tail};

/// `itrace report TRACE --json`, parsed; panics unless it succeeds.
pub fn report_json(trace: &Path) -> serde_json::Value {
    let out = itrace([OsStr::new("report"), trace.as_os_str(), OsStr::new("--json")]);
    out.assert_success();
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("report --json is not valid JSON ({e}):\n{}", tail(&out.stdout, 2000)))
}

/// The report's functions whose name is in one module only (so a name says which), by name.
pub fn unique_functions(report: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    let functions = report["functions"].as_array().expect("report: `functions` array");
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for f in functions {
        *seen.entry(f["name"].as_str().expect("function name")).or_default() += 1;
    }
    functions
        .iter()
        .filter(|f| seen[f["name"].as_str().expect("function name")] == 1)
        .map(|f| (f["name"].as_str().expect("function name").to_string(), f.clone()))
        .collect()
}

/// Self instructions per function name from a report, summed over all the
/// entries (processes, threads) whose module is `module`.
pub fn report_self_counts(report: &serde_json::Value, module: &Path) -> HashMap<String, u64> {
    per_function(report, module, "self")
}

/// `calls` per function name of `module`, summed like [`report_self_counts`].
pub fn report_calls(report: &serde_json::Value, module: &Path) -> HashMap<String, u64> {
    per_function(report, module, "calls")
}

/// (self, inclusive, calls) per function name of `module` in a report (one entry per name:
/// single-thread traces).
pub fn report_rows(report: &serde_json::Value, module: &Path) -> BTreeMap<String, (u64, u64, u64)> {
    let module = module.to_string_lossy();
    report["functions"]
        .as_array()
        .expect("report: `functions` array")
        .iter()
        .filter(|f| f["module"].as_str() == Some(&*module))
        .map(|f| {
            let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("function {k}"));
            (f["name"].as_str().expect("function name").to_string(), (n("self"), n("inclusive"), n("calls")))
        })
        .collect()
}

/// `field` per function name of `module`, summed over the report's entries.
fn per_function(report: &serde_json::Value, module: &Path, field: &str) -> HashMap<String, u64> {
    let module = module.to_string_lossy();
    let mut m = HashMap::new();
    for f in report["functions"].as_array().expect("report: `functions` array") {
        if f["module"].as_str() == Some(&*module) {
            let name = f["name"].as_str().expect("function name").to_string();
            *m.entry(name).or_insert(0) += f[field].as_u64().unwrap_or_else(|| panic!("function {field}"));
        }
    }
    m
}

/// The distinct values of `field` (`pid` or `tid`) over the report's threads, sorted.
pub fn report_thread_ids(report: &serde_json::Value, field: &str) -> Vec<u64> {
    let threads = report["threads"].as_array().expect("threads array");
    let mut ids: Vec<u64> = threads.iter().filter_map(|t| t[field].as_u64()).collect();
    ids.sort();
    ids.dedup();
    ids
}
