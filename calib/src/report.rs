//! One run analysed: the profiler's events lined up with the trace's, calibrated, and
//! reported (validation table, JSON, PI's log-rt and log-gen).

use crate::events::EventLog;
use crate::model::{self, Calibrator, FuncSum, Minimum, Step};
use crate::truth::Truth;
use crate::{bad, CalibError};
use itrace_post::resolve::Resolver;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;

/// One thread of the run.
pub struct ThreadRun {
    pub pid: u32,
    pub tid: u32,
    pub steps: Vec<Step>,
    /// Raw deltas (internal calibration only), calibrated deltas, true work; index i is the
    /// interval ending at event i.
    pub raw: Vec<u64>,
    pub cal: Vec<u64>,
    pub truth: Vec<u64>,
}

/// One function of the validation table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub function: String,
    pub module: String,
    pub calls: u64,
    /// Instructions from the trace (hooks and glue excluded), between the function's events.
    pub truth: u64,
    pub uncalibrated: u64,
    pub calibrated: u64,
    pub error: i64,
    pub error_pct: f64,
    pub uncalibrated_error_pct: f64,
    /// Instructions in the function's own code (hooks and glue excluded): what callgrind
    /// counts for the function built without instrumentation.
    pub own: u64,
}

/// The analysis of a run.
pub struct Analysis {
    pub threads: Vec<ThreadRun>,
    pub rows: Vec<Row>,
    /// Function names by (pid, address).
    pub names: HashMap<(u32, u64), String>,
    /// Sequences of the run that the calibration file does not have.
    pub untrained: Vec<String>,
}

fn pct(err: i64, truth: u64) -> f64 {
    if err == 0 {
        0.0
    } else if truth == 0 {
        f64::INFINITY
    } else {
        100.0 * err as f64 / truth as f64
    }
}

/// Line up the profiler's logs with the trace and calibrate with `minima`.
pub fn analyse(
    logs: &[EventLog],
    truth: &Truth,
    minima: &BTreeMap<String, Minimum>,
    res: &mut Resolver,
) -> Result<Analysis, CalibError> {
    let non_leaves = model::non_leaves(logs.iter().flat_map(|l| l.threads.iter().map(|t| &t.events[..])));
    let mut threads = Vec::new();
    for log in logs {
        for t in &log.threads {
            let Some((pid, tevents)) = truth.threads.get(&t.tid) else {
                return bad(format!("thread {} of the profiler is not in the trace", t.tid));
            };
            if tevents.len() != t.events.len() {
                return bad(format!(
                    "thread {}: the profiler logged {} events, the trace shows {} hook calls (tracing of the \
                     thread ended early: a profiled thread that blocks SIGTRAP, as pthread_create does, is \
                     no longer traced; keep such code out of profiled functions)",
                    t.tid,
                    t.events.len(),
                    tevents.len()
                ));
            }
            // The kinds must agree event by event. The function is the profiler's: a hook of an
            // inlined function runs in its caller's code, where the trace alone cannot name it.
            if let Some(i) = (0..tevents.len()).find(|&i| t.events[i].exit != tevents[i].exit) {
                return bad(format!(
                    "thread {}: event {i} is an {} for the profiler but an {} in the trace",
                    t.tid,
                    if t.events[i].exit { "exit" } else { "entry" },
                    if tevents[i].exit { "exit" } else { "entry" }
                ));
            }
            let mut other = |func: u64, site: u64| res.resolve(*pid, func).module != res.resolve(*pid, site).module;
            let steps = model::steps(&t.events, &non_leaves, &mut other);
            let raw = model::deltas(&t.events);
            let truth = tevents.iter().enumerate().map(|(i, e)| if i == 0 { 0 } else { e.work }).collect();
            threads.push(ThreadRun { pid: *pid, tid: t.tid, steps, raw, cal: Vec::new(), truth });
        }
    }
    let views: Vec<(&[Step], &[u64])> = threads.iter().map(|t| (&t.steps[..], &t.raw[..])).collect();
    let cal = Calibrator::new(minima, &views);
    let mut untrained: Vec<String> = Vec::new();
    for t in &mut threads {
        t.cal = cal.calibrate(&t.steps, &t.raw);
        for i in 1..t.steps.len() {
            let c = model::category(&t.steps[i - 1], &t.steps[i]);
            if !cal.trained(&c) && !untrained.contains(&c) {
                untrained.push(c);
            }
        }
    }
    untrained.sort();
    let mut sums: BTreeMap<(u32, u64), [FuncSum; 3]> = BTreeMap::new();
    for t in &threads {
        for (k, v) in [&t.raw, &t.cal, &t.truth].into_iter().enumerate() {
            let mut m = HashMap::new();
            model::attribute(&t.steps, v, &mut m);
            for (f, s) in m {
                let e = sums.entry((t.pid, f)).or_default();
                e[k].calls += s.calls;
                e[k].sum += s.sum;
            }
        }
    }
    let mut names = HashMap::new();
    let mut rows = Vec::new();
    for ((pid, f), [raw, cal, tru]) in sums {
        let loc = res.resolve(pid, f);
        names.insert((pid, f), loc.symbol.to_string());
        let error = cal.sum as i64 - tru.sum as i64;
        rows.push(Row {
            function: loc.symbol.to_string(),
            module: loc.module.rsplit('/').next().unwrap_or("").to_string(),
            calls: raw.calls,
            truth: tru.sum,
            uncalibrated: raw.sum,
            calibrated: cal.sum,
            error,
            error_pct: pct(error, tru.sum),
            uncalibrated_error_pct: pct(raw.sum as i64 - tru.sum as i64, tru.sum),
            own: truth.own.get(&(pid, f)).copied().unwrap_or(0),
        });
    }
    rows.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.function.cmp(&b.function)));
    Ok(Analysis { threads, rows, names, untrained })
}

impl Analysis {
    /// The functions whose calibrated error exceeds `tolerance` percent (with at least
    /// `min_calls` calls).
    pub fn failures(&self, tolerance: f64, min_calls: u64) -> Vec<&Row> {
        self.rows.iter().filter(|r| r.calls >= min_calls && r.error_pct.abs() > tolerance).collect()
    }

    /// The validation table and its summary line.
    pub fn write_table(&self, out: &mut dyn Write, tolerance: f64, min_calls: u64) -> std::io::Result<()> {
        writeln!(
            out,
            "{:>8} {:>12} {:>12} {:>12} {:>8} {:>9} {:>9}  function",
            "calls", "true", "uncalib", "calibrated", "error", "error%", "uncal%"
        )?;
        for r in &self.rows {
            writeln!(
                out,
                "{:>8} {:>12} {:>12} {:>12} {:>8} {:>9.3} {:>9.1}  {}",
                r.calls,
                r.truth,
                r.uncalibrated,
                r.calibrated,
                r.error,
                r.error_pct,
                r.uncalibrated_error_pct,
                r.function
            )?;
        }
        let checked: Vec<&Row> = self.rows.iter().filter(|r| r.calls >= min_calls).collect();
        let worst = checked.iter().max_by(|a, b| a.error_pct.abs().total_cmp(&b.error_pct.abs()));
        let worst_raw = checked.iter().map(|r| r.uncalibrated_error_pct.abs()).fold(0.0, f64::max);
        let fails = self.failures(tolerance, min_calls).len();
        write!(
            out,
            "summary: {} functions, {} with >= {min_calls} calls: max calibrated error {:.3}%{}, max uncalibrated error {:.1}%; ",
            self.rows.len(),
            checked.len(),
            worst.map_or(0.0, |r| r.error_pct.abs()),
            worst.map_or(String::new(), |r| format!(" ({})", r.function)),
            worst_raw
        )?;
        if fails == 0 {
            writeln!(out, "all within {tolerance}%")?;
        } else {
            writeln!(out, "{fails} beyond {tolerance}%")?;
        }
        if !self.untrained.is_empty() {
            writeln!(out, "untrained sequences (minimum 1 assumed): {}", self.untrained.join(" "))?;
        }
        Ok(())
    }

    fn name(&self, pid: u32, f: u64) -> &str {
        self.names.get(&(pid, f)).map_or("<unknown>", |s| s.as_str())
    }

    /// PI's log-gen: one line per entry or exit with the metric since the previous event
    /// (calibrated, and raw).
    pub fn write_log_gen(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(out, "{:>8} {:>8} {:>3} {:>10} {:>10}  name", "seq", "tid", "ev", "delta", "raw")?;
        for t in &self.threads {
            for (i, s) in t.steps.iter().enumerate() {
                let ev = if s.exit { "Ex" } else { "En" };
                writeln!(
                    out,
                    "{i:>8} {:>8} {ev:>3} {:>10} {:>10}  {}",
                    t.tid,
                    t.cal[i],
                    t.raw[i],
                    self.name(t.pid, s.func)
                )?;
            }
        }
        Ok(())
    }

    /// PI's log-rt: the call tree of each thread. LV level, CALLS calls, CEE distinct callees,
    /// BASE calibrated own instructions, DELTA the calibration's adjustment, DS the raw sum
    /// (BASE + DELTA), IN calibrated inclusive instructions.
    pub fn write_log_rt(&self, out: &mut dyn Write) -> std::io::Result<()> {
        struct Node {
            func: u64,
            children: Vec<usize>,
            calls: u64,
            base: u64,
            raw: u64,
        }
        for t in &self.threads {
            writeln!(out, "Thread {} (pid {})", t.tid, t.pid)?;
            writeln!(
                out,
                "{:>3} {:>8} {:>5} {:>12} {:>10} {:>12} {:>12}  NAME",
                "LV", "CALLS", "CEE", "BASE", "DELTA", "DS", "IN"
            )?;
            let mut nodes = vec![Node { func: 0, children: Vec::new(), calls: 0, base: 0, raw: 0 }];
            let mut stack = vec![0usize];
            for (i, s) in t.steps.iter().enumerate() {
                let top = *stack.last().expect("root stays");
                if i > 0 && top != 0 {
                    nodes[top].base += t.cal[i];
                    nodes[top].raw += t.raw[i];
                }
                if s.exit {
                    if let Some(j) = stack.iter().rposition(|&n| n != 0 && nodes[n].func == s.func) {
                        stack.truncate(j);
                    }
                } else {
                    let child = match nodes[top].children.iter().copied().find(|&c| nodes[c].func == s.func) {
                        Some(c) => c,
                        None => {
                            nodes.push(Node { func: s.func, children: Vec::new(), calls: 0, base: 0, raw: 0 });
                            let c = nodes.len() - 1;
                            nodes[top].children.push(c);
                            c
                        }
                    };
                    nodes[child].calls += 1;
                    stack.push(child);
                }
            }
            fn inclusive(nodes: &[Node], n: usize) -> u64 {
                nodes[n].base + nodes[n].children.iter().map(|&c| inclusive(nodes, c)).sum::<u64>()
            }
            let mut todo: Vec<(usize, usize)> = nodes[0].children.iter().rev().map(|&c| (c, 0)).collect();
            while let Some((n, lv)) = todo.pop() {
                let nd = &nodes[n];
                writeln!(
                    out,
                    "{lv:>3} {:>8} {:>5} {:>12} {:>10} {:>12} {:>12}  {}{}",
                    nd.calls,
                    nd.children.len(),
                    nd.base,
                    nd.raw - nd.base,
                    nd.raw,
                    inclusive(&nodes, n),
                    " ".repeat(lv),
                    self.name(t.pid, nd.func)
                )?;
                todo.extend(nd.children.iter().rev().map(|&c| (c, lv + 1)));
            }
            writeln!(out)?;
        }
        Ok(())
    }
}
