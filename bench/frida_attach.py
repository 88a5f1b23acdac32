#!/usr/bin/env python3
"""Frida's Stalker attached to a running process, every block event delivered: the side-by-side
baseline of bench/attach.py (issue 29).

Usage: frida_attach.py PID SECONDS

Attaches to PID (`frida.attach`), loads an agent that follows every thread of the process with
Stalker (events: block, delivered to the JavaScript callback in batches), lets it run SECONDS,
then unfollows every thread, flushes, collects the counts and detaches. The callback reads the
raw events and adds the instructions of each block (decoded once per block start, then looked
up), in memory: Frida keeps no trace. Prints one JSON line on stdout:
  {"attach_seconds": A, "blocks": B, "instructions": I, "seconds": S, "threads": T}
A: from before `frida.attach` to every thread followed; S: from every thread followed to the
unfollow (the window the counts cover).
"""
import json
import sys
import time

import frida
from frida_counting import COUNTING_JS, settled_counts

AGENT = COUNTING_JS + r"""
let followed = [];
rpc.exports = {
    follow() {
        Stalker.queueCapacity = 1 << 20;
        Stalker.queueDrainInterval = 50;
        const me = Process.getCurrentThreadId();
        for (const t of Process.enumerateThreads()) {
            if (t.id === me) continue;
            Stalker.follow(t.id, { events: { block: true }, onReceive: onReceive });
            followed.push(t.id);
        }
        return followed.length;
    },
    unfollow() {
        Stalker.flush();
        for (const id of followed) Stalker.unfollow(id);
        Stalker.flush();
        return true;
    },
    counts() { return counts; },
};
"""


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    pid, seconds = int(sys.argv[1]), float(sys.argv[2])
    t0 = time.perf_counter()
    session = frida.attach(pid)
    try:
        script = session.create_script(AGENT, runtime="v8")
    except frida.InvalidArgumentError:
        script = session.create_script(AGENT)
    script.load()
    threads = script.exports_sync.follow()
    t1 = time.perf_counter()
    time.sleep(seconds)
    script.exports_sync.unfollow()
    t2 = time.perf_counter()
    c = settled_counts(script)
    script.unload()
    session.detach()
    print(json.dumps({"attach_seconds": t1 - t0, "blocks": c["blocks"], "instructions": c["instructions"],
                      "seconds": t2 - t1, "threads": threads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
