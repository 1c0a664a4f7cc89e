"""Kafka behaviour tansu could not show, now shown through the proxy against
Apache Kafka (issue 32):

- `dlt replay --since/--until`: exactly the DLT records dead-lettered in the
  window are replayed, and the replay reads its target partition only from
  the offset ListOffsets gives for the oldest chosen `x-failed-at` (minus
  the one-hour clock margin), not from its log start: a target holding
  hundreds of older records reads only the few recent ones, and still finds
  its own earlier replays (no double replay).
- OFFSET_OUT_OF_RANGE: a consumer fetching before the log start (after
  DeleteRecords) or past the end gets it and resets per its
  `auto.offset.reset` (earliest, latest, or an error to the application)
  through the proxy exactly as directly: librdkafka and kafka-python, on
  three paths (the broker itself, a proxy with no policies, a proxy whose
  policy covers the topic); a group whose committed offset was deleted
  starts again at the log start.
- acks=0 Produce on one raw connection: no answer on the wire, directly or
  through the proxy, and the requests after it on the same connection are
  answered in order; an acks=0 Produce to a partition that does not exist
  or one Kafka refuses makes Kafka close the connection, and the proxy's
  client connection closes as well; at the door (`on_produce: reject`) an
  acks=0 Produce the proxy refuses in part writes the rest and closes the
  connection the same way, after the answers pending before it.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import time
import uuid

import confluent_kafka as ck
import kafka as kp
import kafka.errors as kerr
import pytest
from confluent_kafka.admin import AdminClient
from kafka.record.memory_records import MemoryRecordsBuilder

import clients as c
import harness as h
import poison_support as ps
from test_ops import ok

HOUR_MS = 3600 * 1000


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return ps.write_policies(tmp_path_factory.mktemp("edges-policies"))


@pytest.fixture(scope="module")
def policy_proxy(workdir, broker, policy_file):
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                              name="antidote-edges")
    yield p
    p.stop_and_check()


def now_ms() -> int:
    return int(time.time() * 1000)


def delete_records(ep: c.Endpoint, topic: str, before: int) -> int:
    admin = AdminClient(ep.ck())
    fs = admin.delete_records([ck.TopicPartition(topic, 0, before)], request_timeout=30,
                              operation_timeout=30)
    [res] = [f.result(30) for f in fs.values()]
    return res.low_watermark


def offset_for_time(ep: c.Endpoint, topic: str, ts: int) -> int:
    """ListOffsets by timestamp as librdkafka asks it, straight at the broker."""
    cons = ck.Consumer(ep.ck(**{"group.id": f"oft-{time.monotonic_ns()}"}))
    try:
        [tp] = cons.offsets_for_times([ck.TopicPartition(topic, 0, ts)], timeout=15)
        assert tp.error is None, tp.error
        return tp.offset
    finally:
        cons.close()


def read_direct(ep: c.Endpoint, topic: str, n: int) -> list[c.Rec]:
    return c.ck_consume_assign(ep, topic, [0], n, timeout=30)


# ---------------------------------------------------------------------------
# dlt replay: a time window, and the target read from ListOffsets by timestamp
# ---------------------------------------------------------------------------

def replay(config, *args: str) -> tuple[str, str]:
    env = dict(os.environ, ANTIDOTE_LOG="antidote=debug,info")
    p = subprocess.run([str(h.ANTIDOTE_BIN), "dlt", "replay", "--config", str(config), *args],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                       env=env)
    return ok(p), p.stderr


def target_read(stderr: str) -> tuple[int, int]:
    """(offset the target read started at, target records read), from the
    replay's debug log."""
    starts = re.findall(r"target read starts here.*?offset=(-?\d+)", stderr)
    read = re.findall(r"records=(\d+) target records read for earlier replays|"
                      r"target records read for earlier replays.*?records=(\d+)", stderr)
    assert len(starts) == 1 and len(read) == 1, stderr[-4000:]
    return int(starts[0]), int(next(x for x in read[0] if x))


def replay_counts(out: str) -> dict[str, int]:
    """The numbers of the LAST `replay: ...` summary line (stderr carries a
    progress line after each record, then the final one)."""
    lines = [ln for ln in out.splitlines() if ln.startswith("replay: ")]
    assert lines, f"no summary line in {out!r}"
    return {name: int(n) for n, name in re.findall(r"(\d+) ([a-z ]+?)(?:,|$)", lines[-1][8:])}


def replayed_coords(stdout: str) -> list[str]:
    return re.findall(r"^replayed\s+(\S+) -> ", stdout, re.M)


def test_a_time_window_replays_exactly_its_records_reading_the_target_from_list_offsets(
        policy_proxy, broker, broker_endpoint):
    topic = ps.unique_topic(ps.JSON_PREFIX, "window")
    dlt = f"{topic}.dlt"
    target = f"edges-target-{uuid.uuid4().hex[:8]}"   # no policy covers it
    c.ck_create_topic(broker_endpoint, topic, 1)
    c.ck_create_topic(broker_endpoint, target, 1)
    ep = c.Endpoint(policy_proxy.bootstrap, "proxy")

    # Two rounds of diversions, a second and a half apart.
    rounds = [["lat", "enum", "lon", "valid"], ["schema", "lat", "nan", "valid"]]
    off = 0
    for kinds in rounds:
        c.ck_produce(broker_endpoint, topic, [ps.json_rec(k, off + i) for i, k in enumerate(kinds)])
        off += len(kinds)
        got = c.ck_consume_assign(ep, topic, [0], 1, timeout=30,
                                  until=lambda g, o=off: any(r.offset == o - 1 for r in g))
        assert all(r.offset in (3, 7) for r in got), got
        time.sleep(1.5)
    dl = ps.without_markers(ps.read_dlt(broker_endpoint, dlt, settle=0))
    assert [int(ps.hdict(r)["x-original-offset"]) for r in dl] == [0, 1, 2, 4, 5, 6]
    failed = [int(ps.hdict(r)["x-failed-at"]) for r in dl]
    coords = [f"{dlt}/0/{r.offset}" for r in dl]
    a_since, b_since = min(failed[:3]), min(failed[3:])
    assert max(failed[:3]) < b_since, failed

    # The target: 300 records three days old, then 4 from twenty minutes ago.
    old = now_ms() - 3 * 24 * HOUR_MS
    recent = now_ms() - 20 * 60 * 1000
    c.ck_produce(broker_endpoint, target,
                 [c.Rec(0, i, None, f"old-{i}".encode(), (), old + i) for i in range(300)]
                 + [c.Rec(0, 300 + i, None, f"recent-{i}".encode(), (), recent + i)
                    for i in range(4)], **{"linger.ms": 50})
    # What Kafka's ListOffsets answers for the oldest chosen failure minus the
    # margin: the first recent record.
    assert offset_for_time(broker_endpoint, target, b_since - HOUR_MS) == 300
    assert offset_for_time(broker_endpoint, target, a_since - HOUR_MS) == 300

    cfg = policy_proxy.config_path
    # Window B: its three records, none of A's.
    out, err = replay(cfg, "--topic", dlt, "--to", target, "--since", str(b_since), "--execute")
    assert sorted(replayed_coords(out)) == sorted(coords[3:]), out
    assert replay_counts(err) == {"considered": 3, "replayed": 3, "already replayed": 0,
                                        "still invalid": 0, "refused": 0, "failed": 0}, out + err
    assert target_read(err) == (300, 4)
    back = read_direct(broker_endpoint, target, 307)
    assert [dict(r.headers).get("x-replayed-from-dlt") for r in back[304:]] == \
        [x.encode() for x in coords[3:]]

    # Again: nothing more, and the bounded read found the three replays.
    out, err = replay(cfg, "--topic", dlt, "--to", target, "--since", str(b_since), "--execute")
    assert replayed_coords(out) == [], out
    assert replay_counts(err)["already replayed"] == 3, out + err
    assert target_read(err) == (300, 7)

    # Window A (since A's first failure, until B's): exactly A's three.
    out, err = replay(cfg, "--topic", dlt, "--to", target, "--since", str(a_since),
                      "--until", str(b_since), "--execute")
    assert sorted(replayed_coords(out)) == sorted(coords[:3]), out
    assert replay_counts(err)["considered"] == 3, out + err
    assert target_read(err) == (300, 7)

    # Everything: all six already there, each once.
    out, err = replay(cfg, "--topic", dlt, "--to", target, "--execute")
    assert replayed_coords(out) == [] and replay_counts(err)["already replayed"] == 6
    back = read_direct(broker_endpoint, target, 310)
    assert len(back) == 310
    assert sorted(dict(r.headers)["x-replayed-from-dlt"].decode() for r in back[304:]) == \
        sorted(coords)


# ---------------------------------------------------------------------------
# OFFSET_OUT_OF_RANGE and auto.offset.reset
# ---------------------------------------------------------------------------

OOR_PATHS = ["direct", "proxy", "policy"]


@pytest.fixture(params=OOR_PATHS)
def oor(request, broker, broker_endpoint):
    """(endpoint, topic): a topic of 10 valid records whose first 4 were
    deleted (log start 4, end 10), reached on the path under test."""
    path = request.param
    if path == "direct":
        ep = c.Endpoint(broker.bootstrap, "direct")
    elif path == "proxy":
        ep = c.Endpoint(request.getfixturevalue("proxy").bootstrap, "proxy")
    else:
        ep = c.Endpoint(request.getfixturevalue("policy_proxy").bootstrap, "policy")
    topic = ps.unique_topic(ps.JSON_PREFIX, "oor")  # a policy topic on the "policy" path
    c.ck_create_topic(broker_endpoint, topic, 1)
    c.ck_produce(broker_endpoint, topic, [ps.json_rec("valid", i) for i in range(10)])
    assert delete_records(broker_endpoint, topic, 4) == 4
    return ep, topic


def ck_first(ep: c.Endpoint, topic: str, start: int, reset: str, timeout: float = 30):
    """Assign at `start` with `auto.offset.reset` = `reset`; the first
    message or error event librdkafka hands the application."""
    cons = ck.Consumer(ep.ck(**{"group.id": f"oor-{time.monotonic_ns()}",
                                "enable.auto.commit": False, "auto.offset.reset": reset}))
    try:
        cons.assign([ck.TopicPartition(topic, 0, start)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is not None:
                return m.error() if m.error() else c._ck_rec(m)
        raise AssertionError(f"{ep.path}: nothing from {topic} at {start} in {timeout}s")
    finally:
        cons.close()


@pytest.mark.parametrize("start", [2, 50])
def test_librdkafka_earliest_resets_to_the_log_start(oor, start):
    ep, topic = oor
    first = ck_first(ep, topic, start, "earliest")
    assert isinstance(first, c.Rec) and first.offset == 4, f"{ep.path}: {first}"
    assert first.value == ps.json_rec("valid", 4).value


@pytest.mark.parametrize("start", [2, 50])
def test_librdkafka_reset_error_hands_the_application_offset_out_of_range(oor, start):
    ep, topic = oor
    err = ck_first(ep, topic, start, "error")
    assert isinstance(err, ck.KafkaError), f"{ep.path}: {err}"
    assert err.code() == ck.KafkaError._AUTO_OFFSET_RESET, err
    assert "Offset out of range" in err.str(), err.str()


@pytest.mark.parametrize("reset,start,expected", [
    ("earliest", 2, 4), ("earliest", 50, 4), ("latest", 2, 10), ("latest", 50, 10)])
def test_kafka_python_resets_its_position_per_auto_offset_reset(oor, reset, start, expected):
    ep, topic = oor
    cons = kp.KafkaConsumer(**ep.kp(group_id=None, enable_auto_commit=False,
                                    auto_offset_reset=reset))
    tp = kp.TopicPartition(topic, 0)
    try:
        cons.assign([tp])
        cons.seek(tp, start)
        got = []
        deadline = time.monotonic() + 30
        while cons.position(tp) == start and time.monotonic() < deadline:
            for _tp, msgs in cons.poll(timeout_ms=300).items():
                got.extend(m.offset for m in msgs)
        if reset == "earliest":
            while len(got) < 6 and time.monotonic() < deadline:
                for _tp, msgs in cons.poll(timeout_ms=300).items():
                    got.extend(m.offset for m in msgs)
            assert got == list(range(4, 10)), f"{ep.path}: {got}"
        else:
            assert got == [] and cons.position(tp) == expected, \
                f"{ep.path}: {got}, position {cons.position(tp)}"
    finally:
        cons.close()


@pytest.mark.parametrize("start", [2, 50])
def test_kafka_python_without_reset_raises_offset_out_of_range(oor, start):
    ep, topic = oor
    cons = kp.KafkaConsumer(**ep.kp(group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="none"))
    tp = kp.TopicPartition(topic, 0)
    try:
        cons.assign([tp])
        cons.seek(tp, start)
        deadline = time.monotonic() + 30
        with pytest.raises(kerr.OffsetOutOfRangeError):
            while time.monotonic() < deadline:
                assert not cons.poll(timeout_ms=300), f"{ep.path}: records at {start}"
    finally:
        cons.close()


# ---------------------------------------------------------------------------
# acks=0 on one raw connection
# ---------------------------------------------------------------------------

def batch(values: list[bytes]) -> bytes:
    b = MemoryRecordsBuilder(2, 0, 1 << 20)
    for i, v in enumerate(values):
        b.append(now_ms() + i, None, v, [])
    b.close()
    return b.buffer()


def produce_v3(topic: str, partition: int, records: bytes, acks: int) -> bytes:
    return (struct.pack(">hhi", -1, acks, 10000)           # transactional id null, acks, timeout
            + struct.pack(">i", 1) + h.kstr(topic)
            + struct.pack(">i", 1) + struct.pack(">ii", partition, len(records)) + records)


def metadata_v1(topic: str) -> bytes:
    return struct.pack(">i", 1) + h.kstr(topic)


def next_frame(sock: socket.socket) -> tuple[int, bytes]:
    size = struct.unpack(">i", h.recv_exact(sock, 4))[0]
    resp = h.recv_exact(sock, size)
    return struct.unpack(">i", resp[:4])[0], resp[4:]


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True if the peer closes the connection within `seconds` (and sends
    nothing before)."""
    sock.settimeout(seconds)
    try:
        data = sock.recv(1)
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True
    assert data == b"", f"unexpected bytes {data!r}"
    return True


@pytest.fixture(params=OOR_PATHS)
def raw_path(request, broker):
    """(path, port of the partition leader on that path)."""
    if request.param == "direct":
        return "direct", broker.port
    name = "proxy" if request.param == "proxy" else "policy_proxy"
    return request.param, request.getfixturevalue(name).broker_port()


def test_acks_zero_gets_no_answer_and_later_requests_are_answered_in_order(
        raw_path, broker_endpoint):
    path, port = raw_path
    topic = ps.unique_topic(ps.JSON_PREFIX, "acks0")  # a policy topic on the "policy" path
    c.ck_create_topic(broker_endpoint, topic, 1)
    with socket.create_connection((h.HOST, port), timeout=10) as s:
        s.settimeout(10)
        s.sendall(h.request_frame(0, 3, 11, produce_v3(topic, 0, batch([b"a"]), 0))
                  + h.request_frame(0, 3, 12, produce_v3(topic, 0, batch([b"b", b"c"]), 0))
                  + h.request_frame(3, 1, 13, metadata_v1(topic)))
        corr, _ = next_frame(s)
        assert corr == 13, f"{path}: first answer is for {corr}, not the Metadata (13)"
        s.sendall(h.request_frame(0, 3, 14, produce_v3(topic, 0, batch([b"d"]), 1)))
        corr, body = next_frame(s)
        assert corr == 14
        # Produce v3 answer: one topic, one partition, error 0 at offset 3.
        n = struct.unpack_from(">h", body, 4)[0]
        name = body[6:6 + n].decode()
        part, err, base = struct.unpack_from(">ihq", body, 6 + n + 4)
        assert (name, part, err, base) == (topic, 0, 0, 3), (name, part, err, base)
        assert not closed_within(s, 0.5), f"{path}: connection closed"
    got = read_direct(broker_endpoint, topic, 4)
    assert [r.value for r in got] == [b"a", b"b", b"c", b"d"]


def test_acks_zero_to_a_missing_partition_closes_the_connection_as_kafka_does(
        raw_path, broker_endpoint):
    """Kafka answers an acks=0 Produce that fails by closing the connection
    (the only way it can tell the producer); through the proxy the client's
    connection closes too, and no Metadata answer sent after it arrives."""
    path, port = raw_path
    topic = ps.unique_topic(ps.JSON_PREFIX, "acks0x")
    c.ck_create_topic(broker_endpoint, topic, 1)
    with socket.create_connection((h.HOST, port), timeout=10) as s:
        s.sendall(h.request_frame(0, 3, 21, produce_v3(topic, 7, batch([b"x"]), 0))
                  + h.request_frame(3, 1, 22, metadata_v1(topic)))
        assert closed_within(s, 10), f"{path}: connection still open"


def test_kafka_closes_an_acks_zero_connection_on_a_record_it_refuses(raw_path, broker_endpoint):
    """The reference for the door below: a record Kafka itself refuses
    (a record without a key on a compacted topic: INVALID_RECORD) sent with
    acks=0 closes the connection, on every path, before the Metadata after it
    is answered; nothing lands."""
    from confluent_kafka.admin import NewTopic
    path, port = raw_path
    topic = ps.unique_topic(ps.JSON_PREFIX, "compact")
    admin = AdminClient(broker_endpoint.ck())
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic] \
        .result(30)
    c.wait_topic_visible(broker_endpoint, topic, 1, 30)
    with socket.create_connection((h.HOST, port), timeout=10) as s:
        s.sendall(h.request_frame(0, 3, 41, produce_v3(topic, 0, batch([b"no key"]), 0))
                  + h.request_frame(3, 1, 42, metadata_v1(topic)))
        assert closed_within(s, 10), f"{path}: connection still open"
    assert ps.high_watermark(broker_endpoint_port(broker_endpoint), topic) == 0


def broker_endpoint_port(ep: c.Endpoint) -> int:
    return int(ep.bootstrap.rsplit(":", 1)[1])


# ---------------------------------------------------------------------------
# acks=0 at the door (on_produce: reject)
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def door(workdir, broker, tmp_path_factory):
    from test_produce_door import DoorProxy, door_policies
    d = tmp_path_factory.mktemp("edges-door")
    (d / "door.yaml").write_text(door_policies())
    import conftest
    p = DoorProxy(workdir, upstream=[broker.bootstrap], policies=[d / "door.yaml"],
                  admin_port=h.free_port(), name="antidote-edges-door")
    conftest._PROXIES.append(p)
    p.start()
    yield p
    p.stop_and_check()


def json_batch(recs: list[c.Rec]) -> bytes:
    b = MemoryRecordsBuilder(2, 0, 1 << 20)
    for r in recs:
        b.append(r.timestamp, r.key, r.value, list(r.headers))
    b.close()
    return b.buffer()


def produce_v3_parts(topic: str, parts: list[tuple[int, bytes]], acks: int) -> bytes:
    body = struct.pack(">hhi", -1, acks, 10000) + struct.pack(">i", 1) + h.kstr(topic)
    body += struct.pack(">i", len(parts))
    for p, records in parts:
        body += struct.pack(">ii", p, len(records)) + records
    return body


def test_door_refusing_part_of_an_acks_zero_produce_writes_the_rest_and_closes_as_kafka_does(
        door, broker, broker_endpoint):
    """At the door (`on_produce: reject`) an acks=0 Produce some partition of
    which is refused: the other partitions are written, nothing is answered
    for it, the answers pending before it are delivered, and then the
    connection closes, as Kafka closes it when it refuses an acks=0 batch
    (the test above): the producer cannot be told otherwise. A request
    after it on the same connection is never answered. One whose every
    partition is refused writes nothing and closes the same way."""
    from test_produce_door import PREFIX
    topic = ps.unique_topic(PREFIX, "acks0")
    c.ck_create_topic(broker_endpoint, topic, 2)
    # Right after creation Kafka may still answer NOT_LEADER_OR_FOLLOWER;
    # an acks=0 batch sent then is dropped unseen. Wait for both leaders.
    for part in (0, 1):
        ps.fetch_partition(door.broker_port(), topic, part)
    poison = json_batch([ps.json_rec("lat", 0)])
    good = [json_batch([ps.json_rec("valid", i)]) for i in (1, 2, 3)]
    with socket.create_connection((h.HOST, door.broker_port()), timeout=10) as s:
        s.settimeout(10)
        s.sendall(h.request_frame(0, 3, 50, produce_v3_parts(topic, [(0, good[0])], 1))
                  + h.request_frame(3, 1, 51, metadata_v1(topic))
                  + h.request_frame(0, 3, 52, produce_v3_parts(topic, [(0, good[1]), (1, poison)],
                                                               0))
                  + h.request_frame(3, 1, 53, metadata_v1(topic)))
        assert [next_frame(s)[0] for _ in range(2)] == [50, 51]
        assert closed_within(s, 10), "the connection stayed open"
    with socket.create_connection((h.HOST, door.broker_port()), timeout=10) as s:
        s.sendall(h.request_frame(0, 3, 54, produce_v3_parts(topic, [(1, poison)], 0))
                  + h.request_frame(0, 3, 55, produce_v3_parts(topic, [(0, good[2])], 1)))
        assert closed_within(s, 10), "the connection stayed open"
    got = read_direct(broker_endpoint, topic, 2)
    assert [r.value for r in got] == [ps.json_rec("valid", i).value for i in (1, 2)]
    time.sleep(1)
    assert ps.high_watermark(broker_endpoint_port(broker_endpoint), topic, 0) == 2
    assert ps.high_watermark(broker_endpoint_port(broker_endpoint), topic, 1) == 0


def test_a_group_whose_committed_offset_was_deleted_resets_to_the_log_start(oor):
    """A consumer group's committed offset (2) lies before the log start (4,
    after DeleteRecords). Joining (librdkafka, `auto.offset.reset` earliest), it
    fetches at 2, gets OFFSET_OUT_OF_RANGE and reads from 4; its next commit
    is the end."""
    ep, topic = oor
    group = f"oor-group-{uuid.uuid4().hex[:8]}"
    cons = ck.Consumer(ep.ck(**{"group.id": group, "enable.auto.commit": False}))
    try:
        cons.commit(offsets=[ck.TopicPartition(topic, 0, 2)], asynchronous=False)
    finally:
        cons.close()
    assert c.ck_committed(ep, topic, group, [0]) == {0: 2}
    got = c.ck_consume_group(ep, topic, group, 6, timeout=60)
    assert [r.offset for r in got] == list(range(4, 10)), f"{ep.path}: {got}"
    assert c.ck_committed(ep, topic, group, [0]) == {0: 10}
