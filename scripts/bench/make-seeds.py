#!/usr/bin/env python3
"""Write the small seed corpora under fuzz/corpus/<target>/ (deterministic).

Needs the repo's .venv (lz4, zstandard) for compressed batches:
    .venv/bin/python scripts/bench/make-seeds.py
"""
import gzip, os, struct, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "fuzz" / "corpus"

# --- CRC-32C (Castagnoli), table driven -------------------------------------
_T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _T.append(c)

def crc32c(b: bytes) -> int:
    c = 0xFFFFFFFF
    for x in b:
        c = _T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF

def varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80); z >>= 7
    out.append(z)
    return bytes(out)

def nullable(b):
    return varint(-1) if b is None else varint(len(b)) + b

def record(i, value, headers=((b"idempotency-key", b"k"),)):
    body = b"\x00" + varint(i) + varint(i) + nullable(b"key-%d" % i) + nullable(value)
    body += varint(len(headers)) + b"".join(nullable(k) + nullable(v) for k, v in headers)
    return varint(len(body)) + body

def batch(base, values, codec=0, attrs_extra=0, ts=1_780_000_000_000, pid=-1):
    recs = b"".join(record(i, v) for i, v in enumerate(values))
    if codec == 1:
        recs = gzip.compress(recs, mtime=0)
    elif codec == 3:
        import lz4.frame
        recs = lz4.frame.compress(recs, block_linked=False)
    elif codec == 4:
        import zstandard
        recs = zstandard.ZstdCompressor().compress(recs)
    attrs = codec | attrs_extra
    after_crc = struct.pack(">hiqqqhii", attrs, len(values) - 1, ts, ts + len(values), pid, -1, -1, len(values)) + recs
    crc = crc32c(after_crc)
    tail = struct.pack(">ibI", -1, 2, crc) + after_crc
    return struct.pack(">qi", base, len(tail)) + tail

def json_value(i, lat=48.1):
    return (b'{"device_id":"device-%08d","geofence_id":"fence-00042","lat":%s,"lon":2.35,'
            b'"transition":"ENTER","speed_mps":3.5,"event_time_ms":1780000000000,"accuracy_m":4.0}'
            % (i, str(lat).encode()))

def zz(n):
    return varint(n)

def avro_value(lat=48.1, sid=1):
    out = b"\x00" + struct.pack(">I", sid)
    for s in (b"device-1", b"fence-1"):
        out += zz(len(s)) + s
    out += struct.pack("<dd", lat, 2.35) + zz(0) + zz(1) + struct.pack("<d", 3.5) + zz(1_780_000_000_000) + zz(0)
    return out

def pb_varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80); n >>= 7
    out.append(n)
    return bytes(out)

def protobuf_value(lat=48.1):
    out = b"\x00\x00\x00\x00\x01\x00"
    out += b"\x0a\x08device-1\x12\x07fence-1"
    out += b"\x19" + struct.pack("<d", lat) + b"\x21" + struct.pack("<d", 2.35)
    out += b"\x28\x01\x31" + struct.pack("<d", 3.5) + b"\x38" + pb_varint(1_780_000_000_000)
    return out

def frame(api_key, version, corr, client=b"bench", body=b"", flexible=False):
    hdr = struct.pack(">hhih", api_key, version, corr, len(client)) + client
    if flexible:
        hdr += b"\x00"
    payload = hdr + body
    return struct.pack(">i", len(payload)) + payload

def write(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)

def main():
    vals = [json_value(i) for i in range(5)]
    poison = json_value(9, lat=91.5)
    # fetch_plan: flag byte + records section
    clean = batch(0, vals)
    mixed = batch(5, vals[:2] + [poison] + vals[2:])
    write("fetch_plan", "clean", b"\x00" + clean)
    write("fetch_plan", "mixed", b"\x00" + clean + mixed)
    write("fetch_plan", "mixed-held", b"\x02" + mixed)
    write("fetch_plan", "mixed-partial", b"\x00" + mixed + clean[:40])
    write("fetch_plan", "all-poison", b"\x00" + batch(0, [poison, poison]))
    write("fetch_plan", "txn-aborted", b"\x05" + batch(0, [poison], attrs_extra=0x10, pid=1))
    write("fetch_plan", "control", b"\x01" + batch(3, [b"\x00\x00\x00\x00"], attrs_extra=0x30, pid=1))
    for codec, name in ((1, "gzip"), (3, "lz4"), (4, "zstd")):
        write("fetch_plan", f"mixed-{name}", b"\x00" + batch(10, vals[:2] + [poison], codec=codec))
    # splice_raw: cut byte + 16-byte mask + section
    write("splice_raw", "none", b"\xff" + b"\x00" * 16 + clean)
    write("splice_raw", "drop2", b"\xff" + b"\x04" + b"\x00" * 15 + clean + mixed)
    write("splice_raw", "cut1", b"\x01" + b"\x01" + b"\x00" * 15 + mixed)
    for codec, name in ((1, "gzip"), (3, "lz4"), (4, "zstd")):
        write("splice_raw", f"drop-{name}", b"\xff" + b"\x05" + b"\x00" * 15 + batch(0, vals, codec=codec))
    # splice (arbitrary-derived struct): a few plain byte strings
    write("splice", "zeros", b"\x00" * 64)
    write("splice", "bytes", bytes(range(256)))
    write("splice", "json", b"\x01" * 8 + clean)
    # frame: 2-byte limit + stream of frames
    lim = struct.pack("<H", 0xFFFF)
    fetch_body = struct.pack(">iiiib", -1, 500, 1, 1048576, 0)
    write("frame", "apiversions", lim + frame(18, 3, 1, flexible=True, body=b"\x06bench\x041.0\x00"))
    write("frame", "two", lim + frame(3, 1, 2) + frame(1, 11, 3, body=fetch_body))
    write("frame", "truncated", lim + frame(0, 9, 4, body=b"x" * 20)[:-3])
    write("frame", "negative", lim + b"\xff\xff\xff\xf0" + b"\x00" * 8)
    # judge_*: values
    write("judge_json", "valid", vals[0])
    write("judge_json", "poison", poison)
    write("judge_json", "nested", b'{"a":' * 70 + b"1" + b"}" * 70)
    write("judge_json", "nulls", b'{"device_id":null,"lat":null,"lon":"x","transition":1,"event_time_ms":-1}')
    write("judge_avro", "valid", avro_value())
    write("judge_avro", "poison", avro_value(lat=91.5))
    write("judge_avro", "unknown-id", avro_value(sid=7))
    write("judge_avro", "truncated", avro_value()[:14])
    write("judge_protobuf", "valid", protobuf_value())
    write("judge_protobuf", "poison", protobuf_value(lat=91.5))
    write("judge_protobuf", "indexes", b"\x00\x00\x00\x00\x01\x02\x00" + protobuf_value()[6:])
    write("judge_protobuf", "truncated", protobuf_value()[:20])
    # policy_parse: the reference policies and a broken one
    for f in ("geofence.yaml", "geofence-avro.yaml", "geofence-protobuf.yaml"):
        write("policy_parse", f, (ROOT / "policies" / f).read_bytes())
    write("policy_parse", "bad-key", b"policies:\n  - name: x\n    topics: [a]\n    valu: {}\n")
    write("policy_parse", "glob", b"policies:\n  - name: g\n    topics: [\"geo.*\", \"a?\"]\n    value: {format: bytes, max_bytes: 10}\n    on_invalid: drop\n    dead_letter: {topic: \"{topic}.{class}\"}\n")
    print(f"seeds written under {OUT}", file=sys.stderr)

if __name__ == "__main__":
    main()
