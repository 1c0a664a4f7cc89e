#!/usr/bin/env python3
"""Measure what running several instances costs (issue 13), against a tansu
started here on loopback, with the debug or release binary of this checkout.

1. Tail delay: instance A diverts a record (a raw Fetch through A returns
   once the record is acknowledged in the DLT); instance B's
   antidote_dlt_diversions_total{source="learned"} is polled every 5 ms until
   it counts it. Reported: p50 and max over the trials.
2. Cost per diversion: the latency of a raw Fetch through one instance that
   diverts one new poison record (the DLT partition's lease is held after the
   first write; each write reads the DLT partition to its end first), and the
   two extra requests on their own, straight to tansu: the catch-up Fetch at
   the end of a DLT partition and InitProducerId (once per lease).

Run: .venv/bin/python scripts/fleet-measure.py [trials]
"""
from __future__ import annotations

import re
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import clients as c  # noqa: E402
import harness as h  # noqa: E402
import poison_support as ps  # noqa: E402
from test_ops import POLICY, OpsAntidote, http_get  # noqa: E402


def learned(port: int) -> int:
    _, text = http_get(port, "/metrics")
    m = re.search(r'antidote_dlt_diversions_total\{source="learned"\} (\d+)', text)
    return int(m.group(1)) if m else 0


def ms(xs):
    xs = sorted(xs)
    return f"p50 {statistics.median(xs) * 1000:.1f} ms, max {xs[-1] * 1000:.1f} ms (n={len(xs)})"


def raw_end_fetch(port: int, topic: str, offset: int) -> float:
    body = (struct.pack(">iiiib", -1, 1, 1, 1 << 20, 1) + struct.pack(">ii", 0, -1)
            + struct.pack(">i", 1) + h.kstr(topic) + struct.pack(">i", 1)
            + struct.pack(">iiqqi", 0, -1, offset, -1, 1 << 20) + struct.pack(">i", 0) + h.kstr(""))
    with socket.create_connection((h.HOST, port)) as s:
        t = time.monotonic()
        h.roundtrip(s, 1, 11, 7, body)
        return time.monotonic() - t


def main() -> int:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    d = Path(tempfile.mkdtemp(prefix="fleet-measure-"))
    broker = h.Tansu(d).start()
    ep = c.Endpoint(broker.bootstrap)
    topic = "measure"
    c.ck_create_topic(ep, topic, 1)
    c.ck_create_topic(ep, f"{topic}.dlt", 1)
    policy = d / "p.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    a, b = [OpsAntidote(d, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        admin_port=h.free_port(), name=f"m{i}").start() for i in range(2)]
    try:
        time.sleep(1)
        delays, fetches = [], []
        for i in range(trials):
            c.ck_produce(ep, topic, [c.Rec(0, -1, b"k", b'{"lat": 95}')])
            ps.wait_high_watermark(broker.port, topic, 0, i + 1)
            before = learned(b.admin_port)
            t0 = time.monotonic()
            ps.fetch_partition(a.broker_port(), topic, 0, i)
            t1 = time.monotonic()
            fetches.append(t1 - t0)
            deadline = t1 + 10
            while learned(b.admin_port) <= before and time.monotonic() < deadline:
                time.sleep(0.005)
            delays.append(time.monotonic() - t1)
        print(f"tail delay (A's diversion acknowledged -> B's ledger has it): {ms(delays)}")
        print(f"raw Fetch through A diverting one record: {ms(fetches[1:])} "
              f"(first, with DLT lease: {fetches[0] * 1000:.1f} ms)")
        ends = [raw_end_fetch(broker.port, f"{topic}.dlt", trials) for _ in range(trials)]
        print(f"catch-up Fetch at the DLT partition's end, straight to tansu: {ms(ends)}")
        inits = []
        for _ in range(trials):
            with socket.create_connection((h.HOST, broker.port)) as s:
                hdr = struct.pack(">hhi", 22, 4, 9) + h.kstr("m") + b"\x00"
                tid = b"antidote-dlt/measure.dlt/0"
                body = bytes([len(tid) + 1]) + tid + struct.pack(">iqh", 60000, -1, -1) + b"\x00"
                t = time.monotonic()
                s.sendall(struct.pack(">i", len(hdr + body)) + hdr + body)
                n = struct.unpack(">i", h.recv_exact(s, 4))[0]
                h.recv_exact(s, n)
                inits.append(time.monotonic() - t)
        print(f"InitProducerId (once per lease), straight to tansu: {ms(inits)}")
    finally:
        for p in (a, b):
            h.stop_process(p.proc)
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
