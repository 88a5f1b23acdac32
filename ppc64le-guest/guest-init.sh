#!/bin/busybox sh
# /init of the ppc64le guest (see test-in-guest.sh). Records the test programs with the native
# ppc64le itrace and prints each trace in base64 between "PPC64-FILE name" and "PPC64-END name"
# lines (checked on the host against qemu-ppc64le's log); the checks made here print
# "PPC64: PASS|FAIL name detail"; "PPC64-RESULT: PASS|FAIL" ends, then it powers off.
# The shared helpers (scripts/guest-init-lib.sh): pass, fail, finish, send, record, attach,
# check_bad_input.
TAG=PPC64
. /lib/guest-init-lib.sh

WHAT=$(cat /etc/what)
echo "PPC64: kernel $(uname -r) $(grep -m1 '^cpu' /proc/cpuinfo) [$(now) s]"

if [ "$WHAT" = test ]; then
    # The default step method (block steps, which the probe finds working in this guest), and
    # single steps (--step instruction) for the same programs: both must equal qemu's log.
    record asm -- /t/ppc64le-asm
    record asm-step --step instruction -- /t/ppc64le-asm
    record libc -- /t/ppc64le-libc
    record libc-step --step instruction -- /t/ppc64le-libc
    record dynamic -- /t/ppc64le-dynamic
    record signal -- /t/ppc64le-signal
    record signal-step --step instruction -- /t/ppc64le-signal
    record threads -- /t/threads
    record forkexec --follow-forks -- /t/forkexec
    # The three modes: normal above; continuous writes segments as it goes; wrap keeps the last.
    record continuous --mode continuous --segment-size 4K -- /t/ppc64le-libc
    record wrap --mode wrap --buffer-size 4K --segment-size 4K -- /t/ppc64le-libc
    # Region tracing: stepped from sum_list's entry (a trap breakpoint) to printf's, untraced around.
    record region --start sum_list --stop printf -- /t/ppc64le-libc
    # ITraceOn/ITraceOff (nested) and ITraceEnabled, carried out by itrace: what the program saw.
    record itraceon --region --backend ptrace -- /t/region
    if grep -q "enabled before 0 inside 1 after 0" /tmp/itraceon.out; then
        pass "region ITraceEnabled: $(tail -1 /tmp/itraceon.out)"
    else
        fail "region ITraceEnabled: $(tail -1 /tmp/itraceon.out)"
    fi
    # Attach to a running program (the loop is long enough under TCG to be caught running).
    /t/loop 50 > /dev/null &
    pid=$!
    sleep 1
    attach attach 1 "$pid"
    kill "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    # Bad input: the same one-line errors as itrace on x86_64 (/etc/expect-*, made there).
    check_bad_input
fi

# The benchmark (bench/ppc64le.sh): raw_step (the ptrace single-step loop with nothing else,
# and its PTRACE_SINGLEBLOCK variant) and itrace (its default, block steps, and --step instruction) on the same freestanding loop,
# alternately, twice each.
[ "$WHAT" = bench ] && for round in 1 2; do
    /t/raw_step /t/loop > /dev/null 2> /tmp/raw.err
    echo "BENCH raw $(cat /tmp/raw.err)"
    RAW_STEP_BLOCK=1 /t/raw_step /t/loop > /dev/null 2> /tmp/raw.err
    echo "BENCH rawblock $(cat /tmp/raw.err)"
    a=$(now)
    itrace record -o /tmp/bench.itr -- /t/loop > /dev/null 2> /tmp/bench.err
    b=$(now)
    echo "BENCH itrace seconds=$(echo "$a $b" | awk '{ printf "%.2f", $2 - $1 }') $(tail -1 /tmp/bench.err)"
    a=$(now)
    itrace record --step instruction -o /tmp/bench.itr -- /t/loop > /dev/null 2> /tmp/bench.err
    b=$(now)
    echo "BENCH itrace-step seconds=$(echo "$a $b" | awk '{ printf "%.2f", $2 - $1 }') $(tail -1 /tmp/bench.err)"
    # itrace's fixed cost: start-up, module table, trace file, on a 47-instruction program.
    a=$(now)
    itrace record -o /tmp/fixed.itr -- /t/ppc64le-asm > /dev/null 2>&1
    b=$(now)
    echo "BENCH fixed seconds=$(echo "$a $b" | awk '{ printf "%.2f", $2 - $1 }')"
done
finish
