//! Names of system calls and signals, per architecture of the traced program.

use itrace_format::Arch;
use std::borrow::Cow;

/// A name from the trace (a module path, a symbol, a process or thread name) as it may be
/// written in a line of text: control characters (a newline in a file name, an escape
/// sequence in a thread name) and the Unicode line and paragraph separators are written as
/// Rust escapes (`\n`, `\u{1b}`), so that one arc line or table row stays one line and
/// nothing reaches a terminal as a command. The JSON report keeps names whole.
pub fn printable(s: &str) -> Cow<'_, str> {
    let escape = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) || !s.chars().any(escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `sys_NAME` for a system call number.
pub fn syscall(arch: Arch, nr: u16) -> String {
    use crate::syscall_table as t;
    let table = match arch {
        Arch::X86_64 => t::X86_64,
        Arch::I386 => t::I386,
        Arch::Ppc64 | Arch::Ppc64le => t::PPC64,
        Arch::S390x => t::S390X,
    };
    let name = table.binary_search_by_key(&nr, |&(n, _)| n).ok().map(|i| table[i].1);
    match name {
        Some(n) => format!("sys_{n}"),
        None => format!("sys_{nr}"),
    }
}

/// `signal_SIGNAME` for a signal number (Linux numbering, the same on every architecture itrace supports).
pub fn signal(sig: u16) -> String {
    const NAMES: [&str; 32] = [
        "0",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match NAMES.get(sig as usize) {
        Some(n) if sig > 0 => format!("signal_{n}"),
        _ => format!("signal_SIGRT{}", sig as i32 - 32),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names() {
        use itrace_format::Arch;
        assert_eq!(super::syscall(Arch::X86_64, 1), "sys_write");
        assert_eq!(super::syscall(Arch::X86_64, 231), "sys_exit_group");
        assert_eq!(super::syscall(Arch::I386, 4), "sys_write");
        assert_eq!(super::syscall(Arch::S390x, 4), "sys_write");
        assert_eq!(super::syscall(Arch::Ppc64le, 4), "sys_write");
        assert_eq!(super::signal(11), "signal_SIGSEGV");
        assert_eq!(super::signal(34), "signal_SIGRT2");
    }
}

#[cfg(test)]
mod syscall_tests {
    use super::syscall;
    use itrace_format::Arch;

    /// Numbers known by heart (the ABIs do not change), on every architecture.
    #[test]
    fn known_numbers() {
        assert_eq!(syscall(Arch::X86_64, 0), "sys_read");
        assert_eq!(syscall(Arch::X86_64, 59), "sys_execve");
        assert_eq!(syscall(Arch::X86_64, 231), "sys_exit_group");
        assert_eq!(syscall(Arch::I386, 11), "sys_execve");
        assert_eq!(syscall(Arch::I386, 173), "sys_rt_sigreturn");
        assert_eq!(syscall(Arch::Ppc64le, 11), "sys_execve");
        assert_eq!(syscall(Arch::Ppc64, 172), "sys_rt_sigreturn");
        assert_eq!(syscall(Arch::S390x, 11), "sys_execve");
        assert_eq!(syscall(Arch::S390x, 248), "sys_exit_group");
        assert_eq!(syscall(Arch::X86_64, 4000), "sys_4000");
    }

    /// The generated table is what the installed UAPI headers say, number for number
    /// (scripts/gen-syscall-names.sh writes it again after a headers update).
    #[test]
    fn table_matches_the_installed_headers() {
        for (arch, header) in [
            (Arch::X86_64, "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
            (Arch::I386, "/usr/include/x86_64-linux-gnu/asm/unistd_32.h"),
            (Arch::Ppc64le, "/usr/powerpc64le-linux-gnu/include/asm/unistd_64.h"),
            (Arch::S390x, "/usr/s390x-linux-gnu/include/asm/unistd_64.h"),
        ] {
            let text = std::fs::read_to_string(header).unwrap_or_else(|e| {
                panic!("{header}: {e}: install linux-libc-dev and the libc6-dev-*-cross packages (scripts/install-test-deps.sh)")
            });
            let mut n = 0;
            for line in text.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if let [_, name, nr] = f[..] {
                    if let (Some(name), Ok(nr)) = (name.strip_prefix("__NR_"), nr.parse::<u16>()) {
                        if f[0] == "#define" {
                            assert_eq!(syscall(arch, nr), format!("sys_{name}"), "{header}");
                            n += 1;
                        }
                    }
                }
            }
            assert!(n > 300, "{header}: only {n} system calls");
        }
    }
}
