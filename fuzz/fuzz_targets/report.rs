//! The report (`itrace_post::report::build`, what `itrace report` runs) on arbitrary trace
//! files: the replay, the shadow call stacks (unmatched returns, signal frames, recursion) and
//! both outputs must never panic, hang or allocate without bound. Also checked: the self
//! counts of the functions, of the modules and of the threads each add up to the total, no
//! function's inclusive count is below its self count, the JSON output parses, and the text
//! output holds no control characters but newlines.
//!
//! Input: a control byte (bit 0: fix the checksums, see `itrace_fuzz`; bits 1-7 pick the
//! text layout: `--width` 0..127 scaled, `--top` 0 or 40), then the file.

#![no_main]

use itrace_fuzz::TraceInput;
use itrace_post::report::{self, TextOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(input) = TraceInput::new("report", data) else {
        return;
    };
    let Ok(trace) = itrace_post::open(input.path()) else {
        return;
    };
    let r = match report::build(&trace, &mut |_| {}) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let total = r.total_instructions;
    let functions: u64 = r.functions.iter().map(|f| f.self_instructions).sum();
    let modules: u64 = r.modules.iter().map(|m| m.self_instructions).sum();
    let threads: u64 = r.threads.iter().map(|t| t.instructions).sum();
    assert_eq!((functions, modules, threads), (total, total, total), "self counts do not add up to the total");
    for f in &r.functions {
        assert!(f.inclusive >= f.self_instructions, "{f:?}: inclusive below self");
    }

    let mut json = Vec::new();
    r.write_json(&mut json).expect("JSON to memory");
    serde_json::from_slice::<serde_json::Value>(&json).expect("the JSON report parses");

    let opts = TextOptions { top: if input.extra & 1 != 0 { 40 } else { 0 }, width: (input.extra >> 1) as usize * 4 };
    let mut text = Vec::new();
    r.write_text(&mut text, &opts).expect("text to memory");
    let text = std::str::from_utf8(&text).expect("the text report is UTF-8");
    assert!(!text.chars().any(|c| c != '\n' && c.is_control()), "a control character in the text report");
});
