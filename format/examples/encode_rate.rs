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

use itrace_format::{compact::Encoder, Branch, Record, TraceFile};
use std::time::Instant;

const CHUNK: usize = 256 * 1024;
const REPS: usize = 100;

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
    let window = window.split_off(skip.min(window.len()));
    if window.is_empty() {
        return Err(format!("{path}: no CPU stream has more than {skip} branches").into());
    }
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
            for b in &window {
                enc.branch(&mut out, b);
                if out.len() + enc.pending() > CHUNK - 64 {
                    enc.finish(&mut out);
                    enc.reset();
                    done(&mut out, &mut bytes);
                }
            }
        }
        enc.finish(&mut out);
        done(&mut out, &mut bytes);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let n = (window.len() * REPS) as f64;
    println!(
        "{} branches x {REPS}: best {:.2} ns/branch, {:.3} bytes/branch, payload fnv-1a {hash:016x}",
        window.len(),
        best * 1e9 / n,
        bytes as f64 / n
    );
    Ok(())
}
