# Shared by the native recorders' guest tests (ppc64le-guest/test-in-guest.sh,
# s390x-guest/test-in-guest.sh), sourced after `log` is defined, from the repository's root:
#   guest_kernel DEBARCH FLAVOUR IMAGE CACHE
#       Debian's kernel (linux-image-FLAVOUR:DEBARCH, its boot/IMAGE-*) and busybox-static:DEBARCH
#       downloaded with apt-get download and unpacked (never installed) into CACHE/ABI/ (IMAGE,
#       busybox), cached per kernel ABI (older ones removed); sets KDIR.
#   guest_initramfs ROOT BUILD INIT WHAT
#       ROOT/init (INIT), /lib/guest-init-lib.sh, /etc/what and the bad-input errors of the
#       x86_64 itrace (/etc/expect-nopid, /etc/expect-noprog) into the tree ROOT, packed into
#       BUILD/initramfs.cpio.gz
#   guest_traces TAG CONSOLE DIR
#       the files sent between "TAG-FILE name" and "TAG-END name" console lines, decoded into DIR
guest_kernel() {
    local debarch=$1 flavour=$2 image=$3 cache=$4 abi d
    abi=$(apt-cache depends "linux-image-$flavour:$debarch" 2>/dev/null |
        sed -n "s/.*Depends: linux-image-\(.*-$flavour\)\(:$debarch\)\?\$/\1/p" | head -1)
    [ -n "$abi" ] || { log "no linux-image-$flavour:$debarch in the package lists (dpkg --add-architecture $debarch; apt-get update: scripts/install-test-deps.sh)"; exit 1; }
    KDIR=$cache/$abi
    if [ ! -s "$KDIR/$image" ] || [ ! -s "$KDIR/busybox" ]; then
        rm -rf "$KDIR"
        mkdir -p "$KDIR/dl"
        log "downloading linux-image-$abi:$debarch and busybox-static:$debarch (unpacked here, never installed)"
        (cd "$KDIR/dl" && apt-get download "linux-image-$abi:$debarch" "busybox-static:$debarch") > "$KDIR/download.log" 2>&1 || {
            cat "$KDIR/download.log" >&2
            log "cannot download the $debarch kernel or busybox"
            exit 1
        }
        dpkg -x "$KDIR"/dl/linux-image-*.deb "$KDIR/kroot"
        dpkg -x "$KDIR"/dl/busybox-static_*.deb "$KDIR/broot"
        mv "$KDIR"/kroot/boot/"$image"-* "$KDIR/$image"
        mv "$KDIR/broot/bin/busybox" "$KDIR/busybox"
        rm -rf "$KDIR/dl" "$KDIR/kroot" "$KDIR/broot"
    fi
    for d in "$cache"/*-"$flavour"; do
        [ "$d" = "$KDIR" ] || [ ! -d "$d" ] || { log "removing the cached kernel $(basename "$d")"; rm -rf "$d"; }
    done
}

guest_initramfs() {
    local root=$1 build=$2 init=$3 what=$4 host_itrace
    mkdir -p "$root"/{bin,proc,sys,dev,tmp,etc,t,lib}
    cp "$init" "$root/init"
    chmod +x "$root/init"
    cp scripts/guest-init-lib.sh "$root/lib/guest-init-lib.sh"
    echo "$what" > "$root/etc/what"
    # Bad input: the errors itrace gives on this x86_64 machine, which the guest's must equal.
    cargo build -q -p itrace </dev/null
    host_itrace=${CARGO_TARGET_DIR:-$PWD/target}/debug/itrace
    "$host_itrace" record -p 999999 -o "$build/bad.itr" > /dev/null 2> "$root/etc/expect-nopid" && exit 1
    "$host_itrace" record -o "$build/bad.itr" -- /t/does-not-exist > /dev/null 2> "$root/etc/expect-noprog" && exit 1
    (cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > "$build/initramfs.cpio.gz")
}

guest_traces() {
    local tag=$1 console=$2 dir=$3 f
    rm -rf "$dir"
    mkdir -p "$dir"
    awk -v dir="$dir" -v tag="$tag" '
        $1 == tag "-FILE" { name = $2; file = dir "/" name ".b64"; next }
        $1 == tag "-END" { close(file); name = ""; next }
        name != "" { print > file }
    ' "$console"
    for f in "$dir"/*.b64; do
        [ -e "$f" ] || break
        base64 -d "$f" > "${f%.b64}" || { log "cannot decode $(basename "$f")"; exit 1; }
        rm "$f"
    done
}
