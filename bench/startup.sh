#!/usr/bin/env bash
# Start-up of the translating recorder (docs/translate.md, "Where the time goes"): small real
# programs whose time under `itrace record --backend translate` is mostly the stops that
# translate their code. Each program is recorded with each value of ITRACE_TRANSLATE_AHEAD
# (units translated ahead per stop; 0: none), and with another itrace binary if BENCH_BASE names
# one (an earlier build), alternating, BENCH_REPS times; prints the best and median wall time of
# each, the peak RSS of the largest process of its last run (itrace's, here) and the stops of
# that run (ITRACE_STATS=1). A benchmark, not a test: it exits non-zero only if a run failed or
# its output differed from the program's native output.
# Knobs (environment):
#   BENCH_REPS=7               runs of each configuration
#   BENCH_AHEAD="0 16"         the ITRACE_TRANSLATE_AHEAD values compared
#   BENCH_BASE=path            an itrace binary run too ("base"), e.g. one built before a change
#   ITRACE=path                itrace binary (default target/release/itrace; not built here)
set -u -o pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
REPS=${BENCH_REPS:-7}
AHEAD=${BENCH_AHEAD:-0 16}
ITRACE=${ITRACE:-$ROOT/target/release/itrace}
S=$(mktemp -d "${TMPDIR:-/tmp}/itrace-startup.XXXXXX")
trap 'rm -rf "$S"' EXIT
FAILS=0

[ -x "$ITRACE" ] || { echo "bench: no $ITRACE (cargo build --release -p itrace)" >&2; exit 1; }
cc -O2 -o "$S/workload" "$HERE/workload.c" || exit 1
python3 - "$S" <<'EOF'
import random, sys
d = sys.argv[1]
rng = random.Random(28)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
         for _ in range(3000)]
out, n = [], 0
while n < 20_000:
    line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n"
    out.append(line); n += len(line)
open(d + "/text20k", "w").write("".join(out)[:20_000])
open(d + "/lines3k", "w").write("".join("%s %d\n" % (rng.choice(words), rng.randrange(10**9))
                                        for _ in range(3000)))
EOF
PROGS=(
    "python3 -c pass|python3 -c pass"
    "gzip -c 20 KB|gzip -c $S/text20k"
    "sort 3,000 lines|sort $S/lines3k"
    "sha256sum 20 KB|sha256sum $S/text20k"
    "workload 1|$S/workload 1"
)
stat() { # stat KEY FILE: the number before KEY in the statistics line (-: none)
    grep '^itrace: translate: ' "$2" | grep -e "$1" | sed "s/$1.*//" | awk '{ print $NF }' | tr -d '(' | grep . || echo -
}
median() { sort -g | awk '{ a[++n] = $1 } END { if (n % 2) print a[(n + 1) / 2]; else print (a[n / 2] + a[n / 2 + 1]) / 2 }'; }
CONFIGS=()
[ -n "${BENCH_BASE:-}" ] && CONFIGS+=("base|$BENCH_BASE|")
for a in $AHEAD; do CONFIGS+=("$a|$ITRACE|$a"); done
printf '%-18s %6s %9s %9s %8s %7s %7s %7s %9s %7s\n' program ahead "best s" "median s" "RSS KB" units ahead links "ind.miss" "ret.fill"
for p in "${PROGS[@]}"; do
    name=${p%%|*}; cmd=${p#*|}
    # shellcheck disable=SC2086
    $cmd > "$S/native.out" 2>/dev/null
    for r in $(seq "$REPS"); do
        for c in "${CONFIGS[@]}"; do
            a=${c%%|*}; rest=${c#*|}; bin=${rest%%|*}; ahead=${rest#*|}
            t0=$(date +%s.%N)
            # shellcheck disable=SC2086
            ITRACE_STATS=1 ITRACE_TRANSLATE_AHEAD=$ahead /usr/bin/time -o "$S/time.$a" -f '%M' \
                "$bin" record --backend translate -o "$S/t.itrace" -- $cmd > "$S/out" 2> "$S/err.$a"
            rc=$?
            t1=$(date +%s.%N)
            if [ $rc -ne 0 ] || ! cmp -s "$S/out" "$S/native.out"; then
                echo "bench: FAILED: $name, $a (exit $rc):" >&2; cat "$S/err.$a" >&2; FAILS=$((FAILS + 1))
            fi
            awk "BEGIN { print $t1 - $t0 }" >> "$S/times.$a"
        done
    done
    for c in "${CONFIGS[@]}"; do
        a=${c%%|*}
        printf '%-18s %6s %9.3f %9.3f %8s %7s %7s %7s %9s %7s\n' "$name" "$a" \
            "$(sort -g "$S/times.$a" | head -1)" "$(median < "$S/times.$a")" "$(cat "$S/time.$a")" \
            "$(stat ' units translated' "$S/err.$a")" "$(stat ' ahead of their first run' "$S/err.$a")" \
            "$(stat ' links,' "$S/err.$a")" "$(stat ' indirect misses' "$S/err.$a")" \
            "$(stat ' return addresses put' "$S/err.$a")"
        rm -f "$S/times.$a"
    done
done
[ "$FAILS" -eq 0 ]
