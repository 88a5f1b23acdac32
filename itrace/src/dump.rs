//! `itrace dump`: the header and every record, one per line.

use crate::cli::DumpArgs;
use anyhow::Result;
use itrace_format::Record;
use std::io::Write;
use std::process::ExitCode;

pub fn run(args: DumpArgs) -> Result<ExitCode> {
    let path = args.input.path();
    // As arc and report: a missing default file gets the hint, errors name the file once.
    let t = crate::read::open_trace(&path)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let h = t.header();
    writeln!(
        out,
        "# itrace trace v{}.{} arch={} mode={} step={} cpus={} endian={:?} aslr_disabled={}",
        h.version_major,
        h.version_minor,
        h.arch,
        h.mode,
        h.step_method,
        h.ncpu,
        h.endian,
        h.aslr_disabled()
    )?;
    for ev in t.merged() {
        let ev = ev?;
        let s = if ev.stream == itrace_format::STREAM_MTE { "mte".to_string() } else { format!("cpu{}", ev.stream) };
        if ev.after_gap {
            writeln!(out, "# {s}: records lost to a damaged chunk before this point")?;
        }
        match &ev.record {
            Record::Branch(b) => writeln!(
                out,
                "{:#010x} {s} {} {} {:?} flags={} aux={} {:#x} -> {:#x} tid={} n={}",
                ev.offset,
                b.ts,
                if b.kernel { "K" } else { "U" },
                b.kind,
                b.flags,
                b.aux,
                b.from,
                b.to,
                b.tid,
                b.icount
            )?,
            Record::Mte(itrace_format::Mte::VdsoImage { ts, pid, start, image }) => writeln!(
                out,
                "{:#010x} {s} VdsoImage {{ ts: {ts}, pid: {pid}, start: {start:#x}, bytes: {} }}",
                ev.offset,
                image.len()
            )?,
            r => writeln!(out, "{:#010x} {s} {:?}", ev.offset, r)?,
        }
    }
    if let Some(s) = t.summary() {
        writeln!(out, "# summary {s:?}")?;
    }
    crate::read::warn_truncated(&t);
    Ok(ExitCode::SUCCESS)
}
