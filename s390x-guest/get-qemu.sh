#!/usr/bin/env bash
# Fetches qemu-system-s390x 10 from bookworm-backports into a cache folder, never installing it
# (the machine's own qemu, 7.2, and its package lists stay as they are):
#     s390x-guest/get-qemu.sh [DIR]      (default target/s390x-guest/qemu)
# apt-get reads a private sources list naming bookworm-backports only, with its own lists and
# cache under DIR; `apt-get download` fetches qemu-system-s390x and qemu-system-data, `dpkg -x`
# unpacks them into DIR/root. Prints the path of the qemu-system-s390x binary.
# qemu 10 must be run with `-L DIR/root/usr/share/qemu`: without it, it finds the firmware
# (s390-ccw.img) of an installed qemu 7.2 first. Why 10: under 7.2's TCG a raw single-step loop
# stopped 10 times over 506 instructions (PER), and the native recorder is checked under 10 only
# (README, "itrace on PowerPC64 and s390x machines").
# The shared libraries it needs are bookworm's (scripts/install-test-deps.sh installs them with
# the machine's qemu-system packages); a missing one is reported by ldd.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR=${1:-${CARGO_TARGET_DIR:-$PWD/target}/s390x-guest/qemu}
log() { echo "s390x-guest: $*" >&2; }
Q=$DIR/root/usr/bin/qemu-system-s390x
if [ -x "$Q" ] && "$Q" --version 2>/dev/null | grep -q 'version 10\.'; then
    echo "$Q"
    exit 0
fi
mkdir -p "$DIR"/{lists/partial,cache/archives/partial,dl}
echo 'deb http://deb.debian.org/debian bookworm-backports main' > "$DIR/sources.list"
APT=(-oDir::Etc::SourceList="$DIR/sources.list" -oDir::Etc::SourceParts=/dev/null
    -oDir::State::Lists="$DIR/lists" -oDir::Cache="$DIR/cache" -oDebug::NoLocking=1
    -oAPT::Architectures=amd64)
log "reading bookworm-backports' package lists into $DIR/lists"
apt-get "${APT[@]}" update > "$DIR/update.log" 2>&1 || { cat "$DIR/update.log" >&2; log "apt-get update of bookworm-backports failed"; exit 1; }
version=$(apt-cache "${APT[@]}" policy qemu-system-s390x | sed -n 's/^ *Candidate: //p')
case $version in
    1:10.*) ;;
    *) log "bookworm-backports offers qemu-system-s390x '$version', not 10.x"; exit 1 ;;
esac
log "downloading qemu-system-s390x and qemu-system-data $version (unpacked, never installed)"
rm -rf "$DIR/dl" "$DIR/root"
mkdir -p "$DIR/dl"
(cd "$DIR/dl" && apt-get "${APT[@]}" download "qemu-system-s390x=$version" "qemu-system-data=$version") > "$DIR/download.log" 2>&1 ||
    { cat "$DIR/download.log" >&2; log "download failed"; exit 1; }
for p in "$DIR"/dl/*.deb; do dpkg -x "$p" "$DIR/root"; done
rm -rf "$DIR/dl" "$DIR/cache/archives"/*.deb
if ldd "$Q" | grep 'not found' >&2; then
    log "qemu-system-s390x $version lacks the shared libraries above (install bookworm's qemu-system-s390x dependencies)"
    exit 1
fi
"$Q" --version | head -1 >&2
echo "$Q"
