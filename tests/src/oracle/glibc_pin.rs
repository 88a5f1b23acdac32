//! The same glibc code natively and under valgrind, on any x86_64 CPU.
//!
//! glibc picks its string and memory functions (IFUNCs), their size thresholds and its lazy
//! binding trampoline from the CPU it finds at start-up. valgrind's virtual CPU is not the
//! host's: VEX answers CPUID with a fixed Intel model (GenuineIntel, family 6 model 0x3c here)
//! with AVX2 at most, whatever the host is. So an AMD host, an AVX-512 host or one with FSRM
//! runs other libc code natively than the same program does under callgrind, and every
//! comparison that reaches libc code (printf's inclusive count, main's) would compare two
//! different programs.
//!
//! [`GLIBC_PIN`] makes both runs take the same choices by construction:
//! - `glibc.cpu.hwcaps` turns off every CPU feature glibc's selectors test that the tunable can
//!   turn off (everything above the x86-64 baseline's SSE2), so both sides pick the SSE2
//!   versions, and sets each "preferred" flag (glibc's per-vendor, per-model tuning) to one
//!   value;
//! - the cache sizes and `rep movsb`/`rep stosb` thresholds, which glibc otherwise derives from
//!   the vendor's cache descriptors, are given.
//!
//! [`assert_glibc_pin_holds`] checks it instead of trusting it: the dynamic loader's own report
//! of its choices (`ld.so --list-diagnostics`, glibc 2.33 and later) is read natively and under
//! valgrind with the pin, and every value that selects code must be equal. A test that
//! compares libc code with callgrind calls it (through [`pinned`] or the callgrind oracle), and
//! fails naming what differs if a CPU defeats the pin.

use crate::require_tool;
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::OnceLock;

/// The `GLIBC_TUNABLES` of [`GLIBC_PIN`].
///
/// hwcaps: `-NAME` turns a CPU feature or preferred flag off, `NAME` turns a preferred flag on.
/// FSRM, F16C, SSE3 and CX16 cannot be turned off through this tunable in glibc 2.36: FSRM only
/// sets the default `rep movsb` threshold, which is given here; the others are checked equal.
pub const GLIBC_TUNABLES_PIN: &str = concat!(
    "glibc.cpu.hwcaps=",
    "-SSSE3,-SSE4_1,-SSE4_2,-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-AVX512ER,",
    "-AVX512PF,-BMI1,-BMI2,-LZCNT,-MOVBE,-POPCNT,-ERMS,-RTM,-FMA,-FMA4,-XSAVEC,",
    "Fast_Unaligned_Load,Fast_Unaligned_Copy,-Fast_Rep_String,-Fast_Copy_Backward,-Slow_BSF,",
    "-Prefer_PMINUB_for_stringop,-Slow_SSE4_2,-AVX_Fast_Unaligned_Load,-Prefer_No_VZEROUPPER,",
    "-Prefer_ERMS,-Prefer_FSRM,-Prefer_No_AVX512,-MathVec_Prefer_No_AVX512",
    ":glibc.cpu.x86_data_cache_size=0x8000",
    ":glibc.cpu.x86_shared_cache_size=0x100000",
    ":glibc.cpu.x86_non_temporal_threshold=0xc0000",
    ":glibc.cpu.x86_rep_movsb_threshold=0x800",
    ":glibc.cpu.x86_rep_stosb_threshold=0x800",
);

/// The environment that pins glibc's CPU-dependent choices (see the module's doc). Tests that
/// need every PLT slot bound before main add `LD_BIND_NOW=1` themselves.
pub const GLIBC_PIN: &[(&str, &str)] = &[("GLIBC_TUNABLES", GLIBC_TUNABLES_PIN)];

/// The CPU features whose usable bit selects glibc code (string and memory functions, the lazy
/// binding trampoline, libm's variants), as `(name, word, register, bit)` of
/// `x86.cpu_features.features[word].active[register]` (glibc 2.36's `cpuid_index` and
/// eax/ebx/ecx/edx order). Bits not listed here (RDSEED, ADX, SHA, CLWB, GFNI, VAES, the
/// AVX-512 extensions beyond the base set, SSE4A, PREFETCHW, XSAVEOPT, AVX_VNNI, AMX, ...)
/// select no code in glibc; they may differ, and the tunable cannot clear them. (AVX_VNNI was
/// listed until an Intel Xeon (Sapphire Rapids) host showed it usable natively, as a feature
/// that only needs AVX to be, and not under valgrind: glibc 2.36 sets it for
/// `CPU_FEATURE_ACTIVE` and no selector reads it.)
const SELECTING_FEATURES: &[(&str, usize, usize, u32)] = &[
    ("SSE3", 0, 2, 0),
    ("SSSE3", 0, 2, 9),
    ("FMA", 0, 2, 12),
    ("CMPXCHG16B", 0, 2, 13),
    ("SSE4_1", 0, 2, 19),
    ("SSE4_2", 0, 2, 20),
    ("MOVBE", 0, 2, 22),
    ("POPCNT", 0, 2, 23),
    ("XSAVE", 0, 2, 26),
    ("OSXSAVE", 0, 2, 27),
    ("AVX", 0, 2, 28),
    ("F16C", 0, 2, 29),
    ("CMOV", 0, 3, 15),
    ("SSE2", 0, 3, 26),
    ("BMI1", 1, 1, 3),
    ("AVX2", 1, 1, 5),
    ("BMI2", 1, 1, 8),
    ("ERMS", 1, 1, 9),
    ("RTM", 1, 1, 11),
    ("AVX512F", 1, 1, 16),
    ("AVX512DQ", 1, 1, 17),
    ("AVX512PF", 1, 1, 26),
    ("AVX512ER", 1, 1, 27),
    ("AVX512CD", 1, 1, 28),
    ("AVX512BW", 1, 1, 30),
    ("AVX512VL", 1, 1, 31),
    ("LZCNT", 2, 2, 5),
    ("FMA4", 2, 2, 16),
    ("XSAVEC", 3, 0, 1),
];

/// `x86.cpu_features.*` values that select code or sizes in the string functions. Left out:
/// the cache levels' sizes (read by `sysconf` only), `rep_movsb_stop_threshold` and the
/// `Avoid_Short_Distance_REP_MOVSB` flag (read only on the `rep movsb` path of memmove, which
/// needs ERMS, turned off and checked above), the x86 ISA level and the XSAVE state size (the
/// lazy binding trampoline runs the same instructions whatever its size), and the CPUID words.
fn selects_code(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("x86.cpu_features.") else { return false };
    if let Some(flag) = rest.strip_prefix("preferred.") {
        return flag != "Avoid_Short_Distance_REP_MOVSB";
    }
    matches!(
        rest,
        "data_cache_size"
            | "shared_cache_size"
            | "non_temporal_threshold"
            | "rep_movsb_threshold"
            | "rep_stosb_threshold"
    )
}

/// `ld.so --list-diagnostics` with the pin, natively or under valgrind: `key -> value`.
fn loader_diagnostics(under_valgrind: bool) -> BTreeMap<String, String> {
    let loader = "/lib64/ld-linux-x86-64.so.2";
    let mut cmd = if under_valgrind {
        let mut c = Command::new(require_tool("valgrind"));
        c.args(["-q", "--tool=none", loader]);
        c
    } else {
        Command::new(loader)
    };
    cmd.arg("--list-diagnostics").envs(GLIBC_PIN.iter().copied());
    let side = if under_valgrind { "under valgrind" } else { "natively" };
    let o = cmd.output().unwrap_or_else(|e| panic!("{loader} --list-diagnostics {side}: {e}"));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("x86.cpu_features."),
        "{loader} --list-diagnostics {side} failed ({}; glibc 2.33 or later is needed): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A feature's usable bit in the diagnostics.
fn feature_bit(diag: &BTreeMap<String, String>, word: usize, register: usize, bit: u32) -> Option<bool> {
    let v = diag.get(&format!("x86.cpu_features.features[{word:#x}].active[{register:#x}]"))?;
    let v = u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?;
    Some(v >> bit & 1 == 1)
}

/// What differs between two loaders' diagnostics, among the values that select code.
fn pin_differences(native: &BTreeMap<String, String>, valgrind: &BTreeMap<String, String>) -> Vec<String> {
    let mut diffs = Vec::new();
    for &(name, word, register, bit) in SELECTING_FEATURES {
        let (n, v) = (feature_bit(native, word, register, bit), feature_bit(valgrind, word, register, bit));
        if n.is_none() || n != v {
            diffs.push(format!("CPU feature {name} usable: natively {n:?}, under valgrind {v:?}"));
        }
    }
    let keys: std::collections::BTreeSet<&String> = native.keys().chain(valgrind.keys()).collect();
    for k in keys.into_iter().filter(|k| selects_code(k)) {
        if native.get(k) != valgrind.get(k) {
            diffs.push(format!("{k}: natively {:?}, under valgrind {:?}", native.get(k), valgrind.get(k)));
        }
    }
    if feature_bit(native, 1, 1, 9) != Some(false) {
        diffs.push("ERMS is still usable: the rep movsb path (and its thresholds) would be reached".into());
    }
    diffs
}

/// Panics, naming each value, unless glibc takes the same CPU-dependent choices natively and
/// under valgrind with [`GLIBC_PIN`]. Checked once per test process.
pub fn assert_glibc_pin_holds() {
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    let result = CHECK.get_or_init(|| {
        let diffs = pin_differences(&loader_diagnostics(false), &loader_diagnostics(true));
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "glibc's CPU-dependent choices differ natively and under valgrind despite GLIBC_TUNABLES={GLIBC_TUNABLES_PIN} \
                 (this CPU: {}); a comparison of libc code with callgrind would compare two programs:\n{}",
                cpu_model(),
                diffs.join("\n")
            ))
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// `cmd` with [`GLIBC_PIN`] in its environment, once the pin is checked.
pub fn pinned(cmd: &mut Command) -> &mut Command {
    assert_glibc_pin_holds();
    cmd.envs(GLIBC_PIN.iter().copied())
}

/// This machine's CPU, as /proc/cpuinfo names it.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim().to_string()))
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diag(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A difference in a selecting feature or a threshold is named; one in a bit that selects
    /// nothing, or in rep_movsb_stop_threshold, is not.
    #[test]
    fn differences_are_named_and_only_those_that_select_code() {
        let base = [
            ("x86.cpu_features.features[0x0].active[0x2]", "0x4000000"),
            ("x86.cpu_features.features[0x0].active[0x3]", "0x4008000"),
            ("x86.cpu_features.features[0x1].active[0x1]", "0x0"),
            ("x86.cpu_features.features[0x2].active[0x2]", "0x0"),
            ("x86.cpu_features.features[0x3].active[0x0]", "0x0"),
            ("x86.cpu_features.features[0x6].active[0x0]", "0x0"),
            ("x86.cpu_features.rep_movsb_threshold", "0x800"),
            ("x86.cpu_features.rep_movsb_stop_threshold", "0xc0000"),
            ("x86.cpu_features.preferred.Fast_Unaligned_Load", "0x1"),
        ];
        assert!(pin_differences(&diag(&base), &diag(&base)).is_empty());
        let mut other = diag(&base);
        // SHA (leaf 7 ebx bit 29) and the stop threshold: no difference that matters
        other.insert("x86.cpu_features.features[0x1].active[0x1]".into(), "0x20000000".into());
        other.insert("x86.cpu_features.rep_movsb_stop_threshold".into(), "0x100000".into());
        assert!(pin_differences(&diag(&base), &other).is_empty());
        // AVX2, a preferred flag and a threshold: each named
        other.insert("x86.cpu_features.features[0x1].active[0x1]".into(), "0x20".into());
        other.insert("x86.cpu_features.preferred.Fast_Unaligned_Load".into(), "0x0".into());
        other.insert("x86.cpu_features.rep_movsb_threshold".into(), "0x2000".into());
        let d = pin_differences(&diag(&base), &other).join("\n");
        assert!(d.contains("AVX2") && d.contains("Fast_Unaligned_Load") && d.contains("rep_movsb_threshold"), "{d}");
        assert_eq!(d.lines().count(), 3, "{d}");
    }
}
