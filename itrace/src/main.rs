//! `itrace`: record every taken branch of a program, then turn the trace
//! into PI-style arc files and reports.

mod calib;
mod cli;
mod dump;
mod inproc;
mod kmod;
mod plugin;
mod record;
mod remote;
mod signals;
mod size;

use clap::error::ErrorKind;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        cli::Command::Record(args) => record::run(*args),
        cli::Command::Arc(args) => cli::arc(args),
        cli::Command::Report(args) => cli::report(args),
        cli::Command::Dump(args) => dump::run(args),
        cli::Command::Calib(args) => calib::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // One line: the context chain joined, as `itrace: what: why`.
            eprintln!("itrace: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Help and version go to stdout as clap prints them; a usage error is one line on stderr.
fn usage_error(e: clap::Error) -> ExitCode {
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::SUCCESS;
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
