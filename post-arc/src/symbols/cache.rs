//! A cache of loaded images by path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::module::DEFAULT_DEBUG_DIR;
use super::{ModuleSymbols, SymbolError};

/// A cache of ModuleSymbols by path so each file is parsed once; failures are remembered, not retried.
pub struct SymbolCache {
    debug_dirs: Vec<PathBuf>,
    modules: HashMap<String, Result<Arc<ModuleSymbols>, SymbolError>>,
}

impl Default for SymbolCache {
    fn default() -> Self {
        Self::new()
    }
}

impl SymbolCache {
    /// An empty cache looking for separate debug files under [`DEFAULT_DEBUG_DIR`].
    pub fn new() -> Self {
        Self::with_debug_dirs(vec![PathBuf::from(DEFAULT_DEBUG_DIR)])
    }

    /// An empty cache looking for separate debug files under `debug_dirs`.
    pub fn with_debug_dirs(debug_dirs: Vec<PathBuf>) -> Self {
        SymbolCache { debug_dirs, modules: HashMap::new() }
    }

    /// The symbols of the image at `path`, loading it on first use; `None` if it cannot be loaded.
    pub fn get(&mut self, path: &str) -> Option<&Arc<ModuleSymbols>> {
        if !self.modules.contains_key(path) {
            let loaded = if path.starts_with('[') {
                // /proc/PID/maps pseudo-paths ([vdso], [heap]...) name no
                // file; their images come through insert_bytes.
                Err(SymbolError::NotElf { name: path.to_string(), reason: "a pseudo-mapping with no file".into() })
            } else {
                ModuleSymbols::from_path_with_debug_dirs(Path::new(path), &self.debug_dirs).map(Arc::new)
            };
            self.modules.insert(path.to_string(), loaded);
        }
        self.modules.get(path)?.as_ref().ok()
    }

    /// The symbols of the image in `file` (a copy, as in a trace's archive) shown as the image
    /// at `name`: functions without symbols are named after `name`'s file name.
    pub fn get_copy(&mut self, file: &str, name: &str) -> Option<&Arc<ModuleSymbols>> {
        if !self.modules.contains_key(file) {
            let loaded = ModuleSymbols::from_copy(Path::new(file), name, &self.debug_dirs).map(Arc::new);
            self.modules.insert(file.to_string(), loaded);
        }
        self.modules.get(file)?.as_ref().ok()
    }

    /// Load an in-memory image (a saved vDSO) under `name`, replacing any earlier entry.
    pub fn insert_bytes(&mut self, name: &str, bytes: Vec<u8>) -> Option<&Arc<ModuleSymbols>> {
        let loaded = ModuleSymbols::from_bytes_with_debug_dirs(name, bytes, &self.debug_dirs).map(Arc::new);
        self.modules.insert(name.to_string(), loaded);
        self.modules.get(name)?.as_ref().ok()
    }

    /// Every image asked for so far, by the path it was read from, with its symbols when it
    /// loaded: the files the names came from (a summary's key, [`crate::summary`]).
    pub fn loaded(&self) -> impl Iterator<Item = (&str, Option<&Arc<ModuleSymbols>>)> {
        self.modules.iter().map(|(path, m)| (path.as_str(), m.as_ref().ok()))
    }

    /// Where separate debug files are looked for.
    pub fn debug_dirs(&self) -> &[PathBuf] {
        &self.debug_dirs
    }

    /// Why `path` could not be loaded, if it was tried and failed.
    pub fn error(&self, path: &str) -> Option<&SymbolError> {
        self.modules.get(path)?.as_ref().err()
    }
}
