//! The trace file a backend writes in this process: created with its header and buffers
//! (whose totals feed the status line), finished with the summary record.

use super::{BackendError, RecordOutcome, RecordSettings, Recorded};
use itrace_format::{
    human_size, Arch, BufferConfig, Buffers, FileHeader, LiveCounts, StepMethod, StopReason, Summary, TraceWriter,
    FLAG_ICOUNT, FLAG_NO_ASLR,
};
use std::sync::Arc;

/// Create the trace file (header written) and the buffers that fill it.
pub fn open(
    s: &RecordSettings,
    arch: Arch,
    step: StepMethod,
    ncpu: u16,
    no_aslr: bool,
    live: Arc<LiveCounts>,
) -> Result<Buffers, BackendError> {
    let flags = FLAG_ICOUNT | if no_aslr { FLAG_NO_ASLR } else { 0 };
    let header = FileHeader::starting_now(arch, s.mode, step, ncpu, flags, s.buffer_size as u64, s.segment_size as u64);
    let mut writer = TraceWriter::create(&s.output, &header).map_err(|e| match e {
        itrace_format::FormatError::Open { err, .. } => {
            BackendError::io(format!("cannot create trace file {}", s.output.display()), err)
        }
        e => e.into(),
    })?;
    if let Some(level) = s.compress {
        writer.compress(level);
    }
    let cfg = BufferConfig {
        mode: s.mode,
        ncpu: ncpu as usize,
        buffer_size: s.buffer_size,
        segment_size: s.segment_size,
        mte_size: s.mte_size,
    };
    let buffers = Buffers::new(cfg, writer);
    if buffers.is_err() {
        let _ = std::fs::remove_file(&s.output);
    }
    let mut buffers = buffers?.with_live(live);
    // Where the trace came from, first in the MTE stream; a trace without it is still a trace.
    let _ = buffers.push_mte(&itrace_format::Record::Mte(recording_record(header.start_monotonic_ns)));
    Ok(buffers)
}

/// Longest command line the recording record keeps, in bytes (a record holds 64 KiB).
const MAX_ARGS_BYTES: usize = 16 << 10;

/// Where the trace comes from: itrace's version and command line, the working directory,
/// host, kernel and CPU model.
pub fn recording_record(ts: u64) -> itrace_format::Mte {
    let mut args = Vec::new();
    let mut bytes = 0;
    for a in std::env::args_os() {
        let a = a.to_string_lossy().into_owned();
        bytes += a.len() + 2;
        if bytes > MAX_ARGS_BYTES {
            args.push("…".to_string());
            break;
        }
        args.push(a);
    }
    let proc =
        |name: &str| std::fs::read_to_string(format!("/proc/sys/kernel/{name}")).unwrap_or_default().trim().to_string();
    let kernel = format!("{} {} {} {}", proc("ostype"), proc("osrelease"), proc("version"), std::env::consts::ARCH);
    itrace_format::Mte::Recording {
        ts,
        version: env!("CARGO_PKG_VERSION").to_string(),
        args,
        cwd: std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default(),
        host: proc("hostname"),
        kernel: kernel.trim().to_string(),
        cpu: cpu_model(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()),
    }
}

/// The CPU model in /proc/cpuinfo: `model name` (x86), `cpu` (PowerPC), `machine` (s390x's
/// `processor 0:` lines have no model name).
fn cpu_model(cpuinfo: &str) -> String {
    for key in ["model name", "cpu", "machine"] {
        let found = cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        });
        if let Some(v) = found.filter(|v| !v.is_empty()) {
            return v;
        }
    }
    String::new()
}

/// Run a backend's recording loop into `buffers` and finish the file; when the loop fails
/// before there is anything to keep, the file goes.
pub fn record_into(
    s: &RecordSettings,
    mut buffers: Buffers,
    arch: Arch,
    step: String,
    record: impl FnOnce(&mut Buffers) -> Result<RecordOutcome, BackendError>,
) -> Result<Recorded, BackendError> {
    match record(&mut buffers) {
        Ok(outcome) => finish(s, buffers, outcome, arch, step),
        Err(e) => {
            drop(buffers);
            let _ = std::fs::remove_file(&s.output);
            Err(e)
        }
    }
}

/// Write what is buffered and the summary; the totals of the recording. A write or trigger
/// error of the recording is reported here, after what was recorded is safe in the file.
pub fn finish(
    s: &RecordSettings,
    buffers: Buffers,
    outcome: RecordOutcome,
    arch: Arch,
    step: String,
) -> Result<Recorded, BackendError> {
    let stop_reason = outcome.stop_reason.unwrap_or(StopReason::Exited);
    let lost: u64 = buffers.lost().iter().sum();
    let records: u64 = buffers.records().iter().sum();
    let summary = Summary {
        ts: itrace_format::now_ns(),
        stop_reason: stop_reason as u32,
        instructions: outcome.instructions,
        ..Default::default()
    };
    let live = buffers.live();
    let finished = buffers.finish(summary);
    let bytes = std::fs::metadata(&s.output).map(|m| m.len()).unwrap_or(0);
    if let Some(e) = outcome.trigger_error {
        return Err(BackendError::Failed(e));
    }
    // A write that failed while recording or at the end: say what reached the file, which is
    // all a reader will find, and what did not.
    if let Some(e) = outcome.write_error.or_else(|| finished.as_ref().err().map(|e| e.to_string())) {
        return Err(BackendError::Failed(write_failed(&e, &s.output, bytes, &live)));
    }
    finished?;
    Ok(Recorded {
        records,
        instructions: outcome.instructions,
        branches: outcome.branches,
        lost,
        bytes,
        arch,
        step,
        stop_reason,
        why: None,
        exit_status: outcome.exit_status,
    })
}

/// The one line for a recording whose trace file could not be written (a full disk, a file
/// size limit): the error, then the totals of what reached the file and what did not.
pub fn write_failed(error: &str, output: &std::path::Path, bytes: u64, live: &LiveCounts) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let disk_full = if error.contains("os error 28") { " (the file system is full)" } else { "" };
    format!(
        "{error}{disk_full}; tracing stopped. {} ({}) holds what reached it: {} records ({} instructions, {} taken \
         branches); {} records were not written",
        output.display(),
        human_size(bytes),
        live.written_records.load(Relaxed),
        live.written_instructions.load(Relaxed),
        live.written_branches.load(Relaxed),
        live.unwritten_records.load(Relaxed),
    )
}

/// The number of CPUs the buffers have a stream for.
pub fn ncpu() -> u16 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.clamp(1, u16::MAX as libc::c_long) as u16
}

#[cfg(test)]
mod recording_tests {
    use super::cpu_model;

    #[test]
    fn cpu_models_of_each_architecture() {
        let x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n";
        assert_eq!(cpu_model(x86), "Intel(R) Xeon(R) CPU @ 2.20GHz");
        let ppc = "processor\t: 0\ncpu\t\t: POWER9 (architected), altivec supported\nclock\t\t: 2200.000000MHz\n";
        assert_eq!(cpu_model(ppc), "POWER9 (architected), altivec supported");
        let s390 = "vendor_id       : IBM/S390\n# processors    : 2\nmachine         : 8561\n";
        assert_eq!(cpu_model(s390), "8561");
        assert_eq!(cpu_model(""), "");
    }
}
