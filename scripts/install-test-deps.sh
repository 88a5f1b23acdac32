#!/usr/bin/env bash
# Installs the Debian packages the test suite needs. Idempotent: packages
# already installed are left alone, and apt-get runs only when something is
# missing. Works as root (CI) or through sudo.
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
    coreutils             # env -i, sleep
    mount                 # mount/umount of a small tmpfs for the disk-full test
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
)
# The kernel module builds against the headers of Debian's current kernel ABI (what
# linux-image-amd64 depends on today; the kernel image itself is only downloaded and unpacked
# by kmod-shim/test-in-guest.sh, never installed).
KABI=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-\(.*\)$/\1/p' | head -1)
if [ -n "$KABI" ]; then
    PACKAGES+=("linux-headers-$KABI")
fi

log() { echo "install-test-deps: $*"; }

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
else
    SUDO=()
fi

missing=()
for p in "${PACKAGES[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        log "$p: installed"
    else
        log "$p: missing"
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    log "all ${#PACKAGES[@]} packages are installed"
else
    if [ "$(id -u)" -ne 0 ] && [ "${#SUDO[@]}" -eq 0 ]; then
        log "not root and no sudo: install these packages yourself: ${missing[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    log "running: ${SUDO[*]} apt-get update"
    "${SUDO[@]}" apt-get update
    log "running: ${SUDO[*]} apt-get install -y --no-install-recommends ${missing[*]}"
    "${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi

# cargo fmt and cargo clippy (rustup components) for scripts/test.sh
if command -v rustup >/dev/null 2>&1; then
    for c in rustfmt clippy; do
        if rustup component list --installed 2>/dev/null | grep -q "^$c"; then
            log "rust component $c: installed"
        else
            log "running: rustup component add $c"
            rustup component add "$c"
        fi
    done
fi
