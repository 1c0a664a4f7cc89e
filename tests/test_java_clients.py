"""Apache Kafka's own Java clients (the fourth client, after librdkafka,
kafka-python and kafkajs) through the proxy, against the suite's Kafka.

The programs are single files under tests/java/, compiled once per run
(javac into target/java-tests/<hash of the sources>, under a file lock so
that xdist workers share one build) against the jars scripts/setup.sh put in
.tools/kafka/lib (kafka-clients among them), and run with `java -cp`.

- JavaConsumer, by assignment and in a group, reads a partition with poison
  (first, middle, a whole batch, and at its end) through a policy proxy: it
  gets exactly the valid records, its position reaches the end of the
  partition, and in a group it commits that end (the commit marker that
  ends a partition ending in poison, crates/core/src/kafka/marker.rs, was
  only read in the Java client's source before).
- JavaProducer at the door (`on_produce: reject`): the refusal reaches the
  application as InvalidRecordException with the policy's message, the other
  records land, and idempotent and transactional producers carry on.
- JavaAdmin through the proxy: describeCluster names only the proxy's
  addresses (nodes and controller), createTopics, describeTopics (leaders at
  the proxy), listOffsets (earliest, latest, by timestamp, max timestamp: the
  same answers as directly), listTopics and deleteTopics; the process is
  watched and never connects to the broker's port.

KIP-848 groups, Admin's describeConsumerGroups and share consumers (JavaMember,
JavaShare) are in test_group_protocols.py.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import clients as c
import harness as h
import poison_support as ps

pytestmark = h.needs_kafka

JAVA_DIR = Path(__file__).resolve().parent / "java"
SOURCES = sorted(JAVA_DIR.glob("*.java"))


@pytest.fixture(scope="session")
def java_classes() -> Path:
    """The compiled programs: javac once per source and Kafka version, shared by workers."""
    # Per Kafka version too: classes built against one kafka-clients may not
    # load against another (4.4 moved some into `internals` packages).
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)
                            + h.KAFKA_VERSION.encode()).hexdigest()[:16]
    out = h.REPO / "target" / "java-tests" / digest
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / ".done").exists():
            out.mkdir(exist_ok=True)
            r = subprocess.run(["javac", "-d", str(out), "-cp", h.kafka_classpath(),
                                *map(str, SOURCES)], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"javac failed:\n{r.stderr}"
            (out / ".done").touch()
    return out


def run_java(classes: Path, main: str, *args: str, timeout: float = 90) -> list[dict]:
    cp = f"{h.kafka_classpath()}:{classes}"
    r = subprocess.run(["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                        "-Dlog4j2.level=WARN", "-cp", cp, main, *args],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{main} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def run_java_watched(classes: Path, main: str, *args: str,
                     timeout: float = 90) -> tuple[list[dict], set[int]]:
    """run_java, and every remote port the process was seen connected to."""
    cp = f"{h.kafka_classpath()}:{classes}"
    proc = subprocess.Popen(["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                             "-Dlog4j2.level=WARN", "-cp", cp, main, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        with h.ConnectionWatcher(proc.pid) as w:
            stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0, f"{main} exited {proc.returncode}\n{stdout[-3000:]}\n{stderr[-5000:]}"
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")], \
        w.remote_ports


def records(out: list[dict]) -> list[tuple[int, int, bytes, bytes]]:
    def d(x):
        return None if x is None else base64.b64decode(x)
    return [(p, o, d(k), d(v)) for p, o, k, v in (x["record"] for x in out if "record" in x)]


# ---------------------------------------------------------------------------
# Consumers through a policy proxy
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pproxy(workdir, broker, tmp_path_factory):
    pfile = ps.write_policies(tmp_path_factory.mktemp("java-policies"))
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[pfile],
                              name="antidote-java")
    yield p
    p.stop_and_check()


# One batch per list; the partition ends in poison.
LAYOUT = [["nan", "valid", "valid", "lat", "valid", "enum"],
          ["garbage", "noheader", "lon"],
          ["valid", "valid"],
          ["valid", "schema"]]


def poison_partition(broker_endpoint, partitions: int = 1) -> tuple[str, list[c.Rec]]:
    """LAYOUT on every partition of a new policy topic; the valid records."""
    topic = ps.unique_topic(ps.JSON_PREFIX, "java")
    c.ck_create_topic(broker_endpoint, topic, partitions)
    valid = []
    for p in range(partitions):
        off = 0
        for kinds in LAYOUT:
            batch = []
            for k in kinds:
                r = ps.json_rec(k, off, partition=p, offset=off)
                batch.append(r)
                if k == "valid":
                    valid.append(r)
                off += 1
            c.ck_produce(broker_endpoint, topic, batch, **{"linger.ms": 5000})
    return topic, valid


N = sum(len(b) for b in LAYOUT)


def test_java_consumer_by_assignment_reads_exactly_the_valid_records_to_the_end(
        java_classes, pproxy, broker_endpoint):
    topic, valid = poison_partition(broker_endpoint)
    out = run_java(java_classes, "JavaConsumer", "assign", pproxy.bootstrap, topic, "1",
                   f"java-{uuid.uuid4().hex[:8]}", "60000")
    got = records(out)
    assert [(p, o, k, v) for p, o, k, v in got] == \
        [(r.partition, r.offset, r.key, r.value) for r in valid]
    [ends] = [x for x in out if "end" in x]
    assert ends == {"end": {"0": N}, "position": {"0": N}}, ends
    dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt")
    assert len(dlt) == N - len(valid)


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_java_group_consumer_commits_the_end_of_partitions_that_end_in_poison(
        java_classes, pproxy, broker_endpoint, isolation):
    topic, valid = poison_partition(broker_endpoint, partitions=2)
    group = f"java-grp-{uuid.uuid4().hex[:8]}"
    out = run_java(java_classes, "JavaConsumer", "group", pproxy.bootstrap, topic, "2", group,
                   "90000", isolation)
    got = records(out)
    assert c.by_partition_in_order([c.Rec(p, o, k, v, (), None) for p, o, k, v in got]) == \
        c.by_partition_in_order([c.Rec(r.partition, r.offset, r.key, r.value, (), None)
                                 for r in valid])
    [committed] = [x["committed"] for x in out if "committed" in x]
    assert committed == {"0": N, "1": N}, out
    # What librdkafka reads as the group's offsets, directly from the broker.
    assert c.ck_committed(broker_endpoint, topic, group, [0, 1]) == {0: N, 1: N}


# ---------------------------------------------------------------------------
# Producers at the door
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def door(workdir, broker, tmp_path_factory):
    from test_produce_door import door_policies
    d = tmp_path_factory.mktemp("java-door")
    (d / "door.yaml").write_text(door_policies())
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[d / "door.yaml"],
                              name="antidote-java-door")
    yield p
    p.stop_and_check()


def door_topic(broker_endpoint) -> str:
    from test_produce_door import PREFIX
    topic = f"{PREFIX}java-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(broker_endpoint, topic, 1)
    return topic


def landed(broker_endpoint, topic: str, n: int, **conf) -> list[bytes]:
    return [r.value for r in c.ck_consume_assign(broker_endpoint, topic, [0], n, timeout=30,
                                                 **conf)]


V = [ps.json_rec("valid", i).value.decode() for i in range(4)]
BAD = ps.json_rec("lat", 9).value.decode()


@pytest.mark.parametrize("mode", ["plain", "idempotent"])
def test_java_producer_sees_the_refusal_and_its_later_records_land(java_classes, door,
                                                                  broker_endpoint, mode):
    from test_produce_door import POLICY
    topic = door_topic(broker_endpoint)
    out = run_java(java_classes, "JavaProducer", mode, door.bootstrap, topic,
                   V[0], BAD, V[1], V[2])
    assert [x.get("error") for x in out] == [None, "InvalidRecordException", None, None], out
    assert POLICY in out[1]["message"] and "coordinates" in out[1]["message"], out[1]
    assert [x.get("offset") for x in out] == [0, None, 1, 2], out
    assert landed(broker_endpoint, topic, 3) == [v.encode() for v in (V[0], V[1], V[2])]


def test_java_transactional_producer_aborts_the_refused_transaction_and_commits_the_next(
        java_classes, door, broker_endpoint):
    topic = door_topic(broker_endpoint)
    out = run_java(java_classes, "JavaProducer", "transactional", door.bootstrap, topic,
                   f"java-tx-{topic}", f"{V[0]}|{BAD}", V[1], f"{V[2]}|{V[3]}")
    txns = [x for x in out if "txn" in x]
    assert [t["result"] for t in txns] == ["aborted", "committed", "committed"], out
    sent = [x for x in out if "sent" in x]
    assert sent[1]["error"] == "InvalidRecordException", out
    # read_committed: only the committed transactions; the aborted one's
    # valid record landed but is never read, the refused one never landed.
    h.wait_transactions_settled(int(broker_endpoint.bootstrap.rsplit(":", 1)[1]), topic)
    assert landed(broker_endpoint, topic, 3, **{"isolation.level": "read_committed"}) == \
        [v.encode() for v in (V[1], V[2], V[3])]
    every = landed(broker_endpoint, topic, 4, **{"isolation.level": "read_uncommitted"})
    assert every == [v.encode() for v in (V[0], V[1], V[2], V[3])]


# ---------------------------------------------------------------------------
# The Admin client
# ---------------------------------------------------------------------------

TS0 = 1_700_000_000_000


def test_java_admin_through_the_proxy_sees_only_proxy_addresses_and_the_brokers_answers(
        java_classes, pproxy, broker, broker_endpoint):
    topic = f"java-admin-{uuid.uuid4().hex[:8]}"
    ours = {pproxy.bootstrap_port, pproxy.broker_port()}
    me = [1, h.HOST, pproxy.broker_port()]

    out, ports = run_java_watched(java_classes, "JavaAdmin", pproxy.bootstrap, "cluster",
                                  f"create:{topic}:3", f"describe:{topic}")
    assert [x.get("error") for x in out] == [None, None, None], out
    cluster, created, desc = out
    [direct] = run_java(java_classes, "JavaAdmin", broker.bootstrap, "cluster")
    assert direct["nodes"] == [[1, h.HOST, broker.port]], direct  # validates the comparison
    assert cluster == {"cluster": direct["cluster"], "controller": me, "nodes": [me]}, cluster
    assert created == {"created": topic}
    assert desc["topic"] == topic and desc["partitions"] == [[p, me, [1]] for p in range(3)], desc

    # Records with known timestamps: 5 on partition 0, 3 on partition 1, none on 2.
    for p, n in ((0, 5), (1, 3)):
        c.ck_produce(broker_endpoint, topic,
                     [c.Rec(p, i, f"k{i}".encode(), f"v{i}".encode(), (), TS0 + 1000 * i)
                      for i in range(n)])
    ask = f"offsets:{topic}:3:{TS0 + 1500}"
    [direct_offsets] = run_java(java_classes, "JavaAdmin", broker.bootstrap, ask)
    out2, ports2 = run_java_watched(java_classes, "JavaAdmin", pproxy.bootstrap, ask, "topics",
                                    f"delete:{topic}")
    assert [x.get("error") for x in out2] == [None, None, None], out2
    offsets, listed, deleted = out2
    assert offsets == {"offsets": {
        "earliest": {"0": 0, "1": 0, "2": 0},
        "latest": {"0": 5, "1": 3, "2": 0},
        "ts": {"0": 2, "1": 2, "2": -1},          # the first record at or after TS0 + 1500
        "max_ts": {"0": 4, "1": 2, "2": -1},      # the record with the highest timestamp
    }}, offsets
    assert offsets == direct_offsets
    assert topic in listed["topics"]
    assert deleted == {"deleted": topic}
    # The topic is gone for the broker too (deletion is asynchronous: bounded wait).
    deadline = time.monotonic() + 30
    while True:
        [now] = run_java(java_classes, "JavaAdmin", broker.bootstrap, "topics")
        if topic not in now["topics"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert topic not in now["topics"]

    for seen in (ports, ports2):
        assert seen, "the admin process was never seen connected"
        assert seen <= ours, f"connected to {seen - ours}; the broker is at {broker.port}"
