#!/bin/busybox sh
# /init of the s390x guest (see test-in-guest.sh). Records the test programs with the native
# s390x itrace and prints each trace in base64 between "S390X-FILE name" and "S390X-END name"
# lines (checked on the host); the checks made here print "S390X: PASS|FAIL name detail";
# "S390X-RESULT: PASS|FAIL" ends, then it powers off.
# The shared helpers (scripts/guest-init-lib.sh): pass, fail, finish, send, record, attach,
# check_bad_input.
TAG=S390X
FAIL_ON_WARNING=1
. /lib/guest-init-lib.sh

WHAT=$(cat /etc/what)
echo "S390X: kernel $(uname -r) $(grep -m1 '^processor 0' /proc/cpuinfo) [$(now) s]"

if [ "$WHAT" = test ]; then
    # The default step method (block steps, which the probe finds working in this guest).
    record asm -- /t/s390x-asm
    # Execute instructions (exrl, ex) running plain instructions and branches out of line, and
    # compare-and-branch right before system calls.
    record ex -- /t/s390x-ex
    record libc -- /t/s390x-libc
    record signal -- /t/s390x-signal
    # System calls interrupted by a signal handler: a read restarted (SA_RESTART), a nanosleep
    # ended by EINTR and slept again. The program checks what it saw.
    record restart -- /t/restart
    if grep -q "restart: read 1, nanosleep interrupted" /tmp/restart.out; then
        pass "restart: the program saw $(cat /tmp/restart.out)"
    else
        fail "restart: the program saw '$(cat /tmp/restart.out)'"
    fi
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
    attach attach 1 "$pid"
    if kill -0 "$pid" 2> /dev/null; then
        pass "attach: the program runs on after itrace detached"
    else
        fail "attach: the program is gone after itrace detached"
    fi
    kill "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    # Attach to a program sitting in a system call (a read that a SIGALRM every 100 ms ends).
    /t/restart forever > /dev/null &
    pid=$!
    sleep 1
    attach attachsys 2 "$pid"
    if kill -0 "$pid" 2> /dev/null && grep -q "^State:.*S (sleeping)" "/proc/$pid/status"; then
        pass "attachsys: the program runs on after itrace detached"
    else
        fail "attachsys: the program is gone or stopped after itrace detached: $(grep State "/proc/$pid/status")"
    fi
    kill "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    # Bad input: the same one-line errors as itrace on x86_64 (/etc/expect-*, made there).
    check_bad_input
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
