//! The event log hookit writes at exit (`hookit-PID.events`): per thread, one line per entry
//! or exit with the function, its call site and the Early and Late Reads.

use crate::{bad, CalibError};

/// Flag of an event whose call site is not a direct `call rel32` (a call through a pointer).
pub const INDIRECT: u64 = 2;

/// One entry or exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub exit: bool,
    pub flags: u64,
    /// The function entered or left (its address in the process).
    pub func: u64,
    /// Where it was called from (return address in the caller).
    pub site: u64,
    pub early: u64,
    pub late: u64,
}

/// One thread's events, in order.
#[derive(Clone, Debug)]
pub struct ThreadEvents {
    pub tid: u32,
    pub events: Vec<Event>,
}

/// One process's log.
#[derive(Clone, Debug)]
pub struct EventLog {
    pub metric: String,
    pub pid: u32,
    pub threads: Vec<ThreadEvents>,
}

fn num(s: Option<&str>, line: usize) -> Result<u64, CalibError> {
    let s = s.ok_or_else(|| CalibError::Bad(format!("event log line {line}: too few fields")))?;
    let v = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|_| CalibError::Bad(format!("event log line {line}: '{s}' is not a number")))
}

/// Parse a hookit event log.
pub fn parse(text: &str) -> Result<EventLog, CalibError> {
    let mut lines = text.lines();
    let head = lines.next().unwrap_or("");
    let mut f = head.split_whitespace();
    if f.next() != Some("hookit") || f.next() != Some("1") {
        return bad("not a hookit event log (version 1)");
    }
    let mut log = EventLog { metric: String::new(), pid: 0, threads: Vec::new() };
    for kv in f {
        match kv.split_once('=') {
            Some(("metric", v)) => log.metric = v.to_string(),
            Some(("pid", v)) => log.pid = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    for (i, line) in lines.enumerate() {
        let n = i + 2;
        let mut f = line.split_whitespace();
        match f.next() {
            Some("T") => log.threads.push(ThreadEvents { tid: num(f.next(), n)? as u32, events: Vec::new() }),
            Some(k @ ("E" | "X")) => {
                let e = Event {
                    exit: k == "X",
                    func: num(f.next(), n)?,
                    site: num(f.next(), n)?,
                    early: num(f.next(), n)?,
                    late: num(f.next(), n)?,
                    flags: num(f.next(), n)?,
                };
                match log.threads.last_mut() {
                    Some(t) => t.events.push(e),
                    None => return bad(format!("event log line {n}: event before any thread")),
                }
            }
            None => {}
            Some(other) => return bad(format!("event log line {n}: unknown record '{other}'")),
        }
    }
    Ok(log)
}
