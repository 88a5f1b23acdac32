//! `itrace`: record every taken branch of a program, then turn the trace
//! into PI-style arc files and reports.

mod calib;
mod cli;
mod diff;
mod dump;
mod hints;
mod info;
mod read;
mod record;
mod shell;
mod signals;
mod size;
mod status;
mod summary;
mod supervise;

use clap::error::ErrorKind;
use clap::Parser;
use std::process::ExitCode;

/// A program itrace launches inherits the signal dispositions and mask itrace was started with
/// (`nohup itrace record ./prog` leaves SIGHUP ignored for it). Rust's runtime ignores SIGPIPE
/// before `main`, so they are taken in a constructor, which the loader runs before that.
#[used]
#[link_section = ".init_array"]
static CAPTURE_INHERITED_SIGNALS: extern "C" fn() = {
    extern "C" fn capture() {
        itrace_arch::inherit::capture_signals();
    }
    capture
};

fn main() -> ExitCode {
    // itrace waits for the processes it starts (the recorder, the program, qemu, tools): an
    // ignored SIGCHLD, inherited from whoever started itrace, would have the kernel reap them
    // first. A launched program still gets it ignored (see CAPTURE_INHERITED_SIGNALS).
    // SAFETY: setting a disposition to SIG_DFL has no preconditions; no thread runs yet.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    let raised = supervise::raise_at_start();
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            raised.undo();
            return usage_error(e);
        }
    };
    match &cli.command {
        cli::Command::Record(args) if args.pid.is_some() => raised.keep(),
        _ => raised.undo(),
    }
    read::set_strict(cli.command.read_options().is_some_and(|r| r.strict));
    read::set_quiet(cli.command.read_options().is_some_and(|r| r.quiet));
    read::set_no_index(cli.command.read_options().is_some_and(|r| r.no_index));
    // Debug files are fetched by build-id when a trace is read, never while recording.
    itrace_post::symbols::debuginfod::allow_downloads(cli.command.read_options().is_some());
    let result = match cli.command {
        cli::Command::Record(args) => {
            let on_death = if args.pid.is_some() || args.gdb.is_some() {
                supervise::OnSupervisorDeath::Detach
            } else {
                supervise::OnSupervisorDeath::Kill
            };
            let output = args.output.clone();
            supervised(on_death, Some(&output), || record::command(*args))
        }
        cli::Command::Arc(args) => read::arc(args),
        cli::Command::Report(args) => read::report(args),
        cli::Command::Annotate(args) => read::annotate(args),
        cli::Command::Replay(args) => read::replay(args),
        cli::Command::Diff(args) => diff::run(&diff::settings(args)),
        cli::Command::Flamegraph(args) => read::flamegraph(args),
        cli::Command::Export(args) => read::export(args),
        cli::Command::Dump(args) => dump::run(args),
        cli::Command::Info(args) => info::run(args),
        cli::Command::Archive(args) => read::archive(args),
        cli::Command::Calib(args) => supervised(supervise::OnSupervisorDeath::Kill, None, || calib::run(args)),
        cli::Command::Completions(args) => shell::completions(args),
        cli::Command::Man(args) => shell::man(args),
    };
    match result {
        Ok(code) => code,
        // A reader that went away (`itrace arc t.itr | head`) ends the output, as with cat.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("itrace: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Run `record` in a recording process of its own (see [`supervise`]).
fn supervised(
    on_death: supervise::OnSupervisorDeath,
    output: Option<&std::path::Path>,
    record: impl FnOnce() -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    match supervise::split(on_death, output)? {
        supervise::Side::Recorder => record(),
        supervise::Side::Supervisor(code) => Ok(code),
    }
}

/// The error and its causes on one line, `what: why: why`, leaving out a cause whose text
/// the message before it already says (typed errors often print their source themselves).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.to_string().contains("Broken pipe (os error 32)")
    })
}

/// Help and version go to stdout as clap prints them, and exit 0; `itrace` with no command
/// prints the help on stderr and exits 2 (a usage error); any other usage error is one line on
/// stderr, exit 2.
fn usage_error(e: clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        _ => {}
    }
    let text = e.render().to_string();
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .collect();
    eprintln!("itrace: {} (see 'itrace --help')", parts.join(" "));
    ExitCode::from(2)
}
