#!/usr/bin/env bash
# The project's one test command: dependencies, formatting, lints, tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each step prints the wall time since the start; at the end (pass or fail) a summary of the
# steps' durations, so a CI log shows where the time went.
test_sh_start=$(date +%s)
step_names=()
step_starts=()
step() {
    step_names+=("$*")
    step_starts+=("$(date +%s)")
    echo
    echo "=== test.sh [+$((step_starts[-1] - test_sh_start)) s]: $*"
}
step_summary() {
    local rc=$? now i end
    cross_build_stop
    now=$(date +%s)
    echo
    echo "=== test.sh: time per step (exit $rc after $((now - test_sh_start)) s)"
    for i in "${!step_names[@]}"; do
        end=${step_starts[i + 1]:-$now}
        printf '=== test.sh: %6d s  %s\n' "$((end - step_starts[i]))" "${step_names[i]}"
    done
}
trap step_summary EXIT
# a signal ends the script through its EXIT trap too (the background build below is ended there)
trap 'exit 130' INT
trap 'exit 143' TERM

# The static PowerPC64 and s390x itrace the guest tests need (scripts/cross-build.sh: release
# builds of the crate graph for two more targets, some 400 s of both CPUs, the longest part of
# those tests) can be built in the background from the fuzz smoke test on, at nice 19, into
# target/cross-build-background.log, with ITRACE_CROSS_BACKGROUND=1. Off by default: in a
# fresh-clone CI run (2026-11-27) it saved the guests 290 s but cost the fuzz smoke test and
# the kmod guest's preparation (its static itrace build) 440 s more, and left that guest with
# less room under its time limit. It locks target/release and target/TRIPLE/release; the
# ppc64le step waits for it; if it failed, the guest scripts' own cross-build.sh calls build
# again and say why.
cross_build_pid=
cross_build_log=target/cross-build-background.log
cross_build_start() {
    [ "${ITRACE_CROSS_BACKGROUND:-0}" != 0 ] || return 0
    mkdir -p target
    # its own session (setsid does not fork here: a background job is no group leader), so that
    # cross_build_stop ends cargo and the compilers with it
    setsid nice -n 19 scripts/cross-build.sh >"$cross_build_log" 2>&1 </dev/null &
    cross_build_pid=$!
    echo "=== test.sh: building the ppc64le and s390x itrace in the background (pid $cross_build_pid, nice 19, log $cross_build_log)"
}
cross_build_wait() {
    [ -n "$cross_build_pid" ] || return 0
    local t0 rc=0
    t0=$(date +%s)
    wait "$cross_build_pid" || rc=$?
    cross_build_pid=
    if [ "$rc" -eq 0 ]; then
        echo "=== test.sh: the background cross build is done (waited $(($(date +%s) - t0)) s)"
    else
        echo "=== test.sh: the background cross build failed (exit $rc); the guest scripts build again. Its log's end:"
        tail -n 20 "$cross_build_log" || true
    fi
}
cross_build_stop() {
    [ -n "$cross_build_pid" ] || return 0
    kill -- "-$cross_build_pid" 2>/dev/null || true
    wait "$cross_build_pid" 2>/dev/null || true
    cross_build_pid=
}

step "scripts/install-test-deps.sh"
scripts/install-test-deps.sh
# it refreshed the package lists: kmod-shim/test-in-guest.sh need not do it again
export ITRACE_APT_LISTS_FRESH=1

# the CI machines have 2 cores
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
# One build from scratch: incremental state would only take disk (CI machines can be short of it).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# the end-to-end tests run target/<profile>/itrace and link libitrace.so: build them, and the
# test binaries in the same command (--all-targets). Built alone, itrace and libitrace.so lacked
# the features the tests' dev-dependencies add to shared crates (flate2, object, ...), so
# `cargo test` built itrace-post, itrace-calib and itrace a second time.
step "cargo build --workspace --all-targets"
cargo build --workspace --all-targets

step "cargo test --workspace --no-fail-fast"
cargo test --workspace --no-fail-fast

# Tests of the fidelity binaries below that are the same in every run, whatever ITRACE_STEP and
# ITRACE_BACKEND say: they pin a recorder of their own (`--backend translate`, `--backend
# inproc`, `--backend qemu`, `--qemu`, `--step block`), or `--emulate-block-step` (the branch-trap
# decoder's test hook: it ignores ITRACE_BACKEND, and ITRACE_STEP=instruction steps it as auto
# does). The runs below skip them; the run above ran them. (tests/tests/oracles.rs, which checks the oracles against each other and
# runs no itrace, is not in them at all.) A renamed test is no longer skipped: it runs again,
# costing time, never coverage.
same_in_every_run=(
    --skip attach_block_stepping --skip attaches_with_a_duration_end
    --skip the_translating_recorder_is_not_pinned --skip an_attach_again_reuses_the_code_cache
    --skip an_attach_leaves_alone_a_region_the_program_replaced
    --skip inproc_backend:: --skip inproc_modes_with_small_buffers
    --skip attach_to_a_program_with_regions_translated
    --skip count_loop_block_step --skip branches_block_step --skip long_loop_block_step
    --skip signal_handler_block_step --skip setjmp_longjmp_block_step --skip threads_block_step
    --skip fork_and_exec_block_step
)

# On x86_64 auto records x86_64 programs with the translating recorder (the run above); the
# fidelity tests again with every instruction stepped by ptrace, against the same oracles.
# `--workspace` (not `-p itrace-tests`): cargo unifies the dependencies' features over the
# packages it is asked for, so `-p itrace-tests` alone rebuilt libc, itrace-format, itrace-post and
# the test binaries with other features (a minute on 2 cores); with --workspace the binaries of
# the run above are reused as they are.
step "fidelity tests with ITRACE_STEP=instruction (the ptrace backend single-stepping)"
ITRACE_STEP=instruction cargo test --workspace --no-fail-fast \
    --test exact_counts --test libc_counts --test examples --test crash --test jit \
    --test modes --test region --test attach --test symbols_lines -- "${same_in_every_run[@]}"

# Block stepping (the ptrace backend's own default, where the probe finds debug registers
# working) must record the same traces: the fidelity tests a third time with it, against the
# same oracles. (A test that passes --backend or --step keeps its own.) Skipped besides: the
# tests that pin `--backend ptrace` with the default step (region's ptrace_backend::, whose
# default is this run's block stepping; attach's a_signal_before_the_attach_stop_is_the_programs,
# which attaches with `--backend translate` and `--backend ptrace`) or `--step instruction`, and inherit's that pin
# qemu, the gdb stub or the in-process recorder. tests/tests/program_traps.rs is not here: it
# runs `--step auto`, `block` and `instruction` each time, and this run's auto is block.
step "fidelity tests with ITRACE_BACKEND=ptrace (block stepping)"
ITRACE_BACKEND=ptrace cargo test --workspace --no-fail-fast \
    --test exact_counts --test libc_counts --test examples --test crash --test jit \
    --test modes --test region --test attach --test symbols_lines --test inherit -- \
    "${same_in_every_run[@]}" --skip ptrace_backend:: --skip ptrace_single_stepping_ \
    --skip a_signal_before_the_attach_stop_is_the_programs \
    --skip qemu_backend_ --skip in_process_backend_ --skip gdb_stub_backend_

# The translating recorder's threads encode their own full rings when two or more run in the
# cache (docs/translate.md, "Threads that encode their own rings"); most tests run one thread.
# The translate tests of threads, signals, forks and flushes again with every thread encoding
# its own rings (ITRACE_XL_SELF_ENCODE=1), against the same oracles (--step instruction's trace).
step "translate tests with ITRACE_XL_SELF_ENCODE=1 (every thread encodes its own rings)"
ITRACE_XL_SELF_ENCODE=1 cargo test --workspace --no-fail-fast --test translate -- \
    thread signal fork flush rseq clone exec

cross_build_start
step "scripts/fuzz-smoke.sh (fuzz/: each libFuzzer target 15 s on its corpus, two at a time)"; scripts/fuzz-smoke.sh
# On CI the fuzz build (about 1 GB) is not needed again: its disk goes to the guest tests.
if [ -n "${CI:-}" ]; then rm -rf fuzz/target; fi

# the kernel module, in a booted guest (QEMU TCG; never loaded on this machine)
step "kmod-shim/test-in-guest.sh"
kmod-shim/test-in-guest.sh

# The native PowerPC64 and s390x recorders, each in a booted guest (QEMU TCG; the scripts build
# the static itrace of their architecture).
step "ppc64le-guest/test-in-guest.sh"
cross_build_wait
ppc64le-guest/test-in-guest.sh
step "s390x-guest/test-in-guest.sh"
s390x-guest/test-in-guest.sh

step "all passed"
