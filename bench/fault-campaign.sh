#!/usr/bin/env bash
# The fault-injection campaign of issue 14: the test tests/tests/fault_injection.rs at
# FAULT_RUNS runs per scenario and signal (default 100), then the one case itrace cannot
# answer, measured: SIGKILL of every itrace process at once (`pkill -9 itrace`, a kill of the
# process group, the OOM killer choosing the recorder), while attached to a program.
# A measurement, not a test: it exits non-zero only if something failed to run.
#   FAULT_RUNS=100        runs per cell of the test's table
#   FAULT_RESIDUAL_RUNS=30  runs of the kill-everything case
#   ITRACE_FAULT_SEED=N   replay the test's random delays
set -u -o pipefail
export LC_ALL=C
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
RUNS=${FAULT_RUNS:-100}
RESIDUAL=${FAULT_RESIDUAL_RUNS:-30}
cd "$ROOT" || exit 1

echo "== the fault-injection test, $RUNS runs per scenario and signal"
cargo build --workspace -q || exit 1
ITRACE_FAULT_RUNS=$RUNS cargo test -q -p itrace-tests --test fault_injection -- --nocapture 2>&1 |
    awk '/^fault injection:|^\|/ || /failed runs|^[a-z].* SIG[A-Z]+ after/'

echo
echo "== SIGKILL of every itrace process at once while attached ($RESIDUAL runs)"
ITRACE=$ROOT/target/debug/itrace
SPINNER=$ROOT/target/test-programs/spinner
[ -x "$SPINNER" ] || { echo "fault-campaign: $SPINNER missing (the test above builds it)"; exit 1; }
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
harmed=0
for i in $(seq 1 "$RESIDUAL"); do
    "$SPINNER" 40 10000 >"$SCRATCH/out" &
    target=$!
    sleep 0.05
    setsid "$ITRACE" record -o "$SCRATCH/t.itr" -p "$target" 2>/dev/null &
    itrace=$!
    sleep "0.$((RANDOM % 4 + 1))"
    # The process group setsid made: the supervisor and the recorder.
    kill -9 -- "-$itrace" 2>/dev/null
    wait "$target"
    status=$?
    if [ "$status" -ne 0 ]; then harmed=$((harmed + 1)); fi
    wait "$itrace" 2>/dev/null
done
echo "targets harmed: $harmed of $RESIDUAL (a ptrace tracer's death leaves the trap flag set; see the README)"
