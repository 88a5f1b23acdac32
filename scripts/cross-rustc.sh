#!/usr/bin/env bash
# RUSTC_WRAPPER for scripts/cross-build.sh: runs rustc as asked, except for the syscalls crate,
# which under Debian's rustc 1.85 needs two features not yet stable there: inline assembly on
# powerpc64/s390x (its raw syscalls, which itrace does not call) and the const
# usize::is_multiple_of (stable in 1.87). Only that crate is compiled with them allowed.
rustc="$1"
shift
for arg in "$@"; do
    if [ "$arg" = syscalls ]; then
        prev_was_name=$saw_name_flag
    fi
    saw_name_flag=$([ "$arg" = --crate-name ] && echo 1 || echo)
    [ -n "${prev_was_name:-}" ] && break
done
if [ -n "${prev_was_name:-}" ]; then
    exec env RUSTC_BOOTSTRAP=syscalls "$rustc" "$@" -Zcrate-attr='feature(unsigned_is_multiple_of)'
fi
exec "$rustc" "$@"
