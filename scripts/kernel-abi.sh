# shellcheck shell=bash
# The one place that decides which Debian kernel the kmod guest test uses, sourced by
# scripts/install-test-deps.sh and kmod-shim/test-in-guest.sh (bash, set -euo pipefail):
#
#   source scripts/kernel-abi.sh
#   kabi_ensure_headers      # sets KABI (e.g. 6.1.0-48-amd64) and KABI_VERSION (e.g. 6.1.172-1)
#
# KABI is the ABI that linux-image-amd64 depends on in the package lists, read only after the
# lists have been refreshed (kabi_refresh_lists); linux-headers-KABI is installed (or upgraded)
# to the lists' candidate version, and KABI_VERSION is the version installed. The guest boots
# linux-image-KABI at exactly KABI_VERSION (both come from one source package), so the module
# is built against the headers of the kernel it is loaded into.
#
# Run directly (scripts/kernel-abi.sh), it does the same and prints "KABI KABI_VERSION".
#
# Environment: ITRACE_APT_LISTS_FRESH=1 skips the refresh (set by kabi_refresh_lists for the
# processes it starts, and by scripts/test.sh after scripts/install-test-deps.sh), so one run
# of the test suite refreshes the lists once.

kabi_log() { echo "${KABI_LOG_PREFIX:-kernel-abi}: $*" >&2; }

# KABI_SUDO: () as root, (sudo) if sudo is there, else unset (returns 1).
kabi_sudo() {
    if [ "$(id -u)" -eq 0 ]; then
        KABI_SUDO=()
    elif command -v sudo >/dev/null 2>&1; then
        KABI_SUDO=(sudo)
    else
        unset KABI_SUDO
        return 1
    fi
}

# kabi_installed_version PKG: the installed version of PKG on stdout, or nothing (status 1).
# (No `dpkg-query | grep -q`: under pipefail grep's early exit can fail the pipeline.)
kabi_installed_version() {
    local st
    st=$(dpkg-query -W -f='${Status}\t${Version}' "$1" 2>/dev/null) || return 1
    case "$st" in
        "install ok installed"$'\t'*) echo "${st#*$'\t'}" ;;
        *) return 1 ;;
    esac
}

# kabi_refresh_lists: apt-get update, once (see ITRACE_APT_LISTS_FRESH), when root or through
# sudo. A failure is reported in one line and the lists are used as they are.
kabi_refresh_lists() {
    if [ "${ITRACE_APT_LISTS_FRESH:-0}" = 1 ]; then
        return 0
    fi
    export ITRACE_APT_LISTS_FRESH=1
    if ! kabi_sudo; then
        kabi_log "not root and no sudo: not refreshing the package lists (using them as they are)"
        return 0
    fi
    kabi_log "refreshing the package lists: ${KABI_SUDO[*]}${KABI_SUDO:+ }apt-get update"
    local out
    if ! out=$("${KABI_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update 2>&1); then
        kabi_log "apt-get update failed (going on with the package lists as they are): $(tail -n1 <<<"$out")"
    fi
}

# kabi_resolve: KABI from the package lists (what linux-image-amd64 depends on) and
# KABI_CANDIDATE, the lists' version of linux-headers-KABI. Status 1 if the lists don't say.
kabi_resolve() {
    local deps policy
    KABI="" KABI_CANDIDATE=""
    deps=$(apt-cache depends linux-image-amd64 2>/dev/null) || deps=""
    KABI=$(sed -n '/Depends: linux-image-/{s/.*Depends: linux-image-//p;q;}' <<<"$deps")
    [ -n "$KABI" ] || return 1
    policy=$(apt-cache policy "linux-headers-$KABI" 2>/dev/null) || policy=""
    KABI_CANDIDATE=$(sed -n '/^ *Candidate: /{s/^ *Candidate: //p;q;}' <<<"$policy")
    [ -n "$KABI_CANDIDATE" ] && [ "$KABI_CANDIDATE" != "(none)" ] || KABI_CANDIDATE=""
    [ -n "$KABI_CANDIDATE" ]
}

# kabi_newest_installed: KABI and KABI_VERSION of the newest installed linux-headers-*-amd64
# (the fallback when the lists name nothing installable). Status 1 if there is none.
kabi_newest_installed() {
    local rows best
    rows=$(dpkg-query -W -f='${Status}\t${Package}\t${Version}\n' 'linux-headers-[0-9]*-amd64' 2>/dev/null) || rows=""
    best=$(awk -F'\t' '$1 == "install ok installed" { print $3 "\t" $2 }' <<<"$rows" | sort -V | tail -n1)
    [ -n "$best" ] || return 1
    KABI_VERSION=${best%%$'\t'*}
    KABI=${best#*$'\t'}
    KABI=${KABI#linux-headers-}
}

# kabi_ensure_headers: refresh the lists, resolve the ABI, install linux-headers-KABI at the
# candidate version if it is not installed at it; sets KABI and KABI_VERSION (installed).
kabi_ensure_headers() {
    kabi_refresh_lists
    if ! kabi_resolve; then
        if kabi_newest_installed; then
            kabi_log "the package lists name no installable kernel headers; using the installed linux-headers-$KABI $KABI_VERSION"
            return 0
        fi
        kabi_log "cannot find Debian's kernel ABI (apt-cache depends linux-image-amd64) and no linux-headers-*-amd64 is installed"
        return 1
    fi
    local have
    have=$(kabi_installed_version "linux-headers-$KABI") || have=""
    if [ "$have" != "$KABI_CANDIDATE" ]; then
        if kabi_sudo; then
            kabi_log "installing linux-headers-$KABI=$KABI_CANDIDATE${have:+ (installed: $have)}"
            "${KABI_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
                "linux-headers-$KABI=$KABI_CANDIDATE" >&2 || kabi_log "apt-get install linux-headers-$KABI=$KABI_CANDIDATE failed"
        else
            kabi_log "not root and no sudo: install linux-headers-$KABI=$KABI_CANDIDATE yourself"
        fi
        have=$(kabi_installed_version "linux-headers-$KABI") || have=""
    fi
    if [ -z "$have" ]; then
        if kabi_newest_installed; then
            kabi_log "linux-headers-$KABI is not installed; using the installed linux-headers-$KABI $KABI_VERSION"
            return 0
        fi
        kabi_log "linux-headers-$KABI is not installed"
        return 1
    fi
    KABI_VERSION=$have
}

# Run directly: ensure the headers and print "KABI KABI_VERSION".
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    kabi_ensure_headers
    echo "$KABI $KABI_VERSION"
fi
