//! What a thread's own encoding of its full ring costs, per record, on rings made from a real
//! trace: `cargo run --release -p itrace-translate-inproc --example ring_rate -- TRACE [RINGS]`.
//!
//! The user-mode branches of the first thread of the trace's first CPU stream that has them
//! become the records a translated thread writes (one exit per branch source, count and kind;
//! returns and indirect jumps as indirect exits, their target in the record), in rings of
//! 65,536 records. Each ring is encoded as `encode_ring` does in the program (hops made 4,096
//! at a time, a fixed output): once a ring just written, as the ring-full path meets it (the
//! ring copied in first, so that it comes from the cache as the thread's own stores leave it),
//! and the encoder's tables those of a chunk's start. Prints ns per record (best of 5 passes
//! over RINGS rings, 16 by default), bytes per record, and the rate a traced thread could keep
//! up with when it spends T ns a record of its own, for T of 1 to 3.

use itrace_compact::{BatchStamp, BranchKind, Encoder, Hop, SliceOut};
use itrace_format::{Record, TraceFile};
use itrace_translate_inproc::{encode_ring, RingCursor, RingExit, RECORD_BYTES};
use std::collections::HashMap;
use std::time::Instant;

const RING_RECORDS: usize = 1 << 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: ring_rate TRACE [RINGS]")?;
    let rings: usize = args.next().map_or(Ok(16), |a| a.parse())?;
    let trace = TraceFile::open(std::path::Path::new(&path))?;
    let mut branches = Vec::new();
    for cpu in 0..trace.header().ncpu {
        for r in trace.stream(cpu) {
            if let (_, Record::Branch(b)) = r? {
                if !b.kernel && b.flags == 0 && branches.first().is_none_or(|f: &itrace_format::Branch| f.tid == b.tid)
                {
                    branches.push(b);
                }
            }
            if branches.len() == rings * RING_RECORDS {
                break;
            }
        }
        if !branches.is_empty() {
            break;
        }
    }
    if branches.len() < RING_RECORDS {
        return Err(format!("{path}: fewer than {RING_RECORDS} user branches of one thread").into());
    }
    let mut exits: Vec<RingExit> = Vec::new();
    let mut ids = HashMap::new();
    let mut raw = Vec::with_capacity(branches.len() * RECORD_BYTES);
    for b in &branches {
        let indirect = matches!(b.kind, BranchKind::Return) || b.to & 0xf == 0x8;
        let key = (b.from, b.icount, b.kind, if indirect { 0 } else { b.to });
        let id = *ids.entry(key).or_insert_with(|| {
            let n = exits.len() as u32;
            exits.push(RingExit { hop: Hop::new(b.from, b.to, b.icount, b.kind, n + 1), branch: true, indirect });
            n as u64
        });
        raw.extend_from_slice(&id.to_le_bytes());
        raw.extend_from_slice(&b.to.to_le_bytes());
    }
    let rings = raw.len() / (RING_RECORDS * RECORD_BYTES);
    let ring_bytes = RING_RECORDS * RECORD_BYTES;
    let mut enc = Box::new(Encoder::new());
    let mut hops = vec![Hop::default(); 4096];
    let mut out = vec![0u8; 4 << 20];
    let mut ring = vec![0u8; ring_bytes];
    let (mut best, mut bytes) = (f64::MAX, 0);
    for _ in 0..5 {
        let mut spent = 0.0;
        bytes = 0;
        for r in 0..rings {
            ring.copy_from_slice(&raw[r * ring_bytes..(r + 1) * ring_bytes]);
            let t0 = Instant::now();
            let mut o = SliceOut::new(&mut out);
            let mut cursor = RingCursor::default();
            let stamp = BatchStamp { first: 1, first_n: usize::MAX, rest: 1 };
            let done = encode_ring(&mut enc, &mut o, &mut hops, &exits, &ring, &mut cursor, 1, stamp);
            spent += t0.elapsed().as_secs_f64();
            assert!(o.fitted() && done.branches == RING_RECORDS as u64);
            bytes += done.len;
        }
        best = best.min(spent);
    }
    let records = (rings * RING_RECORDS) as f64;
    let e = best * 1e9 / records;
    println!(
        "{} rings of {RING_RECORDS} records, {} exits: best {e:.2} ns/record, {:.3} bytes/record",
        rings,
        exits.len(),
        bytes as f64 / records
    );
    for t in [1.0, 2.0, 3.0] {
        println!("a thread at {t:.0} ns/record of its own: {:.0} M records/s encoding itself", 1e3 / (t + e));
    }
    Ok(())
}
