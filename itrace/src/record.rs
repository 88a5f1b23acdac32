//! `itrace record`: the arguments become settings, [`itrace_arch::backend::choose`] picks the
//! backend, it records, and one summary says what happened.

use crate::cli::{ArchArg, BackendArg, ModeArg, RecordArgs};
use crate::status::StatusLine;
use crate::summary::{self, ProgramEnd, RecordSummary};
use anyhow::Result;
use itrace_arch::backend::{self, Backend, RecordSettings, Recorded, Target, TriggerResolver};
use itrace_arch::procfs::Mapping;
use itrace_format::{LiveCounts, Mode};
use itrace_post::symbols::{ModuleSymbols, SymbolCache};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

/// `itrace record`: record, print the summary, write the arc when asked, and exit with the
/// program's status.
pub fn command(args: RecordArgs) -> Result<ExitCode> {
    let settings = settings(&args)?;
    keep_previous(&settings.output)?;
    let (recorded, chosen) = run(&settings)?;
    let summary = summary_of(&recorded, &settings, &chosen, Some(settings.output.clone()));
    summary.print();
    if args.arc {
        let arc_path = settings.output.with_extension("arc");
        crate::read::write_arc(&settings.output, Some(&arc_path), &Default::default())?;
    }
    Ok(summary.program.exit_code())
}

/// Keep the trace already at `output` as `output.old` (replacing an older `.old`), as perf keeps
/// perf.data.old: recording again never loses the previous trace silently. Anything other than a
/// regular file (a FIFO, /dev/null) is left alone.
///
/// The `.old` replaced is freed on a thread of its own, while the recording starts: the rename
/// freed it, and freeing a 36 MB trace took ext4 about 30 ms, which an attach's first block
/// waited for (8 busy threads, the same output each time: first block 50-86 ms, median 73,
/// against 32-62, median 46, 10 attaches each, alternating). An `O_PATH` descriptor opened
/// before the rename keeps its blocks until that thread closes it (or the process ends).
fn keep_previous(output: &Path) -> Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::OpenOptionsExt;
    let is_file = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file());
    if is_file(output) {
        let mut old = output.as_os_str().to_owned();
        old.push(".old");
        let old = std::path::PathBuf::from(old);
        let replaced = is_file(&old)
            .then(|| {
                std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_NOFOLLOW).open(&old).ok()
            })
            .flatten();
        std::fs::rename(output, &old)
            .with_context(|| format!("cannot keep the previous trace {} as {}", output.display(), old.display()))?;
        if let Some(replaced) = replaced {
            // A failure to start the thread drops it here: freed now, as before.
            let _ = std::thread::Builder::new().name("itrace-free-old".into()).spawn(move || {
                crate::signals::block_in_this_thread(true);
                drop(replaced);
            });
        }
    }
    Ok(())
}

/// The plain settings the command line asks for.
pub fn settings(a: &RecordArgs) -> Result<RecordSettings> {
    let target = match (&a.pid, &a.gdb) {
        (Some(pid), _) => Target::Attach { pid: *pid },
        (None, Some(addr)) => Target::Remote {
            addr: addr.clone(),
            program: a.gdb_program.clone().or_else(|| a.command.first().map(PathBuf::from)),
        },
        (None, None) => Target::Launch { command: a.command.clone(), aslr: a.aslr },
    };
    let mut s = RecordSettings::new(target, a.output.clone());
    let backend = match a.backend {
        Some(b) => b,
        // The environment's default gives way to a --step or a test hook of the ptrace backend.
        None if a.step.is_some() || a.emulate_block_step => BackendArg::Auto,
        None => match std::env::var("ITRACE_BACKEND") {
            Ok(v) if !v.is_empty() => {
                s.backend_from_env = true;
                <BackendArg as clap::ValueEnum>::from_str(&v, true).map_err(|_| {
                    anyhow::anyhow!("ITRACE_BACKEND={v}: expected auto, ptrace, inproc, qemu, kmod or translate")
                })?
            }
            _ => BackendArg::Auto,
        },
    };
    s.backend = match backend {
        _ if a.gdb.is_some() || a.qemu.is_some() => Backend::Gdb,
        BackendArg::Auto => Backend::Auto,
        BackendArg::Ptrace => Backend::Ptrace,
        BackendArg::Inproc => Backend::Inproc,
        BackendArg::Qemu => Backend::Qemu,
        BackendArg::Kmod => Backend::Kmod,
        BackendArg::Translate => Backend::Translate,
    };
    s.mode = match a.mode {
        ModeArg::Normal => Mode::Normal,
        ModeArg::Wrap => Mode::Wrap,
        ModeArg::Continuous => Mode::Continuous,
    };
    s.buffer_size = a.buffer_size;
    s.segment_size = a.segment_size;
    s.compress = a.compress.then_some(itrace_format::COMPRESS_LEVEL);
    s.mte_size = a.mte_size;
    s.follow_forks = a.follow_forks;
    s.follow_threads = !a.no_follow_threads;
    s.duration = a.duration;
    s.region = a.region;
    s.start = a.start.clone();
    s.stop = a.stop.clone();
    s.arch = match &a.qemu {
        Some(name) => Some(qemu_arch(name)?),
        None => a.arch.map(ArchArg::arch),
    };
    s.env = a
        .qemu_env
        .iter()
        .map(|kv| {
            let text = kv.to_string_lossy();
            match text.split_once('=') {
                Some((k, v)) => (k.into(), v.into()),
                None => (text.as_ref().into(), "".into()),
            }
        })
        .collect();
    s.emulate_block_step = a.emulate_block_step;
    let step = match a.step {
        Some(step) => step,
        None => match std::env::var("ITRACE_STEP") {
            Ok(v) if !v.is_empty() => {
                s.step_from_env = true;
                <crate::cli::StepArg as clap::ValueEnum>::from_str(&v, true)
                    .map_err(|_| anyhow::anyhow!("ITRACE_STEP={v}: expected instruction, block or auto"))?
            }
            _ => crate::cli::StepArg::Auto,
        },
    };
    s.step = match step {
        crate::cli::StepArg::Instruction => itrace_arch::backend::StepChoice::Instruction,
        crate::cli::StepArg::Block => itrace_arch::backend::StepChoice::Block,
        crate::cli::StepArg::Auto => itrace_arch::backend::StepChoice::Auto,
    };
    Ok(s)
}

/// The architecture named by `--qemu ARCH`.
fn qemu_arch(name: &str) -> Result<itrace_format::Arch> {
    use itrace_format::Arch;
    const KNOWN: [Arch; 5] = [Arch::Ppc64le, Arch::Ppc64, Arch::S390x, Arch::I386, Arch::X86_64];
    KNOWN.into_iter().find(|a| a.name() == name).ok_or_else(|| {
        let known: Vec<&str> = KNOWN.iter().map(|a| a.name()).collect();
        anyhow::anyhow!("unknown architecture '{name}' for --qemu (known: {})", known.join(", "))
    })
}

/// Record as `s` say, with a status line on a terminal; the trace is complete in `s.output`
/// when this returns Ok.
pub fn run(s: &RecordSettings) -> Result<(Recorded, Chosen)> {
    let resolver = Arc::new(SymbolResolver::default());
    let mut chosen = backend::choose(s, resolver)?;
    crate::signals::install(s.duration)?;
    // A stop asked for while itrace was starting: nothing was attached yet, so nothing is.
    // A program to launch is launched all the same, and the recorder detaches at once, as it
    // does for a stop a moment later: whatever the moment of the stop, the program runs on.
    let launch = matches!(s.target, Target::Launch { .. });
    if !launch && crate::signals::STOP.load(std::sync::atomic::Ordering::Relaxed) {
        anyhow::bail!("interrupted before tracing started; nothing was traced");
    }
    let live = Arc::new(LiveCounts::default());
    let status = StatusLine::start(Arc::clone(&live), s.duration);
    let recorded = chosen.recorder.record(live, &crate::signals::STOP);
    status.finish();
    Ok((recorded?, Chosen { backend: chosen.backend, why: chosen.why }))
}

/// The backend that recorded, and why it was chosen.
pub struct Chosen {
    pub backend: Backend,
    pub why: String,
}

/// The summary of a recording; `output` is `None` for a file the user never sees.
pub fn summary_of(r: &Recorded, s: &RecordSettings, chosen: &Chosen, output: Option<PathBuf>) -> RecordSummary {
    let emulated = matches!(chosen.backend, Backend::Gdb | Backend::Qemu);
    // Say why auto chose what it did, unless it is the plain default (ptrace where nothing
    // else applies).
    let step = if s.backend == Backend::Auto && chosen.why != backend::WHY_DEFAULT {
        format!("{} (auto: {})", r.step, chosen.why)
    } else {
        r.step.clone()
    };
    RecordSummary {
        records: r.records,
        instructions: r.instructions,
        branches: r.branches,
        lost: r.lost,
        mode: s.mode,
        step,
        arch: (emulated || r.arch != itrace_format::Arch::X86_64).then_some(r.arch),
        bytes: r.bytes,
        output,
        why: r.why.unwrap_or_else(|| summary::why(r.stop_reason)).into(),
        program: ProgramEnd::from_status(r.exit_status),
    }
}

/// Functions found through post-processing's symbol tables (ELF symbols, debug files).
#[derive(Default)]
struct SymbolResolver {
    cache: Mutex<SymbolCache>,
}

impl TriggerResolver for SymbolResolver {
    fn addresses(&self, maps: &[Mapping], name: &str) -> Result<Vec<u64>, String> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let files = maps.iter().filter_map(|m| {
            let ms = cache.get(&m.path)?.clone();
            Some((ms, Some(m)))
        });
        let files: Vec<_> = files.collect();
        functions_named(&files, name)
    }

    fn defines(&self, paths: &[PathBuf], name: &str) -> Result<bool, String> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let files: Vec<_> =
            paths.iter().filter_map(|p| Some((cache.get(&p.to_string_lossy())?.clone(), None))).collect();
        Ok(!functions_named(&files, name)?.is_empty())
    }
}

/// The addresses of the functions `name` names (as `report` matches names:
/// [`itrace_post::funcname`]) among those of `files`: runtime addresses for a file with its
/// mapping, image addresses otherwise. An ambiguous name is an error line listing the candidates.
fn functions_named(files: &[(Arc<ModuleSymbols>, Option<&Mapping>)], name: &str) -> Result<Vec<u64>, String> {
    use itrace_post::funcname::{FunctionQuery, NameError};
    let query = FunctionQuery::new(name);
    let mut candidates: Vec<(u64, String)> = Vec::new();
    for (ms, mapping) in files {
        // A symbol's name as written in the ELF (a versioned C name, a mangled name) names it too.
        let raw = ms.find_function(name).filter(|_| query.matches(name).is_none());
        let named = ms.functions().filter(|(_, n)| query.matches(n).is_some()).map(|(v, n)| (v, n.to_string()));
        for (vaddr, n) in raw.map(|v| (v, name.to_string())).into_iter().chain(named) {
            let addr = match mapping {
                Some(m) => match ms.runtime_addr(m.start, m.offset, m.end - m.start, vaddr) {
                    Some(a) => a,
                    None => continue,
                },
                None => vaddr,
            };
            candidates.push((addr, n));
        }
    }
    match query.select(candidates) {
        Ok(mut v) => {
            v.sort_unstable();
            v.dedup();
            Ok(v)
        }
        Err(NameError::NotFound(_)) => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    }
}
