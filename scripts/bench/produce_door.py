#!/usr/bin/env python3
"""End-to-end produce throughput, direct to tansu vs through antidote with
`on_produce: reject` (every record judged at the door), and through a second
antidote with the same policy but `on_produce: pass` (relay only), which
separates the door's cost from the relay's.

Starts its own tansu and antidote (ANTIDOTE_BIN, default target/debug/antidote)
on loopback, then in ROUNDS rounds produces N valid JSON geofence triggers
(about 250 bytes each, librdkafka, acks=all, lz4, linger 5 ms) once direct and
once through each proxy, each to a fresh topic, and reports records/s per
path (median of the rounds), the ratios, and each proxy's CPU seconds per
record (utime + stime from /proc, over its produce runs). Alternating the
paths in every round spreads drift over both.

    nice .venv/bin/python scripts/bench/produce_door.py [N] [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import confluent_kafka as ck  # noqa: E402

import clients as c  # noqa: E402
import harness as h  # noqa: E402
import poison_support as ps  # noqa: E402

PREFIX = "benchdoor."
POLICY = f"""policies:
  - name: bench-door
    topics: ["{PREFIX}*"]
    value:
      format: json
      schema: {ps.JSON_SCHEMA}
{ps.RULES}    on_produce: reject
"""


class DoorProxy(ps.PolicyProxy):
    pass


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce(bootstrap: str, topic: str, values: list[tuple[bytes, bytes, list]]) -> float:
    """Seconds from the first produce() to the last delivery report."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                     "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000,
                     "log_level": 3})
    failed = []

    def report(err, _m):
        if err is not None:
            failed.append(err)

    start = time.monotonic()
    for key, value, headers in values:
        while True:
            try:
                p.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(120) == 0, "records left undelivered"
    took = time.monotonic() - start
    assert not failed, f"{len(failed)} delivery errors, first: {failed[0]}"
    return took


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    work = Path(tempfile.mkdtemp(prefix="produce-door-"))
    (work / "door.yaml").write_text(POLICY)
    broker = h.Tansu(work).start()
    (work / "pass.yaml").write_text(POLICY.replace("on_produce: reject", "on_produce: pass"))
    proxy = DoorProxy(work, upstream=[broker.bootstrap], policies=[work / "door.yaml"],
                      name="bench-door")
    relay = DoorProxy(work, upstream=[broker.bootstrap], policies=[work / "pass.yaml"],
                      name="bench-pass")
    proxy.start()
    relay.start()
    procs = {"proxy": proxy, "pass": relay}
    try:
        recs = [ps.json_rec("valid", i) for i in range(n)]
        values = [(r.key, r.value, list(r.headers)) for r in recs]
        size = sum(len(v) for _, v, _ in values) / n
        rates = {"direct": [], "pass": [], "proxy": []}
        cpu = {"pass": 0.0, "proxy": 0.0}
        for rnd in range(rounds):
            for path in ("direct", "pass", "proxy"):
                topic = ps.unique_topic(PREFIX, f"{path}{rnd}")
                c.ck_create_topic(c.Endpoint(broker.bootstrap), topic)
                bootstrap = broker.bootstrap if path == "direct" else procs[path].bootstrap
                pid = procs[path].proc.pid if path != "direct" else None
                before = cpu_seconds(pid) if pid else 0.0
                took = produce(bootstrap, topic, values)
                if pid:
                    cpu[path] += cpu_seconds(pid) - before
                got = ps.wait_high_watermark(broker.port, topic, 0, n)
                assert got == n, f"{path}: high watermark {got}, expected {n}"
                rates[path].append(n / took)
                print(f"round {rnd} {path:6}: {n} records in {took:.2f} s = "
                      f"{n / took:,.0f} rec/s", flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"records: {n} x {rounds} rounds, {size:.0f}-byte JSON values, lz4, acks=all")
        for k in ("direct", "pass", "proxy"):
            print(f"{k:6} median {med[k]:,.0f} rec/s (all: {[round(x) for x in rates[k]]})")
        print(f"reject/direct ratio {med['proxy'] / med['direct']:.2f}, "
              f"pass/direct {med['pass'] / med['direct']:.2f}, "
              f"reject/pass {med['proxy'] / med['pass']:.2f}")
        for k in ("pass", "proxy"):
            print(f"{k} CPU {cpu[k]:.2f} s for {n * rounds} records = "
                  f"{cpu[k] / (n * rounds) * 1e6:.2f} us/record")
        print(f"loadavg at end: {Path('/proc/loadavg').read_text().strip()}")
    finally:
        proxy.stop_and_check()
        relay.stop_and_check()
        broker.stop()


if __name__ == "__main__":
    main()
