//! `itrace calib train|validate`: run a program built with `-finstrument-functions` and
//! linked with hookit under the in-process recorder, and set the profiler's calibrated counts
//! against the instruction trace of the same run.

use crate::cli::{CalibArgs, CalibCommand, TrainArgs, ValidateArgs};
use anyhow::{bail, Context, Result};
use itrace_calib::events::{self, EventLog};
use itrace_calib::model::{self, Calibration, Machine};
use itrace_calib::report::{self, Analysis};
use itrace_calib::truth;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const HOOKIT: &str = "libhookit.so";
const TRAINER_C: &str = include_str!("../../calib/trainer/trainer.c");
const TRAINER_LIB_C: &str = include_str!("../../calib/trainer/trainer_lib.c");
const TRAINER_H: &str = include_str!("../../calib/trainer/trainer.h");

pub fn run(args: CalibArgs) -> Result<ExitCode> {
    match args.command {
        CalibCommand::Train(a) => train(a),
        CalibCommand::Validate(a) => validate(a),
    }
}

/// libhookit.so next to the itrace executable.
fn hookit() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the itrace executable")?;
    let p = exe.parent().map(|d| d.join(HOOKIT)).unwrap_or_default();
    if !p.is_file() {
        bail!("cannot find {HOOKIT} next to {} (build it: cargo build -p hookit)", exe.display());
    }
    Ok(p)
}

fn machine(hookit: &Path) -> Result<Machine> {
    let bytes = std::fs::read(hookit).with_context(|| format!("cannot read {}", hookit.display()))?;
    Ok(Machine::current("sw", &format!("{:08x}", crc32fast::hash(&bytes))))
}

/// A fresh scratch directory.
fn scratch() -> Result<PathBuf> {
    let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let d = std::env::temp_dir().join(format!("itrace-calib-{}-{ns}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}

/// Whether `program` calls the hooks, and gets them from hookit.
fn check_instrumented(program: &Path) -> Result<()> {
    let bytes = std::fs::read(program).with_context(|| format!("cannot read {}", program.display()))?;
    let elf =
        goblin::elf::Elf::parse(&bytes).with_context(|| format!("{} is not an ELF program", program.display()))?;
    let calls_hook = elf.dynsyms.iter().chain(elf.syms.iter()).any(|s| {
        elf.dynstrtab.get_at(s.st_name).or_else(|| elf.strtab.get_at(s.st_name)) == Some("__cyg_profile_func_enter")
    });
    if !calls_hook {
        bail!(
            "{} is not instrumented (no __cyg_profile_func_enter): build it with -finstrument-functions and link -lhookit",
            program.display()
        );
    }
    if !elf.libraries.contains(&HOOKIT) {
        bail!("{} is instrumented but not linked with {HOOKIT}: link it with -lhookit", program.display());
    }
    Ok(())
}

/// One profiled run: the profiler's logs, the truth from the trace and the resolver.
struct Run {
    logs: Vec<EventLog>,
    truth: truth::Truth,
    res: itrace_post::resolve::Resolver,
}

fn profile(command: &[OsString], dir: &Path, trace_path: &Path) -> Result<Run> {
    use itrace_arch::backend::{Backend, RecordSettings, Target};
    let mut settings =
        RecordSettings::new(Target::Launch { command: command.to_vec(), aslr: false }, trace_path.to_path_buf());
    settings.backend = Backend::Inproc;
    settings.region = true;
    settings.env = vec![
        ("ITRACE_HOOKIT_OUT".into(), dir.as_os_str().to_os_string()),
        ("ITRACE_HOOKIT_METRIC".into(), "sw".into()),
        // Bind the PLT at load: a lazy first resolution would be charged to one interval.
        ("LD_BIND_NOW".into(), "1".into()),
    ];
    let (recorded, chosen) = crate::record::run(&settings)?;
    // The summary, without the temporary trace's name (it is deleted unless --trace keeps it).
    crate::record::summary_of(&recorded, &settings, &chosen, None).print();
    let mut logs = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "events") {
            let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
            logs.push(events::parse(&text).with_context(|| format!("bad profile {}", p.display()))?);
        }
    }
    if logs.is_empty() {
        bail!("the program wrote no profile (hookit writes it when the program exits normally)");
    }
    let trace = itrace_post::open(trace_path).with_context(|| format!("cannot read {}", trace_path.display()))?;
    let (truth, res) = truth::truth(&trace, HOOKIT).context("cannot read the trace")?;
    if truth.lost > 0 {
        bail!("the trace lost {} records: the truth is incomplete", truth.lost);
    }
    Ok(Run { logs, truth, res })
}

fn train(args: TrainArgs) -> Result<ExitCode> {
    let hook = hookit()?;
    let here = machine(&hook)?;
    let dir = scratch()?;
    for (name, text) in [("trainer.c", TRAINER_C), ("trainer_lib.c", TRAINER_LIB_C), ("trainer.h", TRAINER_H)] {
        std::fs::write(dir.join(name), text).with_context(|| format!("cannot write {}", dir.join(name).display()))?;
    }
    let hookdir = hook.parent().unwrap_or(Path::new("."));
    let flags: Vec<&str> = args.cflags.split_whitespace().collect();
    let cc = |extra: &[&str]| -> Result<()> {
        let out = std::process::Command::new(&args.cc)
            .args(&flags)
            .arg("-finstrument-functions")
            .args(extra)
            .arg(format!("-L{}", hookdir.display()))
            .arg("-lhookit")
            .arg(format!("-Wl,-rpath,{}:{}", dir.display(), hookdir.display()))
            .current_dir(&dir)
            .output()
            .with_context(|| format!("cannot run {}", args.cc))?;
        if !out.status.success() {
            bail!("cannot build the trainer: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    };
    cc(&["-fPIC", "-shared", "-o", "libtrainer.so", "trainer_lib.c"])?;
    cc(&["-o", "trainer", "trainer.c", "-L.", "-ltrainer"])?;
    let run = profile(&[dir.join("trainer").into()], &dir, &dir.join("trainer.itr"))?;
    let mut run = run;
    let a = report::analyse(&run.logs, &run.truth, &BTreeMap::new(), &mut run.res)?;
    let threads: Vec<_> = a.threads.iter().map(|t| (t.steps.clone(), t.raw.clone(), t.truth.clone())).collect();
    let (minima, varying) = model::train(&threads);
    let events: usize = a.threads.iter().map(|t| t.steps.len()).sum();
    let cal = Calibration { machine: here, compiler: format!("{} {}", args.cc, args.cflags), minima };
    std::fs::write(&args.output, cal.to_text()).with_context(|| format!("cannot write {}", args.output.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    for (c, lo, hi) in &varying {
        eprintln!("itrace: warning: sequence {c}: overhead not constant ({lo}..{hi} instructions)");
    }
    let (lo, hi) = cal.minima.values().fold((u64::MAX, 0), |(lo, hi), m| {
        let o = m.delta - m.env.min(m.delta);
        (lo.min(o), hi.max(o))
    });
    eprintln!(
        "itrace: trained {} sequences from {events} events; overhead {lo}..{hi} instructions per interval; wrote {}",
        cal.minima.len(),
        args.output.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn validate(args: ValidateArgs) -> Result<ExitCode> {
    let hook = hookit()?;
    let here = machine(&hook)?;
    let what = args.calibration.display().to_string();
    let text = std::fs::read_to_string(&args.calibration)
        .with_context(|| format!("cannot read calibration file {what} (train one with `itrace calib train`)"))?;
    let cal = Calibration::from_text(&text, &what)?;
    cal.check_machine(&here, &what)?;
    let program = itrace_arch::backend::find_program(&args.command[0])?;
    check_instrumented(&program)?;
    let dir = scratch()?;
    let trace_path = args.trace.clone().unwrap_or_else(|| dir.join("run.itr"));
    let result = profile(&args.command, &dir, &trace_path);
    let _ = std::fs::remove_dir_all(&dir);
    let mut run = result?;
    let a: Analysis = report::analyse(&run.logs, &run.truth, &cal.minima, &mut run.res)?;
    if let Some(d) = &args.logs {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        let mut rt = Vec::new();
        a.write_log_rt(&mut rt)?;
        std::fs::write(d.join("log-rt"), rt).with_context(|| format!("cannot write {}", d.join("log-rt").display()))?;
        let mut gen = Vec::new();
        a.write_log_gen(&mut gen)?;
        std::fs::write(d.join("log-gen"), gen)
            .with_context(|| format!("cannot write {}", d.join("log-gen").display()))?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let fails = a.failures(args.tolerance, args.min_calls).len();
        let v = serde_json::json!({
            "tolerance_pct": args.tolerance,
            "min_calls": args.min_calls,
            "functions": a.rows,
            "untrained_sequences": a.untrained,
            "failures": fails,
        });
        serde_json::to_writer_pretty(&mut out, &v)?;
        use std::io::Write;
        writeln!(out)?;
    } else {
        a.write_table(&mut out, args.tolerance, args.min_calls)?;
    }
    Ok(if a.failures(args.tolerance, args.min_calls).is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
