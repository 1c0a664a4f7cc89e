"""Network faults between clients, proxies and brokers, Jepsen-style
(issue 51): a 3-node Kafka cluster, two antidote instances and their
clients, each in a network namespace of its own (netns_support.py,
jepsen_support.py), under a randomized, seeded fault schedule
(jepsen_schedule.py): partitions proxy-broker, proxy-DLT leader and
client-proxy, packet loss, delay and reordering, slow links, leader moves,
proxy and group member SIGKILL and restart. Meanwhile three producers write valid and
poison records (through each proxy's door and directly at the brokers) to
a topic of an `ordering: none` policy and one of an `ordering: per_key`
policy, and four consumer groups (classic and KIP-848, librdkafka and
Java, one member through each proxy) read both. After the faults heal,
the checker (jepsen_check.py) reads the whole history: the logs and DLTs
read back from the brokers, every producer acknowledgement and every
delivery.

Which schedules run:
  default (CI):                 the seeds in CI_SEEDS, plus
                                ANTIDOTE_JEPSEN_FRESH_SEED when set (scripts/test.sh
                                draws and prints one per run),
                                ANTIDOTE_JEPSEN_SECONDS (default 60) of faults each
  ANTIDOTE_JEPSEN_SEED=7,9      those seeds (a replay)
  ANTIDOTE_JEPSEN_SCHEDULES=50  fifty seeds drawn at random (printed)

Skipped, with the reason, where network namespaces cannot be made (not
root, no iproute2/iptables, no NFQUEUE); under CI=true that is a failure.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid

import pytest

import harness as h
import jepsen_check as jc
import jepsen_schedule as js
import jepsen_support as jx
import netns_support as ns
from test_java_clients import java_classes  # noqa: F401 (fixture)

pytestmark = h.needs_kafka

CI_SEEDS = [51001, 51002]
SECONDS = float(os.environ.get("ANTIDOTE_JEPSEN_SECONDS", "60"))
BOUND_S = 60.0       # a group reads everything, and no proxy holds a partition, this long after the heal
RATE = 12.0          # records per second per producer


def seeds() -> list[int]:
    if os.environ.get("ANTIDOTE_JEPSEN_SEED"):
        return [int(s) for s in os.environ["ANTIDOTE_JEPSEN_SEED"].split(",")]
    n = int(os.environ.get("ANTIDOTE_JEPSEN_SCHEDULES", "0"))
    if n:
        # Drawn from the run's id (conftest.py), so that every pytest-xdist
        # worker collects the same seeds.
        rng = random.Random(os.environ.get("PYTEST_XDIST_TESTRUNUID") or None)
        return [rng.randrange(1, 1 << 31) for _ in range(n)]
    fresh = os.environ.get("ANTIDOTE_JEPSEN_FRESH_SEED", "")
    return CI_SEEDS + ([int(fresh)] if fresh else [])


@pytest.fixture(scope="module")
def net(workdir):
    why = ns.unavailable()
    if why:
        if os.environ.get("CI") == "true" or os.environ.get("ANTIDOTE_CI_ENTRY") == "1":
            pytest.fail(f"network namespaces unavailable under CI: {why}")
        pytest.skip(f"network namespaces unavailable: {why}")
    n = ns.Net(dict(jx.NODES), workdir).create()
    yield n
    n.destroy()


@pytest.fixture(scope="module")
def jcluster(net, workdir):
    k = jx.NsCluster(workdir / "jepsen-cluster", net=net)
    k.start()
    try:
        k.ctl(h.ensure_transaction_coordinator, k.bootstrap, 60, timeout=90)
        k.ctl(k.ensure_offsets_topic, timeout=90)
        yield k
    finally:
        k.stop()


@pytest.fixture(scope="module")
def jproxies(net, jcluster, workdir):
    policy = jx.write_policies(workdir / "jepsen-policies")
    ps_ = {p: jx.start_proxy(net, workdir, jcluster, p, policy) for p in jx.PROXIES}
    yield ps_
    for p in ps_.values():
        p.stop_and_check(15)


def report(request, line: str) -> None:
    print(f"\n[jepsen] {line}", flush=True)
    request.node.user_properties.append(("jepsen", line))


def converge(work: jx.Workload, must: set, healed_wall_ms: int, bound: float
             ) -> dict[str, float]:
    """Wait (at most bound + 30 s) until each group has read every record
    of `must`; per group, seconds from the heal to the first read of the
    last of them (inf if some never came)."""
    deadline = time.monotonic() + bound + 30
    while True:
        ds = work.deliveries()
        done = {g: {(t, p, o) for t, p, o, _, _ in d} >= must for g, d in ds.items()}
        if all(done.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    out = {}
    for g, d in ds.items():
        first: dict = {}
        for t, p, o, _, ms in d:
            first.setdefault((t, p, o), ms)
        if not must <= set(first):
            out[g] = float("inf")
        else:
            last = max((first[k] for k in must), default=healed_wall_ms)
            out[g] = max(0.0, (last - healed_wall_ms) / 1000)
    return out


def held_after(proxies: dict, healed: float, bound: float) -> dict[str, float]:
    """Seconds after the heal until each proxy's held-partitions gauge read 0."""
    out = {}
    for name, p in proxies.items():
        deadline = healed + bound + 10
        while True:
            try:
                held = p.held()
            except Exception:  # noqa: BLE001 - admin listener restarting
                held = -1
            if held == 0 or time.monotonic() > deadline:
                out[name] = time.monotonic() - healed if held == 0 else float("inf")
                break
            time.sleep(0.5)
    return out


@pytest.mark.timeout(SECONDS + 420)
@pytest.mark.parametrize("seed", seeds())
def test_no_record_lost_or_leaked_under_a_fault_schedule(seed, net, jcluster, jproxies,
                                                         java_classes, workdir, request):
    steps = js.make_schedule(seed, SECONDS)
    report(request, f"seed {seed} (replay: ANTIDOTE_JEPSEN_SEED={seed}), faults "
                    f"{js.kinds_of(steps)}:\n" + "\n".join(f"  {s}" for s in steps))
    tag = f"s{seed}-{uuid.uuid4().hex[:6]}"
    plain, keyed = f"jx.plain.{tag}", f"jx.keyed.{tag}"
    topics = [plain, keyed, f"{plain}.dlt", f"{keyed}.dlt"]
    for t, assignment in zip(topics, ([[1, 2, 3], [2, 3, 1], [3, 1, 2]], [[2, 3, 1], [3, 1, 2]],
                                      [[3, 1, 2]], [[1, 2, 3]])):
        jcluster.ctl(jcluster.create_topic, t, assignment, timeout=90)
    run_dir = workdir / f"jepsen-{tag}"
    run_dir.mkdir()
    work = jx.Workload(net, run_dir, [plain, keyed], jproxies, jcluster, java_classes, seed)
    player = js.Player(net, jcluster, jproxies, topics, steps, seed, work=work)
    stop = threading.Event()
    try:
        work.start_members()
        time.sleep(3)
        work.start_producers(RATE)
        thread = threading.Thread(target=player.play, args=(stop,), daemon=True)
        thread.start()
        thread.join(SECONDS + 300)
        assert not thread.is_alive(), "the schedule did not finish"
        net.heal_all()
        crashed = {n: p.proc.returncode for n, p in jproxies.items() if p.proc.poll() is not None}
        for n in crashed:
            jproxies[n].start()
        healed, healed_wall_ms = time.monotonic(), int(time.time() * 1000)
        work.stop("producer", 120)

        rows = {t: jcluster.ctl(jx.read_topic, jcluster.bootstrap, t, timeout=120)
                for t in topics}
        log = jx.log_records(rows[plain] + rows[keyed])
        hist = jc.History(log=log, acks=work.acks(),
                          door_producers={f"{p}-" for p in jx.Workload.DOOR_PRODUCERS},
                          deliveries={}, dlt=[], per_key_topics={keyed}, bound_s=BOUND_S)
        must, _ = jc.expected(hist)
        hist.recovery_s = converge(work, set(must), healed_wall_ms, BOUND_S)
        hist.held_after_s = held_after(jproxies, healed, BOUND_S)
    finally:
        stop.set()
        work.stop("member", 60)
        net.heal_all()
    rows = {t: jcluster.ctl(jx.read_topic, jcluster.bootstrap, t, timeout=120)
            for t in topics[2:]}
    hist.dlt = jx.dlt_records(rows[topics[2]] + rows[topics[3]])
    # A group's reads in time order across its members (a partition handed
    # from one member to the other is read on by the second after the first).
    hist.deliveries = {g: [(t, p, o, rid) for t, p, o, rid, _ in sorted(d, key=lambda x: x[4])]
                       for g, d in work.deliveries().items()}
    anomalies = jc.check(hist)
    if crashed:
        anomalies.append(jc.Anomaly("proxy-exited", f"exit codes {crashed}"))
    if player.error:
        anomalies.append(jc.Anomaly("schedule-error", player.error[-2000:]))
    dead = {c.name: c.proc.returncode for c in work.clients
            if c.proc is not None and c.proc.returncode not in (0, None, -9)}
    if dead:
        anomalies.append(jc.Anomaly("client-exited", str(dead)))
    per_member = work.per_member()
    for proxy in jx.PROXIES:
        if not any(n for m, n in per_member.items() if m.endswith(proxy)):
            anomalies.append(jc.Anomaly("proxy-unused", f"no member read through {proxy}"))
    report(request, f"seed {seed}: {jc.summary(hist)}; per member {per_member}; "
                    f"client errors {work.errors()}")
    report(request, f"seed {seed}: {len(anomalies)} anomalies" +
           "".join(f"\n  {a}" for a in anomalies))
    for p in jproxies.values():
        p.assert_running()
    assert not anomalies, (f"seed {seed} (replay with ANTIDOTE_JEPSEN_SEED={seed}): "
                           + "; ".join(map(str, anomalies)) + "\nschedule:\n"
                           + "\n".join(player.events))


# ---------------------------------------------------------------------------
# The checker itself, on made-up histories (no cluster)
# ---------------------------------------------------------------------------

def _clean_history() -> jc.History:
    """Two topics; the keyed one with key b"a" blocked from offset 1 on."""
    L = jc.LogRec
    log = [L("t", 0, 0, b"x", "direct-1", "valid"), L("t", 0, 1, b"x", "direct-2", "lat"),
           L("t", 0, 2, b"x", "door1-3", "valid"),
           L("k", 0, 0, b"a", "direct-4", "valid"), L("k", 0, 1, b"a", "direct-5", "nan"),
           L("k", 0, 2, b"b", "door1-6", "valid"), L("k", 0, 3, b"a", "door2-7", "valid")]
    reads = [("t", 0, 0, "direct-1"), ("t", 0, 2, "door1-3"), ("k", 0, 0, "direct-4"),
             ("k", 0, 2, "door1-6")]
    return jc.History(
        log=log, acks=[("door1-3", "t", 0, 2), ("direct-4", "k", 0, 0)],
        door_producers={"door1-", "door2-"},
        deliveries={"g1": list(reads), "g2": reads[2:] + reads[:2]},
        dlt=[jc.DltRec("t", 0, 1, "poison"), jc.DltRec("k", 0, 1, "poison"),
             jc.DltRec("k", 0, 3, "blocked")],
        per_key_topics={"k"}, recovery_s={"g1": 3.0}, held_after_s={"p1": 1.0})


def test_the_checker_finds_each_anomaly():
    """A clean history has no anomaly; each way of breaking it is found
    (a checker that cannot fail would make the fault runs pass for nothing)."""
    import dataclasses
    base = _clean_history()
    assert jc.check(base) == [], jc.check(base)
    g1 = base.deliveries["g1"]

    def broken(**kw) -> set[str]:
        return {a.kind for a in jc.check(dataclasses.replace(base, **kw))}

    assert broken(deliveries={**base.deliveries, "g1": g1[1:]}) == {"lost"}
    assert broken(deliveries={**base.deliveries, "g1": g1 + [("t", 0, 1, "direct-2")]}) \
        == {"leaked", "reordered"}
    assert broken(deliveries={**base.deliveries, "g1": g1 + [("k", 0, 3, "door2-7")]}) \
        == {"leaked"}  # a record of a blocked key overtook it
    assert broken(deliveries={**base.deliveries, "g1": [g1[1], g1[0]] + g1[2:]}) \
        == {"reordered"}
    assert broken(deliveries={**base.deliveries, "g1": g1 + [g1[0]]}) == set()  # re-read
    assert broken(acks=base.acks + [("door1-9", "t", 0, 7)]) == {"acked-not-in-log"}
    assert broken(log=base.log + [jc.LogRec("t", 0, 3, b"y", "door2-8", "enum")]) \
        == {"door-leak", "dlt-missing"}
    assert broken(log=base.log + [jc.LogRec("t", 0, 3, b"y", "direct-1", "valid")]) \
        == {"duplicate-in-log", "lost"}
    assert broken(dlt=base.dlt[1:]) == {"dlt-missing"}
    assert broken(dlt=base.dlt + base.dlt[:1]) == {"dlt-duplicate"}
    assert broken(dlt=base.dlt + [jc.DltRec("t", 0, 0, "poison")]) == {"dlt-extra"}
    assert broken(dlt=base.dlt[:2] + [jc.DltRec("k", 0, 3, "poison")]) == {"dlt-class"}
    assert broken(recovery_s={"g1": 61.0}) == {"slow-recovery"}
    assert broken(held_after_s={"p1": float("inf")}) == {"held-after-heal"}


# ---------------------------------------------------------------------------
# Regressions of anomalies the schedules found
# ---------------------------------------------------------------------------

def test_a_proxy_cut_off_from_its_dlt_does_not_deliver_a_blocked_keys_later_record(
        net, jcluster, jproxies):
    """`ordering: per_key`: p1 diverts key K's record at offset 1 (K is
    blocked from then on) while p2 cannot reach the broker that leads the
    DLT, so p2's DLT follower cannot learn the block. A reader that goes on
    from offset 2 through p2 (a group member taking the partition over)
    must not get K's record at offset 2 before K's parked records: p2 holds
    the partition until it has read the DLT again, then diverts it as
    `blocked`, and delivers the other key's record."""
    tag = uuid.uuid4().hex[:6]
    topic = f"jx.keyed.cut-{tag}"
    dlt = f"{topic}.dlt"
    jcluster.ctl(jcluster.create_topic, topic, [[1, 2, 3]], timeout=90)  # led by b1
    jcluster.ctl(jcluster.create_topic, dlt, [[3, 1, 2]], timeout=90)    # led by b3
    p1, p2 = jproxies["p1"], jproxies["p2"]
    direct = jcluster.bootstrap
    net.run_in("c1", jx.produce_direct, direct, topic, [(tag, 0, "valid", "K")], timeout=60)
    # p2 serves the topic first, so it has loaded its (empty) DLT.
    got = net.run_in("c1", jx.read_from, p2.bootstrap, topic, 0, 3.0, timeout=30)
    assert got == [(0, f"{tag}-0")], got
    net.run_in("c1", jx.produce_direct, direct, topic, [(tag, 1, "lat", "K")], timeout=60)
    cut = net.partition("p2", "b3", "drop")
    try:
        time.sleep(1.0)
        got = net.run_in("c1", jx.read_from, p1.bootstrap, topic, 0, 4.0, timeout=30)
        assert got == [(0, f"{tag}-0")], got
        net.run_in("c1", jx.produce_direct, direct, topic,
                   [(tag, 2, "valid", "K"), (tag, 3, "valid", "L")], timeout=60)
        got = net.run_in("c1", jx.read_from, p2.bootstrap, topic, 2, 6.0, timeout=30)
        assert (2, f"{tag}-2") not in got, \
            f"p2 delivered K's record at offset 2 while K is blocked at offset 1: {got}"
    finally:
        cut.heal()
    got = net.run_in("c1", jx.read_from, p2.bootstrap, topic, 2, 8.0, timeout=30)
    assert got == [(3, f"{tag}-3")], got
    rows = jcluster.ctl(jx.read_topic, jcluster.bootstrap, dlt, timeout=60)
    assert sorted((d.offset, d.klass) for d in jx.dlt_records(rows)) == \
        [(1, "poison"), (2, "blocked")]
