#!/usr/bin/env bash
# itrace benchmark of the trace format: bytes per taken branch and post-processing rates, of
# this tree's itrace and, when ITRACE_BASE names another itrace (e.g. one built from an older
# commit: `git worktree add /tmp/base COMMIT && cargo build --release` there), of that one too,
# in this one invocation on this machine.
# A benchmark, not a test: it exits non-zero only if something failed to run.
#
# 1. Bytes per taken branch (the file's size / the report's total_branches) of:
#    bench/workload.c mix and branchy under ptrace (BENCH_PTRACE_N iterations) and under
#    --backend qemu (BENCH_QEMU_N), and `python3 -c pass` under --backend qemu; each also with
#    --compress when the itrace has it.
# 2. `itrace arc TRACE > /dev/null` and `itrace report --json TRACE > /dev/null` on one trace of
#    workload branchy under --backend qemu (BENCH_BIG_N iterations, about 3 taken branches
#    each; each itrace reads the trace it recorded), BENCH_REPS runs each, the itraces
#    alternating: records/s/core = branches / max(wall, user + sys), median and best, the
#    ratios of this tree's to the base's, and branches / CPU time alone (wall time counts
#    waiting for a CPU, which a loaded machine adds).
# Knobs: BENCH_PTRACE_N (300), BENCH_QEMU_N (200000), BENCH_BIG_N (1000000), BENCH_REPS (3),
#   ITRACE (default target/release/itrace), ITRACE_BASE (none), BENCH_NO_CARGO=1, BENCH_OUT.
set -u -o pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${BENCH_OUT:-$HERE/build}
ITRACE=${ITRACE:-$ROOT/target/release/itrace}
BASE=${ITRACE_BASE:-}
PN=${BENCH_PTRACE_N:-300}
QN=${BENCH_QEMU_N:-200000}
BN=${BENCH_BIG_N:-1000000}
REPS=${BENCH_REPS:-3}
say() { echo "bench: $*" >&2; }
die() { echo "bench: FAILED: $*" >&2; exit 1; }
calc() { awk "BEGIN { x = ($1); printf \"%.4g\n\", x }"; }
median() { sort -g | awk '{ a[++n] = $1 } END { if (n % 2) print a[(n + 1) / 2]; else print (a[n / 2] + a[n / 2 + 1]) / 2 }'; }

for t in gcc qemu-x86_64 python3 /usr/bin/time; do command -v $t >/dev/null || die "$t is not installed (scripts/install-test-deps.sh)"; done
if [ "${BENCH_NO_CARGO:-0}" != 1 ]; then
    say "cargo build --release -p itrace -p itrace-qemu-plugin"
    (cd "$ROOT" && cargo build --release -p itrace -p itrace-qemu-plugin) || die "cargo build"
fi
mkdir -p "$OUT"
gcc -O1 -static -o "$OUT/workload" "$HERE/workload.c" || die "building the workload"
W=$OUT/workload
SCRATCH=$(mktemp -d /tmp/itrace-format-bench.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT

BINS=("$ITRACE")
NAMES=("this tree")
[ -n "$BASE" ] && { BINS=("$BASE" "$ITRACE"); NAMES=("base ($BASE)" "this tree"); }

branches_of() {
    "$1" report --json "$2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total_branches"])'
}

# bytes_per_branch ITRACE LABEL OPTIONS... -- PROGRAM ARGS...: one line of the table.
bytes_per_branch() {
    local bin=$1 label=$2
    shift 2
    local t=$SCRATCH/b.itr
    "$bin" record -o "$t" "$@" >/dev/null 2>"$SCRATCH/err" || die "$label: $(tail -1 "$SCRATCH/err")"
    local bytes branches
    bytes=$(stat -c %s "$t")
    branches=$(branches_of "$bin" "$t") || die "$label: report"
    printf '  %-52s %12s bytes %10s branches %8s B/branch\n' "$label" "$bytes" "$branches" "$(calc "$bytes / $branches")"
    rm -f "$t"
}

echo
echo "bytes per taken branch (file size / taken branches)"
for i in "${!BINS[@]}"; do
    bin=${BINS[$i]}
    echo " ${NAMES[$i]}:"
    compress=
    "$bin" record --help | grep -q -- --compress && compress=--compress
    for c in "" $compress; do
        bytes_per_branch "$bin" "ptrace workload $PN mix $c" $c -- "$W" "$PN"
        bytes_per_branch "$bin" "ptrace workload $PN branchy $c" $c -- "$W" "$PN" branchy
        bytes_per_branch "$bin" "qemu workload $QN mix $c" --backend qemu $c -- "$W" "$QN"
        bytes_per_branch "$bin" "qemu workload $QN branchy $c" --backend qemu $c -- "$W" "$QN" branchy
        bytes_per_branch "$bin" "qemu python3 -c pass $c" --backend qemu $c -- /usr/bin/python3 -c pass
    done
done

echo
echo "post-processing: workload $BN branchy under --backend qemu; $REPS runs each, the itraces alternating;"
echo "rate = branches / max(wall, cpu) (median and best of the runs); cpu-only = branches / cpu (median)"
rate_of() { awk -v b="$1" '{ c = $2 + $3; w = ($1 > c) ? $1 : c; if (w <= 0) w = 0.01; printf "%.0f\n", b / w }' "$2"; }
cpu_rate_of() { awk -v b="$1" '{ c = $2 + $3; if (c <= 0) c = 0.01; printf "%.0f\n", b / c }' "$2"; }
best() { sort -g | tail -1; }
TRACES=()
BRANCHES=()
for i in "${!BINS[@]}"; do
    t=$SCRATCH/big$i.itr
    "${BINS[$i]}" record --backend qemu -o "$t" -- "$W" "$BN" branchy >/dev/null 2>"$SCRATCH/err" || die "record: $(tail -1 "$SCRATCH/err")"
    TRACES+=("$t")
    BRANCHES+=("$(branches_of "${BINS[$i]}" "$t")") || die "report"
done
for cmd in arc report; do
    declare -A RATES=() CPU_RATES=()
    for r in $(seq "$REPS"); do
        for i in "${!BINS[@]}"; do
            bin=${BINS[$i]}
            t=${TRACES[$i]}
            if [ $cmd = arc ]; then
                /usr/bin/time -f '%e %U %S' -o "$SCRATCH/time" "$bin" arc "$t" >/dev/null || die "arc"
            else
                /usr/bin/time -f '%e %U %S' -o "$SCRATCH/time" "$bin" report --json "$t" >/dev/null || die "report"
            fi
            RATES[$i]+="$(rate_of "${BRANCHES[$i]}" "$SCRATCH/time") "
            CPU_RATES[$i]+="$(cpu_rate_of "${BRANCHES[$i]}" "$SCRATCH/time") "
        done
    done
    MEDIANS=()
    BESTS=()
    for i in "${!BINS[@]}"; do
        med=$(printf '%s\n' ${RATES[$i]} | median)
        top=$(printf '%s\n' ${RATES[$i]} | best)
        cpu=$(printf '%s\n' ${CPU_RATES[$i]} | median)
        MEDIANS+=("$med")
        BESTS+=("$top")
        printf '  %-12s itrace %-6s %10s branches: median %12.0f, best %12.0f records/s/core; cpu-only %12.0f (%s bytes of trace)\n' \
            "${NAMES[$i]%% *}" "$cmd" "${BRANCHES[$i]}" "$med" "$top" "$cpu" "$(stat -c %s "${TRACES[$i]}")"
    done
    if [ -n "$BASE" ]; then
        printf '  this tree / base, itrace %s: median %sx, best %sx\n' "$cmd" \
            "$(calc "${MEDIANS[1]} / ${MEDIANS[0]}")" "$(calc "${BESTS[1]} / ${BESTS[0]}")"
    fi
    unset RATES CPU_RATES
done
rm -f "${TRACES[@]}"
