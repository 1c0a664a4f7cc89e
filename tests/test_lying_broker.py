"""A broker that lies: responses whose arrays and strings claim billions of
elements. No real broker sends such bytes, so a small relay in front of it
(`LyingFront`) forwards everything and replaces the next response of a
chosen API with a lie. antidote must end that one connection (the broker's
bytes cannot be decoded) and keep running and serving every other
connection; before the bounded decoder (vendor/kafka-protocol) a 7-byte
ApiVersions body aborted the process.

The broker (Kafka; tansu under ANTIDOTE_TEST_BROKER=tansu) advertises the
front's port, so every broker connection of the proxy
(bootstrap, per-broker listeners, its own metadata and DLT traffic) passes
through the front."""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request
import uuid
from typing import Optional

import pytest

import fault_support as fs
import harness as h
from clients import Endpoint, Rec, ck_consume_assign, ck_create_topic, ck_produce

# Bodies (after the correlation id and any response-header tagged fields)
# whose first array or string claims ~2^31 or ~2^32 elements.
HUGE_COMPACT = b"\xff\xff\xff\xff\x0f"
HUGE_I32 = b"\x7f\xff\xff\xff"
LIES = {
    # ApiVersions v0 (classic array): error code, then the api_keys count.
    (18, 0): b"\x00\x00" + HUGE_I32,
    # ApiVersions v3 (compact array): the issue's 7 bytes.
    (18, 3): b"\x00\x00" + HUGE_COMPACT,
    # Metadata v1: brokers count.
    (3, 1): HUGE_I32,
    # Metadata v12 (flexible): throttle, then brokers compact count.
    (3, 12): b"\x00\x00\x00\x00" + HUGE_COMPACT,
    # FindCoordinator v1: throttle, error, then an error-message length of 32767
    # with nothing behind it.
    (10, 1): b"\x00\x00\x00\x00\x00\x00\x7f\xff",
    # Fetch v11: throttle, error, session id, then the responses count.
    (1, 11): b"\x00" * 10 + HUGE_I32,
}
# Response header v1 (one tagged-fields byte) for these flexible versions.
FLEXIBLE = {(3, 12)}


class LyingFront:
    """Relays 127.0.0.1:port to a broker; `lie_next(key, version)` replaces the
    next response to that request with `LIES[(key, version)]`, or
    `lie_always(key)` every response to `key` at any listed version."""

    def __init__(self, port: int, target_port: int):
        self.port, self.target = port, target_port
        self._lock = threading.Lock()
        self._once: set[tuple[int, int]] = set()
        self._always: set[int] = set()
        self._corrupt_fetches = 0
        self.corrupted = 0
        self.fetch_body: Optional[bytes] = None  # replaces every client Fetch response body
        self.lies_told = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((h.HOST, port))
        self._sock.listen(64)
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def lie_next(self, key: int, version: int) -> None:
        with self._lock:
            self._once.add((key, version))

    def lie_always(self, key: int) -> None:
        with self._lock:
            self._always.add(key)

    def corrupt_next_fetch(self) -> None:
        """Flip the last byte of the next Fetch response: the body of the
        last record batch in it, so that batch's CRC no longer matches."""
        with self._lock:
            self._corrupt_fetches += 1

    def _take_corruption(self, key: int) -> bool:
        with self._lock:
            if key == 1 and self._corrupt_fetches:
                self._corrupt_fetches -= 1
                self.corrupted += 1
                return True
        return False

    def truth(self) -> None:
        with self._lock:
            self._once.clear()
            self._always.clear()

    def _take_lie(self, key: int, version: int) -> Optional[bytes]:
        with self._lock:
            if (key, version) not in LIES:
                return None
            if key in self._always or (key, version) in self._once:
                self._once.discard((key, version))
                self.lies_told += 1
                return LIES[(key, version)]
        return None

    def _accept(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                c, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            try:
                b = socket.create_connection((h.HOST, self.target), timeout=5)
            except OSError:
                c.close()
                continue
            self._conns += [c, b]
            pending: list[tuple[int, int, int, bool]] = []
            cond = threading.Condition()
            threading.Thread(target=self._requests, args=(c, b, pending, cond), daemon=True).start()
            threading.Thread(target=self._responses, args=(c, b, pending, cond), daemon=True).start()

    @staticmethod
    def _frame(s: socket.socket) -> Optional[bytes]:
        try:
            size = struct.unpack(">i", h.recv_exact(s, 4))[0]
            return h.recv_exact(s, size)
        except (ConnectionError, OSError, struct.error):
            return None

    @staticmethod
    def _shut(*socks: socket.socket) -> None:
        """Shut both directions of every socket (either pump may end first)."""
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _requests(self, c, b, pending, cond) -> None:
        while (f := self._frame(c)) is not None:
            key, version, corr = struct.unpack(">hhi", f[:8])
            # The proxy's own reads of its DLTs (ledger tail, the read
            # before each DLT write) are never replaced by `fetch_body`:
            # the lies are for the records clients fetch.
            own_dlt_read = key == 1 and b".dlt" in f
            with cond:
                pending.append((key, version, corr, own_dlt_read))
                cond.notify()
            try:
                b.sendall(struct.pack(">i", len(f)) + f)
            except OSError:
                break
        self._shut(c, b)

    def _responses(self, c, b, pending, cond) -> None:
        while (f := self._frame(b)) is not None:
            with cond:
                cond.wait_for(lambda: pending, timeout=5)
                if not pending:
                    break
                key, version, corr, own_dlt_read = pending.pop(0)
            lie = self._take_lie(key, version)
            if key == 1 and self.fetch_body is not None and not own_dlt_read:
                f = struct.pack(">i", corr) + self.fetch_body
            elif self._take_corruption(key):
                f = f[:-1] + bytes([f[-1] ^ 0x55])
            elif lie is not None:
                header = struct.pack(">i", corr) + (b"\x00" if (key, version) in FLEXIBLE else b"")
                f = header + lie
            try:
                c.sendall(struct.pack(">i", len(f)) + f)
            except OSError:
                break
        self._shut(c, b)

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        for s in self._conns:
            try:
                s.close()
            except OSError:
                pass


class RefreshingAntidote(fs.PolicyAntidote):
    """PolicyAntidote whose own metadata refresh runs every second, with an
    admin listener."""
    admin_port: int = 0

    def config_yaml(self) -> str:
        y = super().config_yaml()
        y = y.replace("upstream:\n", "upstream:\n  metadata_refresh: 1s\n", 1)
        return y + f"admin:\n  listen: {h.HOST}:{self.admin_port}\n"


def admin_metrics(p: RefreshingAntidote) -> str:
    with urllib.request.urlopen(f"http://{h.HOST}:{p.admin_port}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def lying(tmp_path_factory):
    """The broker advertising a LyingFront's port, and antidote in front of both,
    with a pass-through bytes policy on every topic (so Fetch responses are
    decoded)."""
    d = tmp_path_factory.mktemp("lying")
    front_port = h.free_port()
    t = h.new_broker(d, advertised_port=front_port).start()
    front = LyingFront(front_port, t.port)
    policy = fs.write_bytes_policy(d / "policies", ["lying-*"])
    p = RefreshingAntidote(d, upstream=[f"{h.HOST}:{front_port}"],
                           policy_paths=[str(policy)])
    p.admin_port = h.free_port()
    p.start()
    yield t, front, p
    front.truth()
    p.stop_and_check()
    front.stop()
    t.stop()


def closed_without_answer(sock: socket.socket, timeout: float = 10) -> bool:
    """Whether the peer closes `sock` (EOF or reset) without sending a frame."""
    sock.settimeout(timeout)
    try:
        return sock.recv(4) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def connect(port: int) -> socket.socket:
    return socket.create_connection((h.HOST, port), timeout=10)


def roundtrip_ok(port: int) -> bool:
    with connect(port) as s:
        return 0 in h.api_versions(s)


def metadata_v1_body() -> bytes:
    return struct.pack(">i", -1)  # all topics


def find_coordinator_v1_body(group: str) -> bytes:
    return h.kstr(group) + b"\x00"


@pytest.mark.parametrize("key,version,body", [
    (18, 0, b""),
    (3, 1, metadata_v1_body()),
    (10, 1, find_coordinator_v1_body("lying-group")),
], ids=["ApiVersions-v0", "Metadata-v1", "FindCoordinator-v1"])
def test_a_lying_response_ends_only_its_connection(lying, key, version, body):
    _, front, p = lying
    bystander = connect(p.bootstrap_port)
    assert 0 in h.api_versions(bystander)
    front.lie_next(key, version)
    told = front.lies_told
    with connect(p.bootstrap_port) as victim:
        victim.sendall(h.request_frame(key, version, 7, body))
        assert closed_without_answer(victim), "the proxy relayed or hung on an undecodable response"
    assert front.lies_told == told + 1, "the lie was never sent: the test proved nothing"
    p.assert_running()
    # The connection opened before the lie keeps working, and so do new ones.
    assert 0 in h.api_versions(bystander)
    bystander.close()
    assert roundtrip_ok(p.bootstrap_port)


def test_the_issue_seven_byte_api_versions_body_does_not_kill_the_proxy(lying):
    """ApiVersions v3 from a real client (librdkafka asks v3+): the 7-byte body."""
    _, front, p = lying
    front.lie_next(18, 3)
    told = front.lies_told
    from confluent_kafka.admin import AdminClient
    a = AdminClient({"bootstrap.servers": p.bootstrap, "socket.timeout.ms": 3000,
                     "api.version.request.timeout.ms": 3000})
    try:
        a.list_topics(timeout=8)  # retries past the lied-to connection
    except Exception:
        pass
    assert front.lies_told > told, "librdkafka never asked ApiVersions v3: the test proved nothing"
    p.assert_running()
    assert roundtrip_ok(p.bootstrap_port)


def test_a_lying_fetch_response_ends_its_connection_and_others_consume(lying):
    _, front, p = lying
    topic = f"lying-fetch-{uuid.uuid4().hex[:8]}"
    ck_create_topic(Endpoint(p.bootstrap, "proxy"), topic, 1)
    recs = [Rec(0, i, b"k%d" % i, b"v%d" % i) for i in range(5)]
    ck_produce(Endpoint(p.bootstrap, "proxy"), topic, recs)
    front.lie_next(1, 11)
    told = front.lies_told
    with connect(p.broker_port()) as victim:
        victim.sendall(fs.fetch_request(topic, 9, 1 << 20))
        assert closed_without_answer(victim)
    assert front.lies_told == told + 1
    p.assert_running()
    got = ck_consume_assign(Endpoint(p.bootstrap, "proxy"), topic, [0], len(recs), timeout=60)
    assert [r.value for r in got] == [r.value for r in recs]


def test_lying_metadata_on_the_proxys_own_refresh_is_survived(lying):
    """The proxy's own client refreshes metadata every second through the
    front; while every Metadata answer is a lie it keeps running and keeps
    relaying, and it recovers when the broker tells the truth again."""
    _, front, p = lying
    told = front.lies_told
    front.lie_always(3)
    try:
        deadline = time.monotonic() + 20
        while front.lies_told < told + 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert front.lies_told >= told + 3, "the proxy's refresh never met the lie"
        p.assert_running()
        assert roundtrip_ok(p.bootstrap_port)
    finally:
        front.truth()
    topic = f"lying-after-{uuid.uuid4().hex[:8]}"
    ep = Endpoint(p.bootstrap, "proxy")
    ck_create_topic(ep, topic, 1)
    recs = [Rec(0, i, None, b"x%d" % i) for i in range(3)]
    ck_produce(ep, topic, recs)
    got = ck_consume_assign(ep, topic, [0], len(recs), timeout=60)
    assert [r.value for r in got] == [r.value for r in recs]


def three_batches(p, prefix: str) -> str:
    """A new one-partition topic `prefix-...` holding three batches,
    `batch-0` to `batch-2`, produced through the proxy."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    ep = Endpoint(p.bootstrap, "proxy")
    ck_create_topic(ep, topic, 1)
    for i in range(3):  # three flushes: three batches
        ck_produce(ep, topic, [Rec(0, i, None, b"batch-%d" % i)], **{"linger.ms": 0})
    return topic


def test_a_corrupt_batch_on_a_policy_topic_holds_the_partition_instead_of_passing(lying):
    """A batch whose CRC does not match cannot be judged: the records before
    it are delivered, it and everything after it are not (fail closed; on
    005719a it was forwarded unfiltered). The next, uncorrupted fetch
    delivers it."""
    _, front, p = lying
    topic = three_batches(p, "lying-corrupt")
    front.corrupt_next_fetch()
    with connect(p.broker_port()) as s:
        body = h.roundtrip(s, 1, 11, 21, h.fetch_v11_body(topic, 0, 0))
    assert front.corrupted == 1
    err, topics = h.parse_fetch_v11(body)
    assert err == 0
    [part] = topics[topic]
    got = [r.value for r in h.decode_uncompressed_batches(part.records or b"")]
    assert got == [b"batch-0", b"batch-1"], f"the corrupt last batch was relayed: {got}"
    metrics = admin_metrics(p)
    assert f'antidote_held_batches_total{{topic="{topic}",partition="0",reason="undecodable"}} 1' in metrics
    # The broker tells the truth again: the held batch is delivered.
    with connect(p.broker_port()) as s:
        body = h.roundtrip(s, 1, 11, 22, h.fetch_v11_body(topic, 0, 2))
    _, topics = h.parse_fetch_v11(body)
    got = [r.value for r in h.decode_uncompressed_batches(topics[topic][0].records or b"")]
    assert got == [b"batch-2"]


def test_a_corrupt_copy_of_a_batch_judged_before_is_held_not_passed_on_its_verdict(lying):
    """Three batches are fetched and judged clean: their verdicts are
    cached. The broker then sends the same section again with the last
    batch corrupted (same offset, same stored CRC, a byte of its last record
    flipped). That copy must be held like any batch that does not decode,
    not passed unread on the good copy's cached verdict (on 4d7af57 it
    was). The next, uncorrupted fetch delivers it from the cache."""
    _, front, p = lying
    topic = three_batches(p, "lying-recopy")

    def fetch(corr: int) -> list[bytes]:
        with connect(p.broker_port()) as s:
            body = h.roundtrip(s, 1, 11, corr, h.fetch_v11_body(topic, 0, 0))
        err, topics = h.parse_fetch_v11(body)
        assert err == 0
        return [r.value for r in h.decode_uncompressed_batches(topics[topic][0].records or b"")]

    assert fetch(31) == [b"batch-0", b"batch-1", b"batch-2"]
    corrupted = front.corrupted
    front.corrupt_next_fetch()
    got = fetch(32)
    assert front.corrupted == corrupted + 1
    assert got == [b"batch-0", b"batch-1"], f"the corrupt copy was relayed: {got}"
    metrics = admin_metrics(p)
    assert f'antidote_held_batches_total{{topic="{topic}",partition="0",reason="undecodable"}} 1' in metrics
    assert fetch(33) == [b"batch-0", b"batch-1", b"batch-2"]


# ---------------------------------------------------------------------------
# Decompression bombs
# ---------------------------------------------------------------------------

BOMB_RECORDS = 200_000       # ~100 bytes each: ~20 MB decompressed per batch
BOMB_PARTITIONS = 8
BOMB_BUDGET = 64 << 20       # limits.decode_budget of the proxy under test


def bomb_batch() -> bytes:
    """A zstd batch of BOMB_RECORDS small records that compresses ~100x,
    with one 70 KB record (over the policy's max_bytes: diverted), so the
    batch is spliced and its decoded form held until the response is sent."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(magic=2, compression_type=4, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 30)
    small = b"z" * 90
    for i in range(BOMB_RECORDS):
        value = b"p" * 70_000 if i == 7 else small
        b.append(i, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    return bytes(b.build())


def fetch_v11_response(topic: str, sections: list[bytes]) -> bytes:
    """A Fetch v11 response body: one topic, partition i carrying sections[i]."""
    out = struct.pack(">ihi", 0, 0, 0) + struct.pack(">i", 1) + h.kstr(topic)
    out += struct.pack(">i", len(sections))
    for i, records in enumerate(sections):
        out += struct.pack(">ihqqqii", i, 0, 1 << 40, 1 << 40, 0, -1, -1)
        out += struct.pack(">i", len(records)) + records
    return out


def with_base_offset(batch: bytes, base: int) -> bytes:
    """The same batch at another base offset (outside the CRC), so the
    verdict cache never recognises it."""
    return struct.pack(">q", base) + batch[8:]


def test_decompression_bombs_are_bounded_by_the_decode_budget(lying, tmp_path):
    """Two connections fetch, round after round, responses of 8 partitions
    each holding a fresh ~200 KB zstd batch that expands to ~20 MB (plus its
    record index): unbounded, one round holds ~0.5 GB decoded at once. With
    limits.decode_budget at 64 MiB the proxy's peak RSS stays within the
    budget plus one batch plus its baseline; partitions over budget are held
    (counted as reason="budget"), never passed unjudged."""
    t, front, _ = lying
    bomb = bomb_batch()
    policy = fs.write_bytes_policy(tmp_path / "policies", ["lying-*"])
    p = RefreshingAntidote(tmp_path, upstream=[f"{h.HOST}:{front.port}"],
                           policy_paths=[str(policy)], limits={"decode_budget": BOMB_BUDGET},
                           name="bomb")
    p.admin_port = h.free_port()
    p.start()
    topic = f"lying-bomb-{uuid.uuid4().hex[:8]}"
    try:
        assert roundtrip_ok(p.bootstrap_port)
        baseline_kb = fs.rss_kb(p.proc.pid)
        errors: list[str] = []

        def fetcher(conn: int) -> None:
            try:
                with connect(p.broker_port()) as s:
                    s.settimeout(60)
                    for r in range(3):
                        h.roundtrip(s, 1, 11, 100 * conn + r, h.fetch_v11_body(topic, 0, 0))
            except Exception as e:  # reported below
                errors.append(f"connection {conn}: {e!r}")

        with fs.RssSampler(p.proc.pid, interval=0.01) as rss:
            for rnd in range(2):
                base = (rnd + 1) << 32
                front.fetch_body = fetch_v11_response(
                    topic, [with_base_offset(bomb, base + i * BOMB_RECORDS)
                            for i in range(BOMB_PARTITIONS)])
                threads = [threading.Thread(target=fetcher, args=(c,)) for c in range(2)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(120)
        front.fetch_body = None
        assert not errors, errors
        p.assert_running()
        growth_mb = (rss.peak_kb - baseline_kb) / 1024
        print(f"decompression bombs: baseline {baseline_kb / 1024:.0f} MB, "
              f"peak {rss.peak_kb / 1024:.0f} MB, growth {growth_mb:.0f} MB "
              f"(budget {BOMB_BUDGET >> 20} MiB)")
        # Budget + one batch at the 64 MiB cap + the response frames and
        # allocator slack. Measured: 93 MB with the budget; 784 MB with
        # decode_budget at 64 GiB (unbounded).
        assert growth_mb < (BOMB_BUDGET >> 20) + 64 + 96, f"peak RSS grew {growth_mb:.0f} MB"
        metrics = admin_metrics(p)
        assert f'antidote_held_batches_total{{topic="{topic}",partition="' in metrics
        assert 'reason="budget"' in metrics, "no partition was ever over budget: the test proved nothing"
    finally:
        front.fetch_body = None
        p.stop_and_check()


DIVERT_WHOLE_POLICY = """\
policies:
  - name: lying-divert-whole
    topics: ["lyingdiv-*"]
    value:
      format: bytes
    on_undecodable: divert
"""


def test_on_undecodable_divert_writes_a_corrupt_batch_whole_to_the_dlt_and_moves_on(lying,
                                                                                      tmp_path):
    """With `on_undecodable: divert` a batch that cannot be decoded is not
    held: its raw bytes go to the DLT as one record (rule `batch`, its offset
    range in the headers) and the client gets an empty batch and a commit
    marker in its place, so it moves past it."""
    t, front, _ = lying
    (tmp_path / "p").mkdir()
    policy = tmp_path / "p" / "divert-whole.yaml"
    policy.write_text(DIVERT_WHOLE_POLICY)
    p = RefreshingAntidote(tmp_path, upstream=[f"{h.HOST}:{front.port}"],
                           policy_paths=[str(policy)], name="divert-whole")
    p.admin_port = h.free_port()
    p.start()
    try:
        topic = f"lyingdiv-{uuid.uuid4().hex[:8]}"
        ep = Endpoint(p.bootstrap, "proxy")
        ck_create_topic(ep, topic, 1)
        for i in range(3):
            ck_produce(ep, topic, [Rec(0, i, None, b"batch-%d" % i)], **{"linger.ms": 0})
        front.corrupt_next_fetch()
        with connect(p.broker_port()) as s:
            body = h.roundtrip(s, 1, 11, 31, h.fetch_v11_body(topic, 0, 0))
        _, topics = h.parse_fetch_v11(body)
        records = topics[topic][0].records or b""
        # The corrupt batch's offset is covered by a commit marker (a control
        # batch of 78 bytes, its value the 6-byte end-transaction marker), so
        # the client's next fetch offset is 3; the records are the two others.
        marker_at = len(records) - 78
        base, = struct.unpack_from(">q", records, marker_at)
        attrs, = struct.unpack_from(">h", records, marker_at + 21)
        assert (base, attrs & 0x20) == (2, 0x20), (base, attrs)
        got = [r.value for r in h.decode_uncompressed_batches(records[:marker_at])]
        assert got == [b"batch-0", b"batch-1"], got
        direct = Endpoint(f"{h.HOST}:{t.port}", "direct")
        from poison_support import read_dlt
        [d] = read_dlt(direct, f"{topic}.dlt")
        hdr = dict(d.headers)
        assert (hdr["x-error-rule"], hdr["x-original-offset"], hdr["x-original-last-offset"]) \
            == (b"batch", b"2", b"2")
        assert d.value[:8] == struct.pack(">q", 2) and len(d.value) > 61, "the raw batch"
        assert 'rule="batch",action="diverted"} 1' in admin_metrics(p)
    finally:
        p.stop_and_check()
