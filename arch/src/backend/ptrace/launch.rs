//! Starting to trace: a launched program (seized before its exec) or every thread of a running
//! process, with the ptrace options that follow what the settings ask.

use super::cpus::*;
use super::engine::*;
use crate::procfs::{self};
use itrace_format::now_ns;
use nix::errno::Errno;
use nix::sys::ptrace::{self, Options};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

impl Session<'_> {
    pub(super) fn launch(
        &mut self,
        program: &std::path::Path,
        args: &[OsString],
        aslr: bool,
        env: &[(OsString, OsString)],
    ) -> Result<(), RecordError> {
        let exec_err = |source| RecordError::Exec { program: program.display().to_string(), source };
        let prog = CString::new(program.as_os_str().as_bytes()).map_err(|e| exec_err(std::io::Error::other(e)))?;
        let argv: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|e| exec_err(std::io::Error::other(e)))?;
        let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        // Our environment in its order, with `env` set over it.
        let envp = crate::inherit::Environment::inherited_with(env).map_err(|e| exec_err(std::io::Error::other(e)))?;
        let (go_r, go_w) = nix::unistd::pipe().map_err(|e| exec_err(e.into()))?;
        let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| exec_err(e.into()))?;
        use std::os::fd::AsRawFd;
        let (go_r_fd, go_w_fd, err_r_fd, err_w_fd) =
            (go_r.as_raw_fd(), go_w.as_raw_fd(), err_r.as_raw_fd(), err_w.as_raw_fd());
        // SAFETY: the child only calls async-signal-safe functions (read, close, sigaction,
        // sigprocmask, personality, execve, write, _exit) on memory prepared before the fork.
        let pid = match unsafe { libc::fork() } {
            -1 => return Err(exec_err(std::io::Error::last_os_error())),
            // SAFETY: in the child, as above: only async-signal-safe calls on memory (the
            // pipes' descriptors, prog, argv, envp) prepared before the fork.
            0 => unsafe {
                libc::close(go_w_fd);
                libc::close(err_r_fd);
                let mut b = 0u8;
                // Wait until the parent has seized us, so the exec is seen. A signal may
                // interrupt the read; end of file means itrace died before it could seize
                // us: then the program is not run at all.
                let n = loop {
                    let n = libc::read(go_r_fd, (&mut b as *mut u8).cast(), 1);
                    if n != -1 || *libc::__errno_location() != libc::EINTR {
                        break n;
                    }
                };
                if n != 1 {
                    libc::_exit(127);
                }
                libc::close(go_r_fd);
                procfs::prepare_child_for_exec(aslr);
                libc::execve(prog.as_ptr(), argv_ptrs.as_ptr(), envp.as_ptr());
                let e = *libc::__errno_location();
                libc::write(err_w_fd, (&e as *const i32).cast(), 4);
                libc::_exit(127);
            },
            pid => pid,
        };
        drop(go_r);
        drop(err_w);
        let seized = ptrace::seize(Pid::from_raw(pid), ptrace_options(self.opts));
        // Let the child go on either way; if seizing failed it must not be left blocked.
        let _ = nix::unistd::write(&go_w, &[1]);
        drop(go_w);
        if let Err(errno) = seized {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            wait_gone(pid);
            return Err(RecordError::Ptrace { what: "PTRACE_SEIZE of the launched program", errno });
        }
        let mut e = [0u8; 4];
        // End of file (the exec closed the pipe) or the errno the child could not exec with.
        let n = loop {
            match nix::unistd::read(err_r.as_raw_fd(), &mut e) {
                Err(Errno::EINTR) => continue,
                r => break r.unwrap_or(0),
            }
        };
        if n == 4 {
            wait_gone(pid);
            return Err(exec_err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(e))));
        }
        self.launched = Some(pid);
        let cpu = self.assign_cpu();
        let mut t = self.new_thread(pid, pid, cpu);
        t.state = ThreadState::Launching;
        self.threads.insert(pid, t);
        self.out.processes = 1;
        Ok(())
    }

    pub(super) fn attach(&mut self, pid: i32) -> Result<(), RecordError> {
        if pid <= 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(RecordError::NoSuchProcess(pid));
        }
        let pid = procfs::tgid(pid).unwrap_or(pid);
        self.cpus = allowed_cpus(pid);
        let opts = ptrace_options(self.opts);
        // Threads may be created while we seize: repeat until no new one appears.
        loop {
            let tasks = procfs::tasks(pid).map_err(|_| RecordError::NoSuchProcess(pid))?;
            let mut new = 0;
            for tid in tasks {
                if self.threads.contains_key(&tid) {
                    continue;
                }
                match ptrace::seize(Pid::from_raw(tid), opts) {
                    Ok(()) => {}
                    Err(Errno::ESRCH) if tid != pid => continue, // exited meanwhile
                    Err(Errno::ESRCH) => return Err(RecordError::NoSuchProcess(pid)),
                    Err(errno @ Errno::EPERM) => {
                        self.release_all();
                        // Say what it is when the kernel refuses a process no tracer could take.
                        return Err(match untraceable(pid) {
                            Some(Untraceable::Zombie) => RecordError::Zombie(pid),
                            Some(Untraceable::KernelThread(name)) => RecordError::KernelThread { pid, name },
                            None => RecordError::NotPermitted { pid, errno },
                        });
                    }
                    Err(errno) => {
                        self.release_all();
                        return Err(RecordError::Ptrace { what: "PTRACE_SEIZE", errno });
                    }
                }
                let _ = ptrace::interrupt(Pid::from_raw(tid));
                let cpu = self.assign_cpu();
                let mut t = self.new_thread(tid, pid, cpu);
                t.attached = true;
                self.threads.insert(tid, t);
                new += 1;
            }
            if new == 0 {
                break;
            }
        }
        let ts = now_ns();
        self.new_process(pid, ts, procfs::ppid(pid).unwrap_or(0));
        for tid in self.threads.keys().copied().collect::<Vec<_>>() {
            self.name_thread(pid, tid, ts);
        }
        self.out.processes = 1;
        Ok(())
    }

    /// Undo a partial attach.
    pub(super) fn release_all(&mut self) {
        for tid in self.threads.keys() {
            let _ = ptrace::detach(Pid::from_raw(*tid), None);
        }
        self.threads.clear();
    }
}

/// A process that no tracer can attach to, whoever it is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Untraceable {
    /// Exited, not yet reaped by its parent (state Z), with no thread left.
    Zombie,
    /// A kernel thread (PF_KTHREAD), with its name.
    KernelThread(String),
}

/// Whether `pid` is a zombie or a kernel thread, from /proc/PID/stat (`None`: neither, or gone).
pub(super) fn untraceable(pid: i32) -> Option<Untraceable> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let parsed = parse_stat(&stat)?;
    // A leader that exited while other threads run is Z too, yet traceable through them: the
    // seize of its other threads would have failed first.
    let alone = procfs::tasks(pid).map(|t| t.len() <= 1).unwrap_or(true);
    if parsed.flags & PF_KTHREAD != 0 {
        Some(Untraceable::KernelThread(parsed.name))
    } else if parsed.state == 'Z' && alone {
        Some(Untraceable::Zombie)
    } else {
        None
    }
}

/// The kernel's flag of a kernel thread in /proc/PID/stat's `flags` (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

struct Stat {
    name: String,
    state: char,
    flags: u64,
}

/// The name, state and flags of a /proc/PID/stat line: `pid (comm) state ppid pgrp session
/// tty_nr tpgid flags ...`; comm may hold spaces and parentheses, so fields count from the last `)`.
fn parse_stat(stat: &str) -> Option<Stat> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let mut fields = stat.get(close + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let flags = fields.nth(5)?.parse().ok()?;
    Some(Stat { name, state, flags })
}

/// Reap a child we killed or that failed to exec, through signals that interrupt the wait.
pub(super) fn wait_gone(pid: i32) {
    while let Err(Errno::EINTR) = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::__WALL)) {}
}

pub(super) fn ptrace_options(o: &RecordOptions) -> Options {
    let mut opts = Options::PTRACE_O_TRACEEXEC | Options::PTRACE_O_TRACEEXIT | Options::PTRACE_O_EXITKILL;
    if matches!(o.target, Target::Attach { .. }) {
        // Never kill an attached program if itrace dies.
        opts.remove(Options::PTRACE_O_EXITKILL);
    }
    if o.follow_threads {
        opts |= Options::PTRACE_O_TRACECLONE;
    }
    if o.step.syscall_stops() {
        // Syscall stops say so; threads and children inherit the options.
        opts |= Options::PTRACE_O_TRACESYSGOOD;
    }
    // With breakpoints in memory, children must be caught even when not followed: their copy
    // of our int3s has to be taken out before they run on their own.
    if o.follow_forks || o.triggers.is_some() {
        opts |= Options::PTRACE_O_TRACEFORK | Options::PTRACE_O_TRACEVFORK;
    }
    opts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let s = parse_stat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0\n").unwrap();
        assert_eq!((s.name.as_str(), s.state, s.flags & PF_KTHREAD != 0), ("kthreadd", 'S', true));
        let s = parse_stat("77 (a) b) (c) Z 1 77 77 0 -1 4227084 0 0\n").unwrap();
        assert_eq!((s.name.as_str(), s.state, s.flags & PF_KTHREAD != 0), ("a) b) (c", 'Z', false));
    }

    #[test]
    fn this_process_is_traceable() {
        // (Kernel threads and zombies: tests/tests/bad_input.rs, against real ones.)
        assert_eq!(untraceable(std::process::id() as i32), None);
    }
}
