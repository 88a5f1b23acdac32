//! What the recorder reads from /proc: mappings, names, thread lists.

use std::fs;

/// One executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub prot: u32,
    pub offset: u64,
    pub path: String,
}

impl Mapping {
    /// Whether code here may change without a system call we see (writable code: JITs).
    pub fn writable(&self) -> bool {
        self.prot & itrace_format::prot::WRITE != 0
    }
}

/// The vDSO's image as mapped at `m` in process `pid` (its ELF file, at most [`VDSO_MAX`] bytes), or, if that process
/// cannot be read (gone, or another user's), our own: the kernel maps the same image into
/// every process.
pub fn vdso_image(pid: i32, m: &Mapping) -> Option<Vec<u8>> {
    let read = |pid: i32, m: &Mapping| -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = fs::File::open(format!("/proc/{pid}/mem"))?;
        f.seek(SeekFrom::Start(m.start))?;
        let mut image = vec![0u8; (m.end - m.start).min(VDSO_MAX) as usize];
        f.read_exact(&mut image)?;
        // The mapping is whole pages (64K on PowerPC): keep the ELF file, which ends with its
        // section headers.
        if let Ok(h) = goblin::elf::Elf::parse_header(&image) {
            let end = h.e_shoff.saturating_add(h.e_shnum as u64 * h.e_shentsize as u64);
            if end > 0 && end < image.len() as u64 {
                image.truncate(end as usize);
            }
        }
        Ok(image)
    };
    read(pid, m).ok().or_else(|| {
        let own = std::process::id() as i32;
        let mine = exec_mappings(own).ok()?.into_iter().find(|o| o.path == "[vdso]")?;
        read(own, &mine).ok()
    })
}

/// The most of a vDSO image the trace keeps: what fits one record (65532 bytes, 32 of them
/// the record's own fields).
const VDSO_MAX: u64 = 65500;

/// The executable mappings of `pid`, sorted by address.
pub fn exec_mappings(pid: i32) -> std::io::Result<Vec<Mapping>> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_maps(&text))
}

/// Parse /proc/PID/maps text, keeping executable mappings.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(6, ' ');
        let (Some(range), Some(perms), Some(off)) = (f.next(), f.next(), f.next()) else { continue };
        let (_dev, _inode) = (f.next(), f.next());
        let path = f.next().unwrap_or("").trim_start().to_string();
        let p = perms.as_bytes();
        if p.len() < 3 || p[2] != b'x' {
            continue;
        }
        let Some((s, e)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end), Ok(offset)) =
            (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16), u64::from_str_radix(off, 16))
        else {
            continue;
        };
        use itrace_format::prot::*;
        let prot = if p[0] == b'r' { READ } else { 0 } | if p[1] == b'w' { WRITE } else { 0 } | EXEC;
        out.push(Mapping { start, end, prot, offset, path });
    }
    out.sort_by_key(|m| m.start);
    out
}

/// The thread's name (`comm`), or "" if it is gone.
pub fn comm(pid: i32, tid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default()
}

/// A field of /proc/TID/status, as text.
fn status_field(tid: i32, name: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    text.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
}

/// The process (thread group) a thread belongs to.
pub fn tgid(tid: i32) -> Option<i32> {
    status_field(tid, "Tgid:")?.parse().ok()
}

/// The CPU thread `tid` last ran on (field 39, `processor`, of /proc/TID/stat).
pub fn last_cpu(tid: i32) -> Option<usize> {
    let stat = fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    // Fields count from the last ')': comm may hold spaces and parentheses; the state is 3.
    stat.get(stat.rfind(')')? + 1..)?.split_whitespace().nth(36)?.parse().ok()
}

/// The parent of a process.
pub fn ppid(pid: i32) -> Option<i32> {
    status_field(pid, "PPid:")?.parse().ok()
}

/// Signals pending for the thread itself (not the whole process).
pub fn thread_pending_signals(tid: i32) -> u64 {
    status_field(tid, "SigPnd:").and_then(|v| u64::from_str_radix(&v, 16).ok()).unwrap_or(0)
}

/// The signals pending for thread `tid` or its process that it does not block (SigPnd and
/// ShdPnd, less SigBlk, of /proc/TID/status).
pub fn unblocked_pending_signals(tid: i32) -> u64 {
    let field = |name| status_field(tid, name).and_then(|v| u64::from_str_radix(&v, 16).ok()).unwrap_or(0);
    (field("SigPnd:") | field("ShdPnd:")) & !field("SigBlk:")
}

/// Whether thread `tid` has a handler for signal `sig` (SigCgt of /proc/TID/status).
pub fn signal_has_handler(tid: i32, sig: i32) -> bool {
    let caught = status_field(tid, "SigCgt:").and_then(|v| u64::from_str_radix(&v, 16).ok()).unwrap_or(0);
    (1..=64).contains(&sig) && caught & (1 << (sig - 1)) != 0
}

/// The threads of a process.
pub fn tasks(pid: i32) -> std::io::Result<Vec<i32>> {
    let mut v: Vec<i32> =
        fs::read_dir(format!("/proc/{pid}/task"))?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    v.sort_unstable();
    Ok(v)
}

/// The executable file of a process.
pub fn exe(pid: i32) -> String {
    fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
}

/// In a child between fork and exec of a program itrace launches: give it the signal
/// dispositions and mask itrace was started with (itrace ignores SIGPIPE and SIGXFSZ, catches
/// others and blocks some; see [`crate::inherit`]) and, unless `aslr`, turn address-space
/// randomisation off so traces repeat. Only async-signal-safe calls.
pub fn prepare_child_for_exec(aslr: bool) {
    crate::inherit::restore_signals();
    // SAFETY: personality is async-signal-safe and takes no pointers.
    unsafe {
        if !aslr {
            let cur = libc::personality(0xffff_ffff);
            if cur != -1 {
                libc::personality((cur as libc::c_ulong) | libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
            }
        }
    }
}

/// In a child between fork and exec: die (SIGKILL) when the itrace thread that forked it
/// does, so a helper process itrace started (qemu waiting for its debugger, say) is never left
/// behind. Not for a launched program, which must outlive a detach. Async-signal-safe.
pub fn die_with_parent() {
    // SAFETY: prctl with integer arguments is a plain system call.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
}

/// A process's pidfd (`pidfd_open`, Linux 5.3), which becomes readable when the process ends:
/// waiting on it with a timeout sees the end at once, where a sleep between looks would not.
/// `None` where the kernel lacks it.
pub fn pidfd_open(pid: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative result is a new descriptor that nothing else owns.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Wait up to `ms` milliseconds for the process of `pidfd` to end (or a signal); whether it did.
pub fn pidfd_wait(pidfd: &std::os::fd::OwnedFd, ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// JIT symbols a process wrote to `/tmp/perf-PID.map` (the convention of V8, the JVM's
/// perf-map-agent and others): lines of `START SIZE name`, hexadecimal.
/// A map last written before the process started belongs to an earlier process that had the
/// same pid, and is not read. `started` is the start the caller saw while the process lived
/// ([`process_start`]); maps are read at the end, often after the process is gone, when
/// `/proc` can no longer tell. Without a start time, no map is read.
pub fn perf_map(pid: i32, started: Option<std::time::SystemTime>) -> Vec<(u64, u64, String)> {
    let path = format!("/tmp/perf-{pid}.map");
    let written = fs::metadata(&path).and_then(|m| m.modified()).ok();
    let Some(started) = started.or_else(|| process_start(pid)) else { return Vec::new() };
    if written.is_none_or(|w| w < started) {
        return Vec::new();
    }
    fs::read_to_string(path).map(|t| parse_perf_map(&t)).unwrap_or_default()
}

/// When process `pid` started, by the clock of file times: the boot time of `/proc/stat`
/// (whole seconds, so up to a second early) plus the start in clock ticks of
/// `/proc/PID/stat` (field 22).
pub fn process_start(pid: i32) -> Option<std::time::SystemTime> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses (which may hold spaces), field 3 is first.
    let ticks: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let boot: u64 =
        fs::read_to_string("/proc/stat").ok()?.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    // SAFETY: sysconf takes an integer and has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    let since_boot = std::time::Duration::from_millis(ticks.saturating_mul(1000) / hz);
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(boot) + since_boot)
}

/// Parse perf map text; malformed lines are skipped.
pub fn parse_perf_map(text: &str) -> Vec<(u64, u64, String)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    text.lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, ' ');
            let (start, size, name) = (hex(f.next()?)?, hex(f.next()?)?, f.next()?.trim());
            (!name.is_empty() && size > 0).then(|| (start, size, name.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod perf_map_tests {
    #[test]
    fn a_map_older_than_the_process_is_not_read() {
        // This process started after the boot and before now: its start lies between them.
        let me = std::process::id() as i32;
        let started = super::process_start(me).expect("start of this process");
        assert!(started <= std::time::SystemTime::now());
        let path = format!("/tmp/perf-{me}.map");
        std::fs::write(&path, "7f00 10 fresh\n").unwrap();
        assert_eq!(super::perf_map(me, None).len(), 1, "a map written by this process is read");
        // Back-date it to before this process started: an earlier process's map.
        let old = std::fs::File::options().write(true).open(&path).unwrap();
        old.set_modified(started - std::time::Duration::from_secs(5)).unwrap();
        drop(old);
        assert!(super::perf_map(me, None).is_empty(), "a map older than the process is read");
        std::fs::remove_file(&path).unwrap();
    }

    /// A process gone by the end of the trace: /proc cannot tell its start, so the start seen
    /// while it lived decides, and without one no map is read (it may be an older process's).
    #[test]
    fn a_gone_process_needs_the_start_seen_while_it_lived() {
        let gone = 4_194_305; // above the largest pid_max: no such process
        let path = format!("/tmp/perf-{gone}.map");
        std::fs::write(&path, "7f00 10 fresh\n").unwrap();
        assert!(super::perf_map(gone, None).is_empty(), "a map of a process of unknown start is read");
        let before = std::time::SystemTime::now() - std::time::Duration::from_secs(5);
        assert_eq!(super::perf_map(gone, Some(before)).len(), 1, "a map written after the start is not read");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn perf_map_lines() {
        let m = super::parse_perf_map("7f00 10 LazyCompile:~foo a.js:1\n0x7f10 0x20 bar\nbad line\n7f30 0 zero\n");
        assert_eq!(m, vec![(0x7f00, 0x10, "LazyCompile:~foo a.js:1".to_string()), (0x7f10, 0x20, "bar".to_string())]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_executable_mappings_with_paths() {
        let text = "\
00400000-00401000 r--p 00000000 08:01 123 /usr/bin/prog
00401000-00402000 r-xp 00001000 08:01 123 /usr/bin/prog
7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]
7f000000-7f001000 rwxp 00000000 00:00 0 
7f100000-7f101000 r-xp 00002000 08:01 9 /tmp/with space/lib.so
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 4);
        assert_eq!(
            (m[0].start, m[0].end, m[0].offset, m[0].path.as_str()),
            (0x401000, 0x402000, 0x1000, "/usr/bin/prog")
        );
        assert!(m[1].writable() && m[1].path.is_empty());
        assert_eq!(m[2].path, "/tmp/with space/lib.so");
        assert_eq!(m[3].path, "[vdso]");
    }
}
