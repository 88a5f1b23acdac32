#!/usr/bin/env bash
# itrace benchmark of the translating recorder (`itrace record --backend translate`, issue 28),
# against baselines run in this same invocation:
#   - bench/workload.c sized so that it runs about BENCH_NATIVE_SECONDS natively: native,
#     --backend translate (trace written to a file), valgrind --tool=callgrind
#     --collect-jumps=yes, --backend qemu, Frida's Stalker delivering every block event
#     (bench/frida_stalker.py), and --step block on a much smaller size (rates compared);
#   - real programs (gzip -c, sort, sha256sum on generated inputs, small and large): native,
#     translate, qemu, and --step block on the small inputs;
#   - memory: the maximum RSS of itrace and of the traced program at two trace lengths (x1, x4).
# Each configuration runs BENCH_REPS times, alternating; the best run is compared, medians are
# printed too. Instruction counts come from `itrace report --json` (total_instructions) of the
# same run, callgrind's from its own output, Frida's from its callback (instructions of each
# block event). A benchmark, not a test: it exits non-zero only if something failed to run
# (or a traced program's output differed from its native output). See bench/README.md.
# Knobs (environment):
#   BENCH_REPS=3               runs of each configuration
#   BENCH_NATIVE_SECONDS=1     size the workload for a native run this long
#   BENCH_N=                   workload iterations (overrides BENCH_NATIVE_SECONDS)
#   BENCH_BLOCK_N=1000         workload iterations under --step block
#   BENCH_BLOCK_REPS=          runs of each --step block configuration (default BENCH_REPS)
#   BENCH_MEM_N=               workload iterations of the memory run x1 (default N/4; x4 is 4 times it)
#   BENCH_TIMEOUT=900          seconds allowed to any one run
#   BENCH_NO_FRIDA=1           skip Frida (otherwise it is pip-installed into target/frida-venv if
#                              `import frida` fails, and the script says so)
#   BENCH_NO_CARGO=1           don't run cargo build (use the existing binaries)
#   ITRACE=path                itrace binary (default target/release/itrace)
#   ITRACE_QEMU_PLUGIN=path    the qemu plugin (default: built next to itrace by cargo)
#   BENCH_OUT=dir              where the C programs are built (default bench/build)
#   BENCH_KEEP=1               keep the scratch directory (traces, logs) in target/
set -u -o pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
OUT=${BENCH_OUT:-$HERE/build}
REPS=${BENCH_REPS:-3}
BLOCK_REPS=${BENCH_BLOCK_REPS:-$REPS}
NATIVE_SECONDS=${BENCH_NATIVE_SECONDS:-1}
BLOCK_N=${BENCH_BLOCK_N:-1000}
LIMIT=${BENCH_TIMEOUT:-900}
ITRACE=${ITRACE:-$ROOT/target/release/itrace}

FAILS=()
fail() { echo "bench: FAILED: $*" >&2; FAILS+=("$*"); }
say() { echo "bench: $*" >&2; }
now() { date +%s.%N; }
calc() { awk "BEGIN { x = ($1); printf \"%.6g\n\", x }"; }
calci() { awk "BEGIN { x = ($1); printf \"%d\n\", x }"; }
best_max() { grep . | sort -g | awk '{ x = $1 } END { if (NR == 0) exit 1; print x }'; }
best_min() { grep . | sort -g | awk 'NR == 1 { print $1 }'; }
median() {
    grep . | sort -g | awk '{ a[++n] = $1 } END { if (n == 0) exit 1;
        if (n % 2) print a[(n + 1) / 2]; else print (a[n / 2] + a[n / 2 + 1]) / 2 }'
}
fmt() { # integer with thousands separators, or n/a
    case "${1:-}" in ''|n/a) echo n/a ;; *) printf '%.0f' "$1" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta' ;; esac
}
# fmtm RATE: millions with one decimal (M), or n/a
fmtm() { case "${1:-}" in ''|n/a) echo n/a ;; *) printf '%.1f M' "$(calc "$1 / 1e6")" ;; esac; }
# fsec SECONDS: with three decimals, or n/a
fsec() { case "${1:-}" in ''|n/a) echo n/a ;; *) printf '%.3f' "$1" ;; esac; }
# rate_of INSNS SECONDS: INSNS / SECONDS, or n/a
rate_of() { case "${1:-}|${2:-}" in *n/a*|'|'*|*'|') echo n/a ;; *) calc "$1 / $2" ;; esac; }
# ratio A B: A / B with two decimals, or n/a
ratio() { case "${1:-}|${2:-}" in *n/a*|'|'*|*'|') echo n/a ;; *) printf '%.2f' "$(calc "$1 / $2")" ;; esac; }
json_num() { # json_num FILE FIELD: a top-level number of a JSON object
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2" 2>/dev/null |
        grep -E '^[0-9.]+$'
}
# stats NAME: "best median" of the numbers collected in the file $S/NAME.vals; best is the
# largest for rates (NAME ending in _rate), the smallest otherwise (times, sizes)
stats() {
    local f=$S/$1.vals b m
    [ -s "$f" ] || { echo "n/a n/a"; return; }
    case $1 in *_rate) b=$(best_max <"$f") ;; *) b=$(best_min <"$f") ;; esac
    m=$(median <"$f")
    echo "$b $m"
}
add() { echo "$2" >>"$S/$1.vals"; } # add NAME VALUE
best() { stats "$1" | awk '{ print $1 }'; }
med() { stats "$1" | awk '{ print $2 }'; }
last() { [ -s "$S/$1.vals" ] && tail -n1 "$S/$1.vals" || echo n/a; }

mkdir -p "$ROOT/target"
S=$(mktemp -d "$ROOT/target/translate-bench.XXXXXX")
cleanup() { if [ "${BENCH_KEEP:-0}" = 1 ]; then say "kept $S"; else rm -rf "$S"; fi; }
trap cleanup EXIT
T_START=$(now)

# ---------------------------------------------------------------- tools and build
for t in gcc valgrind qemu-x86_64 /usr/bin/time timeout gzip sort sha256sum python3; do
    command -v "$t" >/dev/null || { fail "$t is not installed (scripts/install-test-deps.sh)"; exit 1; }
done
if [ "${BENCH_NO_CARGO:-0}" != 1 ]; then
    pkgs=(-p itrace)
    [ -n "${ITRACE_QEMU_PLUGIN:-}" ] || pkgs+=(-p itrace-qemu-plugin)
    say "cargo build --release ${pkgs[*]}"
    (cd "$ROOT" && cargo build --release "${pkgs[@]}") || fail "cargo build --release ${pkgs[*]}"
fi
[ -x "$ITRACE" ] || { fail "no itrace binary at $ITRACE"; exit 1; }
mkdir -p "$OUT"
say "gcc: workload (static, as for the other tracers; dynamic, for Frida)"
gcc -O1 -static -Wall -o "$OUT/workload" "$HERE/workload.c" || { fail "gcc workload.c"; exit 1; }
gcc -O1 -Wall -o "$OUT/workload-dyn" "$HERE/workload.c" || { fail "gcc workload.c (dynamic)"; exit 1; }

FRIDA_PY=""
if [ "${BENCH_NO_FRIDA:-0}" != 1 ]; then
    if python3 -c 'import frida' 2>/dev/null; then
        FRIDA_PY=python3
    elif [ -x "$ROOT/target/frida-venv/bin/python" ] &&
        "$ROOT/target/frida-venv/bin/python" -c 'import frida' 2>/dev/null; then
        FRIDA_PY=$ROOT/target/frida-venv/bin/python
    else
        say "frida is not installed: installing it (pip install frida) into $ROOT/target/frida-venv"
        if python3 -m venv "$ROOT/target/frida-venv" &&
            "$ROOT/target/frida-venv/bin/pip" install -q frida; then
            FRIDA_PY=$ROOT/target/frida-venv/bin/python
        else
            fail "pip install frida (into $ROOT/target/frida-venv)"
        fi
    fi
fi

cd "$OUT" || exit 1
CPU_MODEL=$(sed -n '/^model name[[:space:]]*:[[:space:]]*/{s///p;q;}' /proc/cpuinfo)
VIRT=""
grep -qw hypervisor /proc/cpuinfo && VIRT=" (virtual machine)"
LOADS=()
load_now() { LOADS+=("$(cut -d' ' -f1 /proc/loadavg)"); }
load_now

# ---------------------------------------------------------------- running things
# timed NAME CMD...: one run, stdout to $S/NAME.out, stderr to $S/NAME.err; sets WALL (s,
# measured outside), CPU (user + system of the command and the children it waited for) and
# RSS (KB, the largest of the command and those children). False (and a failure noted) if it
# did not exit 0 within the time limit.
timed() {
    local name=$1 t0 t1 rc; shift
    t0=$(now)
    timeout "$LIMIT" /usr/bin/time -f '%U %S %M' -o "$S/$name.time" "$@" >"$S/$name.out" 2>"$S/$name.err"
    rc=$?
    t1=$(now)
    WALL=$(calc "$t1 - $t0")
    CPU=$(awk 'NF == 3 { printf "%.3f\n", $1 + $2 }' "$S/$name.time" 2>/dev/null)
    RSS=$(awk 'NF == 3 { print $3 }' "$S/$name.time" 2>/dev/null)
    if [ $rc -ne 0 ]; then
        local why="exit $rc"
        [ $rc -eq 124 ] && why="timed out after ${LIMIT}s"
        fail "$* ($why): $(grep -v '^Command exited' "$S/$name.err" | tail -n3)"
        return 1
    fi
}
# insns_of TRACE: total_instructions of an itrace trace
insns_of() {
    "$ITRACE" report --json "$1" >"$1.json" 2>"$1.json.err" && json_num "$1.json" total_instructions && return
    fail "itrace report --json $1: $(tail -n3 "$1.json.err")"
    return 1
}
branches_of() { json_num "$1.json" total_branches || echo n/a; }
# same_output NAME: the run's stdout is the native run's ($S/NAME.native)
same_output() {
    cmp -s "$S/$1.out" "$S/$2.expect" ||
        fail "$1: the program's output differs from its native run ($(head -c 120 "$S/$1.out" | tr '\n' ' '))"
}
# itrace_run KEY NAME ARGS -- CMD...: itrace record ARGS -o TRACE -- CMD; adds KEY_wall, KEY_cpu,
# KEY_rate (instructions / wall), KEY_insns, KEY_rss, KEY_bytes, KEY_branches
itrace_run() {
    local key=$1 name=$2 tr; shift 2
    local args=()
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    tr=$S/$name.itr
    rm -f "$tr" "$tr.json"
    timed "$name" "$ITRACE" record "${args[@]}" -o "$tr" -- "$@" || return 1
    local n
    n=$(insns_of "$tr") || return 1
    add "${key}_wall" "$WALL"; add "${key}_cpu" "$CPU"; add "${key}_rss" "$RSS"
    add "${key}_rate" "$(calc "$n / $WALL")"
    add "${key}_insns" "$n"
    add "${key}_bytes" "$(stat -c %s "$tr")"
    add "${key}_branches" "$(branches_of "$tr")"
    rm -f "$tr"
}

# ---------------------------------------------------------------- workload size
say "calibrating the workload (native)"
cal=2000000
for _ in 1 2; do timed cal ./workload "$cal" || exit 1; add cal_wall "$WALL"; done
if [ -n "${BENCH_N:-}" ]; then
    N=$BENCH_N
else
    N=$(calci "$cal * $NATIVE_SECONDS / $(best cal_wall)")
    [ "$N" -ge 1000 ] || N=1000
fi
MEM_N=${BENCH_MEM_N:-$(calci "$N / 4")}
say "workload: N=$N (native ~${NATIVE_SECONDS}s), --step block N=$BLOCK_N, memory N=$MEM_N and $((MEM_N * 4))"
timed expect ./workload "$N" || exit 1
cp "$S/expect.out" "$S/wl.expect"
timed expect ./workload "$BLOCK_N" || exit 1
cp "$S/expect.out" "$S/wlb.expect"

# ---------------------------------------------------------------- workload runs
for ((r = 1; r <= REPS; r++)); do
    load_now
    say "workload, run $r/$REPS: native"
    timed wl_native ./workload "$N" && { same_output wl_native wl; add wl_native_wall "$WALL"; }
    say "workload, run $r/$REPS: itrace --backend translate"
    itrace_run wl_tr wl_tr --backend translate -- ./workload "$N" && same_output wl_tr wl
    say "workload, run $r/$REPS: valgrind --tool=callgrind --collect-jumps=yes"
    if timed wl_cg valgrind --tool=callgrind --collect-jumps=yes --callgrind-out-file="$S/cg.out" ./workload "$N"; then
        same_output wl_cg wl
        n=$(awk '/^(summary|totals):/ { print $2; exit }' "$S/cg.out")
        if [ -n "$n" ]; then
            add wl_cg_wall "$WALL"; add wl_cg_cpu "$CPU"; add wl_cg_insns "$n"; add wl_cg_rate "$(calc "$n / $WALL")"
        else
            fail "no instruction count in callgrind's output"
        fi
        rm -f "$S/cg.out"
    fi
    say "workload, run $r/$REPS: itrace --backend qemu"
    itrace_run wl_qemu wl_qemu --backend qemu -- ./workload "$N" && same_output wl_qemu wl
    if [ -n "$FRIDA_PY" ]; then
        say "workload, run $r/$REPS: Frida Stalker, every block event (dynamic build)"
        if timed wl_frida "$FRIDA_PY" "$HERE/frida_stalker.py" ./workload-dyn "$N"; then
            fs=$(json_num "$S/wl_frida.out" seconds) fb=$(json_num "$S/wl_frida.out" blocks)
            fi_=$(json_num "$S/wl_frida.out" instructions)
            if [ -n "$fs" ] && [ -n "$fb" ] && [ -n "$fi_" ] && [ "$fb" -gt 0 ]; then
                grep -qxF "$(cat "$S/wl.expect")" "$S/wl_frida.err" ||
                    fail "workload under Frida: output differs ($(tail -n2 "$S/wl_frida.err"))"
                add wl_frida_wall "$WALL"; add wl_frida_secs "$fs"; add wl_frida_blocks "$fb"; add wl_frida_insns "$fi_"
                add wl_frida_rate "$(calc "$fi_ / $fs")"
                add wl_frida_blocks_rate "$(calc "$fb / $fs")"
            else
                fail "frida_stalker.py: no counts: $(tail -n3 "$S/wl_frida.err")"
            fi
        fi
    fi
    if ((r <= BLOCK_REPS)); then
        say "workload, run $r/$REPS: itrace --step block (N=$BLOCK_N)"
        itrace_run wl_blk wl_blk --backend ptrace --step block -- ./workload "$BLOCK_N" && same_output wl_blk wlb
        say "workload, run $r/$REPS: itrace --backend translate (N=$BLOCK_N, the same run as --step block)"
        itrace_run wl_trs wl_trs --backend translate -- ./workload "$BLOCK_N" && same_output wl_trs wlb
    fi
done

# ---------------------------------------------------------------- real programs
say "generating the inputs of the real programs"
python3 - "$S" <<'EOF'
import random, sys
d = sys.argv[1]
rng = random.Random(28)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
         for _ in range(3000)]
def text(size):
    out, n = [], 0
    while n < size:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n"
        out.append(line); n += len(line)
    return "".join(out)[:size]
open(d + "/text20k", "w").write(text(20_000))
open(d + "/text2m", "w").write(text(2_000_000))
for n, name in ((3000, "lines3k"), (100_000, "lines100k")):
    open(d + "/" + name, "w").write("".join("%s %d\n" % (rng.choice(words), rng.randrange(10**9))
                                            for _ in range(n)))
EOF
[ -s "$S/lines100k" ] || { fail "generating the inputs"; exit 1; }
# name | small (block-stepped too) | command
PROGS=(
    "gzip -c 20 KB|1|/usr/bin/gzip -c $S/text20k"
    "gzip -c 2 MB|0|/usr/bin/gzip -c $S/text2m"
    "sort 3,000 lines|1|/usr/bin/sort $S/lines3k"
    "sort 100,000 lines|0|/usr/bin/sort $S/lines100k"
    "sha256sum 20 KB|1|/usr/bin/sha256sum $S/text20k"
    "sha256sum 2 MB|0|/usr/bin/sha256sum $S/text2m"
)
for i in "${!PROGS[@]}"; do
    IFS='|' read -r pname small pcmd <<<"${PROGS[$i]}"
    read -r -a argv <<<"$pcmd"
    timed "p${i}_expect" "${argv[@]}" || continue
    cp "$S/p${i}_expect.out" "$S/p$i.expect"
    for ((r = 1; r <= REPS; r++)); do
        load_now
        blk=""; [ "$small" = 1 ] && ((r <= BLOCK_REPS)) && blk=", --step block"
        say "$pname, run $r/$REPS: native, translate, qemu$blk"
        timed "p${i}_native" "${argv[@]}" && add "p${i}_native_wall" "$WALL"
        itrace_run "p${i}_tr" "p${i}_tr" --backend translate -- "${argv[@]}" && same_output "p${i}_tr" "p$i"
        itrace_run "p${i}_qemu" "p${i}_qemu" --backend qemu -- "${argv[@]}" && same_output "p${i}_qemu" "p$i"
        if [ "$small" = 1 ] && ((r <= BLOCK_REPS)); then
            itrace_run "p${i}_blk" "p${i}_blk" --backend ptrace --step block -- "${argv[@]}" &&
                same_output "p${i}_blk" "p$i"
        fi
    done
done

# ---------------------------------------------------------------- memory
# mem_run KEY N: one translate run of ./workload N, sampling the peak RSS (VmHWM) of itrace
# and of the traced program from /proc every 50 ms while it runs.
mem_run() {
    local key=$1 n=$2 ipid kid hw_i=0 hw_k=0 v rc t0 t1
    rm -f "$S/mem.itr"
    t0=$(now)
    "$ITRACE" record --backend translate -o "$S/mem.itr" -- ./workload "$n" >"$S/$key.out" 2>"$S/$key.err" &
    ipid=$!
    while kill -0 "$ipid" 2>/dev/null; do
        v=$(awk '/^VmHWM:/ { print $2 }' "/proc/$ipid/status" 2>/dev/null)
        [ -n "$v" ] && [ "$v" -gt "$hw_i" ] && hw_i=$v
        for kid in $(cat /proc/"$ipid"/task/*/children 2>/dev/null); do
            v=$(awk '/^VmHWM:/ { print $2 }' "/proc/$kid/status" 2>/dev/null)
            [ -n "$v" ] && [ "$v" -gt "$hw_k" ] && hw_k=$v
        done
        sleep 0.05
    done
    wait "$ipid"
    rc=$?
    t1=$(now)
    if [ $rc -ne 0 ]; then
        fail "itrace record --backend translate -- ./workload $n (memory run, exit $rc): $(tail -n3 "$S/$key.err")"
        return 1
    fi
    local insns
    insns=$(insns_of "$S/mem.itr") || return 1
    add "${key}_itrace_kb" "$hw_i"; add "${key}_tracee_kb" "$hw_k"
    add "${key}_insns" "$insns"; add "${key}_bytes" "$(stat -c %s "$S/mem.itr")"
    add "${key}_wall" "$(calc "$t1 - $t0")"
    rm -f "$S/mem.itr" "$S/mem.itr.json"
}
load_now
say "memory: itrace --backend translate, ./workload $MEM_N and $((MEM_N * 4))"
mem_run mem1 "$MEM_N"
mem_run mem4 "$((MEM_N * 4))"
load_now

# ---------------------------------------------------------------- table
T_TOTAL=$(calc "$(now) - $T_START")
LOAD_RANGE=$(printf '%s\n' "${LOADS[@]}" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo "-" hi }')
row() { printf '  %-50s %14s %9s %9s %14s %14s\n' "$@"; }
{
echo
echo "== itrace --backend translate benchmark =="
echo "machine: $CPU_MODEL$VIRT, nproc $(nproc), Linux $(uname -r); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "load average (1 min) during the runs: $LOAD_RANGE; best of $REPS runs (--step block: $BLOCK_REPS), medians in the rate column's second figure"
echo
echo "workload.c (-O1 -static), N=$N: $(fmt "$(last wl_tr_insns)") instructions, $(fmt "$(last wl_tr_branches)") taken branches (translate's trace)"
row "" "instructions" "wall" "cpu" "instr/s best" "median"
row "native (translate's count / native wall)" "$(fmt "$(last wl_tr_insns)")" "$(fsec "$(best wl_native_wall)")" "" \
    "$(fmtm "$(rate_of "$(last wl_tr_insns)" "$(fsec "$(best wl_native_wall)")")")" \
    "$(fmtm "$(rate_of "$(last wl_tr_insns)" "$(med wl_native_wall)")")"
row "itrace --backend translate (trace to disk)" "$(fmt "$(last wl_tr_insns)")" "$(fsec "$(best wl_tr_wall)")" "$(best wl_tr_cpu)" \
    "$(fmtm "$(best wl_tr_rate)")" "$(fmtm "$(med wl_tr_rate)")"
row "valgrind --tool=callgrind --collect-jumps=yes" "$(fmt "$(last wl_cg_insns)")" "$(fsec "$(best wl_cg_wall)")" "$(best wl_cg_cpu)" \
    "$(fmtm "$(best wl_cg_rate)")" "$(fmtm "$(med wl_cg_rate)")"
row "itrace --backend qemu (trace to disk)" "$(fmt "$(last wl_qemu_insns)")" "$(fsec "$(best wl_qemu_wall)")" "$(best wl_qemu_cpu)" \
    "$(fmtm "$(best wl_qemu_rate)")" "$(fmtm "$(med wl_qemu_rate)")"
if [ -n "$FRIDA_PY" ]; then
    row "Frida Stalker, every block event (from main)" "$(fmt "$(last wl_frida_insns)")" "$(fsec "$(best wl_frida_secs)")" "" \
        "$(fmtm "$(best wl_frida_rate)")" "$(fmtm "$(med wl_frida_rate)")"
    echo "    Frida: $(fmt "$(last wl_frida_blocks)") block events, $(fmtm "$(best wl_frida_blocks_rate)") block events/s at best"
fi
row "itrace --step block, N=$BLOCK_N" "$(fmt "$(last wl_blk_insns)")" "$(fsec "$(best wl_blk_wall)")" "$(best wl_blk_cpu)" \
    "$(fmtm "$(best wl_blk_rate)")" "$(fmtm "$(med wl_blk_rate)")"
row "itrace --backend translate, N=$BLOCK_N" "$(fmt "$(last wl_trs_insns)")" "$(fsec "$(best wl_trs_wall)")" "$(best wl_trs_cpu)" \
    "$(fmtm "$(best wl_trs_rate)")" "$(fmtm "$(med wl_trs_rate)")"
TR=$(best wl_tr_rate)
echo "  translate vs --step block (rates):   $(ratio "$TR" "$(best wl_blk_rate)")x  (target >= 100)"
echo "    at the same N=$BLOCK_N:                $(ratio "$(best wl_trs_rate)" "$(best wl_blk_rate)")x"
echo "  translate vs callgrind (rates):      $(ratio "$TR" "$(best wl_cg_rate)")x  (target >= 5; the qemu plugin: $(ratio "$(best wl_qemu_rate)" "$(best wl_cg_rate)")x here)"
echo "    by cpu time (callgrind cpu / translate cpu, itrace and the program): $(ratio "$(best wl_cg_cpu)" "$(best wl_tr_cpu)")x"
echo "  translate wall / native wall:        $(ratio "$(fsec "$(best wl_tr_wall)")" "$(fsec "$(best wl_native_wall)")")x  (stretch target <= 10)"
echo "  translate vs Frida Stalker (instr/s): $(ratio "$TR" "$(best wl_frida_rate)")x  (target > 1)"
echo "  instruction counts: translate $(last wl_tr_insns), qemu $(last wl_qemu_insns), callgrind $(last wl_cg_insns), Frida (from main) $(last wl_frida_insns);" \
    "at N=$BLOCK_N: translate $(last wl_trs_insns), --step block $(last wl_blk_insns)"
echo
echo "real programs (Debian's, dynamic): wall seconds best of $REPS and instructions/s (translate's count over each wall time)"
printf '  %-20s %13s %8s %9s %13s %9s %13s %9s %13s %9s %9s\n' "program" "instructions" "native" \
    "translate" "instr/s" "qemu" "instr/s" "block" "instr/s" "tr/block" "tr/native"
for i in "${!PROGS[@]}"; do
    IFS='|' read -r pname small _ <<<"${PROGS[$i]}"
    trr=$(best "p${i}_tr_rate") blr=$(best "p${i}_blk_rate") trb=""
    if [ "$small" = 1 ]; then
        trb=$(ratio "$trr" "$blr")
    elif ((i > 0)); then
        # Block stepping the large input would take minutes: its rate is the small input's.
        trb="$(ratio "$trr" "$(best "p$((i - 1))_blk_rate")")*"
    fi
    printf '  %-20s %13s %8s %9s %13s %9s %13s %9s %13s %9s %9s\n' "$pname" "$(fmt "$(last "p${i}_tr_insns")")" \
        "$(fsec "$(best "p${i}_native_wall")")" "$(fsec "$(best "p${i}_tr_wall")")" "$(fmtm "$trr")" \
        "$(fsec "$(best "p${i}_qemu_wall")")" "$(fmtm "$(best "p${i}_qemu_rate")")" \
        "$(fsec "$(best "p${i}_blk_wall")")" "$(fmtm "$blr")" "$trb" \
        "$(ratio "$(best "p${i}_tr_wall")" "$(best "p${i}_native_wall")")"
done
echo "  * translate's rate on the large input over --step block's on the same program's small one"
echo "    (block stepping the large input takes minutes; rates are compared, as for the workload)"
echo "  instruction counts (translate / qemu / --step block):"
for i in "${!PROGS[@]}"; do
    IFS='|' read -r pname _ _ <<<"${PROGS[$i]}"
    a=$(last "p${i}_tr_insns") b=$(last "p${i}_qemu_insns") c=$(last "p${i}_blk_insns")
    d=n/a
    [ "$a" != n/a ] && [ "$b" != n/a ] && d=$((a - b))
    echo "    $pname: $a / $b / $c (translate - qemu: $d)"
done
echo "  target: translate >= 100x --step block's rate (tr/block; the small inputs are mostly start-up)"
echo
echo "memory (itrace --backend translate, trace to disk; peak RSS sampled from /proc every 50 ms):"
printf '  %-28s %15s %9s %14s %16s %14s\n' "" "instructions" "wall" "trace bytes" "itrace max RSS" "tracee max RSS"
for k in mem1 mem4; do
    n=$MEM_N; [ $k = mem4 ] && n=$((MEM_N * 4))
    printf '  %-28s %15s %9s %14s %13s KB %11s KB\n' "./workload $n" "$(fmt "$(last ${k}_insns)")" "$(fsec "$(last ${k}_wall)")" \
        "$(fmt "$(last ${k}_bytes)")" "$(fmt "$(last ${k}_itrace_kb)")" "$(fmt "$(last ${k}_tracee_kb)")"
done
echo "  x4 / x1: itrace $(ratio "$(last mem4_itrace_kb)" "$(last mem1_itrace_kb)"), tracee $(ratio "$(last mem4_tracee_kb)" "$(last mem1_tracee_kb)")  (target: constant, ~1.00)"
echo "  (/usr/bin/time's max RSS of the translate runs above, itrace or tracee: $(fmt "$(best wl_tr_rss)") KB)"
echo
echo "total time of the benchmark: $(printf '%.0f' "$T_TOTAL") s"
if [ ${#FAILS[@]} -gt 0 ]; then
    echo
    echo "FAILED (${#FAILS[@]}):"
    printf '  - %s\n' "${FAILS[@]}"
fi
}
[ ${#FAILS[@]} -eq 0 ]
