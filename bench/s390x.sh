#!/usr/bin/env bash
# The native s390x recorder against raw_step with RAW_STEP_BLOCK=1 (bench/raw_step.c: the bare
# PTRACE_SINGLEBLOCK loop, nothing read and nothing recorded), on the same freestanding loop
# (bench/s390x_loop.S), three times each, alternating, in one boot of the s390x guest
# (qemu-system-s390x 10, TCG: compare only within one boot). itrace runs with its default step
# method (block steps, as the probe finds in this guest). itrace is timed by wall clock around
# the whole `itrace record` (start-up and the trace file included), and its fixed cost on the
# 38-instruction s390x-asm program is printed to take out; raw_step times itself from the exec
# stop to the exit. Target: an itrace/raw rate of at least 0.85.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
s390x-guest/test-in-guest.sh bench
LOG=${CARGO_TARGET_DIR:-target}/s390x-guest/build/console-bench.log.txt
awk '/^BENCH rawblock / { for (i = 3; i <= NF; i++) if ($i ~ /^seconds=/) { split($i, v, "="); if (!rb || v[2] < rb) rb = v[2] } }
     /^BENCH itrace / { split($3, v, "="); if (!it || v[2] < it) it = v[2] }
     /^BENCH fixed / { split($3, v, "="); if (!fx || v[2] < fx) fx = v[2] }
     END {
        printf "raw_step (PTRACE_SINGLEBLOCK): %.2f s, itrace: %.2f s, itrace on 38 instructions: %.2f s (best of three each)\n", rb, it, fx
        if (it > 0) printf "itrace/raw block-step rate: %.2f (stepping alone, without the fixed cost: %.2f)\n", rb / it, rb / (it - fx)
     }' "$LOG"
