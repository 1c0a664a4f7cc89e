"""Both consumer-group protocols through a policy proxy, with librdkafka and
the Java client, and share groups (KIP-932) refused (issue 32, item 4).

Consumer groups: `group.protocol=classic` (JoinGroup/SyncGroup/Heartbeat) and
KIP-848's `group.protocol=consumer` (ConsumerGroupHeartbeat, key 68, which
Kafka 4.x serves; the broker assigns). A topic of four partitions that end in
poison: member A reads the valid records and its committed offsets reach the
partitions' ends (the commit marker after a removed tail); member B joins
(a rebalance: two partitions each); more records, again ending in poison, are
read by whichever member holds their partition. Together they get exactly the
valid records, none twice, B re-reads nothing of what A committed, and the
group's committed offsets reach the new ends. That the group APIs went through
the proxy: the clients' own logs show the heartbeat requests answered, sent to
connections whose addresses are all the proxy's (librdkafka's statistics name
each broker connection's address; the Java member is watched from outside and
never connects to the broker's port); Admin's describeConsumerGroups through
the proxy (ConsumerGroupDescribe, key 69, for a `consumer` group) names the
group's type and both members.

Share groups: the proxy offers none of the share-group APIs (ShareFetch is not
filtered). A Java KafkaShareConsumer against a broker with `share.version=1`
reads its records directly, and through the proxy fails at its first poll with
UnsupportedVersionException, without joining the group.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient

import clients as c
import harness as h
import poison_support as ps
from test_java_clients import java_classes, run_java  # noqa: F401 (fixture)

pytestmark = h.needs_kafka

PARTITIONS = 4
# One batch per list, on every partition; each phase ends in poison.
PHASE1 = [["valid", "lat"], ["valid", "valid", "enum"]]
PHASE2 = [["valid", "garbage", "valid", "lat"]]

# NetworkClient at DEBUG names every request it sends and every response it
# gets ("Sending CONSUMER_GROUP_HEARTBEAT request ...").
JAVA_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1} %m%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
logger.nc.name = org.apache.kafka.clients.NetworkClient
logger.nc.level = DEBUG
"""


@pytest.fixture(scope="module")
def gproxy(workdir, broker, tmp_path_factory):
    pfile = ps.write_policies(tmp_path_factory.mktemp("group-policies"))
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[pfile],
                              name="antidote-groups")
    yield p
    p.stop_and_check()


@pytest.fixture(scope="module")
def java_log_config(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("java-log") / "log4j2.properties"
    p.write_text(JAVA_LOG4J2)
    return p


def java_cmd(classes: Path, log_config: Path, main: str, *args: str) -> list[str]:
    return ["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
            f"-Dlog4j2.configurationFile={log_config}",
            "-cp", f"{h.kafka_classpath()}:{classes}", main, *args]


def proxy_ports(p: h.Antidote) -> set[int]:
    return {p.bootstrap_port, p.broker_port()}


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------

def produce_phase(ep: c.Endpoint, topic: str, batches: list[list[str]],
                  first: dict[int, int]) -> tuple[list[c.Rec], dict[int, int]]:
    """`batches` on every partition from offset first[p]; the valid records
    and the new end of each partition."""
    valid, ends = [], {}
    for p in range(PARTITIONS):
        off = first[p]
        for kinds in batches:
            recs = [ps.json_rec(k, off + i, partition=p) for i, k in enumerate(kinds)]
            c.ck_produce(ep, topic, recs, **{"linger.ms": 200})
            valid += [r for r, k in zip(recs, kinds) if k == "valid"]
            off += len(kinds)
        ends[p] = off
    return valid, ends


def key(r: c.Rec) -> tuple:
    return (r.partition, r.offset, r.key, r.value)


def wait_committed(ep: c.Endpoint, topic: str, group: str, ends: dict[int, int],
                   members: list, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        for m in members:
            m.check()
        try:
            got = c.ck_committed(ep, topic, group, list(ends))
        except ck.KafkaException as e:  # e.g. NOT_COORDINATOR while a new broker loads offsets
            got = e
        if got == ends:
            return
        time.sleep(0.5)
    raise AssertionError(f"committed {got}, want the partitions' ends {ends}")


def wait_two_members(ep: c.Endpoint, group: str, members: list, timeout: float = 120) -> dict:
    """Until the broker's description has two members, each with partitions,
    that share none and hold all of them: {client id: sorted partitions}."""
    admin = AdminClient(ep.ck())
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        for m in members:
            m.check()
        try:
            d = admin.describe_consumer_groups([group])[group].result(timeout=15)
        except ck.KafkaException as e:
            seen = e
            time.sleep(0.5)
            continue
        seen = {mem.client_id: sorted(tp.partition for tp in mem.assignment.topic_partitions)
                for mem in d.members}
        parts = [p for ps_ in seen.values() for p in ps_]
        if len(seen) == 2 and all(seen.values()) and sorted(parts) == list(range(PARTITIONS)):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"the group did not settle on two members: {seen}")


# ---------------------------------------------------------------------------
# Group members: librdkafka in a thread, Java in a process of its own
# ---------------------------------------------------------------------------

class RdkafkaMember:
    """A confluent-kafka consumer polling in a thread, auto-committing every
    200 ms (and on revocation and close, as librdkafka does), with protocol
    debug logging of the group requests and its statistics."""

    def __init__(self, bootstrap: str, topic: str, group: str, protocol: str, name: str):
        self.topic, self.name = topic, name
        self.records: list[c.Rec] = []
        self.log: list[str] = []
        self.stats: list[dict] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        logger = logging.getLogger(f"rdkafka-{name}-{uuid.uuid4().hex[:6]}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        member = self

        class Keep(logging.Handler):
            def emit(self, record):
                msg = record.getMessage()
                if "Group" in msg:
                    member.log.append(msg)

        logger.addHandler(Keep())
        self.consumer = ck.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
            "client.id": name, "auto.offset.reset": "earliest",
            "enable.auto.commit": True, "auto.commit.interval.ms": 200,
            "debug": "protocol", "statistics.interval.ms": 500,
            "stats_cb": lambda s: member.stats.append(json.loads(s)), "log_level": 7,
        }, logger=logger)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "RdkafkaMember":
        self.consumer.subscribe([self.topic])
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                m = self.consumer.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() != ck.KafkaError._PARTITION_EOF:
                        self.errors.append(str(m.error()))
                    continue
                self.records.append(c._ck_rec(m))
            self.consumer.close()  # commits what was delivered, leaves the group
        except Exception as e:  # noqa: BLE001 (reported by check())
            self.errors.append(repr(e))

    def check(self) -> None:
        assert not self.errors, f"{self.name}: {self.errors}"
        assert self.thread.is_alive(), f"{self.name} stopped early"

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"{self.name} did not close within 60 s"
        assert not self.errors, f"{self.name}: {self.errors}"

    def requests_answered(self) -> set[str]:
        """Group request names librdkafka logged a response to."""
        out = set()
        for line in self.log:
            if "Received " in line and "Response (" in line:
                out.add(line.split("Received ", 1)[1].split("Response (", 1)[0])
        return out

    def connected_ports(self) -> set[int]:
        """The port of every broker connection librdkafka's statistics name,
        the group coordinator's among them."""
        out = set()
        for s in self.stats:
            for b in s["brokers"].values():
                if b.get("nodename"):
                    out.add(int(b["nodename"].rsplit(":", 1)[1]))
        return out

    def coordinator_ports(self) -> set[int]:
        return {int(b["nodename"].rsplit(":", 1)[1]) for s in self.stats
                for name, b in s["brokers"].items()
                if name == "GroupCoordinator" and b.get("nodename")}


class JavaMember:
    """tests/java/JavaMember.java in a process of its own, watched for the
    ports it connects to; stopped through a file."""

    def __init__(self, classes: Path, log_config: Path, workdir: Path, bootstrap: str,
                 topic: str, group: str, protocol: str, name: str):
        self.name = name
        self.dir = workdir / f"{name}-{uuid.uuid4().hex[:8]}"
        self.dir.mkdir()
        self.stop_file = self.dir / "stop"
        self.cmd = java_cmd(classes, log_config, "JavaMember", bootstrap, topic, group, protocol,
                            name, str(self.stop_file), "240000")
        self.proc = None
        self.watch = None
        self.out: list[dict] = []

    def start(self) -> "JavaMember":
        with open(self.dir / "stdout", "wb") as out, open(self.dir / "stderr", "wb") as err:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL)
        self.watch = h.ConnectionWatcher(self.proc.pid).__enter__()
        return self

    def stderr(self) -> str:
        return (self.dir / "stderr").read_text(errors="replace")

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n"
                                 f"{(self.dir / 'stdout').read_text()[-3000:]}\n"
                                 f"{self.stderr()[-3000:]}")

    def stop(self) -> None:
        self.stop_file.touch()
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"{self.name} did not stop within 60 s")
        finally:
            self.watch.__exit__(None, None, None)
        text = (self.dir / "stdout").read_text()
        assert rc == 0, f"{self.name} exited {rc}:\n{text[-3000:]}\n{self.stderr()[-3000:]}"
        self.out = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        self.records = [c.Rec(p, o, *(None if x is None else base64.b64decode(x)
                                      for x in (k, v)))
                        for p, o, k, v in (x["record"] for x in self.out if "record" in x)]
        [self.committed] = [{int(p): o for p, o in x["committed"].items()}
                            for x in self.out if "committed" in x]

    def requests_answered(self) -> set[str]:
        """Request kinds NetworkClient logged a response to."""
        out = set()
        for line in self.stderr().splitlines():
            if " Received " in line and " response from node " in line:
                out.add(line.split(" Received ", 1)[1].split(" response", 1)[0])
        return out


def stop_all(members: list) -> None:
    """Stop every member (the last started first); then raise the first failure."""
    failures = []
    for m in reversed(members):
        try:
            m.stop()
        except Exception as e:  # noqa: BLE001
            failures.append(e)
    if failures:
        raise failures[0]


# ---------------------------------------------------------------------------
# The scenario
# ---------------------------------------------------------------------------

CLASSIC_APIS = {"rdkafka": {"JoinGroup", "SyncGroup"}, "java": {"JOIN_GROUP", "SYNC_GROUP"}}
KIP848_APIS = {"rdkafka": {"ConsumerGroupHeartbeat"}, "java": {"CONSUMER_GROUP_HEARTBEAT"}}
NOT_BOTH = {"classic": KIP848_APIS, "consumer": CLASSIC_APIS}


@pytest.mark.parametrize("protocol,kinds", [
    ("classic", ("rdkafka", "rdkafka")),
    ("consumer", ("rdkafka", "rdkafka")),
    ("classic", ("java", "java")),
    ("consumer", ("java", "java")),
    ("consumer", ("rdkafka", "java")),
], ids=["classic-librdkafka", "consumer-librdkafka", "classic-java", "consumer-java",
        "consumer-librdkafka-then-java"])
def test_group_reads_partitions_ending_in_poison_to_their_ends_across_a_rebalance(
        protocol, kinds, gproxy, broker, broker_endpoint, java_classes, java_log_config,
        tmp_path):
    topic = ps.unique_topic(ps.JSON_PREFIX, f"grp-{protocol}")
    group = f"grp-{protocol}-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(broker_endpoint, topic, PARTITIONS)

    def member(kind: str, name: str):
        if kind == "rdkafka":
            return RdkafkaMember(gproxy.bootstrap, topic, group, protocol, name)
        return JavaMember(java_classes, java_log_config, tmp_path, gproxy.bootstrap, topic,
                          group, protocol, name)

    valid1, ends1 = produce_phase(broker_endpoint, topic, PHASE1, {p: 0 for p in
                                                                     range(PARTITIONS)})
    a = member(kinds[0], "member-a").start()
    members = [a]
    try:
        wait_committed(broker_endpoint, topic, group, ends1, members)
        b = member(kinds[1], "member-b").start()
        members.append(b)
        held = wait_two_members(broker_endpoint, group, members)
        # Admin through the proxy: the group's type and both members.
        [desc] = run_java(java_classes, "JavaAdmin", gproxy.bootstrap, f"group:{group}")
        assert desc["type"] == protocol.upper(), desc
        assert sorted(m[0] for m in desc["members"]) == ["member-a", "member-b"], desc
        valid2, ends2 = produce_phase(broker_endpoint, topic, PHASE2, ends1)
        wait_committed(broker_endpoint, topic, group, ends2, members)
    finally:
        stop_all(members)

    got = a.records + b.records
    want = valid1 + valid2
    dups = [k for k, n in collections.Counter(map(key, got)).items() if n > 1]
    assert dups == [], f"records read twice: {dups}"
    assert sorted(map(key, got)) == sorted(map(key, want))
    for m in (a, b):
        by_p = c.by_partition_in_order(m.records)
        for p, recs in by_p.items():
            assert [r.offset for r in recs] == sorted(r.offset for r in recs), (m.name, p)
    # B joined after A had committed the poison tails: it re-read nothing,
    # and read the second phase of the partitions it was given.
    assert b.records and all(r.offset >= ends1[r.partition] for r in b.records), b.records
    assert {r.partition for r in b.records} <= set(held["member-b"]), (held, b.records)
    assert c.ck_committed(broker_endpoint, topic, group, list(range(PARTITIONS))) == ends2

    # The group APIs went through the proxy, and only there.
    for m, kind in zip((a, b), kinds):
        answered = m.requests_answered()
        want_apis = (KIP848_APIS if protocol == "consumer" else CLASSIC_APIS)[kind]
        assert want_apis <= answered, (m.name, answered)
        assert not (NOT_BOTH[protocol][kind] & answered), (m.name, answered)
        if kind == "rdkafka":
            assert m.coordinator_ports() == {gproxy.broker_port()}, m.stats[-1]["brokers"]
            assert m.connected_ports() <= proxy_ports(gproxy)
        else:
            assert m.watch.remote_ports, "the Java member was never seen connected"
            assert m.watch.remote_ports <= proxy_ports(gproxy), (m.watch.remote_ports,
                                                                 broker.port)


def test_admin_describes_a_consumer_group_through_the_proxy_with_consumer_group_describe(
        gproxy, broker_endpoint, java_classes, java_log_config, tmp_path):
    """Admin's describeConsumerGroups sends ConsumerGroupDescribe (69) for a
    KIP-848 group, and the proxy relays it."""
    topic = ps.unique_topic(ps.JSON_PREFIX, "grp-describe")
    group = f"grp-describe-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(broker_endpoint, topic, PARTITIONS)
    m = RdkafkaMember(gproxy.bootstrap, topic, group, "consumer", "member-d").start()
    try:
        wait_assigned(broker_endpoint, group, m)
        r = subprocess.run(java_cmd(java_classes, java_log_config, "JavaAdmin",
                                    gproxy.bootstrap, f"group:{group}"),
                           capture_output=True, text=True, timeout=90)
    finally:
        stop_all([m])
    assert r.returncode == 0, r.stderr[-3000:]
    [desc] = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert desc["type"] == "CONSUMER" and desc["state"] == "STABLE", desc
    assert desc["members"] == [["member-d", list(range(PARTITIONS))]], desc
    assert "Received CONSUMER_GROUP_DESCRIBE response" in r.stderr, r.stderr[-3000:]
    assert "Received DESCRIBE_GROUPS response" not in r.stderr


def wait_assigned(ep: c.Endpoint, group: str, m: RdkafkaMember, timeout: float = 60) -> None:
    admin = AdminClient(ep.ck())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m.check()
        try:
            d = admin.describe_consumer_groups([group])[group].result(timeout=15)
            if [len(x.assignment.topic_partitions) for x in d.members] == [PARTITIONS]:
                return
        except ck.KafkaException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{group}: no member with every partition within {timeout} s")


# ---------------------------------------------------------------------------
# Share groups
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def share_broker(workdir, java_classes):
    """A broker of its own with share groups on (Kafka 4.1 ships them as a
    preview: `share.version` is 0 on a new cluster until it is upgraded;
    never downgraded: Kafka 4.4 starts at 2)."""
    b = h.KafkaBroker(workdir).start()
    try:
        [now] = run_java(java_classes, "JavaAdmin", b.bootstrap, "features")
        if now["finalized"].get("share.version", 0) < 1:  # on by default since Kafka 4.2
            out = run_java(java_classes, "JavaAdmin", b.bootstrap, "feature:share.version:1",
                           "features")
            assert out[1]["finalized"].get("share.version") == 1, out
        yield b
    finally:
        b.stop()


@dataclass
class ShareOffProxy(ps.PolicyProxy):
    """A policy proxy with `share_groups.enabled: false` (share consumers
    through a proxy with share groups on: test_share_groups.py)."""

    def config_yaml(self) -> str:
        return super().config_yaml() + "share_groups:\n  enabled: false\n"


@pytest.fixture(scope="module")
def share_proxy(workdir, share_broker, tmp_path_factory):
    import conftest
    pfile = ps.write_policies(tmp_path_factory.mktemp("share-policies"))
    p = ShareOffProxy(workdir, upstream=[share_broker.bootstrap], policies=[pfile],
                      name="antidote-share-off")
    conftest._PROXIES.append(p)
    p.start()
    yield p
    p.stop_and_check()


def test_a_share_consumer_reads_directly_and_fails_at_once_through_a_proxy_with_share_groups_off(
        share_broker, share_proxy, java_classes):
    ep = c.Endpoint(share_broker.bootstrap, "direct")
    topic = ps.unique_topic(ps.JSON_PREFIX, "share")
    c.ck_create_topic(ep, topic, 1)
    recs = [ps.json_rec("valid", i) for i in range(3)]
    c.ck_produce(ep, topic, recs)
    direct, proxied = f"share-direct-{uuid.uuid4().hex[:8]}", f"share-proxy-{uuid.uuid4().hex[:8]}"
    # A share group starts at the latest offset unless its config says otherwise.
    out = run_java(java_classes, "JavaAdmin", share_broker.bootstrap,
                   f"groupconfig:{direct}:share.auto.offset.reset:earliest",
                   f"groupconfig:{proxied}:share.auto.offset.reset:earliest")
    assert all("error" not in x for x in out), out

    out = run_java(java_classes, "JavaShare", share_broker.bootstrap, topic, direct, "3", "60000")
    assert [x.get("error") for x in out if "error" in x] == [], out
    assert [tuple(x["record"][:2]) for x in out if "record" in x] == [(0, 0), (0, 1), (0, 2)]

    out = run_java(java_classes, "JavaShare", share_proxy.bootstrap, topic, proxied, "3", "60000")
    [err] = [x for x in out if "error" in x]
    assert err["error"] == "UnsupportedVersionException", err
    assert "does not support the share group protocol" in err["message"], err
    assert [x for x in out if "record" in x] == []
    # At once: the first poll, not after a session timeout.
    assert err["after_ms"] < 20000, err
    # It never joined: the broker knows the group it read directly, not this one.
    out = run_java(java_classes, "JavaAdmin", share_broker.bootstrap, f"sharegroup:{direct}",
                   f"sharegroup:{proxied}")
    assert out[0] == {"share_group": direct, "state": "EMPTY", "members": 0}, out
    assert out[1]["error"] == "GroupIdNotFoundException", out
