"""The part of the Frida agents of bench/frida_stalker.py and bench/frida_attach.py that counts
Stalker's block events: `onReceive` adds each batch's blocks and their instructions (each block
decoded once, at its first event) to `counts`, in memory."""

import time


def settled_counts(script):
    """The agent's counts once they stop moving: the queue's last batches are delivered by
    Frida's drain timer after the unfollow or flush."""
    prev = None
    while True:
        c = script.exports_sync.counts()
        if c == prev:
            return c
        prev = c
        time.sleep(0.2)


COUNTING_JS = r"""
// Every event is a GumEvent, a union as large as its largest member (the call event): 32
// bytes on x86_64; a block event is type (4, padded to 8), start, end.
const EVENT_BYTES = 32;
const counts = { blocks: 0, instructions: 0 };
const sizes = new Map();
function insnsOf(start, end) {
    let n = 0;
    let p = ptr(start.toString());
    const e = ptr(end.toString());
    while (p.compare(e) < 0) {
        p = Instruction.parse(p).next;
        n++;
    }
    return n;
}
function onReceive(events) {
    // read the raw events (Stalker.parse makes an array of pointers per event: 20x slower)
    const w = new BigUint64Array(events);
    const n = events.byteLength / EVENT_BYTES;
    counts.blocks += n;
    let insns = 0;
    for (let i = 0; i < n; i++) {
        const start = w[4 * i + 1];
        let k = sizes.get(start);
        if (k === undefined) {
            k = insnsOf(start, w[4 * i + 2]);
            sizes.set(start, k);
        }
        insns += k;
    }
    counts.instructions += insns;
}
"""
