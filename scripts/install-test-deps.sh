#!/usr/bin/env bash
# Installs the Debian packages the test suite needs. Refreshes the package
# lists first (apt-get update), then installs what is missing; packages
# already installed are left alone, except the kernel headers, which follow
# Debian's current kernel ABI and version (scripts/kernel-abi.sh). Works as
# root (CI) or through sudo.
set -euo pipefail

# package                 used for
PACKAGES=(
    gcc                   # test programs (tests/programs, post-arc tests)
    g++                   # C++ symbol tests (post-arc)
    make                  # tests/programs/Makefile
    libc6-dev             # headers and crt files for the libc test programs
    binutils              # objdump, nm, addr2line, readelf, objcopy, strip
    qemu-user             # qemu-x86_64 and qemu-ARCH: the instruction-sequence oracle; --qemu tracing
    valgrind              # callgrind: the per-function count oracle (+ callgrind.h)
    gdbserver             # a real GDB stub for the --gdb recorder tests
    strace                # a second tracer for the "already traced" test
    file                  # identifying binaries when debugging failures
    coreutils             # env -i, sleep, stty, seq
    bsdutils              # script: a pseudo-terminal for the status line test (tests/status_line.rs)
    mount                 # mount/umount of a small tmpfs for the disk-full test
    chromium              # renders a flame graph SVG headless: screenshot and DOM (tests/views.rs)
    libc6-dbg             # separate debug info of libc (post-arc symbol tests)
    gcc-powerpc64-linux-gnu  # big-endian ELFv1 and ELF32 symbol tests (post-arc); ppc64 cross tests
    libc6-dev-ppc64-cross    # static glibc for the ppc64 cross test program
    gcc-powerpc64le-linux-gnu  # ppc64le cross test programs (tests/programs/cross)
    libc6-dev-ppc64el-cross  # static glibc for them
    gcc-s390x-linux-gnu      # s390x cross test programs
    libc6-dev-s390x-cross
    gcc-i686-linux-gnu       # 32-bit x86 test programs (gcc-multilib conflicts with the cross compilers)
    libc6-dev-i386-cross
    bc                    # bench/run.sh arithmetic
    qemu-system-x86       # kmod-shim/test-in-guest.sh: boots Debian's kernel with the module (TCG)
    busybox-static        # the guest's initramfs
    xz-utils              # extracting vmlinux from vmlinuz
    python3.11-minimal    # /usr/bin/python3.11: a large stripped program (tests/tests/stripped.rs)
    qemu-system-ppc       # ppc64le-guest/test-in-guest.sh: the native PowerPC64 recorder in a pseries guest (TCG)
    debuginfod            # a real debuginfod server on loopback (tests/tests/debuginfod.rs)
    python3-pip           # pip for DuckDB's Python package (below), when python3 is Debian's
)

# Debian's Rust at one version (bookworm-security has had newer amd64 builds than the foreign
# archives' standard libraries): scripts/cross-build.sh builds the static PowerPC64
# little-endian and s390x itrace with it, from those architectures' libstd-rust-web-dev, which it
# downloads and unpacks (never installs: a foreign libc6 here would be found by qemu-user's
# dynamic loader before the cross sysroot's). Their package lists need the architectures.
RUST_DEBIAN_VERSION=1.85.0+dfsg3-1~deb12u3
RUST_FOREIGN_ARCHES=(ppc64el s390x)
RUST_PACKAGES=(rustc-web cargo-web libstd-rust-web-dev:amd64 libstd-rust-web-1.85:amd64)
log() { echo "install-test-deps: $*"; }

# Debian's package lists first: everything below reads them, and stale lists name packages the
# archive no longer has (kernel headers of an old ABI). Root or sudo only; a failed refresh is
# one line, and the lists are used as they are.
KABI_LOG_PREFIX=install-test-deps
# shellcheck source=scripts/kernel-abi.sh
source "$(dirname "${BASH_SOURCE[0]}")/kernel-abi.sh"
# The foreign architectures of the cross standard libraries come first: the refresh below
# fetches their package lists too.
for a in "${RUST_FOREIGN_ARCHES[@]}"; do
    if ! dpkg --print-foreign-architectures | grep -qx "$a"; then
        kabi_sudo || { log "not root and no sudo: run dpkg --add-architecture $a yourself" >&2; exit 1; }
        log "running: ${KABI_SUDO[*]}${KABI_SUDO:+ }dpkg --add-architecture $a"
        "${KABI_SUDO[@]}" dpkg --add-architecture "$a"
        unset ITRACE_APT_LISTS_FRESH
    fi
done
kabi_refresh_lists

missing=()
for p in "${PACKAGES[@]}"; do
    if kabi_installed_version "$p" >/dev/null; then
        log "$p: installed"
    else
        log "$p: missing"
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    log "all ${#PACKAGES[@]} packages are installed"
else
    if ! kabi_sudo; then
        log "not root and no sudo: install these packages yourself: ${missing[*]}" >&2
        exit 1
    fi
    log "running: ${KABI_SUDO[*]}${KABI_SUDO:+ }apt-get install -y --no-install-recommends ${missing[*]}"
    "${KABI_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

rust_missing=()
for p in "${RUST_PACKAGES[@]}"; do
    [ "$(kabi_installed_version "$p" || true)" = "$RUST_DEBIAN_VERSION" ] || rust_missing+=("$p=$RUST_DEBIAN_VERSION")
done
if [ "${#rust_missing[@]}" -eq 0 ]; then
    log "Debian's Rust $RUST_DEBIAN_VERSION: installed"
else
    kabi_sudo || { log "not root and no sudo: install these packages yourself: ${rust_missing[*]}" >&2; exit 1; }
    log "running: apt-get install -y --no-install-recommends ${rust_missing[*]}"
    "${KABI_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${rust_missing[@]}"
fi
# The downloaded .debs are not needed once installed; CI machines can be short of disk (the
# fuzz build once failed there with ENOSPC), so they go.
if kabi_sudo; then
    "${KABI_SUDO[@]}" apt-get clean
fi

# The kernel module builds against the headers of Debian's current kernel ABI (what
# linux-image-amd64 depends on in the refreshed lists), at the lists' version;
# kmod-shim/test-in-guest.sh boots the kernel image of that ABI and exactly that version
# (downloaded and unpacked, never installed). scripts/kernel-abi.sh decides both.
kabi_ensure_headers
log "linux-headers-$KABI: installed, version $KABI_VERSION (the kmod guest boots linux-image-$KABI $KABI_VERSION)"

# qemu-system-s390x 10 for s390x-guest/test-in-guest.sh (the native s390x recorder): Debian 12's
# 7.2 misses PER stops under TCG. Fetched from bookworm-backports with apt-get download into
# target/s390x-guest/qemu and unpacked there (private package lists; nothing installed, the
# machine's sources and qemu unchanged). Its shared libraries are bookworm's, installed with
# qemu-system-ppc above.
"$(dirname "${BASH_SOURCE[0]}")/../s390x-guest/get-qemu.sh" > /dev/null
log "qemu-system-s390x 10 (bookworm-backports): unpacked in target/s390x-guest/qemu"

# cargo fmt and cargo clippy (rustup components) for scripts/test.sh
if command -v rustup >/dev/null 2>&1; then
    installed=$(rustup component list --installed 2>/dev/null) || installed=""
    for c in rustfmt clippy; do
        if grep -q "^$c" <<<"$installed"; then
            log "rust component $c: installed"
        else
            log "running: rustup component add $c"
            rustup component add "$c"
        fi
    done
fi

# --- DuckDB's Python package: tests/tests/parquet.rs reads `itrace export --format parquet` with it ---
# Installed for the python3 the tests run (the first on PATH), at one version; pip refuses a
# Debian python3's own site-packages unless told (PEP 668).
DUCKDB_VERSION=1.4.4
if python3 -c "import sys, duckdb; sys.exit(duckdb.__version__ != '$DUCKDB_VERSION')" 2>/dev/null; then
    log "python duckdb $DUCKDB_VERSION: installed"
else
    log "running: python3 -m pip install duckdb==$DUCKDB_VERSION"
    python3 -m pip install --quiet "duckdb==$DUCKDB_VERSION" ||
        python3 -m pip install --quiet --break-system-packages "duckdb==$DUCKDB_VERSION"
fi

# --- fuzz smoke test (scripts/fuzz-smoke.sh, fuzz/) ---
# The fuzz targets build with the stable toolchain's own flags (fuzz/fuzz.sh): the one tool they
# need beyond cargo is a C++ compiler, with which the libfuzzer-sys crate compiles libFuzzer (g++,
# in PACKAGES above). Their crates are fetched here, so the smoke test's build needs no network.
if ! command -v c++ >/dev/null 2>&1; then
    log "no C++ compiler (c++) after installing g++: the fuzz smoke test cannot build libFuzzer" >&2
    exit 1
fi
if ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found: install a Rust toolchain (rustup, stable) for the tests and the fuzz targets" >&2
    exit 1
fi
log "running: cargo fetch --manifest-path fuzz/Cargo.toml (the fuzz targets' crates, libfuzzer-sys)"
cargo fetch --manifest-path "$(dirname "${BASH_SOURCE[0]}")/../fuzz/Cargo.toml"
