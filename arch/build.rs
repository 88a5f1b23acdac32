//! Builds the blob of `translate-inproc` that the x86_64 translating recorder maps into traced
//! processes: the crate (and `itrace-compact`, its one dependency) compiled by rustc directly,
//! as a static position-independent executable with no C library and no unwinding, whose entry
//! points are the ring encoder's (`translate-inproc/blob/entry.rs`). Only for x86_64 Linux targets.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let compact = manifest.join("../compact/src/lib.rs");
    let inproc = manifest.join("translate-inproc/src/lib.rs");
    let entry = manifest.join("translate-inproc/blob/entry.rs");
    println!("cargo:rerun-if-changed=build.rs");
    for dir in
        [manifest.join("../compact/src"), manifest.join("translate-inproc/src"), manifest.join("translate-inproc/blob")]
    {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_ARCH") != "x86_64" || var("CARGO_CFG_TARGET_OS") != "linux" {
        return;
    }
    let out = PathBuf::from(var("OUT_DIR")).join("blob");
    std::fs::create_dir_all(&out).expect("OUT_DIR is writable");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let target = var("TARGET");
    // The same code generation for the two crates and the executable: position-independent,
    // aborting panics (the entry's handler traps), x86-64's baseline features (the thread's
    // vector registers beyond SSE are not saved around the call).
    let common = |c: &mut Command| {
        c.args(["--edition", "2021", "--target", &target, "-C", "opt-level=3", "-C", "panic=abort"]);
        c.args(["-C", "relocation-model=pie", "-C", "debuginfo=0", "-C", "codegen-units=1", "--cap-lints", "allow"]);
        c.arg("-L").arg(format!("dependency={}", out.display()));
    };
    let lib = |name: &str, src: &Path, externs: &[&str]| {
        let mut c = Command::new(&rustc);
        common(&mut c);
        c.args(["--crate-type", "rlib", "--crate-name", name]).arg(src).arg("--out-dir").arg(&out);
        for e in externs {
            c.arg("--extern").arg(format!("{e}={}", out.join(format!("lib{e}.rlib")).display()));
        }
        run(c);
    };
    lib("itrace_compact", &compact, &[]);
    lib("itrace_translate_inproc", &inproc, &["itrace_compact"]);
    let mut c = Command::new(&rustc);
    common(&mut c);
    c.args(["--crate-type", "bin", "--crate-name", "itrace_blob"]).arg(&entry);
    let inproc_rlib = out.join("libitrace_translate_inproc.rlib");
    c.arg("--extern").arg(format!("itrace_translate_inproc={}", inproc_rlib.display()));
    for a in [
        "-nostartfiles",
        "-nostdlib",
        "-static-pie",
        "-Wl,-e,itrace_self_encode",
        "-Wl,-u,itrace_encode_ring",
        "-Wl,--build-id=none",
    ] {
        c.arg("-C").arg(format!("link-arg={a}"));
    }
    c.arg("-o").arg(out.join("blob.elf"));
    run(c);
}

fn run(mut c: Command) {
    let status = c.status().unwrap_or_else(|e| panic!("running {c:?}: {e}"));
    assert!(status.success(), "{c:?} failed: {status}");
}
