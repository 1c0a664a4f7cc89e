"""Connection limits: `limits.max_connections` and `limits.idle_timeout`.

Over the cap, a new client connection is accepted and closed at once while
the connections already served (a real librdkafka consumer among them) keep
working; a connection with no request for `idle_timeout` is closed, but never
while an answer is pending (a long-polling Fetch)."""

from __future__ import annotations

import os
import socket
import struct
import time
import urllib.request
from dataclasses import dataclass, field

import confluent_kafka as ck
import pytest

import clients as c
import harness as h
from conftest import _PROXIES
from test_robustness import closed_by_peer


@dataclass
class LimitedProxy(h.Antidote):
    limits: str = ""          # YAML lines under `limits:`
    admin_port: int = field(default_factory=h.free_port)

    def config_yaml(self) -> str:
        return (h.Antidote.config_yaml(self) + "limits:\n" + self.limits
                + f"admin:\n  listen: {h.HOST}:{self.admin_port}\n")

    def metrics(self) -> str:
        url = f"http://{h.HOST}:{self.admin_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()


def start_limited(workdir, broker, name: str, limits: str) -> LimitedProxy:
    p = LimitedProxy(workdir, upstream=[broker.bootstrap], name=name, limits=limits)
    _PROXIES.append(p)
    return p.start()


def settled_open_connections(p: LimitedProxy, still: float = 1.0, timeout: float = 15) -> int:
    """Client connections open on all listeners, once unchanged for `still` seconds."""
    def count() -> int:
        return sum(int(float(line.rsplit(" ", 1)[1])) for line in p.metrics().splitlines()
                   if line.startswith("antidote_connections_open{"))
    deadline = time.monotonic() + timeout
    last, since = count(), time.monotonic()
    while time.monotonic() - since < still:
        assert time.monotonic() < deadline, "the proxy's open connections never settled"
        time.sleep(0.1)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
    return last


def api_versions_on(s: socket.socket) -> bool:
    try:
        return 0 in h.api_versions(s)
    except (ConnectionError, OSError, AssertionError):
        return False


def fetch_body(topic: str, max_wait_ms: int) -> bytes:
    """Fetch v11 for partition 0 from offset 0, waiting up to `max_wait_ms`."""
    body = h.fetch_v11_body(topic, 0, 0)
    return body[:4] + struct.pack(">i", max_wait_ms) + body[8:]


def fetch_partition_error(body: bytes) -> int:
    """The error code of the one partition of a Fetch v11 response body."""
    at = 4 + 2 + 4 + 4  # throttle, error, session id, topic count
    (name_len,) = struct.unpack_from(">h", body, at)
    at += 2 + name_len + 4  # topic name, partition count
    (error,) = struct.unpack_from(">h", body, at + 4)  # after partition_index
    return error


@pytest.fixture
def capped(workdir, broker):
    p = start_limited(workdir, broker, "antidote-capped", "  max_connections: 5\n")
    yield p
    p.stop_and_check()


def test_over_max_connections_new_ones_are_closed_and_existing_ones_keep_working(
        capped, broker, broker_endpoint, new_topic):
    topic = new_topic(1)
    first = c.sample_records(5, tag="before")
    c.ck_produce(broker_endpoint, topic, first)
    consumer = ck.Consumer(c.Endpoint(capped.bootstrap, "proxy").ck(
        **{"group.id": "edge-cap", "enable.auto.commit": False}))
    socks: list[socket.socket] = []
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        got = c._ck_poll(consumer, 5, 30)
        assert [r.value for r in got] == [r.value for r in first]
        # committed() goes to the group coordinator, so the consumer has opened
        # every connection it will use (librdkafka's coordinator connection is
        # its own, and may come after the first records). Wait for its set to
        # settle, so none of its connections is refused below.
        consumer.committed([ck.TopicPartition(topic, 0)], timeout=30)
        held = settled_open_connections(capped)
        assert 1 <= held <= 4, f"the consumer holds {held} connections"
        # Fill the remaining places with raw connections until one is refused.
        refused = None
        for _ in range(6):
            s = socket.create_connection((h.HOST, capped.bootstrap_port), timeout=5)
            s.settimeout(5)
            if api_versions_on(s):
                socks.append(s)
            else:
                refused = s
                break
        assert refused is not None, "no connection was refused over the cap"
        assert closed_by_peer(refused, 2)
        refused.close()
        assert len(socks) == 5 - held, f"{len(socks)} raw connections served next to {held}"
        # Everyone already connected keeps working.
        assert all(api_versions_on(s) for s in socks)
        more = c.sample_records(5, tag="after")
        c.ck_produce(broker_endpoint, topic, more)
        got = c._ck_poll(consumer, 5, 30)
        assert [r.value for r in got] == [r.value for r in more]
        # A freed place is served again.
        socks.pop().close()
        time.sleep(0.3)
        with socket.create_connection((h.HOST, capped.bootstrap_port), timeout=5) as s:
            s.settimeout(5)
            assert api_versions_on(s)
    finally:
        consumer.close()
        for s in socks:
            s.close()
    log = h.read_log(capped.log)
    assert log.count("connection limit reached") == 1, "refusals must be logged once per interval"
    assert "antidote_connections_refused_total 1\n" in capped.metrics()


@pytest.fixture
def idle_proxy(workdir, broker):
    p = start_limited(workdir, broker, "antidote-idle", "  idle_timeout: 2s\n")
    yield p
    p.stop_and_check()


def test_an_idle_connection_is_closed_after_idle_timeout(idle_proxy):
    with socket.create_connection((h.HOST, idle_proxy.bootstrap_port), timeout=5) as s:
        s.settimeout(5)
        assert api_versions_on(s)
        t0 = time.monotonic()
        assert closed_by_peer(s, 6), "idle connection was not closed"
        waited = time.monotonic() - t0
        assert 1.5 <= waited <= 4.5, f"closed after {waited:.1f}s, idle_timeout is 2s"


def test_a_connection_waiting_for_an_answer_is_not_idle(idle_proxy, new_topic):
    topic = new_topic(1)
    with socket.create_connection((h.HOST, idle_proxy.bootstrap_port), timeout=10) as s:
        s.settimeout(10)
        assert api_versions_on(s)
        # Metadata first, so the per-broker listener exists; then a Fetch that
        # long-polls an empty partition for longer than idle_timeout.
        h.roundtrip(s, 3, 1, 2, struct.pack(">i", 1) + h.kstr(topic))
    with socket.create_connection((h.HOST, idle_proxy.broker_port()), timeout=10) as s:
        s.settimeout(10)
        # A topic this new may have no leader yet: the broker then answers
        # at once with an error. Wait until a Fetch finds its partition.
        deadline = time.monotonic() + 30
        while fetch_partition_error(h.roundtrip(s, 1, 11, 2, fetch_body(topic, 0))) != 0:
            assert time.monotonic() < deadline, "the partition never got a leader"
            time.sleep(0.2)
        t0 = time.monotonic()
        body = h.roundtrip(s, 1, 11, 3, fetch_body(topic, 3500))
        waited = time.monotonic() - t0
        assert waited > 2.5, f"the broker answered in {waited:.1f}s: not a long poll"
        assert struct.unpack(">i", body[:4])[0] >= 0  # throttle_time_ms: a real answer
        assert fetch_partition_error(body) == 0
        # Answered; now idle, it is closed.
        assert closed_by_peer(s, 6)


def broker_connections(pid: int, broker_port: int) -> int:
    """Established TCP connections of process `pid` to `broker_port`, from
    /proc (the process's socket inodes matched against /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                remote_port = int(cols[2].rsplit(":", 1)[1], 16)
                if cols[3] == "01" and remote_port == broker_port and cols[9] in inodes:
                    n += 1
    return n


def test_a_client_gets_a_broker_connection_only_once_it_sends_a_request(idle_proxy, broker):
    """A connection that sends nothing, or a first frame the relay would
    refuse, never makes the proxy connect to a broker: a flood of them costs
    the brokers nothing. A real request then gets its broker connection."""
    broker_port = int(broker.bootstrap.rsplit(":", 1)[1])
    pid = idle_proxy.proc.pid
    # The proxy's own clients (metadata, dead-letter side) hold a connection
    # or two of their own, and may open one meanwhile.
    before = broker_connections(pid, broker_port)
    socks = [socket.create_connection((h.HOST, idle_proxy.bootstrap_port), timeout=5)
             for _ in range(5)]
    try:
        # Within idle_timeout (2 s): connecting for each would hold 5 more.
        time.sleep(0.5)
        extra = broker_connections(pid, broker_port) - before
        assert extra <= 1, f"{extra} broker connections for 5 clients that sent nothing"
        # A first frame too long, negative, or of an unknown API key is
        # refused at once (the last one is incomplete: the relay would have
        # waited for the rest of its 40 bytes).
        for head in (struct.pack(">i", 300 << 20), struct.pack(">i", -5),
                     struct.pack(">ihh", 40, 0x5000, 0)):
            s = socket.create_connection((h.HOST, idle_proxy.bootstrap_port), timeout=5)
            socks.append(s)
            s.sendall(head + b"\0" * 12)
            assert closed_by_peer(s, 1), f"a first frame starting {head.hex()} was not refused"
        with socket.create_connection((h.HOST, idle_proxy.bootstrap_port), timeout=5) as s:
            s.settimeout(5)
            assert api_versions_on(s)
        # A first request that arrives a few bytes at a time is waited for
        # (the head is peeked again at growing pauses), then served.
        with socket.create_connection((h.HOST, idle_proxy.bootstrap_port), timeout=5) as s:
            s.settimeout(5)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            frame = h.request_frame(18, 0, 7, b"")
            for part in (frame[:3], frame[3:6]):
                s.sendall(part)
                time.sleep(0.3)
            s.sendall(frame[6:])
            size = struct.unpack(">i", h.recv_exact(s, 4))[0]
            body = h.recv_exact(s, size)
            assert struct.unpack(">ih", body[:6]) == (7, 0), "ApiVersions answered"
    finally:
        for s in socks:
            s.close()
