//! `itrace annotate TRACE FUNCTION`: the instructions of one function per source line, and
//! per instruction (`--asm`), as perf annotate and callgrind_annotate show them.
//!
//! The trace counts blocks, not instructions: a block is the straight run of instructions
//! from a branch target to the next taken branch, so each run of a block adds one execution
//! to every instruction in it. The instructions are found by decoding the block's bytes from
//! the file the trace mapped there (or the trace's archive copy), `icount` of them from its
//! start; a block whose decoded instructions do not end at its branch (a wrap-mode trace that
//! lost its start) is counted as unplaced. Each instruction's line comes from the line
//! tables, as callgrind charges each instruction to its own line.

use crate::funcname::FunctionQuery;
use crate::names::printable;
use crate::replay::{replay, Block, GapCause, Sink, Where};
use crate::resolve::{Location, Resolver};
use crate::threads::Names;
use crate::{PostError, Trace};
use itrace_decoders::text::Disassembler;
use itrace_format::{Lost, TraceOff};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;

/// Longest instruction of any architecture itrace traces (x86's 15 bytes).
const MAX_INSN_LEN: usize = 16;

/// Executions of one instruction.
#[derive(Clone, Debug, Serialize)]
pub struct InsnCount {
    /// Address in the traced process.
    pub address: u64,
    /// Offset from the function's start.
    pub offset: u64,
    pub executions: u64,
    pub file: Option<String>,
    /// 0 when unknown.
    pub line: u32,
    /// The instruction, disassembled (Intel syntax on x86), a direct branch's or call's
    /// target named as objdump names it (`call printf@plt`, `jmp bar+0x10`).
    pub text: String,
    /// The target of a direct branch or call (named in `text` when a symbol covers it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<u64>,
    /// For a conditional branch: the executions that branched (the trace's records from it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taken: Option<u64>,
    /// For a conditional branch: the executions that fell through (executions minus taken).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_taken: Option<u64>,
}

/// Instructions run on one source line.
#[derive(Clone, Debug, Serialize)]
pub struct LineCount {
    pub file: Option<String>,
    /// 0 when unknown.
    pub line: u32,
    pub instructions: u64,
}

/// One function annotated.
#[derive(Clone, Debug, Serialize)]
pub struct AnnotatedFunction {
    pub name: String,
    pub module: String,
    /// Instructions of blocks that start in the function: the report's self count.
    #[serde(rename = "self")]
    pub self_instructions: u64,
    /// Of those, instructions of blocks that could not be placed on their instructions.
    pub unplaced: u64,
    /// By file, then line.
    pub lines: Vec<LineCount>,
    /// By address.
    pub instructions: Vec<InsnCount>,
}

/// `itrace annotate`'s result.
#[derive(Clone, Debug, Serialize)]
pub struct Annotation {
    pub total_instructions: u64,
    /// `--hot`: only the lines and instructions with at least this percentage of their
    /// function's self instructions are listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot_percent: Option<f64>,
    /// Every function of the name that ran (one per module, or per process that loaded it elsewhere).
    pub functions: Vec<AnnotatedFunction>,
    /// Warnings and hints about the names, as in [`crate::report::Report::notes`].
    #[serde(skip)]
    pub notes: Vec<String>,
}

#[derive(Default)]
struct Insn {
    executions: u64,
    offset: u64,
    file: Option<Arc<str>>,
    line: u32,
    text: String,
    target: Option<u64>,
    /// Whether the target is named in `text` (or cannot be).
    named: bool,
    conditional: bool,
    /// Branch records from the instruction: the times a conditional one was taken.
    taken: u64,
}

#[derive(Default)]
struct Func {
    name: String,
    module: String,
    self_instructions: u64,
    unplaced: u64,
    insns: BTreeMap<u64, Insn>,
}

/// A file's bytes and an offset in them.
type CodeAt = (Arc<Vec<u8>>, usize);

/// (pid, start, instructions): a block's identity.
type BlockKey = (u32, u64, u32);

struct AnnotateSink<'a> {
    function: FunctionQuery,
    /// Whether each function id seen matches `function` in some way (chosen after the replay).
    matched: FxHashMap<u32, bool>,
    module: Option<&'a str>,
    dis: Disassembler,
    funcs: BTreeMap<u32, Func>,
    /// The instructions of each block seen (None: it could not be placed).
    blocks: FxHashMap<BlockKey, Option<Vec<u64>>>,
    /// Files read, by the path they were recorded under.
    files: HashMap<Arc<str>, Arc<Vec<u8>>>,
    /// Where each thread's next block starts (the last branch's target), for the partial
    /// block a thread's trace ends with.
    next_start: FxHashMap<u32, u64>,
    /// Partial blocks that ended a thread's trace: (location, pid, start if known, instructions, where the thread stood).
    pending: Vec<(Location, u32, Option<u64>, u32, u64)>,
    total: u64,
    error: Option<PostError>,
}

/// The name objdump gives `addr` in a listing (`printf@plt`, `main`, `bar+0x10`); None where
/// no symbol covers it.
fn address_name(res: &mut Resolver, pid: u32, addr: u64) -> Option<String> {
    let loc = res.resolve(pid, addr);
    if loc.symbol.starts_with('<') {
        return None;
    }
    Some(match loc.offset {
        0 => loc.symbol.to_string(),
        off => format!("{}+{off:#x}", loc.symbol),
    })
}

impl Insn {
    /// Set the instruction's branch `target` and name it in its text, whose last operand is
    /// the target's address (`call 0x401030` becomes `call printf@plt`).
    fn name_target(&mut self, res: &mut Resolver, pid: u32, target: u64) {
        self.named = true;
        let hex = format!("0x{target:x}");
        let Some(before) = self.text.strip_suffix(&hex) else { return };
        if !before.ends_with([' ', ',']) {
            return;
        }
        self.target = Some(target);
        if let Some(name) = address_name(res, pid, target) {
            self.text = format!("{before}{name}");
        }
    }
}

impl AnnotateSink<'_> {
    /// What the block's closing branch tells of its instruction: a branch taken (the taken
    /// count of a conditional one; a conditional jump also where the disassembler did not
    /// say), a direct target the disassembler did not decode.
    fn branch(&mut self, res: &mut Resolver, func: u32, pid: u32, br: &itrace_format::Branch) {
        use itrace_format::BranchKind;
        let Some(f) = self.funcs.get_mut(&func) else { return };
        let Some(insn) = f.insns.get_mut(&br.from) else { return };
        // A branch's own records, not a signal's or fault's that stopped the block there.
        if !matches!(br.kind, BranchKind::Call | BranchKind::Return | BranchKind::Jump | BranchKind::CondJump) {
            return;
        }
        insn.taken += 1;
        if br.kind == BranchKind::CondJump {
            insn.conditional = true;
        }
        if !insn.named && br.to != 0 && br.kind != BranchKind::Return {
            insn.name_target(res, pid, br.to);
        }
    }

    fn wanted(&mut self, l: &Location) -> bool {
        let query = &self.function;
        *self.matched.entry(l.func).or_insert_with(|| query.matches(&l.symbol).is_some())
            && match self.module {
                None => true,
                Some(m) => &*l.module == m || crate::report::basename(&l.module) == m,
            }
    }

    /// The code bytes at `addr` of `pid` (up to [`MAX_INSN_LEN`]); None when no file is
    /// mapped there; an error when the file cannot be read.
    fn code(&mut self, res: &Resolver, pid: u32, addr: u64) -> Result<Option<CodeAt>, PostError> {
        let Some((path, offset)) = res.file_offset(pid, addr) else { return Ok(None) };
        let bytes = match self.files.get(&path) {
            Some(b) => b.clone(),
            None => {
                let file = res.code_file(&path);
                let bytes = std::fs::read(&*file).map_err(|e| PostError::CodeUnreadable {
                    function: self.function.text().to_string(),
                    path: file.to_string(),
                    why: e.to_string(),
                })?;
                let bytes = Arc::new(bytes);
                self.files.insert(path, bytes.clone());
                bytes
            }
        };
        Ok(usize::try_from(offset).ok().filter(|&o| o < bytes.len()).map(|o| (bytes, o)))
    }

    /// The addresses of the `icount` instructions from `start` that end at (or just before)
    /// `end`; None when they cannot be found.
    fn place(
        &mut self,
        res: &mut Resolver,
        func: u32,
        pid: u32,
        (start, start_offset): (u64, u64),
        icount: u32,
        end: Option<u64>,
    ) -> Result<Option<Vec<u64>>, PostError> {
        // Capped: a damaged trace may claim any count; the Vec grows as the code decodes.
        let mut addrs = Vec::with_capacity((icount as usize).min(4096));
        let mut pc = start;
        let func_start = start.wrapping_sub(start_offset);
        for _ in 0..icount {
            let Some((bytes, off)) = self.code(res, pid, pc)? else { return Ok(None) };
            let code = &bytes[off..(off + MAX_INSN_LEN).min(bytes.len())];
            let Some(listed) = self.dis.list(pc, code) else { return Ok(None) };
            let f = self.funcs.get_mut(&func).expect("the block's function");
            if let std::collections::btree_map::Entry::Vacant(slot) = f.insns.entry(pc) {
                let loc = res.resolve(pid, pc);
                // From the annotated function's start, also for an instruction a block falls
                // through to past its end.
                let offset = pc.wrapping_sub(func_start);
                let mut insn = Insn {
                    executions: 0,
                    offset,
                    file: loc.file.clone(),
                    line: loc.line,
                    text: listed.text,
                    target: None,
                    named: false,
                    conditional: listed.conditional,
                    taken: 0,
                };
                if let Some(target) = listed.target {
                    insn.name_target(res, pid, target);
                }
                slot.insert(insn);
            }
            addrs.push(pc);
            pc += listed.len as u64;
        }
        // A branch block ends at its branch; a block a signal or fault cut ends before it.
        let ends_right = match end {
            Some(end) => addrs.last() == Some(&end) || pc == end,
            None => true,
        };
        Ok(ends_right.then_some(addrs))
    }

    /// A run of the block of `icount` instructions at `start`, in `loc`.
    fn run(
        &mut self,
        res: &mut Resolver,
        loc: &Location,
        pid: u32,
        start: u64,
        icount: u32,
        end: Option<u64>,
    ) -> Result<(), PostError> {
        let f = self.funcs.entry(loc.func).or_default();
        if f.name.is_empty() {
            f.name = loc.symbol.to_string();
            f.module = loc.module.to_string();
        }
        f.self_instructions += icount as u64;
        let key = (pid, start, icount);
        if !self.blocks.contains_key(&key) {
            let placed = self.place(res, loc.func, pid, (start, loc.offset), icount, end)?;
            self.blocks.insert(key, placed);
        }
        let f = self.funcs.get_mut(&loc.func).expect("entered above");
        match &self.blocks[&key] {
            Some(addrs) => {
                for a in addrs {
                    if let Some(i) = f.insns.get_mut(a) {
                        i.executions += 1;
                    }
                }
            }
            None => f.unplaced += icount as u64,
        }
        Ok(())
    }
}

impl Sink for AnnotateSink<'_> {
    fn block(&mut self, b: &Block, _names: &mut Names, res: &mut Resolver) -> Result<(), PostError> {
        let br = b.branch;
        self.total += br.icount as u64;
        if br.to != 0 {
            self.next_start.insert(br.tid, br.to);
        } else {
            self.next_start.remove(&br.tid);
        }
        if self.error.is_some() {
            return Ok(());
        }
        if let Where::User(l) = &b.loc {
            if self.wanted(l) {
                match self.run(res, l, b.pid, b.start, br.icount, Some(br.from)) {
                    Ok(()) if !br.kernel => self.branch(res, l.func, b.pid, br),
                    Ok(()) => {}
                    Err(e) => self.error = Some(e),
                }
            }
        }
        Ok(())
    }

    fn trace_off(
        &mut self,
        off: &TraceOff,
        partial: Option<&Location>,
        _at: &Location,
        _names: &mut Names,
    ) -> Result<(), PostError> {
        self.total += off.icount as u64;
        let start = self.next_start.remove(&off.tid);
        let Some(l) = partial.filter(|l| self.wanted(l)) else { return Ok(()) };
        // Placed after the replay, by the resolver it returns (the sink gets none here).
        self.pending.push((l.clone(), off.pid, start, off.icount, off.pc));
        Ok(())
    }

    fn lost(&mut self, _cpu: u16, _lost: &Lost) -> Result<(), PostError> {
        Ok(())
    }

    fn gap(&mut self, _cpu: u16, tids: &[u32], _cause: GapCause) -> Result<(), PostError> {
        for tid in tids {
            self.next_start.remove(tid);
        }
        Ok(())
    }
}

/// Annotate the functions named `function` (in module `module`, a file name or path, when
/// given) of `trace`.
pub fn annotate(
    trace: &Trace,
    function: &str,
    module: Option<&str>,
    progress: &mut dyn FnMut(u64),
) -> Result<Annotation, PostError> {
    let mut sink = AnnotateSink {
        function: FunctionQuery::new(function),
        matched: FxHashMap::default(),
        module,
        dis: Disassembler::new(trace.header().arch),
        funcs: BTreeMap::new(),
        blocks: FxHashMap::default(),
        files: HashMap::new(),
        next_start: FxHashMap::default(),
        pending: Vec::new(),
        total: 0,
        error: None,
    };
    let (_names, mut res) = replay(trace, true, &mut sink, progress)?;
    for (loc, pid, start, icount, at) in std::mem::take(&mut sink.pending) {
        match start {
            Some(start) => sink.run(&mut res, &loc, pid, start, icount, Some(at))?,
            None => {
                let f = sink.funcs.entry(loc.func).or_default();
                f.name = loc.symbol.to_string();
                f.module = loc.module.to_string();
                f.self_instructions += icount as u64;
                f.unplaced += icount as u64;
            }
        }
    }
    if let Some(e) = sink.error {
        return Err(e);
    }
    if sink.funcs.is_empty() {
        return Err(crate::no_such_function(function, res.notes()));
    }
    // The functions the name selects of those it matched in some way (a trailing part must
    // be unique).
    let selected = sink.function.select(sink.funcs.iter().map(|(&id, f)| (id, f.name.clone())));
    let selected = selected.map_err(PostError::Name)?;
    sink.funcs.retain(|id, _| selected.contains(id));
    let functions = sink
        .funcs
        .into_values()
        .map(|f| {
            let mut lines: BTreeMap<(Option<Arc<str>>, u32), u64> = BTreeMap::new();
            for i in f.insns.values() {
                *lines.entry((i.file.clone(), i.line)).or_default() += i.executions;
            }
            AnnotatedFunction {
                name: f.name,
                module: f.module,
                self_instructions: f.self_instructions,
                unplaced: f.unplaced,
                lines: lines
                    .into_iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|((file, line), instructions)| LineCount {
                        file: file.map(|f| f.to_string()),
                        line,
                        instructions,
                    })
                    .collect(),
                instructions: f
                    .insns
                    .into_iter()
                    .map(|(address, i)| InsnCount {
                        address,
                        offset: i.offset,
                        executions: i.executions,
                        file: i.file.map(|f| f.to_string()),
                        line: i.line,
                        text: i.text,
                        target: i.target,
                        // A record per taken branch: taken never exceeds the executions,
                        // but a damaged trace's counts are not trusted to say so.
                        taken: i.conditional.then_some(i.taken),
                        not_taken: i.conditional.then(|| i.executions.saturating_sub(i.taken)),
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(Annotation { total_instructions: sink.total, hot_percent: None, functions, notes: res.notes().to_vec() })
}

/// Lines of source shown around a function's lines at most: a function whose lines spread
/// wider (inlined code from far away) shows only its lines that ran.
const MAX_SPAN: u32 = 400;

impl Annotation {
    /// JSON, for machines.
    pub fn write_json(&self, out: &mut dyn Write) -> Result<(), PostError> {
        serde_json::to_writer_pretty(&mut *out, self).map_err(std::io::Error::from)?;
        writeln!(out)?;
        Ok(())
    }

    /// Keep only the lines and instructions with at least `percent` of their function's
    /// self instructions (`--hot`).
    pub fn retain_hot(&mut self, percent: f64) {
        self.hot_percent = Some(percent);
        for f in &mut self.functions {
            let hot = |n: u64| n > 0 && share(n, f.self_instructions) >= percent;
            f.lines.retain(|l| hot(l.instructions));
            f.instructions.retain(|i| hot(i.executions));
        }
    }

    /// Text: per function, its source lines with the instructions each ran (the source
    /// text when the file is readable), and with `asm` each instruction's executions; each
    /// count also as a percentage of the function's self instructions (`%func`) and of the
    /// trace's (`%all`).
    pub fn write_text(&self, out: &mut dyn Write, asm: bool) -> Result<(), PostError> {
        let all = |n: u64| share(n, self.total_instructions);
        for (k, f) in self.functions.iter().enumerate() {
            if k > 0 {
                writeln!(out)?;
            }
            let func = |n: u64| share(n, f.self_instructions);
            writeln!(
                out,
                "{} [{}]: {} self instructions ({:.2}% of {}); %func is of the function's self instructions, %all of the trace's",
                printable(&f.name),
                printable(&f.module),
                f.self_instructions,
                all(f.self_instructions),
                self.total_instructions
            )?;
            if let Some(hot) = self.hot_percent {
                writeln!(out, "  (only lines and instructions with at least {hot}% of the function's instructions)")?;
            }
            if f.unplaced > 0 {
                writeln!(
                    out,
                    "  ({} instructions of blocks whose start the trace lost are not on any line)",
                    f.unplaced
                )?;
            }
            // Per file, the lines that ran.
            let mut by_file: BTreeMap<Option<&str>, BTreeMap<u32, u64>> = BTreeMap::new();
            for l in &f.lines {
                *by_file.entry(l.file.as_deref()).or_default().entry(l.line).or_default() += l.instructions;
            }
            for (file, lines) in &by_file {
                let name = file.unwrap_or("(no line information)");
                writeln!(out, "\n-- {}", printable(name))?;
                writeln!(out, "{:>12} {:>7} {:>7} {:>6}  source", "instructions", "%func", "%all", "line")?;
                let source = file.and_then(|f| std::fs::read_to_string(f).ok());
                let source: Vec<&str> = source.as_deref().map(|s| s.lines().collect()).unwrap_or_default();
                let (first, last) = (*lines.keys().next().unwrap_or(&0), *lines.keys().next_back().unwrap_or(&0));
                // The hot lines alone, without the cold ones between them.
                let whole_span =
                    self.hot_percent.is_none() && !source.is_empty() && first > 0 && last - first <= MAX_SPAN;
                let shown: Vec<u32> =
                    if whole_span { (first..=last).collect() } else { lines.keys().copied().collect() };
                for line in shown {
                    let text = line.checked_sub(1).and_then(|i| source.get(i as usize)).copied().unwrap_or("");
                    match lines.get(&line) {
                        Some(n) => writeln!(
                            out,
                            "{:>12} {:>7.2} {:>7.2} {:>6}  {}",
                            n,
                            func(*n),
                            all(*n),
                            line,
                            printable(text)
                        )?,
                        None => writeln!(out, "{:>12} {:>7} {:>7} {:>6}  {}", "", "", "", line, printable(text))?,
                    }
                }
                if file.is_some() && source.is_empty() {
                    writeln!(out, "{:>12} (source not readable here)", "")?;
                }
            }
            if asm {
                writeln!(
                    out,
                    "\n{:>12} {:>7} {:>18} {:>8}  {:<24}  instruction",
                    "executions", "%func", "address", "offset", "line"
                )?;
                for i in &f.instructions {
                    let at = match &i.file {
                        Some(file) if i.line > 0 => format!("{}:{}", crate::report::basename(file), i.line),
                        _ => "?".to_string(),
                    };
                    let branches = match (i.taken, i.not_taken) {
                        (Some(t), Some(n)) => format!("  [taken {t}, not taken {n}]"),
                        _ => String::new(),
                    };
                    writeln!(
                        out,
                        "{:>12} {:>7.2} {:>#18x} {:>8}  {:<24}  {}{branches}",
                        i.executions,
                        func(i.executions),
                        i.address,
                        format!("+{:#x}", i.offset),
                        printable(&at),
                        printable(&i.text)
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// `n` as a percentage of `total` (0 of nothing).
fn share(n: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * n as f64 / total as f64
    }
}
