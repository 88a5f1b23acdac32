//! The calibration model (PI paper, section 4): sequences of transitions and function kinds,
//! minimum observed deltas per sequence, the environmental minimum, the saved file.
//!
//! A thread's events e0, e1, ... give deltas d_i = early_i - late_(i-1): the instructions run
//! between two hooks, that is the work of the function on top of the call stack plus the
//! instrumentation overhead outside the reads (the hook's path before its Early Read and after
//! its Late Read, the glue that calls it). The overhead is constant per sequence
//! (previous transition and kind, this transition and kind), so the smallest delta seen for a
//! sequence is that overhead plus the smallest real work of the sequence (the environmental
//! minimum, measured on an instruction trace of the trainer). A delta is calibrated by
//! removing `delta minimum - environmental minimum` of its sequence. A sequence the trainer
//! never produced uses the smallest delta of the run and an environmental minimum of 1.

use crate::events::{Event, INDIRECT};
use crate::{bad, CalibError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// How a function was called this time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    Direct,
    Pointer,
    /// From another module (through its PLT).
    Plt,
}

/// The kind of one activation: leaf or not, and how it was called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FnType {
    pub leaf: bool,
    pub call: CallKind,
}

impl FnType {
    fn name(&self) -> String {
        let call = match self.call {
            CallKind::Direct => "direct",
            CallKind::Pointer => "pointer",
            CallKind::Plt => "plt",
        };
        format!("{}.{call}", if self.leaf { "leaf" } else { "nonleaf" })
    }
}

/// One event with its kind.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub exit: bool,
    pub func: u64,
    pub ty: FnType,
}

/// The sequence of the interval between `a` and `b`, e.g. `En-nonleaf.direct-En-leaf.plt`.
pub fn category(a: &Step, b: &Step) -> String {
    let t = |s: &Step| if s.exit { "Ex" } else { "En" };
    format!("{}-{}-{}-{}", t(a), a.ty.name(), t(b), b.ty.name())
}

/// Functions that had a profiled function called inside them (in any thread).
pub fn non_leaves<'a>(threads: impl IntoIterator<Item = &'a [Event]>) -> HashSet<u64> {
    let mut out = HashSet::new();
    for events in threads {
        let mut stack: Vec<u64> = Vec::new();
        for e in events {
            if e.exit {
                if let Some(i) = stack.iter().rposition(|&f| f == e.func) {
                    stack.truncate(i);
                }
            } else {
                if let Some(&top) = stack.last() {
                    out.insert(top);
                }
                stack.push(e.func);
            }
        }
    }
    out
}

/// The kinds of a thread's events; `other_module(func, site)` tells a call from another module.
pub fn steps(events: &[Event], non_leaves: &HashSet<u64>, other_module: &mut dyn FnMut(u64, u64) -> bool) -> Vec<Step> {
    events
        .iter()
        .map(|e| {
            let call = if other_module(e.func, e.site) {
                CallKind::Plt
            } else if e.flags & INDIRECT != 0 {
                CallKind::Pointer
            } else {
                CallKind::Direct
            };
            Step { exit: e.exit, func: e.func, ty: FnType { leaf: !non_leaves.contains(&e.func), call } }
        })
        .collect()
}

/// The raw deltas of a thread: d_i = early_i - late_(i-1); d_0 = 0 (nothing before).
pub fn deltas(events: &[Event]) -> Vec<u64> {
    (0..events.len()).map(|i| if i == 0 { 0 } else { events[i].early.saturating_sub(events[i - 1].late) }).collect()
}

/// A function's totals over the intervals it was on top of the stack.
#[derive(Clone, Copy, Debug, Default)]
pub struct FuncSum {
    pub calls: u64,
    pub sum: u64,
}

/// Add each interval's value (`values[i]` ends at event i) to the function on top of the
/// stack during it; count entries as calls.
pub fn attribute(steps: &[Step], values: &[u64], out: &mut HashMap<u64, FuncSum>) {
    let mut stack: Vec<u64> = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        if i > 0 {
            if let Some(&top) = stack.last() {
                out.entry(top).or_default().sum += values[i];
            }
        }
        if s.exit {
            if let Some(j) = stack.iter().rposition(|&f| f == s.func) {
                stack.truncate(j);
            }
        } else {
            out.entry(s.func).or_default().calls += 1;
            stack.push(s.func);
        }
    }
}

/// The trained minima of one sequence.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Minimum {
    /// Smallest delta seen.
    pub delta: u64,
    /// Environmental minimum: smallest real work of the sequence (instruction trace).
    pub env: u64,
    /// How often the trainer produced the sequence.
    pub seen: u64,
}

/// What the minima hold for: they are valid only on the same kind of machine and hooks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Machine {
    pub arch: String,
    pub cpu: String,
    pub metric: String,
    /// CRC-32 of libhookit.so: the hooks' own path is part of every minimum.
    pub hookit: String,
}

impl Machine {
    /// This machine, with the metric source and the hook library's hash.
    pub fn current(metric: &str, hookit: &str) -> Machine {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |k: &str| {
            info.lines()
                .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        Machine {
            arch: std::env::consts::ARCH.to_string(),
            cpu: format!("{} {}", field("vendor_id"), field("model name")).trim().to_string(),
            metric: metric.to_string(),
            hookit: hookit.to_string(),
        }
    }
}

/// A calibration: the minima per sequence and what they hold for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Calibration {
    pub machine: Machine,
    /// Compiler command and flags the trainer was built with.
    pub compiler: String,
    pub minima: BTreeMap<String, Minimum>,
}

const FORMAT: &str = "itrace-calibration 1";

#[derive(Serialize, Deserialize)]
struct FileForm {
    format: String,
    calibration: serde_json::Value,
    crc32: String,
}

fn crc(v: &serde_json::Value) -> String {
    // serde_json's maps are sorted: the text is canonical.
    format!("{:08x}", crc32fast::hash(v.to_string().as_bytes()))
}

impl Calibration {
    /// The file's text: the calibration and a checksum of it.
    pub fn to_text(&self) -> String {
        let v = serde_json::to_value(self).expect("plain data serialises");
        let f = FileForm { format: FORMAT.into(), crc32: crc(&v), calibration: v };
        serde_json::to_string_pretty(&f).expect("plain data serialises") + "\n"
    }

    /// Read a calibration file's text (`what` names it in errors), checking format and checksum.
    pub fn from_text(text: &str, what: &str) -> Result<Calibration, CalibError> {
        let f: FileForm = match serde_json::from_str(text) {
            Ok(f) => f,
            Err(e) => return bad(format!("{what} is not a calibration file or is corrupted ({e})")),
        };
        if f.format != FORMAT {
            return bad(format!("{what}: unknown format '{}' (expected '{FORMAT}')", f.format));
        }
        if crc(&f.calibration) != f.crc32 {
            return bad(format!("{what} is corrupted (checksum mismatch): train again with `itrace calib train`"));
        }
        serde_json::from_value(f.calibration)
            .or_else(|e| bad(format!("{what} is corrupted ({e}): train again with `itrace calib train`")))
    }

    /// Refuse minima trained for another machine kind or other hooks.
    pub fn check_machine(&self, here: &Machine, what: &str) -> Result<(), CalibError> {
        let m = &self.machine;
        let diff = if m.arch != here.arch {
            Some(format!("architecture {} (here {})", m.arch, here.arch))
        } else if m.cpu != here.cpu {
            Some(format!("CPU '{}' (here '{}')", m.cpu, here.cpu))
        } else if m.metric != here.metric {
            Some(format!("metric {} (here {})", m.metric, here.metric))
        } else if m.hookit != here.hookit {
            Some(format!("hook library {} (here {})", m.hookit, here.hookit))
        } else {
            None
        };
        match diff {
            Some(d) => {
                bad(format!("{what} was trained on another machine kind: {d}; train here with `itrace calib train`"))
            }
            None => Ok(()),
        }
    }
}

/// Train: the minima of every sequence in the trainer's threads, given per thread its
/// kinds, raw deltas and true work (instruction trace). Also returns the sequences whose
/// overhead (delta - work) was not constant, with its range.
#[allow(clippy::type_complexity)]
pub fn train(threads: &[(Vec<Step>, Vec<u64>, Vec<u64>)]) -> (BTreeMap<String, Minimum>, Vec<(String, u64, u64)>) {
    let mut minima: BTreeMap<String, Minimum> = BTreeMap::new();
    let mut overhead: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (steps, d, w) in threads {
        for i in 1..steps.len() {
            let c = category(&steps[i - 1], &steps[i]);
            let m = minima.entry(c.clone()).or_insert(Minimum { delta: u64::MAX, env: u64::MAX, seen: 0 });
            m.delta = m.delta.min(d[i]);
            m.env = m.env.min(w[i]);
            m.seen += 1;
            let o = d[i].saturating_sub(w[i]);
            let r = overhead.entry(c).or_insert((o, o));
            *r = (r.0.min(o), r.1.max(o));
        }
    }
    let varying = overhead.into_iter().filter(|(_, (lo, hi))| lo != hi).map(|(c, (lo, hi))| (c, lo, hi)).collect();
    (minima, varying)
}

/// Calibrates deltas: the trained minima, and the run's own minima for sequences never trained.
pub struct Calibrator<'a> {
    minima: &'a BTreeMap<String, Minimum>,
    run_min: HashMap<String, u64>,
}

impl<'a> Calibrator<'a> {
    /// A calibrator for a run whose threads are `threads` (kinds and raw deltas).
    pub fn new(minima: &'a BTreeMap<String, Minimum>, threads: &[(&[Step], &[u64])]) -> Self {
        let mut run_min: HashMap<String, u64> = HashMap::new();
        for (steps, d) in threads {
            for i in 1..steps.len() {
                let m = run_min.entry(category(&steps[i - 1], &steps[i])).or_insert(u64::MAX);
                *m = (*m).min(d[i]);
            }
        }
        Calibrator { minima, run_min }
    }

    /// The adjustment of a sequence: its trained minimum delta less its environmental minimum
    /// (capped by the run's own minimum delta); untrained, the run's minimum less 1.
    pub fn adjustment(&self, category: &str) -> u64 {
        let run = self.run_min.get(category).copied().unwrap_or(u64::MAX);
        match self.minima.get(category) {
            // The trained overhead, but never more than the run's smallest delta.
            Some(m) => m.delta.saturating_sub(m.env).min(run),
            None if run == u64::MAX => 0,
            None => run.saturating_sub(1),
        }
    }

    /// Whether the trainer produced this sequence.
    pub fn trained(&self, category: &str) -> bool {
        self.minima.contains_key(category)
    }

    /// Calibrated deltas of one thread (`d_0` stays 0).
    pub fn calibrate(&self, steps: &[Step], d: &[u64]) -> Vec<u64> {
        (0..steps.len())
            .map(|i| if i == 0 { 0 } else { d[i].saturating_sub(self.adjustment(&category(&steps[i - 1], &steps[i]))) })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(exit: bool, func: u64, early: u64, late: u64) -> Event {
        Event { exit, flags: 0, func, site: 0, early, late }
    }

    #[test]
    fn attribution_and_calibration_by_hand() {
        // main enters, calls leaf twice. Overhead 10 per interval; leaf does 3, main 5 between.
        let e = [
            ev(false, 1, 0, 100),
            ev(false, 2, 115, 200), // main: 5 + 10
            ev(true, 2, 213, 300),  // leaf: 3 + 10
            ev(false, 2, 315, 400), // main: 5 + 10
            ev(true, 2, 413, 500),  // leaf: 3 + 10
            ev(true, 1, 515, 600),  // main: 5 + 10
        ];
        let nl = non_leaves([&e[..]]);
        assert!(nl.contains(&1) && !nl.contains(&2));
        let s = steps(&e, &nl, &mut |_, _| false);
        let d = deltas(&e);
        assert_eq!(d, vec![0, 15, 13, 15, 13, 15]);
        let mut raw = HashMap::new();
        attribute(&s, &d, &mut raw);
        assert_eq!((raw[&1].calls, raw[&1].sum, raw[&2].calls, raw[&2].sum), (1, 45, 2, 26));
        let w = vec![0, 5, 3, 5, 3, 5];
        let (minima, varying) = train(&[(s.clone(), d.clone(), w)]);
        assert!(varying.is_empty());
        let c = Calibrator::new(&minima, &[(&s[..], &d[..])]);
        let cal = c.calibrate(&s, &d);
        assert_eq!(cal, vec![0, 5, 3, 5, 3, 5]);
    }

    #[test]
    fn file_round_trip_checksum_and_machine() {
        let mut minima = BTreeMap::new();
        minima.insert("En-leaf.direct-Ex-leaf.direct".to_string(), Minimum { delta: 12, env: 0, seen: 3 });
        let m = Machine { arch: "x86_64".into(), cpu: "cpu A".into(), metric: "sw".into(), hookit: "1234".into() };
        let c = Calibration { machine: m.clone(), compiler: "gcc".into(), minima };
        let text = c.to_text();
        assert_eq!(Calibration::from_text(&text, "f").unwrap(), c);
        let bad_text = text.replace("\"delta\": 12", "\"delta\": 13");
        assert!(Calibration::from_text(&bad_text, "f").unwrap_err().to_string().contains("checksum"));
        assert!(Calibration::from_text("garbage", "f").unwrap_err().to_string().contains("not a calibration file"));
        let other = Machine { cpu: "cpu B".into(), ..m };
        assert!(c.check_machine(&other, "f").unwrap_err().to_string().contains("another machine kind"));
    }
}
