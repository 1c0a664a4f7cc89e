"""Thin, bounded wrappers over the two real Kafka clients used by the tests:
confluent-kafka (librdkafka 2.16) and kafka-python 3.x.

Both sides return `Rec` values, so a test can compare what one client wrote
with what the other read, field by field."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Optional

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic
import kafka as kp
import kafka.errors as kerr
from kafka.admin import NewTopic as KpNewTopic


@dataclass(frozen=True)
class Endpoint:
    """How a client reaches the cluster under test: an address plus TLS options."""
    bootstrap: str
    path: str = "direct"                 # "direct" or "proxy": for messages only
    ca: Optional[str] = None             # set => TLS
    cert: Optional[str] = None           # set => client certificate (mTLS)
    key: Optional[str] = None

    def ck(self, **extra) -> dict:
        conf = {"bootstrap.servers": self.bootstrap, "log_level": 3,
                "socket.timeout.ms": 10000}
        if self.ca:
            conf.update({"security.protocol": "SSL", "ssl.ca.location": self.ca})
            if self.cert:
                conf.update({"ssl.certificate.location": self.cert,
                             "ssl.key.location": self.key})
        conf.update(extra)
        return conf

    def kp(self, **extra) -> dict:
        conf = {"bootstrap_servers": self.bootstrap, "request_timeout_ms": 15000}
        if self.ca:
            conf.update({"security_protocol": "SSL", "ssl_cafile": self.ca,
                         "ssl_check_hostname": True})
            if self.cert:
                conf.update({"ssl_certfile": self.cert, "ssl_keyfile": self.key})
        conf.update(extra)
        return conf


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: tuple = ()                  # ((name: str, value: bytes|None), ...)
    timestamp: Optional[int] = None      # CreateTime, ms


def sample_records(n: int, partition: int = 0, ts0: int = 1_700_000_000_000,
                   tag: str = "r") -> list[Rec]:
    """Records with distinct keys, values, repeated-name headers, a null key and a
    null value among them, and strictly increasing timestamps. Offsets are the
    ones expected in a fresh partition written by a single producer."""
    out = []
    for i in range(n):
        key = None if i == 1 else f"{tag}-key-{i}".encode()
        value = None if i == 2 else (f"{tag}-value-{i}-" + "x" * (i * 7)).encode()
        headers = (("h", f"{i}".encode()), ("h", b"dup"), ("empty", b"")) if i % 3 == 0 else ()
        out.append(Rec(partition, i, key, value, headers, ts0 + i * 1000))
    return out


# ---------------------------------------------------------------------------
# Admin
# ---------------------------------------------------------------------------

def ck_create_topic(ep: Endpoint, name: str, partitions: int = 1, timeout: float = 30) -> None:
    admin = AdminClient(ep.ck())
    fut = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=timeout,
                              request_timeout=timeout)[name]
    fut.result(timeout)
    wait_topic_visible(ep, name, partitions, timeout)


def kp_create_topic(ep: Endpoint, name: str, partitions: int = 1) -> None:
    admin = kp.KafkaAdminClient(**ep.kp())
    try:
        admin.create_topics([KpNewTopic(name, partitions, 1)], timeout_ms=30000)
    finally:
        admin.close()
    wait_topic_visible(ep, name, partitions, 30)


def wait_topic_visible(ep: Endpoint, name: str, partitions: int, timeout: float) -> None:
    """Until Metadata lists the topic with `partitions` partitions with leaders."""
    admin = AdminClient(ep.ck())
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=10)
        t = md.topics.get(name)
        last = t
        if t is not None and t.error is None and len(t.partitions) == partitions and \
                all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {name} not visible with {partitions} partitions: {last}")


def ck_partition_count(ep: Endpoint, name: str) -> int:
    md = AdminClient(ep.ck()).list_topics(topic=name, timeout=10)
    return len(md.topics[name].partitions)


# ---------------------------------------------------------------------------
# confluent-kafka (librdkafka)
# ---------------------------------------------------------------------------

def _ck_headers(h: tuple) -> Optional[list]:
    return list(h) if h else None


def ck_produce(ep: Endpoint, topic: str, recs: list[Rec], timeout: float = 30,
               **conf) -> list[tuple[int, int]]:
    """Produce in order and wait for every delivery report; raise on any error.
    Returns where each record landed, (partition, offset), in `recs` order.
    One request in flight (unless `conf` says otherwise), so that a retried
    batch should not land after a later one: against a loaded Kafka, a topic's
    first records once landed after 1223 later ones (test_ops' splice test).
    A test that cares about the log's order still takes it from what is
    returned, not from `recs`. Idempotent unless `conf` says otherwise:
    without idempotence librdkafka may land a retried batch after a later
    one even with one request in flight (librdkafka issue 1092; CI at
    e755cc1 saw a new topic's first batch land second)."""
    p = ck.Producer(ep.ck(**{"linger.ms": 5, "max.in.flight.requests.per.connection": 1,
                             "enable.idempotence": True, **conf}))
    errors = []
    landed: list[tuple[int, int]] = [(-1, -1)] * len(recs)

    def report(i, err, msg):
        if err is not None:
            errors.append(err)
        else:
            landed[i] = (msg.partition(), msg.offset())

    # The topic's leader first: records queued before it is known are
    # batched apart from later ones (a layout's batch came out as two).
    p.list_topics(topic, timeout=timeout)
    for i, r in enumerate(recs):
        p.produce(topic, value=r.value, key=r.key, partition=r.partition,
                  headers=_ck_headers(r.headers), timestamp=r.timestamp or 0,
                  on_delivery=functools.partial(report, i))
    left = p.flush(timeout)
    assert left == 0, f"{left} records not delivered within {timeout}s"
    assert not errors, f"delivery errors: {errors}"
    return landed


def _ck_rec(m) -> Rec:
    ts_type, ts = m.timestamp()
    headers = tuple(m.headers() or ())
    return Rec(m.partition(), m.offset(), m.key(), m.value(), headers,
               ts if ts_type == ck.TIMESTAMP_CREATE_TIME else None)


def ck_consume_assign(ep: Endpoint, topic: str, partitions: list[int], n: int,
                      timeout: float = 30, until=None, **conf) -> list[Rec]:
    """Read `n` records from offset 0 of `partitions` with assign() (no group
    join), or fail after `timeout` with what was read."""
    c = ck.Consumer(ep.ck(**{"group.id": f"assign-{time.monotonic_ns()}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             **conf}))
    try:
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in partitions])
        return _ck_poll(c, n, timeout, until)
    finally:
        c.close()


def _ck_poll(c, n: int, timeout: float, until=None) -> list[Rec]:
    """Poll until `n` records were read (or `until(records)` holds), at most `timeout` s."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and not (until and until(got)) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == ck.KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(f"consumer error: {m.error()}")
        got.append(_ck_rec(m))
    assert len(got) >= n or (until and until(got)), \
        f"read {len(got)} of {n} records in {timeout}s: {got}"
    return got


def ck_consume_group(ep: Endpoint, topic: str, group: str, n: int, timeout: float = 90,
                     **conf) -> list[Rec]:
    """Subscribe as a member of `group`, read `n` records, commit synchronously."""
    c = ck.Consumer(ep.ck(**{"group.id": group, "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", **conf}))
    try:
        c.subscribe([topic])
        got = _ck_poll(c, n, timeout)
        c.commit(asynchronous=False)
        return got
    finally:
        c.close()


def ck_committed(ep: Endpoint, topic: str, group: str, partitions: list[int]) -> dict[int, int]:
    c = ck.Consumer(ep.ck(**{"group.id": group, "enable.auto.commit": False}))
    try:
        tps = c.committed([ck.TopicPartition(topic, p) for p in partitions], timeout=20)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


# ---------------------------------------------------------------------------
# kafka-python
# ---------------------------------------------------------------------------

def kp_produce(ep: Endpoint, topic: str, recs: list[Rec], **conf) -> list[int]:
    """Produce in order (one in flight, so order holds); return the offsets."""
    p = kp.KafkaProducer(**ep.kp(**{"linger_ms": 5, "max_in_flight_requests_per_connection": 1,
                                    **conf}))
    try:
        futs = [p.send(topic, value=r.value, key=r.key, partition=r.partition,
                       headers=list(r.headers), timestamp_ms=r.timestamp) for r in recs]
        p.flush(30)
        return [f.get(timeout=30).offset for f in futs]
    finally:
        p.close(10)


def _kp_rec(m) -> Rec:
    headers = tuple((k, v) for k, v in (m.headers or ()))
    ts = m.timestamp if m.timestamp_type == 0 else None
    return Rec(m.partition, m.offset, m.key, m.value, headers, ts)


def _kp_poll(c, n: int, timeout: float, until=None) -> list[Rec]:
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and not (until and until(got)) and time.monotonic() < deadline:
        for _tp, msgs in c.poll(timeout_ms=500).items():
            got.extend(_kp_rec(m) for m in msgs)
    assert len(got) >= n or (until and until(got)), \
        f"read {len(got)} of {n} records in {timeout}s: {got}"
    return got


def kp_consume_assign(ep: Endpoint, topic: str, partitions: list[int], n: int,
                      timeout: float = 30, until=None, **conf) -> list[Rec]:
    c = kp.KafkaConsumer(**ep.kp(**{"group_id": None, "enable_auto_commit": False,
                                    "auto_offset_reset": "earliest", **conf}))
    try:
        tps = [kp.TopicPartition(topic, p) for p in partitions]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        return _kp_poll(c, n, timeout, until)
    finally:
        c.close()


def kp_subscribe(c: "kp.KafkaConsumer", topic: str, timeout: float = 30) -> None:
    """Subscribe once the consumer's own metadata lists the topic's
    partitions. kafka-python's group leader assigns nothing for a topic its
    metadata does not list yet ("No partition metadata for topic",
    dpkp/kafka-python#2377, seen against brokers directly too), and on 2
    busy cores CI runs spent whole tests in that state."""
    deadline = time.monotonic() + timeout
    while not c.partitions_for_topic(topic):
        assert time.monotonic() < deadline, f"kafka-python never listed {topic}'s partitions"
        time.sleep(0.2)
    c.subscribe([topic])


def kp_consume_group(ep: Endpoint, topic: str, group: str, n: int, timeout: float = 90,
                     **conf) -> list[Rec]:
    c = kp.KafkaConsumer(**ep.kp(**{"group_id": group, "enable_auto_commit": False,
                                    "auto_offset_reset": "earliest", **conf}))
    try:
        kp_subscribe(c, topic)
        got = _kp_poll(c, n, timeout)
        _kp_commit(c, got)
        return got
    finally:
        c.close()


def _kp_commit(c: "kp.KafkaConsumer", got: list[Rec], attempts: int = 5) -> None:
    """Commit the consumer's positions. The coordinator refuses a commit
    while the group rebalances (kafka-python rejoins when the subscribed
    topic's metadata changes, as it can just after the topic was created;
    CI at c2b1d54 saw it in test_cluster); kafka-python's answer is to poll,
    which completes the rejoin, and commit again. What that poll returns
    joins `got`, so nothing read is hidden from the test."""
    for attempt in range(attempts):
        try:
            c.commit()
            return
        except kerr.RebalanceInProgressError:
            if attempt == attempts - 1:
                raise
            for _tp, msgs in c.poll(timeout_ms=1000).items():
                got.extend(_kp_rec(m) for m in msgs)


def kp_committed(ep: Endpoint, topic: str, group: str, partitions: list[int]) -> dict[int, int]:
    c = kp.KafkaConsumer(**ep.kp(group_id=group, enable_auto_commit=False))
    try:
        return {p: c.committed(kp.TopicPartition(topic, p)) for p in partitions}
    finally:
        c.close()


def by_partition_in_order(recs: list[Rec]) -> dict[int, list[Rec]]:
    """Group by partition keeping read order (order only holds per partition)."""
    out: dict[int, list[Rec]] = {}
    for r in recs:
        out.setdefault(r.partition, []).append(r)
    return out


def kp_send_each(ep: Endpoint, topic: str, values: list[bytes]) -> list:
    """kafka-python, one batch per record; each record's exception (or None)."""
    p = kp.KafkaProducer(**ep.kp(linger_ms=0, retries=0, max_in_flight_requests_per_connection=1))
    out = []
    try:
        for v in values:
            f = p.send(topic, value=v)
            p.flush(30)
            try:
                f.get(timeout=30)
                out.append(None)
            except kerr.KafkaError as e:
                out.append(e)
    finally:
        p.close(10)
    return out
