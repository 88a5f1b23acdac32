//! Debug files by build-id from debuginfod servers (`DEBUGINFOD_URLS`), as gdb, perf and
//! valgrind fetch them, kept in elfutils' client cache so that both share it.
//!
//! - The cache is `$DEBUGINFOD_CACHE_PATH`, else `~/.debuginfod_client_cache` when it exists
//!   (elfutils' old place), else `$XDG_CACHE_HOME/debuginfod_client`, else
//!   `~/.cache/debuginfod_client`; a debug file is `<cache>/<build-id in hex>/debuginfo`.
//!   A file there is used without asking any server, `DEBUGINFOD_URLS` set or not.
//! - A server answering "not found" leaves an empty `debuginfo` file, as elfutils does: no
//!   server is asked again for that build-id for `cache_miss_s` seconds (the number in
//!   `<cache>/cache_miss_s`, 600 when that file is missing).
//! - `DEBUGINFOD_TIMEOUT` (seconds, default 90, elfutils' default) bounds the connection and
//!   each read: a server that fails or times out gets one warning and is not asked again by
//!   this process, so a dead server costs at most one timeout per command.
//! - Servers are asked only once a program allows it ([`allow_downloads`]): itrace does for the
//!   commands that read traces, not while recording.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// elfutils' default of `DEBUGINFOD_TIMEOUT`, in seconds.
const DEFAULT_TIMEOUT_S: u64 = 90;
/// elfutils' default of `cache_miss_s`: how long a "not found" answer is believed.
const DEFAULT_CACHE_MISS_S: u64 = 600;

/// Servers that failed in this process (asked no more), and the warnings not yet taken.
struct State {
    failed: Vec<String>,
    warnings: Vec<String>,
}

static STATE: Mutex<State> = Mutex::new(State { failed: Vec::new(), warnings: Vec::new() });

/// Whether servers may be asked (the cache is always looked in): off until a program turns it
/// on, so that a recording never waits on the network with the traced program stopped.
static DOWNLOADS: AtomicBool = AtomicBool::new(false);

/// Let [`find_debuginfo`] ask the servers of `DEBUGINFOD_URLS` (the commands that read traces).
pub fn allow_downloads(on: bool) {
    DOWNLOADS.store(on, Ordering::Relaxed);
}

/// The warnings about servers given since the last call (one per failed server).
pub fn take_warnings() -> Vec<String> {
    std::mem::take(&mut STATE.lock().unwrap_or_else(|e| e.into_inner()).warnings)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The client cache directory, as elfutils' `debuginfod_find_debuginfo` chooses it.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(p) = env("DEBUGINFOD_CACHE_PATH") {
        return Some(PathBuf::from(p));
    }
    let home = env("HOME").map(PathBuf::from);
    if let Some(old) = home.as_ref().map(|h| h.join(".debuginfod_client_cache")).filter(|p| p.is_dir()) {
        return Some(old);
    }
    match env("XDG_CACHE_HOME") {
        Some(x) => Some(PathBuf::from(x).join("debuginfod_client")),
        None => Some(home?.join(".cache").join("debuginfod_client")),
    }
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cached debug file of `build_id`, if the cache has one (an empty file is a remembered
/// "not found", not a debug file).
pub fn cached(build_id: &[u8]) -> Option<PathBuf> {
    let p = cache_dir()?.join(hex(build_id)).join("debuginfo");
    std::fs::metadata(&p).ok().filter(|m| m.is_file() && m.len() > 0).map(|_| p)
}

/// Where the cache keeps the debug file of `build_id` (whether it is there or not).
pub fn cache_entry(build_id: &[u8]) -> Option<PathBuf> {
    Some(cache_dir()?.join(hex(build_id)).join("debuginfo"))
}

/// Whether `DEBUGINFOD_URLS` names a server.
pub fn servers_set() -> bool {
    !servers().is_empty()
}

/// The servers of `DEBUGINFOD_URLS` (separated by spaces), without trailing slashes.
fn servers() -> Vec<String> {
    env("DEBUGINFOD_URLS")
        .map(|v| v.split_whitespace().map(|u| u.trim_end_matches('/').to_string()).filter(|u| !u.is_empty()).collect())
        .unwrap_or_default()
}

/// True while a "not found" answer for the entry at `file` (empty) is recent enough to believe.
fn recent_miss(cache: &Path, file: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(file) else { return false };
    if meta.len() > 0 {
        return false;
    }
    let miss_s = std::fs::read_to_string(cache.join("cache_miss_s"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_CACHE_MISS_S);
    let age = meta.modified().ok().and_then(|t| SystemTime::now().duration_since(t).ok()).unwrap_or(Duration::MAX);
    age < Duration::from_secs(miss_s)
}

/// The debug file of the image `module` with `build_id`: from the cache, else downloaded from
/// the first server of `DEBUGINFOD_URLS` that has it (into the cache). `None` when no server
/// is set or none has it; failed servers are warned about once (see [`take_warnings`]).
pub fn find_debuginfo(build_id: &[u8], module: &str) -> Option<PathBuf> {
    if build_id.len() < 2 {
        return None;
    }
    if let Some(p) = cached(build_id) {
        return Some(p);
    }
    if !DOWNLOADS.load(Ordering::Relaxed) {
        return None;
    }
    let servers = servers();
    if servers.is_empty() {
        return None;
    }
    let cache = cache_dir()?;
    let id = hex(build_id);
    let entry = cache.join(&id);
    let file = entry.join("debuginfo");
    if recent_miss(&cache, &file) {
        return None;
    }
    let timeout =
        Duration::from_secs(env("DEBUGINFOD_TIMEOUT").and_then(|s| s.trim().parse().ok()).unwrap_or(DEFAULT_TIMEOUT_S));
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout_read(timeout)
        .user_agent(concat!("itrace/", env!("CARGO_PKG_VERSION")))
        .build();
    let mut all_missed = true;
    for server in servers {
        if STATE.lock().unwrap_or_else(|e| e.into_inner()).failed.contains(&server) {
            all_missed = false;
            continue;
        }
        let url = format!("{server}/buildid/{id}/debuginfo");
        match download(&agent, &url, &entry, module) {
            Ok(Some(p)) => return Some(p),
            Ok(None) => {}
            Err(why) => {
                all_missed = false;
                let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
                st.warnings.push(format!(
                    "warning: debuginfod server {server} failed ({why}); not asked again in this command"
                ));
                st.failed.push(server);
            }
        }
    }
    if all_missed {
        // Every server said "not found": remembered as elfutils does (an empty file).
        if std::fs::create_dir_all(&entry).is_ok() {
            let _ = std::fs::File::create(&file);
        }
    }
    None
}

/// GET `url` into `<entry>/debuginfo`: `Ok(None)` when the server has no such file, `Err` with
/// why when the server failed (connection, timeout, an answer that is not an ELF file).
fn download(agent: &ureq::Agent, url: &str, entry: &Path, module: &str) -> Result<Option<PathBuf>, String> {
    let resp = match agent.get(url).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(404, _)) => return Ok(None),
        Err(ureq::Error::Status(code, r)) => return Err(format!("HTTP {code} {}", r.status_text())),
        Err(e) => return Err(e.to_string()),
    };
    let total = resp.header("Content-Length").and_then(|v| v.parse::<u64>().ok());
    std::fs::create_dir_all(entry).map_err(|e| format!("cannot create {}: {e}", entry.display()))?;
    let file = entry.join("debuginfo");
    // Written under a temporary name and renamed, so that an interrupted download is never
    // taken for the file (by us or by elfutils).
    let tmp = entry.join(format!(".debuginfo.itrace-{}", std::process::id()));
    let result = (|| {
        let mut out = std::fs::File::create(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        let base = module.rsplit('/').next().unwrap_or(module);
        let bar = crate::progress::download_bar(&format!("debuginfo of {base}"), total);
        let mut reader = resp.into_reader();
        let mut buf = vec![0u8; 1 << 16];
        let mut first = true;
        loop {
            let n = reader.read(&mut buf).map_err(|e| format!("reading {url}: {e}"))?;
            if n == 0 {
                break;
            }
            if first && !buf[..n].starts_with(b"\x7fELF") {
                return Err(format!("{url} is not an ELF file"));
            }
            first = false;
            out.write_all(&buf[..n]).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
            bar.inc(n as u64);
        }
        bar.finish_and_clear();
        if first {
            return Err(format!("{url} is empty"));
        }
        out.flush().map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &file).map_err(|e| format!("cannot rename to {}: {e}", file.display()))
    })();
    match result {
        Ok(()) => Ok(Some(file)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
