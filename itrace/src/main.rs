//! `itrace`: record every taken branch of a program, then turn the trace
//! into PI-style arc files and reports.

mod cli;
mod dump;
mod record;
mod signals;
mod size;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Record(args) => record::run(args),
        cli::Command::Arc(args) => cli::arc(args),
        cli::Command::Report(args) => cli::report(args),
        cli::Command::Dump(args) => dump::run(args),
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
