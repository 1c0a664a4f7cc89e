"""Process, network and protocol helpers for antidote's integration tests.

Everything here talks to 127.0.0.1 only, and every wait loop is bounded by a
deadline. The pytest fixtures that use these helpers live in conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parent.parent
TANSU_BIN = Path(os.environ.get("TANSU_BIN", REPO / ".tools" / "bin" / "tansu"))
ANTIDOTE_BIN = Path(os.environ.get("ANTIDOTE_BIN", REPO / "target" / "debug" / "antidote"))
HOST = "127.0.0.1"
TANSU_NODE_ID = 111  # tansu always reports itself as node 111
# The suite's broker: Apache Kafka (fetched by scripts/setup.sh) unless
# ANTIDOTE_TEST_BROKER=tansu. Tests that need the broker's node id (the proxy
# serves node N at port_base + N) use BROKER_NODE_ID.
TEST_BROKER = os.environ.get("ANTIDOTE_TEST_BROKER", "kafka")
if TEST_BROKER not in ("kafka", "tansu"):
    raise ValueError(f"ANTIDOTE_TEST_BROKER={TEST_BROKER!r}: use kafka or tansu")
KAFKA_NODE_ID = 1
BROKER_NODE_ID = TANSU_NODE_ID if TEST_BROKER == "tansu" else KAFKA_NODE_ID
# Apache Kafka's version: $ANTIDOTE_KAFKA_VERSION, or scripts/kafka/pom.xml's
# default; scripts/setup.sh installs each version in .tools/kafka-VERSION.
# KAFKA_HOME, if set, wins.
KAFKA_DEFAULT_VERSION = re.search(r"<kafka.version>([^<]+)</kafka.version>",
                                  (REPO / "scripts" / "kafka" / "pom.xml").read_text()).group(1)
KAFKA_VERSION = os.environ.get("ANTIDOTE_KAFKA_VERSION") or KAFKA_DEFAULT_VERSION
KAFKA_HOME = Path(os.environ.get("KAFKA_HOME", REPO / ".tools" / f"kafka-{KAFKA_VERSION}"))


# Marks a test that shows what only Apache Kafka does (aborted-transaction
# lists, ...): it runs in every default run and is left out only under
# ANTIDOTE_TEST_BROKER=tansu, whose broker cannot show it.
needs_kafka = pytest.mark.skipif(TEST_BROKER == "tansu",
                                 reason="needs Apache Kafka (ANTIDOTE_TEST_BROKER=tansu)")


class HarnessError(AssertionError):
    """A helper process did not behave; the message carries its log."""


# ---------------------------------------------------------------------------
# Ports and processes
# ---------------------------------------------------------------------------

# Ports are picked here and bound later by another process, so two picks must
# never coincide, across the xdist workers of one run too: every pick is
# claimed by creating a file named after it in a directory the run's workers
# share (named after the run's id, which conftest.py sets in the controller
# and xdist passes to the workers; the controller removes it at the end).
# Picks come from below the kernel's ephemeral range, so no outgoing
# connection's local port can take one between the pick and the bind.
def port_claims_dir() -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / (
        "antidote-test-ports-" + os.environ.get("PYTEST_XDIST_TESTRUNUID", f"pid{os.getpid()}"))


def _port_range() -> tuple[int, int]:
    """Where to pick ports: below the ephemeral range, or above it if it
    starts too low to leave room."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    if lo > 12000:
        return 10000, lo - 1
    return hi + 1, 65535


def _claim(port: int) -> bool:
    """Claim `port` for this run; False if some worker already did."""
    claims = port_claims_dir()
    claims.mkdir(exist_ok=True)
    try:
        os.close(os.open(claims / str(port), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def free_port(tries: int = 500) -> int:
    """A TCP port on loopback that nothing listens on right now and that no
    other pick of this run has returned."""
    import random
    lo, hi = _port_range()
    for _ in range(tries):
        port = random.randrange(lo, hi)
        if port_is_free(port) and _claim(port):
            return port
    raise HarnessError("no free port found")


def free_port_base(node_id: int = BROKER_NODE_ID, tries: int = 500) -> int:
    """A base such that base + node_id is free (the proxy's per-broker port)."""
    import random
    lo, hi = _port_range()
    for _ in range(tries):
        base = random.randrange(lo, hi - node_id)
        if port_is_free(base + node_id) and _claim(base + node_id):
            return base
    raise HarnessError("no free port base found")


def wait_for_port(port: int, timeout: float, proc: Optional[subprocess.Popen] = None,
                  log: Optional[Path] = None, what: str = "process") -> None:
    """Wait until 127.0.0.1:port accepts a TCP connection.

    Fails early, with the log, if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise HarnessError(f"{what} exited with code {proc.returncode} before listening on "
                               f"{port}\n{read_log(log)}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise HarnessError(f"{what} did not listen on {port} within {timeout}s\n{read_log(log)}")


def read_log(log: Optional[Path], limit: int = 20000) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace")
    if len(text) > limit:
        text = "...[cut]...\n" + text[-limit:]
    return f"--- {log} ---\n{text}"


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> Optional[int]:
    """SIGTERM, then SIGKILL after `timeout`. Returns the exit code seen after SIGTERM,
    or None if it had to be killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
        return None


# ---------------------------------------------------------------------------
# tansu
# ---------------------------------------------------------------------------

@dataclass
class Tansu:
    """A tansu broker with in-memory storage on loopback.

    `advertised_port` lets a TLS terminator sit in front: tansu listens on
    `port` (plaintext) and tells clients to use `advertised_port`."""
    workdir: Path
    port: int = field(default_factory=free_port)
    advertised_port: Optional[int] = None
    proc: Optional[subprocess.Popen] = None
    node_id: int = TANSU_NODE_ID

    @property
    def log(self) -> Path:
        return self.workdir / f"tansu-{self.port}.log"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.advertised_port or self.port}"

    def start(self) -> "Tansu":
        if not TANSU_BIN.exists():
            raise HarnessError(f"tansu not found at {TANSU_BIN}: run scripts/setup.sh")
        adv = self.advertised_port or self.port
        cmd = [str(TANSU_BIN), "broker",
               "--listener-url", f"tcp://{HOST}:{self.port}",
               "--advertised-listener-url", f"tcp://{HOST}:{adv}",
               "--storage-engine", "memory://tansu/"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        wait_for_port(self.port, 15, self.proc, self.log, "tansu")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


# ---------------------------------------------------------------------------
# Apache Kafka
# ---------------------------------------------------------------------------

KAFKA_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = STDOUT
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = INFO
"""

# One combined broker+controller on loopback, tuned to start fast and to be
# small: internal topics with one replica and one partition, no initial
# rebalance delay, a 2 MiB cleaner buffer (default 128 MiB of heap), two
# threads each. Tests write records stamped in 2023: with the default
# log.roll.ms (7 days, counted from a segment's first timestamp) every batch
# would roll a segment of its own (and a Fetch returns one segment), and
# time retention would delete them, so neither applies by default here
# (topics that test retention set their own). The controller quorum is static (controller.quorum.voters),
# so a formatted directory names no port and can be copied: every broker of
# a worker starts from one template formatted once (StorageTool costs ~2.5 s).
KAFKA_PROPERTIES = """\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={node_id}@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{advertised_port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={log_dir}
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=2097152
log.cleaner.threads=1
num.network.threads=2
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
num.replica.fetchers=1
log.flush.offset.checkpoint.interval.ms=60000
log.retention.ms=-1
log.roll.ms=9223372036854775807
"""

KAFKA_JVM = ["-Xms256m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-XX:-UsePerfData", "-Djava.awt.headless=true"]
KAFKA_CLUSTER_ID = "AntidoteTestCluster00w"  # 22 chars of base64url: a valid cluster id
# AppCDS: an archive of the classes a broker loads until it has started,
# dumped once by scripts/setup.sh (`python tests/harness.py --build-kafka-cds`).
# It halves a start here (2.0 s instead of 3.5-4.2 s). A stale or missing
# archive is harmless: the JVM then loads classes as usual.
KAFKA_CDS = KAFKA_HOME / "kafka.jsa"


def kafka_jvm() -> list[str]:
    if KAFKA_CDS.exists():
        return [*KAFKA_JVM, f"-XX:SharedArchiveFile={KAFKA_CDS}", "-Xlog:cds=off",
                "-Xlog:class+path=off"]
    return list(KAFKA_JVM)

_kafka_templates: dict[int, Path] = {}


def kafka_classpath() -> str:
    lib = KAFKA_HOME / "lib"
    if not lib.is_dir():
        raise HarnessError(f"Kafka not found at {lib}: run scripts/setup.sh")
    return str(lib / "*")


def kafka_version() -> str:
    return KAFKA_HOME.resolve().name.removeprefix("kafka-")


def _kafka_template(workdir: Path, node_id: int) -> Path:
    """A log dir formatted once (per process and node id) for copying."""
    if node_id in _kafka_templates:
        return _kafka_templates[node_id]
    base = workdir / f"kafka-template-{node_id}-{os.getpid()}"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    props = base / "format.properties"
    props.write_text(KAFKA_PROPERTIES.format(node_id=node_id, controller_port=1, port=2,
                                             advertised_port=2, log_dir=base / "data"))
    (base / "log4j2.properties").write_text(KAFKA_LOG4J2)
    out = subprocess.run(
        ["java", *KAFKA_JVM, f"-Dlog4j2.configurationFile={base / 'log4j2.properties'}",
         "-cp", kafka_classpath(), "kafka.tools.StorageTool", "format",
         "-t", KAFKA_CLUSTER_ID, "-c", str(props)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if out.returncode != 0:
        raise HarnessError(f"kafka-storage format failed ({out.returncode}):\n"
                           f"{out.stdout.decode(errors='replace')[-5000:]}")
    _kafka_templates[node_id] = base / "data"
    return base / "data"


@dataclass
class KafkaBroker:
    """An Apache Kafka broker (KRaft, combined broker and controller) on
    loopback, from the jars scripts/setup.sh fetched.

    Same surface as `Tansu`: `port`, `advertised_port` (a relay may sit in
    front: Kafka then advertises that port), `bootstrap`, `start`, `stop`.
    Unlike tansu it keeps its data on disk: `start` after `stop` comes back
    with every topic and record (pass `fresh=True` to start empty)."""
    workdir: Path
    port: int = field(default_factory=free_port)
    advertised_port: Optional[int] = None
    controller_port: int = field(default_factory=free_port)
    node_id: int = KAFKA_NODE_ID
    extra_properties: dict = field(default_factory=dict)
    proc: Optional[subprocess.Popen] = None
    started_in: float = 0.0  # seconds from launch to "Kafka Server started"
    jvm: Optional[list[str]] = None  # JVM options instead of kafka_jvm()

    @property
    def dir(self) -> Path:
        return self.workdir / f"kafka-{self.port}"

    @property
    def log(self) -> Path:
        return self.dir / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.advertised_port or self.port}"

    def properties(self) -> str:
        text = KAFKA_PROPERTIES.format(node_id=self.node_id, controller_port=self.controller_port,
                                       port=self.port,
                                       advertised_port=self.advertised_port or self.port,
                                       log_dir=self.dir / "data")
        return text + "".join(f"{k}={v}\n" for k, v in self.extra_properties.items())

    def log4j2(self) -> str:
        """The broker's log4j2 configuration (a subclass may log more)."""
        return KAFKA_LOG4J2

    def start(self, fresh: bool = False, timeout: float = 90) -> "KafkaBroker":
        data = self.dir / "data"
        if fresh and data.exists():
            shutil.rmtree(data)
        if not data.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            shutil.copytree(_kafka_template(self.workdir, self.node_id), data)
        (self.dir / "server.properties").write_text(self.properties())
        (self.dir / "log4j2.properties").write_text(self.log4j2())
        cmd = ["java", *(self.jvm or kafka_jvm()),
               f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
               "-cp", kafka_classpath(), "kafka.Kafka", str(self.dir / "server.properties")]
        t0 = time.monotonic()
        with open(self.log, "ab") as out:
            start_at = out.tell()
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.dir)
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise HarnessError(f"kafka exited with {self.proc.returncode} before it started"
                                   f"\n{read_log(self.log)}")
            with open(self.log, "rb") as f:
                f.seek(start_at)
                if b"Kafka Server started" in f.read():
                    break
            if time.monotonic() > deadline:
                stop_process(self.proc, 10)
                raise HarnessError(f"kafka did not start within {timeout}s\n{read_log(self.log)}")
            time.sleep(0.05)
        self.started_in = time.monotonic() - t0
        wait_for_port(self.port, 10, self.proc, self.log, "kafka")
        return self

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)


def ensure_transaction_coordinator(bootstrap: str, timeout: float = 30) -> None:
    """Make the broker load a transaction coordinator, as any cluster that has
    seen a transactional producer has: one librdkafka transactional producer
    runs init_transactions(). Kafka creates `__transaction_state` only on
    the first FindCoordinator(TRANSACTION); the proxy's DLT lease sends
    InitProducerId without one, and on a fresh Kafka it is answered
    NOT_COORDINATOR (16) and the proxy writes without fencing."""
    import uuid
    import confluent_kafka as ck
    p = ck.Producer({"bootstrap.servers": bootstrap,
                     "transactional.id": f"coordinator-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(timeout)


def new_broker(workdir: Path, **kw):
    """The suite's broker (Kafka, or tansu under ANTIDOTE_TEST_BROKER=tansu), not started."""
    return (Tansu if TEST_BROKER == "tansu" else KafkaBroker)(workdir, **kw)


# ---------------------------------------------------------------------------
# antidote
# ---------------------------------------------------------------------------

@dataclass
class Antidote:
    """The proxy under test, run from ANTIDOTE_BIN with a generated config."""
    workdir: Path
    upstream: list[str]
    listen_tls: Optional[dict] = None      # {cert, key, client_ca?}
    upstream_tls: Optional[dict] = None    # {ca, cert?, key?}
    bootstrap_port: int = field(default_factory=free_port)
    port_base: Optional[int] = None  # claimed so that port_base + node_id is free
    proc: Optional[subprocess.Popen] = None
    name: str = "antidote"
    node_id: int = BROKER_NODE_ID    # the upstream broker's node id (tansu: 111)

    def __post_init__(self) -> None:
        if self.port_base is None:
            self.port_base = free_port_base(self.node_id)

    @property
    def config_path(self) -> Path:
        return self.workdir / f"{self.name}-{self.bootstrap_port}.yaml"

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}-{self.bootstrap_port}.stderr.log"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.bootstrap_port}"

    def broker_port(self, node_id: Optional[int] = None) -> int:
        return self.port_base + (self.node_id if node_id is None else node_id)

    def config_yaml(self) -> str:
        # Written by hand (no PyYAML dependency); all values are plain scalars.
        lines = ["listen:",
                 f"  bootstrap: {HOST}:{self.bootstrap_port}",
                 f"  advertised_host: {HOST}",
                 f"  broker_port_base: {self.port_base}"]
        if self.listen_tls:
            lines.append("  tls:")
            lines += [f"    {k}: {v}" for k, v in self.listen_tls.items()]
        lines += ["upstream:", "  bootstrap_servers:"]
        lines += [f"    - {u}" for u in self.upstream]
        if self.upstream_tls:
            lines.append("  tls:")
            lines += [f"    {k}: {v}" for k, v in self.upstream_tls.items()]
        lines.append("policies: []")
        return "\n".join(lines) + "\n"

    def start(self) -> "Antidote":
        self.config_path.write_text(self.config_yaml())
        if not ANTIDOTE_BIN.exists():
            raise HarnessError(f"antidote binary not found at {ANTIDOTE_BIN}: run cargo build "
                               "or set ANTIDOTE_BIN")
        env = dict(os.environ)
        env.setdefault("ANTIDOTE_LOG", "info")  # the variable the binary reads
        env.setdefault("RUST_BACKTRACE", "1")
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [str(ANTIDOTE_BIN), "run", "--config", str(self.config_path)],
                stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        wait_for_port(self.bootstrap_port, 15, self.proc, self.log,
                      f"antidote ({self.config_path.name})")
        self.wait_first_metadata()
        return self

    # The first upstream metadata request's outcome, as the proxy logs it. Only
    # after it are the per-broker ports listening: a test that connects to
    # broker_port() without going through the bootstrap first must wait for it.
    FIRST_METADATA = ("upstream metadata fetched", "fetching upstream metadata failed")

    def wait_first_metadata(self, timeout: float = 10.0) -> None:
        """Wait until the proxy logs the outcome of its first upstream metadata
        request; go on after `timeout` (a test of an unreachable upstream then
        sees the proxy as it is)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            if any(line in text for line in self.FIRST_METADATA):
                return
            time.sleep(0.02)

    def assert_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise HarnessError(f"antidote is not running (exit {self.proc and self.proc.returncode})"
                               f"\n{read_log(self.log)}")

    # What a debug build logs when it rebuilt a records section whose
    # batches are out of offset order (src/intercept/fetch/patch.rs ORDER_BUG).
    ORDER_BUG = "BUG: rebuilt records section out of offset order"

    def stop_and_check(self, timeout: float = 5.0) -> None:
        """SIGTERM; the proxy must exit 0 within `timeout`, and its log must
        not show a records section it sent out of offset order."""
        if self.proc is None:
            return
        already = self.proc.poll()
        code = stop_process(self.proc, timeout)
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        if self.ORDER_BUG in text:
            bugs = [line for line in text.splitlines() if self.ORDER_BUG in line]
            raise HarnessError(f"antidote sent records out of order:\n" + "\n".join(bugs[:5]))
        if already is not None:
            raise HarnessError(f"antidote had already exited with {already}\n{read_log(self.log)}")
        if code != 0:
            raise HarnessError(f"antidote exited with {code} after SIGTERM (None = killed after "
                               f"{timeout}s)\n{read_log(self.log)}")


# ---------------------------------------------------------------------------
# TLS: certificates and a terminator for tansu
# ---------------------------------------------------------------------------

@dataclass
class Certs:
    dir: Path

    @property
    def ca(self) -> Path: return self.dir / "ca.pem"
    @property
    def server_cert(self) -> Path: return self.dir / "server.pem"
    @property
    def server_key(self) -> Path: return self.dir / "server.key"
    @property
    def client_cert(self) -> Path: return self.dir / "client.pem"
    @property
    def client_key(self) -> Path: return self.dir / "client.key"


def make_certs(d: Path) -> Certs:
    """A self-signed CA, a server cert for 127.0.0.1/localhost and a client cert,
    all made with the openssl CLI."""
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=antidote-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n")
    for who, cn in (("server", "localhost"), ("client", "antidote-test-client")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
            "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{who}.pem", "-days", "2", "-extfile", f"{who}.ext")
    return Certs(d)


# ---------------------------------------------------------------------------
# Which TCP peers a process is connected to
# ---------------------------------------------------------------------------

TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
              "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
              "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def _decode_addr(hexaddr: str) -> tuple[str, int]:
    ip_hex, port_hex = hexaddr.split(":")
    if len(ip_hex) == 8:  # IPv4, little-endian u32
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(ip_hex, 16)))
    else:                 # IPv6, four little-endian u32 words
        words = [struct.pack("<I", int(ip_hex[i:i + 8], 16)) for i in range(0, 32, 8)]
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(words))
    return ip, int(port_hex, 16)


@dataclass(frozen=True)
class TcpConn:
    local: tuple[str, int]
    remote: tuple[str, int]
    state: str


def tcp_connections(pid: int) -> set[TcpConn]:
    """TCP sockets owned by process `pid` (all its threads share the fd table).

    /proc/PID/net/tcp lists every socket of the network namespace, so rows are
    kept only if their inode is one of the process's socket fds."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # fd closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    conns = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[9] in inodes:
                conns.add(TcpConn(_decode_addr(cols[1]), _decode_addr(cols[2]),
                                  TCP_STATES.get(cols[3], cols[3])))
    return conns


class ConnectionWatcher:
    """Samples a process's TCP peers every `interval` s in a thread until stopped,
    so that short-lived connections are caught too, not only the final ones."""

    def __init__(self, pid: int, interval: float = 0.02):
        self.pid, self.interval = pid, interval
        self.remote_ports: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for c in tcp_connections(self.pid):
                    if c.state != "LISTEN":
                        self.remote_ports.add(c.remote[1])
            except (FileNotFoundError, ProcessLookupError):
                return  # process gone
            self._stop.wait(self.interval)

    def __enter__(self) -> "ConnectionWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


# ---------------------------------------------------------------------------
# Raw Kafka protocol (just enough for hand-built requests)
# ---------------------------------------------------------------------------

def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` in a /metrics page whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def kstr(s: Optional[str]) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def request_frame(api_key: int, version: int, correlation_id: int, body: bytes,
                  client_id: str = "antidote-raw-test") -> bytes:
    """Size-prefixed request with a v1 (non-flexible) request header."""
    header = struct.pack(">hhi", api_key, version, correlation_id) + kstr(client_id)
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def roundtrip(sock: socket.socket, api_key: int, version: int, correlation_id: int,
              body: bytes) -> bytes:
    """Send one request; return the response after its 4-byte correlation id
    (response header v0: callers must only use non-flexible versions)."""
    sock.sendall(request_frame(api_key, version, correlation_id, body))
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    resp = recv_exact(sock, size)
    got = struct.unpack(">i", resp[:4])[0]
    assert got == correlation_id, f"correlation id {got} != {correlation_id}"
    return resp[4:]


def api_versions(sock: socket.socket) -> dict[int, tuple[int, int]]:
    """ApiVersions v0: {api_key: (min, max)}."""
    body = roundtrip(sock, 18, 0, 1, b"")
    err, n = struct.unpack(">hi", body[:6])
    assert err == 0, f"ApiVersions error {err}"
    out = {}
    for i in range(n):
        k, lo, hi = struct.unpack(">hhh", body[6 + 6 * i:12 + 6 * i])
        out[k] = (lo, hi)
    return out


def fetch_v11_body(topic: str, partition: int, offset: int, isolation_level: int = 0,
                   max_bytes: int = 1 << 20) -> bytes:
    """A Fetch v11 request body for one partition, without a fetch session."""
    return (struct.pack(">iiiib", -1, 500, 1, max_bytes, isolation_level)  # replica, wait, min, max, iso
            + struct.pack(">ii", 0, -1)                                    # session id, epoch (none)
            + struct.pack(">i", 1) + kstr(topic)
            + struct.pack(">i", 1)
            + struct.pack(">iiqqi", partition, -1, offset, -1, max_bytes)  # leader epoch, log start
            + struct.pack(">i", 0)                                         # forgotten topics
            + kstr(""))                                                    # rack id


@dataclass
class FetchPartition:
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: Optional[list[tuple[int, int]]]
    preferred_read_replica: int
    records: Optional[bytes]


def parse_fetch_v11(body: bytes) -> tuple[int, dict[str, list[FetchPartition]]]:
    """Parse a Fetch v11 response body (after the correlation id)."""
    pos = 0

    def take(fmt: str):
        nonlocal pos
        vals = struct.unpack_from(fmt, body, pos)
        pos += struct.calcsize(fmt)
        return vals if len(vals) > 1 else vals[0]

    def string() -> str:
        nonlocal pos
        n = take(">h")
        s = body[pos:pos + n].decode()
        pos += n
        return s

    _throttle, error, _session = take(">ihi")
    topics: dict[str, list[FetchPartition]] = {}
    for _ in range(take(">i")):
        name = string()
        parts = []
        for _ in range(take(">i")):
            p, err, hw, lso, lstart = take(">ihqqq")
            n_aborted = take(">i")
            aborted = None if n_aborted < 0 else [take(">qq") for _ in range(n_aborted)]
            replica = take(">i")
            n = take(">i")
            records = None if n < 0 else body[pos:pos + n]
            pos += max(n, 0)
            parts.append(FetchPartition(p, err, hw, lso, lstart, aborted, replica, records))
        topics[name] = parts
    assert pos == len(body), f"{len(body) - pos} trailing bytes in Fetch response"
    return error, topics


def wait_transactions_settled(port: int, topic: str, partition: int = 0,
                              timeout: float = 20) -> None:
    """Until the partition has no open transaction: its last stable offset
    equals its high watermark. On Kafka a producer's commit or abort returns
    once the coordinator has decided; the markers are written to the
    partitions after that, so a Fetch right away may not hold them yet."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.create_connection((HOST, port), timeout=10) as s:
            s.settimeout(10)
            body = roundtrip(s, 1, 11, 1, fetch_v11_body(topic, partition, 0, isolation_level=1,
                                                         max_bytes=1))
        _err, topics = parse_fetch_v11(body)
        p = topics[topic][0]
        if p.error_code == 0 and p.last_stable_offset == p.high_watermark:
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"{topic}-{partition}: last stable offset {p.last_stable_offset} "
                               f"< high watermark {p.high_watermark} after {timeout}s")
        time.sleep(0.05)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Zigzag varint (Kafka record fields): returns (value, new position)."""
    shift = raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos


@dataclass
class RawRecord:
    offset: int
    timestamp: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: list[tuple[str, Optional[bytes]]]


def decode_uncompressed_batches(records: bytes) -> list[RawRecord]:
    """Decode magic-2 batches of a records section (codec none only).

    A trailing partial batch is ignored, as clients do."""
    out, pos = [], 0
    while pos + 12 <= len(records):
        base_offset, batch_len = struct.unpack_from(">qi", records, pos)
        end = pos + 12 + batch_len
        if end > len(records):
            break
        magic = records[pos + 16]
        assert magic == 2, f"magic {magic}"
        attrs, _lod, base_ts, _max_ts = struct.unpack_from(">hiqq", records, pos + 21)
        assert attrs & 0x07 == 0, "compressed batch: use a client to decode it"
        count = struct.unpack_from(">i", records, pos + 57)[0]
        rp = pos + 61
        for _ in range(count):
            _length, rp = _varint(records, rp)
            rp += 1  # attributes
            ts_delta, rp = _varint(records, rp)
            off_delta, rp = _varint(records, rp)
            fields = []
            for _f in range(2):
                n, rp = _varint(records, rp)
                fields.append(None if n < 0 else records[rp:rp + n])
                rp += max(n, 0)
            headers = []
            nh, rp = _varint(records, rp)
            for _h in range(nh):
                n, rp = _varint(records, rp)
                hk = records[rp:rp + n].decode()
                rp += n
                n, rp = _varint(records, rp)
                hv = None if n < 0 else records[rp:rp + n]
                rp += max(n, 0)
                headers.append((hk, hv))
            out.append(RawRecord(base_offset + off_delta, base_ts + ts_delta, fields[0],
                                 fields[1], headers))
        pos = end
    return out


def build_kafka_cds() -> None:
    """Start and stop one broker with -XX:ArchiveClassesAtExit (scripts/setup.sh)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        tmp = KAFKA_CDS.with_suffix(".jsa.tmp")
        b = KafkaBroker(Path(d), jvm=[*KAFKA_JVM, f"-XX:ArchiveClassesAtExit={tmp}"])
        try:
            b.start()
        finally:
            b.stop()
            shutil.rmtree(port_claims_dir(), ignore_errors=True)
        if not tmp.exists():
            raise HarnessError(f"no CDS archive written\n{read_log(b.log)}")
        tmp.replace(KAFKA_CDS)


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--build-kafka-cds"]:
        build_kafka_cds()
    else:
        sys.exit("usage: harness.py --build-kafka-cds")


class Lines:
    """A process whose stdout lines (JSON objects) are collected by a thread."""

    def __init__(self, cmd: list[str], log: Path, stdin=subprocess.DEVNULL):
        self.log = log
        self.err = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, stdin=stdin,
                                     text=True)
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                with self.lock:
                    self.events.append(e)

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.events)

    def wait(self, until, timeout: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = self.snapshot()
            if until(ev):
                return ev
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"{what}: not reached within {timeout}s (exit {self.proc.poll()})\n"
                             f"last events: {self.snapshot()[-5:]}\n{read_log(self.log, 6000)}")

    def stop(self, timeout: float = 60, grace: float = 0) -> list[dict]:
        """SIGTERM (after `grace` seconds for the process to end by itself),
        then SIGKILL after `timeout`."""
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        self.err.close()
        return self.snapshot()
