//! What to record and how: plain settings, built once by a command (from its arguments, or
//! by `itrace calib` directly) and read by [`super::choose`] and the backends.

use crate::procfs::Mapping;
use itrace_format::{Arch, Mode};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The backend asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The kernel shim when it is loaded and can record the settings, else the in-process
    /// recorder for a launched program's regions, else ptrace.
    Auto,
    Ptrace,
    Inproc,
    Kmod,
    /// qemu-user with itrace's TCG plugin.
    Qemu,
    /// x86_64: the program runs from a code cache of translated blocks that record their taken
    /// branches themselves; itrace, its tracer, translates and steps what the cache does not run.
    Translate,
    /// A GDB remote stub: `Target::Remote`, or a program launched under qemu-user for
    /// [`RecordSettings::arch`] (`--qemu ARCH`).
    Gdb,
}

/// What to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Run `command` (its first word is the program, found as execvp finds it) and trace it
    /// from its first instruction.
    Launch { command: Vec<OsString>, aslr: bool },
    /// Attach to every thread of a running process.
    Attach { pid: i32 },
    /// Step what a GDB stub at `addr` (HOST:PORT) holds; `program` is its ELF file.
    Remote { addr: String, program: Option<PathBuf> },
}

/// Everything a recording needs to know.
#[derive(Clone, Debug)]
pub struct RecordSettings {
    pub target: Target,
    pub backend: Backend,
    /// The trace file to write.
    pub output: PathBuf,
    pub mode: Mode,
    /// Bytes per CPU buffer (normal and wrap modes).
    pub buffer_size: usize,
    /// Bytes per segment written at a time (continuous mode; the MTE stream in wrap mode).
    pub segment_size: usize,
    /// Bytes of module-table buffer (normal mode).
    pub mte_size: usize,
    /// zstd level the trace's chunks are compressed with (`--compress`), if any.
    pub compress: Option<i32>,
    /// Trace child processes and what they execute.
    pub follow_forks: bool,
    /// Trace threads created after tracing starts.
    pub follow_threads: bool,
    /// Stop after this many seconds (the command arms the timer; backends see `stop`).
    pub duration: Option<f64>,
    /// Trace only libitrace's ITraceOn/ITraceOff regions.
    pub region: bool,
    /// Functions whose entry starts (stops) tracing a thread.
    pub start: Vec<String>,
    pub stop: Vec<String>,
    /// The program's architecture where the backend cannot read it from the program (`--qemu
    /// ARCH`, `--backend qemu --arch ARCH`).
    pub arch: Option<Arch>,
    /// Environment added to a launched program's (ptrace, in-process, kernel shim, qemu
    /// plugin); for a program under qemu-user's stub (`--qemu`), its whole environment.
    pub env: Vec<(OsString, OsString)>,
    /// Testing: feed the block-step decoder from single steps (see the ptrace backend).
    pub emulate_block_step: bool,
    /// How the ptrace backend stops the program (`--step`).
    pub step: StepChoice,
    /// `step` is a default from the environment, not asked for: other backends ignore it.
    pub step_from_env: bool,
    /// `backend` is the environment's default (ITRACE_BACKEND), not the command line's: a
    /// program it cannot record (`translate` and an i386 program) gets `auto`'s instead.
    pub backend_from_env: bool,
}

/// `--step`: how the ptrace backend stops a traced thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepChoice {
    /// Every instruction (PTRACE_SINGLESTEP).
    Instruction,
    /// Block by block with debug-register breakpoints (x86_64), single-stepping what the
    /// decoder cannot be sure of; an error where the probe finds the breakpoints do not work.
    Block,
    /// The fastest way the probes find working: debug-register breakpoints, else
    /// PTRACE_SINGLEBLOCK where the branch trap works, else single steps.
    #[default]
    Auto,
}

impl RecordSettings {
    /// Settings with the defaults of `itrace record` for `target`.
    pub fn new(target: Target, output: PathBuf) -> Self {
        RecordSettings {
            target,
            backend: Backend::Auto,
            output,
            mode: Mode::Continuous,
            buffer_size: 64 << 20,
            segment_size: 1 << 20,
            mte_size: 8 << 20,
            compress: None,
            follow_forks: false,
            follow_threads: true,
            duration: None,
            region: false,
            start: Vec::new(),
            stop: Vec::new(),
            arch: None,
            env: Vec::new(),
            emulate_block_step: false,
            step: StepChoice::Auto,
            step_from_env: false,
            backend_from_env: false,
        }
    }

    /// Refuse buffer sizes no backend can use.
    pub fn validate(&self) -> Result<(), super::BackendError> {
        const MIN: usize = 4096;
        if self.buffer_size < MIN || self.segment_size < MIN || self.mte_size < MIN {
            return Err(super::BackendError::Settings("buffer, segment and MTE sizes must be at least 4K".into()));
        }
        if self.mode == Mode::Continuous && self.segment_size > 1 << 30 {
            return Err(super::BackendError::Settings("--segment-size must be at most 1G".into()));
        }
        Ok(())
    }

    /// Whether tracing starts at functions rather than at the program's start.
    pub fn has_triggers(&self) -> bool {
        !self.start.is_empty() || !self.stop.is_empty()
    }

    /// The ring size for the in-process and kernel recorders: the buffer size in normal and
    /// wrap modes, a segment or more (at most 16M) in continuous mode.
    pub fn ring_size(&self) -> usize {
        match self.mode {
            Mode::Continuous => self.segment_size.max(self.buffer_size.min(16 << 20)),
            _ => self.buffer_size,
        }
    }
}

/// Finds functions by name in the files a process maps. Symbol tables are post-processing's
/// business: the command passes its lookup in.
pub trait TriggerResolver {
    /// The runtime addresses of the functions `name` names in the files mapped as `maps`,
    /// chosen among all of them (every overload of a qualified C++ name; none when no file
    /// defines such a function); an error line when the name is ambiguous.
    fn addresses(&self, maps: &[Mapping], name: &str) -> Result<Vec<u64>, String>;
    /// Whether the files at `paths` define a function `name` names; an error line when the
    /// name is ambiguous among them.
    fn defines(&self, paths: &[std::path::PathBuf], name: &str) -> Result<bool, String>;
}

/// Find `cmd` as execvp would: a path with a slash as it is, else along $PATH; it must be an
/// executable file.
pub fn find_program(cmd: &OsString) -> Result<PathBuf, super::BackendError> {
    use super::BackendError;
    use std::os::unix::fs::PermissionsExt;
    let p = Path::new(cmd);
    let check = |p: &Path| -> Result<(), BackendError> {
        let md = std::fs::metadata(p).map_err(|e| BackendError::io(format!("cannot run {}", p.display()), e))?;
        if md.is_dir() {
            return Err(BackendError::Settings(format!("cannot run {}: it is a directory", p.display())));
        }
        if md.permissions().mode() & 0o111 == 0 {
            return Err(BackendError::Settings(format!("cannot run {}: it is not executable", p.display())));
        }
        Ok(())
    };
    if cmd.as_encoded_bytes().contains(&b'/') {
        check(p)?;
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let cand = dir.join(p);
        if cand.is_file() && check(&cand).is_ok() {
            return Ok(cand);
        }
    }
    Err(BackendError::Settings(format!("cannot run {}: command not found in PATH", p.display())))
}
