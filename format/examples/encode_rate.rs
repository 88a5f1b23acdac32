//! The compact encoder's cost per taken branch, on branches taken from a real trace:
//! `cargo run --release -p itrace-format --example encode_rate -- TRACE [SKIP] [COUNT]`.
//!
//! A window of COUNT (100,000) branches of the first CPU stream that has them, after SKIP
//! (1,000,000), is encoded 100
//! times over in 256 KiB chunks, as the qemu plugin's vCPUs make them (a window small enough to
//! stay in the cache, as the branches a recorder encodes are: it measures the encoder, not the
//! memory). Prints the best of 5 rounds in ns per branch, the payload's bytes per branch, and
//! an FNV-1a hash of the payload bytes, so that two builds of the encoder can be compared for
//! speed and for identical output.

use itrace_format::compact::{Encoder, MAX_BRANCH_ITEM};
use itrace_format::{BatchStamp, Branch, Hop, Record, TraceFile};
use std::time::Instant;

const CHUNK: usize = 256 * 1024;
const REPS: usize = 100;
/// Branches a piece: a stretch of `Buffers::push_hops`.
const PIECE: usize = 1024;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: encode_rate TRACE [SKIP] [COUNT]")?;
    let skip: usize = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let count: usize = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let trace = TraceFile::open(std::path::Path::new(&path))?;
    let mut window: Vec<Branch> = Vec::with_capacity(count);
    for cpu in 0..trace.header().ncpu {
        window.clear();
        for r in trace.stream(cpu) {
            if let (_, Record::Branch(b)) = r? {
                window.push(b);
            }
            if window.len() == skip + count {
                break;
            }
        }
        if window.len() > skip {
            break;
        }
    }
    let mut window = window.split_off(skip.min(window.len()));
    if window.is_empty() {
        return Err(format!("{path}: no CPU stream has more than {skip} branches").into());
    }
    // The user-mode branches of the window's first thread, as a drain's batches hold them:
    // both ways of encoding take these, in the same pieces (a piece has one timestamp).
    let tid = window[0].tid;
    window.retain(|b| !b.kernel && b.flags == 0 && b.aux == 0 && b.tid == tid);
    // Keyed as the translating recorder keys them: one key for each branch source, count and
    // kind (an exit of the code cache).
    let mut keys = std::collections::HashMap::new();
    let hops: Vec<Hop> = window
        .iter()
        .map(|b| {
            let n = keys.len() as u32 + 1;
            let key = *keys.entry((b.from, b.icount, b.kind)).or_insert(n);
            Hop::new(b.from, b.to, b.icount, b.kind, key)
        })
        .collect();
    let mut pieces = Vec::new();
    let mut start = 0;
    for i in 1..=window.len() {
        if i == window.len() || i - start == PIECE || window[i].ts != window[start].ts {
            pieces.push(start..i);
            start = i;
        }
    }
    measure("branch", window.len(), &pieces, |enc, out, r| {
        for b in &window[r] {
            enc.branch(out, b);
        }
    });
    measure("hops", window.len(), &pieces, |enc, out, r| {
        let ts = window[r.start].ts;
        enc.hops(out, &hops[r.clone()], tid, BatchStamp { first: ts, first_n: 0, rest: ts }, 0);
    });
    Ok(())
}

/// Encode `pieces` of the window `REPS` times over with `encode`, in chunks of `CHUNK`, and
/// print the best of 5 rounds.
fn measure(
    name: &str,
    n: usize,
    pieces: &[std::ops::Range<usize>],
    encode: impl Fn(&mut Encoder, &mut Vec<u8>, std::ops::Range<usize>),
) {
    let (mut best, mut bytes, mut hash) = (f64::MAX, 0, 0xcbf2_9ce4_8422_2325u64);
    let mut out = Vec::with_capacity(CHUNK);
    for round in 0..5 {
        let mut enc = Encoder::new();
        let mut done = |out: &mut Vec<u8>, bytes: &mut usize| {
            *bytes += out.len();
            if round == 0 {
                hash = out.iter().fold(hash, |h, &x| (h ^ x as u64).wrapping_mul(0x0100_0000_01b3));
            }
            out.clear();
        };
        bytes = 0;
        let t0 = Instant::now();
        for _ in 0..REPS {
            for r in pieces {
                if out.len() + enc.pending() + r.len() * MAX_BRANCH_ITEM > CHUNK {
                    enc.finish(&mut out);
                    enc.reset();
                    done(&mut out, &mut bytes);
                }
                encode(&mut enc, &mut out, r.clone());
            }
        }
        enc.finish(&mut out);
        done(&mut out, &mut bytes);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let per = (n * REPS) as f64;
    println!(
        "{name:>6}: {n} branches x {REPS}: best {:.2} ns/branch, {:.3} bytes/branch, payload fnv-1a {hash:016x}",
        best * 1e9 / per,
        bytes as f64 / per
    );
}
