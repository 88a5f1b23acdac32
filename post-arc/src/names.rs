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
    let nr = nr as usize;
    let name = match arch {
        Arch::X86_64 => syscalls::x86_64::Sysno::new(nr).map(|s| s.name()),
        Arch::I386 => syscalls::x86::Sysno::new(nr).map(|s| s.name()),
        Arch::Ppc64 | Arch::Ppc64le => syscalls::powerpc64::Sysno::new(nr).map(|s| s.name()),
        Arch::S390x => syscalls::s390x::Sysno::new(nr).map(|s| s.name()),
    };
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
