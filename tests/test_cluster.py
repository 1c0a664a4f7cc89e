"""antidote in front of a cluster of three Apache Kafka nodes
(`cluster_support.KafkaCluster`, issue 32 item 5).

- The port-per-broker mapping serves all three brokers: librdkafka and
  kafka-python, given only the proxy's bootstrap, read partitions led by
  each broker, and are never seen connected to a broker's own port. Under
  SNI routing, the names `broker-{1,2,3}.kafka.test` serve them.
- A partition leader moves while two consumers of one group read a
  policy-covered topic through the proxy and its poison records are being
  diverted to a DLT led by another broker than the topic's partitions:
  moved by the Admin API (AlterPartitionReassignments, then a preferred
  leader election), with the two members on two instances of a fleet; and
  by stopping and restarting brokers (the DLT's leader, then a topic
  partition's), and by killing the DLT's leader (SIGKILL) and freezing the
  next one (SIGSTOP). Every valid record is consumed once per group (each
  member commits each record synchronously; a record is allowed again only
  after its first delivery's commit failed), no poison record reaches a
  consumer, each poison record is in the DLT once (read from the brokers),
  the proxies keep running and no client connection or held partition is
  left over.
- The proxy's own clients follow new leaders: after the DLT partition's
  leader (and the lease's transaction coordinator) moves, new diversions
  land once, another instance's ledger tail still learns them, the lease
  still passes between instances through its markers (real epochs, from
  the transaction coordinator, which is not the broker the instances
  bootstrap from), and the blocked-key follower of `ordering: per_key`
  still reads the DLT (a discard written after the move releases the key).
  An idle instance's ledger tail follows a DLT reassigned off its broker
  (the tail used to keep asking the old broker: fixed in 7f7ab76).
- A broker that joins after the proxy started is served at its port; a
  frozen first bootstrap server (SIGSTOP: it accepts connections, answers
  nothing) is passed over, so new clients still bootstrap (fixed in
  bce081c: every bootstrap connection used to go to it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import clients as c
import harness as h
import poison_support as ps
from cluster_support import NODE_IDS, cluster, cluster_proxy_base  # noqa: F401 (fixture)

pytestmark = h.needs_kafka  # a cluster of Apache Kafka nodes; tansu has one node

TESTS = Path(__file__).resolve().parent
POISON_KINDS = ["lat", "nan", "enum", "noheader", "schema"]


# ---------------------------------------------------------------------------
# Proxies on the cluster
# ---------------------------------------------------------------------------

@dataclass
class ClusterProxy(ps.PolicyProxy):
    """A policy proxy with an admin listener (metrics) and extra YAML."""
    admin_port: int = 0
    extra_yaml: str = ""
    upstream_extra: dict = field(default_factory=dict)  # more keys of `upstream:`

    def config_yaml(self) -> str:
        text = ps.PolicyProxy.config_yaml(self)
        extra = "".join(f"  {k}: {v}\n" for k, v in self.upstream_extra.items())
        text = text.replace("upstream:\n", "upstream:\n" + extra, 1)
        if self.admin_port:
            text += f"admin:\n  listen: {h.HOST}:{self.admin_port}\n"
        return text + self.extra_yaml

    @property
    def ports(self) -> set[int]:
        """The bootstrap port and one port per broker of the cluster."""
        return {self.bootstrap_port} | {self.port_base + n for n in NODE_IDS}

    def endpoint(self) -> c.Endpoint:
        return c.Endpoint(self.bootstrap, "proxy")

    def metrics(self) -> str:
        url = f"http://{h.HOST}:{self.admin_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, labels: str = "") -> float:
        """Sum of the samples of `name` whose label set contains `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name + " ") or (line.startswith(name + "{") and labels in line):
                total += float(line.rsplit(" ", 1)[1])
        return total


def start_cluster_proxy(workdir: Path, cluster, name: str, upstream=None, serve_all: bool = True,
                        **kw) -> ClusterProxy:
    import conftest
    p = ClusterProxy(workdir, upstream=upstream or [b.bootstrap for b in cluster.brokers.values()],
                     port_base=cluster_proxy_base(), admin_port=h.free_port(),
                     name=f"{name}-{uuid.uuid4().hex[:6]}", **kw)
    conftest._PROXIES.append(p)
    p.start()
    if serve_all:
        wait_serving_all(p)
    return p


def wait_serving_all(p: ClusterProxy, timeout: float = 15) -> None:
    """Until the proxy listens on its port for every broker."""
    for n in NODE_IDS:
        h.wait_for_port(p.port_base + n, timeout, p.proc, p.log, f"{p.name} broker {n}")


@pytest.fixture(scope="module")
def txn_coordinator(cluster):
    """__transaction_state exists (see harness.ensure_transaction_coordinator)."""
    h.ensure_transaction_coordinator(cluster.bootstrap, timeout=60)


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return ps.write_policies(tmp_path_factory.mktemp("cluster-policies"))


@pytest.fixture(scope="module")
def proxy(workdir, cluster, policy_file, txn_coordinator):
    p = start_cluster_proxy(workdir, cluster, "cluster", policies=[policy_file])
    yield p
    p.stop_and_check(15)


def unique(prefix: str, tag: str) -> str:
    return ps.unique_topic(prefix, tag)


# ---------------------------------------------------------------------------
# Reading the DLT from the brokers
# ---------------------------------------------------------------------------

def read_topic_direct(cluster, topic: str, partitions: int = 1, timeout: float = 30) -> list[c.Rec]:
    """Every record of `topic` up to each partition's high watermark, read
    from the brokers (librdkafka, assign), lease markers included."""
    import confluent_kafka as ck
    cons = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"dlt-{uuid.uuid4()}",
                        "enable.auto.commit": False, "auto.offset.reset": "earliest",
                        "isolation.level": "read_uncommitted", "log_level": 0})
    try:
        ends = {}
        for p in range(partitions):
            lo, hi = cons.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=15)
            if hi > lo:
                ends[p] = hi
        if not ends:
            return []
        cons.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in ends])
        got: list[c.Rec] = []
        pos = {p: -1 for p in ends}
        deadline = time.monotonic() + timeout
        while any(pos[p] + 1 < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"{topic}: read to {pos}, ends {ends}"
            m = cons.poll(0.5)
            if m is None or m.error():
                continue
            got.append(c._ck_rec(m))
            pos[m.partition()] = m.offset()
        return got
    finally:
        cons.close()


def dlt_origins(cluster, dlt: str, partitions: int = 1) -> list[tuple[int, int]]:
    """(origin partition, origin offset) of every DLT record but lease markers."""
    recs = ps.without_markers(read_topic_direct(cluster, dlt, partitions))
    return sorted(ps.origin_offsets(recs))


def wait_dlt_origins(cluster, dlt: str, want: list, timeout: float = 30) -> list:
    deadline = time.monotonic() + timeout
    while True:
        got = dlt_origins(cluster, dlt)
        if len(got) >= len(want) or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


# ---------------------------------------------------------------------------
# The mapping serves all three brokers
# ---------------------------------------------------------------------------

MAP_ASSIGNMENT = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]  # partition i led by node i + 1

PROBE = r"""
import sys, uuid
sys.path.insert(0, sys.argv[4])
import clients as c
kind, bootstrap, topic = sys.argv[1:4]
ep = c.Endpoint(bootstrap, "proxy")
recs = [r for p in range(3) for r in c.sample_records(4, partition=p, tag=f"{kind}-{p}")]
group = f"cluster-probe-{uuid.uuid4().hex[:8]}"
if kind == "librdkafka":
    c.ck_produce(ep, topic, recs)
    got = c.ck_consume_assign(ep, topic, [0, 1, 2], len(recs), timeout=60)
    assert c.by_partition_in_order(got) == c.by_partition_in_order(recs), got
    got = c.ck_consume_group(ep, topic, group, len(recs), timeout=120)
else:
    c.kp_produce(ep, topic, recs)
    got = c.kp_consume_assign(ep, topic, [0, 1, 2], len(recs), timeout=60)
    assert c.by_partition_in_order(got) == c.by_partition_in_order(recs), got
    got = c.kp_consume_group(ep, topic, group, len(recs), timeout=120)
assert c.by_partition_in_order(got) == c.by_partition_in_order(recs), got
print("DONE", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("kind", ["librdkafka", "kafka-python"])
def test_each_broker_is_served_at_its_own_proxy_port(kind, cluster, proxy, workdir):
    """A client reads and writes partitions led by each of the three brokers
    through the proxy (assign and group), and is seen connected only to the
    proxy's bootstrap and per-broker ports: to each of the three, never to a
    broker."""
    topic = unique("cluster-map.", kind)
    cluster.create_topic(topic, MAP_ASSIGNMENT)
    script = workdir / "cluster_probe.py"
    script.write_text(PROBE)
    proc = subprocess.Popen([sys.executable, str(script), kind, proxy.bootstrap, topic,
                             str(TESTS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        with h.ConnectionWatcher(proc.pid) as w:
            line = proc.stdout.readline()
            if line.strip() == "DONE":
                w.remote_ports |= {cn.remote[1] for cn in h.tcp_connections(proc.pid)
                                   if cn.state != "LISTEN"}
        proc.stdin.close()
        rc = proc.wait(timeout=60)
        assert line.strip() == "DONE" and rc == 0, f"probe failed ({rc}):\n{proc.stderr.read()[-5000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    ports = w.remote_ports
    assert not ports & cluster.ports, f"connected to a broker itself: {ports & cluster.ports}"
    assert ports <= proxy.ports, f"unexpected peers: {ports - proxy.ports}"
    for n in NODE_IDS:
        assert proxy.port_base + n in ports, f"broker {n}'s proxy port never used: {ports}"
    assert cluster.leaders(topic) == {0: 1, 1: 2, 2: 3}
    proxy.assert_running()


# --- SNI -------------------------------------------------------------------

from test_sni import (BOOTSTRAP_NAME, SUFFIX, SniAntidote, accepted_by_listener,  # noqa: E402
                      kafka_test_names, resolver_shim, sni_certs)  # noqa: F401 (fixtures)

SNI_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[4])
import clients as c
from confluent_kafka.admin import AdminClient
ep = c.Endpoint(sys.argv[1], "proxy", ca=sys.argv[2])
topic = sys.argv[3]
recs = [r for p in range(3) for r in c.sample_records(4, partition=p, tag=f"sni-{p}")]
c.ck_produce(ep, topic, recs)
got = c.ck_consume_assign(ep, topic, [0, 1, 2], len(recs), timeout=60)
md = AdminClient(ep.ck()).list_topics(topic, timeout=15)
print(json.dumps({"same": c.by_partition_in_order(got) == c.by_partition_in_order(recs),
                  "brokers": {str(k): [b.host, b.port] for k, b in md.brokers.items()},
                  "leaders": {str(p): m.leader for p, m in md.topics[topic].partitions.items()}}))
"""


@pytest.fixture(scope="module")
def sni_proxy(workdir, cluster, sni_certs):
    import conftest
    p = SniAntidote(workdir, upstream=[b.bootstrap for b in cluster.brokers.values()],
                    name="antidote-cluster-sni",
                    listen_tls={"cert": sni_certs.cert, "key": sni_certs.key},
                    admin_port=h.free_port())
    conftest._PROXIES.append(p)
    p.start()
    yield p
    p.stop_and_check()


def test_sni_names_serve_each_broker(cluster, sni_proxy, sni_certs, resolver_shim, workdir,
                                     kafka_test_names):
    """Under SNI routing, librdkafka (LD_PRELOAD resolver) and kafka-python
    read partitions led by each broker; metadata names `broker-N.kafka.test`
    on the one port for each of the three, and each name took connections."""
    topic = unique("cluster-sni.", "")
    cluster.create_topic(topic, MAP_ASSIGNMENT)
    before = accepted_by_listener(sni_proxy)
    script = workdir / "cluster_sni.py"
    script.write_text(SNI_SCRIPT)
    bootstrap = f"{BOOTSTRAP_NAME}:{sni_proxy.bootstrap_port}"
    out = subprocess.run([sys.executable, str(script), bootstrap, str(sni_certs.ca), topic,
                          str(TESTS)], env={**os.environ, "LD_PRELOAD": str(resolver_shim)},
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["same"], result
    assert result["brokers"] == {str(n): [f"broker-{n}{SUFFIX}", sni_proxy.bootstrap_port]
                                 for n in NODE_IDS}, result
    assert result["leaders"] == {"0": 1, "1": 2, "2": 3}, result
    after = accepted_by_listener(sni_proxy)
    for n in NODE_IDS:
        assert after.get(f"broker-{n}", 0) > before.get(f"broker-{n}", 0), (n, before, after)
    # kafka-python, in this process (names resolved by the wrapped getaddrinfo).
    ep = c.Endpoint(bootstrap, "proxy", ca=str(sni_certs.ca))
    recs = [r for p in range(3) for r in c.sample_records(3, partition=p, tag=f"sni-kp-{p}")]
    c.kp_produce(ep, topic, recs)
    first = [r for p in range(3) for r in c.sample_records(4, partition=p, tag=f"sni-{p}")]
    want = first + [dataclasses.replace(r, offset=r.offset + 4) for r in recs]
    got = c.kp_consume_assign(ep, topic, [0, 1, 2], len(want), timeout=60)
    assert c.by_partition_in_order(got) == c.by_partition_in_order(want)
    sni_proxy.assert_running()


# ---------------------------------------------------------------------------
# Leader moves while a group consumes and poison is diverted
# ---------------------------------------------------------------------------

# The topic's partitions are led by nodes 1 and 2, its DLT by node 3.
TOPIC_ASSIGNMENT = [[1, 2, 3], [2, 3, 1], [1, 3, 2]]
DLT_ASSIGNMENT = [[3, 1, 2]]


@dataclass
class Delivery:
    member: str
    partition: int
    offset: int
    value: bytes
    committed: bool = False  # its synchronous commit succeeded


class Member(threading.Thread):
    """A member of `group` reading `topic` through `ep` until stopped; every
    record delivered is committed synchronously before the next poll."""

    def __init__(self, name: str, kind: str, ep: c.Endpoint, topic: str, group: str,
                 out: list, lock: threading.Lock):
        super().__init__(daemon=True, name=name)
        self.kind, self.ep, self.topic, self.group = kind, ep, topic, group
        self.out, self.lock = out, lock
        self.stop_evt = threading.Event()
        self.errors: list[str] = []
        self.commit_failures: list[str] = []
        self.failed: BaseException | None = None

    def record(self, partition: int, offset: int, value: bytes) -> Delivery:
        d = Delivery(self.name, partition, offset, value)
        with self.lock:
            self.out.append(d)
        return d

    def run(self) -> None:
        try:
            (self.run_ck if self.kind == "librdkafka" else self.run_kp)()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.failed = e

    def run_ck(self) -> None:
        import confluent_kafka as ck
        cons = ck.Consumer(self.ep.ck(**{"group.id": self.group, "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest",
                                         "client.id": self.name}))
        try:
            cons.subscribe([self.topic])
            while not self.stop_evt.is_set():
                m = cons.poll(0.3)
                if m is None:
                    continue
                if m.error():
                    self.errors.append(str(m.error()))
                    continue
                d = self.record(m.partition(), m.offset(), m.value())
                try:
                    cons.commit(message=m, asynchronous=False)
                    d.committed = True
                except ck.KafkaException as e:
                    self.commit_failures.append(f"{m.partition()}@{m.offset()}: {e}")
        finally:
            cons.close()

    def run_kp(self) -> None:
        import kafka as kp
        from kafka.structs import OffsetAndMetadata
        cons = kp.KafkaConsumer(**self.ep.kp(group_id=self.group, enable_auto_commit=False,
                                             auto_offset_reset="earliest", client_id=self.name))
        try:
            c.kp_subscribe(cons, self.topic)
            while not self.stop_evt.is_set():
                try:
                    batches = cons.poll(timeout_ms=300)
                except kp.errors.KafkaConnectionError as e:
                    # kafka-python 3 raises a reset connection (a killed
                    # broker's, closed by the proxy as the broker would)
                    # from poll; an application polls again. Nothing was
                    # delivered, so nothing is lost or repeated.
                    self.errors.append(repr(e))
                    continue
                for tp, msgs in batches.items():
                    for m in msgs:
                        d = self.record(m.partition, m.offset, m.value)
                        try:
                            cons.commit({tp: OffsetAndMetadata(m.offset + 1, "", -1)})
                            d.committed = True
                        except Exception as e:  # noqa: BLE001 - CommitFailedError, KafkaError
                            self.commit_failures.append(f"{m.partition}@{m.offset}: {e!r}")
        finally:
            cons.close()


class Source(threading.Thread):
    """Writes `rounds` rounds of one record per partition straight to the
    cluster (idempotent librdkafka producer, acks=all): every fourth round
    poison (kinds in turn), the others valid. `produced` holds each record
    with the offset its delivery report gave."""

    def __init__(self, cluster, topic: str, partitions: int, rounds: int, pause: float):
        super().__init__(daemon=True, name="source")
        self.cluster, self.topic, self.partitions = cluster, topic, partitions
        self.rounds, self.pause = rounds, pause
        self.produced: list[tuple[str, c.Rec]] = []  # (kind, record with its offset)
        self.errors: list[str] = []
        self.failed: BaseException | None = None

    def run(self) -> None:
        import confluent_kafka as ck
        try:
            p = ck.Producer({"bootstrap.servers": self.cluster.bootstrap, "linger.ms": 10,
                             "enable.idempotence": True, "log_level": 3})

            def report(kind, rec):
                def cb(err, msg):
                    if err is not None:
                        self.errors.append(str(err))
                    else:
                        self.produced.append((kind, dataclasses.replace(rec, offset=msg.offset())))
                return cb

            for i in range(self.rounds):
                for part in range(self.partitions):
                    kind = POISON_KINDS[(i // 4) % len(POISON_KINDS)] if i % 4 == 1 else "valid"
                    r = ps.json_rec(kind, i, partition=part)
                    p.produce(self.topic, value=r.value, key=r.key, partition=part,
                              headers=list(r.headers), timestamp=r.timestamp,
                              on_delivery=report(kind, r))
                p.poll(0)
                time.sleep(self.pause)
            left = p.flush(60)
            assert left == 0, f"{left} records not delivered"
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.failed = e

    def count(self) -> int:
        return len(self.produced)


def group_run(cluster, topic: str, members: list[tuple[str, c.Endpoint]], moves,
              rounds: int = 60, pause: float = 0.08, partitions: int = 3,
              group: str | None = None):
    """Members (kind, endpoint) of one group read `topic` while `Source`
    writes to it; `moves` (callables) run one after the other while it
    writes, each once a further share of the records has been delivered.
    Returns (source, deliveries, members) once every valid record was
    delivered (or 120 s passed) and 2 s more for late duplicates."""
    group = group or f"cluster-group-{uuid.uuid4().hex[:8]}"
    out: list[Delivery] = []
    lock = threading.Lock()
    ms = [Member(f"{kind}-{i}", kind, ep, topic, group, out, lock)
          for i, (kind, ep) in enumerate(members)]
    for m in ms:
        m.start()
    src = Source(cluster, topic, partitions, rounds, pause)
    src.start()
    total = rounds * partitions
    try:
        for k, move in enumerate(moves, start=1):
            share = total * k // (len(moves) + 1)
            deadline = time.monotonic() + 60
            while src.count() < share and src.is_alive():
                assert time.monotonic() < deadline, f"source stuck at {src.count()} of {total}"
                time.sleep(0.05)
            move()
        src.join(120)
        assert not src.is_alive() and src.failed is None and not src.errors, \
            (src.failed, src.errors[:5])
        want = {(r.partition, r.offset) for kind, r in src.produced if kind == "valid"}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with lock:
                got = {(d.partition, d.offset) for d in out}
            if want <= got or any(m.failed for m in ms):
                break
            time.sleep(0.2)
        time.sleep(2.0)
    finally:
        for m in ms:
            m.stop_evt.set()
        for m in ms:
            m.join(30)
    return src, out, ms


def check_group_run(cluster, topic: str, src: Source, out: list[Delivery], ms: list[Member]):
    """Each valid record delivered once (again only after a failed commit),
    no poison record delivered, each poison record in the DLT once."""
    for m in ms:
        assert m.failed is None, f"{m.name}: {m.failed!r}"
    valid = {(r.partition, r.offset): r for kind, r in src.produced if kind == "valid"}
    poison = {(r.partition, r.offset): (kind, r) for kind, r in src.produced if kind != "valid"}
    assert len(valid) + len(poison) == len(src.produced)
    # A record the producer wrote twice (librdkafka's idempotent producer
    # can, across a leader move: seen as poison at 37 and 38, one delivery
    # report) is the log's, so the log says what each offset holds: a copy
    # is the same kind as its original, at the copy's offset.
    by_value = {r.value: (kind, r) for kind, r in src.produced}
    for r in read_topic_direct(cluster, topic, src.partitions):
        key = (r.partition, r.offset)
        if key in valid or key in poison or r.value not in by_value:
            continue
        kind, orig = by_value[r.value]
        copy = dataclasses.replace(orig, offset=r.offset)
        if kind == "valid":
            valid[key] = copy
        else:
            poison[key] = (kind, copy)
    seen: dict[tuple[int, int], list[Delivery]] = {}
    for d in out:
        seen.setdefault((d.partition, d.offset), []).append(d)
    leaked = sorted(set(seen) & set(poison))
    assert not leaked, f"poison records delivered: {leaked}"
    missing = sorted(set(valid) - set(seen))
    assert not missing, f"valid records never delivered: {missing[:20]} ({len(missing)})"
    assert set(seen) <= set(valid), f"unknown records: {sorted(set(seen) - set(valid))[:10]}"
    for key, ds in seen.items():
        assert ds[-1].value == valid[key].value, key
        unexplained = [d for d in ds[:-1] if d.committed]
        assert not unexplained, (f"{key} delivered {len(ds)} times, an earlier delivery "
                                 f"committed: {ds}")
    dlt = f"{topic}.dlt"
    recs = ps.without_markers(read_topic_direct(cluster, dlt))
    got = sorted(ps.origin_offsets(recs))
    assert got == sorted(poison), (f"DLT holds {len(got)} records for {len(poison)} poison ones; "
                                   f"extra {sorted(set(got) - set(poison))[:10]}, duplicates "
                                   f"{sorted(k for k in set(got) if got.count(k) > 1)[:10]}, "
                                   f"missing {sorted(set(poison) - set(got))[:10]}")
    for r in recs:
        kind, orig = poison[(int(ps.hdict(r)["x-original-partition"]),
                             int(ps.hdict(r)["x-original-offset"]))]
        ps.check_dlt_record(r, orig, topic, "pz-json", ps.JSON_RULE[kind])
    redelivered = sum(len(ds) - 1 for ds in seen.values())
    return {"valid": len(valid), "poison": len(poison), "redelivered": redelivered,
            "commit_failures": sum(len(m.commit_failures) for m in ms)}


def settled(p: ClusterProxy) -> None:
    """No client connection left open and no partition held once the
    clients are gone (nothing leaked). The held gauge is set by each Fetch
    response of a partition, so a hold whose diversion was written after
    the group's last fetch of that partition shows until the partition is
    fetched again: each partition the gauge names is read to its end once
    through the proxy first (a partition still held never reaches its end,
    and stays on the gauge)."""
    wait_metric(p, "antidote_connections_open", "", 0)
    for topic, partition in held_partitions(p):
        fetch_to_end(p, topic, partition)
    wait_metric(p, "antidote_held_partitions", "", 0)
    wait_metric(p, "antidote_connections_open", "", 0)


def held_partitions(p: ClusterProxy) -> list[tuple[str, int]]:
    """The (topic, partition) pairs the proxy's held gauge shows as held."""
    import re
    held = []
    for line in p.metrics().splitlines():
        m = re.match(r'antidote_held_partitions\{topic="([^"]*)",partition="(\d+)"\} (\S+)$', line)
        if m and float(m.group(3)) > 0:
            held.append((m.group(1), int(m.group(2))))
    return held


def fetch_to_end(p: ClusterProxy, topic: str, partition: int, timeout: float = 20) -> None:
    """Read `partition` from its start to its end through `p` once (or give
    up after `timeout`, where the proxy holds it)."""
    import confluent_kafka as ck
    cons = ck.Consumer(p.endpoint().ck(**{"group.id": f"settle-{uuid.uuid4()}",
                                          "enable.auto.commit": False,
                                          "enable.partition.eof": True}))
    try:
        cons.assign([ck.TopicPartition(topic, partition, ck.OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is not None and m.error() and m.error().code() == ck.KafkaError._PARTITION_EOF:
                return
    finally:
        cons.close()


def policy_topic(cluster, tag: str) -> str:
    """A policy-covered topic led by nodes 1 and 2 and its DLT led by node 3."""
    topic = unique(ps.JSON_PREFIX, tag)
    cluster.create_topic(topic, TOPIC_ASSIGNMENT)
    cluster.create_topic(f"{topic}.dlt", DLT_ASSIGNMENT)
    assert set(cluster.leaders(topic).values()) == {1, 2}
    assert cluster.leaders(f"{topic}.dlt") == {0: 3}
    return topic


def test_leaders_moved_by_reassignment_while_a_group_reads_through_two_instances(
        workdir, cluster, proxy, policy_file):
    """Two librdkafka members of one group, each through another instance of
    a fleet; the leader of a topic partition moves (2 -> 3, onto the DLT's
    broker), then the DLT's (3 -> 1), then the group coordinator's (its
    __consumer_offsets partition) by AlterPartitionReassignments and a
    preferred election, while records and poison keep coming."""
    topic = policy_topic(cluster, "reassign")
    dlt = f"{topic}.dlt"
    other = start_cluster_proxy(workdir, cluster, "cluster-b", policies=[policy_file])
    try:
        group = f"cluster-group-{uuid.uuid4().hex[:8]}"
        offsets_partition = (java_hash(group) & 0x7FFFFFFF) % 3  # the group's coordinator
        cluster.ensure_offsets_topic()
        coordinator = cluster.leaders("__consumer_offsets")[offsets_partition]
        new_coordinator = next(n for n in NODE_IDS if n != coordinator)
        moves = [lambda: cluster.move_leader(topic, 1, 3),
                 lambda: cluster.move_leader(dlt, 0, 1),
                 lambda: cluster.move_leader("__consumer_offsets", offsets_partition,
                                             new_coordinator)]
        src, out, ms = group_run(cluster, topic, [("librdkafka", proxy.endpoint()),
                                                  ("librdkafka", other.endpoint())], moves,
                                 group=group)
        assert cluster.leaders(topic) == {0: 1, 1: 3, 2: 1}
        assert cluster.leaders(dlt) == {0: 1}
        assert cluster.leaders("__consumer_offsets")[offsets_partition] == new_coordinator
        stats = check_group_run(cluster, topic, src, out, ms)
        print("reassignment run:", stats)
        assert {d.member for d in out} == {m.name for m in ms}, "a member read nothing"
        proxy.assert_running()
        other.assert_running()
        settled(proxy)
        settled(other)
    finally:
        other.stop_and_check(15)


def test_leader_brokers_stopped_and_restarted_while_a_group_reads(cluster, proxy):
    """A librdkafka and a kafka-python member of one group, through one
    instance; the DLT's leader (node 3) is stopped (controlled shutdown)
    and started again, then node 1, which leads two of the topic's
    partitions and by then the DLT too."""
    topic = policy_topic(cluster, "restart")
    dlt = f"{topic}.dlt"

    while_down = {}
    open_during = []

    def bounce(node):
        def go():
            open_during.append(proxy.metric("antidote_connections_open"))
            cluster.stop_node(node)
            while_down[node] = (cluster.leaders(topic), cluster.leaders(dlt))
            time.sleep(1.0)  # records and poison keep coming meanwhile
            cluster.start_node(node)
            cluster.wait_full_isr(topic)
            cluster.wait_full_isr(dlt)
        return go

    src, out, ms = group_run(cluster, topic, [("librdkafka", proxy.endpoint()),
                                              ("kafka-python", proxy.endpoint())],
                             [bounce(3), bounce(1)], rounds=80)
    stats = check_group_run(cluster, topic, src, out, ms)
    print("restart run:", stats, while_down)
    # Leaders while each node was down: the DLT's moved off node 3, then
    # topic partitions 0 and 2 (and the DLT, if it had gone there) off node 1.
    assert while_down[3][1][0] in (1, 2), while_down
    assert 1 not in (while_down[1][0][0], while_down[1][0][2], while_down[1][1][0]), while_down
    proxy.assert_running()
    assert min(open_during) > 0, open_during  # the gauge counts these clients
    settled(proxy)


# ---------------------------------------------------------------------------
# The proxy's own clients follow new leaders
# ---------------------------------------------------------------------------

def java_hash(s: str) -> int:
    """Java's String.hashCode (ASCII), as an unsigned 32-bit value."""
    v = 0
    for ch in s:
        v = (31 * v + ord(ch)) & 0xFFFFFFFF
    return v


def lease_coordinator_partition(dlt: str, partition: int = 0) -> int:
    """The __transaction_state partition of the DLT partition's lease (its
    transactional id `antidote-dlt/{dlt}/{partition}`, as Kafka's
    TransactionStateManager.partitionFor places it)."""
    tid = f"antidote-dlt/{dlt}/{partition}"
    return (java_hash(tid) & 0x7FFFFFFF) % 3


def wait_metric(p: ClusterProxy, name: str, labels: str, want: float, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while (got := p.metric(name, labels)) != want:
        assert time.monotonic() < deadline, f"{p.name}: {name}{{{labels}}} = {got}, want {want}"
        time.sleep(0.2)


def test_a_fleet_follows_the_dlt_leader_and_the_lease_its_coordinator(workdir, cluster,
                                                                       policy_file,
                                                                       txn_coordinator):
    """Two instances bootstrapped from node 1 only, the topic led by node 1,
    its DLT by node 2, and the DLT partition's transaction coordinator (the
    lease's) moved to node 3 first. Instances 0, 1, 0 each divert one
    poison record; between rounds the DLT's leader moves (2 -> 3 -> 1) and
    the coordinator too (3 -> 2). The DLT then reads: record, lease marker,
    record, lease marker, record (each later lease took a new epoch from
    the coordinator and fenced the other instance), and each instance's
    ledger tail, following the DLT's leader, learned the other's records."""
    topic = unique(ps.JSON_PREFIX, "lease")
    dlt = f"{topic}.dlt"
    cluster.create_topic(topic, [[1, 2, 3]])
    cluster.create_topic(dlt, [[2, 3, 1]])
    coord = lease_coordinator_partition(dlt)
    cluster.move_leader("__transaction_state", coord, 3)
    bootstrap = [cluster.brokers[1].bootstrap]
    fleet = [start_cluster_proxy(workdir, cluster, f"cluster-lease-{i}", upstream=bootstrap,
                                 policies=[policy_file]) for i in range(2)]
    moves = {1: lambda: cluster.move_leader(dlt, 0, 3),
             2: lambda: (cluster.move_leader(dlt, 0, 1),
                         cluster.move_leader("__transaction_state", coord, 2))}
    try:
        for i, p in enumerate([0, 1, 0]):
            if i in moves:
                moves[i]()
            recs = [ps.json_rec("valid", 2 * i), ps.json_rec("lat", 2 * i + 1)]
            c.ck_produce(cluster.endpoint(), topic, recs)
            got = c.ck_consume_assign(fleet[p].endpoint(), topic, [0], i + 1, timeout=60)
            assert [r.offset for r in got] == [2 * j for j in range(i + 1)], got
            time.sleep(1.0)  # past the tail delay: the other instance learns the diversion
        dlt_recs = read_topic_direct(cluster, dlt)
        seq = ["lease" if ps.is_lease_marker(r) else int(ps.hdict(r)["x-original-offset"])
               for r in dlt_recs]
        assert seq == [1, "lease", 3, "lease", 5], seq
        assert cluster.leaders(dlt) == {0: 1}
        assert cluster.leaders("__transaction_state")[coord] == 2
        # Each instance knows the other's diversions: from its ledger tail,
        # or (a tail slower than the 1 s pause, under load) from the read
        # just before writing it again. Instance 1 never fetched after
        # offset 5 was written (by instance 0, the DLT led by node 1): that
        # one only its tail, following the leader, can have brought.
        def from_others(f):
            return (f.metric("antidote_dlt_diversions_total", 'source="learned"')
                    + f.metric("antidote_dlt_diversions_total", 'source="found_at_write"'))
        deadline = time.monotonic() + 20
        while (from_others(fleet[1]), from_others(fleet[0])) != (2, 1):
            assert time.monotonic() < deadline, (from_others(fleet[1]), from_others(fleet[0]))
            time.sleep(0.2)
        assert fleet[1].metric("antidote_dlt_diversions_total", 'source="learned"') >= 1
        for f in fleet:
            wait_metric(f, "antidote_dlt_ledger_lag_records", "", 0)
            f.assert_running()
    finally:
        for f in fleet:
            f.stop_and_check(15)


def test_an_idle_instance_tail_follows_a_dlt_moved_off_its_broker(workdir, cluster,
                                                                  policy_file, txn_coordinator):
    """A DLT with two replicas, led by node 2, is reassigned to nodes 3 and
    1: node 2 no longer holds it at all (a leader move that a read from a
    former leader, now a follower, cannot hide). Instance A diverts before
    and after; instance B, which no client uses, must learn both diversions
    from its ledger tail."""
    topic = unique(ps.JSON_PREFIX, "tailmove")
    dlt = f"{topic}.dlt"
    cluster.create_topic(topic, [[1, 2, 3]])
    cluster.create_topic(dlt, [[2, 1]])
    a, b = [start_cluster_proxy(workdir, cluster, f"cluster-tail-{n}", policies=[policy_file])
            for n in "ab"]
    try:
        for i in range(2):
            if i == 1:
                cluster.reassign(dlt, 0, [3, 1])
                cluster.wait_leaders(dlt, {0: 3})
            c.ck_produce(cluster.endpoint(), topic,
                         [ps.json_rec("valid", 2 * i), ps.json_rec("lat", 2 * i + 1)])
            got = c.ck_consume_assign(a.endpoint(), topic, [0], i + 1, timeout=60)
            assert [r.offset for r in got] == [2 * j for j in range(i + 1)], got
            wait_metric(b, "antidote_dlt_diversions_total", 'source="learned"', i + 1)
        assert dlt_origins(cluster, dlt) == [(0, 1), (0, 3)]
        wait_metric(b, "antidote_dlt_ledger_lag_records", "", 0)
    finally:
        a.stop_and_check(15)
        b.stop_and_check(15)


def test_the_blocked_key_follower_follows_a_dlt_moved_off_its_broker(workdir, cluster,
                                                                     txn_coordinator):
    """`ordering: per_key`: key A is blocked by a poison record (the DLT led
    by node 2, the topic by node 1). The DLT is then reassigned to nodes 3
    and 1. A's next record is still parked (a new diversion after the move,
    once), `dlt discard` writes its release marker to the new leader, and
    the proxy's blocked-key follower reads it there: A is released and its
    next record delivered."""
    from test_keys import POLICY, rec, tags
    from test_ops import cli, ok
    topic = f"cluster-keys-{uuid.uuid4().hex[:8]}"
    dlt = f"{topic}.dlt"
    cluster.create_topic(topic, [[1, 2, 3]])
    cluster.create_topic(dlt, [[2, 1]])
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    p = start_cluster_proxy(workdir, cluster, "cluster-keys", policies=[policy])

    def through_proxy(last_tag):
        got = c.ck_consume_assign(p.endpoint(), topic, [0], 10_000, timeout=60,
                                  until=lambda rs: last_tag in tags(rs))
        return tags(got)

    def parked(n):
        deadline = time.monotonic() + 30
        while True:
            got = [r for r in read_topic_direct(cluster, dlt)
                   if "x-antidote-marker" not in dict(r.headers)]
            if len(got) >= n or time.monotonic() > deadline:
                return tags(got)
            time.sleep(0.3)

    try:
        c.ck_produce(cluster.endpoint(), topic, [rec(0, "A", "A1", lat=95), rec(0, "B", "B1"),
                                                 rec(0, "A", "A2"), rec(0, "C", "C1")])
        assert through_proxy("C1") == ["B1", "C1"]
        assert parked(2) == ["A1", "A2"]
        wait_metric(p, "antidote_blocked_keys", "", 1)

        cluster.reassign(dlt, 0, [3, 1])
        cluster.wait_leaders(dlt, {0: 3})
        c.ck_produce(cluster.endpoint(), topic, [rec(0, "A", "A3"), rec(0, "D", "D1")])
        assert through_proxy("D1") == ["B1", "C1", "D1"]
        assert parked(3) == ["A1", "A2", "A3"]

        out = ok(cli("dlt", "discard", "--config", str(p.config_path), "--topic", dlt,
                     "--key", "A", "--execute"))
        assert "discarded         key A" in out, out
        wait_metric(p, "antidote_blocked_keys", "", 0, timeout=30)
        c.ck_produce(cluster.endpoint(), topic, [rec(0, "A", "A4")])
        assert through_proxy("A4") == ["B1", "C1", "D1", "A4"]
        assert parked(3) == ["A1", "A2", "A3"], "a record parked twice, or A4 parked"
        p.assert_running()
    finally:
        p.stop_and_check(15)


def test_a_broker_that_joins_after_the_proxy_started_is_served(workdir, cluster, policy_file):
    """Node 3 is down when an instance starts (metadata names nodes 1 and 2
    only); it comes back, a partition's leadership moves to it, and a client
    of the proxy reads that partition through the port of node 3, which the
    proxy opened when it learned the broker."""
    cluster.stop_node(3)
    try:
        p = start_cluster_proxy(workdir, cluster, "cluster-join", serve_all=False,
                                policies=[policy_file])
        for n in (1, 2):
            h.wait_for_port(p.port_base + n, 15, p.proc, p.log, f"broker {n}")
        time.sleep(0.5)
        assert h.port_is_free(p.port_base + 3), "node 3 served while it was down"
    finally:
        cluster.start_node(3)
    try:
        topic = unique("cluster-join.", "")
        cluster.create_topic(topic, [[1, 3, 2]])
        recs = c.sample_records(5, tag="join")
        c.ck_produce(cluster.endpoint(), topic, recs)
        cluster.move_leader(topic, 0, 3)
        wait_every_node_names_leader(cluster, topic, 0, 3)
        proc = subprocess.Popen([sys.executable, "-c", READ_SCRIPT, p.bootstrap, topic,
                                 str(len(recs)), str(TESTS)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            with h.ConnectionWatcher(proc.pid) as w:
                out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        assert proc.returncode == 0 and out.strip() == "OK", err[-4000:]
        assert not w.remote_ports & cluster.ports, w.remote_ports
        # Node 3's own port serves its partition. (Whether the reader above
        # went there is up to Kafka: a former leader still answers a
        # consumer's Fetch, so a client with older metadata reads on.)
        fp = ps.fetch_partition(p.port_base + 3, topic)
        assert fp.error_code == 0, fp.error_code
        assert [r.value for r in h.decode_uncompressed_batches(fp.records)] == \
            [r.value for r in recs]
        assert any("serving broker" in ln and "node=3" in ln
                   for ln in h.read_log(p.log, 10**7).splitlines())
        p.assert_running()
    finally:
        p.stop_and_check(15)


def wait_every_node_names_leader(cluster, topic: str, partition: int, leader: int,
                                 timeout: float = 30) -> None:
    """Until the metadata of every running node names `leader` for the
    partition: nodes learn a leader move at slightly different times, and a
    client that asked a late one would read from the former leader (which
    still answers reads), never through the new leader's port."""
    from confluent_kafka.admin import AdminClient
    deadline = time.monotonic() + timeout
    while True:
        seen = {}
        for n in cluster.running():
            md = AdminClient({"bootstrap.servers": cluster.brokers[n].bootstrap,
                              "log_level": 0}).list_topics(topic, timeout=10)
            t = md.topics.get(topic)
            seen[n] = t.partitions[partition].leader if t and not t.error else None
        if all(v == leader for v in seen.values()):
            return
        assert time.monotonic() < deadline, f"leaders seen by each node: {seen}"
        time.sleep(0.2)


READ_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[4])
import clients as c
bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
got = c.ck_consume_assign(c.Endpoint(bootstrap, "proxy"), topic, [0], n, timeout=90)
assert [r.value for r in got] == [r.value for r in c.sample_records(n, tag="join")], got
print("OK")
"""



def test_a_frozen_first_bootstrap_server_is_passed_over(workdir, cluster, policy_file,
                                                        txn_coordinator):
    """Node 1, the first of the proxy's `upstream.bootstrap_servers`, is
    frozen (SIGSTOP, as a long GC pause or a half-open network would): its
    kernel still accepts connections, nothing answers. The controller fences
    it and the cluster goes on with nodes 2 and 3. A new client of the proxy
    bootstraps, reads a policy topic led by node 2 and its poison is
    diverted, within a bounded time: the proxy's metadata refresh (every 2 s
    here) finds node 1 silent and its clients' bootstrap connections go to
    the next server from then on. (Before, every bootstrap connection went
    to node 1, the first server that accepted a connection: no new client
    could start while it was frozen.)"""
    import signal
    topic = unique(ps.JSON_PREFIX, "frozen")
    dlt = f"{topic}.dlt"
    cluster.create_topic(topic, [[2, 3, 1]])
    cluster.create_topic(dlt, [[3, 2, 1]])
    p = start_cluster_proxy(workdir, cluster, "cluster-frozen", policies=[policy_file],
                            upstream_extra={"metadata_refresh": "2s", "connect_timeout": "3s"})
    first = [ps.json_rec("valid", 0), ps.json_rec("lat", 1)]
    later = [ps.json_rec("valid", 2), ps.json_rec("enum", 3), ps.json_rec("valid", 4)]
    node1 = cluster.brokers[1].proc
    try:
        c.ck_produce(cluster.endpoint(), topic, first)
        assert [r.offset for r in c.ck_consume_assign(p.endpoint(), topic, [0], 1)] == [0]
        os.kill(node1.pid, signal.SIGSTOP)
        try:
            cluster.wait_brokers({2, 3}, timeout=60, ask=[2, 3])
            c.ck_produce(c.Endpoint(f"{cluster.brokers[2].bootstrap},"
                                    f"{cluster.brokers[3].bootstrap}"), topic, later)
            t0 = time.monotonic()
            got = c.ck_consume_assign(p.endpoint(), topic, [0], 3, timeout=60)
            took = time.monotonic() - t0
            assert [r.offset for r in got] == [0, 2, 4], got
            print(f"read through the proxy with node 1 frozen in {took:.1f} s")
            assert wait_dlt_origins(cluster, dlt, [1, 3]) == [(0, 1), (0, 3)]
            # The fault took effect in the proxy: it found node 1 silent and
            # passed it over (not merely a client that never asked it).
            passed = [line for line in h.read_log(p.log, limit=10**7).splitlines()
                      if "upstream bootstrap server failed" in line]
            assert any(cluster.brokers[1].bootstrap in line for line in passed), passed
        finally:
            os.kill(node1.pid, signal.SIGCONT)
        cluster.wait_brokers(set(NODE_IDS), timeout=60)
        cluster.wait_full_isr(topic)
        cluster.wait_full_isr(dlt)
        p.assert_running()
    finally:
        if node1.poll() is None:
            os.kill(node1.pid, signal.SIGCONT)
        p.stop_and_check(15)


def test_the_dlt_leader_killed_then_frozen_while_a_group_reads(cluster, proxy):
    """Harsher than a controlled shutdown, through one instance with a
    librdkafka and a kafka-python member: node 3, the DLT's leader, is
    SIGKILLed (its connections reset, no leadership handed over) and
    started again; then whichever node leads the DLT is frozen (SIGSTOP:
    connections stay open and silent until the controller fences it) and
    thawed. Same promises: each valid record once, no poison delivered, each
    poison record in the DLT once, nothing left open or held."""
    import signal
    topic = policy_topic(cluster, "kill")
    dlt = f"{topic}.dlt"
    seen = {}

    def kill3():
        b = cluster.brokers[3]
        b.proc.kill()
        b.proc.wait(10)
        cluster.wait_brokers({1, 2}, timeout=60)
        seen["after kill"] = cluster.leaders(dlt)[0]
        time.sleep(1.0)
        cluster.start_node(3)
        cluster.wait_full_isr(topic)
        cluster.wait_full_isr(dlt)

    def freeze_dlt_leader():
        n = cluster.leaders(dlt)[0]
        b = cluster.brokers[n]
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            others = [m for m in NODE_IDS if m != n]
            cluster.wait_brokers(set(others), timeout=60, ask=others)
            seen["frozen"], seen["while frozen"] = n, cluster.leaders(dlt)[0]
            time.sleep(2.0)
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        cluster.wait_brokers(set(NODE_IDS), timeout=60)
        cluster.wait_full_isr(topic)
        cluster.wait_full_isr(dlt)

    src, out, ms = group_run(cluster, topic, [("librdkafka", proxy.endpoint()),
                                              ("kafka-python", proxy.endpoint())],
                             [kill3, freeze_dlt_leader], rounds=80)
    stats = check_group_run(cluster, topic, src, out, ms)
    print("kill/freeze run:", stats, seen)
    assert seen["after kill"] != 3 and seen["while frozen"] != seen["frozen"], seen
    proxy.assert_running()
    settled(proxy)


def test_a_dlt_the_proxy_creates_gets_the_clusters_replication_factor(cluster, proxy):
    """`dead_letter.replication_factor` defaults to -1: a DLT the proxy
    creates on first diversion is replicated as the cluster's
    `default.replication.factor` says (3 here), not on one broker."""
    topic = unique(ps.JSON_PREFIX, "rfdefault")
    cluster.create_topic(topic, TOPIC_ASSIGNMENT)
    ep = c.Endpoint(proxy.bootstrap, "proxy")
    c.ck_produce(c.Endpoint(cluster.bootstrap), topic,
                 [ps.json_rec("valid", 0), ps.json_rec("lat", 1)])
    got = c.ck_consume_assign(ep, topic, [0, 1], 1, timeout=60)
    assert [r.value for r in got] == [ps.json_rec("valid", 0).value]
    dlt = f"{topic}.dlt"
    assert wait_dlt_origins(cluster, dlt, [(0, 1)]) == [(0, 1)]
    [(leader, replicas, _isr)] = cluster.describe(dlt).values()
    assert sorted(replicas) == [1, 2, 3], replicas
