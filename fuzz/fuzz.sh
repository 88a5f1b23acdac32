#!/usr/bin/env bash
# Build and run the libFuzzer targets of fuzz/ with the stable toolchain: the
# sanitizer-coverage instrumentation libFuzzer feeds on is plain -C flags (what cargo-fuzz
# passes with --sanitizer none), and libfuzzer-sys builds libFuzzer itself with the C++
# compiler. No nightly, no cargo-fuzz. See fuzz/README.md.
#
#   fuzz/fuzz.sh build                      build every target (release, debug assertions on)
#   fuzz/fuzz.sh run TARGET [SECS] [ARGS]   fuzz TARGET for SECS seconds (default 300) from its corpus
#                                           (fuzz/corpus/trace or fuzz/corpus/decode) and the inputs of
#                                           fixed findings (fuzz/regressions/trace or decode), new inputs to
#                                           fuzz/corpus-work/TARGET, crashes to fuzz/artifacts/TARGET;
#                                           ARGS go to libFuzzer after the corpus directories (-fork=1,
#                                           more seed directories, ...)
#   fuzz/fuzz.sh merge trace|decode [DIRS]  minimise the corpus plus the corpus-work of its targets (and
#                                           DIRS) into a new fuzz/corpus/trace or decode: what covers arc,
#                                           then what adds to report, then to trace_reader (inputs up to
#                                           FUZZ_MERGE_MAX_BYTES, default 32768)
#   fuzz/fuzz.sh repro TARGET FILES...      run TARGET once on each file (a crash shows its stack)
#   fuzz/fuzz.sh targets                    list the targets
#   fuzz/fuzz.sh corpus TARGET              the committed corpus directory TARGET runs on
#
# Environment: FUZZ_NICE (default 19): niceness of run and merge; FUZZ_OUT: for run, a directory
# that gets the new inputs (FUZZ_OUT/new) and crash artifacts (FUZZ_OUT/artifacts) instead.
set -euo pipefail
FUZZ=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARGETS=(trace_reader arc report decode)

die() { echo "fuzz.sh: $*" >&2; exit 1; }

# Longest input per target: a trace of a small program, or one instruction with its ISA and address.
max_len() {
    case "$1" in
        trace_reader | arc | report) echo 65536 ;;
        decode) echo 32 ;;
        *) die "unknown target '$1' (targets: ${TARGETS[*]})" ;;
    esac
}

# The committed corpus of a target: the three trace targets read the same inputs and share one.
corpus_of() {
    case "$1" in
        trace_reader | arc | report) echo trace ;;
        decode) echo decode ;;
        *) die "unknown target '$1' (targets: ${TARGETS[*]})" ;;
    esac
}

host=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p') || true
[ -n "$host" ] || die "rustc not found: install a Rust toolchain (rustup, stable)"
BIN_DIR="$FUZZ/target/$host/release"

build() {
    command -v c++ >/dev/null 2>&1 \
        || die "no C++ compiler (c++): libfuzzer-sys compiles libFuzzer with it; install g++ (scripts/install-test-deps.sh does)"
    # --target keeps these flags off build scripts and proc macros, which are not linked with libFuzzer.
    local flags=(
        -Cpasses=sancov-module
        -Cllvm-args=-sanitizer-coverage-level=4
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
        -Cllvm-args=-sanitizer-coverage-pc-table
        -Cllvm-args=-sanitizer-coverage-trace-compares
        -Cllvm-args=-sanitizer-coverage-stack-depth
        -Cllvm-args=-simplifycfg-branch-fold-threshold=0
        --cfg fuzzing
    )
    RUSTFLAGS="${flags[*]}" cargo build --release --manifest-path "$FUZZ/Cargo.toml" --target "$host" --bins
}

bin() {
    local t=$1
    max_len "$t" >/dev/null
    [ -x "$BIN_DIR/$t" ] || die "$BIN_DIR/$t is not built: run fuzz/fuzz.sh build"
    echo "$BIN_DIR/$t"
}

# libFuzzer options every run gets.
common_opts() {
    echo "-max_len=$(max_len "$1") -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1"
}

run() {
    local t=$1 secs=${2:-300}
    shift $(($# < 2 ? $# : 2))
    local b
    b=$(bin "$t")
    local work="$FUZZ/corpus-work/$t" artifacts="$FUZZ/artifacts/$t"
    if [ -n "${FUZZ_OUT:-}" ]; then
        work="$FUZZ_OUT/new" artifacts="$FUZZ_OUT/artifacts"
    fi
    local dirs=("$work" "$FUZZ/corpus/$(corpus_of "$t")")
    [ -d "$FUZZ/regressions/$(corpus_of "$t")" ] && dirs+=("$FUZZ/regressions/$(corpus_of "$t")")
    mkdir -p "${dirs[@]}" "$artifacts"
    # An empty working directory: module paths in fuzzed traces are looked up relative to it.
    local scratch
    scratch=$(mktemp -d)
    local rc=0
    # shellcheck disable=SC2046 # the options are words
    (cd "$scratch" && exec nice -n "${FUZZ_NICE:-19}" "$b" $(common_opts "$t") -max_total_time="$secs" \
        -artifact_prefix="$artifacts/" "${dirs[@]}" "$@") || rc=$?
    rm -rf "$scratch"
    return $rc
}

merge() {
    local c=$1
    shift
    local targets
    case "$c" in
        trace) targets=(arc report trace_reader) ;;
        decode) targets=(decode) ;;
        *) die "unknown corpus '$c' (trace, decode)" ;;
    esac
    local new="$FUZZ/corpus/$c.new" scratch t b d
    rm -rf "$new"
    mkdir -p "$new" "$FUZZ/corpus/$c"
    scratch=$(mktemp -d)
    local sources=("$FUZZ/corpus/$c")
    for t in "${targets[@]}"; do
        [ -d "$FUZZ/corpus-work/$t" ] && sources+=("$FUZZ/corpus-work/$t")
    done
    # Inputs over FUZZ_MERGE_MAX_BYTES (default 32 KiB) stay out of the committed corpus: long
    # branch streams that add a few edges each would make it several times bigger.
    local max_bytes=${FUZZ_MERGE_MAX_BYTES:-32768}
    mkdir "$scratch/in"
    for d in "${sources[@]}" "$@"; do
        find "$d" -maxdepth 1 -type f -size -"$((max_bytes + 1))"c -exec cp -t "$scratch/in" {} +
    done
    # The first target keeps what covers its code; each next one adds what covers more of its own.
    # Edges only (-use_counters=0): inputs that differ only in how often a loop runs stay in the
    # long runs' own corpora, and the committed one stays small.
    for t in "${targets[@]}"; do
        b=$(bin "$t")
        # shellcheck disable=SC2046
        (cd "$scratch" && nice -n "${FUZZ_NICE:-19}" "$b" $(common_opts "$t") -use_counters=0 -merge=1 "$new" "$scratch/in")
    done
    rm -rf "$scratch" "$FUZZ/corpus/$c"
    mv "$new" "$FUZZ/corpus/$c"
    echo "fuzz.sh: corpus/$c: $(find "$FUZZ/corpus/$c" -type f | wc -l) files, $(du -sb "$FUZZ/corpus/$c" | cut -f1) bytes"
}

repro() {
    local t=$1
    shift
    local b
    b=$(bin "$t")
    # shellcheck disable=SC2046
    "$b" $(common_opts "$t") -runs=1 "$@"
}

cmd=${1:-}
shift || true
case "$cmd" in
    build) build ;;
    run) [ $# -ge 1 ] || die "usage: fuzz.sh run TARGET [SECS] [LIBFUZZER-ARGS]"; run "$@" ;;
    merge) [ $# -ge 1 ] || die "usage: fuzz.sh merge trace|decode [DIRS]"; merge "$@" ;;
    repro) [ $# -ge 2 ] || die "usage: fuzz.sh repro TARGET FILES..."; repro "$@" ;;
    targets) printf '%s\n' "${TARGETS[@]}" ;;
    corpus) [ $# -eq 1 ] || die "usage: fuzz.sh corpus TARGET"; echo "$FUZZ/corpus/$(corpus_of "$1")" ;;
    *) die "usage: fuzz.sh build | run TARGET [SECS] [ARGS] | merge trace|decode [DIRS] | repro TARGET FILES... | targets" ;;
esac
