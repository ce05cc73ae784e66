#!/usr/bin/env python3
"""gen_bus_corpus.py - seeds for fuzz_bus: one sealed bus message of each
kind (cluster/tc_bus_msg.h, TXB2), with the fuzz key of fuzz_bus.c, plus
the old unauthenticated TXB1 format and a few near misses.

    tests/fuzz/gen_bus_corpus.py tests/fuzz/corpus-bus

libsodium's crypto_auth is HMAC-SHA-512 truncated to 32 bytes.
"""
import hashlib, hmac, os, struct, sys

KEY = bytes.fromhex("6275732d66757a7a2d6b65792d6e6f742d612d7265616c2d7365637265742121")


def s8(b):
    return struct.pack(">B", len(b)) + b


def msg(kind, payload, frm=2, inc=0x1234ABCD, seq=7, ms=1700000000000, flags=0, key=KEY):
    body = b"TXB2" + struct.pack(">BBHIIQQ", kind, flags, frm, inc, len(payload), seq, ms) + payload
    return body + hmac.new(key, body, hashlib.sha512).digest()[:32]


frame = bytes(range(20)) + b"\x81\x01\xa3x:1"  # opaque to the bus decoder
seeds = {
    "hello.bin": msg(1, s8(b"127.0.0.1:8091"), flags=3),
    "hello-empty.bin": msg(1, s8(b"")),
    "released.bin": msg(2, struct.pack(">H", 3) + s8(b"127.0.0.1:8091:1") + s8(b"a:2") + s8(b"b:3")),
    "released-none.bin": msg(2, struct.pack(">H", 0)),
    "forward.bin": msg(3, struct.pack(">HQI", 0, 0x0102030405060708, 9000) + s8(b"rm-1")
                       + struct.pack(">I", len(frame)) + frame),
    "result-answered.bin": msg(4, struct.pack(">HQB", 1, 42, 0) + s8(b"127.0.0.1:8091:7") + struct.pack(">q", 5)
                               + struct.pack(">I", len(frame)) + frame),
    "result-no-rm.bin": msg(4, struct.pack(">HQB", 1, 42, 1) + s8(b"x:1") + struct.pack(">q", -1)
                            + struct.pack(">I", 0)),
    "wrong-key.bin": msg(1, s8(b"h:1"), key=b"\x00" * 32),
    "old-txb1.bin": b"TXB1" + struct.pack(">BBHII", 4, 0, 777, 12345, 15) + struct.pack(">HQBI", 1, 42, 0, 0),
}
# Prefixed with one byte: fuzz_bus's check (c) seals what follows it.
seeds["prefixed-forward.bin"] = b"\x05" + seeds["forward.bin"][:-32]

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus-bus")
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
