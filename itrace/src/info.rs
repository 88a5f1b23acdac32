//! `itrace info`: what a trace holds and what it costs: the header, each stream's chunks,
//! records and bytes, the bytes per taken branch by kind of record, and the time span.

use crate::cli::InfoArgs;
use anyhow::Result;
use itrace_format::{human_size, KindStats, StreamStats, HEADER_LEN, STREAM_END, STREAM_MTE};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

pub fn run(args: InfoArgs) -> Result<ExitCode> {
    let path = args.input.path();
    let t = crate::read::open_trace(&path)?;
    let h = t.header();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let file_len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    writeln!(out, "{}: {} ({file_len} bytes)", path.display(), human_size(file_len))?;
    writeln!(
        out,
        "format {}.{}, {:?}-endian; {} traced with {}, mode {}, {} CPU streams, aslr {}",
        h.version_major,
        h.version_minor,
        h.endian,
        h.arch,
        h.step_method,
        h.mode,
        h.ncpu,
        if h.aslr_disabled() { "off" } else { "on" }
    )?;
    let started = itrace_post::origin::utc_date(h.start_realtime_ns / 1_000_000_000);
    match itrace_post::origin::origin(&t) {
        Some(o) => {
            let p = |s: &str| itrace_post::names::printable(s).into_owned();
            writeln!(out, "recorded {} on {} by itrace {}", o.date, p(&o.host), p(&o.version))?;
            writeln!(out, "command: {}", p(&o.command()))?;
            writeln!(out, "directory: {}", p(&o.cwd))?;
            writeln!(out, "kernel: {}", p(&o.kernel))?;
            writeln!(out, "cpu: {}", p(&o.cpu))?;
        }
        None => writeln!(out, "recorded {started} (no command line, host or kernel in this trace)")?,
    }
    let mut ids: Vec<u16> = t.chunks().iter().map(|c| c.stream).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut cpu_total = StreamStats::default();
    let mut kinds: BTreeMap<&'static str, KindStats> = BTreeMap::new();
    writeln!(
        out,
        "\n{:<8} {:>7} {:>11} {:>13} {:>13} {:>12}",
        "stream", "chunks", "records", "branches", "bytes", "B/branch"
    )?;
    // A CPU stream's counts come from the summary's stream totals when the file has them;
    // else (files written before them, damaged or cut short ones, the MTE and end streams)
    // every record is decoded, which takes a while on a large trace: a bar on a terminal.
    let from_totals: Vec<Option<StreamStats>> =
        ids.iter().map(|&id| t.stream_stats_from_totals(id).filter(|_| !args.decode)).collect();
    let slow_bytes = t
        .chunks()
        .iter()
        .filter(|c| ids.iter().zip(&from_totals).any(|(&id, f)| id == c.stream && f.is_none()))
        .map(|c| c.len as u64)
        .sum();
    let pb = crate::read::progress(slow_bytes);
    let mut done = 0;
    let mut stats = Vec::with_capacity(ids.len());
    for (&id, fast) in ids.iter().zip(from_totals) {
        stats.push(match fast {
            Some(st) => st,
            None => t.stream_stats_with_progress(id, &mut |n| {
                done += n;
                pb.set_position(done);
            })?,
        });
    }
    pb.finish_and_clear();
    for (id, s) in ids.into_iter().zip(stats) {
        let name = match id {
            STREAM_MTE => "mte".to_string(),
            STREAM_END => "end".to_string(),
            cpu => format!("cpu{cpu}"),
        };
        let per = if s.branches > 0 { format!("{:.2}", s.file_bytes as f64 / s.branches as f64) } else { "-".into() };
        let compressed =
            if s.compressed_chunks > 0 { format!("  ({} compressed)", s.compressed_chunks) } else { String::new() };
        writeln!(
            out,
            "{name:<8} {:>7} {:>11} {:>13} {:>13} {per:>12}{compressed}",
            s.chunks, s.records, s.branches, s.file_bytes
        )?;
        if id < h.ncpu {
            cpu_total.chunks = cpu_total.chunks.saturating_add(s.chunks);
            cpu_total.records = cpu_total.records.saturating_add(s.records);
            cpu_total.branches = cpu_total.branches.saturating_add(s.branches);
            cpu_total.file_bytes = cpu_total.file_bytes.saturating_add(s.file_bytes);
            cpu_total.payload_bytes = cpu_total.payload_bytes.saturating_add(s.payload_bytes);
            for (ts, keep_min) in [(s.first_ts, true), (s.last_ts, false)] {
                let Some(ts) = ts else { continue };
                let slot = if keep_min { &mut cpu_total.first_ts } else { &mut cpu_total.last_ts };
                *slot = Some(slot.map_or(ts, |v| if keep_min { v.min(ts) } else { v.max(ts) }));
            }
            for (k, v) in s.kinds {
                let e = kinds.entry(k).or_default();
                e.records = e.records.saturating_add(v.records);
                e.bytes = e.bytes.saturating_add(v.bytes);
            }
        }
    }
    let b = cpu_total.branches.max(1) as f64;
    writeln!(
        out,
        "\ntaken branches: {}; bytes per taken branch: {:.2} in the CPU streams ({:.2} before compression), \
         {:.2} for the whole file",
        cpu_total.branches,
        cpu_total.file_bytes as f64 / b,
        cpu_total.payload_bytes as f64 / b,
        file_len as f64 / b
    )?;
    writeln!(out, "file header {HEADER_LEN} bytes, {} chunks", t.chunks().len())?;
    if !t.damage().is_empty() {
        writeln!(out, "\ndamaged (skipped):")?;
        writeln!(out, "  {:>12} {:>12} {:<10} {:>7}  what", "offset", "bytes", "stream", "chunks")?;
        for d in t.damage() {
            let stream = match d.stream {
                Some(STREAM_MTE) => "mte".to_string(),
                Some(STREAM_END) => "end".to_string(),
                Some(cpu) => format!("cpu{cpu}"),
                None => "unknown".to_string(),
            };
            let chunks = d.chunks.map_or_else(|| "?".to_string(), |n| n.to_string());
            writeln!(out, "  {:>#12x} {:>12} {stream:<10} {chunks:>7}  {}", d.offset, d.len, d.what)?;
        }
    }
    writeln!(out, "\nCPU records by kind of item (bytes before compression):")?;
    writeln!(out, "  {:<24} {:>13} {:>8} {:>13} {:>9}", "kind", "records", "share", "bytes", "B/record")?;
    for (k, v) in &kinds {
        writeln!(
            out,
            "  {k:<24} {:>13} {:>7.1}% {:>13} {:>9.2}",
            v.records,
            100.0 * v.records as f64 / cpu_total.records.max(1) as f64,
            v.bytes,
            v.bytes as f64 / v.records.max(1) as f64
        )?;
    }
    if let (Some(first), Some(last)) = (cpu_total.first_ts, cpu_total.last_ts) {
        let start = h.start_monotonic_ns;
        writeln!(
            out,
            "\ntime span: {:.6} s (records from {:.6} s to {:.6} s after the trace started)",
            (last - first) as f64 / 1e9,
            first.saturating_sub(start) as f64 / 1e9,
            last.saturating_sub(start) as f64 / 1e9
        )?;
    }
    match t.summary() {
        Some(s) => writeln!(
            out,
            "summary: {} instructions, {} records kept, {} lost, {} module records",
            s.instructions,
            s.records.iter().sum::<u64>(),
            s.lost.iter().sum::<u64>(),
            s.mte_records
        )?,
        None => writeln!(out, "summary: none (the recording did not finish)")?,
    }
    crate::read::warn_truncated(&t);
    Ok(ExitCode::SUCCESS)
}
