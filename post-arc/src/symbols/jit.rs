//! Symbols of JIT-compiled code from perf map files.

use std::collections::BTreeMap;

use super::SymbolHit;

/// One disjoint piece of a JIT symbol's range (a later symbol may have
/// replaced part of it).
#[derive(Debug, Clone, Copy)]
struct Piece {
    end: u64,
    sym_start: u64,
    name: u32,
}

/// Symbols of JIT code from a perf map file (/tmp/perf-PID.map lines: "START SIZE name", hex without 0x or with).
#[derive(Debug, Default, Clone)]
pub struct JitSymbols {
    names: Vec<Box<str>>,
    /// Keyed by piece start; pieces never overlap.
    pieces: BTreeMap<u64, Piece>,
}

impl JitSymbols {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse perf map text; lines that are not "START SIZE name" are skipped.
    pub fn parse(text: &str) -> Self {
        let mut jit = Self::new();
        for line in text.lines() {
            if let Some((start, size, name)) = parse_line(line) {
                jit.add(start, size, name.to_string());
            }
        }
        jit
    }

    /// Add a symbol; where it overlaps earlier ones it replaces them, as a
    /// JIT reuses memory for newer code and appends the newer entry.
    pub fn add(&mut self, start: u64, size: u64, name: String) {
        let Ok(idx) = u32::try_from(self.names.len()) else {
            return;
        };
        self.names.push(name.into_boxed_str());
        let end = start.saturating_add(size.max(1));
        let mut hit: Vec<(u64, Piece)> = Vec::new();
        if let Some((&k, &p)) = self.pieces.range(..start).next_back() {
            if p.end > start {
                hit.push((k, p));
            }
        }
        hit.extend(self.pieces.range(start..end).map(|(&k, &p)| (k, p)));
        for (k, p) in hit {
            self.pieces.remove(&k);
            if k < start {
                self.pieces.insert(k, Piece { end: start, ..p });
            }
            if p.end > end {
                self.pieces.insert(end, p);
            }
        }
        self.pieces.insert(start, Piece { end, sym_start: start, name: idx });
    }

    /// The symbol covering `addr`.
    pub fn lookup(&self, addr: u64) -> Option<SymbolHit<'_>> {
        let (_, p) = self.pieces.range(..=addr).next_back()?;
        if addr >= p.end {
            return None;
        }
        Some(SymbolHit {
            name: self.names.get(p.name as usize)?,
            start: p.sym_start,
            offset: addr - p.sym_start,
            plt: None,
            local_entry: 0,
        })
    }

    /// Number of symbols added.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when no symbol was added.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

fn parse_hex(s: &str) -> Option<u64> {
    let s = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    u64::from_str_radix(s, 16).ok()
}

/// "START SIZE name"; the name is the rest of the line and may contain spaces.
fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let line = line.trim();
    let (start, rest) = line.split_once(char::is_whitespace)?;
    let (size, name) = rest.trim_start().split_once(char::is_whitespace)?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    Some((parse_hex(start)?, parse_hex(size)?, name))
}
