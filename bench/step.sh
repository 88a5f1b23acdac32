#!/usr/bin/env bash
# itrace --step block (debug-register breakpoints) beside --step instruction and the raw
# ptrace single-step loop pinned to one CPU (the baseline of bench/run.sh), on bench/workload.c,
# in one invocation: REPS alternating runs of each, wall clock from outside, best and median.
# Also checks that both itrace modes count the same instructions and that the workload's
# output is the same under all three. A benchmark, not a test: it exits non-zero only if
# something failed to run. Knobs: BENCH_REPS (5), BENCH_N (workload iterations, 1000),
# ITRACE (default target/release/itrace), BENCH_NO_CARGO=1, BENCH_OUT (bench/build).
set -u -o pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${BENCH_OUT:-$HERE/build}
REPS=${BENCH_REPS:-5}
N=${BENCH_N:-1000}
ITRACE=${ITRACE:-$ROOT/target/release/itrace}
SCRATCH=$(mktemp -d /tmp/itrace-step.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
say() { echo "step-bench: $*" >&2; }
now() { date +%s.%N; }
calc() { awk "BEGIN { x = ($1); printf \"%.6g\n\", x }"; }
FAILS=0
fail() { echo "step-bench: FAILED: $*" >&2; FAILS=$((FAILS + 1)); }

if [ "${BENCH_NO_CARGO:-0}" != 1 ]; then
    (cd "$ROOT" && cargo build --release -p itrace) || { fail "cargo build"; exit 1; }
fi
[ -x "$ITRACE" ] || { fail "no itrace at $ITRACE"; exit 1; }
mkdir -p "$OUT"
gcc -O2 -Wall -o "$OUT/raw_step" "$HERE/raw_step.c" || exit 1
gcc -O1 -static -Wall -o "$OUT/workload" "$HERE/workload.c" || exit 1
cd "$OUT" || exit 1
PIN_CPU=$(awk '/^Cpus_allowed_list:/ { split($2, a, /[-,]/); print a[1]; exit }' /proc/self/status)
[ -n "$PIN_CPU" ] || PIN_CPU=0

declare -A RATES INSNS
RAW_STEPS=""
CHECKSUM=""
for ((r = 1; r <= REPS; r++)); do
    say "repetition $r/$REPS"
    t0=$(now)
    taskset -c "$PIN_CPU" ./raw_step ./workload "$N" >"$SCRATCH/raw.out" 2>"$SCRATCH/raw.err" || fail "raw_step"
    t1=$(now)
    RAW_STEPS=$(sed -n 's/^raw_step .*steps=\([0-9]*\).*/\1/p' "$SCRATCH/raw.err")
    [ -n "$RAW_STEPS" ] && RATES[raw]+="$(calc "$RAW_STEPS / ($t1 - $t0)") "
    CHECKSUM=$(cat "$SCRATCH/raw.out")
    for step in instruction block; do
        rm -f "$SCRATCH/$step.itr"
        t0=$(now)
        "$ITRACE" record --step "$step" -o "$SCRATCH/$step.itr" -- ./workload "$N" \
            >"$SCRATCH/$step.out" 2>"$SCRATCH/$step.err"
        rc=$?
        t1=$(now)
        if [ $rc -ne 0 ]; then
            fail "itrace record --step $step (exit $rc): $(tail -n2 "$SCRATCH/$step.err")"
            continue
        fi
        [ "$(cat "$SCRATCH/$step.out")" = "$CHECKSUM" ] || fail "workload output differs under --step $step"
        insns=$("$ITRACE" report "$SCRATCH/$step.itr" --json |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["total_instructions"])')
        INSNS[$step]=$insns
        RATES[$step]+="$(calc "$insns / ($t1 - $t0)") "
    done
done
best() { tr ' ' '\n' | grep . | sort -g | tail -n1; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[++n] = $1 } END { if (n % 2) print a[(n + 1) / 2]; else print (a[n / 2] + a[n / 2 + 1]) / 2 }'; }
fmt() { printf '%.0f' "$1" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta'; }
[ "${INSNS[instruction]:-x}" = "${INSNS[block]:-y}" ] ||
    fail "instruction counts differ: --step instruction ${INSNS[instruction]:-n/a}, --step block ${INSNS[block]:-n/a}"
RAW_BEST=$(best <<<"${RATES[raw]:-}")
SS_BEST=$(best <<<"${RATES[instruction]:-}")
echo
echo "== itrace --step block =="
echo "machine: $(sed -n '/^model name[[:space:]]*:[[:space:]]*/{s///p;q;}' /proc/cpuinfo)$(grep -qw hypervisor /proc/cpuinfo && echo ' (virtual machine)'), nproc $(nproc), Linux $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "./workload $N: raw_step ${RAW_STEPS:-n/a} steps, itrace ${INSNS[block]:-n/a} instructions; $REPS alternating runs each, wall clock"
printf '  %-40s %14s %14s %12s %14s\n' "" "instr/s, best" "median" "vs pinned raw" "vs single-step"
for k in raw instruction block; do
    case $k in
        raw) label="raw single-step loop, pinned (CPU $PIN_CPU)" ;;
        instruction) label="itrace record --step instruction" ;;
        block) label="itrace record --step block" ;;
    esac
    [ -n "${RATES[$k]:-}" ] || { printf '  %-40s %14s\n' "$label" n/a; continue; }
    b=$(best <<<"${RATES[$k]}")
    m=$(median <<<"${RATES[$k]}")
    printf '  %-40s %14s %14s %12s %14s\n' "$label" "$(fmt "$b")" "$(fmt "$m")" \
        "$(printf '%.2f' "$(calc "$b / $RAW_BEST")")" \
        "$( [ -n "$SS_BEST" ] && printf '%.2f' "$(calc "$b / $SS_BEST")" || echo n/a)"
done
# What block stepping saves depends on how far apart the stops are: the workload's taken
# branches by kind (from the block trace) and the instructions per taken branch.
if [ -f "$SCRATCH/block.itr" ]; then
    echo
    echo "./workload $N, taken branches by kind (itrace dump of the --step block trace):"
    "$ITRACE" dump "$SCRATCH/block.itr" | awk -v insns="${INSNS[block]:-0}" '
        $2 ~ /^cpu/ && ($4 == "U" || $4 == "K") { n[$5]++; total++ }
        END {
            for (k in n) printf "  %-10s %10d  %5.1f%%\n", k, n[k], 100 * n[k] / total
            printf "  %-10s %10d  instructions per taken branch: %.2f\n", "all", total, (total ? insns / total : 0)
        }'
fi
[ "$FAILS" -eq 0 ]
