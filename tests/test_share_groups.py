"""Share groups (KIP-932) through a policy proxy: share consumers are kept
from poison like any other consumer.

- Apache Kafka's KafkaShareConsumer (4.4) and librdkafka's ShareConsumer
  read a topic with poison mixed in by a producer writing straight to the
  broker: every valid record is delivered, no poison, each poison record
  is in its DLT once, and the group's lag is 0 on every partition (the
  proxy's REJECTs of the removed records landed: nothing stays acquired or
  available).
- Two consumers of one share group (Java and librdkafka) while poison keeps
  arriving: the valid records delivered between them, none twice, no poison.
- The proxy SIGKILLed mid-stream and started again: the consumer carries
  on; records whose acknowledgement the proxy owed when it died come back
  when their locks expire, are found in the DLT and settled, once.
- A group with a broker DLQ (KIP-1191): with `removed_ack: reject` the
  broker copies each removed record to its DLQ too; with `accept` only
  antidote's DLT has it.
- A proxy whose DLT cannot be read back: the valid records are delivered
  all the same (no order to keep), the poison neither delivered nor written.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import confluent_kafka as ck
import pytest

import clients as c
import harness as h
import poison_support as ps
from test_java_clients import java_classes, run_java  # noqa: F401 (fixture)
from test_topic_ids import raw

pytestmark = h.needs_kafka

LOCK_MS = 15000  # share.record.lock.duration.ms of the test groups (the broker's minimum)


def share_api(broker) -> bool:
    import socket
    with socket.create_connection((h.HOST, broker.port), timeout=10) as s:
        return 78 in h.api_versions(s)


@pytest.fixture(scope="module")
def share_ready(broker, java_classes):
    """share.version 1 on the suite's broker (a no-op on Kafka 4.2+)."""
    if not share_api(broker):
        pytest.skip(f"Kafka {h.KAFKA_VERSION} offers no share groups")
    [now] = run_java(java_classes, "JavaAdmin", broker.bootstrap, "features")
    if now["finalized"].get("share.version", 0) < 1:
        # Never a downgrade: Kafka 4.4 starts at 2, which its DLQ (KIP-1191) needs.
        out = run_java(java_classes, "JavaAdmin", broker.bootstrap, "feature:share.version:1",
                       "features")
        assert out[1]["finalized"].get("share.version", 0) >= 1, out
    return broker


@pytest.fixture(scope="module")
def sproxy(workdir, share_ready, tmp_path_factory):
    pfile = ps.write_policies(tmp_path_factory.mktemp("share-policies"))
    p = ps.start_policy_proxy(workdir, upstream=[share_ready.bootstrap], policies=[pfile],
                              name="antidote-share", admin=True)
    yield p
    p.stop_and_check()


def new_group(broker, classes, **extra: str) -> str:
    group = f"share-{uuid.uuid4().hex[:10]}"
    configs = {"share.auto.offset.reset": "earliest",
               "share.record.lock.duration.ms": str(LOCK_MS), **extra}
    out = run_java(classes, "JavaAdmin", broker.bootstrap,
                   *[f"groupconfig:{group}:{k}:{v}" for k, v in configs.items()])
    assert all("error" not in x for x in out), out
    return group


def mixed(n: int, base: int, parts: int,
          poison_every: int = 4) -> tuple[list[c.Rec], list[bytes], list[bytes]]:
    """Records `base`.. round robin over the partitions, every
    `poison_every`-th poison (four kinds); the records, the valid values
    and the poison values."""
    kinds = ["lat", "garbage", "enum", "noheader"]
    recs, valid, poison = [], [], []
    for i in range(n):
        bad = i % poison_every == poison_every - 1
        r = ps.json_rec(kinds[(i // poison_every) % 4] if bad else "valid", base + i,
                        partition=i % parts)
        recs.append(r)
        (poison if bad else valid).append(r.value)
    return recs, valid, poison


def lags(broker, classes, group: str, topic: str, parts: int) -> dict[int, int]:
    """Each share-partition's lag (DescribeShareGroupOffsets v1, Kafka 4.4):
    records not yet acknowledged for good."""
    [r] = raw(classes, "shareoffsets", broker.bootstrap, group, topic,
              ",".join(map(str, range(parts))), "1")
    [g] = r["groups"]
    [t] = g["topics"]
    return {p["partitionIndex"]: p["lag"] for p in t["partitions"]}


def wait_settled(broker, classes, group, topic, parts, timeout: float = 60) -> dict[int, int]:
    """Until the group's lag is 0 on every partition: every record
    acknowledged (delivered and accepted, or removed and settled by the
    proxy); the last lags seen."""
    deadline = time.monotonic() + timeout
    while True:
        got = lags(broker, classes, group, topic, parts)
        if set(got.values()) == {0} or time.monotonic() > deadline:
            return got
        time.sleep(1)


class JavaShareConsumer:
    """tests/java/JavaShare.java in the background, its records collected;
    it stops once `stop_file` exists."""

    def __init__(self, classes, bootstrap, topic, group, n, timeout_ms, stop_file):
        cp = f"{h.kafka_classpath()}:{classes}"
        self.proc = subprocess.Popen(
            ["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
             "-Dlog4j2.level=WARN", "-cp", cp, "JavaShare", bootstrap, topic, group, str(n),
             str(timeout_ms), str(stop_file)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[dict] = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.out.append(json.loads(line))

    def records(self) -> list[tuple[int, int, bytes]]:
        import base64
        return [(x["record"][0], x["record"][1], base64.b64decode(x["record"][3]))
                for x in list(self.out) if "record" in x]

    def wait(self, timeout: float = 180) -> list[dict]:
        self.proc.wait(timeout)
        self.t.join(10)
        assert self.proc.returncode == 0, self.proc.stderr.read()[-3000:]
        return self.out


def ck_share_consume(bootstrap: str, topic: str, group: str, want: set[bytes],
                     timeout: float = 120, stop: threading.Event | None = None,
                     into: list | None = None) -> list:
    """librdkafka's ShareConsumer (implicit acknowledgement) until it has
    every value of `want` and 3 s more (or, given `stop`, until it is set);
    (partition, offset, value) of what it got (also appended to `into` as
    it comes)."""
    cons = ck.ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    cons.subscribe([topic])
    got = [] if into is None else into
    deadline = time.monotonic() + timeout
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            for m in cons.poll(0.5):
                if m.error() is None:
                    got.append((m.partition(), m.offset(), m.value()))
            if stop is not None:
                if stop.is_set():
                    break
                continue
            if want <= {v for _, _, v in got}:
                quiet_until = quiet_until or time.monotonic() + 3
                if time.monotonic() > quiet_until:
                    break
        cons.commit_sync()
    finally:
        cons.close()
    return got


def read_until_settled(broker, classes, group, topic, parts, valid, got, timeout=120):
    """While a consumer reads in the background (filling `got` with (partition,
    offset, value)): until every valid value has come and the group's lag is
    0 on every partition (a record withheld meanwhile, e.g. while its new DLT
    had no leader yet, comes back when its lock expires and is settled then),
    then 3 s more for anything extra (a duplicate, poison)."""
    deadline = time.monotonic() + timeout
    lag = None
    while time.monotonic() < deadline:
        if set(valid) <= {v for _, _, v in list(got)}:
            lag = lags(broker, classes, group, topic, parts)
            if set(lag.values()) == {0}:
                break
        time.sleep(1)
    time.sleep(3)
    return lag


@pytest.mark.parametrize("client", ["java", "librdkafka"])
def test_a_share_consumer_gets_every_valid_record_no_poison_and_the_lag_ends_at_0(
        client, sproxy, share_ready, java_classes, tmp_path):
    broker = share_ready
    ep = c.Endpoint(broker.bootstrap, "direct")
    topic = ps.unique_topic(ps.JSON_PREFIX, f"share-{client}")
    parts = 2
    c.ck_create_topic(ep, topic, parts)
    recs, valid, poison = mixed(80, 0, parts)
    c.ck_produce(ep, topic, recs)
    group = new_group(broker, java_classes)
    if client == "java":
        stop_file = tmp_path / "stop"
        java = JavaShareConsumer(java_classes, sproxy.bootstrap, topic, group, 10**6, 170_000,
                                 stop_file)
        lag = read_until_settled(broker, java_classes, group, topic, parts, valid,
                                 _LiveRecords(java))
        stop_file.touch()
        out = java.wait()
        assert [x for x in out if "error" in x] == [], out[-3:]
        got = java.records()
    else:
        stop = threading.Event()
        got = []
        t = threading.Thread(target=lambda: ck_share_consume(
            sproxy.bootstrap, topic, group, set(), timeout=170, stop=stop, into=got),
            daemon=True)
        t.start()
        lag = read_until_settled(broker, java_classes, group, topic, parts, valid, got)
        stop.set()
        t.join(60)
    values = Counter(v for _, _, v in got)
    assert values == Counter(valid), {"poison": [v[:60] for v in values if v in poison],
                                      "missing": len(set(valid) - set(values))}
    assert lag == {p: 0 for p in range(parts)}, lag
    dlt = ps.read_dlt(ep, f"{topic}.dlt", c.ck_partition_count(ep, f"{topic}.dlt"))
    assert Counter(r.value for r in dlt) == Counter(poison)
    m = sproxy.metrics()
    assert h.metric(m, "antidote_share_acks_total", result="sent") >= len(poison)


class _LiveRecords:
    """A JavaShareConsumer's records as a list-like view for read_until_settled."""

    def __init__(self, consumer):
        self.consumer = consumer

    def __iter__(self):
        return iter(self.consumer.records())


class _Both:
    """A JavaShareConsumer's and a librdkafka consumer's records, together."""

    def __init__(self, java, ck_got):
        self.java, self.ck_got = java, ck_got

    def __iter__(self):
        return iter(self.java.records() + list(self.ck_got))


def test_two_share_consumers_split_the_valid_records_while_poison_keeps_coming(
        sproxy, share_ready, java_classes, tmp_path):
    """A Java and a librdkafka share consumer in one group, through the proxy,
    while a producer writes valid and poison records straight to the broker:
    between them every valid record once, no poison."""
    broker = share_ready
    ep = c.Endpoint(broker.bootstrap, "direct")
    topic = ps.unique_topic(ps.JSON_PREFIX, "share-two")
    parts = 3
    c.ck_create_topic(ep, topic, parts)
    first, valid, poison = mixed(60, 0, parts)
    c.ck_produce(ep, topic, first)
    group = new_group(broker, java_classes)
    stop_file = tmp_path / "stop"
    stop = threading.Event()
    ck_got: list = []
    t = threading.Thread(target=lambda: ck_share_consume(
        sproxy.bootstrap, topic, group, set(), timeout=150, stop=stop, into=ck_got),
        daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while not ck_got and time.monotonic() < deadline:
        time.sleep(0.2)
    java = JavaShareConsumer(java_classes, sproxy.bootstrap, topic, group, 10**6, 150_000,
                             stop_file)
    # Both are members of the group (which of them gets a batch is the
    # broker's choice: either may get none).
    deadline = time.monotonic() + 60
    while True:
        [desc] = run_java(java_classes, "JavaAdmin", broker.bootstrap, f"sharegroup:{group}")
        if desc.get("members") == 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert desc.get("members") == 2, desc
    # More records, valid and poison, while both read.
    for round_ in range(3):
        time.sleep(2)
        recs, v, p = mixed(40, 1000 * (round_ + 1), parts, poison_every=3)
        c.ck_produce(ep, topic, recs)
        valid += v
        poison += p
    lag = read_until_settled(broker, java_classes, group, topic, parts, valid,
                             _Both(java, ck_got))
    stop_file.touch()
    stop.set()
    java.wait()
    t.join(60)
    assert lag == {p: 0 for p in range(parts)}, lag
    got = Counter([v for _, _, v in java.records()] + [v for _, _, v in ck_got])
    assert got == Counter(valid), {
        "poison": [v[:60] for v in got if v in poison],
        "duplicates": {v[:40]: n for v, n in got.items() if n > 1},
        "missing": len(set(valid) - set(got))}
    dlt = ps.read_dlt(ep, f"{topic}.dlt", c.ck_partition_count(ep, f"{topic}.dlt"))
    assert Counter(r.value for r in dlt) == Counter(poison)


def test_a_proxy_killed_mid_stream_and_started_again_loses_and_leaks_nothing(
        workdir, share_ready, java_classes, tmp_path):
    """SIGKILL the proxy while a share consumer reads through it, start it
    again on the same ports: every valid record is delivered (a record whose
    acknowledgement died with a connection may come again: the broker's own
    redelivery), no poison, each poison record in its DLT once, and the
    records whose acknowledgement the proxy owed when it died are settled
    when their locks expire."""
    broker = share_ready
    ep = c.Endpoint(broker.bootstrap, "direct")
    pfile = ps.write_policies(tmp_path / "policies")
    proxy = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[pfile],
                                  name="antidote-share-restart", admin=True)
    topic = ps.unique_topic(ps.JSON_PREFIX, "share-restart")
    parts = 2
    c.ck_create_topic(ep, topic, parts)
    recs, valid, poison = mixed(60, 0, parts)
    c.ck_produce(ep, topic, recs)
    group = new_group(broker, java_classes)
    stop_file = tmp_path / "stop"
    java = JavaShareConsumer(java_classes, proxy.bootstrap, topic, group, 10**6, 170_000,
                             stop_file)
    try:
        deadline = time.monotonic() + 60
        while len(java.records()) < 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        proxy.proc.kill()
        proxy.proc.wait(10)
        later, v, p = mixed(40, 1000, parts, poison_every=3)
        c.ck_produce(ep, topic, later)
        valid += v
        poison += p
        time.sleep(2)
        proxy.start()
        # Owed acknowledgements lost with the first process: settled once
        # their locks expire (records delivered again, judged, rejected).
        lag = read_until_settled(broker, java_classes, group, topic, parts, valid,
                                 _LiveRecords(java), timeout=LOCK_MS / 1000 + 120)
    finally:
        stop_file.touch()
        java.wait()
    assert lag == {0: 0, 1: 0}, lag
    got = Counter(v for _, _, v in java.records())
    assert set(got) == set(valid), {"poison": [v[:60] for v in got if v in poison],
                                    "missing": len(set(valid) - set(got))}
    dlt = ps.read_dlt(ep, f"{topic}.dlt", c.ck_partition_count(ep, f"{topic}.dlt"))
    assert Counter(r.value for r in dlt) == Counter(poison)
    proxy.stop_and_check()


@pytest.mark.parametrize("removed_ack", ["reject", "accept"])
def test_a_group_with_a_broker_dlq_gets_the_removed_records_only_when_rejected(
        removed_ack, workdir, share_ready, java_classes, tmp_path):
    """KIP-1191: a share group whose config names a DLQ topic. The proxy's
    REJECT of a removed record makes the broker copy it to that DLQ too
    (both dead-letter topics have it); with `removed_ack: accept` only
    antidote's DLT has it."""
    broker = share_ready
    ep = c.Endpoint(broker.bootstrap, "direct")
    pfile = ps.write_policies(tmp_path / "policies")
    import conftest

    @dataclass
    class AckProxy(ps.AdminPolicyProxy):
        def config_yaml(self) -> str:
            return super().config_yaml() + f"share_groups:\n  removed_ack: {removed_ack}\n"

    proxy = AckProxy(workdir, upstream=[broker.bootstrap], policies=[pfile],
                     name=f"antidote-share-{removed_ack}")
    conftest._PROXIES.append(proxy)
    proxy.start()
    try:
        topic = ps.unique_topic(ps.JSON_PREFIX, f"share-dlq-{removed_ack}")
        dlq = f"dlq.share-{uuid.uuid4().hex[:10]}"  # the broker's required DLQ prefix
        c.ck_create_topic(ep, topic, 1)
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(
            dlq, 1, 1, config={"errors.deadletterqueue.group.enable": "true"})])[dlq].result(30)
        recs, valid, poison = mixed(24, 0, 1)
        c.ck_produce(ep, topic, recs)
        group = new_group(broker, java_classes, **{"errors.deadletterqueue.topic.name": dlq})
        out = run_java(java_classes, "JavaShare", proxy.bootstrap, topic, group,
                       str(len(valid)), "90000", timeout=150)
        assert [x for x in out if "error" in x] == [], out[-3:]
        assert wait_settled(broker, java_classes, group, topic, 1) == {0: 0}
        dlt = ps.read_dlt(ep, f"{topic}.dlt")
        assert Counter(r.value for r in dlt) == Counter(poison)
        # The broker writes its DLQ in the background: wait for it (with
        # REJECT it took 1-5 s here), and as long before calling it empty.
        deadline = time.monotonic() + 30
        while True:
            broker_dlq = ps.read_dlt(ep, dlq, settle=0.5)
            if len(broker_dlq) >= len(poison) or time.monotonic() > deadline:
                break
            time.sleep(1)
        if removed_ack == "reject":
            assert len(broker_dlq) == len(poison), broker_dlq[:2]
        else:
            assert broker_dlq == []
    finally:
        proxy.stop_and_check()


def test_while_the_dlt_cannot_be_read_back_valid_records_still_reach_a_share_consumer(
        workdir, share_ready, java_classes, tmp_path):
    """The proxy's DLT cluster is unreachable from its start, so the topic's
    DLT is never read back and nothing can be written to it. A Fetch would
    hold the whole topic (order); a share group promises no order, so its
    valid records are delivered all the same, and only the poison waits
    (withheld without an acknowledgement: its lock brings it back). Neither
    is a poison record delivered nor anything written."""
    broker = share_ready
    ep = c.Endpoint(broker.bootstrap, "direct")
    pfile = ps.write_policies(tmp_path / "policies")
    nobody = h.free_port()  # nothing listens there
    proxy = ps.start_policy_proxy(
        workdir, upstream=[broker.bootstrap], policies=[pfile],
        dead_letter={"bootstrap_servers": [f"{h.HOST}:{nobody}"], "timeout": "1s"},
        name="antidote-share-no-dlt", admin=True)
    try:
        topic = ps.unique_topic(ps.JSON_PREFIX, "share-no-dlt")
        parts = 2
        c.ck_create_topic(ep, topic, parts)
        recs, valid, poison = mixed(40, 0, parts)
        c.ck_produce(ep, topic, recs)
        group = new_group(broker, java_classes)
        got = ck_share_consume(proxy.bootstrap, topic, group, set(valid), timeout=120)
        values = Counter(v for _, _, v in got)
        assert not set(values) & set(poison), [v[:60] for v in values if v in poison]
        assert set(values) == set(valid), {"missing": len(set(valid) - set(values))}
        m = proxy.metrics()
        assert h.metric(m, "antidote_share_withheld_records_total",
                        reason="not_loaded") >= len(poison), m
        assert h.metric(m, "antidote_share_acks_total", result="sent") == 0
        assert not ps.topic_exists(ep, f"{topic}.dlt")
    finally:
        proxy.stop_and_check()
