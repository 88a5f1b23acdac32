//! Address to symbol, module and line, as of the moment of the record:
//! the module-table records are applied in time order, so an address reused
//! by a later mapping (or an exec) resolves to what was there at the time.

use crate::symbols::{JitSymbols, ModuleSymbols, PltPart, SymbolCache};
use itrace_format::Mte;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::rc::Rc;
use std::sync::Arc;

/// Where an address is.
#[derive(Clone, Debug)]
pub struct Location {
    /// Demangled function name, `name@plt` for a PLT stub, `<plt>`, or `<unknown>`.
    pub symbol: Arc<str>,
    /// Offset of the address from the symbol's start.
    pub offset: u64,
    /// Module path, `[vdso]`, `JITCODE`, or `0x<addr>` for unmapped code.
    pub module: Arc<str>,
    /// Source line, 0 when unknown.
    pub line: u32,
    /// Source file of `line`, when known.
    pub file: Option<Arc<str>>,
    /// Interned (module, symbol) pair: the function's identity in reports.
    pub func: u32,
    /// Set when the address is in a PLT stub or header.
    pub plt: Option<PltPart>,
}

/// A file as the recorder saw it.
#[derive(Clone, Debug)]
struct RecordedFile {
    build_id: Vec<u8>,
    size: u64,
    mtime_ns: u64,
}

/// A source file and line (0 and no file when unknown).
type SourceLine = (Option<Arc<str>>, u32);

#[derive(Clone)]
struct Segment {
    start: u64,
    end: u64,
    offset: u64,
    path: Arc<str>,
}

/// Maps keyed by address: Fx hashing, as SipHash would cost more than the lookup it guards.
type AddrMap<V> = rustc_hash::FxHashMap<u64, V>;

#[derive(Clone, Default)]
struct Space {
    segs: Vec<Segment>,
    vdso: Option<Arc<ModuleSymbols>>,
    /// Resolved locations, shared with the blocks that use them (a clone is one count, not
    /// atomic: an `Arc`'s locked increment and decrement cost a tenth of an arc's time).
    cache: AddrMap<Rc<Location>>,
}

impl Space {
    /// Take `start..end` out of the segments, keeping the parts of each outside it (a mapping
    /// placed over part of an earlier one, as the dynamic loader does, leaves the rest mapped).
    fn cut(&mut self, start: u64, end: u64) {
        let mut kept = Vec::with_capacity(self.segs.len() + 1);
        for g in self.segs.drain(..) {
            if g.end <= start || g.start >= end {
                kept.push(g);
                continue;
            }
            if g.start < start {
                kept.push(Segment { start: g.start, end: start, offset: g.offset, path: g.path.clone() });
            }
            if g.end > end {
                // File offsets come from the trace: a damaged one must not overflow here.
                let offset = g.offset.wrapping_add(end - g.start);
                kept.push(Segment { start: end, end: g.end, offset, path: g.path });
            }
        }
        self.segs = kept;
    }
}

/// Entries of the resolver's direct-mapped cache (a power of two).
const RECENT_SLOTS: usize = 4096;

/// An entry of the direct-mapped cache in front of the per-process maps.
#[derive(Clone, Default)]
struct Recent {
    /// Valid only while equal to [`Resolver::recent_gen`].
    gen: u64,
    pid: u32,
    addr: u64,
    loc: Option<Rc<Location>>,
}

/// Resolves addresses of every traced process.
pub struct Resolver {
    spaces: HashMap<u32, Space>,
    /// The locations resolved last, by (pid, address) hashed to a slot: asked for once or
    /// more per record, they cost an index and two compares here, not two hash lookups.
    recent: Vec<Recent>,
    /// Bumped by every module-table record (any may change what an address is), which
    /// empties `recent` at once.
    recent_gen: u64,
    symbols: SymbolCache,
    lines: bool,
    funcs: HashMap<(Arc<str>, Arc<str>), u32>,
    func_names: Vec<(Arc<str>, Arc<str>)>,
    unknown: Arc<str>,
    jitcode: Arc<str>,
    /// JIT symbols per process: recorded at the end of tracing, valid for the whole trace.
    jit: HashMap<u32, JitSymbols>,
    /// Warnings and hints for the user, one per module at most.
    notes: Vec<String>,
    /// Modules already looked at for notes.
    noted: HashSet<Arc<str>>,
    /// What each mapped file was when recorded (module-identity records), by path.
    recorded: HashMap<Arc<str>, RecordedFile>,
    /// Modules whose file is missing or no longer the one recorded: their addresses are shown
    /// as `module+0xOFFSET` (file offsets), never with the names of the file there now.
    stale: HashSet<Arc<str>>,
    /// The trace's archive directory (`itrace archive`), when it has one.
    archive: Option<std::path::PathBuf>,
    /// Files read from the archive instead of their recorded path: recorded path -> copy.
    archived: HashMap<Arc<str>, Arc<str>>,
    /// Function starts (image addresses) learned from branch targets in code of a module that
    /// no symbol covers, by module path.
    learned: HashMap<Arc<str>, std::collections::BTreeSet<u64>>,
    /// Entry points (file offsets) learned from calls and jumps into a stale module, by its
    /// path: its code is shown per entry point, as perf shows code without symbols.
    stale_starts: HashMap<Arc<str>, std::collections::BTreeSet<u64>>,
}

impl Resolver {
    /// A resolver; `lines` looks up DWARF source lines too (slower on first use of each module).
    pub fn new(lines: bool) -> Self {
        Resolver {
            spaces: HashMap::default(),
            recent: vec![Recent::default(); RECENT_SLOTS],
            recent_gen: 1,
            symbols: SymbolCache::new(),
            lines,
            funcs: HashMap::default(),
            func_names: Vec::new(),
            unknown: Arc::from("<unknown>"),
            jitcode: Arc::from("JITCODE"),
            jit: HashMap::default(),
            notes: Vec::new(),
            noted: Default::default(),
            learned: HashMap::default(),
            stale_starts: HashMap::default(),
            recorded: HashMap::default(),
            stale: Default::default(),
            archive: None,
            archived: HashMap::default(),
        }
    }

    /// Read the files the trace recorded from the archive directory `dir` where it has them,
    /// and debug files from there first.
    pub fn use_archive(&mut self, dir: &std::path::Path) {
        let mut debug_dirs = vec![dir.to_path_buf()];
        debug_dirs.push(std::path::PathBuf::from(crate::symbols::DEFAULT_DEBUG_DIR));
        self.symbols = SymbolCache::with_debug_dirs(debug_dirs);
        self.archive = Some(dir.to_path_buf());
    }

    /// The symbols of the file recorded at `path`: the archive's copy when there is one.
    fn symbols_for(&mut self, path: &Arc<str>) -> Option<Arc<ModuleSymbols>> {
        match self.archived.get(path).cloned() {
            Some(copy) => self.symbols.get_copy(&copy, path).cloned(),
            None => self.symbols.get(path).cloned(),
        }
    }

    /// A call (`from_func` None) or a jump from function `from_func` to `to` in process `pid`:
    /// if no symbol covers `to` and it is in a mapped file, and the jump leaves its function,
    /// a function starts there (named `module+0xOFFSET` like those from call-frame
    /// information). In a file changed since the recording (no symbol of it can be trusted),
    /// such an entry point starts a function named by its file offset.
    pub fn learn_function_start(&mut self, pid: u32, from_func: Option<u32>, to: u64) {
        let target = self.resolve(pid, to);
        if from_func == Some(target.func) {
            return;
        }
        let stale = self.stale.contains(&target.module);
        if &*target.symbol != "<unknown>" && !stale {
            return;
        }
        let Some(space) = self.spaces.get(&pid) else { return };
        let i = space.segs.partition_point(|g| g.end <= to);
        let Some(seg) = space.segs.get(i).filter(|g| g.start <= to).cloned() else { return };
        if stale {
            let file_offset = (to - seg.start).wrapping_add(seg.offset);
            if target.offset != 0 && self.stale_starts.entry(seg.path.clone()).or_default().insert(file_offset) {
                // Locations resolved before are named by the start below this one.
                self.recent_gen += 1;
            }
            return;
        }
        let Some(ms) = self.symbols_for(&seg.path) else { return };
        let Some(va) = ms.file_vaddr(seg.start, seg.offset, to) else { return };
        self.learned.entry(seg.path.clone()).or_default().insert(va);
    }

    /// The learned function start covering `va` of module `path`, as (name, offset).
    fn learned_start(&self, path: &Arc<str>, va: u64) -> Option<(Arc<str>, u64)> {
        let start = *self.learned.get(path)?.range(..=va).next_back()?;
        let base = path.rsplit('/').next().unwrap_or(path);
        Some((Arc::from(format!("{base}+{start:#x}")), va - start))
    }

    /// What the user should know about the names: stripped modules (with what to install),
    /// one line each, starting with `warning:` or `hint:`.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The first time `path` is resolved in: check it is still the file that was recorded,
    /// and note it if it is not, or if it has no full symbol table.
    fn note_module(&mut self, path: &Arc<str>) {
        if !self.noted.insert(path.clone()) {
            return;
        }
        if let Some(rec) = self.recorded.get(path).filter(|_| !self.archived.contains_key(path)).cloned() {
            let base = path.rsplit('/').next().unwrap_or(path);
            let why = match std::fs::metadata(&**path) {
                Err(e) => Some(format!("is missing ({e})")),
                Ok(meta) if !rec.build_id.is_empty() => {
                    let now = self.symbols.get(path).and_then(|ms| ms.build_id().map(<[u8]>::to_vec));
                    match now {
                        Some(id) if id == rec.build_id => None,
                        Some(id) => Some(format!(
                            "has changed (build-id {} when recorded, {} now)",
                            hex(&rec.build_id),
                            hex(&id)
                        )),
                        None => Some(format!(
                            "has changed (build-id {} when recorded, none now; {} bytes)",
                            hex(&rec.build_id),
                            meta.len()
                        )),
                    }
                }
                Ok(meta) => {
                    let mtime_ns = itrace_format::file_mtime_ns(&meta);
                    (meta.len() != rec.size || mtime_ns != rec.mtime_ns).then(|| {
                        format!(
                            "has changed (no build-id; {} bytes when recorded, {} now, or its modification time)",
                            rec.size,
                            meta.len()
                        )
                    })
                }
            };
            if let Some(why) = why {
                self.notes.push(format!(
                    "warning: {path} {why} since the trace was recorded: its code is shown as {base}+0xOFFSET (the file offsets where calls and jumps entered it), without function names"
                ));
                self.stale.insert(path.clone());
                return;
            }
        }
        if let Some(ms) = self.symbols_for(path) {
            if !ms.has_full_symbols() {
                let note = crate::notes::stripped_hint(path, ms.build_id());
                self.notes.push(note);
            }
        }
        // Loading the module may have asked debuginfod servers: one warning per failed server.
        self.notes.extend(crate::symbols::debuginfod::take_warnings());
    }

    /// Apply a module-table record.
    pub fn apply(&mut self, m: &Mte) {
        self.recent_gen += 1;
        match m {
            Mte::Segment { pid, start, end, offset, path, .. } => {
                let s = self.spaces.entry(*pid).or_default();
                s.cut(*start, *end);
                let i = s.segs.partition_point(|g| g.start < *start);
                s.segs.insert(i, Segment { start: *start, end: *end, offset: *offset, path: Arc::from(path.as_str()) });
                s.cache.clear();
            }
            Mte::Unmap { pid, start, end, .. } => {
                let s = self.spaces.entry(*pid).or_default();
                s.cut(*start, *end);
                s.cache.clear();
            }
            Mte::Exec { pid, .. } => {
                self.spaces.insert(*pid, Space::default());
            }
            Mte::VdsoImage { pid, image, .. } => {
                let name = format!("[vdso] of {pid}");
                let syms = ModuleSymbols::from_bytes(&name, image.clone()).ok().map(Arc::new);
                let s = self.spaces.entry(*pid).or_default();
                s.vdso = syms;
                s.cache.clear();
            }
            Mte::ModuleId { path, size, mtime_ns, build_id, .. } => {
                let rec = RecordedFile { build_id: build_id.clone(), size: *size, mtime_ns: *mtime_ns };
                let path: Arc<str> = Arc::from(path.as_str());
                if let Some(dir) = &self.archive {
                    let copy = crate::archive::archived_path(dir, &path, build_id);
                    if copy.is_file() {
                        self.archived.insert(path.clone(), Arc::from(copy.to_string_lossy().as_ref()));
                    }
                }
                self.recorded.insert(path, rec);
            }
            // Known before the replay: see `preload`.
            Mte::JitSymbol { .. } => {}
            Mte::Clone { parent_pid, child_pid, thread: false, .. } => {
                if let Some(p) = self.spaces.get(parent_pid).cloned() {
                    self.spaces.insert(*child_pid, Space { cache: AddrMap::default(), ..p });
                }
            }
            _ => {}
        }
    }

    /// Take the JIT symbols of a trace (they are recorded at its end but hold for all of it).
    pub fn preload(&mut self, m: &Mte) {
        if let Mte::JitSymbol { pid, start, size, name, .. } = m {
            self.jit.entry(*pid).or_default().add(*start, *size, name.clone());
        }
    }

    fn intern(&mut self, module: &Arc<str>, symbol: &Arc<str>) -> u32 {
        let key = (module.clone(), symbol.clone());
        if let Some(&id) = self.funcs.get(&key) {
            return id;
        }
        let id = self.func_names.len() as u32;
        self.func_names.push(key.clone());
        self.funcs.insert(key, id);
        id
    }

    /// The names of the functions of the files recorded at `paths` that `query` selects
    /// ([`crate::funcname`]), from their symbol tables: a trailing part must be unique among
    /// all of them.
    pub fn functions_named(
        &mut self,
        query: &crate::funcname::FunctionQuery,
        paths: &[Arc<str>],
    ) -> Result<HashSet<Arc<str>>, crate::funcname::NameError> {
        let mut names: Vec<(Arc<str>, String)> = Vec::new();
        for path in paths {
            if let Some(ms) = self.symbols_for(path) {
                names.extend(
                    ms.function_names().filter(|n| query.matches(n).is_some()).map(|n| (Arc::from(n), n.to_string())),
                );
            }
        }
        Ok(query.select(names)?.into_iter().collect())
    }

    /// The id of a kernel event shown as a function (`signal_SIGUSR1` in module `[kernel]`): the
    /// root under which signal handlers run in call stacks.
    pub fn kernel_func(&mut self, name: &str) -> u32 {
        self.intern(&Arc::from("[kernel]"), &Arc::from(name))
    }

    /// Every file the names came from so far, for a summary's key ([`crate::summary`]): the
    /// images read or tried (a missing one too), their debug files, and for an image without
    /// one every place its debug file was looked for by build-id and not found (installing one
    /// there later changes the names). The second value is true when such an image has a
    /// build-id that `DEBUGINFOD_URLS` servers may be asked for: its names may change without
    /// any file here changing.
    pub(crate) fn name_sources(&self) -> (Vec<std::path::PathBuf>, bool) {
        use std::path::PathBuf;
        let mut files: Vec<PathBuf> = self.noted.iter().map(|p| PathBuf::from(&**p)).collect();
        let mut may_download = false;
        for (path, ms) in self.symbols.loaded() {
            files.push(PathBuf::from(path));
            let Some(ms) = ms else { continue };
            if let Some(debug) = ms.debug_file() {
                files.push(debug.to_path_buf());
                continue;
            }
            // A debug file adds call-frame function starts even to an image with a symbol table.
            if let Some(id) = ms.build_id() {
                files.extend(crate::symbols::build_id_debug_files(id, self.symbols.debug_dirs()));
                if !ms.has_full_symbols() {
                    files.extend(crate::symbols::debuginfod::cache_entry(id));
                    may_download |= crate::symbols::debuginfod::servers_set();
                }
            }
        }
        // Where `apply` looked for archive copies: one put there later is read instead.
        if let Some(dir) = &self.archive {
            files.extend(
                self.recorded.iter().map(|(path, rec)| crate::archive::archived_path(dir, path, &rec.build_id)),
            );
        }
        files.sort();
        files.dedup();
        (files, may_download)
    }

    /// The (module, symbol) of an interned function id.
    pub fn func(&self, id: u32) -> (&str, &str) {
        let (m, s) = &self.func_names[id as usize];
        (m, s)
    }

    /// Number of interned functions.
    pub fn func_count(&self) -> usize {
        self.func_names.len()
    }

    /// The file mapped at `addr` in process `pid` and the offset of `addr` in it (for reading
    /// code bytes); None for anonymous and special mappings.
    pub fn file_offset(&self, pid: u32, addr: u64) -> Option<(Arc<str>, u64)> {
        let space = self.spaces.get(&pid)?;
        let i = space.segs.partition_point(|g| g.end <= addr);
        let seg = space.segs.get(i).filter(|g| g.start <= addr && !g.path.is_empty() && !g.path.starts_with('['))?;
        Some((seg.path.clone(), (addr - seg.start).wrapping_add(seg.offset)))
    }

    /// The file to read the code of the module recorded at `path` from: the trace's archive
    /// copy when there is one, else `path` itself.
    pub fn code_file(&self, path: &Arc<str>) -> Arc<str> {
        self.archived.get(path).cloned().unwrap_or_else(|| path.clone())
    }

    /// Whether `addr` in process `pid` is the local entry point of the ELF function it is in
    /// (64-bit PowerPC ELFv2: where calls and tail calls from the same module enter, past the
    /// TOC set-up); false where functions have one entry point.
    pub fn is_local_entry(&mut self, pid: u32, addr: u64) -> bool {
        let Some(seg) = self.spaces.get(&pid).and_then(|space| {
            let i = space.segs.partition_point(|g| g.end <= addr);
            space.segs.get(i).filter(|g| g.start <= addr && g.path.starts_with('/')).cloned()
        }) else {
            return false;
        };
        if self.stale.contains(&seg.path) {
            return false;
        }
        let Some(ms) = self.symbols_for(&seg.path) else { return false };
        let file_offset = (addr - seg.start).wrapping_add(seg.offset);
        let va = ms.file_vaddr(seg.start, seg.offset, addr).unwrap_or(file_offset);
        ms.lookup(va).is_some_and(|h| h.local_entry != 0 && h.offset == u64::from(h.local_entry))
    }

    /// Resolve `addr` in process `pid`.
    pub fn resolve(&mut self, pid: u32, addr: u64) -> Rc<Location> {
        let slot = ((addr ^ (pid as u64) << 48).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % RECENT_SLOTS;
        let r = &self.recent[slot];
        if r.gen == self.recent_gen && r.addr == addr && r.pid == pid {
            if let Some(loc) = &r.loc {
                return loc.clone();
            }
        }
        let (loc, keep) = self.resolve_in_space(pid, addr);
        if keep {
            self.recent[slot] = Recent { gen: self.recent_gen, pid, addr, loc: Some(loc.clone()) };
        }
        loc
    }

    /// [`Self::resolve`] by the process's map, and whether the location may be kept.
    fn resolve_in_space(&mut self, pid: u32, addr: u64) -> (Rc<Location>, bool) {
        if let Some(loc) = self.spaces.get(&pid).and_then(|s| s.cache.get(&addr)) {
            return (loc.clone(), true);
        }
        let (symbol, offset, module, (file, line), plt) = self.lookup(pid, addr);
        let func = self.intern(&module, &symbol);
        let loc = Rc::new(Location { symbol, offset, module, line, file, func, plt });
        // Code of a file that no symbol covers, or of a stale one, may be named by a function
        // start learned later (`learn_function_start`): not kept, so that learning never has
        // to forget; a stale file's is kept in the recent slots only, which learning in it
        // empties at once.
        let unnamed = &*loc.symbol == "<unknown>" && loc.module.starts_with('/');
        if unnamed {
            return (loc, false);
        }
        if !self.stale.contains(&loc.module) {
            self.spaces.entry(pid).or_default().cache.insert(addr, loc.clone());
        }
        (loc, true)
    }

    fn lookup(&mut self, pid: u32, addr: u64) -> (Arc<str>, u64, Arc<str>, SourceLine, Option<PltPart>) {
        let jit_hit = self.jit.get(&pid).and_then(|j| j.lookup(addr)).map(|h| (Arc::<str>::from(h.name), h.offset));
        let space = self.spaces.entry(pid).or_default();
        let i = space.segs.partition_point(|g| g.end <= addr);
        let seg = space.segs.get(i).filter(|g| g.start <= addr).cloned();
        let jitcode = self.jitcode.clone();
        let jit = |_: &Space, _: Arc<str>| match jit_hit.clone() {
            Some((name, offset)) => (name, offset, jitcode.clone(), (None, 0), None),
            None => (Arc::from("<unknown>"), 0, Arc::from(format!("{addr:#x}")), (None, 0), None),
        };
        let Some(seg) = seg else {
            return jit(space, self.jitcode.clone());
        };
        if &*seg.path == "[vdso]" {
            if let Some(v) = space.vdso.clone() {
                if let Some(va) = v.file_vaddr(seg.start, 0, addr) {
                    if let Some(h) = v.lookup(va) {
                        return (Arc::from(h.name), h.offset, seg.path.clone(), (None, 0), h.plt);
                    }
                }
            }
            return (self.unknown.clone(), addr - seg.start, seg.path.clone(), (None, 0), None);
        }
        if seg.path.is_empty() || seg.path.starts_with('[') {
            let r = jit(space, self.jitcode.clone());
            if &*r.0 != "<unknown>" {
                return r;
            }
            let name: Arc<str> = if seg.path.is_empty() { Arc::from("[anon]") } else { seg.path.clone() };
            return (self.unknown.clone(), addr - seg.start, name, (None, 0), None);
        }
        let lines = self.lines;
        self.note_module(&seg.path);
        if self.stale.contains(&seg.path) {
            // By the entry point below it that calls and jumps were seen to enter, else the
            // file as a whole.
            let base = seg.path.rsplit('/').next().unwrap_or(&seg.path);
            let file_offset = (addr - seg.start).wrapping_add(seg.offset);
            let start = self.stale_starts.get(&seg.path).and_then(|s| s.range(..=file_offset).next_back());
            return match start {
                Some(&start) => {
                    (Arc::from(format!("{base}+{start:#x}")), file_offset - start, seg.path.clone(), (None, 0), None)
                }
                None => (Arc::from(base), file_offset, seg.path.clone(), (None, 0), None),
            };
        }
        match self.symbols_for(&seg.path) {
            Some(ms) => {
                let file_offset = (addr - seg.start).wrapping_add(seg.offset);
                let va = ms.file_vaddr(seg.start, seg.offset, addr).unwrap_or(file_offset);
                let source = if lines { ms.source(va) } else { None };
                let line = match source {
                    Some((file, line)) => (Some(file), line),
                    None => (None, 0),
                };
                match ms.lookup(va) {
                    Some(h) => (Arc::from(h.name), h.offset, seg.path.clone(), line, h.plt),
                    None => match self.learned_start(&seg.path, va) {
                        Some((name, offset)) => (name, offset, seg.path.clone(), line, None),
                        None => (self.unknown.clone(), va, seg.path.clone(), line, None),
                    },
                }
            }
            None => {
                (self.unknown.clone(), (addr - seg.start).wrapping_add(seg.offset), seg.path.clone(), (None, 0), None)
            }
        }
    }
}

/// (build-id, size, mtime in ns) of the file at `path` now; the build-id is empty for a file
/// that has none (or is not ELF). None when it cannot be read.
pub(crate) fn file_identity(path: &std::path::Path) -> Option<(Vec<u8>, u64, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    let mtime_ns = itrace_format::file_mtime_ns(&meta);
    let id = ModuleSymbols::from_path(path).ok().and_then(|m| m.build_id().map(<[u8]>::to_vec)).unwrap_or_default();
    Some((id, meta.len(), mtime_ns))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(start: u64, end: u64, offset: u64, path: &str) -> Mte {
        Mte::Segment { ts: 0, pid: 1, prot: 5, start, end, offset, path: path.into() }
    }

    /// The dynamic loader maps a library whole, then maps its data over part of it: the parts
    /// of the first mapping outside the second stay, with their file offsets.
    #[test]
    fn a_mapping_over_part_of_another_keeps_the_rest() {
        let mut r = Resolver::new(false);
        r.apply(&segment(0x1000, 0x9000, 0, "/nonexistent/lib.so"));
        r.apply(&segment(0x6000, 0x7000, 0x20000, "/nonexistent/data"));
        assert_eq!(&*r.resolve(1, 0x2000).module, "/nonexistent/lib.so");
        assert_eq!(&*r.resolve(1, 0x6800).module, "/nonexistent/data");
        assert_eq!(&*r.resolve(1, 0x8000).module, "/nonexistent/lib.so");
        let space = &r.spaces[&1];
        let tail = space.segs.iter().find(|g| g.start == 0x7000).expect("the tail of the first mapping");
        assert_eq!((tail.end, tail.offset), (0x9000, 0x6000));
        r.apply(&Mte::Unmap { ts: 0, pid: 1, start: 0x1000, end: 0x3000 });
        assert_eq!(&*r.resolve(1, 0x2000).module, "0x2000");
        assert_eq!(&*r.resolve(1, 0x4000).module, "/nonexistent/lib.so");
    }

    /// Found by fuzz/ (arc): a segment whose file offset is near u64::MAX (a damaged trace)
    /// overflowed "attempt to add with overflow" when a mapping cut it, and when an address
    /// in it was resolved.
    #[test]
    fn file_offsets_near_u64_max_do_not_overflow() {
        let mut r = Resolver::new(false);
        r.apply(&segment(0x1000, 0x9000, u64::MAX - 0x10, "/nonexistent/lib.so"));
        assert_eq!(r.resolve(1, 0x2000).offset, 0xfef);
        assert_eq!(r.file_offset(1, 0x2000).map(|(_, o)| o), Some(0xfef));
        r.apply(&segment(0x6000, 0x7000, 0, "/nonexistent/data"));
        let tail = r.spaces[&1].segs.iter().find(|g| g.start == 0x7000).expect("the tail of the first mapping");
        assert_eq!(tail.offset, 0x5fef);
        assert_eq!(&*r.resolve(1, 0x8000).module, "/nonexistent/lib.so");
    }
}
