//! The test programs of tests/programs: built once per test binary with
//! make into `target/test-programs/` (the cross-architecture ones into
//! `target/test-programs/cross/`), their paths, and their hand counts.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::run::{profile_dir, require_tool, run, target_dir};

/// Hand counts (see the comments in the .S files).
pub const COUNT_LOOP_INSTRUCTIONS: u64 = 3011;
/// Taken branches of count_loop including the exit syscall (= U blocks).
pub const COUNT_LOOP_BLOCKS: usize = 1003;
pub const LONG_LOOP_INSTRUCTIONS: u64 = 406_009;
pub const LONG_LOOP_BLOCKS: usize = 201_501;

/// fib.c: fib_asm(15) self count and calls (closed form, see fib.c).
pub const FIB_ASM_SELF: u64 = 4 * 987 + 14 * 986;
pub const FIB_CALLS: u64 = 2 * 987 - 1;

static PROGRAMS: OnceLock<PathBuf> = OnceLock::new();

/// Builds the test programs (once per test binary, serialised between test
/// binaries with a lock file) into `target/test-programs/` and returns that
/// directory, canonicalised.
pub fn programs_dir() -> &'static Path {
    PROGRAMS.get_or_init(|| {
        require_tool("make");
        require_tool("gcc");
        let out = target_dir().join("test-programs");
        fs::create_dir_all(&out).expect("create test-programs dir");
        let out = out.canonicalize().expect("canonicalize");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs");
        let lock = fs::File::create(out.join(".build.lock")).expect("lock file");
        let _guard = FileLock::new(&lock);
        // The region programs link target/<profile>/libitrace.so (cargo build --workspace makes it).
        let libdir = profile_dir();
        assert!(
            libdir.join("libitrace.so").is_file(),
            "{} is missing: run `cargo build --workspace` first (scripts/test.sh does)",
            libdir.join("libitrace.so").display()
        );
        let o = run(Command::new("make")
            .arg("-C")
            .arg(&src)
            .arg(format!("OUT={}", out.display()))
            .arg(format!("LIBDIR={}", libdir.display())));
        assert!(o.success(), "building the test programs failed:\n{}\n{}", o.stdout, o.stderr);
        out
    })
}

/// The canonical absolute path of a test program.
pub fn program(name: &str) -> PathBuf {
    let p = programs_dir().join(name);
    assert!(p.is_file(), "test program {} missing", p.display());
    p
}

struct FileLock<'a>(&'a fs::File);

impl<'a> FileLock<'a> {
    fn new(f: &'a fs::File) -> Self {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a valid open descriptor.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock failed");
        FileLock(f)
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The cross architectures: (itrace/qemu architecture name, cross tool prefix, Debian package
/// of the cross compiler).
pub const ARCHES: &[(&str, &str, &str)] = &[
    ("ppc64le", "powerpc64le-linux-gnu-", "gcc-powerpc64le-linux-gnu"),
    ("ppc64", "powerpc64-linux-gnu-", "gcc-powerpc64-linux-gnu"),
    ("s390x", "s390x-linux-gnu-", "gcc-s390x-linux-gnu"),
    ("i386", "i686-linux-gnu-", "gcc-i686-linux-gnu"),
];

/// Hand counts from the comments in tests/programs/cross/*.S: (instructions, user blocks).
pub fn cross_hand_count(arch: &str) -> (u64, usize) {
    match arch {
        "ppc64le" | "ppc64" => (47, 17),
        "s390x" => (38, 17),
        "i386" => (44, 17),
        _ => unreachable!(),
    }
}

/// The cross sysroot of `arch` (`/usr/powerpc64le-linux-gnu`), for qemu's `-L`.
pub fn cross_sysroot(arch: &str) -> String {
    let (_, prefix, _) = ARCHES.iter().find(|a| a.0 == arch).expect("known arch");
    format!("/usr/{}", prefix.trim_end_matches('-'))
}

/// qemu's options to run a dynamically linked `arch` program with its cross sysroot: `-L`, and
/// where the architecture's libc is also installed multi-arch (`libc6:ppc64el`, which the Rust
/// cross toolchain brings) `-E LD_LIBRARY_PATH=/lib:/usr/lib`, so the sysroot's loader does not
/// take that libc (of another build) from the host's `/lib/TRIPLET`: itrace's own rule
/// (`cross_loader_env`, arch/src/backend/gdb/mod.rs). For dynamically linked programs only:
/// a static one's start-up reads the variable too.
pub fn cross_qemu_options(arch: &str) -> Vec<String> {
    let (_, prefix, _) = ARCHES.iter().find(|a| a.0 == arch).expect("known arch");
    let triplet = prefix.trim_end_matches('-');
    let multiarch = if triplet == "i686-linux-gnu" { "i386-linux-gnu" } else { triplet };
    let mut options = vec!["-L".to_string(), cross_sysroot(arch)];
    if std::path::Path::new(&format!("/lib/{multiarch}/libc.so.6")).exists() {
        options.extend(["-E".to_string(), "LD_LIBRARY_PATH=/lib:/usr/lib".to_string()]);
    }
    options
}

/// A cross tool (`powerpc64le-linux-gnu-objdump`), or a failure naming its package.
pub fn cross_tool(arch: &str, tool: &str) -> String {
    let (_, prefix, package) = ARCHES.iter().find(|a| a.0 == arch).expect("known arch");
    let name = format!("{prefix}{tool}");
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join(&name).is_file());
    assert!(
        found,
        "required tool `{name}` is not installed: install the Debian package `{package}` \
         (its binutils come with it; or run scripts/install-test-deps.sh)"
    );
    name
}

static CROSS: OnceLock<PathBuf> = OnceLock::new();

/// Builds tests/programs/cross into target/test-programs/cross (once per test binary) and
/// returns the canonical path of the cross program `name`.
pub fn cross_program(name: &str) -> PathBuf {
    let dir = CROSS.get_or_init(|| {
        require_tool("make");
        for (arch, _, _) in ARCHES {
            cross_tool(arch, "gcc");
        }
        let out = target_dir().join("test-programs").join("cross");
        fs::create_dir_all(&out).expect("create cross dir");
        let out = out.canonicalize().expect("canonicalize");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs").join("cross");
        let o = run(Command::new("make").arg("-C").arg(&src).arg(format!("OUT={}", out.display())));
        assert!(o.success(), "building the cross test programs failed:\n{}\n{}", o.stdout, o.stderr);
        out
    });
    let p = dir.join(name);
    assert!(p.is_file(), "cross test program {} missing", p.display());
    p
}
