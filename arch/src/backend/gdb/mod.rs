//! Recording through the GDB remote serial protocol: any stub (qemu-user's
//! `-g PORT`, gdbserver) on any architecture itrace knows, stepped one
//! instruction at a time. This is how itrace traces PowerPC64 and s390x
//! programs on x86_64 machines (under qemu-user), and 32-bit x86 through
//! qemu-i386.
//!
//! [`protocol`] speaks the wire format, [`registers`] reads the stub's
//! target description, [`engine`] turns steps into records; [`launch_qemu`]
//! starts a program under qemu-user with its stub on a free local port.

pub mod engine;
mod files;
pub mod protocol;
pub mod registers;
mod runahead;

pub use engine::{record, RemoteOptions, RemoteOutcome};
pub use protocol::{Connection, GdbError};

use itrace_format::Arch;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long to wait for a reply to an ordinary request (a step, a register read).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long qemu may take to open its stub.
const QEMU_START_TIMEOUT: Duration = Duration::from_secs(20);

/// The qemu-user emulator for an architecture.
pub fn qemu_binary(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "qemu-x86_64",
        Arch::I386 => "qemu-i386",
        Arch::Ppc64le => "qemu-ppc64le",
        Arch::Ppc64 => "qemu-ppc64",
        Arch::S390x => "qemu-s390x",
    }
}

/// Debian's cross sysroot for an architecture (libc6-ARCH-cross), where qemu finds the dynamic
/// loader and libraries of a dynamically linked program (`-L`).
pub fn cross_sysroot(arch: Arch) -> Option<PathBuf> {
    let (triplet, _) = triplets(arch)?;
    let p = Path::new("/usr").join(triplet);
    p.is_dir().then_some(p)
}

/// The cross triplet and the multi-arch directory name of an architecture.
fn triplets(arch: Arch) -> Option<(&'static str, &'static str)> {
    Some(match arch {
        Arch::X86_64 => return None,
        Arch::I386 => ("i686-linux-gnu", "i386-linux-gnu"),
        Arch::Ppc64le => ("powerpc64le-linux-gnu", "powerpc64le-linux-gnu"),
        Arch::Ppc64 => ("powerpc64-linux-gnu", "powerpc64-linux-gnu"),
        Arch::S390x => ("s390x-linux-gnu", "s390x-linux-gnu"),
    })
}

/// qemu's `-E` for a program run with [`cross_sysroot`] where the architecture's own libc is
/// also installed multi-arch (`libc6:ppc64el`, which Debian's Rust cross toolchain brings).
/// The sysroot's loader searches `/lib/TRIPLET` first, which is not in the sysroot, so qemu
/// finds the host's multi-arch libc there, of another build than the loader (seen: "stack
/// smashing detected" at start-up). `LD_LIBRARY_PATH=/lib:/usr/lib` (the sysroot's, under
/// `-L`) keeps the loader with its own libc; the user's own path follows. Statically linked
/// programs get nothing: their start-up reads the variable too, and they load no libraries.
pub fn cross_loader_env(arch: Arch, program: &Path, user_path: Option<&str>) -> Option<String> {
    let (_, multiarch) = triplets(arch)?;
    cross_sysroot(arch)?;
    if !Path::new("/lib").join(multiarch).join("libc.so.6").exists() {
        return None;
    }
    crate::elf::Program::read(program).ok()?.interpreter?;
    Some(match user_path {
        Some(p) if !p.is_empty() => format!("LD_LIBRARY_PATH=/lib:/usr/lib:{p}"),
        _ => "LD_LIBRARY_PATH=/lib:/usr/lib".to_string(),
    })
}

/// A program started under qemu-user, stopped at its first instruction, with a connection to
/// its stub. Dropping it kills qemu if it is still running.
pub struct Qemu {
    pub child: Child,
    pub port: u16,
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A TCP port on the loopback interface that nothing listens on now.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Start `program` (`args[0]` is its argv[0]) under qemu-user for `arch`, in an environment made
/// only of `env` (`VAR=VALUE`, in this order; qemu-user passes its own environment to the
/// program, and glibc's start-up work depends on it), and connect to its stub.
pub fn launch_qemu(
    arch: Arch,
    program: &Path,
    args: &[OsString],
    env: &[OsString],
) -> Result<(Qemu, Connection), GdbError> {
    let qemu = qemu_binary(arch);
    let spawn_err = |source| GdbError::Spawn { qemu: qemu.to_string(), source };
    let port = free_port().map_err(spawn_err)?;
    // Found in our PATH: the exec searches the program's (which `env` may set).
    let qemu_path = crate::backend::find_program(&qemu.into()).unwrap_or_else(|_| qemu.into());
    let mut cmd = Command::new(qemu_path);
    // qemu-user reads QEMU_* settings from its environment: none leak in from ours. It gives
    // the program its environment reversed (each variable goes to the front of its list), so
    // it gets `env` reversed; a variable given twice counts once, with its last value.
    let name = |kv: &OsString| -> Vec<u8> {
        let b = kv.as_encoded_bytes();
        b[..b.iter().position(|&c| c == b'=').unwrap_or(b.len())].to_vec()
    };
    let mut vars: Vec<OsString> = Vec::new();
    for kv in env {
        vars.retain(|v| name(v) != name(kv));
        let mut kv = kv.clone();
        if !kv.as_encoded_bytes().contains(&b'=') {
            kv.push("=");
        }
        vars.push(kv);
    }
    vars.reverse();
    let qemu_env = crate::inherit::Environment::from_vars(vars).map_err(|e| spawn_err(std::io::Error::other(e)))?;
    if let Some(root) = cross_sysroot(arch) {
        cmd.arg("-L").arg(root);
        let user_path = env.iter().find_map(|kv| kv.to_str()?.strip_prefix("LD_LIBRARY_PATH="));
        if let Some(e) = cross_loader_env(arch, program, user_path) {
            cmd.arg("-E").arg(e);
        }
    }
    cmd.arg("-g").arg(port.to_string());
    cmd.arg(program).args(args.iter().skip(1)).stdin(Stdio::inherit());
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls (sigaction, sigprocmask, prctl, a store to the
    // child's `environ`) between fork and exec; qemu_env lives in the closure until the exec.
    unsafe {
        cmd.pre_exec(move || {
            crate::inherit::restore_signals();
            crate::procfs::die_with_parent();
            qemu_env.install_in_child();
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(spawn_err)?;
    let mut q = Qemu { child, port };
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = q.child.try_wait() {
            return Err(GdbError::QemuExited { qemu: qemu.to_string(), status });
        }
        match Connection::connect(&format!("127.0.0.1:{port}"), REPLY_TIMEOUT) {
            Ok(c) => return Ok((q, c)),
            Err(e) if start.elapsed() > QEMU_START_TIMEOUT => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// `itrace record --qemu ARCH -- PROG` (the program launched under qemu-user's stub) and
/// `itrace record --gdb HOST:PORT` (any stub).
pub struct GdbRecorder {
    settings: crate::backend::RecordSettings,
    arch: Arch,
    /// The program's path and ELF file, when known.
    program: Option<(PathBuf, crate::elf::Program)>,
}

impl GdbRecorder {
    pub fn new(s: &crate::backend::RecordSettings) -> Result<Self, crate::backend::BackendError> {
        use crate::backend::{settings::find_program, BackendError, Target};
        let program_path = match &s.target {
            Target::Remote { program: Some(p), .. } if p.is_file() => Some(p.clone()),
            Target::Remote { program: Some(p), .. } => Some(find_program(&p.clone().into_os_string())?),
            Target::Remote { program: None, .. } => None,
            Target::Launch { command, .. } => match command.first() {
                Some(cmd) => Some(find_program(cmd)?),
                None => return Err(BackendError::Settings("nothing to trace: give a command to run".into())),
            },
            Target::Attach { .. } => {
                return Err(BackendError::Settings(
                    "--qemu and --gdb trace what a GDB stub runs: they cannot attach to a process (-p)".into(),
                ))
            }
        };
        let program = match program_path {
            Some(p) => Some((p.clone(), crate::elf::Program::read(&p)?)),
            None => None,
        };
        let elf_arch = program.as_ref().and_then(|(_, p)| p.arch);
        let arch = match (s.arch, elf_arch) {
            (Some(q), Some(e)) if q != e => {
                let path = program.as_ref().map(|(p, _)| p.display().to_string()).unwrap_or_default();
                return Err(BackendError::Settings(format!("{path} is a {e} program, not {q}")));
            }
            (Some(q), _) => q,
            (None, Some(e)) => e,
            (None, None) => return Err(BackendError::Settings(
                "--gdb: cannot tell the target's architecture: give its program with --gdb-program PATH (or -- PATH)"
                    .into(),
            )),
        };
        Ok(GdbRecorder { settings: s.clone(), arch, program })
    }
}

impl crate::backend::Recorder for GdbRecorder {
    fn record(
        &mut self,
        live: std::sync::Arc<itrace_format::LiveCounts>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<crate::backend::Recorded, crate::backend::BackendError> {
        use crate::backend::{output, BackendError, Target};
        use itrace_format::StepMethod;
        let s = &self.settings;
        // Start the program (or reach the stub) before creating the trace file.
        let (qemu, mut conn): (Option<Qemu>, Connection) = match &s.target {
            Target::Launch { command, .. } => {
                let (path, _) = self.program.as_ref().expect("a launched program is known");
                let env: Vec<OsString> = s
                    .env
                    .iter()
                    .map(|(k, v)| {
                        let mut kv = k.clone();
                        kv.push("=");
                        kv.push(v);
                        kv
                    })
                    .collect();
                let (q, c) = launch_qemu(self.arch, path, command, &env)?;
                (Some(q), c)
            }
            Target::Remote { addr, .. } => (None, Connection::connect(addr, REPLY_TIMEOUT)?),
            Target::Attach { .. } => unreachable!("refused by new()"),
        };
        let mut buffers = output::open(s, self.arch, StepMethod::GdbStep, 1, false, live)?;
        let arch_impl = crate::for_arch(self.arch);
        let process_name = self
            .program
            .as_ref()
            .and_then(|(p, _)| p.file_name())
            .map(|n| n.to_string_lossy().chars().take(15).collect())
            .unwrap_or_default();
        let opts = RemoteOptions {
            arch: arch_impl.as_ref(),
            program: self.program.as_ref().map(|(_, p)| p.clone()),
            sysroot: cross_sysroot(self.arch),
            process_name,
            pid_hint: qemu.as_ref().map(|q| q.child.id()).unwrap_or(0),
            launched: qemu.is_some(),
            stub_steps_over_breakpoints: qemu.is_some(),
            stop,
        };
        let result = match record(&mut conn, &opts, &mut buffers) {
            Ok(r) => r,
            Err(e) => {
                drop(buffers);
                let _ = std::fs::remove_file(&s.output);
                return Err(e.into());
            }
        };
        drop(conn);
        let stub_error = result.error;
        let finished = output::finish(s, buffers, result.outcome, self.arch, StepMethod::GdbStep.to_string());
        if let Some(mut q) = qemu {
            // qemu exits with the program (or runs it on after a detach).
            if stub_error.is_some() {
                drop(q);
            } else {
                let _ = q.child.wait();
            }
        }
        if let Some(e) = stub_error {
            let bytes = std::fs::metadata(&s.output).map(|m| m.len()).unwrap_or(0);
            return Err(BackendError::Failed(format!(
                "{e}; tracing stopped, the trace up to there is in {} ({})",
                s.output.display(),
                itrace_format::human_size(bytes)
            )));
        }
        finished
    }
}
