//! `itrace completions` and `itrace man`: shell completions and man pages generated from the
//! clap definitions.

use crate::cli::{Cli, CompletionsArgs, ManArgs};
use anyhow::{Context, Result};
use std::io::Write;
use std::process::ExitCode;

pub fn completions(args: CompletionsArgs) -> Result<ExitCode> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "itrace", &mut out);
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn man(args: ManArgs) -> Result<ExitCode> {
    let cmd = <Cli as clap::CommandFactory>::command();
    match &args.output {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            eprintln!("itrace: wrote man pages into {}", dir.display());
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
