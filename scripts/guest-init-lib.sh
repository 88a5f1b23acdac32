# Shared by the native recorders' guest /init scripts (ppc64le-guest/guest-init.sh,
# s390x-guest/guest-init.sh), sourced from /lib/guest-init-lib.sh in their initramfs (busybox sh).
# Before sourcing: TAG, the console's line prefix (PPC64, S390X). Then:
#   pass/fail TEXT       "TAG: PASS|FAIL TEXT [uptime s]"
#   finish               "TAG-RESULT: PASS|FAIL (N failed)", power off
#   send NAME FILE       FILE in base64 between "TAG-FILE NAME" and "TAG-END NAME" lines
#   record NAME OPTIONS -- PROGRAM ARGS
#                        itrace record into /tmp/NAME.itr in an empty environment (as qemu's
#                        oracle runs), sent with its report (made here, where the programs are);
#                        with FAIL_ON_WARNING=1 an itrace warning fails the check
#   attach NAME SECONDS PID
#                        itrace record -p PID for SECONDS, sent with its report
#   check_bad_input      a bad pid and a missing program: itrace's one-line errors must equal
#                        the x86_64 build's (/etc/expect-nopid, /etc/expect-noprog)
FAILS=0
now() { cut -d' ' -f1 /proc/uptime; }
pass() { echo "$TAG: PASS $* [$(now) s]"; }
fail() { echo "$TAG: FAIL $* [$(now) s]"; FAILS=$((FAILS + 1)); }
finish() {
    if [ "$FAILS" -eq 0 ]; then echo "$TAG-RESULT: PASS"; else echo "$TAG-RESULT: FAIL ($FAILS failed)"; fi
    poweroff -f
}
send() {
    echo "$TAG-FILE $1"
    base64 "$2"
    echo "$TAG-END $1"
}
# The trace NAME and its report go to the host.
send_trace() {
    send "$1.itr" "/tmp/$1.itr"
    if itrace report --json "/tmp/$1.itr" > "/tmp/$1.json" 2> "/tmp/$1.rerr"; then
        send "$1.json" "/tmp/$1.json"
    else
        fail "report $1: $(cat "/tmp/$1.rerr")"
    fi
}
recorded() {
    pass "record $1: $(tail -1 "/tmp/$1.err")"
    # Stops off the decoded path or system calls run through unseen: the trace is not exact.
    if [ "${FAIL_ON_WARNING:-0}" = 1 ] && grep -q "warning" "/tmp/$1.err"; then
        fail "record $1 warned: $(grep "warning" "/tmp/$1.err")"
    fi
    send_trace "$1"
}
record() {
    name=$1
    shift
    if env -i /bin/itrace record -o "/tmp/$name.itr" "$@" > "/tmp/$name.out" 2> "/tmp/$name.err"; then
        recorded "$name"
    else
        fail "record $name (exit $?): $(cat "/tmp/$name.err")"
    fi
}
attach() {
    if env -i /bin/itrace record -p "$3" --duration "$2" -o "/tmp/$1.itr" > /dev/null 2> "/tmp/$1.err"; then
        recorded "$1"
    else
        fail "record $1: $(cat "/tmp/$1.err")"
    fi
}
check_bad_input() {
    for case in nopid noprog; do
        case $case in
            nopid) itrace record -p 999999 -o /tmp/bad.itr > /dev/null 2> /tmp/bad.err ;;
            noprog) itrace record -o /tmp/bad.itr -- /t/does-not-exist > /dev/null 2> /tmp/bad.err ;;
        esac
        rc=$?
        if [ "$rc" -ne 0 ] && cmp -s /tmp/bad.err "/etc/expect-$case"; then
            pass "bad input $case: exit $rc, $(cat /tmp/bad.err)"
        else
            fail "bad input $case: exit $rc, got '$(cat /tmp/bad.err)', want '$(cat "/etc/expect-$case")'"
        fi
    done
}
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
chmod 1777 /tmp
cd /tmp
