#!/usr/bin/env python3
"""Seed inputs for the fuzz targets, from real traces and real instructions.

    fuzz/make-seeds.py OUT TRACE_OR_DIR... [--elf ISA:FILE ...]

Trace seeds (OUT/trace/, for trace_reader, arc and report): each trace file as a format 2.0
or 3.0 file (1.0 files are converted to 2.0: same records, 2.0 headers and checksums), cut to
the targets' -max_len, with the control byte in front twice over (0x01: the target fixes the checksums;
0x00: the bytes as they are). The first directory of every mapped file's path is overwritten
with x's ("/usr/lib/..." -> "/xxx/lib/...", checksums recomputed), so
the arc and report targets never load symbols from binaries on this machine: a run must not
depend on the machine, and loading libc's DWARF lines per input would make it crawl. Saved
vDSO images (ELF bytes inside the trace) stay as they are.

Instruction seeds (OUT/decode/): for each --elf ISA:FILE (ISA one of x86_64 i386 ppc64
ppc64le s390x), instructions listed by the matching objdump -d, every distinct branch-like
mnemonic's encodings and a sample of the rest, as the decode target reads them: ISA byte,
address (8 bytes, little-endian), instruction bytes.
"""

import hashlib
import os
import re
import struct
import subprocess
import sys
import zlib

MAX_LEN = 65536
ISAS = {"x86_64": (0, "objdump"), "i386": (1, "objdump"), "ppc64": (2, "powerpc64-linux-gnu-objdump"),
        "ppc64le": (3, "powerpc64le-linux-gnu-objdump"), "s390x": (4, "s390x-linux-gnu-objdump")}


def save(out, data):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def crc(b):
    return zlib.crc32(bytes(b)) & 0xFFFFFFFF


def parse(b):
    """(byte order, major, header, [(stream, flags, length, payload)]) of a 1.0, 2.0 or 3.0 trace; None if none."""
    if len(b) < 64 or b[:4] != b"ITRC" or b[4] not in (1, 2):
        return None
    e = ">" if b[4] == 2 else "<"
    major = struct.unpack_from(e + "H", b, 6)[0]
    if major not in (1, 2, 3):
        return None
    hlen = 16 if major == 1 else 24
    chunks, off = [], 64
    while off + hlen <= len(b) and b[off:off + 4] == b"CHNK":
        stream, flags, length = struct.unpack_from(e + "HHI", b, off + 4)
        payload = b[off + hlen:off + hlen + length]
        chunks.append((stream, flags, length, bytearray(payload)))
        off += hlen + length
    return e, major, bytearray(b[:64]), chunks


def anonymise(payload, e):
    """Overwrite the first directory of the paths of MTE segment records."""
    p = 0
    while p + 16 <= len(payload):
        rlen = struct.unpack_from(e + "H", payload, p)[0] & 0xFFFC
        major, minor = struct.unpack_from(e + "HI", payload, p + 2)
        if rlen < 16 or p + rlen > len(payload):
            break
        if major == 0x19 and minor == 0x01 and rlen >= 50:
            n = struct.unpack_from(e + "H", payload, p + 48)[0]
            path = payload[p + 50:p + 50 + n]
            if path.startswith(b"/"):
                first = path[1:].split(b"/", 1)[0]
                payload[p + 51:p + 51 + len(first)] = b"x" * len(first)
        p += rlen


def normalise(b):
    """The trace as a 2.0 or 3.0 file (1.0 files converted to 2.0), paths anonymised, every checksum right."""
    parsed = parse(b)
    if parsed is None:
        return bytes(b)
    e, major, header, chunks = parsed
    struct.pack_into(e + "HH", header, 6, max(major, 2), 0)
    header[56:64] = bytes(8)
    struct.pack_into(e + "I", header, 60, crc(header[:60]))
    out = bytearray(header)
    for seq, (stream, flags, length, payload) in enumerate(chunks):
        if stream == 0xFFFE and not flags & 2:  # compressed MTE chunks (3.0) stay as they are
            anonymise(payload, e)
        h = bytearray(b"CHNK" + struct.pack(e + "HHIII", stream, flags, length, crc(payload), seq))
        h += struct.pack(e + "I", crc(h))
        out += h + payload
    return bytes(out)


def trace_seeds(out, path):
    with open(path, "rb") as f:
        data = normalise(f.read())[: MAX_LEN - 1]
    save(os.path.join(out, "trace"), b"\x01" + data)
    save(os.path.join(out, "trace"), b"\x00" + data)


BRANCHY = re.compile(r"^(j|b|call|ret|loop|sys|int|iret|sc|rfid|br|bc|bas|bal|bras|svc|c.*j$|c.*b$|bct|bxh|bxl|lpsw)")


def decode_seeds(out, isa, elf, per_file=400):
    code, objdump = ISAS[isa]
    text = subprocess.run([objdump, "-d", elf], check=True, capture_output=True, text=True).stdout
    seen, rest = {}, []
    for line in text.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\t((?:[0-9a-f]{2} )+)\s*\t?(\S*)", line)
        if not m:
            continue
        addr, raw, mnem = int(m.group(1), 16), bytes.fromhex(m.group(2).replace(" ", "")), m.group(3)
        item = bytes([code]) + struct.pack("<Q", addr) + raw
        if BRANCHY.match(mnem):
            seen.setdefault((mnem, raw), item)
        else:
            rest.append(item)
    items = list(seen.values())[:per_file] + rest[:: max(1, len(rest) // 100)]
    for item in items:
        save(os.path.join(out, "decode"), item)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    out, args = argv[0], argv[1:]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--elf":
            isa, elf = args[i + 1].split(":", 1)
            decode_seeds(out, isa, elf)
            i += 2
            continue
        if os.path.isdir(a):
            for root, _, files in os.walk(a):
                for f in files:
                    if f.endswith(".itr"):
                        trace_seeds(out, os.path.join(root, f))
        else:
            trace_seeds(out, a)
        i += 1
    for sub in ("trace", "decode"):
        d = os.path.join(out, sub)
        if os.path.isdir(d):
            print(f"{d}: {len(os.listdir(d))} files")


if __name__ == "__main__":
    main(sys.argv[1:])
