#!/usr/bin/env bash
# Benchmark of region tracing (issue 3), in one run:
#  - the in-process recorder against a minimal C self-stepping loop (target >= 0.9 of it),
#  - the in-process recorder against the ptrace backend on the same region (expect > 2x),
#  - the cost of an ITraceOn+ITraceOff pair when nobody traces (target < 50 ns).
# Rates are instructions (steps) per second of the region, median of 3 alternating runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${N:-60000}
cargo build --release -q -p itrace -p libitrace
LIB=target/release
mkdir -p bench/build
gcc -O1 -o bench/build/selfstep bench/selfstep.c
gcc -O1 -I libitrace/include -o bench/build/region_workload bench/region_workload.c -L$LIB -litrace -Wl,-rpath,"$(pwd)/$LIB" -Wl,-z,now
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
median() { sort -g | sed -n 2p; }
self=(); inproc=(); ptr=()
for rep in 1 2 3; do
    self+=("$(bench/build/selfstep "$N" | sed 's/.*rate \([0-9.]*\).*/\1/')")
    for b in inproc ptrace; do
        out=$(target/release/itrace record --region --backend "$b" -o "$tmp/$b.itr" -- bench/build/region_workload "$N" 2>/dev/null)
        secs=$(sed 's/.*seconds \([0-9.]*\).*/\1/' <<<"$out")
        insns=$(target/release/itrace report --json "$tmp/$b.itr" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total_instructions"])')
        rate=$(python3 -c "print($insns / $secs)")
        if [ "$b" = inproc ]; then inproc+=("$rate"); else ptr+=("$rate"); fi
    done
done
s=$(printf '%s\n' "${self[@]}" | median); i=$(printf '%s\n' "${inproc[@]}" | median); p=$(printf '%s\n' "${ptr[@]}" | median)
pairs=$(for r in 1 2 3; do bench/build/region_workload pairs 20000000 | sed 's/.*ns_per_pair \([0-9.]*\).*/\1/'; done | median)
echo
echo "== region tracing benchmark (work($N), median of 3; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
printf '  %-42s %14.0f instr/s\n' "minimal C self-stepping loop" "$s"
printf '  %-42s %14.0f instr/s   %.2f of self-stepping (target >= 0.9)\n' "itrace --region --backend inproc" "$i" "$(python3 -c "print($i/$s)")"
printf '  %-42s %14.0f instr/s   inproc is %.2fx ptrace (expect > 2x)\n' "itrace --region --backend ptrace" "$p" "$(python3 -c "print($i/$p)")"
printf '  %-42s %14.2f ns       (target < 50 ns)\n' "ITraceOn+ITraceOff pair, untraced" "$pairs"
