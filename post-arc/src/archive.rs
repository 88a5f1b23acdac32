//! `itrace archive`: the files a trace ran, copied next to it (`TRACE.files/`), so that it
//! can be read where they are gone or different (another machine, a rebuilt program).
//! Files with a build-id are stored as `.build-id/xx/yyyy` (and their debug files as
//! `.build-id/xx/yyyy.debug`, where readers look for debug files), others under
//! `by-path/` + their absolute path. Readers use the directory when it is there. A debug file
//! found in the debuginfod client cache, or fetched from a `DEBUGINFOD_URLS` server, is archived
//! like one from /usr/lib/debug.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use itrace_format::{Mte, Record};

use crate::symbols::ModuleSymbols;
use crate::{PostError, Trace};

/// The archive directory of the trace at `trace`: `TRACE.files`.
pub fn archive_dir(trace: &Path) -> PathBuf {
    let mut name = trace.as_os_str().to_owned();
    name.push(".files");
    PathBuf::from(name)
}

/// Where the archive keeps the file recorded at `path` with `build_id` (empty: none).
pub(crate) fn archived_path(dir: &Path, path: &str, build_id: &[u8]) -> PathBuf {
    match build_id.split_first() {
        Some((first, rest)) if !rest.is_empty() => {
            let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
            dir.join(".build-id").join(format!("{first:02x}")).join(rest)
        }
        _ => dir.join("by-path").join(path.trim_start_matches('/')),
    }
}

/// What `write_archive` did.
#[derive(Debug, Default)]
pub struct ArchiveStats {
    /// Files copied (binaries and debug files), and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Files already in the archive.
    pub kept: u64,
    /// Why some recorded files could not be archived (missing or changed since recording).
    pub notes: Vec<String>,
}

/// Copy the files `trace` recorded (module-identity records) into its archive directory,
/// each only if it is still the file that was recorded.
pub fn write_archive(trace: &Trace) -> Result<ArchiveStats, PostError> {
    let dir = archive_dir(trace.path());
    // One entry per (path, build-id, size, mtime): the last identity recorded for a path wins.
    let mut files: BTreeMap<String, (Vec<u8>, u64, u64)> = BTreeMap::new();
    for r in trace.stream(itrace_format::STREAM_MTE) {
        if let (_, Record::Mte(Mte::ModuleId { path, build_id, size, mtime_ns, .. })) = r? {
            files.insert(path, (build_id, size, mtime_ns));
        }
    }
    let mut stats = ArchiveStats::default();
    if files.is_empty() {
        stats.notes.push(format!(
            "warning: {} names no files (no module identity records: recorded by an older itrace, or by the qemu or GDB backend)",
            trace.path().display()
        ));
    }
    for (path, (build_id, size, mtime_ns)) in files {
        let now = crate::resolve::file_identity(Path::new(&path));
        let same = match &now {
            None => {
                stats.notes.push(format!("warning: {path} is missing: not archived"));
                continue;
            }
            Some((id, _, _)) if !build_id.is_empty() => *id == build_id,
            Some((_, sz, mt)) => *sz == size && *mt == mtime_ns,
        };
        if !same {
            stats.notes.push(format!("warning: {path} has changed since the trace was recorded: not archived"));
            continue;
        }
        let dest = archived_path(&dir, &path, &build_id);
        copy_into(Path::new(&path), &dest, &mut stats)?;
        // The debug file too, where readers look for it.
        if let Ok(ms) = ModuleSymbols::from_path(Path::new(&path)) {
            if let Some(debug) = ms.debug_file() {
                let mut name = dest.clone().into_os_string();
                name.push(".debug");
                if !build_id.is_empty() {
                    copy_into(debug, Path::new(&name), &mut stats)?;
                }
            }
        }
    }
    stats.notes.extend(crate::symbols::debuginfod::take_warnings());
    Ok(stats)
}

fn copy_into(src: &Path, dest: &Path, stats: &mut ArchiveStats) -> Result<(), PostError> {
    if dest.is_file() {
        stats.kept += 1;
        return Ok(());
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Copied to a temporary name first, so that an interrupted copy is never taken for the file.
    let mut tmp = dest.as_os_str().to_owned();
    tmp.push(".tmp");
    let n = std::fs::copy(src, &tmp)?;
    std::fs::rename(&tmp, dest)?;
    stats.files += 1;
    stats.bytes += n;
    Ok(())
}
