"""A cluster of three Apache Kafka nodes on loopback, for test_cluster.py.

Three combined nodes (`process.roles=broker,controller`, node ids 1, 2, 3)
with a static quorum of all three as voters: any single node can be stopped
and started again while the other two keep a quorum, elect leaders and move
partitions. Each node is a `harness.KafkaBroker` (the suite's broker, with
its settings); `extra_properties` (appended last, so they win over
`KAFKA_PROPERTIES`) name the three voters and give the internal topics
replication factor 3 with a minimum ISR of 2, so acks=all writes go on while
one node is down. Each node's log dir is a copy of the harness's formatted
template for its node id (formatted once with the suite's fixed cluster id;
a static quorum stores no voter in the formatted directory, so a copy serves
any ports).

The nodes are launched together (a combined node is "started" only once the
quorum has a leader, which takes two of them) and the cluster is ready when
every node logged "Kafka Server started" and a Metadata request names all
three brokers.

Also here: `cluster_proxy_base`, a proxy port base with base + 1..3 free, and
admin helpers (leaders, reassignment, preferred leader election) over
kafka-python's admin client and librdkafka's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

import clients as c
import harness as h

NODE_IDS = (1, 2, 3)

# Settings of a node of the 3-node cluster, over the harness's single-node ones.
CLUSTER_PROPERTIES = {
    "default.replication.factor": 3,
    "offsets.topic.replication.factor": 3,
    # Three partitions: groups land on different coordinators.
    "offsets.topic.num.partitions": 3,
    "transaction.state.log.replication.factor": 3,
    "transaction.state.log.min.isr": 2,
    "transaction.state.log.num.partitions": 3,
    "share.coordinator.state.topic.replication.factor": 3,
    "share.coordinator.state.topic.min.isr": 2,
    "min.insync.replicas": 2,
    # Leaders move only when a test moves them (no preferred-leader
    # rebalance five minutes in).
    "auto.leader.rebalance.enable": "false",
    # A restarted follower rejoins the ISR quickly; a stopped one is fenced
    # after a few seconds (defaults 30 s and 9 s).
    "replica.lag.time.max.ms": 5000,
    "broker.session.timeout.ms": 6000,
    "broker.heartbeat.interval.ms": 1000,
    "replica.fetch.wait.max.ms": 100,
    "replica.fetch.backoff.ms": 200,
    "controlled.shutdown.enable": "true",
}


@dataclass
class KafkaCluster:
    """Three combined KRaft nodes on loopback (see the module docstring)."""
    workdir: Path
    brokers: dict[int, h.KafkaBroker] = field(default_factory=dict)

    def __post_init__(self) -> None:
        controller_ports = {n: h.free_port() for n in NODE_IDS}
        voters = ",".join(f"{n}@{h.HOST}:{p}" for n, p in controller_ports.items())
        for n in NODE_IDS:
            props = {"controller.quorum.voters": voters, **CLUSTER_PROPERTIES}
            self.brokers[n] = h.KafkaBroker(self.workdir, controller_port=controller_ports[n],
                                            node_id=n, extra_properties=props)

    # --- addresses ---------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated (a client's bootstrap)."""
        return ",".join(b.bootstrap for b in self.brokers.values())

    def endpoint(self) -> c.Endpoint:
        return c.Endpoint(self.bootstrap, "direct")

    @property
    def ports(self) -> set[int]:
        """Every port a node listens on (client and controller listeners)."""
        return {p for b in self.brokers.values() for p in (b.port, b.controller_port)}

    def port_of(self, node: int) -> int:
        return self.brokers[node].port

    # --- life cycle --------------------------------------------------------

    def start(self, timeout: float = 120) -> "KafkaCluster":
        """Launch the three nodes at once; ready when all have started and
        Metadata lists all three."""
        errors: list[BaseException] = []

        def go(b: h.KafkaBroker) -> None:
            try:
                b.start(timeout=timeout)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)

        threads = [threading.Thread(target=go, args=(b,)) for b in self.brokers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 30)
        if errors:
            self.stop()
            raise errors[0]
        self.wait_brokers(set(NODE_IDS), timeout=60)
        return self

    def stop_node(self, node: int, timeout: float = 60) -> None:
        """SIGTERM: a controlled shutdown (its leaderships move first)."""
        self.brokers[node].stop(timeout)
        self.wait_brokers(set(NODE_IDS) - {node}, timeout=60)

    def start_node(self, node: int, timeout: float = 90) -> None:
        self.brokers[node].start(timeout=timeout)
        self.wait_brokers(set(NODE_IDS), timeout=60)

    def stop(self) -> None:
        """All nodes at once: SIGTERM each, then SIGKILL what is left after
        10 s (one by one, the last nodes would wait for a quorum that is gone
        before their controlled shutdown gives up)."""
        procs = [b.proc for b in self.brokers.values() if b.proc is not None]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - killed below
                p.kill()
                p.wait(10)

    def running(self) -> list[int]:
        return [n for n, b in self.brokers.items() if b.proc is not None and b.proc.poll() is None]

    def wait_brokers(self, want: set[int], timeout: float = 60,
                     ask: Optional[list[int]] = None) -> None:
        """Until a Metadata request to each node of `ask` (default: every
        running node) lists exactly `want`: brokers learn a fenced or
        returning broker from the metadata log at slightly different times."""
        from confluent_kafka.admin import AdminClient
        deadline = time.monotonic() + timeout
        seen: dict = {}
        while time.monotonic() < deadline:
            seen = {}
            for n in (ask or self.running()):
                try:
                    md = AdminClient({"bootstrap.servers": self.brokers[n].bootstrap,
                                      "log_level": 0}).list_topics(timeout=5)
                    seen[n] = set(md.brokers)
                except Exception as e:  # noqa: BLE001 - retried until the deadline
                    seen[n] = f"error: {e}"
            if seen and all(v == want for v in seen.values()):
                return
            time.sleep(0.2)
        raise h.HarnessError(f"metadata names brokers {seen}, not {want}, after {timeout}s\n"
                             + "\n".join(h.read_log(b.log, 4000) for b in self.brokers.values()))

    # --- admin -------------------------------------------------------------

    def kp_admin(self):
        from kafka.admin import KafkaAdminClient
        return KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=30000,
                                client_id="cluster-admin")

    def create_topic(self, name: str, assignment: list[list[int]],
                     configs: Optional[dict] = None) -> None:
        """A topic whose partition i has replicas assignment[i] (the first
        is its preferred leader, which Kafka makes the leader)."""
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        nt = NewTopic(name, num_partitions=len(assignment), replica_assignment=assignment,
                      config={k: str(v) for k, v in (configs or {}).items()})
        for f in admin.create_topics([nt], operation_timeout=30).values():
            f.result(60)
        want = {p: a[0] for p, a in enumerate(assignment)}
        self.wait_leaders(name, want)

    def describe(self, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
        """partition -> (leader, replicas, isr), from a running node's metadata."""
        from confluent_kafka.admin import AdminClient
        last = None
        for n in self.running():
            try:
                md = AdminClient({"bootstrap.servers": self.brokers[n].bootstrap,
                                  "log_level": 0}).list_topics(topic, timeout=10)
            except Exception as e:  # noqa: BLE001 - the next node is asked
                last = e
                continue
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                return {}
            return {p: (m.leader, list(m.replicas), list(m.isrs)) for p, m in t.partitions.items()}
        raise h.HarnessError(f"no node answered metadata for {topic}: {last}")

    def ensure_offsets_topic(self, timeout: float = 60) -> None:
        """Make Kafka create __consumer_offsets (on the first FindCoordinator
        of a group) and wait until each of its partitions has a leader."""
        import confluent_kafka as ck
        deadline = time.monotonic() + timeout
        while len([l for l in self.leaders("__consumer_offsets").values() if l >= 0]) < \
                CLUSTER_PROPERTIES["offsets.topic.num.partitions"]:
            assert time.monotonic() < deadline, "__consumer_offsets not created"
            cons = ck.Consumer({"bootstrap.servers": self.bootstrap, "log_level": 0,
                                "group.id": "cluster-offsets-topic"})
            try:
                cons.committed([ck.TopicPartition("cluster-none", 0)], timeout=5)
            except ck.KafkaException:
                pass  # coordinator not available yet: asked again
            finally:
                cons.close()
            time.sleep(0.2)

    def leaders(self, topic: str) -> dict[int, int]:
        return {p: d[0] for p, d in self.describe(topic).items()}

    def wait_leaders(self, topic: str, want: dict[int, int], timeout: float = 60,
                     full_isr: bool = False) -> None:
        """Until every partition of `want` is led by the node it names (and,
        with full_isr, has all its replicas in sync)."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            try:
                seen = self.describe(topic)
            except h.HarnessError as e:
                seen = str(e)
            if isinstance(seen, dict) and all(
                    p in seen and seen[p][0] == leader
                    and (not full_isr or sorted(seen[p][1]) == sorted(seen[p][2]))
                    for p, leader in want.items()):
                return
            time.sleep(0.2)
        raise h.HarnessError(f"{topic}: leaders {seen}, want {want} after {timeout}s")

    def wait_full_isr(self, topic: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.describe(topic)
            if seen and all(sorted(r) == sorted(i) for _, r, i in seen.values()):
                return
            time.sleep(0.2)
        raise h.HarnessError(f"{topic}: ISR not full after {timeout}s: {seen}")

    def reassign(self, topic: str, partition: int, replicas: list[int],
                 timeout: float = 60) -> None:
        """AlterPartitionReassignments of `topic`/`partition` to `replicas`
        (Admin API, kafka-python); waits until no reassignment of it is
        ongoing and metadata names exactly these replicas, in this order."""
        from kafka.structs import TopicPartition
        tp = TopicPartition(topic, partition)
        admin = self.kp_admin()
        try:
            errs = admin.alter_partition_reassignments({tp: list(replicas)})
            assert all(e is None for e in errs.values()), errs
            deadline = time.monotonic() + timeout
            while True:
                ongoing = admin.list_partition_reassignments([tp])
                if not ongoing and self.describe(topic)[partition][1] == list(replicas):
                    return
                if time.monotonic() > deadline:
                    raise h.HarnessError(f"reassignment of {topic}-{partition} to {replicas} "
                                         f"not done after {timeout}s: {ongoing}, "
                                         f"{self.describe(topic)}")
                time.sleep(0.2)
        finally:
            admin.close()

    def move_leader(self, topic: str, partition: int, to: int, timeout: float = 60) -> None:
        """Move the leadership of `topic`/`partition` to node `to` through the
        Admin API: an AlterPartitionReassignments that puts `to` first among
        the same replicas (its preferred leader), then an ElectLeaders
        (preferred). Waits until metadata names `to` as the leader."""
        self.wait_full_isr(topic, timeout)
        _, replicas, _ = self.describe(topic)[partition]
        assert to in replicas, f"{topic}-{partition}: {to} is not a replica of {replicas}"
        self.reassign(topic, partition, [to] + [r for r in replicas if r != to], timeout)
        admin = self.kp_admin()
        try:
            # 0: preferred (ELECTION_NOT_NEEDED when `to` leads already).
            admin.elect_leaders(0, {topic: [partition]}, raise_errors=False)
        finally:
            admin.close()
        self.wait_leaders(topic, {partition: to}, timeout)


def cluster_proxy_base(node_ids=NODE_IDS, tries: int = 500) -> int:
    """A proxy `broker_port_base` with base + n free (and claimed) for every node n."""
    import random
    lo, hi = h._port_range()
    for _ in range(tries):
        base = random.randrange(lo, hi - max(node_ids))
        if all(h.port_is_free(base + n) for n in node_ids):
            claimed = [n for n in node_ids if h._claim(base + n)]
            if len(claimed) == len(node_ids):
                return base
    raise h.HarnessError("no free port base for the cluster's proxy")


@pytest.fixture(scope="module")
def cluster(workdir):
    """One 3-node cluster per test module."""
    k = KafkaCluster(workdir / "cluster").start()
    yield k
    k.stop()
