"""Real frameworks through the proxy, each with poison mixed in by another
producer that writes to the broker directly:

- Kafka's own verification tools: `VerifiableProducer` writes through the
  proxy while a librdkafka producer writes poison straight to the broker;
  `VerifiableConsumer` reads through the proxy in a group, classic with the
  tool's own commits (the offset after the last record it was given) and
  KIP-848 (`--group-protocol consumer`) with auto-commit (the position):
  every acknowledged valid record is consumed exactly once, no poison, each
  poison record in its DLT once, and the committed offsets are where the
  tool's commit rule puts them (the end of every partition with auto-commit,
  also of one that ends in poison).
- A Kafka Streams application with `processing.guarantee=exactly_once_v2`
  (tests/java/StreamsDerive.java), classic and KIP-1071 streams groups,
  reading a policy topic through the proxy and writing a derived topic
  through it: the output, read with read_committed, holds each valid input's
  result exactly once and nothing derived from poison.
- Kafka Connect standalone with a sink connector (tests/java/LinesSink.java:
  Maven Central serves no connect-file 4.4.0) reading a policy topic through
  the proxy: the sink gets each valid record once, no poison, and its
  group's committed offsets reach the end of each partition.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import confluent_kafka as ck
import pytest

import clients as c
import harness as h
import poison_support as ps
from test_java_clients import java_classes  # noqa: F401 (fixture)

pytestmark = h.needs_kafka

# VerifiableProducer writes increasing integers as strings ("0", "1", ...):
# JSON integers. The policy takes integers >= 0; the poison producer writes
# negative numbers and text that is not JSON.
INT_PREFIX = "fwint."
INT_POLICY = """policies:
  - name: fw-verifiable
    topics: ["fwint.*"]
    value:
      format: json
      schema: {schema}
    on_invalid: divert
"""


@pytest.fixture(scope="module")
def fproxy(workdir, broker, tmp_path_factory):
    d = tmp_path_factory.mktemp("framework-policies")
    (d / "int.schema.json").write_text('{"type": "integer", "minimum": 0}')
    (d / "int.yaml").write_text(INT_POLICY.format(schema=d / "int.schema.json"))
    geo = ps.write_policies(d / "geo")
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap],
                              policies=[d / "int.yaml", geo], name="antidote-frameworks",
                              admin=True)
    yield p
    p.stop_and_check()


def requests_seen(p) -> Counter:
    """The proxy's client requests so far, by (API name, version)."""
    seen = Counter()
    for line in p.metrics().splitlines():
        if line.startswith("antidote_client_requests_total{"):
            labels, n = line.rsplit(" ", 1)
            api = labels.split('api="', 1)[1].split('"', 1)[0]
            version = int(labels.split('version="', 1)[1].split('"', 1)[0])
            seen[(api, version)] += int(float(n))
    return seen


def versions_used(p, before: Counter) -> dict[str, set[int]]:
    """The versions of each API requested through the proxy since `before`."""
    used: dict[str, set[int]] = {}
    for (api, v), n in requests_seen(p).items():
        if n > before[(api, v)]:
            used.setdefault(api, set()).add(v)
    return used


def assert_newest_versions_used(p, broker, before: Counter, apis: list[str]) -> dict:
    """Each of `apis` was requested through the proxy since `before`, at the
    highest version the broker offers (Produce v13, by topic id, and Fetch
    v18 from the Java 4.4 clients on Kafka 4.4; Kafka Streams' TxnOffsetCommit
    v6, by topic id). Returns every API's versions used. (The consumer's
    own commits stay at OffsetCommit v9, by name, in these runs: the
    raw-frame tests in test_topic_ids.py send v10.)"""
    import socket
    with socket.create_connection((h.HOST, broker.port), timeout=10) as s:
        offered = h.api_versions(s)
    keys = {"Produce": 0, "Fetch": 1, "TxnOffsetCommit": 28, "ConsumerGroupHeartbeat": 68,
            "StreamsGroupHeartbeat": 88}
    used = versions_used(p, before)
    for api in apis:
        assert api in used, f"no {api} request through the proxy: {used}"
        assert max(used[api]) == offered[keys[api]][1], (api, used, offered[keys[api]])
    return used


def java(classes: Path, *args: str, extra_cp: str = "") -> list[str]:
    cp = f"{h.kafka_classpath()}:{classes}" + (f":{extra_cp}" if extra_cp else "")
    return ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
            "-Dlog4j2.level=WARN", "-cp", cp, *args]


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """A group's committed offsets, asked of the broker directly."""
    cons = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = cons.committed([ck.TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        cons.close()


def end_offsets(broker_port: int, topic: str, partitions: int) -> dict[int, int]:
    return {p: ps.high_watermark(broker_port, topic, p) for p in range(partitions)}


def poison_writer(ep: c.Endpoint, topic: str, partitions: int, n: int,
                  stop: threading.Event) -> tuple[threading.Thread, list]:
    """A librdkafka producer writing `n` poison records straight to the broker,
    spread over the run, round robin over the partitions; returns the thread
    and the (partition, value) list it fills."""
    sent: list[tuple[int, bytes]] = []

    def run():
        p = ck.Producer(ep.ck(**{"linger.ms": 0, "acks": "all"}))
        for i in range(n):
            if stop.is_set():
                break
            v = (f"-{i + 1}" if i % 2 else f"poison-{i}").encode()
            part = i % partitions
            p.produce(topic, value=v, partition=part)
            p.flush(30)
            sent.append((part, v))
            time.sleep(0.1)
        assert p.flush(30) == 0
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, sent


# ---------------------------------------------------------------------------
# VerifiableProducer and VerifiableConsumer
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("protocol,commits", [("classic", "tool"), ("consumer", "auto")])
def test_verifiable_producer_and_consumer_see_every_valid_record_once_and_no_poison(
        protocol, commits, fproxy, broker, java_classes, tmp_path):
    ep = c.Endpoint(broker.bootstrap, "direct")
    topic = ps.unique_topic(INT_PREFIX, protocol)
    parts = 3
    c.ck_create_topic(ep, topic, parts)
    before = requests_seen(fproxy)
    stop = threading.Event()
    poisoner, poison = poison_writer(ep, topic, parts, 30, stop)
    producer = h.Lines(java(java_classes, "org.apache.kafka.tools.VerifiableProducer",
                          "--bootstrap-server", fproxy.bootstrap, "--topic", topic,
                          "--max-messages", "600", "--throughput", "300", "--acks", "-1",
                          "--repeating-keys", "30"),
                     tmp_path / "producer.log")
    producer.wait(lambda ev: any(e.get("name") == "shutdown_complete" for e in ev), 120,
                  "VerifiableProducer finished")
    producer.stop()
    poisoner.join(60)
    # The last record of partition 0 is poison: the tool's commits end one short of it,
    # the position (auto-commit) does not.
    p = ck.Producer(ep.ck())
    p.produce(topic, value=b"poison-last", partition=0)
    assert p.flush(30) == 0
    poison.append((0, b"poison-last"))

    sends = producer.snapshot()
    acked = [e for e in sends if e.get("name") == "producer_send_success"]
    failed = [e for e in sends if e.get("name") == "producer_send_error"]
    assert len(acked) == 600 and not failed, (len(acked), failed[:3])
    acked_values = Counter(e["value"] for e in acked)

    group = f"fw-verifiable-{protocol}-{uuid.uuid4().hex[:8]}"
    cmd = ["org.apache.kafka.tools.VerifiableConsumer", "--bootstrap-server", fproxy.bootstrap,
           "--topic", topic, "--group-id", group, "--group-protocol", protocol, "--verbose"]
    if commits == "auto":
        cmd.append("--enable-autocommit")
    consumer = h.Lines(java(java_classes, *cmd), tmp_path / "consumer.log")

    def consumed(ev):
        return Counter(e["value"] for e in ev if e.get("name") == "record_data")
    consumer.wait(lambda ev: set(consumed(ev)) >= set(acked_values), 120,
                  "VerifiableConsumer read every acknowledged record")
    time.sleep(3)  # anything more (a duplicate, poison) would arrive now
    events = consumer.stop()
    assert any(e.get("name") == "shutdown_complete" for e in events), events[-5:]
    got = consumed(events)
    assert got == acked_values, {
        "duplicates": {v: n for v, n in got.items() if n > 1},
        "unexpected": [v for v in got if v not in acked_values][:10]}
    commit_errors = [e for e in events if e.get("name") == "offsets_committed"
                     and not e.get("success")]
    assert not commit_errors, commit_errors[:3]

    # Each poison record in the DLT once.
    dlt = ps.read_dlt(ep, f"{topic}.dlt", c.ck_partition_count(ep, f"{topic}.dlt"))
    assert Counter(r.value for r in dlt) == Counter(v for _, v in poison)

    assert_newest_versions_used(
        fproxy, broker, before,
        ["Produce", "Fetch"] + (["ConsumerGroupHeartbeat"] if protocol == "consumer" else []))

    ends = end_offsets(broker.port, topic, parts)
    last_valid = {}
    for e in events:
        if e.get("name") == "record_data":
            last_valid[e["partition"]] = max(last_valid.get(e["partition"], -1), e["offset"])
    have = committed(broker.bootstrap, group, topic, parts)
    if commits == "auto":
        assert have == ends, (have, ends)
    else:
        # The tool commits the offset after the last record it was given:
        # short of the end where a partition ends in poison (partition 0).
        assert have == {q: last_valid[q] + 1 for q in range(parts)}, (have, last_valid, ends)
        assert have[0] < ends[0] and all(have[q] <= ends[q] for q in range(parts))


# ---------------------------------------------------------------------------
# Kafka Streams, exactly_once_v2
# ---------------------------------------------------------------------------

def geo_records(n: int, parts: int, poison_every: int, base: int) -> tuple[list[c.Rec], list]:
    """Geofence records `base`..`base + n` (each value unique) round robin over
    the partitions, a poison kind every `poison_every`-th; returns them and
    the valid values."""
    kinds = ["lat", "enum", "garbage", "noheader", "nan"]
    recs, valid = [], []
    for i in range(n):
        kind = kinds[(i // poison_every) % len(kinds)] if i % poison_every == poison_every - 1 \
            else "valid"
        r = ps.json_rec(kind, base + i, partition=i % parts)
        recs.append(r)
        if kind == "valid":
            valid.append(r.value)
    return recs, valid


def read_committed_values(ep: c.Endpoint, topic: str, parts: int, want: int,
                          timeout: float = 90) -> list[bytes]:
    cons = ck.Consumer(ep.ck(**{"group.id": f"fw-reader-{uuid.uuid4().hex[:8]}",
                                "isolation.level": "read_committed",
                                "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    cons.assign([ck.TopicPartition(topic, p, 0) for p in range(parts)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        quiet_until = None
        while time.monotonic() < deadline:
            m = cons.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
                continue
            if len(got) >= want:
                quiet_until = quiet_until or time.monotonic() + 2
                if time.monotonic() > quiet_until:
                    break
        return got
    finally:
        cons.close()


@pytest.mark.parametrize("protocol", ["classic", "streams"])
def test_kafka_streams_exactly_once_v2_derives_each_valid_record_once(
        protocol, fproxy, broker, java_classes, tmp_path):
    if protocol == "streams":
        import socket
        with socket.create_connection((h.HOST, broker.port), timeout=10) as s:
            if 88 not in h.api_versions(s):
                pytest.skip(f"Kafka {h.KAFKA_VERSION} offers no streams groups (KIP-1071)")
    ep = c.Endpoint(broker.bootstrap, "direct")
    parts = 3
    src = ps.unique_topic(ps.JSON_PREFIX, f"streams-{protocol}")
    out = f"fw-derived-{uuid.uuid4().hex[:10]}"
    c.ck_create_topic(ep, src, parts)
    c.ck_create_topic(ep, out, parts)
    first, valid1 = geo_records(120, parts, 7, 0)
    c.ck_produce(ep, src, first)
    app = f"fw-streams-{protocol}-{uuid.uuid4().hex[:8]}"
    before = requests_seen(fproxy)
    streams = h.Lines(java(java_classes, "StreamsDerive", fproxy.bootstrap, app, src, out,
                         str(tmp_path / "state"), protocol),
                    tmp_path / "streams.log", stdin=subprocess.PIPE)
    try:
        streams.wait(lambda ev: any(e.get("state") == "RUNNING" for e in ev), 120,
                     "Streams RUNNING")
        # More records, valid and poison, while the application runs.
        second, valid2 = geo_records(120, parts, 5, 1000)
        c.ck_produce(ep, src, second)
        valid = valid1 + valid2
        want = Counter(b"derived:" + v for v in valid)
        got = read_committed_values(ep, out, parts, len(want))
        assert not [e for e in streams.snapshot() if "uncaught" in e], streams.snapshot()
    finally:
        streams.proc.stdin.close()
        events = streams.stop(grace=90)
    assert any(e.get("closed") for e in events), (events[-5:], h.read_log(streams.log, 4000))
    assert Counter(got) == want, {
        "missing": len(set(want) - set(got)),
        "duplicates": sum(n - 1 for n in Counter(got).values() if n > 1),
        "unexpected": [v[:80] for v in got if v not in want][:5]}
    # Read again after the application closed: still once each.
    assert Counter(read_committed_values(ep, out, parts, len(want))) == want
    assert_newest_versions_used(
        fproxy, broker, before, ["Produce", "Fetch", "TxnOffsetCommit"]
        + (["StreamsGroupHeartbeat"] if protocol == "streams" else []))
    poison = [r for r in first + second if r.value not in set(valid)]
    dlt = ps.read_dlt(ep, f"{src}.dlt", c.ck_partition_count(ep, f"{src}.dlt"))
    assert Counter(r.value for r in dlt) == Counter(r.value for r in poison)


# ---------------------------------------------------------------------------
# Kafka Connect standalone, a sink
# ---------------------------------------------------------------------------

def test_a_connect_sink_gets_each_valid_record_once_and_commits_the_ends(
        fproxy, broker, java_classes, tmp_path):
    ep = c.Endpoint(broker.bootstrap, "direct")
    parts = 2
    topic = ps.unique_topic(ps.JSON_PREFIX, "connect")
    c.ck_create_topic(ep, topic, parts)
    recs, valid = geo_records(100, parts, 6, 0)
    # Both partitions end in a valid record, so a sink's commit (the offset
    # after the last record it was given) is the partition's end.
    recs += [ps.json_rec("valid", 1000 + q, partition=q) for q in range(parts)]
    valid += [r.value for r in recs[-parts:]]
    c.ck_produce(ep, topic, recs)

    plugin = tmp_path / "plugin" / "META-INF" / "services"
    plugin.mkdir(parents=True)
    (plugin / "org.apache.kafka.connect.sink.SinkConnector").write_text("LinesSink\n")
    sink = tmp_path / "sink.jsonl"
    worker = tmp_path / "worker.properties"
    worker.write_text("\n".join([
        f"bootstrap.servers={fproxy.bootstrap}",
        "key.converter=org.apache.kafka.connect.converters.ByteArrayConverter",
        "value.converter=org.apache.kafka.connect.converters.ByteArrayConverter",
        f"offset.storage.file.filename={tmp_path / 'offsets'}",
        "offset.flush.interval.ms=500",
        f"listeners=http://127.0.0.1:{h.free_port()}",
        "plugin.discovery=service_load",
        "consumer.auto.offset.reset=earliest", ""]))
    connector = tmp_path / "lines.properties"
    name = f"lines-{uuid.uuid4().hex[:8]}"
    connector.write_text("\n".join([
        f"name={name}", "connector.class=LinesSink", "tasks.max=1", f"topics={topic}",
        f"file={sink}", ""]))
    proc = h.Lines(java(java_classes, "org.apache.kafka.connect.cli.ConnectStandalone",
                      str(worker), str(connector), extra_cp=str(tmp_path / "plugin")),
                 tmp_path / "connect.log")
    want = Counter(valid)
    group = f"connect-{name}"
    ends = end_offsets(broker.port, topic, parts)

    def lines() -> list[dict]:
        if not sink.exists():
            return []
        return [json.loads(x) for x in sink.read_text().splitlines() if x.endswith("}")]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.proc.poll() is not None:
                raise AssertionError(f"Connect exited {proc.proc.returncode}\n"
                                     f"{h.read_log(proc.log, 8000)}")
            if len(lines()) >= len(valid) and committed(broker.bootstrap, group, topic,
                                                        parts) == ends:
                break
            time.sleep(0.5)
        time.sleep(2)  # a duplicate or poison would arrive now
    finally:
        proc.stop()
    got = Counter(base64.b64decode(x["value"]) for x in lines())
    assert got == want, {"missing": len(set(want) - set(got)),
                         "unexpected": [v[:80] for v in got if v not in want][:5],
                         "log": h.read_log(proc.log, 3000)}
    assert committed(broker.bootstrap, group, topic, parts) == ends
