//! What the native recorders' guest tests (`tests/tests/ppc64le_native.rs`,
//! `tests/tests/s390x_native.rs`) share: the files a guest run left (traces `NAME.itr`, reports
//! `NAME.json` made in the guest, where the programs are, and the programs, in the guest at
//! `/t/NAME`), qemu-user's log of a program, and the checks that are the same for both.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::oracle::cross::*;
use crate::report::{report_self_counts, report_thread_ids};

/// One architecture's guest run.
pub struct NativeGuest {
    /// The architecture's name for the cross tools and qemu-user (`ppc64le`, `s390x`).
    pub arch: &'static str,
    /// The variable naming the directory of the run's files.
    pub env: &'static str,
    /// The script that makes them.
    pub script: &'static str,
}

impl NativeGuest {
    /// A file the guest run left (trace, report or program).
    pub fn file(&self, name: &str) -> PathBuf {
        let dir = std::env::var_os(self.env)
            .unwrap_or_else(|| panic!("{} is not set: needs the guest's traces: run {}", self.env, self.script));
        let p = PathBuf::from(dir).join(name);
        assert!(p.exists(), "{} is missing: the guest did not record it (see its console log)", p.display());
        p
    }

    /// The guest's `itrace report --json` of trace NAME.
    pub fn report(&self, name: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(self.file(&format!("{name}.json"))).expect("read the guest's report");
        serde_json::from_str(&text).expect("the guest's report is JSON")
    }

    /// Self instructions per function of the guest's program `/t/PROGRAM` in a guest report.
    pub fn self_counts(&self, report: &serde_json::Value, program: &str) -> HashMap<String, u64> {
        report_self_counts(report, Path::new(&format!("/t/{program}")))
    }

    /// A cross program's instructions (objdump, and those only qemu's log shows) and qemu's
    /// single-step log of it (its pcs).
    pub fn qemu_run(&self, bin: &Path) -> (BTreeMap<u64, CrossInsn>, Vec<u64>) {
        let mut insns = cross_objdump(self.arch, bin);
        let pcs = cross_qemu_pcs(self.arch, bin);
        add_missing_insns(self.arch, bin, &pcs, &mut insns);
        (insns, pcs)
    }

    /// [start, end) of the named functions of a cross binary (to the next code symbol).
    pub fn function_ranges(&self, bin: &Path, names: &[&str]) -> Vec<(u64, u64)> {
        let syms = cross_code_symbols(self.arch, bin);
        syms.iter()
            .enumerate()
            .filter(|(_, (_, n))| names.contains(&n.as_str()))
            .map(|(i, &(a, _))| (a, syms.get(i + 1).map(|s| s.0).unwrap_or(u64::MAX)))
            .collect()
    }

    /// The guest's trace NAME of `/t/PROGRAM` against qemu's log `pcs`: the blocks ending in
    /// the functions `names`, block for block, and the self instructions of `counted` (which
    /// qemu must have run) in the guest's report. Returns the report's self counts.
    pub fn same_blocks_in(
        &self,
        name: &str,
        program: &str,
        pcs: &[u64],
        insns: &BTreeMap<u64, CrossInsn>,
        names: &[&str],
        counted: &[&str],
    ) -> HashMap<String, u64> {
        let bin = self.file(program);
        let (want, _) = cross_oracle_blocks_native(self.arch, pcs, insns);
        let (got, _) = itrace_blocks(&self.file(&format!("{name}.itr")));
        let ranges = self.function_ranges(&bin, names);
        let inside = |b: &&CrossBlock| ranges.iter().any(|&(lo, hi)| b.from >= lo && b.from < hi);
        let got_in: Vec<CrossBlock> = got.iter().filter(inside).cloned().collect();
        let want_in: Vec<CrossBlock> = want.iter().filter(inside).cloned().collect();
        assert!(want_in.len() > 10, "qemu ran few blocks of {names:?}: {want_in:?}");
        compare_cross_blocks(&format!("native {name}, the blocks of {names:?}"), &got_in, &want_in);
        let want = cross_function_counts(self.arch, &bin, pcs, counted);
        let got = self.self_counts(&self.report(name), program);
        for n in counted {
            assert!(want.get(*n).is_some_and(|&c| c > 0), "qemu never ran {n}");
            assert_eq!(got.get(*n), want.get(*n), "native {name}: self instructions of {n}");
        }
        got
    }

    /// Instructions per named function in a pc sequence, every pc counted (two threads logged
    /// one after the other can be at the same pc).
    pub fn counts_every_pc(&self, bin: &Path, pcs: &[u64], names: &[&str]) -> HashMap<String, u64> {
        let syms = cross_code_symbols(self.arch, bin);
        let mut counts = HashMap::new();
        for &pc in pcs {
            let i = syms.partition_point(|s| s.0 <= pc);
            if i > 0 && names.contains(&syms[i - 1].1.as_str()) {
                *counts.entry(syms[i - 1].1.clone()).or_insert(0) += 1;
            }
        }
        counts
    }

    /// fork and exec, followed (-f, trace `forkexec` of tests/programs/forkexec.c): two
    /// processes, the work of each traced.
    pub fn check_fork_and_exec(&self) {
        let report = self.report("forkexec");
        let pids = report_thread_ids(&report, "pid");
        assert_eq!(pids.len(), 2, "processes in the report: {pids:?}");
        let got = self.self_counts(&report, "forkexec");
        for n in ["fe_parent_work", "fe_child_work", "fe_exec_work"] {
            assert!(got.get(n).is_some_and(|&c| c > 0), "{n} not traced: {got:?}");
        }
    }

    /// `--region` on tests/programs/region.c (trace `itraceon`: ITraceOn, a nested pair,
    /// ITraceEnabled, system calls inside), its libitrace entry points carried out by itrace:
    /// its rg_* functions run only inside the region, as qemu ran them, and rg_untraced_* only
    /// outside. (The guest checks what ITraceEnabled returned.)
    pub fn check_region_itraceon(&self) {
        let (insns, pcs) = self.qemu_run(&self.file("region"));
        let names = ["rg_work", "rg_leaf", "rg_nested"];
        let got = self.same_blocks_in("itraceon", "region", &pcs, &insns, &names, &names);
        assert_eq!(got.get("rg_untraced_sum"), None, "rg_untraced_sum ran outside the region: {got:?}");
    }

    /// Four threads of tests/programs/threads.c (trace `threads`): five traced, the functions
    /// `names` counted as qemu ran them.
    pub fn check_threads(&self, names: &[&str]) {
        let bin = self.file("threads");
        let pcs = cross_qemu_pcs(self.arch, &bin);
        let want = self.counts_every_pc(&bin, &pcs, names);
        let report = self.report("threads");
        let got = self.self_counts(&report, "threads");
        for n in names {
            assert_eq!(got.get(*n), want.get(*n), "self instructions of {n}");
        }
        let tids = report_thread_ids(&report, "tid");
        assert_eq!(tids.len(), 5, "threads in the report: {tids:?}");
    }

    /// Attached to the running freestanding loop `/t/PROGRAM` for a second (trace `attach`): what
    /// ran is its loop, nothing else (the program has no other code), some iterations of it (how
    /// many a second holds depends on the guest's speed), and the trace says the tracing began
    /// with an attach.
    pub fn check_attach(&self, program: &str) {
        let report = self.report("attach");
        let modules = report["modules"].as_array().expect("modules");
        assert_eq!(modules.len(), 1, "modules: {modules:?}");
        assert_eq!(modules[0]["module"], format!("/t/{program}").as_str(), "modules: {modules:?}");
        assert!(modules[0]["self"].as_u64().unwrap_or(0) > 100, "modules: {modules:?}");
        let dump = crate::run::itrace(["dump".as_ref(), self.file("attach.itr").as_os_str()]);
        assert!(
            dump.stdout.contains("reason: Attach"),
            "no trace-on by attach in\n{}",
            &dump.stdout[..2000.min(dump.stdout.len())]
        );
    }
}
