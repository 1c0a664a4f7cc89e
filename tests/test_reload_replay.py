"""Hot reload and the replay round trip, against a real broker.

A record is diverted under a strict policy; the policy file is fixed and the
running proxy reloads it; the record is replayed from its DLT with
`antidote dlt replay`; a consumer through the proxy then receives it exactly
once (the replayed copy: the original stays out, since it was diverted).
Also: a policy file that does not compile is rejected on reload with its
file:line:column, and the running policies stay in force; SIGHUP reloads.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid

import pytest

from clients import Endpoint, Rec, ck_consume_assign, ck_create_topic, ck_produce
from harness import stop_process
from poison_support import without_markers
from test_ops import POLICY, OpsAntidote, cli, ok, read_all


def log_text(proxy) -> str:
    return proxy.log.read_text(errors="replace")


def wait_for_log(proxy, text: str, count: int = 1, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log_text(proxy).count(text) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not logged {count}x within {timeout}s\n{log_text(proxy)[-3000:]}")


def replay_counts(out: str) -> dict[str, int]:
    """The numbers of `dlt replay`'s summary line (src/cli/dlt/replay/mod.rs), by name:
    `replay: 1 considered, 1 replayed, 0 already replayed, ...`."""
    line = next((ln for ln in out.splitlines() if ln.startswith("replay: ")), None)
    assert line is not None, f"no summary line in {out!r}"
    return {name: int(n) for n, name in re.findall(r"(\d+) ([a-z ]+?)(?:,|$)", line[8:])}


@pytest.fixture
def strict(workdir, broker):
    topic = f"reload-{uuid.uuid4().hex[:8]}"
    ck_create_topic(Endpoint(broker.bootstrap), topic, 1)
    policy = workdir / f"{topic}.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    proxy = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        name=f"reload-{topic}")
    proxy.start()
    try:
        yield proxy, topic, policy, broker
    finally:
        proxy.stop_and_check()


def test_a_fixed_policy_and_a_replay_deliver_the_record_exactly_once(strict):
    proxy, topic, policy, broker = strict
    direct = Endpoint(broker.bootstrap)
    ck_produce(direct, topic, [
        Rec(0, -1, b"a", b'{"lat": 10}', (), 1_700_000_000_001),
        Rec(0, -1, b"b", b'{"lat": 95}', (("trace", b"t"),), 1_700_000_000_002),
        Rec(0, -1, b"c", b'{"lat": 20}', (), 1_700_000_000_003),
    ])
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2, timeout=60)
    assert [r.key for r in got] == [b"a", b"c"]
    assert [r.key for r in without_markers(read_all(broker.bootstrap, f"{topic}.dlt"))] == [b"b"]

    # Fix the policy (lat up to 100): the running proxy reloads it by itself.
    policy.write_text(POLICY.format(topic=topic, max_lat=100))
    wait_for_log(proxy, "policies reloaded")

    r = cli("dlt", "replay", "--config", str(proxy.config_path), "--topic", f"{topic}.dlt",
            "--execute")
    out = ok(r) + r.stderr  # the per-record lines on stdout, the summary on stderr
    assert replay_counts(out) == {"considered": 1, "replayed": 1, "already replayed": 0,
                                  "still invalid": 0, "refused": 0, "failed": 0}, out
    # Through the proxy, from the start: the original (diverted) record stays
    # out, the replayed copy comes in once, after the others.
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 3, timeout=60)
    assert [r.key for r in got] == [b"a", b"c", b"b"], got
    replayed = dict(got[2].headers)
    [b_at] = [r.offset for r in without_markers(read_all(broker.bootstrap, f"{topic}.dlt"))]
    assert replayed["x-replayed-from-dlt"] == f"{topic}.dlt/0/{b_at}".encode()
    assert replayed["x-attempt"] == b"1" and replayed["trace"] == b"t"
    # Replaying again adds nothing.
    r = cli("dlt", "replay", "--config", str(proxy.config_path), "--topic", f"{topic}.dlt",
            "--execute")
    out = ok(r) + r.stderr
    assert replay_counts(out)["replayed"] == 0 and replay_counts(out)["already replayed"] == 1, out
    assert [r.key for r in read_all(broker.bootstrap, topic)] == [b"a", b"b", b"c", b"b"]


def test_a_policy_that_does_not_compile_is_rejected_and_the_old_one_stays(strict):
    proxy, topic, policy, broker = strict
    policy.write_text(POLICY.format(topic=topic, max_lat=90) + "    bogus_key: 1\n")
    wait_for_log(proxy, "policy reload rejected")
    assert f"{policy}:" in log_text(proxy) and "bogus_key" in log_text(proxy)
    ck_produce(Endpoint(broker.bootstrap), topic, [Rec(0, -1, b"p", b'{"lat": 95}', (), 1_700_000_000_001),
                                                   Rec(0, -1, b"v", b'{"lat": 5}', (), 1_700_000_000_002)])
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 1, timeout=60)
    assert [r.key for r in got] == [b"v"], "the running policy should still divert lat 95"


def rewrite_keeping_size_and_mtime(path, text: str) -> None:
    """Change a policy file so that only SIGHUP can notice: the poll compares
    size and modification time (src/proxy/reload.rs), so keep both."""
    st = path.stat()
    assert len(text.encode()) == st.st_size, "the new text must keep the file's size"
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_sighup_applies_a_changed_policy_and_drops_verdicts_cached_under_the_old_one(strict):
    """Stricter after SIGHUP (max lat 90 -> 80): a record that passed (lat 85)
    is now diverted when read again, so the cached "valid" verdict of its
    batch was not reused; a record the old policy passed is judged anew."""
    proxy, topic, policy, broker = strict
    direct = Endpoint(broker.bootstrap)
    ck_produce(direct, topic, [Rec(0, -1, b"v", b'{"lat": 5}', (), 1_700_000_000_001),
                               Rec(0, -1, b"m", b'{"lat": 85}', (), 1_700_000_000_002)])
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2, timeout=60)
    assert [r.key for r in got] == [b"v", b"m"]

    rewrite_keeping_size_and_mtime(policy, POLICY.format(topic=topic, max_lat=80))
    time.sleep(2.5)  # two polls: the file watcher must not see this change
    assert "policies reloaded" not in log_text(proxy), "the poll saw a same-size, same-mtime edit"
    proxy.proc.send_signal(signal.SIGHUP)
    wait_for_log(proxy, "policies reloaded")
    assert "SIGHUP" in log_text(proxy)

    # A valid record after it bounds the read: everything before it has come.
    ck_produce(direct, topic, [Rec(0, -1, b"w", b'{"lat": 6}', (), 1_700_000_000_003)])
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2, timeout=60,
                            until=lambda recs: any(r.key == b"w" for r in recs))
    assert [r.key for r in got] == [b"v", b"w"], got
    assert [r.key for r in without_markers(read_all(broker.bootstrap, f"{topic}.dlt"))] == [b"m"]
    proxy.assert_running()


def test_sighup_applies_a_looser_policy_to_records_read_after_it(strict):
    """Looser after SIGHUP (max lat 90 -> 99): lat 95 is diverted before and a
    new lat 95 record passes after."""
    proxy, topic, policy, broker = strict
    direct = Endpoint(broker.bootstrap)
    ck_produce(direct, topic, [Rec(0, -1, b"p", b'{"lat": 95}', (), 1_700_000_000_001),
                               Rec(0, -1, b"v", b'{"lat": 5}', (), 1_700_000_000_002)])
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 1, timeout=60)
    assert [r.key for r in got] == [b"v"]

    rewrite_keeping_size_and_mtime(policy, POLICY.format(topic=topic, max_lat=99))
    proxy.proc.send_signal(signal.SIGHUP)
    wait_for_log(proxy, "policies reloaded")
    ck_produce(direct, topic, [Rec(0, -1, b"q", b'{"lat": 95}', (), 1_700_000_000_003)])
    got = ck_consume_assign(Endpoint(proxy.bootstrap, "proxy"), topic, [0], 2, timeout=60)
    # The diverted original stays out (the ledger); the new one passes.
    assert [r.key for r in got] == [b"v", b"q"], got
    assert [r.key for r in without_markers(read_all(broker.bootstrap, f"{topic}.dlt"))] == [b"p"]


def test_hot_reloads_under_load_lose_and_duplicate_nothing_and_the_last_policy_rules(
        workdir, broker, tmp_path, request):
    """A producer writes ~12 records/s to 3 partitions (lat 5: always valid;
    lat 95: valid only under the lax policy) while one consumer reads through
    the proxy and the policy file flips between lax (max 99) and strict
    (max 90) six times. Every always-valid record arrives exactly once; every
    lat-95 record is delivered or dead-lettered, never both, never twice;
    and after the last (strict) reload lat 95 is diverted."""
    import threading

    import confluent_kafka as ck

    topic = f"reload-load-{uuid.uuid4().hex[:8]}"
    direct = Endpoint(broker.bootstrap)
    ck_create_topic(direct, topic, 3)
    policy = tmp_path / "load.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    proxy = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        name=f"reload-load-{topic}")
    proxy.start()
    # A failed assert below must not leave the proxy running.
    request.addfinalizer(lambda: proxy.proc.poll() is None and stop_process(proxy.proc))
    stop = threading.Event()             # the load producer stops
    finish = threading.Event()           # the reader may stop once it has everything
    sent: dict[bytes, int] = {}          # key -> lat
    got: list[tuple[int, bytes]] = []    # (partition, key) in arrival order
    errors: list[str] = []

    def produce(keys: range, phase: str) -> None:
        p = ck.Producer(direct.ck(**{"linger.ms": 5}))
        for i in keys:
            if stop.is_set() and phase == "load":
                break
            lat = 95 if i % 4 == 1 else 5
            k = f"{phase}-{i}".encode()
            sent[k] = lat
            p.produce(topic, key=k, value=f'{{"lat": {lat}}}'.encode(), partition=i % 3)
            p.poll(0)
            time.sleep(0.08 if phase == "load" else 0)
        assert p.flush(30) == 0

    def consume() -> None:
        c = ck.Consumer(Endpoint(proxy.bootstrap, "proxy").ck(**{
            "group.id": f"load-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}))
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(3)])
        try:
            while not (finish.is_set() and done()):
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() != ck.KafkaError._PARTITION_EOF:
                        errors.append(str(m.error()))
                    continue
                got.append((m.partition(), m.key()))
        finally:
            c.close()

    def done() -> bool:
        valid = {k for k, lat in sent.items() if lat == 5}
        return valid <= {k for _, k in got}

    producer = threading.Thread(target=produce, args=(range(400), "load"))
    reader = threading.Thread(target=consume)
    producer.start()
    reader.start()
    try:
        for n in range(6):                      # lax, strict, lax, strict, lax, strict
            time.sleep(1.2)
            policy.write_text(POLICY.format(topic=topic, max_lat=99 if n % 2 == 0 else 90))
            wait_for_log(proxy, "policies reloaded", count=n + 1)
        stop.set()
        producer.join(60)
        produce(range(12), "after")             # under the last, strict policy
        finish.set()
        deadline = time.monotonic() + 60
        while not done() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)                           # a late duplicate would show
    finally:
        stop.set()
        finish.set()
        reader.join(90)
    assert not errors, errors[:5]
    assert not reader.is_alive(), "the consumer did not finish"
    keys = [k for _, k in got]
    assert len(keys) == len(set(keys)), "a record was delivered twice"
    valid = {k for k, lat in sent.items() if lat == 5}
    flip = {k for k, lat in sent.items() if lat == 95}
    assert valid <= set(keys), f"{len(valid - set(keys))} valid records lost"
    dlt = [r.key for r in without_markers(read_all(broker.bootstrap, f"{topic}.dlt"))]
    assert len(dlt) == len(set(dlt)), "a record was dead-lettered twice"
    delivered_flip = flip & set(keys)
    assert not delivered_flip & set(dlt), "a record was delivered and dead-lettered"
    assert delivered_flip | set(dlt) == flip, "a lat-95 record was neither delivered nor diverted"
    after = {k for k in flip if k.startswith(b"after-")}
    assert after and after <= set(dlt), "the last (strict) policy did not divert lat 95"
    assert delivered_flip, "no lat-95 record passed under the lax policy: no reload took effect"
    proxy.assert_running()
    proxy.stop_and_check()
