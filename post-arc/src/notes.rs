//! Warnings and hints about the names in reports and arcs: stripped modules and what to
//! install for their names.

use std::path::Path;

/// Where Debian's dpkg lists each installed package's files.
const DPKG_INFO: &str = "/var/lib/dpkg/info";

/// The hint for a module that has neither a symbol table nor a debug file.
pub(crate) fn stripped_hint(path: &str, build_id: Option<&[u8]>) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let mut hint = format!("hint: {path} is stripped and has no debug file: its functions show as {base}+0xOFFSET");
    match build_id.filter(|id| id.len() > 1) {
        Some(id) => {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            hint.push_str(&format!("; for names install /usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]));
        }
        None => hint.push_str("; for names install its debug file"),
    }
    if let Some(pkg) = owning_package(path) {
        hint.push_str(&format!(" (package {pkg}-dbgsym, or {pkg}'s -dbg package)"));
    }
    if build_id.is_some_and(|id| id.len() > 1) && std::env::var_os("DEBUGINFOD_URLS").is_none_or(|v| v.is_empty()) {
        hint.push_str(", or set DEBUGINFOD_URLS to a debuginfod server to fetch it");
    }
    hint
}

/// The dpkg package that installed `path` (also under its pre-usrmerge name, /bin for /usr/bin).
fn owning_package(path: &str) -> Option<String> {
    let mut names = vec![path.to_string()];
    if let Some(rest) = path.strip_prefix("/usr") {
        names.push(rest.to_string());
    }
    let dir = std::fs::read_dir(Path::new(DPKG_INFO)).ok()?;
    for entry in dir.flatten() {
        let file = entry.path();
        if file.extension().and_then(|e| e.to_str()) != Some("list") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        if text.lines().any(|l| names.iter().any(|n| n == l)) {
            let stem = file.file_stem()?.to_str()?;
            // Multi-arch packages are listed as NAME:ARCH.list.
            return Some(stem.split(':').next().unwrap_or(stem).to_string());
        }
    }
    None
}
