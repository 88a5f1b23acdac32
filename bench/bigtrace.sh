#!/usr/bin/env bash
# itrace benchmark of a large trace: record bench/workload.c branchy under --backend qemu for
# BIGTRACE_N iterations (about 3 taken branches and 3.3 trace bytes each: the default makes
# a trace of about 1 GB), then time `itrace report --json`, `itrace flamegraph --folded` and
# `itrace export --format callgrind` of it, each with its peak resident memory
# (/usr/bin/time's %M). A small trace of the same program (BIGTRACE_N / 100) is read the
# same way first: the two peaks side by side show whether memory grows with the trace's
# length (it should not: a reader holds the distinct call stacks, not the records).
# A benchmark, not a test: it exits non-zero only if something failed to run.
# Knobs: BIGTRACE_N (330000000), ITRACE (default target/release/itrace), BENCH_NO_CARGO=1,
#   BENCH_OUT (where the workload is built), BIGTRACE_DIR (where the traces go; default a
#   temporary directory under /tmp, removed at the end; it needs about 1.1 GB).
set -u -o pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${BENCH_OUT:-$HERE/build}
ITRACE=${ITRACE:-$ROOT/target/release/itrace}
N=${BIGTRACE_N:-330000000}
say() { echo "bench: $*" >&2; }
die() { echo "bench: FAILED: $*" >&2; exit 1; }

for t in gcc qemu-x86_64 /usr/bin/time; do command -v $t >/dev/null || die "$t is not installed (scripts/install-test-deps.sh)"; done
if [ "${BENCH_NO_CARGO:-0}" != 1 ]; then
    say "cargo build --release -p itrace -p itrace-qemu-plugin"
    (cd "$ROOT" && cargo build --release -p itrace -p itrace-qemu-plugin) || die "cargo build"
fi
mkdir -p "$OUT"
gcc -O1 -static -o "$OUT/workload" "$HERE/workload.c" || die "building the workload"
if [ -n "${BIGTRACE_DIR:-}" ]; then
    SCRATCH=$BIGTRACE_DIR
    mkdir -p "$SCRATCH"
else
    SCRATCH=$(mktemp -d /tmp/itrace-bigtrace.XXXXXX)
    trap 'rm -rf "$SCRATCH"' EXIT
fi

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, $(uname -r)"
printf '  %-12s %-30s %10s %14s %9s %9s %12s\n' trace command wall_s branches user_s sys_s max_rss_KiB
for n in $((N / 100)) "$N"; do
    t=$SCRATCH/w$n.itr
    /usr/bin/time -f '%e %U %S %M' -o "$SCRATCH/time" "$ITRACE" record --backend qemu -o "$t" -- "$OUT/workload" "$n" branchy \
        >/dev/null 2>"$SCRATCH/err" || die "record: $(tail -1 "$SCRATCH/err")"
    read -r wall user sys rss <"$SCRATCH/time"
    bytes=$(stat -c %s "$t")
    printf '  %-12s %-30s %10s %14s %9s %9s %12s\n' "$((bytes / 1048576)) MiB" "record --backend qemu" "$wall" "" "$user" "$sys" "$rss"
    for cmd in "report --json" "flamegraph --folded" "export --format callgrind"; do
        # shellcheck disable=SC2086 # the command's words
        /usr/bin/time -f '%e %U %S %M' -o "$SCRATCH/time" "$ITRACE" $cmd "$t" >"$SCRATCH/out" 2>"$SCRATCH/err" ||
            die "$cmd: $(tail -1 "$SCRATCH/err")"
        read -r wall user sys rss <"$SCRATCH/time"
        # The report says how many taken branches the trace holds.
        [ "$cmd" = "report --json" ] && branches=$(grep -m1 -o '"total_branches": [0-9]*' "$SCRATCH/out" | grep -o '[0-9]*$')
        printf '  %-12s %-30s %10s %14s %9s %9s %12s\n' "$((bytes / 1048576)) MiB" "$cmd" "$wall" "${branches:-?}" "$user" "$sys" "$rss"
    done
    rm -f "$t"
done
