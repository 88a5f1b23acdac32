#!/usr/bin/env bash
# The kernel recorder against the ptrace recorder, on the same workload (long_loop, 406,009
# instructions) in one boot of the test guest (QEMU TCG: compare only within one boot).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kmod-shim/test-in-guest.sh bench
LOG=target/kmod-guest/build/console-bench.log.txt
awk '/^BENCH:/ {
        split($3, ins, "="); split($4, t, "=");
        rate[$2] = ins[2] / (t[2] / 1e9);
        printf "%-7s %9d instructions in %7.3f s: %10.0f instructions/s\n", $2, ins[2], t[2] / 1e9, rate[$2]
     }
     /^BENCH-CONSUMER:/ {
        for (i = 2; i <= NF; i++) { if ($i ~ /^records=/) { split($i, v, "="); rec = v[2] } if ($i ~ /^bytes=/) { split($i, v, "="); bytes = v[2] } }
        for (i = 2; i < NF; i++) { if ($i == "real") real = $(i + 1); if ($i == "user") user = $(i + 1); if ($i == "sys") sys = $(i + 1) }
        consumer = sprintf("consumer (itrace -p, 5 s): %d records, %.2f s real, %.2f s user + %.2f s sys: %.2f us CPU per record, %.1f%% of one CPU; %.2f bytes per record\n",
                           rec, real, user, sys, rec ? (user + sys) * 1e6 / rec : 0, real ? 100 * (user + sys) / real : 0, rec ? bytes / rec : 0)
     }
     END { if (rate["ptrace"] > 0) printf "kmod/ptrace: %.1fx\n", rate["kmod"] / rate["ptrace"]; printf "%s", consumer }' "$LOG"
