//! The part of a trace a view reads (`--from`, `--to`, `--after` of every reading command):
//! applied once, in the replay every view shares ([`crate::replay::replay`]), so that every
//! view of a range adds up to the same totals.
//!
//! Bounds fall on blocks (a thread's instructions up to a taken branch): a block is in the
//! range when its first instruction is. In instructions, a bound counts the instructions of
//! every thread in trace order from the trace's start (`--from 1000000`, `--from 1.5M`); in
//! time, the recorded timestamps from the trace's start (`--from 2.5ms`; units ns, us, ms, s).
//! `--after FUNC` starts at the first block of a function FUNC names (its first call), on any
//! thread. The functions running when the range starts are entered there, as at the start of
//! a trace recorded with `--start`.

use std::fmt;
use std::str::FromStr;

/// One end of a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Instructions run by all threads since the trace's start.
    Instructions(u64),
    /// Nanoseconds since the trace's start (the records' timestamps).
    Nanoseconds(u64),
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::Instructions(n) => write!(f, "instruction {n}"),
            Bound::Nanoseconds(ns) => write!(f, "{}", format_ns(*ns)),
        }
    }
}

fn format_ns(ns: u64) -> String {
    match ns {
        0 => "0s".into(),
        n if n % 1_000_000_000 == 0 => format!("{}s", n / 1_000_000_000),
        n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

impl FromStr for Bound {
    type Err = String;

    /// `1000000`, `1.5M`, `20K`, `3G` (instructions); `2.5ms`, `100us`, `1s`, `500ns` (time).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "'{s}' is not a place in a trace: give instructions (1000000, 1.5M) or a time from its start (2.5ms, 100us, 1s)"
            )
        };
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let (scale, time) = match unit {
            "" => (1.0, false),
            "K" | "k" => (1e3, false),
            "M" => (1e6, false),
            "G" => (1e9, false),
            "ns" => (1.0, true),
            "us" | "µs" => (1e3, true),
            "ms" => (1e6, true),
            "s" => (1e9, true),
            _ => return Err(bad()),
        };
        let n = value * scale;
        if !n.is_finite() || n < 0.0 || n >= u64::MAX as f64 || (!time && n.fract() != 0.0) {
            return Err(bad());
        }
        Ok(if time { Bound::Nanoseconds(n.round() as u64) } else { Bound::Instructions(n as u64) })
    }
}

/// The part of a trace to read; the default is all of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Range {
    /// Blocks from here on.
    pub from: Option<Bound>,
    /// Blocks before here.
    pub to: Option<Bound>,
    /// From the first block of a function of this name (at or after `from`).
    pub after: Option<String>,
}

impl Range {
    /// The whole trace.
    pub fn is_all(&self) -> bool {
        self.from.is_none() && self.to.is_none() && self.after.is_none()
    }

    /// What the range is, for a report's first lines (`from instruction 1000 to 2.5ms`).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(f) = &self.after {
            parts.push(format!("after the first call of {f}"));
        }
        if let Some(b) = self.from {
            parts.push(format!("from {b}"));
        }
        if let Some(b) = self.to {
            parts.push(format!("to {b}"));
        }
        parts.join(", ")
    }

    /// The range's bounds in order, or why not: an error line.
    pub fn check(&self) -> Result<(), String> {
        match (self.from, self.to) {
            (Some(Bound::Instructions(a)), Some(Bound::Instructions(b))) if b <= a => {
                Err(format!("--to instruction {b} is not after --from instruction {a}: the range is empty"))
            }
            (Some(Bound::Nanoseconds(a)), Some(Bound::Nanoseconds(b))) if b <= a => {
                Err(format!("--to {} is not after --from {}: the range is empty", format_ns(b), format_ns(a)))
            }
            _ => Ok(()),
        }
    }
}

/// Where the replay stands with respect to a range.
pub(crate) struct RangeState {
    /// Instructions of the records seen so far (all threads).
    pub instructions: u64,
    pub started: bool,
}

impl RangeState {
    pub fn new(range: &Range) -> Self {
        RangeState { instructions: 0, started: range.from.is_none() && range.after.is_none() }
    }

    /// Whether `bound` is reached at a block starting at the instruction count so far, at time `ns`.
    pub fn reached(&self, bound: Bound, ns: u64) -> bool {
        match bound {
            Bound::Instructions(n) => self.instructions >= n,
            Bound::Nanoseconds(t) => ns >= t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert_eq!("1000000".parse(), Ok(Bound::Instructions(1_000_000)));
        assert_eq!("1.5M".parse(), Ok(Bound::Instructions(1_500_000)));
        assert_eq!("20K".parse(), Ok(Bound::Instructions(20_000)));
        assert_eq!("2.5ms".parse(), Ok(Bound::Nanoseconds(2_500_000)));
        assert_eq!("100us".parse(), Ok(Bound::Nanoseconds(100_000)));
        assert_eq!("1s".parse(), Ok(Bound::Nanoseconds(1_000_000_000)));
        for bad in ["", "x", "-5", "1.5", "3 apples", "1e9999", "ms", "2.5.1ms"] {
            assert!(bad.parse::<Bound>().is_err(), "{bad}");
        }
        let r = Range { from: Some(Bound::Instructions(5)), to: Some(Bound::Instructions(5)), after: None };
        assert!(r.check().is_err());
    }
}
