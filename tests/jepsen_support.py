"""The system under test of the network-fault runs (test_jepsen.py): a
3-node Kafka cluster, two antidote instances and the clients, each node in
a network namespace of its own (netns_support.Net), and what a run reads
back for the checker.

Nodes and addresses (127.42.0.N inside the test's namespaces; every node
has its own ports, so they are fixed):

  ctl 127.42.0.2    the test's own control host: admin requests, reading
                    logs and DLTs, the proxies' /metrics (never faulted)
  b1-b3 .11-.13     Kafka nodes 1-3 (broker+controller, :9092/:9093)
  p1, p2 .21-.22    antidote instances (:29092, brokers at :29101-29103,
                    admin :9644)
  c1, c2 .31-.32    client hosts: producers and group members

The cluster is `cluster_support.KafkaCluster` with each node a
`harness.KafkaBroker` started inside its namespace; its admin helpers
(leaders, reassignment, leader moves) run in `ctl`.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import cluster_support as cs
import harness as h
import jepsen_check as jc
import netns_support as ns
import poison_support as ps

NODES = {"ctl": 2, "b1": 11, "b2": 12, "b3": 13, "p1": 21, "p2": 22, "c1": 31, "c2": 32}
PROXIES = ("p1", "p2")
CLIENTS = ("c1", "c2")
BROKERS = ("b1", "b2", "b3")
BROKER_PORT, CONTROLLER_PORT = 9092, 9093
PROXY_BOOTSTRAP, PROXY_BASE, PROXY_ADMIN = 29092, 29100, 9644

# The timeouts the recovery bound is made of (test_jepsen.py checks that
# each group read everything, and no proxy held a partition, this long after
# the faults healed):
SESSION_TIMEOUT_S = 10         # a member cut off loses its partitions (both protocols)
CLIENT_METADATA_REFRESH_S = 5  # the members' metadata refresh (librdkafka, Java)
PROXY_METADATA_REFRESH_S = 30  # the proxies' upstream.metadata_refresh
DLT_TIMEOUT_S = 5              # the proxies' dead_letter.timeout
# What the timeouts leave out: the group's join and sync rounds after a
# session expired, reconnect backoffs (at most 1 s in every client), a few
# Fetch long polls (500 ms) and one DLT write retried after its timeout.
RECOVERY_MARGIN_S = 15


def recovery_bound_s() -> float:
    """Session timeout + metadata refresh + dead_letter.timeout + margin."""
    return (SESSION_TIMEOUT_S + max(CLIENT_METADATA_REFRESH_S, PROXY_METADATA_REFRESH_S)
            + DLT_TIMEOUT_S + RECOVERY_MARGIN_S)


# Over cluster_support's settings: group members cut off by a fault lose
# their partitions after 10 s (KIP-848 groups take the session timeout from
# the broker; the classic members ask for 10 s themselves).
GROUP_PROPERTIES = {
    "group.consumer.min.session.timeout.ms": 6000,
    "group.consumer.session.timeout.ms": SESSION_TIMEOUT_S * 1000,
    "group.consumer.heartbeat.interval.ms": 1000,
    "group.consumer.min.heartbeat.interval.ms": 1000,
}


# ---------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------

@dataclass
class NsBroker(h.KafkaBroker):
    """A Kafka node listening on its namespace's address (and on its
    namespace's own 127.0.0.1, where the harness checks it is up)."""
    host: str = ""

    @property
    def dir(self) -> Path:
        return self.workdir / f"kafka-node{self.node_id}"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def properties(self) -> str:
        out = []
        for line in super().properties().splitlines():
            if line.startswith("listeners="):
                line = (f"listeners=PLAINTEXT://0.0.0.0:{self.port},"
                        f"CONTROLLER://{self.host}:{self.controller_port}")
            elif line.startswith("advertised.listeners="):
                line = f"advertised.listeners=PLAINTEXT://{self.bootstrap}"
            out.append(line)
        return "\n".join(out) + "\n"


@dataclass
class NsCluster(cs.KafkaCluster):
    net: Optional[ns.Net] = None

    def __post_init__(self) -> None:
        voters = ",".join(f"{n}@{self.net.addr(f'b{n}')}:{CONTROLLER_PORT}" for n in cs.NODE_IDS)
        for n in cs.NODE_IDS:
            props = {"controller.quorum.voters": voters, **cs.CLUSTER_PROPERTIES,
                     **GROUP_PROPERTIES}
            self.brokers[n] = NsBroker(self.workdir, port=BROKER_PORT,
                                       controller_port=CONTROLLER_PORT, node_id=n,
                                       host=self.net.addr(f"b{n}"), extra_properties=props)

    def ctl(self, fn, *args, timeout: Optional[float] = None, **kw):
        """fn(*args) from the control host."""
        return self.net.run_in("ctl", fn, *args, timeout=timeout, **kw)

    def start(self, timeout: float = 120) -> "NsCluster":
        errors: list[BaseException] = []

        def go(n: int) -> None:
            try:
                self.net.run_in(f"b{n}", self.brokers[n].start, timeout=timeout + 10)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)

        threads = [threading.Thread(target=go, args=(n,)) for n in cs.NODE_IDS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 30)
        if errors:
            self.stop()
            raise errors[0]
        self.ctl(self.wait_brokers, set(cs.NODE_IDS), 60)
        return self


# ---------------------------------------------------------------------------
# The proxies
# ---------------------------------------------------------------------------

def write_policies(d: Path) -> Path:
    """jx.plain.* (ordering none) and jx.keyed.* (ordering per_key): the
    geofence JSON policy of the poison tests, judged at the door too."""
    d.mkdir(parents=True, exist_ok=True)
    text = "policies:\n"
    for name, glob, extra in (("jx-plain", "jx.plain.*", ""),
                              ("jx-keyed", "jx.keyed.*", "    ordering: per_key\n")):
        text += (f"  - name: {name}\n    topics: [\"{glob}\"]\n"
                 f"    value:\n      format: json\n      schema: {ps.JSON_SCHEMA}\n"
                 + ps.RULES + "    on_invalid: divert\n    on_produce: reject\n" + extra
                 + "    dead_letter:\n      topic: \"{topic}.dlt\"\n")
    path = d / "jepsen-policies.yaml"
    path.write_text(text)
    return path


def wait_tcp(host: str, port: int, timeout: float) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@dataclass
class NsProxy(ps.PolicyProxy):
    """An antidote instance in namespace `node`, with an admin listener.
    Its log is appended to across restarts."""
    net: Optional[ns.Net] = None
    node: str = ""

    @property
    def host(self) -> str:
        return self.net.addr(self.node)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.bootstrap_port}"

    def config_yaml(self) -> str:
        text = super().config_yaml().replace(h.HOST, self.host)
        assert "upstream:\n" in text
        text = text.replace("upstream:\n", f"upstream:\n  metadata_refresh: "
                                           f"{PROXY_METADATA_REFRESH_S}s\n", 1)
        return text + f"admin:\n  listen: {self.host}:{PROXY_ADMIN}\n"

    def start(self) -> "NsProxy":
        self.config_path.write_text(self.config_yaml())
        with open(self.log, "ab") as out:
            self.proc = self.net.popen(self.node, [str(h.ANTIDOTE_BIN), "run", "--config",
                                                   str(self.config_path)],
                                       stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL,
                                       env={"ANTIDOTE_LOG": "info", "RUST_BACKTRACE": "1",
                                            "PATH": "/usr/bin:/bin"})
        self.net.run_in(self.node, wait_tcp, self.host, self.bootstrap_port, 15)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def metrics(self) -> str:
        def get() -> str:
            url = f"http://{self.host}:{PROXY_ADMIN}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read().decode()
        return self.net.run_in("ctl", get, timeout=15)

    def held(self) -> float:
        return h.metric(self.metrics(), "antidote_held_partitions")


def start_proxy(net: ns.Net, workdir: Path, cluster: NsCluster, node: str,
                policy: Path) -> NsProxy:
    import conftest
    p = NsProxy(workdir, upstream=[b.bootstrap for b in cluster.brokers.values()],
                bootstrap_port=PROXY_BOOTSTRAP, port_base=PROXY_BASE, name=f"antidote-{node}",
                policies=[policy], net=net, node=node,
                dead_letter={"timeout": f"{DLT_TIMEOUT_S}s"})
    conftest._PROXIES.append(p)
    return p.start()


# ---------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------

JAVA_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d %p %c{1} %m%n
rootLogger.level = ERROR
rootLogger.appenderRef.err.ref = STDERR
"""


@dataclass
class Client:
    """One client process: its namespace, role, history file and process."""
    name: str
    node: str
    role: str          # "producer" | "member"
    group: str         # the group a member is in
    out: Path
    proc: Optional[subprocess.Popen] = None
    cmd: list = field(default_factory=list)
    stdout_is_history: bool = False
    killed: int = 0    # SIGKILLs by the schedule (their -9 is no crash)
    killed_proc: Optional[subprocess.Popen] = None  # the process the schedule killed last


@dataclass
class Workload:
    """The clients of one run: three producers (through p1's door, p2's
    door, and directly to the brokers) and four groups of two members, one
    member through each proxy: classic and KIP-848 `consumer`, each with
    librdkafka and with Java."""
    net: ns.Net
    dir: Path
    topics: list[str]
    proxies: dict[str, NsProxy]
    cluster: NsCluster
    java_classes: Optional[Path]
    seed: int
    clients: list[Client] = field(default_factory=list)

    @property
    def stop_file(self) -> Path:
        return self.dir / "stop-producers"

    @property
    def stop_members_file(self) -> Path:
        return self.dir / "stop-members"

    GROUPS = (("rdk-classic", "librdkafka", "classic"), ("rdk-848", "librdkafka", "consumer"),
              ("java-classic", "java", "classic"), ("java-848", "java", "consumer"))
    DOOR_PRODUCERS = ("door1", "door2")

    def _spawn(self, c: Client, cmd: list[str], stdout_is_history: bool = False) -> None:
        """Start `cmd` in c's namespace; stderr (and stdout, unless it is the
        history, as for the Java members) to c's log."""
        c.cmd, c.stdout_is_history = cmd, stdout_is_history
        self._launch(c)
        self.clients.append(c)

    def _launch(self, c: Client) -> None:
        with open(self.dir / f"{c.name}.stderr", "ab") as log:
            if c.stdout_is_history:
                # Each line stamped with the wall clock as it comes (the Java
                # member's assignment lines carry no time of their own).
                c.proc = self.net.popen(c.node, c.cmd, stdout=subprocess.PIPE, stderr=log,
                                        stdin=subprocess.DEVNULL)
                threading.Thread(target=_stamp, args=(c.proc.stdout, c.out), daemon=True,
                                 name=f"stamp-{c.name}").start()
            else:
                c.proc = self.net.popen(c.node, c.cmd, stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL)

    def kill_member(self, name: str) -> bool:
        """SIGKILL a member (a crash: its partitions stay with it until its
        session expires, then move to the group's other member). A member
        that is not running by then is an error: it crashed by itself; one
        the schedule killed already (two kill faults of one step picking the
        same member) stays killed (False)."""
        c = next(c for c in self.clients if c.name == name)
        if c.proc is not None and c.proc is c.killed_proc:
            return False
        if c.proc is None or c.proc.poll() is not None:
            raise h.HarnessError(f"member {name} had exited by itself (code "
                                 f"{c.proc and c.proc.returncode}) before its kill step")
        c.proc.kill()
        c.proc.wait(10)
        c.killed += 1
        c.killed_proc = c.proc
        return True

    def restart_member(self, name: str) -> None:
        """Start a killed member again; its history goes on in the same file."""
        c = next(c for c in self.clients if c.name == name)
        if c.proc is None or c.proc.poll() is not None:
            self._launch(c)

    def start_members(self) -> None:
        import sys
        topics = ",".join(self.topics)
        log_cfg = self.dir / "log4j2.properties"
        log_cfg.write_text(JAVA_LOG4J2)
        for g, (gname, kind, protocol) in enumerate(self.GROUPS):
            group = f"jx-{gname}-{self.seed}-{self.dir.name}"
            # One member through each proxy, their hosts crossed: c1 holds
            # p1's member of one group and p2's of the next.
            for i, proxy in enumerate(PROXIES):
                node = CLIENTS[(i + g) % 2]
                name = f"{gname}-{proxy}"
                c = Client(name, node, "member", gname, self.dir / f"{name}.jsonl")
                bootstrap = self.proxies[proxy].bootstrap
                if kind == "java":
                    cmd = ["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                           f"-Dlog4j2.configurationFile={log_cfg}",
                           "-cp", f"{h.kafka_classpath()}:{self.java_classes}", "JepsenMember",
                           bootstrap, topics, group, protocol, name, str(self.stop_members_file)]
                else:
                    cmd = [sys.executable, str(ns.HERE / "jepsen_worker.py"), "consume",
                           "--bootstrap", bootstrap, "--topics", topics, "--group", group,
                           "--protocol", protocol, "--member", name, "--out", str(c.out),
                           "--stop", str(self.stop_members_file)]
                self._spawn(c, cmd, stdout_is_history=kind == "java")

    def start_producers(self, rate: float) -> None:
        import sys
        direct = ",".join(b.bootstrap for b in self.cluster.brokers.values())
        for i, (tag, node, bootstrap, door) in enumerate((
                ("door1", "c1", self.proxies["p1"].bootstrap, True),
                ("door2", "c2", self.proxies["p2"].bootstrap, True),
                ("direct", "c2", direct, False))):
            c = Client(tag, node, "producer", "", self.dir / f"{tag}.jsonl")
            cmd = [sys.executable, str(ns.HERE / "jepsen_worker.py"), "produce",
                   "--bootstrap", bootstrap, "--topics", ",".join(self.topics), "--tag", tag,
                   "--seed", str(self.seed * 10 + i), "--rate", str(rate),
                   "--out", str(c.out), "--stop", str(self.stop_file)]
            self._spawn(c, cmd + (["--door"] if door else []))

    def stop(self, role: str, timeout: float) -> None:
        (self.stop_file if role == "producer" else self.stop_members_file).touch()
        deadline = time.monotonic() + timeout
        for c in self.clients:
            if c.role != role or c.proc is None:
                continue
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait(10)

    # --- histories -------------------------------------------------------------

    def outcomes(self) -> list[jc.Outcome]:
        """Every record each producer sent, with its outcome."""
        return [o for c in self.clients if c.role == "producer"
                for o in producer_outcomes(c.out, door=c.name in self.DOOR_PRODUCERS)]

    def deliveries(self) -> dict[str, list[jc.Delivery]]:
        """group -> its reads in time order, across its members (a partition
        handed from one member to the other is read on by the second after
        the first)."""
        out: dict[str, list] = {g: [] for g, _, _ in self.GROUPS}
        for c in self.clients:
            if c.role == "member":
                out[c.group] += member_history(c.out, c.name, java="java" in c.name)[0]
        return {g: sorted(ds, key=lambda d: d.ms) for g, ds in out.items()}

    def rebalances(self) -> dict[str, list[int]]:
        """member -> wall-clock millis of its assignment changes."""
        return {c.name: member_history(c.out, c.name, java="java" in c.name)[1]
                for c in self.clients if c.role == "member"}

    def group_nodes(self) -> dict[str, set[str]]:
        """group -> the client hosts and proxies its members use."""
        out: dict[str, set[str]] = {g: set() for g, _, _ in self.GROUPS}
        for c in self.clients:
            if c.role == "member":
                out[c.group] |= {c.node, c.name.rsplit("-", 1)[1]}
        return out

    def group_of(self) -> dict[str, str]:
        return {c.name: c.group for c in self.clients if c.role == "member"}

    def members(self) -> list[str]:
        return [c.name for c in self.clients if c.role == "member"]

    def per_member(self) -> dict[str, int]:
        """Records each member delivered (re-reads included)."""
        return {c.name: sum(1 for o in _lines(c.out) if "d" in o)
                for c in self.clients if c.role == "member"}

    def errors(self) -> dict[str, int]:
        n: dict[str, int] = {}
        for c in self.clients:
            n[c.name] = sum(1 for o in _lines(c.out) if "error" in o or "nack" in o)
        return n

    def logs(self) -> list[Path]:
        """Every client's stderr log (and the Java members' histories)."""
        return sorted(self.dir.glob("*.stderr")) + [c.out for c in self.clients]


def producer_outcomes(path: Path, door: bool) -> list[jc.Outcome]:
    """A producer's history (jepsen_worker.py): each record it sent, with
    "ack" and its position, its refusal's error name, or "timeout" when no
    answer came before the producer ended."""
    sent: dict[str, tuple[str, str]] = {}
    result: dict[str, tuple[str, int, int]] = {}
    for o in _lines(path):
        if "sent" in o:
            sent[o["sent"]] = (o["t"], o["k"])
        elif "ack" in o:
            sent.setdefault(o["ack"], (o["t"], o.get("k", "?")))
            result[o["ack"]] = ("ack", o["p"], o["o"])
        elif "nack" in o:
            sent.setdefault(o["nack"], (o["t"], o.get("k", "?")))
            result[o["nack"]] = (o["e"], -1, -1)
    return [jc.Outcome(rid, t, k, door, *result.get(rid, ("timeout", -1, -1)))
            for rid, (t, k) in sent.items()]


def member_history(path: Path, member: str, java: bool
                   ) -> tuple[list[jc.Delivery], list[int]]:
    """A member's reads and the millis of its assignment changes (assigned,
    revoked, lost). A Java member's values are base64 (its record id is read
    from them); its lines are stamped with "ms" as they are read
    (Workload._launch)."""
    from jepsen_worker import record_id
    ds, rebalances, last_ms = [], [], 0
    for o in _lines(path):
        if "d" in o:
            t, p, off, v, ms = o["d"]
            if java:
                v = record_id(None if v is None else base64.b64decode(v))
            ds.append(jc.Delivery(t, p, off, v, ms, member))
            last_ms = ms
        elif any(k in o for k in ("assigned", "revoked", "lost")):
            rebalances.append(int(o.get("ms", last_ms)))
    return ds, rebalances


def excuses(group_nodes: dict[str, set[str]], group_of: dict[str, str],
            rebalances: dict[str, list[int]], windows: list[dict]) -> dict[str, list[jc.Excuse]]:
    """group -> the windows in which it may read a record again: its
    members' rebalances, a kill of one of its members or proxies, and a
    fault on a link of one of its members' hosts or proxies (`windows`:
    jepsen_schedule.Player.windows)."""
    out: dict[str, list[jc.Excuse]] = {g: [] for g in group_nodes}
    for m, times in rebalances.items():
        out[group_of[m]] += [(t, t, f"rebalance of {m}") for t in times]
    for w in windows:
        for g, nodes in group_nodes.items():
            if w.get("member") and group_of.get(w["member"]) == g or nodes & set(w["nodes"]):
                out[g].append((w["from_ms"], w["to_ms"], w["what"]))
    return out


def build_history(rows: dict[str, list], topics: list[str], dlts: list[str], per_key: set[str],
                  produced: list[jc.Outcome], deliveries: dict[str, list[jc.Delivery]],
                  excuses_: dict[str, list[jc.Excuse]], bound_s: float) -> jc.History:
    """The checker's history from what the run read back: `rows` of each
    topic and DLT (read_topic)."""
    log = [r for t in topics for r in log_records(rows.get(t, []))]
    dlt = [r for t in dlts for r in dlt_records(rows.get(t, []))]
    return jc.History(log=log, produced=produced, deliveries=deliveries, dlt=dlt,
                      per_key_topics=per_key, excuses=excuses_, bound_s=bound_s)


def panics(paths: list[Path], offsets: Optional[dict[Path, int]] = None) -> list[str]:
    """Lines saying "panicked at" in the logs (from each file's offset in
    `offsets`, if given), with the file's name."""
    out = []
    for p in paths:
        if not p.exists():
            continue
        with open(p, "rb") as f:
            f.seek((offsets or {}).get(p, 0))
            for line in f.read().decode(errors="replace").splitlines():
                if "panicked at" in line:
                    out.append(f"{p.name}: {line.strip()[:300]}")
    return out


def _stamp(pipe, out: Path) -> None:
    """Copy a member's stdout to its history, `"ms"` added to each JSON line."""
    with open(out, "ab") as f:
        for line in iter(pipe.readline, b""):
            if line.startswith(b"{") and not line.startswith(b"{}"):
                line = b'{"ms": %d, ' % int(time.time() * 1000) + line[1:]
            f.write(line)
            f.flush()


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line cut by a kill
    return out


# ---------------------------------------------------------------------------
# Reading back (from ctl)
# ---------------------------------------------------------------------------

def read_topic(bootstrap: str, topic: str, timeout: float = 60) -> list:
    """Every record of every partition of `topic` up to its high watermark
    (librdkafka, assign, read_uncommitted); run in ctl."""
    import confluent_kafka as ck
    cons = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"jx-read-{time.time_ns()}",
                        "enable.auto.commit": False, "auto.offset.reset": "earliest",
                        "log_level": 0})
    try:
        md = cons.list_topics(topic, timeout=15)
        ends = {}
        for p in md.topics[topic].partitions:
            lo, hi = cons.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=15)
            if hi > lo:
                ends[p] = hi
        if not ends:
            return []
        cons.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in ends])
        got, pos = [], {p: -1 for p in ends}
        deadline = time.monotonic() + timeout
        while any(pos[p] + 1 < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise h.HarnessError(f"{topic}: read to {pos}, ends {ends}")
            m = cons.poll(0.5)
            if m is None or m.error():
                continue
            got.append(m)
            pos[m.partition()] = m.offset()
        return [(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                 tuple(m.headers() or ())) for m in got]
    finally:
        cons.close()


def log_records(rows) -> list[jc.LogRec]:
    out = []
    for topic, p, o, key, value, headers in rows:
        hd = {k: v for k, v in headers}
        rid = (hd.get("jx-id") or b"?").decode()
        kind = (hd.get("jx-kind") or b"?").decode()
        out.append(jc.LogRec(topic, p, o, key, rid, kind, value, tuple(headers)))
    return out


def dlt_frame(headers) -> tuple[tuple, dict]:
    """(the original record's headers, antidote's context headers) of a DLT
    record: format 2 ends in `x-antidote-context: 2 <n>` after n context
    headers, which follow the original headers (guarantees.md, "Its frame
    holds"); without that trailer, the headers named x-* are the context."""
    headers = tuple(headers)
    if headers and headers[-1][0] == "x-antidote-context":
        fmt, _, n = (headers[-1][1] or b"").decode().partition(" ")
        if fmt == "2" and n.isdigit() and int(n) + 1 <= len(headers):
            cut = len(headers) - 1 - int(n)
            return headers[:cut], {k: v for k, v in headers[cut:-1]}
    return (tuple((k, v) for k, v in headers if not k.startswith("x-")),
            {k: v for k, v in headers if k.startswith("x-")})


def dlt_records(rows) -> list[jc.DltRec]:
    out = []
    for _t, _p, _o, key, value, headers in rows:
        original, ctx = dlt_frame(headers)
        if "x-original-topic" not in ctx:
            continue  # lease and other markers
        rid = (dict(original).get("jx-id") or b"?").decode()
        out.append(jc.DltRec(ctx["x-original-topic"].decode(),
                             int(ctx["x-original-partition"]), int(ctx["x-original-offset"]),
                             ctx["x-error-class"].decode(),
                             (ctx.get("x-error-rule") or b"").decode(), key, value, original,
                             rid))
    return out


def produce_direct(bootstrap: str, topic: str, recs: list[tuple[str, int, str, str]]) -> None:
    """(tag, n, kind, key) records, in order, to partition 0, acks=all; run
    in a client namespace."""
    import confluent_kafka as ck
    from jepsen_worker import record
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                     "max.in.flight.requests.per.connection": 1, "log_level": 3})
    errors = []
    for tag, n, kind, key in recs:
        k, v, hs = record(tag, n, kind, key)
        p.produce(topic, value=v, key=k, headers=hs, partition=0,
                  on_delivery=lambda err, _m: err and errors.append(err))
        p.flush(30)
    assert not errors, errors


def read_from(bootstrap: str, topic: str, offset: int, seconds: float) -> list[tuple[int, str]]:
    """(offset, record id) of what partition 0 of `topic` delivers from
    `offset` within `seconds` (librdkafka, assign); run in a client namespace."""
    import confluent_kafka as ck
    from jepsen_worker import record_id
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"jx-assign-{time.time_ns()}",
                     "enable.auto.commit": False, "log_level": 0})
    try:
        c.assign([ck.TopicPartition(topic, 0, offset)])
        got, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append((m.offset(), record_id(m.value())))
        return got
    finally:
        c.close()
