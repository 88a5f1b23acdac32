//! The trace reader (`itrace_format::TraceFile`) on arbitrary files: opening (header, chunk
//! index, end summary), every stream the index names, the merged read and the error messages
//! must never panic, hang or allocate without bound. Also checked: chunks and records lie inside
//! the file, each stream's records in increasing offsets, the summary counts the header's CPUs,
//! and a merged read that meets no error yields exactly the records of the MTE and CPU streams.
//! Damaged chunks are skipped: the stretches listed lie in the file apart from the chunks read,
//! and a strict reader refuses the first of them and nothing else (but what does not decode in
//! a chunk cut by the file's end).
//!
//! Input: a control byte (bit 0: fix the checksums, see `itrace_fuzz`), then the file.

#![no_main]

use itrace_format::{TraceFile, STREAM_MTE};
use itrace_fuzz::TraceInput;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(input) = TraceInput::new("trace_reader", data) else {
        return;
    };
    let file_len = data.len() as u64 - 1;
    let t = match TraceFile::open(input.path()) {
        Ok(t) => t,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let h = t.header();
    let _ = (h.to_owned(), h.aslr_disabled(), t.summary().cloned(), t.trace_bytes(), t.path());
    if let Some(s) = t.summary() {
        assert_eq!(s.records.len(), h.ncpu as usize, "the summary and the header disagree on the CPU count");
    }
    if let Some(at) = t.truncated_at() {
        assert!(at <= file_len, "truncated_at {at} past the end of a {file_len}-byte file");
    }
    for c in t.chunks() {
        assert!(c.offset + c.len as u64 <= file_len, "chunk {c:?} runs past the end of a {file_len}-byte file");
    }
    // Damaged stretches lie in the file, in order, apart from the chunks read; a strict reader
    // refuses exactly the first of them.
    let mut last_end = 0;
    for d in t.damage() {
        assert!(d.offset >= last_end && d.offset + d.len <= file_len, "damage {d:?} out of place");
        last_end = d.offset + d.len;
        for c in t.chunks() {
            let end = c.offset + (itrace_format::CHUNK_HEADER_LEN + c.len) as u64;
            assert!(end <= d.offset || c.offset >= d.offset + d.len, "chunk {c:?} inside damage {d:?}");
        }
    }
    let _ = t.damage_loss();
    match (TraceFile::open_strict(input.path()), t.damage().first()) {
        (Ok(_), None) => {}
        (Err(e), Some(d)) => assert_eq!(e.to_string(), d.error().to_string()),
        (Ok(_), Some(d)) => panic!("a strict reader read past {d:?}"),
        // The records of a chunk cut by the file's end have no CRC: one that does not decode
        // (the end chunk's summary, read at open) ends the chunk for a reader, not a strict one.
        (Err(_), None) if t.truncated_at().is_some() => {}
        (Err(e), None) => panic!("a strict reader refused an undamaged file: {e}"),
    }

    // Every stream named in the index, then the merged read.
    let mut ids: Vec<u16> = t.chunks().iter().map(|c| c.stream).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut merged_streams_ok = true;
    let mut merged_streams_records = 0u64;
    for id in ids {
        let mut last = None;
        let mut n = 0u64;
        for r in t.stream(id) {
            match r {
                Ok((offset, record)) => {
                    assert!(offset < file_len, "record at {offset} past the end of a {file_len}-byte file");
                    // Records of one compact item (a run) share its offset.
                    assert!(last.is_none_or(|l| offset >= l), "stream {id}: record offsets go back");
                    last = Some(offset);
                    let _ = (record.ts(), format!("{record:?}"));
                    n += 1;
                }
                Err(e) => {
                    let _ = e.to_string();
                    if id == STREAM_MTE || id < h.ncpu {
                        merged_streams_ok = false;
                    }
                    break;
                }
            }
        }
        if id == STREAM_MTE || id < h.ncpu {
            merged_streams_records += n;
        }
    }
    let mut merged = 0u64;
    let mut merged_error = false;
    for ev in t.merged() {
        match ev {
            Ok(ev) => {
                let _ = (ev.stream, ev.offset, ev.record.ts());
                merged += 1;
            }
            Err(e) => {
                let _ = e.to_string();
                merged_error = true;
            }
        }
    }
    if merged_streams_ok {
        assert!(!merged_error, "the merged read failed where no stream did");
        assert_eq!(merged, merged_streams_records, "the merged read and the streams disagree on the record count");
    }
});
