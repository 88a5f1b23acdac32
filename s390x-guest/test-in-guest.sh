#!/usr/bin/env bash
# Runs the native s390x recorder in a booted s390x guest and checks its traces here:
#   s390x-guest/test-in-guest.sh [test|bench]
#
# 1. fetches qemu-system-s390x 10 from bookworm-backports (s390x-guest/get-qemu.sh: unpacked
#    into target/s390x-guest/qemu, never installed; qemu 7.2's TCG misses PER stops);
# 2. builds the static s390x itrace (scripts/cross-build.sh) and the s390x test programs
#    (tests/programs/cross, tests/programs/threads.c, bench/raw_step.c, ...);
# 3. downloads Debian's linux-image-ABI-s390x and busybox-static:s390x with apt-get download
#    into target/s390x-guest/ (cached, never installed);
# 4. boots qemu-system-s390x -M s390-ccw-virtio (TCG) with a busybox initramfs whose /init is
#    s390x-guest/guest-init.sh: it records the programs with itrace and prints each trace in
#    base64 between marker lines on the console, with "S390X: PASS|FAIL name" lines for the
#    checks made inside (bad input, ITraceEnabled) and "S390X-RESULT: ..." at the end;
# 5. decodes the traces into target/s390x-guest/out/ and runs the host-side checks (cargo test
#    --workspace --test s390x_native -- --ignored, which reads ITRACE_S390X_GUEST_OUT):
#    the freestanding programs against qemu-s390x's single-step log, block for block; the glibc
#    ones for consistency (each block ends in a taken branch to the next one's start, and its
#    count equals the decoded straight path).
# bench: the benchmark only (bench/s390x.sh calls it): native itrace vs. raw_step in one boot.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
WHAT=${1:-test}
log() { echo "s390x-guest: $*" >&2; }
t0=$(date +%s)

need=()
for p in gcc-s390x-linux-gnu libc6-dev-s390x-cross rustc-web cargo-web qemu-user; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
    log "missing packages: ${need[*]} (run scripts/install-test-deps.sh)"
    exit 1
fi
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
CACHE=$TARGET_DIR/s390x-guest
mkdir -p "$CACHE"
QEMU=$(s390x-guest/get-qemu.sh "$CACHE/qemu")
QEMU_FIRMWARE=$CACHE/qemu/root/usr/share/qemu

# The kernel and busybox of Debian's s390x archive, cached per version.
. scripts/guest-lib.sh
guest_kernel s390x s390x vmlinuz "$CACHE"

# The static s390x itrace.
nice -n 19 scripts/cross-build.sh s390x-unknown-linux-gnu >&2
ITRACE=$TARGET_DIR/s390x-unknown-linux-gnu/release/itrace

# Test programs.
B=$CACHE/build
rm -rf "$B"
mkdir -p "$B/prog" "$B/root"
CC=s390x-linux-gnu-gcc
make -s -C tests/programs/cross OUT="$B/cross" "$B/cross/s390x-asm" "$B/cross/s390x-libc" \
    "$B/cross/s390x-signal" "$B/cross/s390x-ex" >&2
cp "$B"/cross/s390x-* "$B/prog/"
$CC -static -O1 -g -fno-omit-frame-pointer -Wall -pthread -o "$B/prog/threads" tests/programs/threads.c
# forkexec's callgrind client requests (no-ops outside valgrind) from the host's valgrind headers.
mkdir -p "$B/include"
ln -s /usr/include/valgrind "$B/include/valgrind"
$CC -static -O1 -g -Wall -I"$B/include" -o "$B/prog/forkexec" tests/programs/forkexec.c
# ITraceOn/ITraceOff: the x86_64 region program, with stand-ins for libitrace's entry points
# (the ptrace recorder carries them out itself).
$CC -static -O1 -g -Wall -Ilibitrace/include -o "$B/prog/region" tests/programs/region.c s390x-guest/itrace_stub.c
$CC -static -O1 -g -Wall -o "$B/prog/restart" tests/programs/restart.c
$CC -static -O2 -Wall -o "$B/prog/raw_step" bench/raw_step.c
$CC -nostdlib -static -no-pie -o "$B/prog/s390x-loop" bench/s390x_loop.S

# The initramfs: busybox, itrace, the programs (in /t, the path the host oracle uses too).
R=$B/root
mkdir -p "$R"/{bin,t}
cp "$KDIR/busybox" "$R/bin/busybox"
s390x-linux-gnu-strip -o "$R/bin/itrace" "$ITRACE"
cp "$B"/prog/* "$R/t/"
guest_initramfs "$R" "$B" s390x-guest/guest-init.sh "$WHAT"

log "booting the guest ($("$QEMU" --version | head -1 | sed 's/ (.*//'), s390-ccw-virtio, TCG; prepared in $(( $(date +%s) - t0 )) s)"
b0=$(date +%s)
OUT=$B/console-$WHAT.log
# -L: qemu 10's own firmware (s390-ccw.img), not an installed qemu's.
timeout 900 nice -n 19 "$QEMU" -L "$QEMU_FIRMWARE" -M s390-ccw-virtio -accel tcg -m 1G -smp 1 \
    -nographic -no-reboot -kernel "$KDIR/vmlinuz" -initrd "$B/initramfs.cpio.gz" \
    -append "console=ttysclp0 quiet panic=-1" </dev/null > "$OUT" 2>&1 || true
tr -d '\r' < "$OUT" > "$OUT.txt"
log "guest ran $(( $(date +%s) - b0 )) s; console in $OUT.txt"
grep -E "^(S390X|BENCH)" "$OUT.txt" >&2 || true

# The traces: "S390X-FILE name" ... base64 ... "S390X-END name".
D=$CACHE/out
guest_traces S390X "$OUT.txt" "$D"
cp "$B"/prog/* "$D/"
if [ "$WHAT" = bench ]; then
    grep -q "^BENCH " "$OUT.txt" || { log "no benchmark figures"; tail -30 "$OUT.txt" >&2; exit 1; }
    exit 0
fi
if ! grep -q "^S390X-RESULT: PASS" "$OUT.txt"; then
    log "FAILED inside the guest; console tail:"
    tail -40 "$OUT.txt" >&2
    exit 1
fi
log "checking the traces against qemu-s390x's single-step log and the decoded code"
# --workspace, not -p itrace-tests: the features of the whole workspace, as scripts/test.sh's
# cargo test built the test binaries with (-p alone built some 30 crates again).
ITRACE_S390X_GUEST_OUT=$D cargo test -q --workspace --test s390x_native -- --ignored >&2
log "passed in $(( $(date +%s) - t0 )) s"
