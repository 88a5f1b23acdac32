//! `itrace dump` text made comparable between two recordings of one program: the file
//! offsets, timestamps, pids, thread ids (a clone's too), the step method, the CPU numbers and the
//! summary's per-stream totals go (tests/tests/step_block.rs,
//! tests/tests/differential.rs).

/// `itrace dump` text without what differs between two recordings of one program.
pub fn normalized_dump(dump: &str) -> Vec<String> {
    dump.lines()
        // Where each trace came from (its command line names the --step or --backend) differs by design.
        .filter(|line| !line.contains("mte Mte(Recording {"))
        .map(|line| {
            // The summary's per-stream totals hold the first and last time stamps and the bytes
            // each kind of item took (fewer where time stamps repeat): what the records say,
            // their counts, is compared in the lines above.
            let line = match line.find(", totals: [") {
                Some(at) if line.starts_with("# summary") => sum_per_cpu(&format!("{} }}", &line[..at])),
                _ => line.to_string(),
            };
            let line = line.as_str();
            // "0x000021ec cpu0 TraceOn(...)": the file offset goes; so does a branch's timestamp
            // ("0x... cpu0 11349238898155 U CondJump ...").
            let mut words: Vec<&str> = line.split(' ').collect();
            if words.first().is_some_and(|w| w.starts_with("0x")) {
                words.remove(0);
            }
            if words.first().is_some_and(|w| w.starts_with("cpu"))
                && words.get(1).is_some_and(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))
            {
                words.remove(1);
            }
            // The CPU a record is on is where the scheduler ran the thread: the stepping
            // recorders pin a thread for good, a translated one waited for in a nested wait may
            // move (docs/translate.md, "Stalls"). The records' order is their time order either way.
            if words
                .first()
                .is_some_and(|w| w.strip_prefix("cpu").is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            {
                words[0] = "cpu";
            }
            let mut out: Vec<String> = Vec::new();
            let mut blank_next = false;
            for w in words {
                if w.starts_with("step=") {
                    continue;
                }
                if blank_next {
                    blank_next = false;
                    let rest = w.trim_start_matches(|c: char| c.is_ascii_digit());
                    out.push(format!("N{rest}"));
                    continue;
                }
                if matches!(
                    w,
                    "ts:" | "pid:" | "tid:" | "ppid:" | "parent_pid:" | "parent_tid:" | "child_pid:" | "child_tid:"
                ) {
                    blank_next = true;
                }
                if let Some(v) = w.strip_prefix("tid=") {
                    out.push(format!("tid=N{}", v.trim_start_matches(|c: char| c.is_ascii_digit())));
                    continue;
                }
                out.push(w.to_string());
            }
            out.join(" ")
        })
        .collect()
}

/// The summary line with its per-CPU `records` and `lost` lists replaced by their sums (which CPU
/// stream holds a thread's records is the scheduler's choice, see above).
fn sum_per_cpu(line: &str) -> String {
    let mut out = line.to_string();
    for field in ["records: [", "lost: ["] {
        let Some(at) = out.find(field) else { continue };
        let start = at + field.len();
        let Some(len) = out[start..].find(']') else { continue };
        let total: u64 = out[start..start + len].split(", ").filter_map(|n| n.trim().parse::<u64>().ok()).sum();
        out.replace_range(at..start + len + 1, &format!("{}{total}]", field));
    }
    out
}

/// Panics unless each CPU stream of `trace` is in time order, as readers need: they merge the
/// streams by time, so a record older than the one before it on its stream is read out of its
/// thread's order (docs/trace-format.md). Read with the format crate, not with itrace.
pub fn assert_streams_in_time_order(trace: &std::path::Path) {
    let t = itrace_format::TraceFile::open(trace).unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
    for cpu in 0..t.header().ncpu {
        let mut last: Option<itrace_format::Record> = None;
        for item in t.stream(cpu) {
            let (_, record) = item.unwrap_or_else(|e| panic!("{} stream {cpu}: {e}", trace.display()));
            if let Some(before) = &last {
                assert!(
                    record.ts() >= before.ts(),
                    "{} stream {cpu} goes back in time: {before:?} then {record:?}",
                    trace.display()
                );
            }
            last = Some(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::normalized_dump;

    #[test]
    fn a_thread_moved_to_another_cpu_normalises_to_the_same_dump() {
        let on_cpu0 = "0x00001ee2 cpu0 49750244078885 U Jump flags=0 aux=0 0x10 -> 0x20 tid=14231 n=8\n\
                       0x00001ee8 cpu0 49750244078886 U Jump flags=0 aux=0 0x30 -> 0x40 tid=14231 n=7\n\
                       # summary Summary { ts: 5, stop_reason: 0, instructions: 15, records: [2, 0], lost: [0, 0], mte_records: 1, totals: [] }";
        let moved = "0x00001ee2 cpu0 49750244078885 U Jump flags=0 aux=0 0x10 -> 0x20 tid=14231 n=8\n\
                     0x00001ef0 cpu1 49750244078886 U Jump flags=0 aux=0 0x30 -> 0x40 tid=14231 n=7\n\
                     # summary Summary { ts: 6, stop_reason: 0, instructions: 15, records: [1, 1], lost: [0, 0], mte_records: 1, totals: [] }";
        assert_eq!(normalized_dump(on_cpu0), normalized_dump(moved));
        let other = on_cpu0.replace("n=7", "n=6");
        assert_ne!(normalized_dump(on_cpu0), normalized_dump(&other));
        let fewer = on_cpu0.replace("records: [2, 0]", "records: [1, 0]");
        assert_ne!(normalized_dump(on_cpu0), normalized_dump(&fewer));
    }
}
