#!/usr/bin/env bash
# Builds the static itrace for PowerPC64 little-endian and s390x with Debian's own Rust
# (rustc-web 1.85, installed by scripts/install-test-deps.sh, and the target standard libraries
# of the same version, libstd-rust-web-dev:ppc64el and :s390x, downloaded and unpacked into
# target/debian-rust/ here: installed, their foreign libc6 would be found by qemu-user's dynamic
# loader before the cross sysroot's):
#     target/powerpc64le-unknown-linux-gnu/release/itrace
#     target/s390x-unknown-linux-gnu/release/itrace
# Usage: scripts/cross-build.sh [TARGET...]   (default: both)
# Honours CARGO_TARGET_DIR. Debian's compiler is called by path (/usr/bin), beside rustup's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "cross-build: $*"; }
DEBIAN_RUSTC=/usr/bin/rustc
DEBIAN_CARGO=/usr/bin/cargo
for tool in "$DEBIAN_RUSTC" "$DEBIAN_CARGO"; do
    if [ ! -x "$tool" ]; then
        log "$tool missing: run scripts/install-test-deps.sh (packages rustc-web, cargo-web)" >&2
        exit 1
    fi
done

TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
RUST_VERSION=$(dpkg-query -W -f='${Version}' rustc-web 2>/dev/null) || RUST_VERSION=""
[ -n "$RUST_VERSION" ] || { log "rustc-web is not installed: run scripts/install-test-deps.sh" >&2; exit 1; }
# A sysroot of Debian's host standard library and the unpacked target ones.
SYSROOT=$TARGET_DIR/debian-rust/$RUST_VERSION
mkdir -p "$SYSROOT/lib/rustlib"
ln -sfn /usr/lib/rustlib/x86_64-unknown-linux-gnu "$SYSROOT/lib/rustlib/x86_64-unknown-linux-gnu"

targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(powerpc64le-unknown-linux-gnu s390x-unknown-linux-gnu)

for target in "${targets[@]}"; do
    case "$target" in
        powerpc64le-unknown-linux-gnu) gcc=powerpc64le-linux-gnu-gcc std=ppc64el ;;
        s390x-unknown-linux-gnu) gcc=s390x-linux-gnu-gcc std=s390x ;;
        *) log "unknown target $target (powerpc64le-unknown-linux-gnu or s390x-unknown-linux-gnu)" >&2; exit 1 ;;
    esac
    if ! command -v "$gcc" >/dev/null; then
        log "$gcc missing: run scripts/install-test-deps.sh" >&2
        exit 1
    fi
    if [ ! -d "$SYSROOT/lib/rustlib/$target/lib" ]; then
        log "downloading libstd-rust-web-dev:$std=$RUST_VERSION (unpacked into $SYSROOT, never installed)"
        tmp=$(mktemp -d)
        if ! (cd "$tmp" && apt-get download "libstd-rust-web-dev:$std=$RUST_VERSION") > "$tmp/log" 2>&1; then
            cat "$tmp/log" >&2
            log "cannot download libstd-rust-web-dev:$std=$RUST_VERSION (dpkg --add-architecture $std and apt-get update: scripts/install-test-deps.sh)" >&2
            rm -rf "$tmp"
            exit 1
        fi
        dpkg -x "$tmp"/libstd-rust-web-dev_*.deb "$tmp/x"
        mv "$tmp/x/usr/lib/rustlib/$target" "$SYSROOT/lib/rustlib/$target"
        rm -rf "$tmp"
    fi
    var=$(echo "$target" | tr 'a-z-' 'A-Z_')
    log "building $target"
    # The linker and C compiler (capstone's build script) are the cross gcc; static, so the
    # binary runs in a bare busybox initramfs. Stable Rust 1.85 only: no RUSTC_BOOTSTRAP.
    env RUSTC="$DEBIAN_RUSTC" RUSTDOC=/usr/bin/rustdoc \
        "CARGO_TARGET_${var}_LINKER=$gcc" \
        "CARGO_TARGET_${var}_RUSTFLAGS=-C target-feature=+crt-static --sysroot $SYSROOT" \
        "CC_${target//-/_}=$gcc" "AR_${target//-/_}=${gcc%-gcc}-ar" \
        "$DEBIAN_CARGO" build --release --locked -p itrace --target "$target"
    log "built $TARGET_DIR/$target/release/itrace"
done
