//! The arc writer (`itrace_post::arc::write_arc`, what `itrace arc` runs) on arbitrary trace
//! files: the module-table replay, address resolution (module paths that name no file, saved
//! vDSO images that are not ELF), source lines and the line formatting must never panic, hang
//! or allocate without bound. Every line written must be a `#` comment or an arc line of the
//! layout in docs/arc-and-report.md, with no control characters, whatever names the trace holds.
//!
//! Input: a control byte (bit 0: fix the checksums, see `itrace_fuzz`), then the file.

#![no_main]

use itrace_fuzz::TraceInput;
use libfuzzer_sys::fuzz_target;

/// Fields 1-6 from the left, 8-10 from the right, field 7 (`symbol:module`) what is between.
fn check_arc_line(line: &str) {
    if line.starts_with('#') {
        return;
    }
    let f: Vec<&str> = line.split_whitespace().collect();
    let ok = f.len() >= 10
        && f[0].parse::<u16>().is_ok()
        && (f[1] == "U" || f[1] == "K")
        && f[2].len() == 1
        && f[2].as_bytes()[0].is_ascii_digit()
        && f[3].parse::<u32>().is_ok()
        && f[4] == "@"
        && u64::from_str_radix(f[5], 16).is_ok()
        && f[f.len() - 3].split('_').count() >= 4
        && ["INTRPT", "CALL", "RETURN", "JUMP", "IRET", "OTHER", "UNDEFD", "ALLOC"].contains(&f[f.len() - 2])
        && source_field(f[f.len() - 1]);
    assert!(ok, "not an arc line: {line:?}");
}

/// Field 10: `0` (no source line) or `file:line` (docs/arc-and-report.md).
fn source_field(f: &str) -> bool {
    f == "0" || f.rsplit_once(':').is_some_and(|(file, line)| !file.is_empty() && line.parse::<u32>().is_ok())
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = TraceInput::new("arc", data) else {
        return;
    };
    let Ok(trace) = itrace_post::open(input.path()) else {
        return;
    };
    let mut out = Vec::new();
    match itrace_post::arc::write_arc(&trace, &mut out, &mut |_| {}) {
        Ok(stats) => {
            let text = std::str::from_utf8(&out).expect("the arc is UTF-8");
            assert!(!text.chars().any(|c| c != '\n' && c.is_control()), "a control character in the arc");
            let mut lines = 0u64;
            for line in text.lines() {
                check_arc_line(line);
                lines += !line.starts_with('#') as u64;
            }
            assert_eq!(lines, stats.lines, "arc lines written and counted differ");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
