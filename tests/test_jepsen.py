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
# A group reads everything, and no proxy holds a partition, this long after
# the heal: session timeout + metadata refresh + dead_letter.timeout + margin
# (jepsen_support.recovery_bound_s).
BOUND_S = jx.recovery_bound_s()
RATE = 12.0          # records per second per producer
# The least a run must show (a run under them proved little): at RATE for
# SECONDS, each producer sends ~RATE * SECONDS records, one in ten poison.
MINIMUMS = jc.Minimums(acks_per_producer=int(RATE * SECONDS * 0.3),
                       door_refusals_per_door=max(3, int(RATE * SECONDS * 0.1 * 0.2)),
                       dlt_writes=max(10, int(RATE * SECONDS * 0.1 * 0.3)), blocked=3)


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
        done = {g: {(d.topic, d.partition, d.offset) for d in dl} >= must
                for g, dl in ds.items()}
        if all(done.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    out = {}
    for g, dl in ds.items():
        first: dict = {}
        for d in dl:
            first.setdefault((d.topic, d.partition, d.offset), d.ms)
        if not must <= set(first):
            out[g] = float("inf")
        else:
            last = max((first[k] for k in must), default=healed_wall_ms)
            out[g] = max(0.0, (last - healed_wall_ms) / 1000)
    return out


def held_after(proxies: dict, healed: float, bound: float) -> dict[str, float]:
    """Seconds after the heal until each proxy's held-partitions gauge read 0
    (the proxies polled in turn, every 0.5 s)."""
    out: dict[str, float] = {}
    deadline = healed + bound + 10
    while len(out) < len(proxies):
        for name, p in proxies.items():
            if name in out:
                continue
            try:
                held = p.held()
            except Exception:  # noqa: BLE001 - admin listener restarting
                held = -1
            if held == 0:
                out[name] = time.monotonic() - healed
        if time.monotonic() > deadline:
            return {**{n: float("inf") for n in proxies}, **out}
        if len(out) < len(proxies):
            time.sleep(0.5)
    return out


def _size(path) -> int:
    return path.stat().st_size if path.exists() else 0


@pytest.mark.timeout(SECONDS + 480)
@pytest.mark.parametrize("seed", seeds())
def test_no_record_lost_or_leaked_under_a_fault_schedule(seed, net, jcluster, jproxies,
                                                         java_classes, workdir, request):
    steps = js.make_schedule(seed, SECONDS)
    report(request, f"seed {seed} (replay: ANTIDOTE_JEPSEN_SEED={seed}), faults "
                    f"{js.kinds_of(steps)}, recovery bound {BOUND_S:.0f} s "
                    f"({jx.SESSION_TIMEOUT_S} session + "
                    f"{max(jx.CLIENT_METADATA_REFRESH_S, jx.PROXY_METADATA_REFRESH_S)} metadata "
                    f"+ {jx.DLT_TIMEOUT_S} dead_letter.timeout + {jx.RECOVERY_MARGIN_S} margin):\n"
                    + "\n".join(f"  {s}" for s in steps))
    for n, p in jproxies.items():
        assert p.proc is not None and p.proc.poll() is None, \
            f"proxy {n} exited before the run (code {p.proc and p.proc.returncode})"
    log_from = {p.log: _size(p.log) for p in jproxies.values()}
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
    anomalies: list[jc.Anomaly] = []
    try:
        work.start_members()
        time.sleep(3)
        work.start_producers(RATE)
        thread = threading.Thread(target=player.play, args=(stop,), daemon=True)
        thread.start()
        thread.join(SECONDS + 300)
        assert not thread.is_alive(), "the schedule did not finish"
        left = net.heal_all()
        if left:
            anomalies.append(jc.Anomaly("fault-without-effect", "; ".join(left)))
        # A proxy not running now exited by itself (the last kill step's
        # restart ran at its heal): an anomaly; started again for the rest.
        crashed = {n: p.proc.returncode for n, p in jproxies.items() if p.proc.poll() is not None}
        for n in crashed:
            jproxies[n].start()
        healed, healed_wall_ms = time.monotonic(), int(time.time() * 1000)
        work.stop("producer", 120)

        rows = {t: jcluster.ctl(jx.read_topic, jcluster.bootstrap, t, timeout=120)
                for t in topics[:2]}
        hist = jx.build_history(rows, topics[:2], [], {keyed}, work.outcomes(), {}, {}, BOUND_S)
        must, _ = jc.expected(hist)
        # The proxies' gauges are watched from the heal on, while the groups
        # catch up (not after them, which would count their time too).
        held_s: dict = {}
        watch = threading.Thread(target=lambda: held_s.update(held_after(jproxies, healed,
                                                                         BOUND_S)),
                                 daemon=True)
        watch.start()
        recovery_s = converge(work, set(must), healed_wall_ms, BOUND_S)
        watch.join(BOUND_S + 60)
    finally:
        stop.set()
        work.stop("member", 60)
        net.heal_all()
    rows.update({t: jcluster.ctl(jx.read_topic, jcluster.bootstrap, t, timeout=120)
                 for t in topics[2:]})
    hist = jx.build_history(
        rows, topics[:2], topics[2:], {keyed}, work.outcomes(), work.deliveries(),
        jx.excuses(work.group_nodes(), work.group_of(), work.rebalances(), player.windows),
        BOUND_S)
    hist.recovery_s, hist.held_after_s = recovery_s, held_s
    anomalies += jc.check(hist) + jc.too_little(hist, MINIMUMS)
    if crashed:
        anomalies.append(jc.Anomaly("proxy-exited", f"exit codes {crashed}"))
    if player.error:
        anomalies.append(jc.Anomaly("schedule-error", player.error[-2000:]))
    if player.ineffective:
        anomalies.append(jc.Anomaly("fault-without-effect", "; ".join(player.ineffective)))
    idle = js.unexercised(player.windows, player.proofs)
    if idle:
        anomalies.append(jc.Anomaly("fault-not-exercised",
                                    f"every fault of these kinds met an idle link: {idle}"))
    dead = {c.name: c.proc.returncode for c in work.clients
            if c.proc is not None and c.proc.returncode not in (0, None)
            and not (c.proc.returncode == -9 and c.killed)}
    if dead:
        anomalies.append(jc.Anomaly("client-exited", str(dead)))
    panicked = jx.panics(list(log_from), log_from) + jx.panics(work.logs())
    if panicked:
        anomalies.append(jc.Anomaly("panic", "; ".join(panicked[:10])))
    per_member = work.per_member()
    for proxy in jx.PROXIES:
        if not any(n for m, n in per_member.items() if m.endswith(proxy)):
            anomalies.append(jc.Anomaly("proxy-unused", f"no member read through {proxy}"))
    report(request, f"seed {seed}: {jc.summary(hist)}; per member {per_member}; "
                    f"client errors {work.errors()}; proxies killed {player.killed_proxies}")
    report(request, f"seed {seed}: fault proofs:" + "".join(
        f"\n  {kind}: {what}: {seen}" for kind, what, _ok, _n, _t, seen in player.proofs))
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

def _rec(topic, p, o, key, rid, kind) -> jc.LogRec:
    from jepsen_worker import record
    tag, n = rid.rsplit("-", 1)
    k, v, hs = record(tag, int(n), kind, key.decode())
    return jc.LogRec(topic, p, o, k, rid, kind, v, tuple(hs))


def _dlt_of(r: jc.LogRec, klass: str = "poison", **kw) -> jc.DltRec:
    return jc.DltRec(r.topic, r.partition, r.offset, klass, kw.pop("rule", "/lat"), r.key,
                     r.value, r.headers, r.rid, **kw)


def _clean_history() -> jc.History:
    """Two topics; the keyed one with key b"a" blocked from offset 1 on."""
    log = [_rec("t", 0, 0, b"x", "direct-1", "valid"), _rec("t", 0, 1, b"x", "direct-2", "lat"),
           _rec("t", 0, 2, b"x", "door1-3", "valid"),
           _rec("k", 0, 0, b"a", "direct-4", "valid"), _rec("k", 0, 1, b"a", "direct-5", "nan"),
           _rec("k", 0, 2, b"b", "door1-6", "valid"), _rec("k", 0, 3, b"a", "door2-7", "valid")]
    D = jc.Delivery
    reads = [D("t", 0, 0, "direct-1", 1000, "m1"), D("t", 0, 2, "door1-3", 2000, "m1"),
             D("k", 0, 0, "direct-4", 3000, "m1"), D("k", 0, 2, "door1-6", 4000, "m1")]
    O = jc.Outcome
    produced = [O("direct-1", "t", "valid", False, "ack", 0, 0),
                O("direct-2", "t", "lat", False, "ack", 0, 1),
                O("door1-3", "t", "valid", True, "ack", 0, 2),
                O("door1-8", "t", "enum", True, "INVALID_RECORD"),
                O("direct-4", "k", "valid", False, "ack", 0, 0),
                O("direct-5", "k", "nan", False, "ack", 0, 1),
                O("door1-6", "k", "valid", True, "ack", 0, 2),
                O("door2-7", "k", "valid", True, "ack", 0, 3)]
    return jc.History(
        log=log, produced=produced,
        deliveries={"g1": list(reads), "g2": reads[2:] + reads[:2]},
        dlt=[_dlt_of(log[1]), _dlt_of(log[4]), _dlt_of(log[6], "blocked")],
        per_key_topics={"k"}, excuses={"g1": [(5000, 9000, "partition p1|b2 (drop)")]},
        recovery_s={"g1": 3.0}, held_after_s={"p1": 1.0})


def test_the_checker_finds_each_anomaly():
    """A clean history has no anomaly; each way of breaking it is found
    (a checker that cannot fail would make the fault runs pass for nothing)."""
    import dataclasses
    base = _clean_history()
    assert jc.check(base) == [], jc.check(base)
    g1 = base.deliveries["g1"]
    D, O = jc.Delivery, jc.Outcome

    def broken(**kw) -> set[str]:
        return {a.kind for a in jc.check(dataclasses.replace(base, **kw))}

    def reads(*extra) -> dict:
        return {**base.deliveries, "g1": g1 + list(extra)}

    assert broken(deliveries={**base.deliveries, "g1": g1[1:]}) == {"lost"}
    assert broken(deliveries=reads(D("t", 0, 1, "direct-2", 4500))) == {"leaked", "reordered"}
    assert broken(deliveries=reads(D("k", 0, 3, "door2-7", 4500))) \
        == {"leaked"}  # a record of a blocked key overtook it
    assert broken(deliveries={**base.deliveries, "g1": [g1[1], g1[0]] + g1[2:]}) \
        == {"reordered"}
    # Read again: with nothing of the group's own between the two reads, a
    # redelivery; with a rebalance, a kill or a fault of its own between
    # them, none (g1's excuse runs from 5000 to 9000 ms, 1 s slack).
    assert broken(deliveries=reads(D("t", 0, 0, "direct-1", 3500, "m2"))) == {"redelivered"}
    assert broken(deliveries=reads(D("t", 0, 0, "direct-1", 6000, "m2"))) == set()
    assert broken(deliveries=reads(D("t", 0, 2, "door1-3", 4100))) == set()  # slack
    assert broken(deliveries={**base.deliveries,
                              "g2": base.deliveries["g2"] + [D("t", 0, 0, "direct-1", 6000)]}) \
        == {"redelivered"}  # g1's fault is not g2's
    # The record at a position is not the one the log holds there.
    assert broken(deliveries={**base.deliveries, "g1": [D("t", 0, 0, "door2-9", 1000)] + g1[1:]}) \
        == {"wrong-record", "lost"}
    assert broken(deliveries=reads(D("t", 0, 9, "door2-9", 4500))) == {"delivery-not-in-log"}
    # Producers' outcomes.
    assert broken(produced=base.produced + [O("door1-9", "t", "valid", True, "ack", 0, 7)]) \
        == {"acked-not-in-log"}
    assert broken(produced=base.produced + [O("door2-9", "t", "valid", True, "INVALID_RECORD")]) \
        == {"valid-refused"}
    assert broken(produced=base.produced + [O("door2-9", "t", "valid", True, "timeout")]) \
        == {"valid-unacknowledged"}
    assert broken(produced=base.produced + [O("door2-9", "t", "lat", True, "ack", 0, 9)]) \
        == {"door-leak", "acked-not-in-log"}
    assert broken(produced=base.produced + [O("door2-9", "t", "lat", True, "NOT_LEADER")]) \
        == {"door-refusal-error"}
    door_poison = _rec("t", 0, 3, b"y", "door2-8", "enum")
    assert broken(log=base.log + [door_poison],
                  produced=base.produced + [O("door2-8", "t", "enum", True, "timeout")]) \
        == {"door-leak", "dlt-missing"}
    assert broken(log=base.log + [dataclasses.replace(base.log[0], offset=3)]) \
        == {"duplicate-in-log", "lost"}
    # DLTs.
    assert broken(dlt=base.dlt[1:]) == {"dlt-missing"}
    assert broken(dlt=base.dlt + base.dlt[:1]) == {"dlt-duplicate"}
    assert broken(dlt=base.dlt + [_dlt_of(base.log[0])]) == {"dlt-extra"}
    assert broken(dlt=base.dlt[:2] + [_dlt_of(base.log[6])]) == {"dlt-class"}
    d0 = base.dlt[0]
    for wrong in (dataclasses.replace(d0, value=d0.value.replace(b"91.5", b"91.6")),
                  dataclasses.replace(d0, key=b"z"), dataclasses.replace(d0, rid="direct-9"),
                  dataclasses.replace(d0, headers=d0.headers[1:])):
        assert broken(dlt=[wrong] + base.dlt[1:]) == {"dlt-wrong-record"}, wrong
    # ... but a redacted record and a whole batch keep none of those bytes.
    assert broken(dlt=[dataclasses.replace(d0, klass="redact", key=None, value=None,
                                           headers=(), rid="?")] + base.dlt[1:]) \
        == {"dlt-class"}
    assert broken(dlt=[dataclasses.replace(d0, rule="batch", value=b"raw", headers=())]
                  + base.dlt[1:]) == set()
    assert broken(recovery_s={"g1": base.bound_s + 1}) == {"slow-recovery"}
    assert broken(held_after_s={"p1": float("inf")}) == {"held-after-heal"}
    # Too little activity.
    assert jc.too_little(base, jc.Minimums(1, 0, 3, 1)) == []
    for m, says in ((jc.Minimums(2, 0, 3, 1), "acks of door2: 1 < 2"),
                    (jc.Minimums(1, 1, 3, 1), "door refusals of door2: 0 < 1"),
                    (jc.Minimums(1, 0, 4, 1), "DLT writes: 3 < 4"),
                    (jc.Minimums(1, 0, 3, 2), "blocked records: 1 < 2")):
        short = jc.too_little(base, m)
        assert [a.kind for a in short] == ["too-little"] and says in str(short[0]), short


def test_the_history_is_built_from_what_the_clients_wrote(tmp_path):
    """jepsen_support's history building, from the files the clients write
    and the rows read back, into anomalies: a producer's refusal and its
    missing answer, a DLT record whose value is not the log's, a Java
    member's redelivery with and without a rebalance between its reads."""
    import base64
    import io
    import json as _json
    from jepsen_worker import record
    topic, dlt = "jx.plain.t", "jx.plain.t.dlt"
    recs = {n: record("door1", n, kind, "k1") for n, kind in ((1, "valid"), (2, "lat"),
                                                                (3, "valid"), (4, "valid"))}
    rows = {topic: [(topic, 0, i, recs[n][0], recs[n][1], tuple(recs[n][2]))
                    for i, n in enumerate((1, 3))],
            dlt: []}
    # A direct poison record at offset 2, diverted: its DLT copy in a
    # format-2 frame (original headers, context headers, trailer).
    poison = record("direct", 5, "nan", "k2")
    rows[topic].append((topic, 0, 2, poison[0], poison[1], tuple(poison[2])))

    def dlt_row(value: bytes) -> tuple:
        ctx = [("x-original-topic", topic.encode()), ("x-original-partition", b"0"),
               ("x-original-offset", b"2"), ("x-error-class", b"poison"),
               ("x-error-rule", b"/lat")]
        return (dlt, 0, 0, poison[0], value,
                tuple(poison[2]) + tuple(ctx) + (("x-antidote-context", b"2 5"),))

    def lines(path, *objs):
        path.write_text("".join(_json.dumps(o) + "\n" for o in objs) + '{"cut by a kill')
        return path

    prod = lines(tmp_path / "door1.jsonl",
                 {"sent": "door1-1", "t": topic, "k": "valid"},
                 {"sent": "door1-2", "t": topic, "k": "lat"},
                 {"ack": "door1-1", "t": topic, "k": "valid", "p": 0, "o": 0},
                 {"nack": "door1-2", "t": topic, "k": "lat", "e": "INVALID_RECORD"},
                 {"sent": "door1-3", "t": topic, "k": "valid"},
                 {"ack": "door1-3", "t": topic, "k": "valid", "p": 0, "o": 1},
                 {"sent": "door1-4", "t": topic, "k": "valid"},
                 {"flushed": 1})
    outcomes = jx.producer_outcomes(prod, door=True)
    assert {o.rid: o.result for o in outcomes} == {
        "door1-1": "ack", "door1-2": "INVALID_RECORD", "door1-3": "ack", "door1-4": "timeout"}
    # A Java member's history, stamped as _stamp stamps it.
    b64 = [base64.b64encode(recs[n][1]).decode() for n in (1, 3)]
    raw = "".join(_json.dumps(o) + "\n" for o in (
        {"assigned": 1}, {"d": [topic, 0, 0, b64[0], 1000]}, {"d": [topic, 0, 1, b64[1], 1100]},
        {"revoked": 1}, {"assigned": 1})).encode()
    java = tmp_path / "java-classic-p1.jsonl"
    jx._stamp(io.BytesIO(raw), java)
    stamped = [_json.loads(ln) for ln in java.read_text().splitlines()]
    assert all("ms" in o for o in stamped), stamped
    ds, rebalances = jx.member_history(java, "java-classic-p1", java=True)
    assert [(d.offset, d.rid) for d in ds] == [(0, "door1-1"), (1, "door1-3")]
    assert len(rebalances) == 3
    again = lines(tmp_path / "rdk-classic-p2.jsonl",
                  {"d": [topic, 0, 1, "door1-3", rebalances[-1] + 5000]})
    ds2, _ = jx.member_history(again, "rdk-classic-p2", java=False)
    members = {"java-classic-p1": "java-classic", "rdk-classic-p2": "java-classic"}
    nodes = {"java-classic": {"c1", "p1", "c2", "p2"}}

    def history(dlt_value: bytes, rebalances_=None, windows=()):
        ex = jx.excuses(nodes, members, rebalances_ or {}, list(windows))
        return jx.build_history({**rows, dlt: [dlt_row(dlt_value)]}, [topic], [dlt], set(),
                                outcomes, {"java-classic": sorted(ds + ds2, key=lambda d: d.ms)},
                                ex, 60)

    kinds = {a.kind for a in jc.check(history(poison[1]))}
    # door1-4 got no answer; the second read of offset 1 has no excuse.
    assert kinds == {"valid-unacknowledged", "redelivered"}, kinds
    kinds = {a.kind for a in jc.check(history(poison[1] + b" "))}
    assert kinds == {"valid-unacknowledged", "redelivered", "dlt-wrong-record"}, kinds
    far = ds2[0].ms - 2000
    assert {a.kind for a in jc.check(history(poison[1], {"java-classic-p1": [far]}))} \
        == {"valid-unacknowledged"}
    window = {"what": "partition c2|p2 (drop)", "kind": "partition-client-proxy",
              "nodes": ["c2", "p2"], "from_ms": far, "to_ms": far + 100}
    assert {a.kind for a in jc.check(history(poison[1], windows=[window]))} \
        == {"valid-unacknowledged"}
    assert {a.kind for a in jc.check(history(poison[1], windows=[{**window, "nodes": ["b1"]}]))} \
        == {"valid-unacknowledged", "redelivered"}
    # A refused valid record, as the producer's line says it.
    refused = lines(tmp_path / "door2.jsonl", {"sent": "door2-1", "t": topic, "k": "valid"},
                    {"nack": "door2-1", "t": topic, "k": "valid", "e": "INVALID_RECORD"})
    h2 = jx.build_history(rows, [topic], [], set(), jx.producer_outcomes(refused, True), {}, {},
                          60)
    assert "valid-refused" in {a.kind for a in jc.check(h2)}
    # Panics in a log, from an offset on.
    log = tmp_path / "proxy.log"
    log.write_text("fine\nthread 'x' panicked at src/a.rs:1:2:\nboom\n")
    assert jx.panics([log]) and not jx.panics([log], {log: log.stat().st_size})


def test_a_member_the_schedule_killed_is_no_crash_but_one_that_exited_by_itself_is(tmp_path):
    """Seed 1048632774: one step's two kill-member faults picked the same
    member, and the second took the first's kill for a crash. A member the
    schedule killed stays killed; one that exited by itself is an error."""
    import subprocess
    import sys
    work = jx.Workload(None, tmp_path, [], {}, None, None, 0)
    for name, code in (("m-killed", "import time; time.sleep(60)"), ("m-crashed", "pass")):
        c = jx.Client(name, "c1", "member", "g", tmp_path / f"{name}.jsonl")
        c.proc = subprocess.Popen([sys.executable, "-c", code])
        work.clients.append(c)
    try:
        assert work.kill_member("m-killed") is True
        assert work.kill_member("m-killed") is False
        work.clients[1].proc.wait(30)
        with pytest.raises(h.HarnessError, match="m-crashed had exited by itself"):
            work.kill_member("m-crashed")
    finally:
        for c in work.clients:
            if c.proc.poll() is None:
                c.proc.kill()


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
        # Cut off, p2 cannot tell whether K is blocked: it holds the
        # partition at offset 2 (L's record behind it waits too).
        assert got == [], got
    finally:
        cut.heal()
    # The fault took effect: p2's DLT reads were dropped.
    assert cut.matched > 0, cut.seen
    got = net.run_in("c1", jx.read_from, p2.bootstrap, topic, 2, 8.0, timeout=30)
    assert got == [(3, f"{tag}-3")], got
    rows = jcluster.ctl(jx.read_topic, jcluster.bootstrap, dlt, timeout=60)
    assert sorted((d.offset, d.klass) for d in jx.dlt_records(rows)) == \
        [(1, "poison"), (2, "blocked")]
