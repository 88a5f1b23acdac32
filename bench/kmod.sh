#!/usr/bin/env bash
# The kernel recorder against the ptrace recorder, on the same workload (long_loop, 406,009
# instructions) in one boot of the test guest (QEMU TCG: compare only within one boot).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kmod-shim/test-in-guest.sh bench
LOG=target/kmod-guest/build/console-bench.log.txt
awk '/^BENCH:/ {
        split($3, i, "="); split($4, t, "=");
        rate[$2] = i[2] / (t[2] / 1e9);
        printf "%-7s %9d instructions in %7.3f s: %10.0f instructions/s\n", $2, i[2], t[2] / 1e9, rate[$2]
     }
     END { if (rate["ptrace"] > 0) printf "kmod/ptrace: %.1fx\n", rate["kmod"] / rate["ptrace"] }' "$LOG"
