#!/usr/bin/env bash
# Fuzz smoke test: build the libFuzzer targets of fuzz/ (stable toolchain, fuzz/fuzz.sh build)
# and run each for FUZZ_SMOKE_SECS seconds (default 15) on its committed corpus
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
start=$(date +%s)
log "building the targets (fuzz/fuzz.sh build)"
fuzz/fuzz.sh build || fail "the fuzz targets do not build (fuzz/fuzz.sh build)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in $(fuzz/fuzz.sh targets); do
    corpus=$(fuzz/fuzz.sh corpus "$t")
    [ -n "$(ls -A "$corpus" 2>/dev/null)" ] || fail "$t: no committed corpus in $corpus"
    out=$tmp/$t
    rc=0
    FUZZ_NICE=0 FUZZ_OUT=$out fuzz/fuzz.sh run "$t" "$secs" >"$tmp/$t.log" 2>&1 || rc=$?
    artifact=$(find "$out/artifacts" -type f 2>/dev/null | head -n 1)
    if [ "$rc" -ne 0 ] || [ -n "$artifact" ]; then
        tail -n 40 "$tmp/$t.log" >&2
        if [ -n "$artifact" ]; then
            mkdir -p "fuzz/artifacts/$t"
            cp "$artifact" "fuzz/artifacts/$t/"
            saved=fuzz/artifacts/$t/$(basename "$artifact")
            fail "$t: $(basename "$artifact" | cut -d- -f1) on input $saved (exit $rc; reproduce: fuzz/fuzz.sh repro $t $saved)"
        fi
        fail "$t: libFuzzer exited $rc without saving an input (log above)"
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/$t.log")
    regressions=fuzz/regressions/$(basename "$corpus")
    fixed=$(find "$regressions" -type f 2>/dev/null | wc -l)
    log "$t: ${runs:-?} inputs in ${secs} s from $(find "$corpus" -type f | wc -l) corpus files and $fixed inputs of fixed findings, no crash"
done
log "passed in $(($(date +%s) - start)) s"
