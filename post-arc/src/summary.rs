//! The summary kept beside a trace (`TRACE.itrace-idx`) so that a second `itrace report` of it
//! does not replay it again: the aggregate the report and its views are made from (per-function
//! and per-thread totals, the notes, and when asked for the call tree and the call edges), saved
//! by the first query and read by the next ones while its key still matches.
//!
//! The key is what the names and totals depend on, so that a summary never shows a stale name:
//! - this itrace (its version, the summary's format, and the size, modification time and inode
//!   of the running executable: a rebuilt itrace replays);
//! - the trace (size, modification time, and a hash of its first and last 64 KiB: its header
//!   and its end summary);
//! - where names are looked for: the trace's archive directory (`TRACE.files`) and the debug
//!   directories, the debuginfod client cache directory and `DEBUGINFOD_URLS`;
//! - per entry, every file the names came from, with size, modification time and inode: each
//!   image read (or tried: a missing file is recorded as missing), its debug file, and for an
//!   image without one the places its debug file was looked for by build-id (one installed
//!   there later changes the names), and the archive copies looked for;
//! - per entry, the scope of the aggregate: the range (`--from`, `--to`, `--after`) and the
//!   thread (`--tid`). `--module`, `--grep`, `--sort`, `--top`, `--min-percent`, `--depth`
//!   and the output format are applied after, from the aggregate.
//!
//! An entry also says what it holds (the tree, the edges): a query that needs more replays,
//! collecting what the entry held too, and replaces it. A file holds at most [`MAX_ENTRIES`]
//! entries (one per scope, the newest kept). Anything that does not match, a damaged or
//! truncated file (a hash covers it), or one of another format is ignored: the trace is
//! replayed and the summary written afresh. No summary is written when a `DEBUGINFOD_URLS`
//! server could still give names to a module that has none (a later query may get them).
//!
//! Its size grows with the functions, threads, distinct call stacks and call edges, never with
//! the trace's length. It is written beside the trace when the trace's directory is writable,
//! else in the user's cache (`$XDG_CACHE_HOME/itrace/summaries/`, else `~/.cache/...`), named by
//! a hash of the trace's canonical path; written to a temporary file and renamed into place,
//! so that a reader never sees half of one.

use crate::report::ThreadRow;
use crate::resolve::Resolver;
use crate::stacks::{CallStacks, FuncStats};
use crate::threads::Names;
use crate::{PostError, Trace};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// First bytes of a summary file.
const MAGIC: &[u8; 8] = b"ITRIDX\r\n";
/// Bumped whenever the encoding, or the meaning of what it holds, changes.
const FORMAT: u64 = 1;
/// Entries (scopes) kept in one file.
pub const MAX_ENTRIES: usize = 8;
/// Bytes of the trace hashed at each end (its header, its end summary).
const ENDS: u64 = 64 << 10;

/// One function's totals, with its names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncRow {
    pub module: String,
    pub name: String,
    pub stats: FuncStats,
}

/// One node of the call tree, in the order [`crate::stacks::StackTree::visit_nodes`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    pub depth: u32,
    pub func: u32,
    pub instructions: u64,
    pub calls: u64,
}

/// Calls from one function to another, over all call sites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairEdge {
    pub caller: u32,
    pub callee: u32,
    pub calls: u64,
    pub inclusive: u64,
}

/// What a report and its views are made from: the replay's totals, with the names resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aggregate {
    /// Every function the replay named, by id (those that never ran too).
    pub funcs: Vec<FuncRow>,
    pub threads: Vec<ThreadRow>,
    pub total_branches: u64,
    /// Records lost, as the Lost records say.
    pub lost: u64,
    pub cut_at_gaps: u64,
    pub notes: Vec<String>,
    pub tree: Option<Vec<TreeEntry>>,
    /// Sorted by (caller, callee).
    pub edges: Option<Vec<PairEdge>>,
}

impl Aggregate {
    /// The aggregate of replayed call stacks.
    pub fn from_stacks(sink: &CallStacks, names: &Names, res: &Resolver) -> Self {
        let funcs = (0..res.func_count())
            .map(|i| {
                let (module, name) = res.func(i as u32);
                let stats = sink.funcs.get(i).cloned().unwrap_or_default();
                FuncRow { module: module.to_string(), name: name.to_string(), stats }
            })
            .collect();
        let threads = sink
            .threads
            .iter()
            .map(|(tid, t)| ThreadRow {
                pid: if t.pid != 0 { t.pid } else { names.pid_of(*tid) },
                tid: *tid,
                name: names.thread_name(*tid).to_string(),
                instructions: t.instructions,
                branches: t.branches,
            })
            .collect();
        let tree = sink.tree.as_ref().map(|t| {
            let mut nodes = Vec::with_capacity(t.len());
            t.visit_nodes(&mut |depth, func, instructions, calls| {
                nodes.push(TreeEntry { depth: depth as u32, func, instructions, calls })
            });
            nodes
        });
        let edges = sink.edges.as_ref().map(|edges| {
            let mut pairs: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
            for ((caller, _line, callee), e) in edges {
                let p = pairs.entry((*caller, *callee)).or_default();
                p.0 += e.calls;
                p.1 += e.inclusive;
            }
            pairs
                .into_iter()
                .map(|((caller, callee), (calls, inclusive))| PairEdge { caller, callee, calls, inclusive })
                .collect()
        });
        Aggregate {
            funcs,
            threads,
            total_branches: sink.total_branches,
            lost: sink.lost,
            cut_at_gaps: sink.cut_at_gaps,
            notes: res.notes().to_vec(),
            tree,
            edges,
        }
    }

    /// The (module, name) of function `id`.
    pub fn func(&self, id: u32) -> (&str, &str) {
        let f = &self.funcs[id as usize];
        (&f.module, &f.name)
    }

    /// What it holds beyond the totals.
    fn holds(&self) -> Collected {
        Collected { tree: self.tree.is_some(), edges: self.edges.is_some() }
    }
}

/// What an aggregate holds beyond the totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    pub tree: bool,
    pub edges: bool,
}

impl Collected {
    fn covers(self, need: Collected) -> bool {
        (self.tree || !need.tree) && (self.edges || !need.edges)
    }

    fn union(self, other: Collected) -> Collected {
        Collected { tree: self.tree || other.tree, edges: self.edges || other.edges }
    }
}

/// The files the names of a replay came from ([`Resolver::name_sources`]).
pub struct NameSources {
    pub files: Vec<PathBuf>,
    /// A `DEBUGINFOD_URLS` server may still give names a module lacks: keep no summary.
    pub may_download: bool,
}

impl NameSources {
    /// The sources of the names `res` gave in a replay of `trace`; with `--after`, also every
    /// file the trace mapped (the function it names is looked for in all their symbol tables).
    pub fn of(trace: &Trace, res: &Resolver) -> Result<Self, PostError> {
        let (mut files, may_download) = res.name_sources();
        if trace.range().after.is_some() {
            for r in trace.stream(itrace_format::STREAM_MTE) {
                if let (_, itrace_format::Record::Mte(itrace_format::Mte::Segment { path, .. })) = r? {
                    if path.starts_with('/') {
                        files.push(PathBuf::from(path));
                    }
                }
            }
            files.sort();
            files.dedup();
        }
        Ok(NameSources { files, may_download })
    }
}

/// What a file was: None when it could not be looked at (missing).
type Stamp = Option<(u64, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), itrace_format::file_mtime_ns(&m), m.ino()))
}

fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The part of the key that is the same for every entry: itrace, the trace, where names are
/// looked for. None when the trace cannot be looked at.
fn file_key(trace: &Trace) -> Option<Vec<u8>> {
    let mut e = Enc::default();
    e.bytes(MAGIC);
    e.u(FORMAT);
    e.str(env!("CARGO_PKG_VERSION"));
    let exe = std::env::current_exe().ok().and_then(|p| stamp(&p));
    e.stamp(exe);
    let path = trace.path();
    let mut f = std::fs::File::open(path).ok()?;
    let meta = f.metadata().ok()?;
    e.u(meta.len());
    e.u(itrace_format::file_mtime_ns(&meta));
    let mut ends = Vec::new();
    (&mut f).take(ENDS).read_to_end(&mut ends).ok()?;
    if meta.len() > ENDS {
        f.seek(SeekFrom::Start(meta.len().saturating_sub(ENDS).max(ENDS))).ok()?;
        f.take(ENDS).read_to_end(&mut ends).ok()?;
    }
    e.u(fnv1a(FNV_START, &ends));
    let archive = crate::archive::archive_dir(path);
    e.str(&archive.display().to_string());
    e.stamp(stamp(&archive));
    e.str(crate::symbols::DEFAULT_DEBUG_DIR);
    let cache = crate::symbols::debuginfod::cache_dir();
    e.str(&cache.map(|c| c.display().to_string()).unwrap_or_default());
    e.str(&std::env::var("DEBUGINFOD_URLS").unwrap_or_default());
    Some(e.out)
}

/// Where a summary of the trace at `path` may be: beside it, then in the user's cache.
fn places(path: &Path) -> Vec<PathBuf> {
    let mut beside = path.as_os_str().to_owned();
    beside.push(".itrace-idx");
    let mut places = vec![PathBuf::from(beside)];
    let var = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(base) = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache"))) {
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let name = format!("{:016x}.itrace-idx", fnv1a(FNV_START, canonical.as_os_str().as_encoded_bytes()));
        places.push(base.join("itrace").join("summaries").join(name));
    }
    places
}

/// The scope of an aggregate: the range and the thread.
fn scope(trace: &Trace, tid: Option<u32>) -> String {
    format!("{:?} {tid:?}", trace.range())
}

/// One aggregate in a file, with what its names came from.
struct Entry {
    scope: String,
    files: Vec<(PathBuf, Stamp)>,
    aggregate: Aggregate,
}

impl Entry {
    /// Every file its names came from is as it was.
    fn fresh(&self) -> bool {
        self.files.iter().all(|(p, s)| stamp(p) == *s)
    }
}

/// The entries of the summary at `place` whose file key is `key` (none when it is missing,
/// damaged or of another key).
fn read_entries(place: &Path, key: &[u8]) -> Vec<Entry> {
    let Ok(bytes) = std::fs::read(place) else { return Vec::new() };
    decode(&bytes, key).unwrap_or_default()
}

/// The aggregate of `trace` over its range, of thread `tid` alone when given, holding at least
/// `need`: from a summary whose key matches, else from `replay` (asked to collect `need` and
/// what the summary held), saved for the next query. A summary that cannot be written is only
/// a replay next time.
pub fn aggregate(
    trace: &Trace,
    tid: Option<u32>,
    need: Collected,
    replay: impl FnOnce(Collected) -> Result<(Aggregate, NameSources), PostError>,
) -> Result<Aggregate, PostError> {
    let Some(key) = file_key(trace) else { return Ok(replay(need)?.0) };
    let scope = scope(trace, tid);
    let places = places(trace.path());
    let mut kept: Vec<Entry> = Vec::new();
    let mut collect = need;
    for place in &places {
        let entries = read_entries(place, &key);
        if let Some(i) = entries.iter().position(|e| e.scope == scope && e.fresh()) {
            if entries[i].aggregate.holds().covers(need) {
                return Ok(entries.into_iter().nth(i).expect("found above").aggregate);
            }
            collect = collect.union(entries[i].aggregate.holds());
        }
        if kept.is_empty() {
            kept = entries.into_iter().filter(|e| e.scope != scope && e.fresh()).collect();
        }
    }
    let (aggregate, sources) = replay(collect)?;
    if sources.may_download {
        return Ok(aggregate);
    }
    let files = sources.files.into_iter().map(|p| (p.clone(), stamp(&p))).collect();
    let entry = Entry { scope, files, aggregate };
    kept.truncate(MAX_ENTRIES - 1);
    let mut entries = vec![entry];
    entries.extend(kept);
    let bytes = encode(&key, &entries);
    for place in &places {
        if write_atomically(place, &bytes).is_ok() {
            break;
        }
    }
    Ok(entries.swap_remove(0).aggregate)
}

/// Write `bytes` to a temporary file beside `place` and rename it there.
fn write_atomically(place: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = place.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = place.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, place));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// An encoder: unsigned numbers as LEB128, strings with their length first.
#[derive(Default)]
struct Enc {
    out: Vec<u8>,
}

impl Enc {
    fn u(&mut self, mut n: u64) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                self.out.push(byte);
                return;
            }
            self.out.push(byte | 0x80);
        }
    }

    fn bytes(&mut self, b: &[u8]) {
        self.u(b.len() as u64);
        self.out.extend_from_slice(b);
    }

    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    fn stamp(&mut self, s: Stamp) {
        match s {
            None => self.u(0),
            Some((len, mtime, ino)) => {
                self.u(1);
                self.u(len);
                self.u(mtime);
                self.u(ino);
            }
        }
    }
}

/// A decoder of what [`Enc`] wrote; None on anything out of bounds or malformed.
struct Dec<'a> {
    b: &'a [u8],
}

impl<'a> Dec<'a> {
    fn u(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.b.split_first()?;
            self.b = rest;
            n |= u64::from(byte & 0x7f).checked_shl(shift)?;
            if byte & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u()?).ok()
    }

    /// A count of items of at least one byte each: never more than the bytes left.
    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.u()?).ok().filter(|&n| n <= self.b.len())
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.count()?;
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Some(head)
    }

    fn str(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }

    fn stamp(&mut self) -> Option<Stamp> {
        match self.u()? {
            0 => Some(None),
            1 => Some(Some((self.u()?, self.u()?, self.u()?))),
            _ => None,
        }
    }
}

/// The file: the key, the entries, a hash of both.
fn encode(key: &[u8], entries: &[Entry]) -> Vec<u8> {
    let mut e = Enc::default();
    e.bytes(key);
    e.u(entries.len() as u64);
    for entry in entries {
        e.str(&entry.scope);
        e.u(entry.files.len() as u64);
        for (path, s) in &entry.files {
            e.bytes(path.as_os_str().as_encoded_bytes());
            e.stamp(*s);
        }
        let a = &entry.aggregate;
        e.u(a.funcs.len() as u64);
        for f in &a.funcs {
            e.str(&f.module);
            e.str(&f.name);
            e.u(f.stats.self_instructions);
            e.u(f.stats.inclusive);
            e.u(f.stats.calls);
        }
        e.u(a.threads.len() as u64);
        for t in &a.threads {
            e.u(u64::from(t.pid));
            e.u(u64::from(t.tid));
            e.str(&t.name);
            e.u(t.instructions);
            e.u(t.branches);
        }
        e.u(a.total_branches);
        e.u(a.lost);
        e.u(a.cut_at_gaps);
        e.u(a.notes.len() as u64);
        for n in &a.notes {
            e.str(n);
        }
        match &a.tree {
            None => e.u(0),
            Some(nodes) => {
                e.u(1);
                e.u(nodes.len() as u64);
                for n in nodes {
                    e.u(u64::from(n.depth));
                    e.u(u64::from(n.func));
                    e.u(n.instructions);
                    e.u(n.calls);
                }
            }
        }
        match &a.edges {
            None => e.u(0),
            Some(edges) => {
                e.u(1);
                e.u(edges.len() as u64);
                for p in edges {
                    e.u(u64::from(p.caller));
                    e.u(u64::from(p.callee));
                    e.u(p.calls);
                    e.u(p.inclusive);
                }
            }
        }
    }
    let hash = fnv1a(FNV_START, &e.out);
    e.out.extend_from_slice(&hash.to_le_bytes());
    e.out
}

/// The entries of a file whose key is `key`; None when it is another's, damaged or cut short.
fn decode(bytes: &[u8], key: &[u8]) -> Option<Vec<Entry>> {
    let (body, hash) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    if fnv1a(FNV_START, body).to_le_bytes() != hash {
        return None;
    }
    let mut d = Dec { b: body };
    if d.bytes()? != key {
        return None;
    }
    let n = d.count()?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let scope = d.str()?;
        let nfiles = d.count()?;
        let mut files = Vec::with_capacity(nfiles);
        for _ in 0..nfiles {
            let path = PathBuf::from(std::ffi::OsStr::new(std::str::from_utf8(d.bytes()?).ok()?));
            files.push((path, d.stamp()?));
        }
        let nfuncs = d.count()?;
        let mut funcs = Vec::with_capacity(nfuncs);
        for _ in 0..nfuncs {
            let module = d.str()?;
            let name = d.str()?;
            let stats = FuncStats { self_instructions: d.u()?, inclusive: d.u()?, calls: d.u()? };
            funcs.push(FuncRow { module, name, stats });
        }
        let nthreads = d.count()?;
        let mut threads = Vec::with_capacity(nthreads);
        for _ in 0..nthreads {
            threads.push(ThreadRow {
                pid: d.u32()?,
                tid: d.u32()?,
                name: d.str()?,
                instructions: d.u()?,
                branches: d.u()?,
            });
        }
        let (total_branches, lost, cut_at_gaps) = (d.u()?, d.u()?, d.u()?);
        let nnotes = d.count()?;
        let notes = (0..nnotes).map(|_| d.str()).collect::<Option<Vec<_>>>()?;
        let tree = match d.u()? {
            0 => None,
            1 => {
                let n = d.count()?;
                let mut nodes = Vec::with_capacity(n);
                for _ in 0..n {
                    nodes.push(TreeEntry { depth: d.u32()?, func: d.u32()?, instructions: d.u()?, calls: d.u()? });
                }
                Some(nodes)
            }
            _ => return None,
        };
        let edges = match d.u()? {
            0 => None,
            1 => {
                let n = d.count()?;
                let mut edges = Vec::with_capacity(n);
                for _ in 0..n {
                    edges.push(PairEdge { caller: d.u32()?, callee: d.u32()?, calls: d.u()?, inclusive: d.u()? });
                }
                Some(edges)
            }
            _ => return None,
        };
        // Ids must name functions of the entry: a damaged file never indexes out of bounds.
        let known = |id: u32| (id as usize) < funcs.len() || id == u32::MAX;
        if tree.as_ref().is_some_and(|t| t.iter().any(|n| !known(n.func)))
            || edges.as_ref().is_some_and(|e| e.iter().any(|p| !known(p.caller) || !known(p.callee)))
        {
            return None;
        }
        let aggregate = Aggregate { funcs, threads, total_branches, lost, cut_at_gaps, notes, tree, edges };
        entries.push(Entry { scope, files, aggregate });
    }
    d.b.is_empty().then_some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aggregate() -> Aggregate {
        Aggregate {
            funcs: vec![
                FuncRow {
                    module: "/bin/m".into(),
                    name: "main".into(),
                    stats: FuncStats { self_instructions: 5, inclusive: 300, calls: 0 },
                },
                FuncRow {
                    module: "/lib/libc.so.6".into(),
                    name: "ünïcode\u{1}".into(),
                    stats: FuncStats { self_instructions: u64::MAX, inclusive: 1 << 40, calls: 7 },
                },
            ],
            threads: vec![ThreadRow { pid: 7, tid: 8, name: "m".into(), instructions: 300, branches: 12 }],
            total_branches: 12,
            lost: 0,
            cut_at_gaps: 1,
            notes: vec!["hint: x".into()],
            tree: Some(vec![
                TreeEntry { depth: 0, func: 0, instructions: 5, calls: 0 },
                TreeEntry { depth: 1, func: u32::MAX, instructions: 0, calls: 0 },
            ]),
            edges: Some(vec![PairEdge { caller: 0, callee: 1, calls: 7, inclusive: 295 }]),
        }
    }

    /// What is encoded decodes to the same; another key, any flipped byte or a cut file
    /// decodes to nothing (never a panic).
    #[test]
    fn round_trip_and_damage() {
        let entry = Entry {
            scope: "s".into(),
            files: vec![(PathBuf::from("/bin/m"), Some((1, 2, 3))), (PathBuf::from("/nope"), None)],
            aggregate: aggregate(),
        };
        let bytes = encode(b"key", &[entry]);
        let back = decode(&bytes, b"key").expect("decodes");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].aggregate, aggregate());
        assert_eq!(back[0].files[1], (PathBuf::from("/nope"), None));
        assert!(decode(&bytes, b"other").is_none());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad, b"key").is_none(), "byte {i} flipped");
            assert!(decode(&bytes[..i], b"key").is_none(), "cut at {i}");
        }
    }
}
