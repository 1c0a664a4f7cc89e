"""The DLT partition lease with real epochs on Apache Kafka (issue 32).

Two proxy instances write one DLT partition. Each takes the partition's
lease (InitProducerId with the shared transactional id
`antidote-dlt/<dlt>/<partition>` at its transaction coordinator) and writes
under it; Kafka refuses a write of an older epoch once the partition holds
a batch of a newer one. The tests read the DLT's batch headers straight from
the broker, so they see the producer id and epoch of every batch:

- the second instance's lease fences the first: the first's next DLT write
  is refused (INVALID_PRODUCER_EPOCH, counted as
  `antidote_dlt_writes_total{result="fenced"}`), it takes the lease again,
  reads the partition and writes; nothing is written twice, and the lease
  markers' epochs only go up;
- a transactional id that expired (`transactional.id.expiration.ms` set to a
  few seconds on a broker of this test): the next lease gets a new producer
  id at epoch 0 (no marker: it fences nobody and needs no fence), and two
  instances then writing the same records at once write each once;
- `dlt replay` runs longer than that expiration: the run takes its target
  lease again within half of it, so a second run's lease still fences it
  and each record is replayed once (five of twenty were replayed twice
  when the first lease was kept for the whole run);
- on the 3-node cluster (`cluster_support`, started for this module's last
  test only), three concurrent replays into a partition led by another node
  than the lease's transaction coordinator write each record once.

Without replay's ABORT-marker fence (InitProducerId alone), the cluster test
and test_fleet.py's concurrent replays fail every time (on the cluster, three runs
wrote 38 and 39 replays of thirty records in two tries).
"""

from __future__ import annotations

import struct
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

import clients as c
import harness as h
import poison_support as ps
from cluster_support import cluster  # noqa: F401 (fixture)
from test_ops import POLICY, OpsAntidote, http_get, metric

FENCED = 'antidote_dlt_writes_total'


def batches(port: int, topic: str, partition: int = 0) -> list[dict]:
    """Every batch of `topic`-`partition` up to its high watermark, read from
    the broker: base offset, producer id and epoch, control or not."""
    out, offset = [], 0
    hw = ps.high_watermark(port, topic, partition)
    while offset < hw:
        p = ps.fetch_partition(port, topic, partition, offset)
        got = ps.split_batches(p.records or b"")
        assert got, f"no batch at offset {offset} < {hw}"
        for b in got:
            pid, epoch = struct.unpack_from(">qh", b.bytes, 43)
            out.append({"offset": b.base_offset, "last": b.base_offset + b.last_offset_delta,
                        "pid": pid, "epoch": epoch, "control": bool(b.attributes & 0x20),
                        "count": b.count})
            offset = b.base_offset + b.last_offset_delta + 1
    return out


def dlt_view(broker, dlt: str) -> tuple[list[c.Rec], list[dict]]:
    """The DLT's records (lease markers included) and its batches, each
    batch with `markers` and `records` (origin keys) it holds."""
    recs = ps.read_dlt(c.Endpoint(broker.bootstrap), dlt, settle=0.5, lease_markers=True)
    bs = batches(broker.port, dlt)
    for b in bs:
        inside = [r for r in recs if b["offset"] <= r.offset <= b["last"]]
        b["markers"] = sum(ps.is_lease_marker(r) for r in inside)
        b["keys"] = [r.key for r in inside if not ps.is_lease_marker(r)]
    return recs, bs


def fenced_count(p: OpsAntidote) -> float:
    return metric(http_get(p.admin_port, "/metrics")[1], FENCED, result="fenced")


def start_pair(workdir, broker, topic: str, tag: str) -> list[OpsAntidote]:
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    pair = [OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        admin_port=h.free_port(), name=f"{tag}-{i}-{topic}",
                        node_id=broker.node_id).start()
            for i in range(2)]
    for p in pair:
        p.wait_ready()
    return pair


def poison(n: int, partition: int, tag: str) -> list[c.Rec]:
    return [c.Rec(partition, -1, f"{tag}{i}".encode(), b'{"lat": 95}') for i in range(n)]


def divert(p: OpsAntidote, topic: str, partition: int) -> None:
    """One Fetch of `topic`-`partition` through instance `p` from offset 0:
    the proxy diverts the partition's poison records before it answers."""
    f = ps.fetch_partition(p.broker_port(), topic, partition)
    assert f.error_code == 0


def concurrent_divert(pair, topic: str, partition: int) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(len(pair))

    def one(p):
        try:
            start.wait(10)
            divert(p, topic, partition)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(p,)) for p in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def shape(bs: list[dict]) -> list[tuple]:
    """Batches as (offset, producer id, epoch, control, markers, keys)."""
    return [(x["offset"], x["pid"], x["epoch"], x["control"], x.get("markers"),
             b",".join(x.get("keys") or []).decode()) for x in bs]


def assert_each_once(recs: list[c.Rec], want: set[bytes]) -> None:
    counts = Counter(r.key for r in recs if not ps.is_lease_marker(r))
    assert set(counts) == want, f"missing {want - set(counts)}, unexpected {set(counts) - want}"
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"written more than once: {twice}"


@pytest.fixture(scope="module", autouse=True)
def transaction_coordinator(broker):
    h.ensure_transaction_coordinator(broker.bootstrap)


def test_the_second_lease_fences_the_first(workdir, broker, monkeypatch):
    """A writes at epoch 0 (no marker); B's lease (epoch 1) writes its marker,
    which fences A; A's next write is refused, A takes the lease again
    (epoch 2, marker), reads and writes. Then both divert the same ten
    records at once: each is in the DLT once."""
    if h.TEST_BROKER != "kafka":
        pytest.skip("real epochs: Apache Kafka only (tansu fences from InitProducerId on)")
    topic = f"lease-{uuid.uuid4().hex[:8]}"
    dlt = f"{topic}.dlt"
    direct = c.Endpoint(broker.bootstrap)
    c.ck_create_topic(direct, topic, 4)
    c.ck_create_topic(direct, dlt, 1)
    recs = poison(1, 0, "a") + poison(1, 1, "b") + poison(1, 2, "c") + poison(10, 3, "d")
    c.ck_produce(direct, topic, recs)
    # The refused write is logged at debug level, with Kafka's error code.
    monkeypatch.setenv("ANTIDOTE_LOG", "info,antidote::dlt=debug")
    a, b = start_pair(workdir, broker, topic, "lease")
    try:
        divert(a, topic, 0)
        divert(b, topic, 1)
        divert(a, topic, 2)
        _, bs = dlt_view(broker, dlt)
        data = [x for x in bs if not x["control"]]
        pid = data[0]["pid"]
        assert pid >= 0 and all(x["pid"] == pid for x in data), bs
        # a0 at epoch E; B's marker and b0 at E+1; A's marker and c0 at E+2.
        e = data[0]["epoch"]
        seen = [(x["epoch"] - e, x["markers"], x["keys"]) for x in data]
        assert seen == [(0, 0, [b"a0"]), (1, 1, []), (1, 0, [b"b0"]),
                         (2, 1, []), (2, 0, [b"c0"])], shape(bs)
        assert (fenced_count(a), fenced_count(b)) == (1, 0)
        # INVALID_PRODUCER_EPOCH (47): Kafka's answer to an older epoch on a
        # partition that appended a newer one (PRODUCER_FENCED, 90, is the
        # coordinator's).
        log = a.log.read_text()
        assert "fenced by another writer of the DLT partition" in log
        assert "producer fenced or unknown (error 47)" in log, log[-3000:]
        # Both at once, the same ten records: one of them writes each.
        concurrent_divert([a, b], topic, 3)
        got, bs = dlt_view(broker, dlt)
        assert_each_once(got, {b"a0", b"b0", b"c0"} | {b"d%d" % i for i in range(10)})
        epochs = [x["epoch"] for x in bs if not x["control"]]
        assert epochs == sorted(epochs), f"a write of an older epoch after a newer one: {shape(bs)}"
        markers = [x["epoch"] for x in bs if x["markers"]]
        assert len(markers) == len(set(markers)), f"two lease markers of one epoch: {shape(bs)}"
    finally:
        for p in (a, b):
            p.stop_and_check()


EXPIRY_MS = 4000
CLEANUP_MS = 500


@pytest.fixture(scope="module")
def expiring_broker(workdir):
    """A Kafka broker of its own that forgets a transactional id 4 s after
    its last InitProducerId (`transactional.id.expiration.ms`, checked every
    `transaction.remove.expired.transaction.cleanup.interval.ms`)."""
    if h.TEST_BROKER != "kafka":
        pytest.skip("transactional id expiration: Apache Kafka only")
    k = h.KafkaBroker(workdir, extra_properties={
        "transactional.id.expiration.ms": EXPIRY_MS,
        "transaction.remove.expired.transaction.cleanup.interval.ms": CLEANUP_MS,
    }).start()
    try:
        h.ensure_transaction_coordinator(k.bootstrap)
        yield k
    finally:
        k.stop()


def test_an_expired_transactional_id_gets_a_new_producer_id_and_writes_once(
        workdir, expiring_broker):
    """A and B write under one producer id; the id expires (nobody took the
    lease for longer than the expiration); the next leases get a new producer
    id; A and B then divert the same ten records at once: each is written
    once, and no batch of the old producer id follows one of the new."""
    broker = expiring_broker
    topic = f"expiry-{uuid.uuid4().hex[:8]}"
    dlt = f"{topic}.dlt"
    direct = c.Endpoint(broker.bootstrap)
    c.ck_create_topic(direct, topic, 3)
    c.ck_create_topic(direct, dlt, 1)
    c.ck_produce(direct, topic, poison(1, 0, "a") + poison(1, 1, "b") + poison(10, 2, "d"))
    a, b = start_pair(workdir, broker, topic, "expiry")
    try:
        divert(a, topic, 0)
        divert(b, topic, 1)
        _, before = dlt_view(broker, dlt)
        old = {x["pid"] for x in before if not x["control"]}
        assert len(old) == 1, before
        # The id expires EXPIRY_MS after B's InitProducerId (the last one),
        # at the next cleanup check. Both instances still hold a lease then.
        time.sleep((EXPIRY_MS + 3 * CLEANUP_MS) / 1000 + 1.5)
        concurrent_divert([a, b], topic, 2)
        got, bs = dlt_view(broker, dlt)
        assert_each_once(got, {b"a0", b"b0"} | {b"d%d" % i for i in range(10)})
        data = [x for x in bs if not x["control"]]
        new = [x for x in data if x["pid"] not in old]
        assert new, f"no new producer id after the transactional id expired: {shape(bs)}"
        first_new = data.index(new[0])
        assert all(x["pid"] not in old for x in data[first_new:]), \
            f"a write of the expired producer id after the new one's: {shape(bs)}"
        # The new id starts at epoch 0: that lease writes no marker (it
        # fences nobody); each later lease of it (the other instance's)
        # writes one first, and the epochs only go up. Epoch 0's lease may
        # be fenced before it writes anything (then the first is epoch 1's
        # marker).
        epochs = [x["epoch"] for x in new]
        assert epochs == sorted(epochs) and epochs[0] <= 1, shape(bs)
        for e in set(epochs):
            first = next(x for x in new if x["epoch"] == e)
            assert first["markers"] == (1 if e > 0 else 0), shape(bs)
    finally:
        for p in (a, b):
            p.stop_and_check()


def test_a_replay_longer_than_the_id_expiration_still_writes_each_once(workdir, expiring_broker):
    """`dlt replay --execute --rate 2` of twenty records (about ten seconds,
    more than the 4 s expiration), and a second run started after the
    expiration would have passed: the first run takes its target lease
    again every half expiration, so the id never expires and the second
    run's lease fences it; each record is written once. (With the first
    lease kept, the second run got a new producer id that fenced nothing,
    and both wrote the rest.)"""
    from test_ops import cli, read_all
    from test_reload_replay import replay_counts, wait_for_log
    broker = expiring_broker
    topic = f"expiry-replay-{uuid.uuid4().hex[:8]}"
    direct = c.Endpoint(broker.bootstrap)
    c.ck_create_topic(direct, topic, 1)
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    proxy = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        name=f"expiry-replay-{topic}", node_id=broker.node_id).start()
    try:
        n = 20
        c.ck_produce(direct, topic, poison(n, 0, "r"))
        ps.wait_high_watermark(broker.port, topic, 0, n)
        divert(proxy, topic, 0)
        ps.wait_high_watermark(broker.port, f"{topic}.dlt", 0, n)
        policy.write_text(POLICY.format(topic=topic, max_lat=100))
        wait_for_log(proxy, "policies reloaded")
        args = ("dlt", "replay", "--config", str(proxy.config_path), "--topic", f"{topic}.dlt",
                "--execute")
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(cli, *args, "--rate", "2")
            time.sleep((EXPIRY_MS + 3 * CLEANUP_MS) / 1000 + 1.5)
            assert not slow.done(), slow.result()
            fast = cli(*args)
            slow = slow.result()
        runs = [slow, fast]
        assert all(r.returncode == 0 for r in runs), runs
        counts = [replay_counts([ln for ln in r.stderr.splitlines()
                                 if ln.startswith("replay: ")][-1]) for r in runs]
        got = read_all(broker.bootstrap, topic)
        replays = Counter(r.key for r in got if dict(r.headers).get("x-replayed-from-dlt"))
        assert sorted(replays.values()) == [1] * n, \
            f"replays per key: {dict(replays)}; runs: {counts}"
        assert sum(x["replayed"] for x in counts) == n, counts
        # Both wrote: the second run's lease did fence the first.
        assert all(x["replayed"] > 0 for x in counts), counts
    finally:
        proxy.stop_and_check()


def java_hash(s: str) -> int:
    """Java's String.hashCode (Kafka places a transactional id by it)."""
    n = 0
    for ch in s.encode("utf-16-be").decode("utf-16-be"):
        n = (31 * n + ord(ch)) & 0xFFFFFFFF
    return n - (1 << 32) if n & 0x80000000 else n


def test_concurrent_replays_on_three_nodes_with_the_coordinator_elsewhere(workdir, cluster):
    """On the 3-node cluster: three `dlt replay --execute` of the same thirty
    DLT records at once, into a target partition led by another node than
    the transaction coordinator of its lease (AddPartitionsToTxn, EndTxn and
    DescribeTransactions go to the coordinator, the ABORT marker to the
    partition's leader, acks=all with a minimum ISR of 2): each record is
    written once, and no run fell back to writing without a lease."""
    from test_ops import cli
    h.ensure_transaction_coordinator(cluster.bootstrap, timeout=60)
    topic = f"lease-cluster-{uuid.uuid4().hex[:8]}"
    dlt = f"{topic}.dlt"
    tid = f"antidote-replay/{topic}/0"
    txn_leaders = cluster.leaders("__transaction_state")
    coordinator = txn_leaders[(java_hash(tid) & 0x7FFFFFFF) % len(txn_leaders)]
    leader = next(n for n in (1, 2, 3) if n != coordinator)
    others = [n for n in (1, 2, 3) if n != leader]
    cluster.create_topic(topic, [[leader, *others]])
    cluster.create_topic(dlt, [[coordinator, *[n for n in (1, 2, 3) if n != coordinator]]])
    ep = cluster.endpoint()
    n = 30
    c.ck_produce(ep, dlt, [c.Rec(0, -1, b"k%d" % i, b'{"lat": 1}', (
        ("x-original-topic", topic.encode()), ("x-original-partition", b"0"),
        ("x-original-offset", str(i).encode()), ("x-original-timestamp", b"1700000000000"),
        ("x-error-class", b"poison"), ("x-error", b"/lat: 95 is outside [-90, 90]"),
        ("x-error-rule", b"range:/lat"), ("x-policy", b"ops-geo"),
        ("x-failed-at", b"1700000000500")), 1_700_000_000_000) for i in range(n)])
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    cfg = OpsAntidote(workdir, upstream=[b.bootstrap for b in cluster.brokers.values()],
                      name=f"lease-cluster-{topic}", policy_files=(str(policy),))
    cfg.config_path.write_text(cfg.config_yaml())
    args = ("dlt", "replay", "--config", str(cfg.config_path), "--topic", dlt, "--execute")
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda _: cli(*args, timeout=120), range(3)))
    assert all(r.returncode == 0 for r in runs), [r.stdout + r.stderr for r in runs]
    assert not [r.stderr for r in runs if "no producer lease" in r.stderr], [
            ln for r in runs for ln in r.stderr.splitlines() if "lease" in ln]
    from test_reload_replay import replay_counts
    counts = [replay_counts([ln for ln in r.stderr.splitlines()
                             if ln.startswith("replay: ")][-1]) for r in runs]
    assert sum(x["replayed"] for x in counts) == n, counts
    from test_ops import read_all
    got = read_all(cluster.bootstrap, topic, timeout=60)
    per_key = Counter(r.key for r in got)
    assert sorted(per_key.values()) == [1] * n, f"{dict(per_key)}; runs: {counts}"
    assert cluster.leaders(topic)[0] == leader != coordinator
