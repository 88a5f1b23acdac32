//! Stripped code: the same program stripped and unstripped gives the same report, with
//! every function the unstripped build names (nm) shown in the stripped one as
//! `program+0xADDRESS`, its nm address, and the same self, inclusive and call counts.
//! The report hints at what to install for names.

use itrace_tests::{program, record, report_json, report_rows, require_tool, run, test_dir, Symbols};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

#[test]
fn stripped_program_has_a_row_per_function_at_its_nm_address() {
    require_tool("strip");
    let unstripped = program("funcptr");
    let dir = test_dir("stripped-funcptr");
    // Same directory depth and name length, so that the process starts the same way.
    let stripped = dir.join("funcptr");
    let o = run(Command::new("strip").arg("--strip-all").arg("-o").arg(&stripped).arg(&unstripped));
    o.assert_success();
    assert!(Symbols::of(&stripped).syms.is_empty(), "strip left symbols in {}", stripped.display());

    let t_plain = dir.join("plain.itr");
    let t_stripped = dir.join("stripped.itr");
    record(&t_plain, &[], &unstripped, &[]).assert_success();
    record(&t_stripped, &[], &stripped, &[]).assert_success();
    let plain = report_rows(&report_json(&t_plain), &unstripped);
    let report = report_json(&t_stripped);
    let got = report_rows(&report, &stripped);

    let nm = Symbols::of(&unstripped);
    let base = stripped.file_name().unwrap().to_string_lossy().into_owned();
    let mut missing = Vec::new();
    let mut checked = 0;
    for (name, counts) in &plain {
        let want = if name.ends_with("@plt") || name == "<plt>" {
            name.clone()
        } else {
            let sym = nm.by_name(name).unwrap_or_else(|| panic!("{name} of the unstripped report is not in nm"));
            format!("{base}+{:#x}", sym.addr)
        };
        match got.get(&want) {
            Some(c) if c == counts => checked += 1,
            other => missing.push(format!("{name}: want {want} {counts:?}, got {other:?}")),
        }
    }
    assert!(missing.is_empty(), "stripped report differs:\n{}\nstripped rows: {got:?}", missing.join("\n"));
    assert!(checked >= 8, "only {checked} functions compared: {plain:?}");
    assert!(!got.contains_key("<unknown>"), "code left <unknown>: {got:?}");

    // One hint for the stripped program, naming its build-id's debug file (with a fresh cache
    // of hints shown: report_json above showed it once for this trace already).
    let out = run(Command::new(itrace_tests::itrace_bin())
        .arg("report")
        .arg(&t_stripped)
        .env("XDG_CACHE_HOME", dir.join("xdg-cache")));
    out.assert_success();
    let hints: Vec<&str> = out.stderr.lines().filter(|l| l.contains(&*stripped.to_string_lossy())).collect();
    assert_eq!(hints.len(), 1, "one hint for {}: {}", stripped.display(), out.stderr);
    assert!(hints[0].contains("hint:") && hints[0].contains("/usr/lib/debug/.build-id/"), "{}", hints[0]);
}

/// Debian's python3.11 is stripped (about 2,000 symbols, 10,000 functions in `.eh_frame`):
/// traced whole under the qemu plugin, at most 5% of its instructions may be left `<unknown>`.
/// Every row it gets without a symbol, `python3.11+0xOFFSET`, must start where binutils says a
/// function can start (independent of itrace's gimli reading): an FDE of `readelf
/// --debug-dump=frames`, the start of `.init` or `.fini`, an entry of the init/fini arrays, or the
/// target of a direct call or jump in `objdump -d`; FDE starts must carry all but a few of them.
#[test]
fn stripped_python_is_split_by_its_frame_data() {
    let python = Path::new("/usr/bin/python3.11");
    assert!(
        python.is_file(),
        "/usr/bin/python3.11 is missing: install the Debian package python3.11-minimal \
         (or run scripts/install-test-deps.sh)"
    );
    require_tool("qemu-x86_64");
    require_tool("readelf");
    require_tool("objdump");
    let dir = test_dir("stripped-python");
    let trace = dir.join("python.itr");
    record(&trace, &["--backend", "qemu"], python, &["-c", "pass"]).assert_success();
    let report = report_json(&trace);
    let total = report["total_instructions"].as_u64().unwrap();
    let functions = report["functions"].as_array().unwrap();
    let unknown: u64 = functions
        .iter()
        .filter(|f| f["name"].as_str().unwrap().starts_with("<unknown>"))
        .map(|f| f["self"].as_u64().unwrap())
        .sum();
    assert!(total > 1_000_000, "python3 -c pass ran only {total} instructions");
    assert!(unknown * 20 <= total, "{unknown} of {total} instructions are <unknown> (more than 5%)");

    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let readelf = |args: &[&str]| {
        let o = run(Command::new("readelf").args(args).arg(python));
        o.assert_success();
        o.stdout
    };
    let fde_starts: BTreeSet<u64> = readelf(&["--debug-dump=frames"])
        .lines()
        .filter(|l| l.contains(" FDE "))
        .filter_map(|l| hex(l.split("pc=").nth(1)?.split("..").next()?))
        .collect();
    assert!(fde_starts.len() > 5_000, "readelf found only {} FDEs in {}", fde_starts.len(), python.display());
    // `.init` and `.fini` starts (readelf -S: "[Nr] Name Type Address ...").
    let mut other_starts: BTreeSet<u64> = readelf(&["-S", "-W"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(']').nth(1)?.split_whitespace().collect();
            matches!(f.first(), Some(&".init") | Some(&".fini")).then(|| hex(f.get(2)?))?
        })
        .collect();
    // The init/fini arrays' entries: little-endian 8-byte words of their hex dumps.
    for line in readelf(&["-x", ".init_array", "-x", ".fini_array"]).lines() {
        let words: Vec<&str> = line.split_whitespace().skip(1).take(4).collect();
        let bytes: String = words.iter().take_while(|w| w.len() == 8 && hex(w).is_some()).copied().collect();
        for word in bytes.as_bytes().chunks(16).filter(|c| c.len() == 16) {
            let le: Vec<u8> =
                word.chunks(2).map(|b| u8::from_str_radix(std::str::from_utf8(b).unwrap(), 16).unwrap()).collect();
            other_starts.insert(u64::from_le_bytes(le.try_into().unwrap()));
        }
    }
    // Direct call and jump targets ("  627c05:\tje     627c10 <...>").
    let dis = run(Command::new("objdump").arg("-d").arg("--no-show-raw-insn").arg(python));
    dis.assert_success();
    for line in dis.stdout.lines() {
        let mut f = line.split_whitespace().skip(1);
        if let (Some(op), Some(target)) = (f.next(), f.next()) {
            if op.starts_with("call") || op.starts_with("jmp") {
                other_starts.extend(hex(target));
            }
        }
    }

    let prefix = "python3.11+0x";
    let (mut at_fde, mut elsewhere) = (0u64, 0u64);
    for f in functions.iter().filter(|f| f["module"].as_str() == Some("/usr/bin/python3.11")) {
        let name = f["name"].as_str().unwrap();
        if let Some(offset) = name.strip_prefix(prefix) {
            let offset = hex(offset).unwrap_or_else(|| panic!("bad offset in {name}"));
            let count = f["self"].as_u64().unwrap();
            if fde_starts.contains(&offset) {
                at_fde += count;
            } else {
                assert!(other_starts.contains(&offset), "{name} starts no function binutils knows of");
                elsewhere += count;
            }
        }
    }
    assert!(at_fde > total / 4, "only {at_fde} of {total} instructions in python3.11 rows at FDE starts");
    assert!(elsewhere * 1000 <= at_fde, "{elsewhere} instructions in rows at no FDE start, against {at_fde}");
}
