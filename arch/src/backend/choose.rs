//! Which backend records a set of settings, and why: written once, for every command.

use super::settings::find_program;
use super::{
    gdb, inproc, kmod, ptrace, qemu, Backend, BackendError, Native, RecordSettings, Recorder, StepChoice, Target,
    TriggerResolver,
};
use itrace_format::Arch;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// [`Chosen::why`] when `auto` picked the backend it picks when nothing else applies: the
/// summary does not repeat it.
pub const WHY_DEFAULT: &str = "the default";

/// The backend picked for some settings.
pub struct Chosen {
    pub recorder: Box<dyn Recorder>,
    /// The backend that records (never `Auto`).
    pub backend: Backend,
    /// Why this one, in a few words (for `auto`: what was available).
    pub why: String,
}

/// Pick the backend for `s`: the one asked for, refusing settings it cannot record, or for
/// `auto` the kernel shim when it is loaded and can record them, else the in-process recorder
/// for a launched program's regions, else ptrace. `resolver` finds `--start`/`--stop` and
/// libitrace's functions in program files.
pub fn choose(s: &RecordSettings, resolver: Arc<dyn TriggerResolver + Send + Sync>) -> Result<Chosen, BackendError> {
    let refuse = |m: &str| Err(BackendError::Settings(m.to_string()));
    s.validate()?;
    // `--step` picks how ptrace stops a thread; no other backend steps that way, and saying
    // nothing about it would be a silent ignore.
    // (a default from the environment, ITRACE_STEP, applies only where ptrace steps)
    let step_asked = s.step != StepChoice::Auto && !s.step_from_env;
    if step_asked && !matches!(s.backend, Backend::Auto | Backend::Ptrace) {
        let other = match s.backend {
            Backend::Inproc => "--backend inproc",
            Backend::Kmod => "--backend kmod",
            Backend::Qemu => "--backend qemu",
            Backend::Translate => "--backend translate",
            _ => "a GDB stub (--gdb, --qemu)",
        };
        return refuse(&format!("--step chooses how the ptrace backend stops the program; {other} does not use it"));
    }
    if s.backend == Backend::Qemu {
        return Ok(Chosen {
            recorder: Box::new(qemu::QemuRecorder::new(s)?),
            backend: Backend::Qemu,
            why: "asked for".into(),
        });
    }
    if s.backend == Backend::Gdb || matches!(s.target, Target::Remote { .. }) {
        return Ok(Chosen {
            recorder: Box::new(gdb::GdbRecorder::new(s)?),
            backend: Backend::Gdb,
            why: "asked for".into(),
        });
    }
    let program = match &s.target {
        Target::Launch { command, .. } => match command.first() {
            Some(cmd) => Some(find_program(cmd)?),
            None => return refuse("nothing to trace: give a command to run, or `-p PID`"),
        },
        Target::Attach { pid } => {
            if *pid <= 0 || !Path::new(&format!("/proc/{pid}")).exists() {
                return Err(BackendError::Settings(format!("no process with pid {pid}")));
            }
            None
        }
        Target::Remote { .. } => unreachable!("handled above"),
    };
    let arch = native_arch(program.as_deref(), &s.target)?;
    // The environment's default is a preference: where it cannot record, auto chooses.
    let env_gives_way;
    let s = if s.backend == Backend::Translate && s.backend_from_env && (!TRANSLATE_HERE || arch != Arch::X86_64) {
        env_gives_way = RecordSettings { backend: Backend::Auto, ..s.clone() };
        &env_gives_way
    } else {
        s
    };
    if s.backend == Backend::Translate && (!TRANSLATE_HERE || arch != Arch::X86_64) {
        return refuse(&format!(
            "--backend translate runs x86_64 programs on x86_64 (this is {arch}); use --backend ptrace"
        ));
    }
    let launch = program.is_some();
    let regions_of_launch = launch && s.region && !s.has_triggers();
    let inproc = match s.backend {
        Backend::Inproc if !INPROC_HERE => {
            return refuse("--backend inproc runs on x86_64 only (PowerPC cannot single-step itself from user space); use --backend ptrace")
        }
        Backend::Inproc if regions_of_launch => true,
        Backend::Inproc => {
            return refuse("--backend inproc records --region of a launched program (not -p, --start or --stop)")
        }
        // An explicit --step asks for ptrace.
        Backend::Auto => regions_of_launch && !step_asked && INPROC_HERE,
        _ => false,
    };
    let use_kmod = !(s.backend == Backend::Auto && step_asked) && kmod::chosen(s.backend, s.has_triggers(), arch)?;
    if let Some(program) = &program {
        if (inproc || (use_kmod && s.region)) && !inproc::uses_libitrace(program) {
            return Err(not_using_libitrace(program));
        }
        check_functions_exist(program, s.start.iter().chain(&s.stop), resolver.as_ref())?;
    }
    if !s.stop.is_empty() && s.start.is_empty() && !s.region {
        return refuse("--stop needs --start (or --region): nothing would start tracing");
    }
    // auto: the translating recorder for an x86_64 program, unless something else was picked
    // or a way of stepping was asked for (even by the environment: ITRACE_STEP).
    let attach = matches!(s.target, Target::Attach { .. });
    let translate = s.backend == Backend::Translate
        || (s.backend == Backend::Auto
            && (AUTO_TRANSLATES || (attach && AUTO_TRANSLATES_ATTACH))
            && TRANSLATE_HERE
            && arch == Arch::X86_64
            && s.step == StepChoice::Auto
            && !s.emulate_block_step
            && !use_kmod
            && !inproc);
    let mut settings = s.clone();
    if translate {
        // The recorder reads its way of recording from the settings: auto's choice too.
        settings.backend = Backend::Translate;
    }
    let native = Native { settings, program, arch };
    let (recorder, backend, why): (Box<dyn Recorder>, _, _) = if use_kmod {
        let why = if s.backend == Backend::Kmod { "asked for" } else { "the kernel module is loaded" };
        (Box::new(kmod::KmodRecorder(native)), Backend::Kmod, why.to_string())
    } else if inproc {
        let why = if s.backend == Backend::Inproc { "asked for" } else { "regions of a launched program" };
        (Box::new(inproc::InprocRecorder(native)), Backend::Inproc, why.to_string())
    } else if translate {
        let why = match (s.backend == Backend::Translate, attach) {
            (true, _) => "asked for",
            (false, true) => "a running x86_64 program",
            (false, false) => "an x86_64 program",
        };
        (Box::new(ptrace::PtraceRecorder::new(native, resolver)), Backend::Translate, why.to_string())
    } else {
        let why = if s.backend == Backend::Ptrace {
            "asked for".to_string()
        } else if AUTO_TRANSLATES && TRANSLATE_HERE && arch != Arch::X86_64 && !step_asked && !use_kmod && !inproc {
            // where auto would have translated, the reason it could not
            format!("an {arch} program")
        } else {
            WHY_DEFAULT.to_string()
        };
        (Box::new(ptrace::PtraceRecorder::new(native, resolver)), Backend::Ptrace, why)
    };
    Ok(Chosen { recorder, backend, why })
}

/// The error for regions asked of a program without libitrace.
pub(super) fn not_using_libitrace(program: &Path) -> BackendError {
    BackendError::Settings(format!(
        "--region: {} does not use libitrace (no ITraceOn in it or its libraries): link it with -litrace or load \
         libitrace.so with LD_PRELOAD (see README)",
        program.display()
    ))
}

/// The architectures the ptrace recorder of this build traces natively (the first: a program
/// that is not ELF, e.g. a script).
const NATIVE_ARCHES: &[Arch] = if cfg!(target_arch = "x86_64") {
    &[Arch::X86_64, Arch::I386]
} else if cfg!(all(target_arch = "powerpc64", target_endian = "little")) {
    &[Arch::Ppc64le]
} else if cfg!(target_arch = "s390x") {
    &[Arch::S390x]
} else {
    &[]
};

/// Whether the translating recorder (`--backend translate`) runs here.
const TRANSLATE_HERE: bool = cfg!(target_arch = "x86_64");

/// Whether `auto` picks the translating recorder for x86_64 programs it launches.
const AUTO_TRANSLATES: bool = true;

/// Whether `auto` picks it to attach (`-p`) to a running x86_64 program: there its threads
/// leave the cache and run on untouched if itrace is killed, even by SIGKILL, where a stepped
/// thread keeps its trap flag and debug registers and dies of SIGTRAP (issue 29).
const AUTO_TRANSLATES_ATTACH: bool = true;

/// Whether the in-process recorder (libitrace stepping itself with the trap flag) works here.
const INPROC_HERE: bool = cfg!(target_arch = "x86_64");

/// The architecture of the program to trace natively, from its ELF header (the machine's own
/// when it is not ELF, e.g. a script). Foreign programs need qemu.
fn native_arch(program: Option<&Path>, target: &Target) -> Result<Arch, BackendError> {
    let Some(&own) = NATIVE_ARCHES.first() else {
        return Err(BackendError::Settings(
            "no native recorder on this architecture: trace with --qemu ARCH or a GDB stub (--gdb)".into(),
        ));
    };
    let exe = match (program, target) {
        (Some(p), _) => p.to_path_buf(),
        (None, Target::Attach { pid }) => PathBuf::from(format!("/proc/{pid}/exe")),
        (None, _) => return Ok(own),
    };
    match crate::elf::arch_of(&exe) {
        Some(a) if NATIVE_ARCHES.contains(&a) => Ok(a),
        Some(a) => Err(BackendError::Settings(format!("{} is a {a} program: trace it with --qemu {a}", exe.display()))),
        None => Ok(own),
    }
}

/// Fail before the program runs when a `--start`/`--stop` function is in neither the program
/// nor the libraries it links (found as the dynamic loader would). When a library cannot be
/// found here, the check is left to the run, which sees what is really mapped.
fn check_functions_exist<'a>(
    program: &Path,
    names: impl Iterator<Item = &'a String>,
    resolver: &dyn TriggerResolver,
) -> Result<(), BackendError> {
    let names: Vec<&String> = names.collect();
    if names.is_empty() {
        return Ok(());
    }
    let Some(objects) = crate::elf::linked_objects(program) else { return Ok(()) };
    for name in names {
        if !resolver.defines(&objects, name).map_err(BackendError::Settings)? {
            return Err(BackendError::Settings(format!(
                "no function named {name} in {} or its libraries",
                program.display()
            )));
        }
    }
    Ok(())
}
