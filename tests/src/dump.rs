//! `itrace dump` text made comparable between two recordings of one program: the file
//! offsets, timestamps, pids, thread ids (a clone's too), the step method and the summary's
//! per-stream totals go (tests/tests/step_block.rs,
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
                Some(at) if line.starts_with("# summary") => format!("{} }}", &line[..at]),
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
