//! Arc files (docs/arc-and-report.md): `itrace arc` run and parsed into
//! block lines, the consistency every line must have, and the line-by-line
//! comparison with what an oracle predicts.

use std::ffi::OsStr;
use std::path::Path;

use crate::run::itrace;

/// `itrace arc TRACE` (to stdout); panics unless it succeeds.
pub fn arc_text(trace: &Path) -> String {
    let out = itrace([OsStr::new("arc"), trace.as_os_str()]);
    out.assert_success();
    out.stdout
}

/// `itrace arc TRACE`, kept at `save_as` for a look after the test, parsed, and checked with
/// [`check_arc_consistency`]: the text and its block lines.
pub fn checked_arc(trace: &Path, save_as: &Path) -> (String, Vec<ArcLine>) {
    let text = arc_text(trace);
    std::fs::write(save_as, &text).unwrap_or_else(|e| panic!("writing {}: {e}", save_as.display()));
    let lines = arc_lines(&text);
    check_arc_consistency(&lines);
    (text, lines)
}

/// One block line of an arc file (docs/arc-and-report.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArcLine {
    pub cpu: u32,
    /// Field 2 is `K`.
    pub kernel: bool,
    pub type_code: u8,
    pub count: u64,
    /// Field 5 (`@`).
    pub marker: String,
    pub offset: u64,
    pub symbol: String,
    pub module: String,
    pub pid: u64,
    pub tid: u64,
    /// `pidname_threadname` as written (names may contain `_`).
    pub names: String,
    /// Process name; see [`split_names`] for how the ambiguity is resolved.
    pub pname: String,
    pub tname: String,
    pub type_str: String,
    /// Field 10: the source line, 0 when unknown.
    pub line: u64,
    /// Field 10: the source file, empty when unknown.
    pub file: String,
    /// Line number in the arc text (1-based).
    pub lineno: usize,
}

impl ArcLine {
    /// `symbol+0xoff`.
    pub fn location(&self) -> String {
        format!("{}+{:#x}", self.symbol, self.offset)
    }
}

/// Splits `pidname_threadname` when the two names are equal (`a_b_a_b`)
/// or contain no `_`; otherwise splits at the first `_`.
pub fn split_names(names: &str) -> (String, String) {
    let n = names.len();
    if n % 2 == 1 {
        let mid = n / 2;
        if names.as_bytes()[mid] == b'_' && names[..mid] == names[mid + 1..] {
            return (names[..mid].to_string(), names[mid + 1..].to_string());
        }
    }
    match names.split_once('_') {
        Some((p, t)) => (p.to_string(), t.to_string()),
        None => (names.to_string(), String::new()),
    }
}

/// Parses the block lines of an arc file, skipping `#` comments and blank
/// lines. Fields 1-6 are taken from the left, 8-10 from the right, and
/// field 7 (which may contain spaces) is split at its last `:`.
pub fn parse_arc(text: &str) -> Result<Vec<ArcLine>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let mut l = parse_arc_line(raw).map_err(|e| format!("arc line {lineno}: {e}: {raw:?}"))?;
        l.lineno = lineno;
        out.push(l);
    }
    Ok(out)
}

fn parse_arc_line(raw: &str) -> Result<ArcLine, String> {
    // token spans
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in raw.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                spans.push((s, i));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        spans.push((s, raw.len()));
    }
    if spans.len() < 10 {
        return Err(format!("{} fields, expected 10", spans.len()));
    }
    let tok = |k: usize| &raw[spans[k].0..spans[k].1];
    let n = spans.len();
    let num = |s: &str, what: &str| s.parse::<u64>().map_err(|e| format!("{what} {s:?}: {e}"));
    let cpu = num(tok(0), "cpu")? as u32;
    let kernel = match tok(1) {
        "K" => true,
        "U" => false,
        o => return Err(format!("field 2 is {o:?}, not K or U")),
    };
    let type_code = num(tok(2), "type")? as u8;
    let count = num(tok(3), "count")?;
    let marker = tok(4).to_string();
    let offset = u64::from_str_radix(tok(5), 16).map_err(|e| format!("offset {:?}: {e}", tok(5)))?;
    let f7 = &raw[spans[6].0..spans[n - 4].1];
    let (symbol, module) = f7.rsplit_once(':').ok_or_else(|| format!("field 7 {f7:?} has no ':'"))?;
    let f8 = tok(n - 3);
    let mut parts = f8.splitn(3, '_');
    let pid = parts.next().unwrap_or("");
    let tid = parts.next().ok_or("field 8 has no tid")?;
    let names = parts.next().ok_or("field 8 has no names")?.to_string();
    let pid = u64::from_str_radix(pid, 16).map_err(|e| format!("pid {pid:?}: {e}"))?;
    let tid = u64::from_str_radix(tid, 16).map_err(|e| format!("tid {tid:?}: {e}"))?;
    let (pname, tname) = split_names(&names);
    let type_str = tok(n - 2).to_string();
    // `FILE:LINE`, or 0
    let (file, line) = match tok(n - 1) {
        "0" => (String::new(), 0),
        f10 => {
            let (file, line) = f10.rsplit_once(':').ok_or_else(|| format!("field 10 {f10:?} is not FILE:LINE or 0"))?;
            if file.is_empty() {
                return Err(format!("field 10 {f10:?} has no file"));
            }
            (file.to_string(), num(line, "line")?)
        }
    };
    Ok(ArcLine {
        cpu,
        kernel,
        type_code,
        count,
        marker,
        offset,
        symbol: symbol.to_string(),
        module: module.to_string(),
        pid,
        tid,
        names,
        pname,
        tname,
        type_str,
        line,
        file,
        lineno: 0,
    })
}

/// Parses an arc, panicking with the error.
pub fn arc_lines(text: &str) -> Vec<ArcLine> {
    parse_arc(text).unwrap_or_else(|e| panic!("{e}"))
}

/// The comment lines (`#`) that come after the last block line.
pub fn trailing_comments(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    for l in text.lines() {
        let t = l.trim();
        if t.is_empty() {
            continue;
        }
        if t.starts_with('#') {
            v.push(t.to_string());
        } else {
            v.clear();
        }
    }
    v
}

/// Basic consistency of every line: field 9 matches field 3, `@` marker,
/// `K` lines are in `[kernel]`.
pub fn check_arc_consistency(lines: &[ArcLine]) {
    const NAMES: [&str; 8] = ["INTRPT", "CALL", "RETURN", "JUMP", "IRET", "OTHER", "UNDEFD", "ALLOC"];
    for l in lines {
        assert!(
            (l.type_code as usize) < NAMES.len() && NAMES[l.type_code as usize] == l.type_str,
            "arc line {}: type {} does not match {}",
            l.lineno,
            l.type_code,
            l.type_str
        );
        assert_eq!(l.marker, "@", "arc line {}: field 5", l.lineno);
        if l.kernel {
            assert_eq!(l.module, "[kernel]", "arc line {}: K line module", l.lineno);
        }
    }
}

/// What one arc line must look like, from the oracle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// A `U` block line.
    User { location: String, count: u64, type_code: u8 },
    /// The `K` IRET line after a system call that returned (count 0,
    /// `sys_NAME` or `signal_NAME` in `[kernel]`).
    Kernel,
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expected::User { location, count, type_code } => write!(f, "U {type_code} {count:>5} {location}"),
            Expected::Kernel => write!(f, "K 4     0 sys_*/signal_*"),
        }
    }
}

fn show_line(l: &ArcLine) -> String {
    if l.kernel {
        format!("K {} {:>5} {}", l.type_code, l.count, l.symbol)
    } else {
        format!("U {} {:>5} {}", l.type_code, l.count, l.location())
    }
}

fn matches(l: &ArcLine, e: &Expected, module: &str) -> bool {
    match e {
        Expected::User { location, count, type_code } => {
            !l.kernel
                && l.type_code == *type_code
                && l.count == *count
                && l.location() == *location
                && l.module == module
        }
        Expected::Kernel => {
            l.kernel
                && l.type_code == 4
                && l.count == 0
                && (l.symbol.starts_with("sys_") || l.symbol.starts_with("signal_"))
        }
    }
}

/// Drops a final `K` line that follows a final `U` INTRPT line (the exit
/// system call; whether it gets a `K` line is up to the tracer).
pub fn without_exit_kernel_line(lines: &[ArcLine]) -> &[ArcLine] {
    let n = lines.len();
    if n >= 2 && lines[n - 1].kernel && !lines[n - 2].kernel && lines[n - 2].type_code == 0 {
        &lines[..n - 1]
    } else {
        lines
    }
}

/// Compares `arc` line by line with `expected`, reporting the first
/// difference with context.
pub fn compare_lines(arc: &[ArcLine], expected: &[Expected], module: &str) -> Result<(), String> {
    let n = arc.len().min(expected.len());
    for i in 0..n {
        if !matches(&arc[i], &expected[i], module) {
            return Err(format!(
                "first difference at block {i} (arc line {}):\n{}",
                arc[i].lineno,
                context(arc, expected, i)
            ));
        }
    }
    if arc.len() != expected.len() {
        return Err(format!(
            "arc has {} block lines, oracle {}:\n{}",
            arc.len(),
            expected.len(),
            context(arc, expected, n)
        ));
    }
    Ok(())
}

fn context(arc: &[ArcLine], expected: &[Expected], at: usize) -> String {
    let mut s = String::from("    idx  | arc                                      | oracle\n");
    let lo = at.saturating_sub(5);
    let hi = (at + 5).min(arc.len().max(expected.len()));
    for i in lo..hi {
        let a = arc.get(i).map(show_line).unwrap_or_else(|| "-".into());
        let e = expected.get(i).map(|e| e.to_string()).unwrap_or_else(|| "-".into());
        let mark = if i == at { ">>" } else { "  " };
        s.push_str(&format!("{mark} {i:>6} | {a:<40} | {e}\n"));
    }
    s
}
