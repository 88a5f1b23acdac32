#!/usr/bin/env python3
"""Frida's Stalker on a program, every block event delivered: the side-by-side baseline of
bench/translate.sh (issue 28).

Usage: frida_stalker.py PROGRAM [ARGS...]

Spawns PROGRAM (stopped at its first instruction), attaches, and resumes it; its main thread
follows itself with Stalker from the entry of `main` (events: block, one event per executed
basic block, delivered to the JavaScript callback in batches). At `exit` it flushes the queue,
unfollows, and reports once the callback has counted every queued event. Both are hooked by
symbol: the program must not be stripped. Frida 17 cannot spawn a static program here (its
loader crashes), so the benchmark gives it a dynamic build. The callback (V8 where Frida has
it) reads the raw events, counts them and adds the instructions of each block (decoded once per
block start, then looked up), in memory: Frida keeps no trace. Reading the events with
Stalker.parse instead made the callback the bottleneck (about 150 k events/s) and left most
events queued at exit. Prints one JSON line on stdout:
  {"blocks": B, "instructions": I, "seconds": S, "exit_found": bool}
where S is the wall time from resume to the report (the followed run).
The program's own stdout goes to stderr, so the JSON line is the only thing on stdout.
"""
import json
import sys
import threading
import time

import frida
from frida_counting import COUNTING_JS, settled_counts

AGENT = COUNTING_JS + r"""
let done = false;
function finish() {
    if (done) return;
    done = true;
    // flush first: unfollow drops what the queue still holds
    Stalker.flush();
    Stalker.unfollow();
    Stalker.flush();
}
rpc.exports = {
    counts() { return counts; },
    follow() {
        Stalker.queueCapacity = 1 << 20;
        Stalker.queueDrainInterval = 50;
        let exitSym = null;
        try { exitSym = Process.mainModule.findSymbolByName('exit'); } catch (e) { }
        if (exitSym === null) {
            try { exitSym = Module.findGlobalExportByName('exit'); } catch (e) { }
        }
        if (exitSym !== null) {
            Interceptor.attach(exitSym, {
                onEnter() {
                    finish();
                    send({ exiting: true });
                    // hold the program until the host has the counts
                    recv('ack', function () { }).wait();
                }
            });
        }
        // Stalker.follow(tid) of the spawned, not yet running thread follows nothing here:
        // the thread follows itself from the entry of main.
        let mainSym = null;
        try { mainSym = Process.mainModule.findSymbolByName('main'); } catch (e) { }
        if (mainSym === null || exitSym === null) return false;
        Interceptor.attach(mainSym, {
            onEnter() {
                Stalker.follow({ events: { block: true }, onReceive: onReceive });
            }
        });
        return true;
    }
};
"""


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    argv = sys.argv[1:]
    device = frida.get_local_device()
    got = threading.Event()
    result = {}

    def on_output(pid, fd, data):
        if data:
            sys.stderr.buffer.write(data)

    device.on("output", on_output)
    pid = device.spawn(argv, stdio="pipe")
    session = device.attach(pid)
    try:
        script = session.create_script(AGENT, runtime="v8")
    except frida.InvalidArgumentError:
        script = session.create_script(AGENT)

    def on_message(message, data):
        if message["type"] == "send" and message["payload"].get("exiting"):
            t_end = time.perf_counter()
            # in a thread of ours: the callback must not block Frida's message loop
            def collect():
                result.update(settled_counts(script))
                result["t_end"] = t_end
                script.post({"type": "ack"})
                got.set()
            threading.Thread(target=collect, daemon=True).start()
        elif message["type"] == "error":
            print("frida_stalker: agent error: %s" % message.get("stack", message), file=sys.stderr)

    script.on("message", on_message)
    detached = threading.Event()
    session.on("detached", lambda reason, crash: detached.set())
    script.load()
    exit_found = script.exports_sync.follow()
    if not exit_found:
        print("frida_stalker: no `main` or `exit` symbol to hook (a stripped program?)", file=sys.stderr)
        device.kill(pid)
        return 1
    t0 = time.perf_counter()
    device.resume(pid)
    if not got.wait(timeout=float(3600)):
        print("frida_stalker: no report from the agent", file=sys.stderr)
        return 1
    detached.wait(timeout=30)
    out = {
        "blocks": result["blocks"],
        "instructions": result["instructions"],
        "seconds": result["t_end"] - t0,
        "exit_found": exit_found,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
