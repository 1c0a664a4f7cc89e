"""Fault injection: a broker that crashes and comes back, clients that vanish
mid-response or never read, a thousand idle connections, a flood of garbage,
and a dead-letter cluster that swallows requests without answering.

Each test starts its own proxy (and its own brokers where it kills them or
measures memory), talks to 127.0.0.1 only, and bounds every loop in count
and time. Measured figures are printed (visible with `pytest -s`) and
attached to the test report as a "faults" section."""

from __future__ import annotations

import asyncio
import socket
import statistics
import struct
import threading
import time
import uuid

import confluent_kafka as ck
import kafka as kp
import pytest

import clients as c
import conftest
import fault_support as fs
import harness as h
import poison_support as ps


def report(request, line: str) -> None:
    """Print a measured figure and attach it to the test's report."""
    print(f"\n[faults] {request.node.name}: {line}", flush=True)
    request.node.user_properties.append(("faults", line))


def uid() -> str:
    return uuid.uuid4().hex[:8]


_OWN: list[h.Antidote] = []


@pytest.fixture(autouse=True)
def _stop_own_proxies():
    """A test that fails before its own proxy.stop_and_check() leaves no process behind."""
    yield
    while _OWN:
        p = _OWN.pop()
        if p.proc is not None:
            h.stop_process(p.proc)


def own_proxy(workdir, upstream: list[str], cls=h.Antidote, **kw) -> h.Antidote:
    """A proxy for this test alone; its log is attached to failures."""
    p = cls(workdir, upstream=upstream, **kw)
    conftest._PROXIES.append(p)
    _OWN.append(p)
    return p.start()


def produce_bulk(ep: c.Endpoint, topic: str, n: int, size: int, partition: int = 0,
                 tag: str = "bulk", batch: int = 10000) -> list[bytes]:
    """`n` uncompressed records of `size` bytes each, values `tag-i` padded, in
    batches of at most `batch` records."""
    p = ck.Producer(ep.ck(**{"linger.ms": 20, "batch.num.messages": batch,
                             "queue.buffering.max.messages": max(n, 100000)}))
    values = [f"{tag}-{i:07d}-".encode().ljust(size, b"x") for i in range(n)]
    errors = []
    for v in values:
        p.produce(topic, value=v, partition=partition,
                  on_delivery=lambda err, _m: err and errors.append(err))
    assert p.flush(60) == 0, "not all records delivered within 60s"
    assert not errors, errors[:5]
    return values


@pytest.fixture
def restartable_broker(workdir):
    """A broker of the test's own that it may crash, restart or fill with
    stuck responses. Still tansu (node 111), also in a Kafka run: these tests
    were written for a broker that restarts in well under a second and comes
    back empty (in memory); Kafka comes back with its data after log recovery,
    which the crash test's expectations do not describe yet."""
    t = h.Tansu(workdir).start()
    yield t
    t.stop()


# ---------------------------------------------------------------------------
# 1. The broker crashes mid-consumption and comes back on the same port
# ---------------------------------------------------------------------------

# What a client may report while its broker is gone and comes back empty:
# transport failures, the topic missing until it is recreated, and the
# offset errors a client may meet around a recreated partition.
CK_TRANSIENT = {ck.KafkaError._TRANSPORT, ck.KafkaError._ALL_BROKERS_DOWN,
                ck.KafkaError._PARTITION_EOF, ck.KafkaError.UNKNOWN_TOPIC_OR_PART,
                ck.KafkaError._UNKNOWN_PARTITION, ck.KafkaError.LEADER_NOT_AVAILABLE,
                ck.KafkaError.NOT_LEADER_FOR_PARTITION, ck.KafkaError._AUTO_OFFSET_RESET,
                ck.KafkaError.OFFSET_OUT_OF_RANGE, ck.KafkaError._TIMED_OUT,
                ck.KafkaError._RESOLVE, ck.KafkaError.UNKNOWN_TOPIC_ID,
                ck.KafkaError._UNKNOWN_TOPIC}

PRE, POST, KILL_AFTER = 400, 50, 100


class RestartConsumer:
    """One consumer session through the proxy (assign, no group) for the
    restart test, with the same poll interface for both clients."""

    def __init__(self, client: str, ep: c.Endpoint, topic: str):
        self.client = client
        self.errors: list[str] = []
        if client == "librdkafka":
            self.c = ck.Consumer(ep.ck(**{
                "group.id": f"restart-{uid()}", "enable.auto.commit": False,
                "auto.offset.reset": "earliest", "max.partition.fetch.bytes": 2048, "queued.min.messages": 5,
                "reconnect.backoff.max.ms": 1000, "topic.metadata.refresh.interval.ms": 1000}))
            self.c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        else:
            self.c = kp.KafkaConsumer(**ep.kp(
                group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                fetch_max_bytes=4096, max_partition_fetch_bytes=2048, max_poll_records=5,
                reconnect_backoff_max_ms=1000, metadata_max_age_ms=1000,
                # Ask not to auto-create the topic while the broker is back
                # empty (tansu was still seen auto-creating it: handled below).
                allow_auto_create_topics=False))
            tp = kp.TopicPartition(topic, 0)
            self.c.assign([tp])
            self.c.seek_to_beginning(tp)

    def poll(self) -> list[tuple[int, bytes]]:
        if self.client == "librdkafka":
            m = self.c.poll(0.2)
            if m is None:
                return []
            if m.error():
                if m.error().code() != ck.KafkaError._PARTITION_EOF:
                    self.errors.append(f"{m.error().name()}: {m.error().str()}")
                    assert m.error().code() in CK_TRANSIENT, f"non-transient error {m.error()}"
                return []
            return [(m.offset(), m.value())]
        try:
            batches = self.c.poll(timeout_ms=200)
        except kp.errors.KafkaError as e:
            self.errors.append(repr(e))
            assert getattr(e, "retriable", False) or isinstance(
                e, (kp.errors.OffsetOutOfRangeError, kp.errors.UnknownTopicOrPartitionError)), \
                f"non-transient error {e!r}"
            return []
        return [(m.offset, m.value) for msgs in batches.values() for m in msgs]

    def close(self) -> None:
        self.c.close()


@pytest.mark.parametrize("mode", ["relay", "intercept"])
@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_broker_crash_and_restart_on_same_port_proxy_survives_and_consumer_resumes_through_it(
        client, mode, workdir, restartable_broker, request):
    """`relay`: no policies (Fetch bytes pass untouched). `intercept`: a policy
    covers the topic (every record passes it), so Fetch responses go through
    the interception path, which must also follow the recreated topic (new
    topic id)."""
    t = restartable_broker
    broker_ep = c.Endpoint(t.bootstrap, "direct")
    topic = f"faults-restart-{uid()}"
    if mode == "relay":
        proxy = own_proxy(workdir, [t.bootstrap], node_id=t.node_id)
    else:
        policy = fs.write_bytes_policy(workdir / f"policy-{uid()}", [topic])
        proxy = own_proxy(workdir, [t.bootstrap], node_id=t.node_id, cls=fs.PolicyAntidote,
                          name="antidote-restart", policy_paths=[str(policy)])
    ep = c.Endpoint(proxy.bootstrap, "proxy")
    c.ck_create_topic(broker_ep, topic, 1)
    pre = produce_bulk(broker_ep, topic, PRE, 300, tag="pre")

    cons = RestartConsumer(client, ep, topic)
    read: list[tuple[int, bytes]] = []
    try:
        # Phase 1: read part of the topic, then crash the broker under the consumer.
        deadline = time.monotonic() + 60
        while sum(v.startswith(b"pre-") for _, v in read) < KILL_AFTER and \
                time.monotonic() < deadline:
            read += cons.poll()
        assert len(read) >= KILL_AFTER, f"read only {len(read)} records before the crash"
        fs.kill_hard(t.proc)
        crashed_at = len(read)
        # Keep polling while the broker is down: the client drains what it
        # had prefetched and sees its connection through the proxy fail.
        end = time.monotonic() + 3
        while time.monotonic() < end:
            read += cons.poll()
        proxy.assert_running()

        # Phase 2: the broker comes back empty on the same port; recreate the
        # topic and write more records than the consumer's position, so that
        # it continues from there (tansu answers a Fetch past its end with an
        # empty partition, not OFFSET_OUT_OF_RANGE: no reset can be forced).
        fs.restart_tansu_on_same_port(t)
        # A Metadata request for the missing topic (tansu auto-creates on
        # them, with 4 partitions) may win the race with CreateTopics; either
        # way the test then uses partition 0 only.
        recreated = "by CreateTopics"
        try:
            c.ck_create_topic(broker_ep, topic, 1)
        except Exception as e:
            from confluent_kafka.admin import AdminClient
            md = AdminClient(broker_ep.ck()).list_topics(topic=topic, timeout=10).topics.get(topic)
            assert md is not None and md.error is None and 0 in md.partitions and \
                md.partitions[0].leader >= 0, f"recreating {topic}: {e}; metadata now: {md}"
            recreated = f"auto-created with {len(md.partitions)} partitions"
        position = len(read)
        post = produce_bulk(broker_ep, topic, PRE + POST, 300, tag="post")
        deadline = time.monotonic() + 90
        while sum(v.startswith(b"post-") for _, v in read) < PRE + POST - position and \
                time.monotonic() < deadline:
            read += cons.poll()
        proxy.assert_running()
    finally:
        cons.close()

    pre_read = [(o, v) for o, v in read if v.startswith(b"pre-")]
    post_read = [(o, v) for o, v in read if v.startswith(b"post-")]
    report(request, f"{client}/{mode}: read {crashed_at} before the crash, {len(pre_read)} pre-crash "
                    f"records in all, then {len(post_read)} of the new partition from offset "
                    f"{position} (topic {recreated}); client errors: {sorted(set(cons.errors))}")
    # Before the crash: the partition prefix, in order, each record once.
    assert pre_read == [(i, pre[i]) for i in range(len(pre_read))]
    # After the restart: the new partition from the consumer's position on, in
    # order, each record once.
    assert post_read == [(o, post[o]) for o in range(position, PRE + POST)]
    assert fs.api_versions_ok(proxy.bootstrap_port)
    proxy.stop_and_check()


# ---------------------------------------------------------------------------
# 2. Clients that hang up in the middle of a large response
# ---------------------------------------------------------------------------

def test_clients_hanging_up_mid_large_fetch_response_do_not_disturb_a_full_read(
        workdir, broker, broker_endpoint, new_topic, request):
    proxy = own_proxy(workdir, [broker.bootstrap])
    topic = new_topic(1)
    n, size = 6000, 1000                       # ~6 MB in the partition
    values = produce_bulk(broker_endpoint, topic, n, size, tag="big")
    time.sleep(0.5)
    baseline = fs.established_to(proxy.proc.pid, broker.port)

    result: dict = {}

    def full_read():
        try:
            result["recs"] = c.kp_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), topic, [0],
                                                 n, timeout=120, max_partition_fetch_bytes=262144)
        except BaseException as e:
            result["error"] = e

    reader = threading.Thread(target=full_read, daemon=True)
    reader.start()
    hangups, sizes = 25, []
    for i in range(hangups):
        with socket.create_connection((h.HOST, proxy.broker_port()), timeout=10) as s:
            s.settimeout(10)
            s.sendall(fs.fetch_request(topic, 1000 + i, max_bytes=16 << 20))
            got = h.recv_exact(s, 4096)        # a few KB of a multi-MB response
            sizes.append(struct.unpack(">i", got[:4])[0])
            # close() with unread data: the kernel answers the proxy with a reset
    reader.join(150)
    assert not reader.is_alive(), "full reader hung"
    assert "error" not in result, f"full reader failed: {result['error']!r}"
    got = result["recs"]
    assert [(r.offset, r.value) for r in got] == list(enumerate(values))
    report(request, f"{hangups} clients hung up after 4 KiB of responses of "
                    f"{min(sizes)}-{max(sizes)} bytes; full read of {n} records intact")
    assert min(sizes) > 1 << 20, f"responses were not large: {sizes}"
    proxy.assert_running()
    assert fs.api_versions_ok(proxy.broker_port())
    # Every abandoned connection's upstream side is released.
    deadline = time.monotonic() + 15
    while fs.established_to(proxy.proc.pid, broker.port) > baseline and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert fs.established_to(proxy.proc.pid, broker.port) <= baseline, \
        "upstream connections of hung-up clients were not closed"
    proxy.stop_and_check()


# ---------------------------------------------------------------------------
# 3. A client that pipelines Fetch requests and never reads
# ---------------------------------------------------------------------------

RSS_GROWTH_LIMIT_KB = 128 * 1024


def test_client_that_never_reads_pipelined_fetches_keeps_proxy_memory_bounded_and_others_served(
        workdir, restartable_broker, request):
    t = restartable_broker                     # its own broker: it will hold stuck responses
    broker_ep = c.Endpoint(t.bootstrap, "direct")
    proxy = own_proxy(workdir, [t.bootstrap], node_id=t.node_id)
    topic, other = f"faults-stuck-{uid()}", f"faults-other-{uid()}"
    c.ck_create_topic(broker_ep, topic, 1)
    c.ck_create_topic(broker_ep, other, 1)
    produce_bulk(broker_ep, topic, 2000, 1000, tag="stuck")        # ~2 MB: 1 MiB per response
    others = produce_bulk(broker_ep, other, 5000, 200, tag="other")
    time.sleep(0.5)
    rss_before = fs.rss_kb(proxy.proc.pid)

    victim = socket.socket()
    victim.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    victim.connect((h.HOST, proxy.broker_port()))
    sent, planned = 0, 200_000                 # 200k x 1 MiB responses if anyone buffered them
    with fs.RssSampler(proxy.proc.pid) as rss:
        victim.settimeout(2)
        send_deadline = time.monotonic() + 15
        try:
            for i in range(planned):
                if time.monotonic() > send_deadline:
                    break
                victim.sendall(fs.fetch_request(topic, i, max_bytes=1 << 20))
                sent += 1
        except socket.timeout:
            pass                               # the proxy stopped reading: backpressure
        assert sent < planned, "the proxy kept reading requests from a client that reads nothing"
        time.sleep(2)
        start = time.monotonic()
        got = c.ck_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), other, [0],
                                  len(others), timeout=60)
        took = time.monotonic() - start
        time.sleep(2)
        proxy.assert_running()
        rss_stuck = fs.rss_kb(proxy.proc.pid)
    tansu_rss = fs.rss_kb(t.proc.pid)
    victim.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    victim.close()
    report(request, f"never-reading client sent {sent} pipelined Fetch requests "
                    f"(of {planned}, 1 MiB each); proxy VmRSS before {rss_before} KiB, peak "
                    f"{rss.peak_kb} KiB ({rss.samples} samples), while stuck {rss_stuck} KiB; "
                    f"tansu VmRSS {tansu_rss} KiB; other consumer read {len(got)} records "
                    f"in {took:.1f}s")
    assert [r.value for r in got] == others
    assert rss.peak_kb - rss_before < RSS_GROWTH_LIMIT_KB, \
        f"proxy memory grew by {(rss.peak_kb - rss_before) // 1024} MiB"
    assert fs.api_versions_ok(proxy.bootstrap_port)
    proxy.stop_and_check()


# ---------------------------------------------------------------------------
# 4. A thousand concurrent connections
# ---------------------------------------------------------------------------

CONNS = 1000


async def _hold_connections(port: int, n: int, at_peak) -> tuple[int, list]:
    """Open `n` connections, do ApiVersions v0 on each, keep all open while
    `at_peak()` runs (in a thread), then close them. Returns (#ok, failures)."""
    sem = asyncio.Semaphore(100)
    failures: list = []

    async def one(i: int):
        async with sem:
            r, w = await asyncio.wait_for(asyncio.open_connection(h.HOST, port), 15)
        w.write(fs.api_versions_request(i))
        await w.drain()
        size = struct.unpack(">i", await asyncio.wait_for(r.readexactly(4), 30))[0]
        body = await asyncio.wait_for(r.readexactly(size), 30)
        corr, err = struct.unpack(">ih", body[:6])
        assert (corr, err) == (i, 0), f"connection {i}: correlation {corr}, error {err}"
        return w

    results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    writers = [x for x in results if isinstance(x, asyncio.StreamWriter)]
    failures = [x for x in results if not isinstance(x, asyncio.StreamWriter)]
    try:
        await asyncio.get_running_loop().run_in_executor(None, at_peak)
    finally:
        for w in writers:
            w.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
    return len(writers), failures


def test_thousand_concurrent_connections_are_all_served(workdir, broker, broker_endpoint,
                                                         new_topic, request):
    soft = fs.raise_nofile(8192)
    if soft < 2 * CONNS + 200:
        pytest.skip(f"RLIMIT_NOFILE soft limit {soft}: the OS hard limit is too low for "
                    f"{CONNS} client + {CONNS} upstream sockets")
    proxy = own_proxy(workdir, [broker.bootstrap])
    psoft, _ = fs.nofile_limit(proxy.proc.pid)
    bsoft, _ = fs.nofile_limit(broker.proc.pid)
    if min(psoft, bsoft) < CONNS + 200:
        pytest.skip(f"open-file limits too low: proxy {psoft}, tansu {bsoft}")
    topic = new_topic(1)
    recs = c.sample_records(10, tag="peak")
    c.ck_produce(broker_endpoint, topic, recs)
    time.sleep(0.5)
    rss_before = fs.rss_kb(proxy.proc.pid)
    upstream_before = fs.established_to(proxy.proc.pid, broker.port)
    peak: dict = {}

    def at_peak():
        peak["rss"] = fs.rss_kb(proxy.proc.pid)
        peak["upstream"] = fs.established_to(proxy.proc.pid, broker.port)
        # A real client is served while all of them are open.
        peak["read"] = c.ck_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), topic, [0],
                                           len(recs), timeout=30)
        peak["rss_after_client"] = fs.rss_kb(proxy.proc.pid)

    start = time.monotonic()
    ok, failures = asyncio.run(_hold_connections(proxy.bootstrap_port, CONNS, at_peak))
    took = time.monotonic() - start
    deadline = time.monotonic() + 20
    while fs.established_to(proxy.proc.pid, broker.port) > upstream_before and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    upstream_after = fs.established_to(proxy.proc.pid, broker.port)
    rss_after = fs.rss_kb(proxy.proc.pid)
    report(request, f"{ok}/{CONNS} concurrent connections served in {took:.1f}s; proxy VmRSS "
                    f"before {rss_before} KiB, at peak {peak.get('rss')} KiB "
                    f"({peak.get('upstream')} upstream connections), "
                    f"{peak.get('rss_after_client')} KiB after a consumer ran alongside, "
                    f"{rss_after} KiB after close; upstream connections before/after "
                    f"{upstream_before}/{upstream_after}; open-file limits proxy {psoft}, "
                    f"tansu {bsoft}")
    assert not failures, f"{len(failures)} connections failed, e.g. {failures[:3]!r}"
    assert ok == CONNS
    assert peak["read"] == recs
    assert peak["upstream"] >= CONNS, "the connections were not all open at once"
    assert upstream_after <= upstream_before, "upstream connections left open after clients left"
    proxy.assert_running()
    proxy.stop_and_check()


# ---------------------------------------------------------------------------
# 5. A garbage flood on many connections vs. a consumer's throughput
# ---------------------------------------------------------------------------

FLOOD_CONNS, FLOOD_PAUSE = 50, 0.1          # <= 500 garbage connections/s
THROUGHPUT_RECORDS, ROUNDS = 100000, 5


def consume_rate(ep: c.Endpoint, topic: str, n: int, timeout: float = 60) -> float:
    """Records/s of a librdkafka consumer reading `n` records from the start
    (assign, consume() in batches of 1000), from assign() to the last record.
    Small fetches (4 KiB per partition) of small batches make it a few
    thousand round trips through the proxy rather than a few large reads."""
    cons = ck.Consumer(ep.ck(**{"group.id": f"rate-{uid()}", "enable.auto.commit": False,
                                "auto.offset.reset": "earliest",
                                "max.partition.fetch.bytes": 4096}))
    try:
        start = time.monotonic()
        cons.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        got, last = 0, None
        deadline = time.monotonic() + timeout
        while got < n and time.monotonic() < deadline:
            for m in cons.consume(num_messages=1000, timeout=1):
                if m.error():
                    assert m.error().code() == ck.KafkaError._PARTITION_EOF, m.error()
                    continue
                assert m.offset() == got, f"offset {m.offset()} where {got} was expected"
                got += 1
                last = time.monotonic()
        assert got == n, f"read {got} of {n} records in {timeout}s"
        return n / (last - start)
    finally:
        cons.close()


def _flooded_rate(ep: c.Endpoint, topic: str, flood_port: int) -> tuple[float, dict]:
    """A consumer's records/s while `flood_port` takes the garbage flood, and
    the flood's stats (with its rate in connections/s)."""
    flood = fs.flood_process(flood_port, FLOOD_CONNS, duration=90, pause=FLOOD_PAUSE)
    try:
        time.sleep(1.5)                                   # let it ramp up
        start = time.monotonic()
        rate = consume_rate(ep, topic, THROUGHPUT_RECORDS)
    finally:
        stats = fs.stop_flood(flood)
    stats["per_s"] = round(stats["sent"] / (time.monotonic() - start + 1.5))
    return rate, stats


@pytest.mark.serial
def test_garbage_flood_on_fifty_connections_keeps_consumer_throughput_above_90_percent(
        workdir, broker, broker_endpoint, new_topic, request):
    """The same flood (50 connections, ~450 garbage frames/s, from its own
    process) goes in turn to the proxy and to a control: a sink process that
    reads once and closes, the least any server can do. The consumer reads
    through the proxy in both. The flood generator costs the machine the same
    in both arms, so the ratio of the two rates is what the proxy's handling of
    the flood costs the consumer, not what the generator costs the 2 cores.
    Rounds alternate the arms' order; the median of the per-round ratios must
    be at least 0.9, and the proxy's extra CPU in the flooded arm must stay
    under 1 ms per garbage connection. Marked serial: it runs after the
    parallel suite, alone."""
    proxy = own_proxy(workdir, [broker.bootstrap])
    ep = c.Endpoint(proxy.bootstrap, "proxy")
    topic = new_topic(1)
    # Batches of 50 records: a broker returns whole batches, so this is what
    # makes each fetch small (~4,000 B) and the read ~2,000 round trips.
    produce_bulk(broker_endpoint, topic, THROUGHPUT_RECORDS, 60, tag="rate", batch=50)
    consume_rate(ep, topic, THROUGHPUT_RECORDS)          # warm-up, not counted
    quiet = consume_rate(ep, topic, THROUGHPUT_RECORDS)  # reported only
    sink, sink_port = fs.sink_process()
    control, flooded, floods, ratios = [], [], [], []
    cpu = {"control": 0.0, "flood": 0.0}
    pid = proxy.proc.pid
    try:
        for i in range(ROUNDS):
            for arm in (("control", "flood") if i % 2 == 0 else ("flood", "control")):
                c0 = fs.cpu_seconds(pid)
                rate, stats = _flooded_rate(ep, topic,
                                            sink_port if arm == "control" else proxy.bootstrap_port)
                cpu[arm] += fs.cpu_seconds(pid) - c0
                (control if arm == "control" else flooded).append(rate)
                if arm == "flood":
                    floods.append(stats)
            ratios.append(flooded[-1] / control[-1])
            proxy.assert_running()
    finally:
        sink.kill()
        sink.wait()
    ratio = statistics.median(ratios)
    sent = sum(f["sent"] for f in floods)
    per_conn_ms = 1000 * max(0.0, cpu["flood"] - cpu["control"]) / max(sent, 1)
    report(request, f"records/s: quiet {round(quiet)}; sink flooded (control) "
                    f"{[round(x) for x in control]}; proxy flooded {[round(x) for x in flooded]}; "
                    f"per-round ratios {[round(r, 2) for r in ratios]}, median {ratio:.2f}; "
                    f"proxy CPU s in control/flood arms {cpu['control']:.1f}/{cpu['flood']:.1f} "
                    f"({per_conn_ms:.3f} ms per garbage connection); floods {floods}")
    assert all(f["sent"] > 0 and f["closed_by_proxy"] > 0.5 * f["sent"] for f in floods), \
        f"the flood did not reach the proxy: {floods}"
    assert fs.api_versions_ok(proxy.bootstrap_port)
    assert ratio >= 0.9, f"throughput under flood fell to {ratio:.0%} of the control's"
    # What the proxy controls, in CPU rather than wall time: refusing a garbage
    # connection costs it well under a millisecond (~0.2 ms in a debug build,
    # with its log line); 2 ms of work per connection fails here even when
    # spare cores keep the consumer's rate up.
    assert per_conn_ms < 1.0, f"{per_conn_ms:.2f} ms of proxy CPU per garbage connection"
    proxy.stop_and_check()


# ---------------------------------------------------------------------------
# 6. A dead-letter cluster that accepts connections and never answers
# ---------------------------------------------------------------------------

def _is_clean(value: bytes) -> bool:
    return value.startswith(b"{")


POISON_OFFSET = 5


class HoldScenario:
    """A proxy with a JSON policy on a 2-partition topic, whose dead-letter
    cluster (a second tansu) is up at start (the ledger loads), then dies and
    its port turns into a black hole that accepts and never answers. Partition
    0 holds a poison record at offset 5 among 10; partition 1 is clean."""

    def __init__(self, workdir, t: h.Tansu):
        self.broker_ep = c.Endpoint(t.bootstrap, "direct")
        self.dlt = h.Tansu(workdir).start()
        self.dlt_ep = c.Endpoint(self.dlt.bootstrap, "direct")
        self.hole = None
        self.topic = f"faults-dlt-{uid()}"
        c.ck_create_topic(self.broker_ep, self.topic, 2)
        policy = fs.write_json_policy(workdir / f"policy-{uid()}", [self.topic])
        self.proxy = own_proxy(workdir, [t.bootstrap], node_id=t.node_id, cls=fs.PolicyAntidote,
                               name="antidote-dlt", policy_paths=[str(policy)],
                               dead_letter={"bootstrap_servers": [self.dlt.bootstrap],
                                            "timeout": "2s"})
        deadline = time.monotonic() + 30
        while "ledger rebuilt" not in self.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "ledger rebuilt" in self.log(), h.read_log(self.proxy.log)
        fs.kill_hard(self.dlt.proc)
        fs.wait_port_closed(self.dlt.port, 10)
        self.hole = fs.BlackHole(self.dlt.port).start()
        self.p0 = [c.Rec(0, i, f"k{i}".encode(),
                         b"{not json" if i == POISON_OFFSET else f'{{"i": {i}}}'.encode())
                   for i in range(10)]
        self.p1 = [c.Rec(1, i, f"k{i}".encode(), f'{{"j": {i}}}'.encode()) for i in range(10)]
        c.ck_produce(self.broker_ep, self.topic, self.p0 + self.p1)

    def log(self) -> str:
        return self.proxy.log.read_text(errors="replace")

    def dlt_back(self) -> None:
        """Close the black hole; the DLT cluster comes back (empty) on its port."""
        self.hole.stop()
        self.hole = None
        fs.restart_tansu_on_same_port(self.dlt)

    def close(self) -> None:
        if self.hole is not None:
            self.hole.stop()
        self.dlt.stop()


def test_dlt_black_hole_holds_poison_partition_while_clean_partition_flows_then_resumes(
        workdir, restartable_broker, request):
    t = restartable_broker
    s = HoldScenario(workdir, t)
    topic, proxy = s.topic, s.proxy
    try:
        cons = ck.Consumer(c.Endpoint(proxy.bootstrap, "proxy").ck(**{
            "group.id": f"dlt-{uid()}", "enable.auto.commit": False,
            "auto.offset.reset": "earliest"}))
        got: list[tuple[int, int, bytes]] = []
        too_large: list[str] = []    # see test_held_partition_is_not_reported_as_message_too_large

        def poll_for(seconds: float, until=None) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end and not (until and until()):
                m = cons.poll(0.2)
                if m is None or (m.error() and m.error().code() == ck.KafkaError._PARTITION_EOF):
                    continue
                if m.error() and m.error().code() == ck.KafkaError.MSG_SIZE_TOO_LARGE:
                    too_large.append(m.error().str())
                    continue
                assert not m.error(), f"consumer error {m.error()}"
                got.append((m.partition(), m.offset(), m.value()))

        def offsets(p: int) -> list[int]:
            return [o for q, o, _ in got if q == p]

        try:
            cons.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in (0, 1)])
            # While the DLT is a black hole: the clean prefix of p0 and all of p1.
            poll_for(30, until=lambda: len(offsets(0)) >= POISON_OFFSET and len(offsets(1)) >= 10)
            # More clean records on p1 keep flowing during the hold.
            p1b = [c.Rec(1, 10 + i, b"late", f'{{"late": {i}}}'.encode()) for i in range(5)]
            c.ck_produce(s.broker_ep, topic, p1b)
            poll_for(15, until=lambda: len(offsets(1)) >= 15)
            poll_for(3)                                       # ...and p0 stays held
            held = list(offsets(0))
            flowed = list(offsets(1))
            report(request, f"during the black hole: p0 offsets {held}, p1 offsets {flowed}; "
                            f"black hole accepted {s.hole.accepted} connection(s), "
                            f"{s.hole.bytes_in} bytes; librdkafka MSG_SIZE_TOO_LARGE errors: "
                            f"{len(too_large)}")
            assert held == list(range(POISON_OFFSET)), "poison partition was not held at the poison"
            assert flowed == list(range(15)), "clean partition did not keep flowing"
            assert s.hole.accepted >= 1, "the proxy never tried the dead-letter cluster"
            assert "partition held before this offset" in s.log()

            resumed_at = time.monotonic()
            s.dlt_back()
            poll_for(60, until=lambda: len(offsets(0)) >= 9)
            resumed_after = time.monotonic() - resumed_at
            poll_for(2)
        finally:
            cons.close()
        report(request, f"after the DLT came back: p0 offsets {offsets(0)} "
                        f"(resumed within {resumed_after:.1f}s)")
        assert offsets(0) == [i for i in range(10) if i != POISON_OFFSET]
        assert all(_is_clean(v) for _, _, v in got), "a poison record reached the consumer"
        dlt_recs = ps.read_dlt_records(s.dlt_ep, f"{topic}.dlt", 1)
        headers = dict(dlt_recs[0].headers)
        assert dlt_recs[0].value == b"{not json"
        assert (headers.get("x-original-topic"), headers.get("x-original-partition"),
                headers.get("x-original-offset")) == (topic.encode(), b"0", b"5")
        proxy.assert_running()
        proxy.stop_and_check()
    finally:
        s.close()


def test_held_partition_is_not_reported_to_librdkafka_as_message_too_large(
        workdir, restartable_broker, request):
    s = HoldScenario(workdir, restartable_broker)
    try:
        # What the proxy answers for the held partition, fetched at the poison offset.
        with socket.create_connection((h.HOST, s.proxy.broker_port()), timeout=15) as sock:
            sock.settimeout(15)
            body = h.roundtrip(sock, 1, 11, 7, h.fetch_v11_body(s.topic, 0, POISON_OFFSET))
        _, topics = h.parse_fetch_v11(body)
        [part] = topics[s.topic]
        below = [r.offset for r in h.decode_uncompressed_batches(part.records or b"")]
        cons = ck.Consumer(c.Endpoint(s.proxy.bootstrap, "proxy").ck(**{
            "group.id": f"dlt-{uid()}", "enable.auto.commit": False}))
        errors, read = [], []
        try:
            cons.assign([ck.TopicPartition(s.topic, 0, ck.OFFSET_BEGINNING)])
            # librdkafka doubles its fetch size on each answer it takes for a
            # partial record, and reports the error once it cannot grow: give
            # it enough held fetches (one per dead_letter.timeout) to get there.
            start = time.monotonic()
            end = start + 45
            while time.monotonic() < end and not (errors and len(read) >= POISON_OFFSET):
                m = cons.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() != ck.KafkaError._PARTITION_EOF:
                        errors.append(m.error().str())
                else:
                    read.append(m.offset())
        finally:
            cons.close()
        took = time.monotonic() - start
        report(request, f"after {took:.0f}s: held Fetch at offset {POISON_OFFSET}: high watermark "
                        f"{part.high_watermark}, {len(part.records or b'')} record bytes holding "
                        f"offsets {below}; librdkafka read {read}, errors {errors[:2]} "
                        f"({len(errors)} in all)")
        assert read == list(range(POISON_OFFSET))
        assert errors == [], "the hold surfaced errors to the application"
    finally:
        s.close()


def test_dlt_bootstrap_list_whose_first_server_is_a_black_hole_still_diverts_via_the_second(
        workdir, restartable_broker, request):
    """dead_letter.bootstrap_servers lists a server that accepts and never
    answers, then a healthy one: the poison record must still reach the DLT
    (through the second server) and its partition move on, within a bound."""
    t = restartable_broker
    broker_ep = c.Endpoint(t.bootstrap, "direct")
    dlt = h.Tansu(workdir).start()
    hole = fs.BlackHole(h.free_port()).start()
    try:
        topic = f"faults-dlt2-{uid()}"
        c.ck_create_topic(broker_ep, topic, 1)
        policy = fs.write_json_policy(workdir / f"policy-{uid()}", [topic])
        proxy = own_proxy(workdir, [t.bootstrap], node_id=t.node_id, cls=fs.PolicyAntidote, name="antidote-dlt2",
                          policy_paths=[str(policy)],
                          dead_letter={"bootstrap_servers": [f"{h.HOST}:{hole.port}",
                                                             dlt.bootstrap],
                                       "timeout": "2s"})
        recs = [c.Rec(0, i, None, b"{broken" if i == 1 else b'{"ok": 1}') for i in range(3)]
        c.ck_produce(broker_ep, topic, recs)
        start = time.monotonic()
        got = c.ck_consume_assign(c.Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2,
                                  timeout=60, until=lambda g: len(g) >= 2)
        took = time.monotonic() - start
        report(request, f"offsets {[r.offset for r in got]} read in {took:.1f}s; black hole "
                        f"accepted {hole.accepted} connection(s)")
        assert [r.offset for r in got] == [0, 2]
        dlt_recs = ps.read_dlt_records(c.Endpoint(dlt.bootstrap, "direct"), f"{topic}.dlt", 1)
        assert dlt_recs[0].value == b"{broken"
        # The fault took effect: the DLT clients start at the first server
        # listed (src/client/cluster.rs), so the black hole was tried.
        assert hole.accepted >= 1, "the black hole was never tried"
        proxy.stop_and_check()
    finally:
        hole.stop()
        dlt.stop()
