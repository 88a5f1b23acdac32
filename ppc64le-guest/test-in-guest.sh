#!/usr/bin/env bash
# Runs the native PowerPC64 recorder in a booted ppc64le guest and checks its traces here:
#   ppc64le-guest/test-in-guest.sh [test|bench]
#
# 1. builds the static ppc64le itrace (scripts/cross-build.sh) and the ppc64le test programs
#    (tests/programs/cross, tests/programs/threads.c, bench/raw_step.c, ...);
# 2. downloads Debian's linux-image-ABI-powerpc64le and busybox-static:ppc64el with apt-get
#    download into target/ppc64le-guest/ (cached, never installed; the kernel .deb holds a
#    plain vmlinux);
# 3. boots qemu-system-ppc64 -M pseries -cpu POWER9 (TCG) with a busybox initramfs whose /init
#    is ppc64le-guest/guest-init.sh: it records the programs with itrace and prints each trace
#    in base64 between marker lines on the console, with "PPC64: PASS|FAIL name" lines for the
#    checks made inside (bad input) and "PPC64-RESULT: ..." at the end;
# 4. decodes the traces into target/ppc64le-guest/out/ and runs the host-side comparisons
#    against qemu-ppc64le's single-step log (cargo test --workspace --test ppc64le_native
#    -- --ignored, which reads ITRACE_PPC64LE_GUEST_OUT).
# bench: the benchmark only (bench/ppc64le.sh calls it): native itrace vs. raw_step in one boot.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
WHAT=${1:-test}
log() { echo "ppc64le-guest: $*" >&2; }
t0=$(date +%s)

need=()
for p in qemu-system-ppc gcc-powerpc64le-linux-gnu libc6-dev-ppc64el-cross rustc-web cargo-web; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
    log "missing packages: ${need[*]} (run scripts/install-test-deps.sh)"
    exit 1
fi

# The kernel and busybox of Debian's ppc64el archive, cached per version.
CACHE=$ROOT/target/ppc64le-guest
mkdir -p "$CACHE"
. scripts/guest-lib.sh
guest_kernel ppc64el powerpc64le vmlinux "$CACHE"

# The static ppc64le itrace.
scripts/cross-build.sh powerpc64le-unknown-linux-gnu >&2
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
ITRACE=$TARGET_DIR/powerpc64le-unknown-linux-gnu/release/itrace

# Test programs.
B=$CACHE/build
rm -rf "$B"
mkdir -p "$B/prog" "$B/root"
CC=powerpc64le-linux-gnu-gcc
make -s -C tests/programs/cross OUT="$B/cross" "$B/cross/ppc64le-asm" "$B/cross/ppc64le-libc" \
    "$B/cross/ppc64le-dynamic" "$B/cross/ppc64le-signal" >&2
cp "$B"/cross/ppc64le-* "$B/prog/"
$CC -static -O1 -g -fno-omit-frame-pointer -Wall -pthread -o "$B/prog/threads" tests/programs/threads.c
# forkexec's callgrind client requests (no-ops outside valgrind) from the host's valgrind headers.
mkdir -p "$B/include"
ln -s /usr/include/valgrind "$B/include/valgrind"
$CC -static -O1 -g -Wall -I"$B/include" -o "$B/prog/forkexec" tests/programs/forkexec.c
# ITraceOn/ITraceOff: the x86_64 region program, with stand-ins for libitrace's entry points
# (the ptrace recorder carries them out itself).
$CC -static -O1 -g -Wall -Ilibitrace/include -o "$B/prog/region" tests/programs/region.c ppc64le-guest/itrace_stub.c
$CC -static -O2 -Wall -o "$B/prog/raw_step" bench/raw_step.c
$CC -nostdlib -static -no-pie -o "$B/prog/loop" bench/ppc64le_loop.S

# The initramfs: busybox, itrace, the programs (in /t, the path the host oracle uses too) and
# the cross glibc for the dynamically linked one.
R=$B/root
mkdir -p "$R"/{bin,t,lib64,lib/powerpc64le-linux-gnu}
cp "$KDIR/busybox" "$R/bin/busybox"
powerpc64le-linux-gnu-strip -o "$R/bin/itrace" "$ITRACE"
cp "$B"/prog/* "$R/t/"
SYSROOT=/usr/powerpc64le-linux-gnu
cp -L "$SYSROOT/lib/ld64.so.2" "$R/lib64/ld64.so.2"
cp -L "$SYSROOT/lib/libc.so.6" "$R/lib/powerpc64le-linux-gnu/libc.so.6"
guest_initramfs "$R" "$B" ppc64le-guest/guest-init.sh "$WHAT"

log "booting the guest (qemu-system-ppc64 pseries POWER9, TCG; prepared in $(( $(date +%s) - t0 )) s)"
b0=$(date +%s)
OUT=$B/console-$WHAT.log
timeout 900 qemu-system-ppc64 -M pseries -cpu POWER9 -m 1G -smp 1 -nographic -no-reboot \
    -kernel "$KDIR/vmlinux" -initrd "$B/initramfs.cpio.gz" \
    -append "console=hvc0 quiet panic=-1" </dev/null > "$OUT" 2>&1 || true
tr -d '\r' < "$OUT" > "$OUT.txt"
log "guest ran $(( $(date +%s) - b0 )) s; console in $OUT.txt"
grep -E "^(PPC64|BENCH)" "$OUT.txt" >&2 || true

# The traces: "PPC64-FILE name" ... base64 ... "PPC64-END name".
D=$CACHE/out
guest_traces PPC64 "$OUT.txt" "$D"
cp "$B"/prog/* "$D/"
if [ "$WHAT" = bench ]; then
    grep -q "^BENCH " "$OUT.txt" || { log "no benchmark figures"; tail -30 "$OUT.txt" >&2; exit 1; }
    exit 0
fi
if ! grep -q "^PPC64-RESULT: PASS" "$OUT.txt"; then
    log "FAILED inside the guest; console tail:"
    tail -40 "$OUT.txt" >&2
    exit 1
fi
log "comparing the traces with qemu-ppc64le's single-step log"
# --workspace, not -p itrace-tests: the features of the whole workspace, as scripts/test.sh's
# cargo test built the test binaries with (-p alone built some 30 crates again).
ITRACE_PPC64LE_GUEST_OUT=$D cargo test -q --workspace --test ppc64le_native -- --ignored >&2
log "passed in $(( $(date +%s) - t0 )) s"
