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
pub mod protocol;
pub mod registers;

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
    let triplet = match arch {
        Arch::X86_64 => return None,
        Arch::I386 => "i686-linux-gnu",
        Arch::Ppc64le => "powerpc64le-linux-gnu",
        Arch::Ppc64 => "powerpc64-linux-gnu",
        Arch::S390x => "s390x-linux-gnu",
    };
    let p = Path::new("/usr").join(triplet);
    p.is_dir().then_some(p)
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
/// only of `env` (`VAR=VALUE`; qemu-user passes its own environment to the program, and glibc's
/// start-up work depends on it), and connect to its stub.
pub fn launch_qemu(
    arch: Arch,
    program: &Path,
    args: &[OsString],
    env: &[OsString],
) -> Result<(Qemu, Connection), GdbError> {
    let qemu = qemu_binary(arch);
    let spawn_err = |source| GdbError::Spawn { qemu: qemu.to_string(), source };
    let port = free_port().map_err(spawn_err)?;
    let mut cmd = Command::new(qemu);
    cmd.env_clear();
    for kv in env {
        let s = kv.to_string_lossy();
        match s.split_once('=') {
            Some((k, v)) => cmd.env(k, v),
            None => cmd.env(&*s, ""),
        };
    }
    // qemu-user reads QEMU_* settings from its environment: none leak in from ours.
    if let Some(root) = cross_sysroot(arch) {
        cmd.arg("-L").arg(root);
    }
    cmd.arg("-g").arg(port.to_string());
    cmd.arg(program).args(args.iter().skip(1)).stdin(Stdio::inherit());
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
