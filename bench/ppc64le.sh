#!/usr/bin/env bash
# The native PowerPC64 recorder against raw_step (bench/raw_step.c: the bare PTRACE_SINGLESTEP
# loop), on the same freestanding loop (bench/ppc64le_loop.S, 45,009 instructions), twice each,
# alternating, in one boot of the ppc64le guest (QEMU TCG: compare only within one boot).
# itrace runs with its default step method (block steps where the probe sees them work, as in
# this guest) and with --step instruction (single steps, like raw_step); raw_step also runs
# with RAW_STEP_BLOCK=1, the bare block-step loop, itrace's floor in its default mode.
# itrace is timed by wall clock around the whole `itrace record` (start-up and the trace file
# included); raw_step times itself from the exec stop to the exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ppc64le-guest/test-in-guest.sh bench
LOG=target/ppc64le-guest/build/console-bench.log.txt
awk '/^BENCH raw / { for (i = 3; i <= NF; i++) if ($i ~ /^seconds=/) { split($i, v, "="); if (!raw || v[2] < raw) raw = v[2] } }
     /^BENCH rawblock / { for (i = 3; i <= NF; i++) if ($i ~ /^seconds=/) { split($i, v, "="); if (!rb || v[2] < rb) rb = v[2] } }
     /^BENCH itrace / { split($3, v, "="); if (!it || v[2] < it) it = v[2] }
     /^BENCH itrace-step / { split($3, v, "="); if (!st || v[2] < st) st = v[2] }
     /^BENCH fixed / { split($3, v, "="); if (!fx || v[2] < fx) fx = v[2] }
     END {
        printf "raw_step: %.2f s, itrace: %.2f s, itrace --step instruction: %.2f s, itrace on 47 instructions: %.2f s (best of two each)\n", raw, it, st, fx
        if (it > 0) printf "itrace/raw rate (default: block steps): %.2f (stepping alone, without the fixed cost: %.2f)\n", raw / it, raw / (it - fx)
        if (rb > 0) printf "raw_step with PTRACE_SINGLEBLOCK: %.2f s; itrace/raw block-step rate: %.2f (stepping alone: %.2f)\n", rb, rb / it, rb / (it - fx)
        if (st > 0) printf "itrace --step instruction/raw rate: %.2f (stepping alone: %.2f)\n", raw / st, raw / (st - fx)
     }' "$LOG"
