//! Address to symbol, module and line, as of the moment of the record:
//! the module-table records are applied in time order, so an address reused
//! by a later mapping (or an exec) resolves to what was there at the time.

use crate::symbols::{JitSymbols, ModuleSymbols, SymbolCache};
use itrace_format::Mte;
use std::collections::HashMap;
use std::sync::Arc;

/// Where an address is.
#[derive(Clone, Debug)]
pub struct Location {
    /// Demangled function name, `<plt>`, or `<unknown>`.
    pub symbol: Arc<str>,
    /// Offset of the address from the symbol's start.
    pub offset: u64,
    /// Module path, `[vdso]`, `JITCODE`, or `0x<addr>` for unmapped code.
    pub module: Arc<str>,
    /// Source line, 0 when unknown.
    pub line: u32,
    /// Interned (module, symbol) pair: the function's identity in reports.
    pub func: u32,
}

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
    cache: AddrMap<Location>,
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

/// Resolves addresses of every traced process.
pub struct Resolver {
    spaces: HashMap<u32, Space>,
    symbols: SymbolCache,
    lines: bool,
    funcs: HashMap<(Arc<str>, Arc<str>), u32>,
    func_names: Vec<(Arc<str>, Arc<str>)>,
    unknown: Arc<str>,
    jitcode: Arc<str>,
    /// JIT symbols per process: recorded at the end of tracing, valid for the whole trace.
    jit: HashMap<u32, JitSymbols>,
}

impl Resolver {
    /// A resolver; `lines` looks up DWARF source lines too (slower on first use of each module).
    pub fn new(lines: bool) -> Self {
        Resolver {
            spaces: HashMap::new(),
            symbols: SymbolCache::new(),
            lines,
            funcs: HashMap::new(),
            func_names: Vec::new(),
            unknown: Arc::from("<unknown>"),
            jitcode: Arc::from("JITCODE"),
            jit: HashMap::new(),
        }
    }

    /// Apply a module-table record.
    pub fn apply(&mut self, m: &Mte) {
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

    /// Resolve `addr` in process `pid`.
    pub fn resolve(&mut self, pid: u32, addr: u64) -> Location {
        if let Some(l) = self.spaces.get(&pid).and_then(|s| s.cache.get(&addr)) {
            return l.clone();
        }
        let (symbol, offset, module, line) = self.lookup(pid, addr);
        let func = self.intern(&module, &symbol);
        let loc = Location { symbol, offset, module, line, func };
        self.spaces.entry(pid).or_default().cache.insert(addr, loc.clone());
        loc
    }

    fn lookup(&mut self, pid: u32, addr: u64) -> (Arc<str>, u64, Arc<str>, u32) {
        let jit_hit = self.jit.get(&pid).and_then(|j| j.lookup(addr)).map(|h| (Arc::<str>::from(h.name), h.offset));
        let space = self.spaces.entry(pid).or_default();
        let i = space.segs.partition_point(|g| g.end <= addr);
        let seg = space.segs.get(i).filter(|g| g.start <= addr).cloned();
        let jitcode = self.jitcode.clone();
        let jit = |_: &Space, _: Arc<str>| match jit_hit.clone() {
            Some((name, offset)) => (name, offset, jitcode.clone(), 0),
            None => (Arc::from("<unknown>"), 0, Arc::from(format!("{addr:#x}")), 0),
        };
        let Some(seg) = seg else {
            return jit(space, self.jitcode.clone());
        };
        if &*seg.path == "[vdso]" {
            if let Some(v) = space.vdso.clone() {
                if let Some(va) = v.file_vaddr(seg.start, 0, addr) {
                    if let Some(h) = v.lookup(va) {
                        return (Arc::from(h.name), h.offset, seg.path.clone(), 0);
                    }
                }
            }
            return (self.unknown.clone(), addr - seg.start, seg.path.clone(), 0);
        }
        if seg.path.is_empty() || seg.path.starts_with('[') {
            let r = jit(space, self.jitcode.clone());
            if &*r.0 != "<unknown>" {
                return r;
            }
            let name: Arc<str> = if seg.path.is_empty() { Arc::from("[anon]") } else { seg.path.clone() };
            return (self.unknown.clone(), addr - seg.start, name, 0);
        }
        let lines = self.lines;
        match self.symbols.get(&seg.path).cloned() {
            Some(ms) => {
                let file_offset = (addr - seg.start).wrapping_add(seg.offset);
                let va = ms.file_vaddr(seg.start, seg.offset, addr).unwrap_or(file_offset);
                let line = if lines { ms.line(va).unwrap_or(0) } else { 0 };
                match ms.lookup(va) {
                    Some(h) => (Arc::from(h.name), h.offset, seg.path.clone(), line),
                    None => (self.unknown.clone(), va, seg.path.clone(), line),
                }
            }
            None => (self.unknown.clone(), (addr - seg.start).wrapping_add(seg.offset), seg.path.clone(), 0),
        }
    }
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
