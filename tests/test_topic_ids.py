"""Requests that name topics by id only (KIP-516), through the proxy, at the
exact versions Kafka 4.4 offers, written with kafka-clients' own message
classes (tests/java/RawRequests.java) so no client picks the version:

- Produce v13 at the door (`on_produce: reject`): a valid batch lands, a
  batch with poison is refused with INVALID_RECORD and nothing of it is
  written, an id nobody knows is refused retriably (UNKNOWN_TOPIC_ID).
- A topic deleted and recreated under its old name while a Java 4.4
  producer writes through the door, with Produce v13 and no other version
  (the proxy's request metric): poison is refused before and after, each
  valid record acknowledged after the recreate landed is in the new topic
  at the offset its acknowledgement named, nothing else is there, the old
  id is answered UNKNOWN_TOPIC_ID and the new one judged by the topic's
  name.
- Fetch v18 by id (exactly 18 on Kafka 4.4, and counted as v18 by the
  proxy): poison removed and diverted; an unknown id gets the broker's own
  UNKNOWN_TOPIC_ID and the connection goes on.
- OffsetCommit and OffsetFetch v10 by id: committed through the proxy, the
  same offset read back through it and directly; an unknown id is refused.

TxnOffsetCommit v6 (by id) is sent by Kafka Streams exactly_once_v2 in
test_frameworks.py, with the version read from antidote's request metric.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient

import clients as c
import harness as h
import poison_support as ps
from test_java_clients import java_classes  # noqa: F401 (fixture)

pytestmark = h.needs_kafka

PREFIX = "tid."
INVALID_RECORD, UNKNOWN_TOPIC_ID = 87, 100


def policies() -> str:
    return ("policies:\n"
            "  - name: tid-json\n"
            f"    topics: [\"{PREFIX}*\"]\n"
            f"    value:\n      format: json\n      schema: {ps.JSON_SCHEMA}\n"
            + ps.RULES + "    on_produce: reject\n")


@pytest.fixture(scope="module")
def tproxy(workdir, broker, tmp_path_factory):
    d = tmp_path_factory.mktemp("tid-policies")
    (d / "tid.yaml").write_text(policies())
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[d / "tid.yaml"],
                              name="antidote-tid", admin=True)
    yield p
    p.stop_and_check()


@pytest.fixture(scope="module")
def offered(broker) -> dict[int, tuple[int, int]]:
    with socket.create_connection((h.HOST, broker.port), timeout=10) as s:
        return h.api_versions(s)


def raw(classes, *args: str) -> list[dict]:
    cp = f"{h.kafka_classpath()}:{classes}"
    r = subprocess.run(["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                        "-cp", cp, "RawRequests", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"RawRequests {args[:3]} exited {r.returncode}\n{r.stderr[-3000:]}"
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def topic_id(classes, proxy, topic: str) -> str:
    [m] = raw(classes, "metadata", proxy.bootstrap, topic)
    [t] = m["topics"]
    assert t["errorCode"] == 0, t
    return t["topicId"]


def batch_hex(values: list[bytes]) -> str:
    """One uncompressed v2 batch of `values` with the idempotency-key header
    the test policy requires (kafka-python's batch builder)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    now = int(time.time() * 1000)
    for i, v in enumerate(values):
        b.append(i, timestamp=now, key=None, value=v,
                 headers=[("idempotency-key", uuid.uuid4().hex.encode())])
    return bytes(b.build()).hex()


def produce(classes, proxy, tid: str, values: list[bytes], version: int = 13) -> dict:
    [r] = raw(classes, "produce", f"{h.HOST}:{proxy.broker_port()}", tid, "0", str(version),
              batch_hex(values))
    [t] = r["responses"]
    [p] = t["partitionResponses"]
    return p


def unknown_id() -> str:
    """A topic id no topic has (Kafka's base64url form)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def valid(i: int) -> bytes:
    return ps.json_value("valid", i)


def poison(i: int) -> bytes:
    return ps.json_value("lat", i)


def direct_records(broker, topic: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of partition 0, read directly."""
    ep = c.Endpoint(broker.bootstrap, "direct")
    hw = ps.high_watermark(broker.port, topic, 0)
    if hw == 0:
        return []
    return [(r.offset, r.value) for r in c.kp_consume_assign(ep, topic, [0], hw, timeout=30)]


def direct_values(broker, topic: str) -> list[bytes]:
    return [v for _, v in direct_records(broker, topic)]


def request_versions(proxy, api: str) -> dict[str, float]:
    """version -> requests of `api` the proxy counted (its request metric)."""
    import re
    out: dict[str, float] = {}
    for line in proxy.metrics().splitlines():
        if line.startswith("antidote_client_requests_total{") and f'api="{api}"' in line:
            m = re.search(r'version="(-?\d+)"', line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0) + float(line.rsplit(" ", 1)[1])
    return out


def new_topic(broker) -> str:
    t = ps.unique_topic(PREFIX)
    c.ck_create_topic(c.Endpoint(broker.bootstrap, "direct"), t, 1)
    return t


def test_produce_v13_at_the_door_judges_by_topic_id_and_refuses_an_unknown_id(
        tproxy, broker, java_classes, offered):
    if offered[0][1] < 13:
        pytest.skip(f"the broker offers Produce up to v{offered[0][1]}")
    topic = new_topic(broker)
    tid = topic_id(java_classes, tproxy, topic)
    ok = produce(java_classes, tproxy, tid, [valid(1), valid(2)])
    assert (ok["errorCode"], ok["baseOffset"]) == (0, 0), ok
    bad = produce(java_classes, tproxy, tid, [valid(3), poison(4), valid(5)])
    assert bad["errorCode"] == INVALID_RECORD, bad
    assert [e["batchIndex"] for e in bad["recordErrors"]] == [1], bad
    unknown = produce(java_classes, tproxy, unknown_id(), [valid(6)])
    assert unknown["errorCode"] == UNKNOWN_TOPIC_ID, unknown
    # Only the first batch was written.
    assert direct_values(broker, topic) == [valid(1), valid(2)]
    seen = tproxy.metrics()
    assert h.metric(seen, "antidote_client_requests_total", api="Produce", version="13") >= 3


def test_a_topic_recreated_under_its_old_name_while_a_java_producer_writes_is_judged_again(
        tproxy, broker, java_classes, offered, tmp_path):
    if offered[0][1] < 13:
        pytest.skip(f"the broker offers Produce up to v{offered[0][1]}")
    topic = new_topic(broker)
    old = topic_id(java_classes, tproxy, topic)
    values = [(poison(i) if i % 4 == 3 else valid(i)).decode() for i in range(120)]
    cp = f"{h.kafka_classpath()}:{java_classes}"
    produce_before = request_versions(tproxy, "Produce")
    log = open(tmp_path / "producer.log", "wb")
    proc = subprocess.Popen(["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                             "-Dpace.ms=40", "-cp", cp, "JavaProducer", "idempotent",
                             tproxy.bootstrap, topic, *values],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    out: list[dict] = []
    arrived: list[float] = []  # when each line was read
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        # Delete once a quarter has been acknowledged, recreate at once.
        while len(out) < 30:
            line = proc.stdout.readline()
            assert line, f"producer ended early\n{h.read_log(tmp_path / 'producer.log')}"
            out.append(json.loads(line))
            arrived.append(time.monotonic())
        admin.delete_topics([topic])[topic].result(30)
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.create_topics([ck.admin.NewTopic(topic, 1, 1)])[topic].result(30)
                break
            except ck.KafkaException as e:
                # The producer's own Metadata (allowAutoTopicCreation, on
                # the suite's broker) may have created it first: recreated
                # all the same, under a new id (checked below).
                if e.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS:
                    break
                assert time.monotonic() < deadline, e  # the deletion may still be under way
                time.sleep(0.2)
        recreated = time.monotonic()
        for line in proc.stdout:
            if line.startswith("{"):
                out.append(json.loads(line))
                arrived.append(time.monotonic())
        assert proc.wait(120) == 0, h.read_log(tmp_path / "producer.log")
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    new = topic_id(java_classes, tproxy, topic)
    assert new != old
    by_value = {o["sent"]: o for o in out}
    assert len(by_value) == len(values), (len(by_value), out[-3:])
    # Every poison record was refused at the door, before and after.
    for v in values:
        if "91.5" in v:
            assert by_value[v].get("error") == "InvalidRecordException", by_value[v]
    # Each valid record whose answer came after the recreate landed (its
    # line read after create_topics returned, and a margin for a line of an
    # answer that came just before) was acknowledged, and is in the new
    # topic at the offset the acknowledgement named; the topic holds
    # nothing else but valid records sent before, in the order sent.
    after = [o for o, at in zip(out, arrived) if at > recreated + 0.5]
    after_valid = [o for o in after if "91.5" not in o["sent"]]
    assert len(after_valid) >= 40, (len(after_valid), "too few records after the recreate")
    refused = [o for o in after_valid if "offset" not in o]
    assert not refused, f"valid records not acknowledged after the recreate: {refused[:3]}"
    landed = dict(direct_records(broker, topic))
    missing = [(o["offset"], o["sent"][:40]) for o in after_valid
               if landed.get(o["offset"]) != o["sent"].encode()]
    assert not missing, f"acknowledged after the recreate, not in the new topic there: {missing}"
    assert all(b"91.5" not in v for v in landed.values())
    order = {v.encode(): i for i, v in enumerate(values)}
    assert [order[v] for _, v in sorted(landed.items())] == sorted(order[v]
                                                                   for v in landed.values())
    # The producer used Produce v13, and no other version.
    used = {k: n - produce_before.get(k, 0) for k, n in request_versions(tproxy, "Produce").items()
            if n - produce_before.get(k, 0) > 0}
    acked = sum(1 for o in out if "offset" in o)
    assert set(used) == {"13"} and used["13"] >= acked, (used, acked)
    # Raw Produce v13: the old id is gone, the new one is judged by name.
    assert produce(java_classes, tproxy, old, [valid(500)])["errorCode"] == UNKNOWN_TOPIC_ID
    assert produce(java_classes, tproxy, new, [poison(501)])["errorCode"] == INVALID_RECORD
    assert produce(java_classes, tproxy, new, [valid(502)])["errorCode"] == 0


def test_fetch_v18_by_topic_id_removes_poison_and_an_unknown_id_gets_the_brokers_error(
        tproxy, broker, java_classes, offered):
    v = offered[1][1]
    if h.KAFKA_VERSION.startswith("4.4."):
        assert v == 18, f"Kafka {h.KAFKA_VERSION} offers Fetch up to v{v}, not v18"
    if v < 13:
        pytest.skip(f"the broker offers Fetch up to v{v}")
    fetch_before = request_versions(tproxy, "Fetch")
    topic = new_topic(broker)
    recs = [ps.json_rec(k, i) for i, k in enumerate(["valid", "lat", "valid", "enum", "valid"])]
    c.ck_produce(c.Endpoint(broker.bootstrap, "direct"), topic, recs)
    tid = topic_id(java_classes, tproxy, topic)
    port = f"{h.HOST}:{tproxy.broker_port()}"
    resp, records = raw(java_classes, "fetch", port, tid, "0", "0", str(v))
    [t] = resp["responses"]
    [p] = t["partitions"]
    assert p["errorCode"] == 0, p
    got = h.decode_uncompressed_batches(bytes.fromhex(records["records_hex"]))
    assert [(r.offset, r.value) for r in got] == [(0, recs[0].value), (2, recs[2].value),
                                                  (4, recs[4].value)]
    dlt = ps.read_dlt(c.Endpoint(broker.bootstrap, "direct"), f"{topic}.dlt")
    assert sorted(int(ps.hdict(r)["x-original-offset"]) for r in dlt) == [1, 3]
    resp, records = raw(java_classes, "fetch", port, unknown_id(), "0", "0", str(v))
    [t] = resp["responses"]
    [p] = t["partitions"]
    assert p["errorCode"] == UNKNOWN_TOPIC_ID, p
    assert records["records_hex"] == ""
    # Both requests reached the proxy as Fetch v<v> (v18 on Kafka 4.4).
    fetched = request_versions(tproxy, "Fetch")
    assert fetched.get(str(v), 0) - fetch_before.get(str(v), 0) >= 2, (v, fetch_before, fetched)
    tproxy.assert_running()


def test_offset_commit_and_fetch_v10_by_topic_id_through_the_proxy(
        tproxy, broker, java_classes, offered):
    if offered[8][1] < 10 or offered[9][1] < 10:
        pytest.skip(f"the broker offers OffsetCommit/OffsetFetch up to "
                    f"v{offered[8][1]}/v{offered[9][1]}")
    topic = new_topic(broker)
    tid = topic_id(java_classes, tproxy, topic)
    group = f"tid-group-{uuid.uuid4().hex[:8]}"
    port = f"{h.HOST}:{tproxy.broker_port()}"
    # Like a client: find the coordinator first (on a new broker the first
    # FindCoordinator creates __consumer_offsets), wait out its loading.
    cons = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                cons.committed([ck.TopicPartition(topic, 0)], timeout=30)
                break
            except ck.KafkaException:
                assert time.monotonic() < deadline, "no group coordinator within 60 s"
                time.sleep(0.5)
    finally:
        cons.close()
    deadline = time.monotonic() + 60
    while True:
        [r] = raw(java_classes, "offsetcommit", port, group, tid, "0", "3", "10")
        [t] = r["topics"]
        if t["partitions"][0]["errorCode"] not in (14, 15, 16) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (t["topicId"], t["partitions"][0]["errorCode"]) == (tid, 0), r
    [r] = raw(java_classes, "offsetfetch", port, group, tid, "0", "10")
    [g] = r["groups"]
    [t] = g["topics"]
    assert (t["topicId"], t["partitions"][0]["committedOffset"]) == (tid, 3), r
    # The same offset, asked directly by name.
    cons = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        [tp] = cons.committed([ck.TopicPartition(topic, 0)], timeout=30)
        assert tp.offset == 3
    finally:
        cons.close()
    [r] = raw(java_classes, "offsetcommit", port, group, unknown_id(), "0", "3",
              "10")
    [t] = r["topics"]
    assert t["partitions"][0]["errorCode"] == UNKNOWN_TOPIC_ID, r
    seen = tproxy.metrics()
    for api in ("OffsetCommit", "OffsetFetch"):
        assert h.metric(seen, "antidote_client_requests_total", api=api, version="10") >= 1
