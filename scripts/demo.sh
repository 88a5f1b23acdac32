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
# Every filter reads the file itself (no pipelines: under pipefail an early-exiting reader
# would kill its writer with SIGPIPE). The header: the leading comment lines (at most 11).
awk '!/^#/ || NR > 11 { exit } { print }' "$out/demo.arc"
# Then 31 records from the first one in main (or from the first record if main has none).
awk '!/^#/ { rec[++n] = $0; if (!first && / main:/) first = n; if (first && n >= first + 30) exit }
     END { if (!first) { print "(no record in main; the first records:)"; first = 1 }
           for (i = first; i <= n && i <= first + 30; i++) print rec[i] }' "$out/demo.arc"
echo
echo "== itrace report $out/demo.itr --top 12"
target/release/itrace report "$out/demo.itr" --top 12
