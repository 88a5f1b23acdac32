//! A Rust program that traces one region of its work with `itrace::region()`.
//! Run: `itrace record --region -- target/debug/examples/region`.

#[inline(never)]
fn collatz_steps(mut n: u64) -> u32 {
    let mut steps = 0;
    while n != 1 {
        n = if n % 2 == 0 { n / 2 } else { 3 * n + 1 };
        steps += 1;
    }
    steps
}

fn main() {
    // Untraced: set-up work.
    let inputs: Vec<u64> = (1..=20).collect();
    // Traced: only this block.
    let (total, traced): (u32, bool) = {
        let _region = itrace::region();
        (inputs.iter().map(|&n| collatz_steps(n)).sum(), itrace::enabled())
    };
    println!("region: collatz steps {total} traced {traced}");
}
