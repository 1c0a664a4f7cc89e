"""A fleet: three antidote instances in front of one broker, with Kafka
as the only state they share (issue 13).

Each instance tails every DLT it knows, so it learns the other instances'
diversions within a bounded delay and keeps removing those records instead of
writing them again. Tests here check what the README's "Running several
instances" promises: after the tail delay, a poison record diverted by any
instance is in its DLT once and never delivered by another instance, even
after a policy change that would make it valid.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

import clients as c
import harness as h
import poison_support as ps


@pytest.fixture(scope="module", autouse=True)
def transaction_coordinator(broker):
    """The DLT lease needs the broker's transaction coordinator loaded (see
    harness.ensure_transaction_coordinator)."""
    if h.TEST_BROKER == "kafka":
        h.ensure_transaction_coordinator(broker.bootstrap)


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return ps.write_policies(tmp_path_factory.mktemp("fleet-policies"))


def start_fleet(workdir, broker, policy_file, n=3, tag="fleet"):
    return [ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                                  name=f"antidote-{tag}-{i}", node_id=broker.node_id)
            for i in range(n)]


# Two `dlt replay --execute` racing for one target partition: on Kafka 4.1.2
# (antidote at 910d135) one record of thirty was replayed by both runs (29 + 2
# "replayed", 31 copies; three times in three runs), while tansu, which fences
# an older epoch from InitProducerId on, wrote each once. Kafka fences an
# epoch per partition only once that partition has appended a batch of a
# newer one: run A's first write (old epoch) landed after run B had read the
# target and before B's first write. Replay's lease now leaves an ABORT marker
# of its epoch in the target before reading it (dlt::writer::fence::
# fence_partition), and the test runs on Kafka.


def stop_fleet(fleet):
    for p in fleet:
        p.stop_and_check()


KINDS = ["valid", "lat", "valid", "nan", "enum", "valid", "noheader", "valid", "lat", "valid"]


def produce_mixed(broker_endpoint, topic, partitions=2):
    """KINDS on each partition; (valid records, poison records)."""
    recs = [ps.json_rec(k, i, partition=p) for p in range(partitions) for i, k in enumerate(KINDS)]
    c.ck_produce(broker_endpoint, topic, recs, **{"linger.ms": 100})
    kinds = [k for _ in range(partitions) for k in KINDS]
    valid = [r for r, k in zip(recs, kinds) if k == "valid"]
    poison = [r for r, k in zip(recs, kinds) if k != "valid"]
    return valid, poison


def final_counts(run) -> dict:
    """The numbers of `dlt replay`'s last summary line (stderr also carries
    progress lines with the same prefix)."""
    from test_reload_replay import replay_counts
    last = [ln for ln in run.stderr.splitlines() if ln.startswith("replay: ")][-1:]
    return replay_counts("\n".join(last))


def fleet_topic(broker_endpoint, partitions=2):
    """A policy topic whose DLT exists before the instances start, so that each
    instance loads it (empty) at start and must learn later diversions from
    its tail (a DLT first asked about later is read then, which hides the
    problem)."""
    topic = ps.unique_topic(ps.JSON_PREFIX, "fleet")
    c.ck_create_topic(broker_endpoint, topic, partitions)
    c.ck_create_topic(broker_endpoint, f"{topic}.dlt", 1)
    return topic


def dlt_origins(broker_endpoint, topic, settle=1.0):
    return sorted(ps.origin_offsets(ps.read_dlt(broker_endpoint, f"{topic}.dlt", settle=settle)))


def test_three_instances_read_in_turn_write_each_poison_once(workdir, broker, broker_endpoint,
                                                            policy_file):
    """The issue's reproduction: the same records read through three instances,
    one after the other (each instance started before any diversion)."""
    topic = fleet_topic(broker_endpoint)
    fleet = start_fleet(workdir, broker, policy_file, tag="turn")
    try:
        valid, poison = produce_mixed(broker_endpoint, topic)
        for p in fleet:
            ep = c.Endpoint(p.bootstrap, "proxy")
            got = c.ck_consume_assign(ep, topic, [0, 1], len(valid), timeout=30)
            assert c.by_partition_in_order(got) == c.by_partition_in_order(valid)
            time.sleep(1.5)  # more than the tail delay (see the README)
        want = sorted((r.partition, r.offset) for r in poison)
        assert dlt_origins(broker_endpoint, topic) == want, "each poison record exactly once"
    finally:
        stop_fleet(fleet)


def test_the_lease_passes_between_instances_through_lease_markers(workdir, broker,
                                                                 broker_endpoint, policy_file):
    """Instances 0, 1 and 0 again each divert a new poison record to one DLT
    partition. The first lease (epoch 0) writes no marker. Each later one
    writes a lease marker before its record: Kafka refuses an older epoch on
    a partition only once the partition holds a batch of the newer one.
    Instance 0's second write goes out under its stale lease, is refused,
    and the lease is taken again."""
    topic = fleet_topic(broker_endpoint, partitions=1)
    fleet = start_fleet(workdir, broker, policy_file, n=2, tag="lease")
    try:
        for i, p in enumerate([0, 1, 0]):
            c.ck_produce(broker_endpoint, topic,
                         [ps.json_rec("valid", 2 * i), ps.json_rec("lat", 2 * i + 1)])
            ps.wait_high_watermark(broker.port, topic, 0, 2 * i + 2)
            got = c.kp_consume_assign(c.Endpoint(fleet[p].bootstrap, "proxy"), topic, [0], i + 1,
                                      timeout=30)
            assert [r.offset for r in got] == [2 * j for j in range(i + 1)]
            time.sleep(1.0)  # past the tail delay: the other instance learns the diversion
        dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt", lease_markers=True)
        seq = ["lease" if ps.is_lease_marker(r) else int(ps.hdict(r)["x-original-offset"])
               for r in dlt]
        assert seq == [1, "lease", 3, "lease", 5]
    finally:
        stop_fleet(fleet)


def test_three_instances_fetching_at_once(workdir, broker, broker_endpoint, policy_file):
    """The same records fetched through all three instances at the same moment
    (librdkafka, kafka-python and librdkafka again): every valid record is
    delivered by each, and each poison record is in the DLT once."""
    topic = fleet_topic(broker_endpoint)
    fleet = start_fleet(workdir, broker, policy_file, tag="once")
    try:
        valid, poison = produce_mixed(broker_endpoint, topic)
        eps = [c.Endpoint(p.bootstrap, "proxy") for p in fleet]
        readers = [c.ck_consume_assign, c.kp_consume_assign, c.ck_consume_assign]
        with ThreadPoolExecutor(3) as pool:
            futs = [pool.submit(r, ep, topic, [0, 1], len(valid), timeout=40)
                    for r, ep in zip(readers, eps)]
            for f in futs:
                assert c.by_partition_in_order(f.result()) == c.by_partition_in_order(valid)
        want = sorted((r.partition, r.offset) for r in poison)
        assert dlt_origins(broker_endpoint, topic) == want, "each poison record exactly once"
    finally:
        stop_fleet(fleet)


def fetch_at_once(fleet, topic, partition=0, offset=0):
    """One raw Fetch of `topic`/`partition` through every instance, released
    together by a barrier: the three instances judge the same poison records
    and try to write them at the same moment."""
    barrier = threading.Barrier(len(fleet))
    out = [None] * len(fleet)

    def go(i, p):
        barrier.wait(10)
        out[i] = ps.fetch_partition(p.broker_port(), topic, partition, offset)

    threads = [threading.Thread(target=go, args=(i, p)) for i, p in enumerate(fleet)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_simultaneous_fetches_through_three_instances_write_each_poison_once(
        workdir, broker, policy_file):
    """Five rounds: a new topic, its records fetched through all three
    instances released by one barrier. Each instance returns the same valid
    records, and each poison record is in its DLT once: the DLT partition's
    producer lease (a transactional id per DLT partition) fences all but one
    writer, and a fenced writer reads the partition again before writing."""
    broker_endpoint = c.Endpoint(broker.bootstrap, "direct")
    topics = [fleet_topic(broker_endpoint, partitions=1) for _ in range(5)]
    fleet = start_fleet(workdir, broker, policy_file, tag="race")
    try:
        kinds = ["valid", "lat", "nan", "valid", "enum", "noheader", "valid"]
        for topic in topics:
            recs = [ps.json_rec(k, i) for i, k in enumerate(kinds)]
            c.ck_produce(broker_endpoint, topic, recs)
            ps.wait_high_watermark(broker.port, topic, 0, len(kinds))
            answers = fetch_at_once(fleet, topic)
            kept = [[r.offset for r in h.decode_uncompressed_batches(a.records)] for a in answers]
            want_valid = [i for i, k in enumerate(kinds) if k == "valid"]
            assert kept == [want_valid] * 3, f"{topic}: offsets delivered per instance {kept}"
            want = sorted((0, i) for i, k in enumerate(kinds) if k != "valid")
            assert dlt_origins(broker_endpoint, topic, settle=0.3) == want, \
                f"{topic}: each poison record exactly once"
    finally:
        stop_fleet(fleet)


def test_sigkill_mid_diversion_then_restart_and_a_late_instance(workdir, broker, broker_endpoint,
                                                                policy_file):
    """Instance 0 is SIGKILLed while it diverts (its consumer follows a
    partition that gets a poison record every third offset, produced in 40
    batches 50 ms apart), then restarted on its ports; a fourth instance starts after the diversions.
    Reading through every instance delivers every valid record, and each
    poison record is in the DLT once."""
    topic = fleet_topic(broker_endpoint, partitions=1)
    fleet = start_fleet(workdir, broker, policy_file, n=2, tag="kill")
    kinds = ["valid", "lat", "valid"] * 40
    recs = [ps.json_rec(k, i) for i, k in enumerate(kinds)]
    valid = [r for r, k in zip(recs, kinds) if k == "valid"]
    victim = fleet[0]
    ep0 = c.Endpoint(victim.bootstrap, "proxy")

    def produce_slowly():  # 40 batches, 50 ms apart: diversions go on for ~2 s
        for i in range(0, len(recs), 3):
            c.ck_produce(broker_endpoint, topic, recs[i:i + 3])
            time.sleep(0.05)

    producer = threading.Thread(target=produce_slowly, daemon=True)
    producer.start()
    reader = threading.Thread(target=lambda: _read_quietly(ep0, topic, len(valid)), daemon=True)
    reader.start()
    port = broker.port
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ps.high_watermark(port, f"{topic}.dlt") < 8:
        time.sleep(0.02)
    victim.proc.kill()  # SIGKILL, while it diverts the records arriving
    victim.proc.wait(10)
    dlt_at_kill = ps.high_watermark(port, f"{topic}.dlt")
    assert 0 < dlt_at_kill < kinds.count("lat"), f"killed too late: {dlt_at_kill} in the DLT"
    producer.join(30)
    restarted = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap],
                                      policies=[policy_file], bootstrap_port=victim.bootstrap_port,
                                      port_base=victim.port_base, name="antidote-kill-0b")
    late = None
    try:
        for p in (fleet[1], restarted):
            got = c.kp_consume_assign(c.Endpoint(p.bootstrap, "proxy"), topic, [0], len(valid),
                                      timeout=60)
            assert [r.offset for r in got] == [r.offset for r in valid]
        late = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                                     name="antidote-kill-late")
        got = c.ck_consume_assign(c.Endpoint(late.bootstrap, "proxy"), topic, [0], len(valid),
                                  timeout=60)
        assert [r.offset for r in got] == [r.offset for r in valid]
        want = [(0, i) for i, k in enumerate(kinds) if k != "valid"]
        assert dlt_origins(broker_endpoint, topic) == want, "each poison record exactly once"
    finally:
        for p in (fleet[1], restarted, late):
            if p is not None:
                p.stop_and_check()


def _read_quietly(ep, topic, n):
    """Read through an instance that is about to be killed (errors are
    expected)."""
    try:
        c.kp_consume_assign(ep, topic, [0], n, timeout=20)
    except Exception:  # noqa: BLE001 - the proxy is killed under it
        pass


def test_group_members_on_different_instances(workdir, broker, broker_endpoint, policy_file):
    """One consumer group, its two members connected to two different
    instances: together they receive every valid record once, and each poison
    record is in the DLT once. The records are produced once both members
    hold a partition, so neither can read them all before the other joins."""
    import kafka as kp
    topic = fleet_topic(broker_endpoint, partitions=2)
    fleet = start_fleet(workdir, broker, policy_file, n=2, tag="group")
    try:
        # The premise: both members can see the topic's partitions when the
        # group forms (kafka-python's range assignor gives nothing for a
        # topic it has no metadata for, and a CI run on 2 busy cores once
        # spent the whole wait for a split in that state).
        for p in fleet:
            c.wait_topic_visible(c.Endpoint(p.bootstrap), topic, 2, 30)
        group = f"fleet-{uuid.uuid4().hex[:8]}"
        members = [kp.KafkaConsumer(**c.Endpoint(p.bootstrap).kp(
            group_id=group, auto_offset_reset="earliest", enable_auto_commit=True,
            auto_commit_interval_ms=200, heartbeat_interval_ms=300, session_timeout_ms=6000,
            max_poll_interval_ms=3000)) for p in fleet]
        # Each member's own metadata lists the topic before it joins
        # (`kp_subscribe`: kafka-python's leader assigns nothing otherwise).
        for m in members:
            c.kp_subscribe(m, topic)
        got, per_member, assigned = [], [0, 0], [set(), set()]
        current = [set(), set()]
        want: list = [None]  # how many valid records, once produced
        lock, done = threading.Lock(), threading.Event()
        deadline = time.monotonic() + 90

        def member(i: int) -> None:
            # Each member polls in its own thread, as an application would:
            # one thread polling both would leave one member's rebalance
            # waiting while it polls the other.
            m = members[i]
            while not done.is_set() and time.monotonic() < deadline:
                for _tp, msgs in m.poll(timeout_ms=200).items():
                    with lock:
                        got.extend(c._kp_rec(x) for x in msgs)
                        per_member[i] += len(msgs)
                        if want[0] is not None and len(got) >= want[0]:
                            done.set()
                with lock:
                    current[i] = {tp.partition for tp in m.assignment()}
                    assigned[i] |= current[i]

        threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
        try:
            for t in threads:
                t.start()
            joined = time.monotonic() + 45
            while time.monotonic() < joined:
                with lock:
                    if current[0] and current[1] and not current[0] & current[1]:
                        break
                time.sleep(0.1)
            assert current[0] and current[1], f"the group never split its partitions: {current}"
            valid, poison = produce_mixed(broker_endpoint, topic)
            with lock:
                want[0] = len(valid)
                if len(got) >= want[0]:
                    done.set()
            for t in threads:
                t.join(90)
        finally:
            done.set()
            for m in members:
                m.close()
        assert c.by_partition_in_order(got) == c.by_partition_in_order(valid), \
            f"per member: {per_member} records, partitions assigned: {assigned}"
        assert all(n > 0 for n in per_member), f"one member got everything: {per_member}"
        want_dlt = sorted((r.partition, r.offset) for r in poison)
        assert dlt_origins(broker_endpoint, topic) == want_dlt, "each poison record exactly once"
    finally:
        stop_fleet(fleet)


def test_policy_fix_then_two_concurrent_replays_through_a_fleet(workdir, broker):
    """Instance 0 diverts a record; instances 1 and 2 started before that
    diversion. After the policy is fixed (all three reload the shared file),
    no instance delivers the original; two `dlt replay --execute` of the same
    DLT range run at the same moment write the record once; every instance
    then delivers the replayed copy once and never the original."""
    from test_ops import POLICY, OpsAntidote, cli, read_all
    from test_reload_replay import replay_counts, wait_for_log
    direct = c.Endpoint(broker.bootstrap)
    topic = f"fleet-fix-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(direct, topic, 1)
    c.ck_create_topic(direct, f"{topic}.dlt", 1)
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    fleet = [OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                         admin_port=h.free_port(), name=f"fix-{i}-{topic}",
                         node_id=broker.node_id).start()
             for i in range(3)]
    try:
        # Each has read the (empty) DLT before the diversion: the others
        # must learn it from their DLT tails, not from their start-up read.
        for p in fleet:
            p.wait_ready()
        c.ck_produce(direct, topic, [c.Rec(0, -1, b"a", b'{"lat": 10}'),
                                     c.Rec(0, -1, b"b", b'{"lat": 95}'),
                                     c.Rec(0, -1, b"c", b'{"lat": 20}')])
        eps = [c.Endpoint(p.bootstrap, "proxy") for p in fleet]
        got = c.ck_consume_assign(eps[0], topic, [0], 2, timeout=30)
        assert [r.key for r in got] == [b"a", b"c"]
        # The fleet metrics: instance 0 wrote it, the others learned it
        # (within the tail delay; polled, as a loaded machine can be slow).
        from test_ops import http_get, metric
        name = "antidote_dlt_diversions_total"
        deadline = time.monotonic() + 15
        while True:
            scraped = [http_get(p.admin_port, "/metrics")[1] for p in fleet]
            learned = [metric(t, name, source="learned") for t in scraped]
            if learned == [0, 1, 1] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [metric(t, name, source="written") for t in scraped] == [1, 0, 0]
        assert learned == [0, 1, 1]
        assert [metric(t, "antidote_dlt_ledger_lag_records") for t in scraped] == [0, 0, 0]
        policy.write_text(POLICY.format(topic=topic, max_lat=100))
        for p in fleet:
            wait_for_log(p, "policies reloaded")
        for ep in eps[1:]:  # b is valid now, but it was diverted: never delivered
            got = c.kp_consume_assign(ep, topic, [0], 2, timeout=30)
            assert [r.key for r in got] == [b"a", b"c"], got
        time.sleep(1.0)  # nothing more arrives: b stays out
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda p: cli("dlt", "replay", "--config", str(p.config_path),
                                               "--topic", f"{topic}.dlt", "--execute"),
                                 fleet[:2]))
        counts = [final_counts(r) for r in runs]
        assert all(r.returncode == 0 for r in runs), runs
        assert sum(n["replayed"] for n in counts) == 1, (counts, [r.stderr[-3000:] for r in runs])
        assert sum(n["already replayed"] for n in counts) == 1, counts
        assert [r.key for r in read_all(broker.bootstrap, topic)] == [b"a", b"b", b"c", b"b"]
        time.sleep(1.0)
        # The DLT record b came from (after the writer's lease marker).
        (d,) = ps.read_dlt(direct, f"{topic}.dlt")
        for ep in eps:
            got = c.ck_consume_assign(ep, topic, [0], 3, timeout=30)
            assert [r.key for r in got] == [b"a", b"c", b"b"], got
            assert dict(got[2].headers)["x-replayed-from-dlt"] == \
                f"{topic}.dlt/0/{d.offset}".encode()
    finally:
        stop_fleet(fleet)


def test_two_concurrent_replays_of_thirty_records_write_each_once(workdir, broker):
    """Thirty diverted records, the policy fixed, then two `dlt replay
    --execute` of the whole DLT started at the same moment: the target gets
    each record once (the runs' lines say which wrote what)."""
    concurrent_replays(workdir, broker, 2)


def test_three_concurrent_replays_of_thirty_records_write_each_once(workdir, broker):
    """As above with three runs: leases taken back while another run's
    empty transaction is being aborted (CONCURRENT_TRANSACTIONS)."""
    concurrent_replays(workdir, broker, 3)


def concurrent_replays(workdir, broker, k: int) -> None:
    from test_ops import POLICY, OpsAntidote, cli, read_all
    from test_reload_replay import wait_for_log
    direct = c.Endpoint(broker.bootstrap)
    topic = f"fleet-replay-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(direct, topic, 1)
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    proxy = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        name=f"replay-{topic}", node_id=broker.node_id).start()
    try:
        n = 30
        c.ck_produce(direct, topic, [c.Rec(0, -1, b"k%d" % i, b'{"lat": 95}') for i in range(n)])
        ps.wait_high_watermark(broker.port, topic, 0, n)
        ps.fetch_partition(proxy.broker_port(), topic)  # diverts all thirty
        ps.wait_high_watermark(broker.port, f"{topic}.dlt", 0, n)
        policy.write_text(POLICY.format(topic=topic, max_lat=100))
        wait_for_log(proxy, "policies reloaded")
        args = ("dlt", "replay", "--config", str(proxy.config_path), "--topic", f"{topic}.dlt",
                "--execute")
        with ThreadPoolExecutor(k) as pool:
            runs = list(pool.map(lambda _: cli(*args), range(k)))
        assert all(r.returncode == 0 for r in runs), runs
        counts = [final_counts(r) for r in runs]
        assert sum(x["replayed"] for x in counts) == n, [r.stdout + r.stderr for r in runs]
        assert all(x["considered"] == n and x["failed"] == 0 for x in counts), counts
        # Every run held a fencing lease (none fell back to unfenced writes).
        assert not [r.stderr for r in runs if "no producer lease" in r.stderr], [
            ln for r in runs for ln in r.stderr.splitlines() if "lease" in ln]
        # Records, not offsets: each lease leaves an ABORT marker (a control
        # batch no consumer sees) in the target, so the end offset is more.
        time.sleep(0.5)
        got = read_all(broker.bootstrap, topic)
        replays = [r for r in got if dict(r.headers).get("x-replayed-from-dlt")]
        per_key = Counter(r.key for r in replays)
        hw = ps.high_watermark(broker.port, topic)
        assert len(got) == 2 * n and sorted(per_key.values()) == [1] * n, \
            f"{len(replays)} replays written for {n} DLT records ({counts}); " \
            f"twice: {[k for k, v in per_key.items() if v > 1]}; end offset {hw}"
        assert len({dict(r.headers)["x-replayed-from-dlt"] for r in replays}) == n
    finally:
        proxy.stop_and_check()
