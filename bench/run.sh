#!/usr/bin/env bash
# itrace benchmark: the ptrace recorder's rate (--backend ptrace) vs. a raw ptrace single-step loop (pinned
# to one CPU as itrace pins itself, and unpinned), and post-processing
# throughput of `itrace arc` / `itrace report`.
# A benchmark, not a test: it exits non-zero only if something failed to run.
# See bench/README.md.  Knobs (environment):
#   BENCH_REPS=5            repetitions of each timed command (recording: the best run of
#                           each is compared, medians shown too; post-processing: median)
#   BENCH_RAW_SECONDS=2.5   size the recording workload for this long a raw run
#   BENCH_N=                workload iterations (overrides BENCH_RAW_SECONDS)
#   BENCH_BIG_BRANCHES=1200000  taken branches wanted in the post-processing trace
#   BENCH_BIG_BUDGET=70     max seconds to spend recording that trace
#   BENCH_NO_CARGO=1        don't run cargo build (use the existing binary)
#   ITRACE=path             itrace binary (default target/release/itrace)
#   BENCH_OUT=dir           where the C programs are built (default bench/build)
#   BENCH_KEEP=1            keep the scratch directory with traces and logs
set -u -o pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${BENCH_OUT:-$HERE/build}
REPS=${BENCH_REPS:-5}
RAW_SECONDS=${BENCH_RAW_SECONDS:-2.5}
BIG_BRANCHES=${BENCH_BIG_BRANCHES:-1200000}
BIG_BUDGET=${BENCH_BIG_BUDGET:-70}
ITRACE=${ITRACE:-$ROOT/target/release/itrace}
ARC_TARGET=2000000
RECORD_TARGET=0.9

FAILS=()
fail() { echo "bench: FAILED: $*" >&2; FAILS+=("$*"); }
say() { echo "bench: $*" >&2; }
now() { date +%s.%N; }
# calc EXPR: floating-point arithmetic with awk.
calc() { awk "BEGIN { x = ($1); printf \"%.6g\n\", x }"; }
calci() { awk "BEGIN { x = ($1); printf \"%d\n\", x }"; }
# best (largest) of the numbers on stdin (one per line)
best() { grep . | sort -g | awk '{ x = $1 } END { if (NR == 0) exit 1; print x }'; }
# median of the numbers on stdin (one per line)
median() {
    grep . | sort -g | awk '{ a[++n] = $1 } END { if (n == 0) exit 1;
        if (n % 2) print a[(n + 1) / 2]; else print (a[n / 2] + a[n / 2 + 1]) / 2 }'
}
# json_num FILE FIELD: a top-level number from a JSON object.
json_num() {
    local v
    if command -v jq >/dev/null 2>&1; then
        v=$(jq -r ".$2 | numbers" "$1" 2>/dev/null)
    else
        v=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2" 2>/dev/null)
    fi
    [[ $v =~ ^[0-9]+$ ]] && echo "$v"
}
# field NAME FILE: value of NAME=... from raw_step's summary line
field() { sed -n "s/^raw_step .*\\b$1=\\([^ ]*\\).*/\\1/p" "$2" | tail -n1; }
# cpu seconds (user+sys) from a /usr/bin/time -f '%U %S' output file
cpu_of() { awk 'NF >= 2 { u = $1; s = $2 } END { printf "%.3f\n", u + s }' "$1"; }
fmt() { # fmt NUMBER -> integer with thousands separators, or n/a
    case "${1:-}" in ''|n/a) echo n/a ;; *) printf '%.0f' "$1" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta' ;; esac
}

SCRATCH=$(mktemp -d /tmp/itrace-bench.XXXXXX)
cleanup() { if [ "${BENCH_KEEP:-0}" = 1 ]; then say "kept $SCRATCH"; else rm -rf "$SCRATCH"; fi; }
trap cleanup EXIT
T_START=$(now)

# ---------------------------------------------------------------- build
mkdir -p "$OUT"
have_itrace=1
if [ "${BENCH_NO_CARGO:-0}" != 1 ]; then
    say "cargo build --release -p itrace"
    if ! (cd "$ROOT" && cargo build --release -p itrace); then
        fail "cargo build --release -p itrace"
    fi
fi
if [ ! -x "$ITRACE" ]; then
    fail "no itrace binary at $ITRACE"
    have_itrace=0
fi
say "gcc: raw_step, workload"
gcc -O2 -Wall -o "$OUT/raw_step" "$HERE/raw_step.c" || { fail "gcc raw_step.c"; exit 1; }
gcc -O1 -static -Wall -o "$OUT/workload" "$HERE/workload.c" || { fail "gcc workload.c"; exit 1; }
# Run everything from $OUT as ./workload so argv and the environment (which
# change glibc's start-up instruction count a little) match for all tracers.
cd "$OUT" || exit 1

# ---------------------------------------------------------------- machine
NPROC=$(nproc)
# (filters that stop early read files, never a pipe: no SIGPIPE under pipefail)
CPU_MODEL=$(sed -n '/^model name[[:space:]]*:[[:space:]]*/{s///p;q;}' /proc/cpuinfo)
[ -n "$CPU_MODEL" ] || CPU_MODEL=$(uname -m)
VIRT=""
grep -qw hypervisor /proc/cpuinfo && VIRT=" (virtual machine)"
KERNEL=$(uname -r)
# The baseline pinned the way itrace pins itself (arch/src/backend/ptrace/cpus.rs): the traced
# thread on the first CPU itrace may run on, and the tracer on the traced thread's CPU, so a
# step is a ping-pong on one CPU. `taskset -c CPU raw_step` puts raw_step and its tracee
# (affinity is inherited through fork and exec) on that same first allowed CPU.
PIN_CPU=$(awk '/^Cpus_allowed_list:/ { split($2, a, /[-,]/); print a[1]; exit }' /proc/self/status)
[ -n "$PIN_CPU" ] || PIN_CPU=0
command -v taskset >/dev/null || { fail "taskset (util-linux) is needed for the pinned baseline"; exit 1; }

# raw_run LOG pinned|unpinned ARGS...: raw_step on ./workload; sets RR_STEPS, RR_WALL
# (seconds, measured outside, like itrace's) and RR_SECS (raw_step's own timing).
raw_run() {
    local log=$1 how=$2; shift 2
    local t0 t1 rc pin=()
    [ "$how" = pinned ] && pin=(taskset -c "$PIN_CPU")
    t0=$(now)
    "${pin[@]}" ./raw_step ./workload "$@" >"$log.out" 2>"$log.err"
    rc=$?
    t1=$(now)
    RR_STEPS=$(field steps "$log.err")
    if [ $rc -ne 0 ] || [ -z "$RR_STEPS" ]; then
        fail "raw_step ($how) ./workload $* (exit $rc): $(tail -n3 "$log.err")"
        return 1
    fi
    RR_WALL=$(calc "$t1 - $t0")
    RR_SECS=$(field seconds "$log.err")
}
# exit_desc RC LIMIT: "exit RC" or "timed out after LIMIT s"
exit_desc() { if [ "$1" -eq 124 ]; then echo "timed out after ${2}s"; else echo "exit $1"; fi; }

# ---------------------------------------------------------------- calibrate
say "calibrating the workload size (raw_step pinned to CPU $PIN_CPU)"
raw_run "$SCRATCH/cal0" pinned 0 || exit 1
BASE_STEPS=$RR_STEPS
raw_run "$SCRATCH/cal1" pinned 400 || exit 1
CAL_STEPS=$RR_STEPS CAL_SECS=$RR_SECS
raw_run "$SCRATCH/cal2" pinned 2000 branchy || exit 1
BR_STEPS=$RR_STEPS
PER_ITER=$(calc "($CAL_STEPS - $BASE_STEPS) / 400")
BR_PER_ITER=$(calc "($BR_STEPS - $BASE_STEPS) / 2000")
CAL_RATE=$(calc "$CAL_STEPS / $CAL_SECS")
if [ -n "${BENCH_N:-}" ]; then
    N=$BENCH_N
else
    N=$(calci "($CAL_RATE * $RAW_SECONDS - $BASE_STEPS) / $PER_ITER")
    [ "$N" -ge 500 ] || N=500
fi
say "start-up $BASE_STEPS instructions, mix $PER_ITER/iteration, branchy $BR_PER_ITER/iteration;" \
    "pinned raw rate ~$(fmt "$CAL_RATE")/s -> N=$N"

# ---------------------------------------------------------------- recording
RAW_RATES=() RAWU_RATES=() IT_RATES=() RAW_WALLS=()
RAW_STEPS="" IT_INSNS="" IT_BRANCHES="" IT_TRACE_BYTES=""
CHECKSUM=""
SMALL_TRACE=$SCRATCH/x.itr
it_ok=$have_itrace
for ((r = 1; r <= REPS; r++)); do
    say "recording, repetition $r/$REPS: raw_step pinned to CPU $PIN_CPU"
    if raw_run "$SCRATCH/raw$r" pinned "$N"; then
        RAW_STEPS=$RR_STEPS
        RAW_WALLS+=("$RR_WALL")
        RAW_RATES+=("$(calc "$RR_STEPS / $RR_WALL")")
        CHECKSUM=$(cat "$SCRATCH/raw$r.out")
    fi
    say "recording, repetition $r/$REPS: raw_step unpinned"
    if raw_run "$SCRATCH/rawu$r" unpinned "$N"; then
        RAWU_RATES+=("$(calc "$RR_STEPS / $RR_WALL")")
    fi
    [ "$it_ok" = 1 ] || continue
    say "recording, repetition $r/$REPS: itrace record"
    # generous limit: a run this slow is not worth waiting for
    limit=$(calci "${RAW_WALLS[0]:-5} * 10 + 30")
    rm -f "$SMALL_TRACE"
    t0=$(now)
    timeout "$limit" "$ITRACE" record --backend ptrace -o "$SMALL_TRACE" -- ./workload "$N" \
        >"$SCRATCH/rec$r.out" 2>"$SCRATCH/rec$r.err"
    rc=$?
    t1=$(now)
    if [ $rc -ne 0 ]; then
        fail "itrace record --backend ptrace -o $SMALL_TRACE -- ./workload $N ($(exit_desc $rc "$limit")): $(tail -n3 "$SCRATCH/rec$r.err")"
        it_ok=0; continue
    fi
    if [ ! -s "$SMALL_TRACE" ]; then
        fail "itrace record -o $SMALL_TRACE -- ./workload $N wrote no trace"
        it_ok=0; continue
    fi
    if [ -n "$CHECKSUM" ] && [ "$(cat "$SCRATCH/rec$r.out")" != "$CHECKSUM" ]; then
        fail "workload output under itrace differs: '$(head -c 200 "$SCRATCH/rec$r.out")' vs '$CHECKSUM'"
    fi
    if ! "$ITRACE" report "$SMALL_TRACE" --json >"$SCRATCH/small.json" 2>"$SCRATCH/small.json.err" ||
        ! insns=$(json_num "$SCRATCH/small.json" total_instructions); then
        fail "itrace report $SMALL_TRACE --json: no total_instructions: $(tail -n3 "$SCRATCH/small.json.err")"
        it_ok=0; continue
    fi
    IT_INSNS=$insns
    IT_BRANCHES=$(json_num "$SCRATCH/small.json" total_branches || echo n/a)
    IT_TRACE_BYTES=$(stat -c %s "$SMALL_TRACE")
    IT_RATES+=("$(calc "$insns / ($t1 - $t0)")")
done
# best_of / median_of NAME: of the array NAME (n/a if empty)
best_of() { local -n a=$1; if [ ${#a[@]} -gt 0 ]; then printf '%s\n' "${a[@]}" | best || echo n/a; else echo n/a; fi; }
median_of() { local -n a=$1; if [ ${#a[@]} -gt 0 ]; then printf '%s\n' "${a[@]}" | median || echo n/a; else echo n/a; fi; }
RAW_RATE=$(best_of RAW_RATES) RAW_MED=$(median_of RAW_RATES)
RAWU_RATE=$(best_of RAWU_RATES) RAWU_MED=$(median_of RAWU_RATES)
IT_MED=$(median_of IT_RATES)
IT_RATE=$(best_of IT_RATES)
[ "$it_ok" = 1 ] || IT_RATE=n/a
# ratio A B: A / B with two decimals, or n/a
ratio2() { case "$1$2" in *n/a*|'') echo n/a ;; *) printf '%.2f' "$(calc "$1 / $2")" ;; esac; }
REC_RATIO=$(ratio2 "$IT_RATE" "$RAW_RATE")

# ---------------------------------------------------------------- big trace
BIG_TRACE=$SCRATCH/big.itr
BIG_NOTE=""
BIG_REC_RATE=n/a
POST_TRACE=""
if [ "$it_ok" = 1 ] && [ "$IT_RATE" != n/a ]; then
    mode_args=()
    help=$("$ITRACE" record --help 2>&1) || true
    if grep -q continuous <<<"$help"; then
        mode_args=(--mode continuous)
    fi
    iters=$(calci "($BIG_BRANCHES + 2) / 3")            # call, ret, jne per iteration
    want_insns=$(calc "$BASE_STEPS + $BR_PER_ITER * $iters")
    projected=$(calc "$want_insns / $IT_RATE")
    if awk "BEGIN { exit !($projected > $BIG_BUDGET) }"; then
        iters=$(calci "($BIG_BUDGET * $IT_RATE - $BASE_STEPS) / $BR_PER_ITER")
        BIG_NOTE="scaled down to fit BENCH_BIG_BUDGET=${BIG_BUDGET}s"
        want_insns=$(calc "$BASE_STEPS + $BR_PER_ITER * $iters")
        projected=$(calc "$want_insns / $IT_RATE")
    fi
    if [ "$iters" -gt 0 ] && [ "$(calci "$iters * 3")" -gt "$(calci "${IT_BRANCHES/n\/a/0} * 2")" ]; then
        say "recording the post-processing trace: ${mode_args[*]:-} ./workload $iters branchy" \
            "(~$(calci "$want_insns") instructions, ~$(calci "$projected")s at the measured rate)"
        t0=$(now)
        limit=$(calci "$BIG_BUDGET * 3 + 30")
        timeout "$limit" "$ITRACE" record "${mode_args[@]}" -o "$BIG_TRACE" \
            -- ./workload "$iters" branchy >"$SCRATCH/big.out" 2>"$SCRATCH/big.err"
        rc=$?
        t1=$(now)
        if [ $rc -ne 0 ]; then
            fail "itrace record ${mode_args[*]:-} -o $BIG_TRACE -- ./workload $iters branchy ($(exit_desc $rc "$limit")): $(tail -n3 "$SCRATCH/big.err")"
        elif ! "$ITRACE" report "$BIG_TRACE" --json >"$SCRATCH/big.json" 2>"$SCRATCH/big.json.err" ||
            ! big_insns=$(json_num "$SCRATCH/big.json" total_instructions); then
            fail "itrace report $BIG_TRACE --json: $(tail -n3 "$SCRATCH/big.json.err")"
        else
            BIG_REC_RATE=$(calc "$big_insns / ($t1 - $t0)")
            POST_TRACE=$BIG_TRACE
            POST_JSON=$SCRATCH/big.json
            POST_DESC="${mode_args[*]:+${mode_args[*]} }./workload $iters branchy"
        fi
    else
        BIG_NOTE="not enough time for a larger trace; reusing the recording trace"
    fi
    if [ -z "$POST_TRACE" ]; then
        POST_TRACE=$SMALL_TRACE
        POST_JSON=$SCRATCH/small.json
        POST_DESC="./workload $N (the recording trace)"
    fi
fi

# ---------------------------------------------------------------- post-processing
ARC_RATE=n/a ARC_RATE_WALL=n/a REP_RATE=n/a REP_RATE_WALL=n/a
POST_RECORDS=n/a POST_INSNS=n/a POST_BYTES=n/a
# post_time NAME ARGS...: run itrace ARGS with stdout to /dev/null, REPS times;
# sets PT_CORE (median records/s per core) and PT_WALL (median records/s)
post_time() {
    local name=$1; shift
    local per_core=() wall_rates=() r t0 t1 rc wall cpu
    for ((r = 1; r <= REPS; r++)); do
        say "post-processing, repetition $r/$REPS: itrace $*"
        t0=$(now)
        timeout 120 /usr/bin/time -f '%U %S' -o "$SCRATCH/$name$r.time" \
            "$ITRACE" "$@" >/dev/null 2>"$SCRATCH/$name$r.err"
        rc=$?
        t1=$(now)
        if [ $rc -ne 0 ]; then
            fail "itrace $* ($(exit_desc $rc 120)): $(grep -v '^Command exited' "$SCRATCH/$name$r.err" | tail -n3)"
            return 1
        fi
        wall=$(calc "$t1 - $t0")
        cpu=$(cpu_of "$SCRATCH/$name$r.time")
        # single-threaded: per core = per wall second; if it used more than
        # one core, divide by the CPU time instead.
        per_core+=("$(calc "$POST_RECORDS / ($wall > $cpu ? $wall : $cpu)")")
        wall_rates+=("$(calc "$POST_RECORDS / $wall")")
        # a very slow run is measured once
        awk "BEGIN { exit !($wall > 20) }" && break
    done
    PT_CORE=$(printf '%s\n' "${per_core[@]}" | median)
    PT_WALL=$(printf '%s\n' "${wall_rates[@]}" | median)
}
if [ -n "$POST_TRACE" ]; then
    POST_RECORDS=$(json_num "$POST_JSON" total_branches) || {
        fail "no total_branches in the report of $POST_TRACE"; POST_RECORDS=n/a; }
    POST_INSNS=$(json_num "$POST_JSON" total_instructions || echo n/a)
    POST_BYTES=$(stat -c %s "$POST_TRACE")
    if [ "$POST_RECORDS" != n/a ] && [ "$POST_RECORDS" -gt 0 ]; then
        post_time arc arc "$POST_TRACE" && ARC_RATE=$PT_CORE ARC_RATE_WALL=$PT_WALL
        post_time report report "$POST_TRACE" --json && REP_RATE=$PT_CORE REP_RATE_WALL=$PT_WALL
    fi
fi

# ---------------------------------------------------------------- table
ratio() { # ratio VALUE TARGET
    case "$1" in n/a|'') echo n/a ;; *) printf '%.2f' "$(calc "$1 / $2")" ;; esac
}
T_TOTAL=$(calc "$(now) - $T_START")
{
echo
echo "== itrace benchmark =="
echo "machine:  $CPU_MODEL$VIRT, nproc $NPROC, Linux $KERNEL"
echo "itrace:   $ITRACE"
echo
echo "recording: ./workload $N (mix), $REPS alternating runs of each, wall clock;"
echo "  the baseline is the raw loop pinned as itrace pins itself (tracer and tracee on CPU $PIN_CPU)"
printf '  %-44s %14s %14s %20s\n' "" "instr/s, best" "median" "best vs pinned raw"
printf '  %-44s %14s %14s %20s\n' "raw ptrace single-step loop, pinned (CPU $PIN_CPU)" "$(fmt "$RAW_RATE")" \
    "$(fmt "$RAW_MED")" "$(ratio2 "$RAW_RATE" "$RAW_RATE")"
printf '  %-44s %14s %14s %20s\n' "raw ptrace single-step loop, unpinned" "$(fmt "$RAWU_RATE")" \
    "$(fmt "$RAWU_MED")" "$(ratio2 "$RAWU_RATE" "$RAW_RATE")"
printf '  %-44s %14s %14s %20s   (target >= %s)\n' "itrace record" "$(fmt "$IT_RATE")" "$(fmt "$IT_MED")" \
    "$REC_RATIO" "$RECORD_TARGET"
echo "  itrace record is $REC_RATIO of the pinned raw loop (the baseline)," \
    "and $(ratio2 "$IT_RATE" "$RAWU_RATE")x the unpinned one (not a fair baseline: its tracer and tracee wake each other across CPUs)"
echo "  instructions: raw_step ${RAW_STEPS:-n/a} steps, itrace total_instructions ${IT_INSNS:-n/a}" \
    "(difference $( [ -n "$RAW_STEPS" ] && [ -n "$IT_INSNS" ] && echo $((IT_INSNS - RAW_STEPS)) || echo n/a))"
echo "  trace: ${IT_BRANCHES:-n/a} branch records, ${IT_TRACE_BYTES:-n/a} bytes"
echo
echo "post-processing: ${POST_DESC:-n/a}"
echo "  trace: $POST_RECORDS records (total_branches), $POST_INSNS instructions, $POST_BYTES bytes" \
    "${BIG_NOTE:+($BIG_NOTE)}"
[ "$BIG_REC_RATE" != n/a ] && echo "  (recorded at $(fmt "$BIG_REC_RATE") instr/s, one run)"
printf '  %-30s %14s %14s %10s\n' "median of $REPS" "records/s/core" "records/s" "vs target"
printf '  %-30s %14s %14s %10s   (target >= %s records/s/core)\n' "itrace arc > /dev/null" \
    "$(fmt "$ARC_RATE")" "$(fmt "$ARC_RATE_WALL")" "$(ratio "$ARC_RATE" "$ARC_TARGET")" "$(fmt "$ARC_TARGET")"
printf '  %-30s %14s %14s\n' "itrace report --json" "$(fmt "$REP_RATE")" "$(fmt "$REP_RATE_WALL")"
echo
echo "benchmark took $(printf '%.0f' "$T_TOTAL") s"
if [ ${#FAILS[@]} -gt 0 ]; then
    echo "FAILED to run (${#FAILS[@]}):"
    printf '  - %s\n' "${FAILS[@]}"
fi
}
[ ${#FAILS[@]} -eq 0 ]
