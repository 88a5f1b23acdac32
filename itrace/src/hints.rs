//! The hints already shown for a trace, so that each is printed once per trace and not on every
//! command that reads it.
//!
//! They are remembered in the user's cache, `$XDG_CACHE_HOME/itrace/hints-shown` (else
//! `~/.cache/itrace/hints-shown`), not beside the trace: a trace's directory may be read-only or
//! shared, and a hint is about what this user has installed. Each line is a 64-bit FNV-1a hash
//! (hex) of the trace's canonical path, size and modification time and of the hint's text: a
//! trace recorded again is a new trace and gets its hints again. The file starts afresh past
//! [`MAX_BYTES`]; when it cannot be read or written, hints are printed every time.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Past this size the file is emptied (about 60,000 hints).
const MAX_BYTES: u64 = 1 << 20;

/// The hints shown for one trace.
pub struct Shown {
    file: Option<PathBuf>,
    /// Identity of the trace: canonical path, size, modification time.
    trace_key: String,
    seen: HashSet<u64>,
    new: Vec<u64>,
}

fn cache_file() -> Option<PathBuf> {
    let var = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty()).map(PathBuf::from);
    let base = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))?;
    Some(base.join("itrace").join("hints-shown"))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Shown {
    /// The hints already shown for the trace at `trace`.
    pub fn load(trace: &Path) -> Shown {
        let trace_key = match (trace.canonicalize(), std::fs::metadata(trace)) {
            (Ok(p), Ok(m)) => {
                format!("{}\0{}\0{}", p.display(), m.len(), itrace_format::file_mtime_ns(&m))
            }
            _ => trace.display().to_string(),
        };
        let file = cache_file();
        let seen = file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .map(|text| text.lines().filter_map(|l| u64::from_str_radix(l.trim(), 16).ok()).collect())
            .unwrap_or_default();
        Shown { file, trace_key, seen, new: Vec::new() }
    }

    /// True the first time `hint` is asked about for this trace (it is then remembered).
    pub fn first_time(&mut self, hint: &str) -> bool {
        let key = fnv1a(format!("{}\0{hint}", self.trace_key).as_bytes());
        if !self.seen.insert(key) {
            return false;
        }
        self.new.push(key);
        true
    }

    /// Remember the hints shown this time; a failure only means they are shown again.
    pub fn save(self) {
        let Some(file) = self.file.filter(|_| !self.new.is_empty()) else { return };
        let Some(dir) = file.parent() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let append = std::fs::metadata(&file).is_ok_and(|m| m.len() < MAX_BYTES);
        let text: String = self.new.iter().map(|k| format!("{k:016x}\n")).collect();
        let mut opts = std::fs::OpenOptions::new();
        opts.create(true);
        if append {
            opts.append(true);
        } else {
            opts.write(true).truncate(true);
        }
        if let Ok(mut f) = opts.open(&file) {
            use std::io::Write;
            let _ = f.write_all(text.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_of_known_strings() {
        // The FNV-1a 64 test vectors of its authors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
