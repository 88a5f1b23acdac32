#!/usr/bin/env bash
# itrace benchmark of trace reading (issue 30 §3): the commands that read a trace, run by the
# itrace under test and by a baseline itrace given by path, on the same trace, in one
# invocation. A benchmark, not a test: it exits non-zero only if something failed to run or
# the two binaries' outputs differ (every total must be the same to the instruction).
#
# The trace: python3 with json and re under `--backend qemu` (about 160 M instructions, 22 M
# taken branches), recorded by the binary under test unless BENCH_TRACE names one. Each
# command runs BENCH_REPS times per binary, alternating; the binary under test runs it twice
# each time, first with no index beside the trace (TRACE.itrace-idx, which `report` writes:
# removed before) and then again (a second query, which a report answers from the index);
# the best wall time is compared (a
# loaded machine only ever slows a run down), and the CPU time (user + system) of that run
# is printed too: on a machine other jobs load, the wall time of a two-thread read depends on
# the CPU it gets. The load average is printed before and after.
#
# Usage: bench/read.sh BASELINE_ITRACE
# Knobs (environment):
#   ITRACE=path              the itrace under test (default target/release/itrace)
#   ITRACE_QEMU_PLUGIN=path  its qemu plugin (default: next to it)
#   BENCH_TRACE=file         read this trace instead of recording one
#   BENCH_PYTHON=path        the python3 to record (default: `python3`'s sys.executable)
#   BENCH_N=1000             size of the python workload
#   BENCH_REPS=3             runs of each command per binary
#   BENCH_KEEP=1             keep the scratch directory
set -u -o pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
BASE=${1:?usage: bench/read.sh BASELINE_ITRACE, e.g. a release build of main}
NEW=${ITRACE:-$ROOT/target/release/itrace}
REPS=${BENCH_REPS:-3}
N=${BENCH_N:-1000}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/itrace-read-bench.XXXXXX")
[ -n "${BENCH_KEEP:-}" ] || trap 'rm -rf "$SCRATCH"' EXIT
FAILED=0
say() { echo "bench: $*" >&2; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

for b in "$BASE" "$NEW"; do [ -x "$b" ] || { say "no executable $b"; exit 2; }; done

TRACE=${BENCH_TRACE:-}
if [ -z "$TRACE" ]; then
    PY=${BENCH_PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
    TRACE=$SCRATCH/py.itr
    say "recording $PY (json, re; n=$N) under --backend qemu into $TRACE"
    "$NEW" record --backend qemu -o "$TRACE" -- "$PY" -c "import json,re
d=[{'a':i,'b':str(i)*3} for i in range($N)]
s=json.dumps(d)
x=json.loads(s)
print(len(re.findall(r'\d+',s)))" >/dev/null 2>"$SCRATCH/record.err" || { cat "$SCRATCH/record.err" >&2; exit 1; }
    tail -n1 "$SCRATCH/record.err" >&2
fi
# The function annotate looks at: the most self instructions in the report.
HOT=$("$NEW" report --json "$TRACE" 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
f = max(r["functions"], key=lambda f: f["self"])
print(f["name"])') || { say "cannot read the report of $TRACE"; exit 1; }

COMMANDS=(
    "info"
    "report"
    "report --tree"
    "report --callers $HOT"
    "annotate $HOT"
    "flamegraph --folded"
    "export --format callgrind"
)

# run BIN CMD OUT: one run; prints "wall cpu" seconds.
run() {
    local bin=$1 cmd=$2 out=$3
    # shellcheck disable=SC2086 # the command's words
    /usr/bin/time -o "$SCRATCH/time" -f '%e %U %S' "$bin" ${cmd%% *} "$TRACE" ${cmd#* } \
        >"$out" 2>"$SCRATCH/err" || { cat "$SCRATCH/err" >&2; return 1; }
    awk '{ printf "%s %.2f\n", $1, $2 + $3 }' "$SCRATCH/time"
}

echo "trace: $TRACE ($(stat -c %s "$TRACE") bytes); $("$NEW" info "$TRACE" | grep '^taken branches' | cut -d';' -f1)"
echo "baseline: $BASE"
echo "new:      $NEW"
echo "load average before: $(load) on $(nproc) CPUs; best of $REPS"
echo "new first: with no index beside the trace (removed before the run); new second: the same command right after"
printf '\n%-44s %9s %9s %9s %9s %9s %9s %7s %7s  %s\n' command "base wall" "base cpu" "1st wall" "1st cpu" "2nd wall" "2nd cpu" "1st" "2nd" output
# better CUR BEST: CUR is a smaller wall time than BEST (or BEST is unset).
better() { [ -z "$2" ] || awk "BEGIN { exit !($1 < $2) }"; }
for cmd in "${COMMANDS[@]}"; do
    # "info" and "report" take the trace last: the words after the command go first.
    [ "$cmd" = "${cmd#* }" ] && cmd="$cmd "
    best_b="" best_1="" best_2="" cpu_b="" cpu_1="" cpu_2=""
    for _ in $(seq "$REPS"); do
        if r=$(run "$BASE" "$cmd" "$SCRATCH/out.base"); then
            set -- $r
            if better "$1" "$best_b"; then best_b=$1 cpu_b=$2; fi
        else
            say "base: $cmd failed"; FAILED=1
        fi
        rm -f "$TRACE.itrace-idx"
        if r=$(run "$NEW" "$cmd" "$SCRATCH/out.first"); then
            set -- $r
            if better "$1" "$best_1"; then best_1=$1 cpu_1=$2; fi
        else
            say "new: $cmd failed"; FAILED=1
        fi
        if r=$(run "$NEW" "$cmd" "$SCRATCH/out.second"); then
            set -- $r
            if better "$1" "$best_2"; then best_2=$1 cpu_2=$2; fi
        else
            say "new (second): $cmd failed"; FAILED=1
        fi
    done
    same=identical
    for which in first second; do
        if ! cmp -s "$SCRATCH/out.base" "$SCRATCH/out.$which"; then
            same=DIFFERENT
            FAILED=1
            diff "$SCRATCH/out.base" "$SCRATCH/out.$which" | head -5 >&2
        fi
    done
    # /usr/bin/time counts in hundredths: a faster run is counted as 0.01 s.
    ratio() { awk "BEGIN { n = $2; if (n < 0.01) n = 0.01; printf \"%s%.1fx\", ($2 < 0.01 ? \">\" : \"\"), $1 / n }"; }
    printf '%-44s %9s %9s %9s %9s %9s %9s %7s %7s  %s\n' "${cmd% }" "$best_b" "$cpu_b" "$best_1" "$cpu_1" "$best_2" "$cpu_2" \
        "$(ratio "${best_b:-0}" "${best_1:-0}")" "$(ratio "${best_b:-0}" "${best_2:-0}")" "$same"
done
rm -f "$TRACE.itrace-idx"
echo
echo "load average after: $(load)"
exit $FAILED
