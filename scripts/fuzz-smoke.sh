#!/usr/bin/env bash
# Fuzz smoke test: build the libFuzzer targets of fuzz/ (stable toolchain, fuzz/fuzz.sh build)
# and run each for FUZZ_SMOKE_SECS seconds (default 15; FUZZ_SMOKE_JOBS of them at once, default 2) on its committed corpus
# (fuzz/corpus/trace for trace_reader, arc and report; fuzz/corpus/decode), the inputs of
# fixed findings (fuzz/regressions/) first. Any crash, timeout or out-of-memory fails it with one line naming the
# target and the input, saved under fuzz/artifacts/TARGET/. Nothing in the tree changes
# otherwise: new inputs go to a temporary directory. Long runs: fuzz/README.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "fuzz-smoke: $*"; }
fail() { echo "fuzz-smoke: FAILED: $*" >&2; exit 1; }

for tool in cargo rustc; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool not found: install a Rust toolchain (rustup, stable)"
done
command -v c++ >/dev/null 2>&1 \
    || fail "no C++ compiler (c++): libfuzzer-sys builds libFuzzer with it; install g++ (scripts/install-test-deps.sh does)"

secs=${FUZZ_SMOKE_SECS:-15}
# The targets run FUZZ_SMOKE_JOBS at a time (default: the CPU count, at most 2): each libFuzzer
# run is one process on one CPU for its SECS seconds, so two side by side each get what one
# alone gets (the 2-core CI machines had one CPU idle for 4 x 15 s). Results in target order.
jobs=${FUZZ_SMOKE_JOBS:-$(($(nproc) < 2 ? 1 : 2))}
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || fail "FUZZ_SMOKE_JOBS=$jobs: expected a number of runs at once, 1 or more"
start=$(date +%s)
log "building the targets (fuzz/fuzz.sh build)"
fuzz/fuzz.sh build || fail "the fuzz targets do not build (fuzz/fuzz.sh build)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One target's run: its line (or its failure, with the log's tail) in $tmp/TARGET.result,
# status 0 or 1.
smoke_one() {
    local t=$1 corpus out rc=0 artifact saved runs regressions fixed
    corpus=$(fuzz/fuzz.sh corpus "$t")
    [ -n "$(ls -A "$corpus" 2>/dev/null)" ] || { echo "FAILED: $t: no committed corpus in $corpus"; return 1; }
    out=$tmp/$t
    FUZZ_NICE=0 FUZZ_OUT=$out fuzz/fuzz.sh run "$t" "$secs" >"$tmp/$t.log" 2>&1 || rc=$?
    artifact=$(find "$out/artifacts" -type f 2>/dev/null | head -n 1)
    if [ "$rc" -ne 0 ] || [ -n "$artifact" ]; then
        tail -n 40 "$tmp/$t.log"
        if [ -n "$artifact" ]; then
            mkdir -p "fuzz/artifacts/$t"
            cp "$artifact" "fuzz/artifacts/$t/"
            saved=fuzz/artifacts/$t/$(basename "$artifact")
            echo "FAILED: $t: $(basename "$artifact" | cut -d- -f1) on input $saved (exit $rc; reproduce: fuzz/fuzz.sh repro $t $saved)"
            return 1
        fi
        echo "FAILED: $t: libFuzzer exited $rc without saving an input (log above)"
        return 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/$t.log")
    regressions=fuzz/regressions/$(basename "$corpus")
    fixed=$(find "$regressions" -type f 2>/dev/null | wc -l)
    echo "$t: ${runs:-?} inputs in ${secs} s from $(find "$corpus" -type f | wc -l) corpus files and $fixed inputs of fixed findings, no crash"
}

mapfile -t targets < <(fuzz/fuzz.sh targets)
failed=0
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
    batch=("${targets[@]:i:jobs}")
    pids=()
    for t in "${batch[@]}"; do
        smoke_one "$t" >"$tmp/$t.result" 2>&1 &
        pids+=($!)
    done
    for k in "${!batch[@]}"; do
        t=${batch[k]}
        if wait "${pids[k]}"; then
            log "$(cat "$tmp/$t.result")"
        else
            sed '$d' "$tmp/$t.result" >&2
            echo "fuzz-smoke: $(tail -n 1 "$tmp/$t.result")" >&2
            failed=1
        fi
    done
done
[ "$failed" -eq 0 ] || exit 1
log "passed in $(($(date +%s) - start)) s"
