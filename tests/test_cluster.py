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
  partition's). Every valid record is consumed once per group (each member
  commits each record synchronously; a record is allowed again only after
  its first delivery's commit failed), no poison record reaches a
  consumer, each poison record is in the DLT once (read from the brokers),
  and the proxies keep running.
- The proxy's own clients follow new leaders: after the DLT partition's
  leader (and the lease's transaction coordinator) moves, new diversions
  land once, another instance's ledger tail still learns them, the lease
  still passes between instances through its markers (real epochs, from
  the transaction coordinator, which is not the broker the instances
  bootstrap from), and the blocked-key follower of `ordering: per_key`
  still reads the DLT (a discard written after the move releases the key).
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

    def config_yaml(self) -> str:
        text = ps.PolicyProxy.config_yaml(self)
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


def start_cluster_proxy(workdir: Path, cluster, name: str, upstream=None, **kw) -> ClusterProxy:
    import conftest
    p = ClusterProxy(workdir, upstream=upstream or [b.bootstrap for b in cluster.brokers.values()],
                     port_base=cluster_proxy_base(), admin_port=h.free_port(),
                     name=f"{name}-{uuid.uuid4().hex[:6]}", **kw)
    conftest._PROXIES.append(p)
    p.start()
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
