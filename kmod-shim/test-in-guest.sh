#!/usr/bin/env bash
# Tests the itrace kernel shim in a booted guest (never on this machine's kernel):
#   kmod-shim/test-in-guest.sh [test|bench|faults|stress]
#   (faults: only the fault-injection checks, section 8 of guest-init.sh; stress: only long_loop
#   through a 64K continuous ring, STRESS_RUNS times, default 10: the exit that once hung)
#
# 1. refreshes the package lists and finds Debian's current kernel ABI and the version of its
#    headers (scripts/kernel-abi.sh, as scripts/install-test-deps.sh does), installs what is
#    missing (linux-headers-ABI at that version, qemu-system-x86, busybox-static, ...);
# 2. downloads linux-image-ABI at the installed headers' version with apt-get download,
#    unpacks it with dpkg -x into target/kmod-guest/ABI_VERSION (cached; never installed) and
#    extracts the uncompressed vmlinux from vmlinuz's XZ payload (boots in about 2 s through
#    QEMU's PVH entry);
# 3. builds the module (no warnings allowed), a statically linked itrace and the test programs;
# 4. boots qemu-system-x86_64 -accel tcg with a busybox initramfs whose /init runs
#    kmod-shim/guest-init.sh; the guest prints "KMOD: PASS|FAIL name detail" lines and
#    "KMOD-RESULT: PASS|FAIL", which this script turns into its exit status.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
WHAT=${1:-test}
log() { echo "kmod-guest: $*" >&2; }
t0=$(date +%s)

# Debian's kernel: its ABI and the version of the installed headers, decided in one place
# (scripts/kernel-abi.sh, shared with scripts/install-test-deps.sh): the package lists are
# refreshed first (unless ITRACE_APT_LISTS_FRESH=1), linux-headers-ABI is installed at the
# lists' version, and the guest boots linux-image-ABI at exactly the installed headers' version.
KABI_LOG_PREFIX=kmod-guest
# shellcheck source=scripts/kernel-abi.sh
source "$ROOT/scripts/kernel-abi.sh"
kabi_ensure_headers
ABI=$KABI VERSION=$KABI_VERSION
log "kernel ABI $ABI, version $VERSION"

need=()
for p in qemu-system-x86 busybox-static xz-utils gcc-i686-linux-gnu; do
    kabi_installed_version "$p" >/dev/null || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
    kabi_sudo || { log "not root and no sudo: install these packages yourself: ${need[*]}"; exit 1; }
    log "installing ${need[*]}"
    "${KABI_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
fi

# The kernel image, cached per ABI and version (an upgrade of the headers within one ABI gets
# its matching image); caches of other kernels are removed.
CACHE=$ROOT/target/kmod-guest
KDIR=$CACHE/${ABI}_${VERSION//:/%3a}
mkdir -p "$KDIR"
for d in "$CACHE"/[0-9]*-amd64*; do
    [ "$d" = "$KDIR" ] || [ ! -d "$d" ] || { log "removing the cached kernel $(basename "$d")"; rm -rf "$d"; }
done
if [ ! -s "$KDIR/vmlinux" ]; then
    log "downloading linux-image-$ABI=$VERSION (unpacked here, never installed)"
    rm -f "$KDIR"/*.deb
    (cd "$KDIR" && apt-get download "linux-image-$ABI=$VERSION") > "$KDIR/download.log" 2>&1 || {
        cat "$KDIR/download.log" >&2
        log "cannot download linux-image-$ABI=$VERSION, the image matching the installed headers"
        log "(refresh the package lists and upgrade the headers: scripts/install-test-deps.sh)"
        exit 1
    }
    rm -rf "$KDIR/root"
    dpkg -x "$KDIR"/linux-image-"$ABI"_*.deb "$KDIR/root"
    VMLINUZ=("$KDIR"/root/boot/vmlinuz-*)
    # The XZ stream starts with FD 37 7A 58 5A 00; xz stops at its end (trailing data ignored).
    # Captured and read from files, not piped (no SIGPIPE under pipefail).
    HIT=$(LC_ALL=C grep -m1 -obUaP '\xFD7zXZ(?=\x00)' "${VMLINUZ[0]}") || HIT=""
    OFF=${HIT%%:*}
    [ -n "$OFF" ] || { log "no XZ stream in ${VMLINUZ[0]}"; exit 1; }
    tail -c +$((OFF + 1)) "${VMLINUZ[0]}" > "$KDIR/payload.xz"
    xz -dc --single-stream "$KDIR/payload.xz" > "$KDIR/vmlinux.tmp" ||
        { log "cannot extract vmlinux from ${VMLINUZ[0]}"; exit 1; }
    [ -s "$KDIR/vmlinux.tmp" ] || { log "cannot extract vmlinux from ${VMLINUZ[0]}"; exit 1; }
    mv "$KDIR/vmlinux.tmp" "$KDIR/vmlinux"
    # only vmlinux is used: drop the package, the payload and the unpacked modules
    rm -rf "$KDIR"/*.deb "$KDIR/payload.xz" "$KDIR/root"
fi

# The module, built out of the source tree.
B=$CACHE/build
rm -rf "$B/mod"
mkdir -p "$B/mod" "$B/prog"
cp kmod-shim/itrace.c kmod-shim/itrace_kmod.h kmod-shim/Kbuild "$B/mod/"
log "building the module against /usr/src/linux-headers-$ABI"
make -C "/usr/src/linux-headers-$ABI" M="$B/mod" modules > "$B/mod/build.log" 2>&1 </dev/null ||
    { cat "$B/mod/build.log" >&2; log "module build failed"; exit 1; }
if grep -E "warning:|error:" "$B/mod/build.log" >&2; then
    log "the module build printed warnings"
    exit 1
fi

# A statically linked itrace (its own target triple keeps these flags off the host build).
log "building a static itrace"
RUSTFLAGS="-C target-feature=+crt-static" CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" \
    cargo build -q -p itrace --target x86_64-unknown-linux-gnu </dev/null
ITRACE=$ROOT/target/x86_64-unknown-linux-gnu/debug/itrace

# Test programs: the freestanding ones as they are, the libc ones linked statically.
for p in count_loop branches long_loop; do
    gcc -nostdlib -static -no-pie -o "$B/prog/$p" "tests/programs/$p.S"
done
for p in tests/programs/signal.c tests/programs/spinner.c kmod-shim/tests/syscalls.c kmod-shim/tests/forker.c \
    kmod-shim/tests/badioctl.c; do
    gcc -static -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Ikmod-shim -o "$B/prog/$(basename "$p" .c)" "$p"
done
gcc -static -g -O1 -fno-omit-frame-pointer -Wall -Wextra -pthread -o "$B/prog/threads" tests/programs/threads.c
# The fault-injection target and the module's status (section 8 of guest-init.sh).
gcc -static -O1 -Wall -Wextra -pthread -o "$B/prog/victim" kmod-shim/tests/victim.c
gcc -static -O1 -Wall -Wextra -Ikmod-shim -o "$B/prog/kmodstat" kmod-shim/tests/kmodstat.c
# forkexec execs itself; the callgrind client requests in it are no-ops outside valgrind.
gcc -static -g -O1 -fno-omit-frame-pointer -Wall -Wextra -o "$B/prog/forkexec" tests/programs/forkexec.c
# A 32-bit program (the module stops tracing a thread that execs one).
printf '.globl _start\n_start: movl $4, %%eax\n movl $1, %%ebx\n movl $msg, %%ecx\n movl $8, %%edx\n int $0x80\n movl $1, %%eax\n xorl %%ebx, %%ebx\n int $0x80\n.data\nmsg: .ascii "hello32\\n"\n' > "$B/prog/hello32.S"
i686-linux-gnu-gcc -nostdlib -static -o "$B/prog/hello32" "$B/prog/hello32.S"
rm "$B/prog/hello32.S"
# Region programs, linked statically with libitrace.a (ITraceOn/ITraceOff through the device).
cargo build -q -p libitrace </dev/null
for p in region region_threads region_fork region_exec region_loop; do
    gcc -static -g -O1 -fno-omit-frame-pointer -Wall -Wextra -pthread -Ilibitrace/include -o "$B/prog/$p" \
        "tests/programs/$p.c" target/debug/libitrace.a -ldl -lm 2>/dev/null
done

# long_loop's ptrace trace, recorded here (stepping it under TCG would take minutes); the
# module path is the guest's, the CPU and pid fields are dropped as in the guest.
cargo build -q -p itrace </dev/null
HOST_ITRACE=$ROOT/target/debug/itrace
"$HOST_ITRACE" record --backend ptrace -o "$B/long_loop.host.itr" -- "$B/prog/long_loop" 2> "$B/prog/long_loop.host.log" >/dev/null
"$HOST_ITRACE" arc "$B/long_loop.host.itr" 2>/dev/null | sed "s|$B/prog/|/t/|" |
    awk '!/^#/ { $1 = ""; $8 = ""; print }' > "$B/prog/long_loop.host.arc"

# The initramfs.
R=$B/root
rm -rf "$R"
mkdir -p "$R"/{bin,sbin,proc,sys,dev,tmp,etc,t}
cp /bin/busybox "$R/bin/busybox"
cp "$B/mod/itrace.ko" "$R/t/"
cp "$ITRACE" "$R/bin/itrace"
cp "$B"/prog/* "$R/t/"
cp kmod-shim/guest-init.sh "$R/init"
chmod +x "$R/init"
echo "$WHAT" > "$R/etc/kmod-what"
printf 'root:x:0:0::/:/bin/sh\nuser:x:1000:1000::/tmp:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\nuser:x:1000:\n' > "$R/etc/group"
(cd "$R" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > "$B/initramfs.cpio.gz")

log "booting the guest (qemu -accel tcg; prepared in $(( $(date +%s) - t0 )) s)"
b0=$(date +%s)
OUT=$B/console-$WHAT.log
# loglevel=5: warnings reach the console with their backtraces (a soft lockup's says where).
# KMOD_GUEST_CPUS: the guest's CPU count (2); KMOD_GUEST_ARGS: more kernel arguments (NAME=VALUE
# ones reach guest-init.sh's environment, e.g. STRESS_RUNS=20 for `stress`).
# KMOD_GUEST_TIMEOUT: the guest's time (900 s). The test takes 85 s on a quiet machine and was
# still in its fault block at 330 s with the host's 2 cores at load 7-10; a hung check stops the
# guest itself (a program that does not end), and 60 s before the limit the guest says where
# it is (KMOD_WHERE_AT).
LIMIT=${KMOD_GUEST_TIMEOUT:-900}
timeout "$LIMIT" qemu-system-x86_64 -accel tcg -smp "${KMOD_GUEST_CPUS:-2}" -m 1024 -nographic -no-reboot \
    -kernel "$KDIR/vmlinux" -initrd "$B/initramfs.cpio.gz" \
    -append "console=ttyS0 quiet loglevel=5 panic=-1 oops=panic KMOD_WHERE_AT=$((LIMIT - 60)) ${KMOD_GUEST_ARGS:-}" </dev/null > "$OUT" 2>&1 || true
tr -d '\r' < "$OUT" > "$OUT.txt"
grep -E "^(KMOD|BENCH)|watchdog: BUG|rcu: INFO" "$OUT.txt" >&2 || true
log "guest ran $(( $(date +%s) - b0 )) s, $(( $(date +%s) - t0 )) s in all; console in $OUT.txt"
if grep -q "^KMOD-RESULT: PASS" "$OUT.txt"; then
    exit 0
fi
log "FAILED (no passing result line); console tail:"
tail -40 "$OUT.txt" >&2
exit 1
