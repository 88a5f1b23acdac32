#!/usr/bin/env bash
# Build itrace, trace the bundled example (examples/demo.c) and show the
# head of its arc file and its report. Needs cargo and gcc.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v gcc >/dev/null || { echo "demo: gcc is needed (apt-get install gcc)" >&2; exit 1; }
cargo build --release -q -p itrace
out=target/demo
mkdir -p "$out"
gcc -g -O1 -o "$out/demo" examples/demo.c
echo "== itrace record -o $out/demo.itr --arc -- $out/demo"
target/release/itrace record -o "$out/demo.itr" --arc -- "$out/demo"
echo
echo "== the arc around main (full file: $out/demo.arc)"
grep -v '^#' "$out/demo.arc" | grep -m1 -n ' main:' | cut -d: -f1 | {
    read -r first
    sed -n '1,11p' "$out/demo.arc"
    grep -v '^#' "$out/demo.arc" | sed -n "$((first)),$((first + 30))p"
}
echo
echo "== itrace report $out/demo.itr --top 12"
target/release/itrace report "$out/demo.itr" --top 12
