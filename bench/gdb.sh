#!/usr/bin/env bash
# Stepping rate through a GDB stub: itrace's GDB recorder (`itrace record
# --qemu ARCH`) against a minimal client that only steps (bench/gdb_step.py)
# over the same kind of connection to the same qemu-user stub, on the same
# program. Prints instructions per second for both and the ratio.
#
# usage: bench/gdb.sh [ARCH]   (s390x by default, or i386)
# Not ppc64le/ppc64: the minimal client steps blindly, and stepping malloc's
# lwarx...stwcx. loop never completes (itrace steps over it with breakpoints).
# Needs: qemu-user, python3, the cross compilers of scripts/install-test-deps.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ARCH="${1:-s390x}"
case "$ARCH" in s390x|i386) ;; *) echo "bench/gdb.sh: ARCH must be s390x or i386" >&2; exit 2;; esac
OUT=bench/build/cross
make -s -C tests/programs/cross OUT="$PWD/$OUT" "$PWD/$OUT/$ARCH-libc"
cargo build --release -q -p itrace
PROG="$PWD/$OUT/$ARCH-libc"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# itrace: wall time of the whole recording (start-up of qemu and symbols included).
t0=$(date +%s.%N)
target/release/itrace record --qemu "$ARCH" -o "$TMP/t.itr" -- "$PROG" >/dev/null 2>"$TMP/itrace.err"
t1=$(date +%s.%N)
# counts from the report's JSON, not from the wording of itrace's summary line
insns=$(target/release/itrace report --json "$TMP/t.itr" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["total_instructions"])')
itrace_rate=$(echo "$insns / ($t1 - $t0)" | bc)
# The same instructions over the stepping alone (first to last trace record, from the trace's
# own timestamps), which is what the minimal client's rate measures.
span=$(target/release/itrace dump "$TMP/t.itr" | grep -v ' mte ' | grep -o 'ts: [0-9]*\|^0x[0-9a-f]* cpu[0-9]* [0-9]*' \
    | grep -o '[0-9]*$' | sort -n | sed -n '1p;$p' | tr '\n' ' ' | awk '{print ($2 - $1) / 1e9}')
step_rate=$(echo "$insns / $span" | bc)

# The minimal client: one `s` per instruction, nothing else.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
env -i "qemu-$ARCH" -g "$port" "$PROG" >/dev/null &
qpid=$!
for _ in $(seq 100); do
    grep -q ":$(printf '%04X' "$port") 00000000:0000 0A" /proc/net/tcp && break
    sleep 0.05
done
read -r steps secs < <(python3 bench/gdb_step.py "127.0.0.1:$port")
wait "$qpid" || true
client_rate=$(echo "$steps / $secs" | bc)

echo "program:        $ARCH-libc ($insns instructions traced, $steps steps by the minimal client)"
echo "itrace:         $itrace_rate instructions/s (whole recording: qemu start-up, module table, records)"
echo "itrace:         $step_rate instructions/s (stepping only: first to last record of the trace)"
echo "minimal client: $client_rate steps/s (bench/gdb_step.py: s and acks only)"
echo "ratio:          $(echo "scale=2; $step_rate / $client_rate" | bc) (itrace stepping / minimal client; whole recording $(echo "scale=2; $itrace_rate / $client_rate" | bc))"
