#!/usr/bin/env bash
# The project's one test command: dependencies, formatting, lints, tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { echo; echo "=== test.sh: $*"; }

step "scripts/install-test-deps.sh"
scripts/install-test-deps.sh
# it refreshed the package lists: kmod-shim/test-in-guest.sh need not do it again
export ITRACE_APT_LISTS_FRESH=1

# the CI machines have 2 cores
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# the end-to-end tests run target/<profile>/itrace and link libitrace.so: build them
step "cargo build --workspace"
cargo build --workspace

step "cargo test --workspace --no-fail-fast"
cargo test --workspace --no-fail-fast

step "scripts/fuzz-smoke.sh (fuzz/: each libFuzzer target 15 s on its corpus)"; scripts/fuzz-smoke.sh

# the kernel module, in a booted guest (QEMU TCG; never loaded on this machine)
step "kmod-shim/test-in-guest.sh"
kmod-shim/test-in-guest.sh

step "all passed"
