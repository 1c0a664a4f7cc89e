#!/usr/bin/env python3
"""Latency a registry-backed door adds to one Produce while its schema ids
are cached (issue 31).

Starts Apache Kafka (the suite's harness), the registry stub and two
proxies from ANTIDOTE_BIN (default target/release/antidote) with the same
Avro policy (`registry: true`, `subject: {topic}-value`, a coordinates
rule): `pass` has `on_produce: pass` (relay only), `reject` has
`on_produce: reject` (every record judged at the door through the
registry's cached schema). The values are serialized by confluent-kafka's
AvroSerializer; one Produce per record (librdkafka, acks=all, linger 0,
flushed one by one), so each round trip is one request. Paths alternate in
every round (direct, pass, reject) to spread drift over all three.

Reports, per path, the round-trip median and p99 over all rounds, the
door's added latency (reject minus pass, medians), and each proxy's CPU
per request (utime + stime from /proc over its own runs).

    nice .venv/bin/python scripts/bench/door_registry_latency.py [N] [ROUNDS]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("ANTIDOTE_BIN", str(ROOT / "target/release/antidote"))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

import clients as c  # noqa: E402
import harness as h  # noqa: E402
import poison_support as ps  # noqa: E402
from registry_stub import Registry  # noqa: E402

PREFIX = "benchdsr."
TRIGGER = json.dumps({"type": "record", "name": "Trigger", "namespace": "geo", "fields": [
    {"name": "device_id", "type": "string"},
    {"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}]})


def policy(on_produce: str) -> str:
    return f"""policies:
  - name: bench-door-sr
    topics: ["{PREFIX}*"]
    value: {{ format: avro, wire: confluent, registry: true, subject: "{{topic}}-value" }}
    rules:
      - coordinates: {{ lat: /lat, lon: /lon }}
    on_produce: {on_produce}
"""


class RegistryProxy(ps.PolicyProxy):
    registry_url: str = ""

    def config_yaml(self) -> str:
        return ps.PolicyProxy.config_yaml(self) + (
            f"schema_registry:\n  url: [\"{self.registry_url}\"]\n  timeout: 1s\n")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_trips(bootstrap: str, topic: str, values: list[bytes]) -> list[float]:
    """Seconds of each produce-and-acknowledge, one request per record."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                     "log_level": 3})
    p.produce(topic, value=values[0])            # connect and learn metadata first
    assert p.flush(30) == 0
    out = []
    for v in values:
        t0 = time.perf_counter()
        p.produce(topic, value=v)
        assert p.flush(30) == 0
        out.append(time.perf_counter() - t0)
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    work = Path(tempfile.mkdtemp(prefix="bench-door-sr-"))
    broker = h.KafkaBroker(work).start()
    registry = Registry().start()
    proxies = {}
    try:
        for name, on_produce in (("pass", "pass"), ("reject", "reject")):
            f = work / f"{name}.yaml"
            f.write_text(policy(on_produce))
            p = RegistryProxy(work, upstream=[broker.bootstrap], policies=[f],
                              name=f"antidote-{name}")
            p.registry_url = registry.url
            proxies[name] = p.start()
        ep = c.Endpoint(broker.bootstrap)
        sr = SchemaRegistryClient({"url": registry.url})
        lat: dict[str, list[float]] = {"direct": [], "pass": [], "reject": []}
        cpu = {"pass": 0.0, "reject": 0.0}
        for r in range(rounds):
            for path in ("direct", "pass", "reject"):
                topic = f"{PREFIX}{path}-{r}-{time.monotonic_ns()}"
                c.ck_create_topic(ep, topic, 1)
                ser = AvroSerializer(sr, TRIGGER, conf={"auto.register.schemas": True})
                ctx = SerializationContext(topic, MessageField.VALUE)
                values = [ser({"device_id": f"d-{i}", "lat": 52.0 + i % 30, "lon": 4.3}, ctx)
                          for i in range(n)]
                bootstrap = broker.bootstrap if path == "direct" else proxies[path].bootstrap
                pid = proxies[path].proc.pid if path != "direct" else None
                before = cpu_seconds(pid) if pid else 0.0
                xs = round_trips(bootstrap, topic, values)
                if pid:
                    cpu[path] += cpu_seconds(pid) - before
                lat[path] += xs
                print(f"round {r} {path:6}: p50 {pct(xs, .5) * 1e6:7.0f} us  "
                      f"p99 {pct(xs, .99) * 1e6:7.0f} us", flush=True)
        print(f"records: {n} x {rounds} rounds, one Produce (acks=all) per record, "
              f"Avro values via the registry, ids cached after the first")
        for path, xs in lat.items():
            print(f"{path:6} p50 {pct(xs, .5) * 1e6:7.0f} us  p99 {pct(xs, .99) * 1e6:7.0f} us  "
                  f"mean {statistics.fmean(xs) * 1e6:7.0f} us")
        added = (pct(lat["reject"], .5) - pct(lat["pass"], .5)) * 1e6
        print(f"door added latency (reject p50 - pass p50): {added:.0f} us per Produce")
        for path in ("pass", "reject"):
            requests = n * rounds
            print(f"{path} CPU {cpu[path]:.2f} s for {requests} requests = "
                  f"{cpu[path] / requests * 1e6:.1f} us/request")
        print("loadavg at end:", Path("/proc/loadavg").read_text().strip())
    finally:
        for p in proxies.values():
            p.stop_and_check()
        registry.stop()
        broker.stop()


if __name__ == "__main__":
    main()
