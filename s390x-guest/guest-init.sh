#!/bin/busybox sh
# /init of the s390x guest (see test-in-guest.sh). Records the test programs with the native
# s390x itrace and prints each trace in base64 between "S390X-FILE name" and "S390X-END name"
# lines (checked on the host); the checks made here print "S390X: PASS|FAIL name detail";
# "S390X-RESULT: PASS|FAIL" ends, then it powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
chmod 1777 /tmp
cd /tmp
FAILS=0
now() { cut -d' ' -f1 /proc/uptime; }
pass() { echo "S390X: PASS $* [$(now) s]"; }
fail() { echo "S390X: FAIL $* [$(now) s]"; FAILS=$((FAILS + 1)); }
finish() {
    if [ "$FAILS" -eq 0 ]; then echo "S390X-RESULT: PASS"; else echo "S390X-RESULT: FAIL ($FAILS failed)"; fi
    poweroff -f
}
send() {
    echo "S390X-FILE $1"
    base64 "$2"
    echo "S390X-END $1"
}
# record NAME [itrace options] -- PROGRAM ARGS: in an empty environment, like qemu's oracle run.
record() {
    name=$1
    shift
    if env -i /bin/itrace record -o "/tmp/$name.itr" "$@" > "/tmp/$name.out" 2> "/tmp/$name.err"; then
        pass "record $name: $(tail -1 "/tmp/$name.err")"
        # Stops off the decoded path or system calls run through unseen: the trace is not exact.
        if grep -q "warning" "/tmp/$name.err"; then
            fail "record $name warned: $(grep "warning" "/tmp/$name.err")"
        fi
        send "$name.itr" "/tmp/$name.itr"
        # The report where the program files are (the host has no /t): symbols for the host's checks.
        if itrace report --json "/tmp/$name.itr" > "/tmp/$name.json" 2> "/tmp/$name.rerr"; then
            send "$name.json" "/tmp/$name.json"
        else
            fail "report $name: $(cat "/tmp/$name.rerr")"
        fi
    else
        fail "record $name (exit $?): $(cat "/tmp/$name.err")"
    fi
}

WHAT=$(cat /etc/what)
echo "S390X: kernel $(uname -r) $(grep -m1 '^processor 0' /proc/cpuinfo) [$(now) s]"

if [ "$WHAT" = test ]; then
    # The default step method (block steps, which the probe finds working in this guest).
    record asm -- /t/s390x-asm
    record libc -- /t/s390x-libc
    record signal -- /t/s390x-signal
    record threads -- /t/threads
    record forkexec --follow-forks -- /t/forkexec
    # The three modes: normal above; continuous writes segments as it goes; wrap keeps the last.
    record continuous --mode continuous --segment-size 4K -- /t/s390x-libc
    record wrap --mode wrap --buffer-size 4K --segment-size 4K -- /t/s390x-libc
    # Region tracing: stepped from sum_list's entry (a breakpoint) to printf's, untraced around.
    record region --start sum_list --stop printf -- /t/s390x-libc
    # ITraceOn/ITraceOff (nested) and ITraceEnabled, carried out by itrace: what the program saw.
    record itraceon --region --backend ptrace -- /t/region
    if grep -q "enabled before 0 inside 1 after 0" /tmp/itraceon.out; then
        pass "region ITraceEnabled: $(tail -1 /tmp/itraceon.out)"
    else
        fail "region ITraceEnabled: $(tail -1 /tmp/itraceon.out)"
    fi
    # Attach to a running program (the loop runs until killed).
    /t/s390x-loop forever > /dev/null &
    pid=$!
    sleep 1
    if env -i /bin/itrace record -p "$pid" --duration 1 -o /tmp/attach.itr > /dev/null 2> /tmp/attach.err; then
        pass "record attach: $(tail -1 /tmp/attach.err)"
        send attach.itr /tmp/attach.itr
        itrace report --json /tmp/attach.itr > /tmp/attach.json && send attach.json /tmp/attach.json
    else
        fail "record attach: $(cat /tmp/attach.err)"
    fi
    if kill -0 "$pid" 2> /dev/null; then
        pass "attach: the program runs on after itrace detached"
    else
        fail "attach: the program is gone after itrace detached"
    fi
    kill "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    # Bad input: the same one-line errors as itrace on x86_64 (/etc/expect-*, made there).
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
fi

# The benchmark (bench/s390x.sh): raw_step's PTRACE_SINGLEBLOCK loop (nothing read, nothing
# recorded) and itrace (block steps) on the same freestanding loop, alternately, three times.
[ "$WHAT" = bench ] && for round in 1 2 3; do
    RAW_STEP_BLOCK=1 /t/raw_step /t/s390x-loop > /dev/null 2> /tmp/raw.err
    echo "BENCH rawblock $(cat /tmp/raw.err)"
    a=$(now)
    itrace record -o /tmp/bench.itr -- /t/s390x-loop > /dev/null 2> /tmp/bench.err
    b=$(now)
    echo "BENCH itrace seconds=$(echo "$a $b" | awk '{ printf "%.2f", $2 - $1 }') $(tail -1 /tmp/bench.err)"
    # itrace's fixed cost: start-up (its probe), module table, trace file, on a 38-instruction program.
    a=$(now)
    itrace record -o /tmp/fixed.itr -- /t/s390x-asm > /dev/null 2>&1
    b=$(now)
    echo "BENCH fixed seconds=$(echo "$a $b" | awk '{ printf "%.2f", $2 - $1 }')"
done
finish
