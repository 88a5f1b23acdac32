#!/usr/bin/env python3
"""Minimal GDB remote-protocol stepping client: the floor for itrace's GDB
recorder. Connects to a stub, reads the target description (qemu 7.2 wants
it before anything else), then sends `s` until the program exits, with acks
and checksums and nothing else (no register reads, no decoding, no records).
Prints `STEPS SECONDS`.

usage: gdb_step.py HOST:PORT
"""
import socket
import sys
import time


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()

    def read_packet():
        nonlocal buf
        while True:
            start = buf.find(b"$")
            if start >= 0:
                end = buf.find(b"#", start)
                if end >= 0 and len(buf) >= end + 3:
                    payload = bytes(buf[start + 1:end])
                    del buf[:end + 3]
                    return payload
            data = s.recv(65536)
            if not data:
                raise SystemExit("stub closed the connection")
            buf += data

    def request(payload, ack=b""):
        csum = sum(payload) & 0xFF
        s.sendall(ack + b"$" + payload + b"#%02x" % csum)
        return read_packet()

    request(b"qSupported:xmlRegisters=i386")
    off = 0
    while True:
        r = request(b"qXfer:features:read:target.xml:%x,f00" % off, b"+")
        off += len(r) - 1
        if r[:1] != b"m":
            break
    steps = 0
    t0 = time.monotonic()
    while True:
        # The ack of the previous reply travels with the next request, as itrace does.
        r = request(b"s", b"+")
        steps += 1
        if r[:1] in (b"W", b"X"):
            break
    s.sendall(b"+")
    print(steps, time.monotonic() - t0)


if __name__ == "__main__":
    main()
