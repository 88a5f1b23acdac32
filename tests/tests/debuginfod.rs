//! Debug info by build-id from a real debuginfod server (elfutils' `debuginfod`, started here on
//! loopback, serving a folder with the program's `.debug` file): the report of the stripped
//! program names its functions as `nm` of the unstripped build does, with the counts of the
//! unstripped trace; the file lands in elfutils' client cache layout
//! (`$DEBUGINFOD_CACHE_PATH/<build-id>/debuginfo`) and is used from there with the server
//! stopped; `itrace archive` keeps it; a dead server and a server that never answers each give
//! one warning and a report of `program+0xOFFSET` rows.

use itrace_tests::{
    free_port, record, report_rows, require_tool, run, test_dir, wait_until, KillOnDrop, Output, Symbols,
};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `itrace report TRACE --json` with the debuginfod variables `vars` (and no others).
fn report_with(trace: &Path, vars: &[(&str, &str)]) -> (serde_json::Value, Output) {
    let mut cmd = Command::new(itrace_tests::itrace_bin());
    cmd.arg("report").arg(trace).arg("--json");
    for v in ["DEBUGINFOD_URLS", "DEBUGINFOD_CACHE_PATH", "DEBUGINFOD_TIMEOUT"] {
        cmd.env_remove(v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = run(&mut cmd);
    out.assert_success();
    let json = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("report --json: {e}\n{}", out.stdout));
    (json, out)
}

/// The GNU build-id of `binary` in hex, as `readelf -n` prints it.
fn build_id(binary: &Path) -> String {
    let o = run(Command::new("readelf").arg("-n").arg(binary));
    o.assert_success();
    o.stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .unwrap_or_else(|| panic!("no build-id in {}:\n{}", binary.display(), o.stdout))
}

/// The status code of `GET path` on 127.0.0.1:`port` (None: no answer).
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 32];
    let n = s.read(&mut head).ok()?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace().nth(1)?.parse().ok()
}

struct Built {
    dir: PathBuf,
    unstripped: PathBuf,
    stripped: PathBuf,
    served: PathBuf,
    id: String,
}

/// funcptr.c built with debug info and a build-id, a stripped copy, and its debug file alone in
/// a folder to serve.
fn build(name: &str) -> Built {
    require_tool("gcc");
    require_tool("objcopy");
    require_tool("strip");
    require_tool("readelf");
    let dir = test_dir(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/funcptr.c");
    let unstripped = dir.join("funcptr.full");
    run(Command::new("gcc").args(["-O1", "-g", "-Wl,--build-id=sha1", "-o"]).arg(&unstripped).arg(&src))
        .assert_success();
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    run(Command::new("objcopy").arg("--only-keep-debug").arg(&unstripped).arg(served.join("funcptr.debug")))
        .assert_success();
    let stripped = dir.join("funcptr");
    run(Command::new("strip").arg("--strip-all").arg("-o").arg(&stripped).arg(&unstripped)).assert_success();
    assert!(Symbols::of(&stripped).syms.is_empty(), "strip left symbols in {}", stripped.display());
    let id = build_id(&unstripped);
    assert_eq!(build_id(&stripped), id, "strip changed the build-id");
    Built { dir, unstripped, stripped, served, id }
}

/// `itrace record` of `program` with no debuginfod variables (the recording reads no debug info).
fn record_plain(trace: &Path, program: &Path) {
    record(trace, &[], program, &[]).assert_success();
}

#[test]
fn stripped_program_gets_its_names_from_a_debuginfod_server_then_from_the_cache() {
    let debuginfod = require_tool("debuginfod");
    let b = build("debuginfod-names");
    let t_plain = b.dir.join("plain.itr");
    let t_stripped = b.dir.join("stripped.itr");
    record_plain(&t_plain, &b.unstripped);
    record_plain(&t_stripped, &b.stripped);
    let (plain_report, _) = report_with(&t_plain, &[]);
    let plain = report_rows(&plain_report, &b.unstripped);
    // The truth for names: nm of the unstripped build.
    let nm = Symbols::of(&b.unstripped);
    for name in plain.keys().filter(|n| !n.ends_with("@plt") && *n != "<plt>") {
        assert!(nm.by_name(name).is_some(), "{name} of the unstripped report is not in nm");
    }
    assert!(plain.len() >= 8, "only {} functions in the unstripped report: {plain:?}", plain.len());

    // Without a server: hex offsets (the premise of the test).
    let cache = b.dir.join("cache");
    let cache_s = cache.to_str().unwrap();
    let (r, _) = report_with(&t_stripped, &[("DEBUGINFOD_CACHE_PATH", cache_s)]);
    assert!(
        report_rows(&r, &b.stripped).keys().any(|n| n.starts_with("funcptr+0x")),
        "stripped report has names already"
    );

    let port = free_port();
    let mut server = Command::new(&debuginfod);
    server
        .arg("-p")
        .arg(port.to_string())
        .arg("-d")
        .arg(b.dir.join("debuginfod.sqlite"))
        .arg("-F")
        .arg(&b.served)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let server = KillOnDrop(server.spawn().expect("starting debuginfod"));
    let url = format!("http://127.0.0.1:{port}");
    let path = format!("/buildid/{}/debuginfo", b.id);
    // Its first scan runs in the background: ready when it serves the file.
    wait_until("debuginfod to serve the debug file", || http_status(port, &path) == Some(200));

    let vars = [("DEBUGINFOD_URLS", url.as_str()), ("DEBUGINFOD_CACHE_PATH", cache_s)];
    let (r, out) = report_with(&t_stripped, &vars);
    let got = report_rows(&r, &b.stripped);
    assert_eq!(
        got, plain,
        "names and counts from the debuginfod file differ from the unstripped trace's\n{}",
        out.stderr
    );
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    assert!(!out.stderr.contains("is stripped"), "hint although the debug file was fetched: {}", out.stderr);
    let cached = cache.join(&b.id).join("debuginfo");
    assert!(cached.is_file(), "{} not in the cache (elfutils' layout)", cached.display());
    assert_eq!(
        std::fs::read(&cached).unwrap(),
        std::fs::read(b.served.join("funcptr.debug")).unwrap(),
        "the cached file is not the served debug file"
    );

    // Server stopped: the same names from the cache, without a warning.
    drop(server);
    wait_until("debuginfod to stop", || http_status(port, &path).is_none());
    let (r, out) = report_with(&t_stripped, &vars);
    assert_eq!(report_rows(&r, &b.stripped), plain, "from the cache\n{}", out.stderr);
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);

    // `itrace archive` keeps the fetched file: with an empty cache and no server, the
    // archived trace still has the names.
    let o = run(Command::new(itrace_tests::itrace_bin()).arg("archive").arg(&t_stripped).envs(vars));
    o.assert_success();
    let empty = b.dir.join("empty-cache");
    let (r, out) = report_with(&t_stripped, &[("DEBUGINFOD_CACHE_PATH", empty.to_str().unwrap())]);
    assert_eq!(report_rows(&r, &b.stripped), plain, "from the archive\n{}", out.stderr);
}

/// The report of the stripped trace with `url` as the only server: one warning naming it, the
/// program's rows as `funcptr+0x…`, and no cache entry.
fn check_failing_server(b: &Built, trace: &Path, url: &str, extra: &[(&str, &str)]) {
    let cache = b.dir.join(format!("cache-{}", url.rsplit(':').next().unwrap()));
    let mut vars = vec![("DEBUGINFOD_URLS", url), ("DEBUGINFOD_CACHE_PATH", cache.to_str().unwrap())];
    vars.extend_from_slice(extra);
    let (r, out) = report_with(trace, &vars);
    let warnings: Vec<&str> = out.stderr.lines().filter(|l| l.contains("debuginfod server")).collect();
    assert_eq!(warnings.len(), 1, "one warning for the server:\n{}", out.stderr);
    assert!(warnings[0].contains(url) && warnings[0].contains("warning:"), "{}", warnings[0]);
    let got = report_rows(&r, &b.stripped);
    let plt = |n: &str| n.ends_with("@plt") || n == "<plt>";
    assert!(got.keys().any(|n| n.starts_with("funcptr+0x")), "{got:?}");
    assert!(got.keys().all(|n| plt(n) || n.starts_with("funcptr+0x")), "names without a debug file: {got:?}");
    assert!(!cache.join(&b.id).join("debuginfo").is_file(), "a failed server left a cache file");
}

#[test]
fn dead_or_silent_debuginfod_server_gives_one_warning_and_a_report() {
    let b = build("debuginfod-dead");
    let trace = b.dir.join("stripped.itr");
    record_plain(&trace, &b.stripped);
    // Nothing listens there.
    let port = free_port();
    check_failing_server(&b, &trace, &format!("http://127.0.0.1:{port}"), &[]);
    // A server that takes the connection and never answers: the read timeout ends it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in listener.incoming().take(1) {
            conns.push(c);
            std::thread::sleep(std::time::Duration::from_secs(30));
        }
    });
    check_failing_server(&b, &trace, &format!("http://127.0.0.1:{port}"), &[("DEBUGINFOD_TIMEOUT", "1")]);
    drop(held);
}

/// The hints on stderr of `itrace ARGS` (with `XDG_CACHE_HOME` at `cache`) about `module`.
fn hints(args: &[&std::ffi::OsStr], cache: &Path, module: &Path) -> Vec<String> {
    let mut cmd = Command::new(itrace_tests::itrace_bin());
    cmd.args(args).env("XDG_CACHE_HOME", cache).env_remove("DEBUGINFOD_URLS");
    cmd.env("DEBUGINFOD_CACHE_PATH", cache.join("debuginfod_client"));
    let out = run(&mut cmd);
    out.assert_success();
    out.stderr.lines().filter(|l| l.contains(&*module.to_string_lossy())).map(str::to_string).collect()
}

/// `a` borrowed as arguments.
fn refs(a: &[std::ffi::OsString]) -> Vec<&std::ffi::OsStr> {
    a.iter().map(|s| s.as_os_str()).collect()
}

/// The hint about a stripped module is printed once per trace (remembered in the user's cache,
/// `$XDG_CACHE_HOME/itrace/hints-shown`), by whichever reading command comes first; `-q` prints
/// none; a trace recorded again gets it again. Without `DEBUGINFOD_URLS` it says to set it.
#[test]
fn stripped_hint_is_printed_once_per_trace() {
    let b = build("debuginfod-hint");
    let trace = b.dir.join("stripped.itr");
    record_plain(&trace, &b.stripped);
    let cache = b.dir.join("xdg-cache");
    let os = |s: &str| std::ffi::OsString::from(s);
    let report = [os("report"), trace.clone().into_os_string()];
    let arc = [os("arc"), trace.clone().into_os_string(), os("-o"), b.dir.join("t.arc").into_os_string()];

    let quiet = [os("report"), os("-q"), trace.clone().into_os_string()];
    assert_eq!(hints(&refs(&quiet), &cache, &b.stripped), Vec::<String>::new(), "-q prints no hint");
    let first = hints(&refs(&report), &cache, &b.stripped);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].contains("hint:") && first[0].contains("DEBUGINFOD_URLS"), "{}", first[0]);
    assert_eq!(hints(&refs(&report), &cache, &b.stripped), Vec::<String>::new(), "report again: hint repeated");
    assert_eq!(hints(&refs(&arc), &cache, &b.stripped), Vec::<String>::new(), "arc after report: hint repeated");
    assert!(cache.join("itrace/hints-shown").is_file());

    // A new recording is a new trace (path, size, modification time).
    std::thread::sleep(std::time::Duration::from_millis(20));
    record_plain(&trace, &b.stripped);
    assert_eq!(hints(&refs(&report), &cache, &b.stripped).len(), 1, "a new trace gets its hint");
}

/// `itrace record` never asks a server (the traced program would wait on the network): with
/// `DEBUGINFOD_URLS` naming a listener and a `--start` function only the debug file names, the
/// listener gets no connection.
#[test]
fn recording_asks_no_server() {
    let b = build("debuginfod-record");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let cache = b.dir.join("cache");
    let o = run(Command::new(itrace_tests::itrace_bin())
        .args(["record", "--start", "main", "-o"])
        .arg(b.dir.join("t.itr"))
        .arg(&b.stripped)
        .env("DEBUGINFOD_URLS", &url)
        .env("DEBUGINFOD_CACHE_PATH", &cache)
        .env("DEBUGINFOD_TIMEOUT", "5"));
    o.assert_no_panic();
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("itrace record connected to the debuginfod server: {other:?}\n{}", o.stderr),
    }
    assert!(!cache.join(&b.id).exists(), "itrace record wrote a cache entry");
}
