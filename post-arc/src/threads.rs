//! Process and thread names and the thread-to-process map, replayed from
//! module-table and trace-on records.

use itrace_format::Mte;
use rustc_hash::FxHashMap as HashMap;

#[derive(Default)]
struct ThreadInfo {
    pid: u32,
    name: String,
    /// The arc's `pid_tid_pidname_threadname`, built when first needed.
    label: Option<String>,
}

/// Who is who, as of the record being processed.
#[derive(Default)]
pub struct Names {
    procs: HashMap<u32, String>,
    threads: HashMap<u32, ThreadInfo>,
}

/// Names go in whitespace-separated fields: write spaces as '-', other control characters as
/// escapes ([`crate::names::printable`]).
fn field(s: &str) -> String {
    if s.is_empty() {
        return "-".into();
    }
    let spaced: String = s.chars().map(|c| if c.is_whitespace() { '-' } else { c }).collect();
    crate::names::printable(&spaced).into_owned()
}

impl Names {
    /// Apply a module-table record.
    pub fn apply(&mut self, m: &Mte) {
        match m {
            Mte::ProcessName { pid, name, .. } => {
                self.procs.insert(*pid, name.clone());
                for t in self.threads.values_mut().filter(|t| t.pid == *pid) {
                    t.label = None;
                }
            }
            Mte::ThreadName { pid, tid, name, .. } => {
                let t = self.threads.entry(*tid).or_default();
                t.pid = *pid;
                t.name = name.clone();
                t.label = None;
            }
            Mte::Clone { child_pid, child_tid, .. } => {
                let t = self.threads.entry(*child_tid).or_default();
                t.pid = *child_pid;
                t.label = None;
            }
            Mte::Exec { pid, tid, .. } => {
                let t = self.threads.entry(*tid).or_default();
                t.pid = *pid;
                t.label = None;
            }
            _ => {}
        }
    }

    /// A thread starts being traced.
    pub fn trace_on(&mut self, pid: u32, tid: u32) {
        let t = self.threads.entry(tid).or_default();
        if t.pid != pid {
            t.pid = pid;
            t.label = None;
        }
    }

    /// The process of a thread (the tid itself when nothing says otherwise).
    pub fn pid_of(&self, tid: u32) -> u32 {
        match self.threads.get(&tid) {
            Some(t) if t.pid != 0 => t.pid,
            _ => tid,
        }
    }

    /// Process name.
    pub fn process_name(&self, pid: u32) -> &str {
        self.procs.get(&pid).map(|s| s.as_str()).unwrap_or("")
    }

    /// Thread name.
    pub fn thread_name(&self, tid: u32) -> &str {
        self.threads.get(&tid).map(|t| t.name.as_str()).unwrap_or("")
    }

    /// `pid_tid_pidname_threadname`, pid and tid in hex.
    pub fn label(&mut self, tid: u32) -> &str {
        // Asked for every arc line: the label is built once per thread (and again after a
        // name or process change clears it).
        if self.threads.get(&tid).is_some_and(|t| t.label.is_some()) {
            return self.threads[&tid].label.as_deref().expect("checked above");
        }
        let pid = self.pid_of(tid);
        let pname = field(self.process_name(pid));
        let t = self.threads.entry(tid).or_default();
        if t.pid == 0 {
            t.pid = pid;
        }
        if t.label.is_none() {
            t.label = Some(format!("{:x}_{:x}_{}_{}", pid, tid, pname, field(&t.name)));
        }
        t.label.as_deref().expect("set above")
    }
}
