#!/usr/bin/env bash
# itrace benchmark of the qemu plugin backend (`itrace record --backend qemu`):
# its rate on a program of at least 100 million instructions against
# valgrind's callgrind with jump collection (the target: at least as fast) and
# against plain qemu-user without the plugin (the ceiling), all measured in
# this one invocation, plus the trace's bytes per taken branch.
# A benchmark, not a test: it exits non-zero only if something failed to run.
# Knobs (environment):
#   BENCH_N=1400000     workload iterations (about 75 instructions and 11 taken branches each)
#   BENCH_REPS=3        runs of each command (the median time is used)
#   BENCH_NO_CARGO=1    don't run cargo build --release
#   ITRACE=path         itrace binary (default target/release/itrace; the plugin is found next to it)
#   ITRACE_BASE=path    another itrace (e.g. built from an older commit) measured in the same runs, for
#                       a before/after table
#   BENCH_OUT=dir       where the workload is built (default bench/build)
set -u -o pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${BENCH_OUT:-$HERE/build}
N=${BENCH_N:-1400000}
REPS=${BENCH_REPS:-3}
ITRACE=${ITRACE:-$ROOT/target/release/itrace}
BASE=${ITRACE_BASE:-}
say() { echo "bench: $*" >&2; }
die() { echo "bench: FAILED: $*" >&2; exit 1; }
now() { date +%s.%N; }
calc() { awk "BEGIN { x = ($1); printf \"%.4g\n\", x }"; }
median() { sort -g | awk '{ a[++n] = $1 } END { if (n % 2) print a[(n + 1) / 2]; else print (a[n / 2] + a[n / 2 + 1]) / 2 }'; }
fmt() { printf '%.0f' "$1" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta'; }

for t in gcc qemu-x86_64 valgrind /usr/bin/time; do command -v $t >/dev/null || die "$t is not installed (scripts/install-test-deps.sh)"; done
if [ "${BENCH_NO_CARGO:-0}" != 1 ]; then
    say "cargo build --release -p itrace -p itrace-qemu-plugin"
    (cd "$ROOT" && cargo build --release -p itrace -p itrace-qemu-plugin) || die "cargo build"
fi
mkdir -p "$OUT"
gcc -O1 -static -o "$OUT/workload" "$HERE/workload.c" || die "building the workload"
W=$OUT/workload
SCRATCH=$(mktemp -d /tmp/itrace-plugin-bench.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT

# time_of CMD...: "wall cpu" seconds of one run (cpu = user + system of the command and its
# children, all threads); stdout/stderr go to the scratch dir.
time_of() {
    /usr/bin/time -f '%e %U %S' -o "$SCRATCH/time" "$@" >"$SCRATCH/out" 2>"$SCRATCH/err" || return 1
    awk '{ printf "%s %.3f\n", $1, $2 + $3 }' "$SCRATCH/time"
}

# The trace is also recorded into memory (tmpfs) to show the recorder without the disk (with
# format 2.0's 40 bytes per taken branch, writing to the page cache was most of the cost).
SHM=/dev/shm
[ -d "$SHM" ] && [ -w "$SHM" ] || SHM=
declare -a T_QEMU T_PLUGIN T_CG C_QEMU C_PLUGIN C_CG T_SHM C_SHM T_BASE C_BASE T_COMP C_COMP
for r in $(seq "$REPS"); do
    say "run $r/$REPS: qemu-x86_64, itrace --backend qemu, callgrind (workload $N)"
    read -r w c < <(time_of qemu-x86_64 "$W" "$N") || die "qemu-x86_64 run"
    T_QEMU+=("$w"); C_QEMU+=("$c")
    read -r w c < <(time_of "$ITRACE" record --backend qemu -o "$SCRATCH/p.itr" -- "$W" "$N") ||
        die "itrace record: $(cat "$SCRATCH/err")"
    T_PLUGIN+=("$w"); C_PLUGIN+=("$c")
    if "$ITRACE" record --help | grep -q -- --compress; then
        read -r w c < <(time_of "$ITRACE" record --backend qemu --compress -o "$SCRATCH/pc.itr" -- "$W" "$N") ||
            die "itrace record --compress: $(cat "$SCRATCH/err")"
        T_COMP+=("$w"); C_COMP+=("$c")
    fi
    if [ -n "$BASE" ]; then
        read -r w c < <(time_of "$BASE" record --backend qemu -o "$SCRATCH/base.itr" -- "$W" "$N") ||
            die "$BASE record: $(cat "$SCRATCH/err")"
        T_BASE+=("$w"); C_BASE+=("$c")
        BASE_BYTES=$(stat -c %s "$SCRATCH/base.itr")
        rm -f "$SCRATCH/base.itr"
    fi
    if [ -n "$SHM" ]; then
        read -r w c < <(time_of "$ITRACE" record --backend qemu -o "$SHM/itrace-bench-$$.itr" -- "$W" "$N") ||
            die "itrace record to $SHM: $(cat "$SCRATCH/err")"
        rm -f "$SHM/itrace-bench-$$.itr"
        T_SHM+=("$w"); C_SHM+=("$c")
    fi
    read -r w c < <(time_of valgrind --tool=callgrind --collect-jumps=yes --callgrind-out-file="$SCRATCH/cg.out" "$W" "$N") ||
        die "callgrind run"
    T_CG+=("$w"); C_CG+=("$c")
done
# counts from the report's JSON, not from the wording of itrace's summary line
read -r INSNS BRANCHES < <("$ITRACE" report --json "$SCRATCH/p.itr" | python3 -c \
    'import json,sys; d = json.load(sys.stdin); print(d["total_instructions"], d["total_branches"])') ||
    die "itrace report --json $SCRATCH/p.itr"
BYTES=$(stat -c %s "$SCRATCH/p.itr")
CG_INSNS=$(awk '/^(summary|totals):/ { print $2; exit }' "$SCRATCH/cg.out")
[ -n "$INSNS" ] && [ -n "$CG_INSNS" ] || die "could not read instruction counts"
tq=$(printf '%s\n' "${T_QEMU[@]}" | median)
tp=$(printf '%s\n' "${T_PLUGIN[@]}" | median)
tc=$(printf '%s\n' "${T_CG[@]}" | median)
cq=$(printf '%s\n' "${C_QEMU[@]}" | median)
cp=$(printf '%s\n' "${C_PLUGIN[@]}" | median)
cc=$(printf '%s\n' "${C_CG[@]}" | median)
rq=$(calc "$INSNS / $tq")
rp=$(calc "$INSNS / $tp")
rc=$(calc "$CG_INSNS / $tc")
echo
echo "qemu plugin backend benchmark: workload $N (median of $REPS runs; rates by wall clock; cpu = user + system)"
row() { printf '  %-46s %13s instr  %7ss  %7ss cpu  %13s instr/s\n' "$1" "$(fmt "$2")" "$3" "$4" "$(fmt "$5")"; }
row "qemu-x86_64, no plugin (ceiling)" "$INSNS" "$tq" "$cq" "$rq"
row "itrace record --backend qemu (trace on disk)" "$INSNS" "$tp" "$cp" "$rp"
if [ -n "$SHM" ]; then
    ts=$(printf '%s\n' "${T_SHM[@]}" | median)
    cs=$(printf '%s\n' "${C_SHM[@]}" | median)
    rs=$(calc "$INSNS / $ts")
    row "itrace record --backend qemu (trace in $SHM)" "$INSNS" "$ts" "$cs" "$rs"
fi
if [ ${#T_COMP[@]} -gt 0 ]; then
    tz=$(printf '%s\n' "${T_COMP[@]}" | median)
    cz=$(printf '%s\n' "${C_COMP[@]}" | median)
    rz=$(calc "$INSNS / $tz")
    row "itrace record --backend qemu --compress (disk)" "$INSNS" "$tz" "$cz" "$rz"
fi
if [ -n "$BASE" ]; then
    tb=$(printf '%s\n' "${T_BASE[@]}" | median)
    cb=$(printf '%s\n' "${C_BASE[@]}" | median)
    rb=$(calc "$INSNS / $tb")
    row "base itrace --backend qemu (disk)" "$INSNS" "$tb" "$cb" "$rb"
fi
row "valgrind --tool=callgrind --collect-jumps=yes" "$CG_INSNS" "$tc" "$cc" "$rc"
echo "  plugin / callgrind rate:  $(calc "$rp / $rc")x by wall clock, $(calc "($INSNS / $cp) / ($CG_INSNS / $cc)")x by cpu time  (target >= 3)"
[ -n "$SHM" ] && echo "  plugin (trace in $SHM) / callgrind rate: $(calc "$rs / $rc")x by wall clock"
echo "  plugin / plain qemu rate: $(calc "$rp / $rq")x by wall clock  (target >= 0.35)"
[ ${#T_COMP[@]} -gt 0 ] && echo "  plugin --compress / callgrind rate: $(calc "$rz / $rc")x, / plain qemu: $(calc "$rz / $rq")x by wall clock; trace $(fmt "$(stat -c %s "$SCRATCH/pc.itr")") bytes"
if [ -n "$BASE" ]; then
    echo "  base plugin / callgrind rate: $(calc "$rb / $rc")x, / plain qemu: $(calc "$rb / $rq")x by wall clock; trace $(fmt "$BASE_BYTES") bytes, $(calc "$BASE_BYTES / $BRANCHES") bytes per taken branch"
fi
echo "  trace: $(fmt "$BYTES") bytes, $(fmt "$BRANCHES") taken branches, $(calc "$BYTES / $BRANCHES") bytes per taken branch"
