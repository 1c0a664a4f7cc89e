"""What a dead-letter topic's retention and size limit do to the proxy,
against Apache Kafka (issue 32; tansu could show neither: it keeps every
record and stores `max.message.bytes` without enforcing it).

Retention: after DeleteRecords (the head of the DLT gone, cut in the middle
of a batch) or `retention.ms` (every DLT record gone, on a broker started for
the test with a short `log.retention.check.interval.ms`), a restarted proxy
rebuilds its ledger from the DLT's log start (not from 0: no
OFFSET_OUT_OF_RANGE loop, no stall), consumers get exactly the valid records
once, and the once-only promise then covers what the DLT still holds: a
poison record whose DLT copy was deleted is written again when it is read
again, once; one whose copy is still there is not.

`max.message.bytes` on the DLT (a DLT created before the proxy, with a small
limit): many poison records of one Fetch response are written in batches
split until the broker takes them, each record once; a single record larger
than the limit holds its partition (the records before it are delivered,
nothing after it), is retried at a bounded rate (not a hot loop), is
reported (error log, `antidote_dlt_writes_total{result="too_large"}`,
`antidote_held_partitions`), and lands once when the operator raises the
limit, after which the partition flows again.

A DLT deleted and created again under two running instances: the new DLT
ends below where they had read to, and each reads it again from its start,
so a diversion through one is not written again through the other.

The boundary of "consumers get a replayed copy, never both": the original
stays hidden while the DLT keeps its copy, and comes back beside the
replayed copy once retention took it and the proxy restarted.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import time
import urllib.request

import confluent_kafka as ck
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewTopic)

import clients as c
import harness as h
import poison_support as ps
from test_dlt_ledger import AdminPolicyProxy
from test_ops import cli, ok

DLT_LIMIT = 16384  # the DLT's max.message.bytes in the size tests


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

def start_proxy(workdir, broker, policy_file, name, **kw) -> AdminPolicyProxy:
    import conftest
    p = AdminPolicyProxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                         admin_port=h.free_port(), name=name, **kw)
    conftest._PROXIES.append(p)
    return p.start()


def scrape(proxy) -> str:
    with urllib.request.urlopen(f"http://{h.HOST}:{proxy.admin_port}/metrics", timeout=5) as r:
        return r.read().decode()


def create_topic(ep: c.Endpoint, name: str, config: dict) -> None:
    admin = AdminClient(ep.ck())
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)
    c.wait_topic_visible(ep, name, 1, 30)


def alter_config(ep: c.Endpoint, topic: str, name: str, value: str) -> None:
    admin = AdminClient(ep.ck())
    res = ConfigResource("topic", topic, incremental_configs=[ConfigEntry(
        name, value, incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)


def delete_records(ep: c.Endpoint, topic: str, before: int) -> int:
    """DeleteRecords up to `before` on partition 0; the new low watermark."""
    admin = AdminClient(ep.ck())
    fs = admin.delete_records([ck.TopicPartition(topic, 0, before)], request_timeout=30,
                              operation_timeout=30)
    [res] = [f.result(30) for f in fs.values()]
    return res.low_watermark


def watermarks(ep: c.Endpoint, topic: str) -> tuple[int, int]:
    """(log start, high watermark) of partition 0, as the broker says."""
    cons = ck.Consumer(ep.ck(**{"group.id": f"wm-{time.monotonic_ns()}"}))
    try:
        return cons.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=15)
    finally:
        cons.close()


def log_start(ep: c.Endpoint, topic: str) -> int:
    return watermarks(ep, topic)[0]


def dlt_records(ep: c.Endpoint, topic: str, timeout: float = 30) -> list[c.Rec]:
    """Every record of DLT partition 0 readable now (from its log start to
    its high watermark), lease markers left out, read with librdkafka."""
    cons = ck.Consumer(ep.ck(**{"group.id": f"dlt-{time.monotonic_ns()}",
                                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                "enable.partition.eof": True}))
    got: list[c.Rec] = []
    try:
        lo, hi = cons.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=15)
        if hi <= lo:
            return []
        cons.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    if not got or got[-1].offset >= hi - 1:
                        return ps.without_markers(got)
                    continue
                raise AssertionError(f"DLT read: {m.error()}")
            got.append(c._ck_rec(m))
        raise AssertionError(f"{topic}: read {len(got)} records up to {hi} in {timeout}s")
    finally:
        cons.close()


def origins(dlt: list[c.Rec]) -> list[int]:
    """The origin offsets the DLT records name, sorted (duplicates kept)."""
    return sorted(int(ps.hdict(r)["x-original-offset"]) for r in dlt)


def proxy_consumer(proxy, topic: str, tag: str) -> ck.Consumer:
    """A librdkafka consumer through the proxy, assigned partition 0 of
    `topic` from its start (no commits)."""
    ep = c.Endpoint(proxy.bootstrap, "proxy")
    cons = ck.Consumer(ep.ck(**{"group.id": f"{tag}-{time.monotonic_ns()}",
                                "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    cons.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    return cons


def read_valid(proxy, topic: str, n: int, timeout: float = 60) -> list[c.Rec]:
    """The first `n` records of `topic` through the proxy, from offset 0,
    then two more seconds of polling so that an extra record would show."""
    cons = proxy_consumer(proxy, topic, "rd")
    try:
        got = c._ck_poll(cons, n, timeout)
        return got + _drain(cons, 2)
    finally:
        cons.close()


def _drain(cons, seconds: float) -> list[c.Rec]:
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = cons.poll(0.2)
        if m is not None and not m.error():
            out.append(c._ck_rec(m))
    return out


def wait_log(proxy, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = proxy.log.read_text(errors="replace")
        if text in log:
            return log
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not logged in {timeout}s\n{proxy.log.read_text()[-4000:]}")


# Poison at 1, 3, 4, 6, 9 (five of them), valid elsewhere.
KINDS = ["valid", "lat", "valid", "enum", "lon", "valid", "schema", "valid", "valid", "nan",
         "valid", "valid"]
POISON = [i for i, k in enumerate(KINDS) if k != "valid"]
VALID = [i for i, k in enumerate(KINDS) if k == "valid"]


def produce_layout(ep: c.Endpoint, topic: str) -> list[c.Rec]:
    recs = [ps.json_rec(k, i) for i, k in enumerate(KINDS)]
    # One batch: the whole layout is in one Fetch response and its five
    # diversions go to the DLT as one batch.
    c.ck_produce(ep, topic, recs, **{"linger.ms": 2000})
    return recs


def assert_no_ledger_trouble(proxy) -> None:
    log = proxy.log.read_text(errors="replace")
    for bad in ("loading the dead-letter ledger failed", "tailing the DLTs failed",
                "read stuck"):
        assert bad not in log, f"{bad!r} in the proxy's log:\n{log[-4000:]}"


# ---------------------------------------------------------------------------
# Retention
# ---------------------------------------------------------------------------

def test_after_delete_records_a_restart_rebuilds_from_the_log_start_and_rewrites_only_deleted_copies(
        workdir, broker, broker_endpoint, tmp_path):
    policy_file = ps.write_policies(tmp_path)
    topic = ps.unique_topic(ps.JSON_PREFIX, "delrec")
    dlt = f"{topic}.dlt"
    c.ck_create_topic(broker_endpoint, topic, 1)
    recs = produce_layout(broker_endpoint, topic)

    first = start_proxy(workdir, broker, policy_file, "antidote-delrec-a")
    try:
        got = read_valid(first, topic, len(VALID))
        assert [r.offset for r in got] == VALID
    finally:
        first.stop_and_check()
    before = dlt_records(broker_endpoint, dlt)
    assert origins(before) == POISON
    by_origin = {int(ps.hdict(r)["x-original-offset"]): r.offset for r in before}
    # The diversions went as one batch (or a few, if the writer woke up
    # between them): cut the largest one after its first record.
    batches = ps.split_batches(ps.fetch_partition(broker.port, dlt, 0, 0).records)
    big = max(batches, key=lambda b: b.count)
    assert big.count >= 2, [(b.base_offset, b.count) for b in batches]
    cut = big.base_offset + 1
    kept = sorted(o for o, at in by_origin.items() if at >= cut)
    assert 0 < len(kept) < len(POISON), (by_origin, cut)
    low = delete_records(broker_endpoint, dlt, cut)
    assert low == cut and log_start(broker_endpoint, dlt) == low
    assert origins(dlt_records(broker_endpoint, dlt)) == kept

    second = start_proxy(workdir, broker, policy_file, "antidote-delrec-b",
                         bootstrap_port=first.bootstrap_port, port_base=first.port_base)
    try:
        log = wait_log(second, f"dead-letter ledger loaded from DLT dlt={dlt} ")
        # Read from the log start: the records kept, not the ones deleted
        # before it in the cut batch (which its first fetch still carries).
        n = len(kept)
        assert re.search(rf"dlt={re.escape(dlt)} records={n} entries={n}\b", log), log[-3000:]
        for reader in range(2):  # two readers: the second writes nothing more
            got = read_valid(second, topic, len(VALID))
            assert [(r.offset, r.value) for r in got] == [(i, recs[i].value) for i in VALID], \
                f"reader {reader}: {got}"
        # The deleted copies were written again, once; the kept ones not.
        after = dlt_records(broker_endpoint, dlt)
        assert origins(after) == POISON, [ps.hdict(r)["x-original-offset"] for r in after]
        assert sorted(int(ps.hdict(r)["x-original-offset"]) for r in after[:len(kept)]) == kept
        for d in after:
            o = recs[int(ps.hdict(d)["x-original-offset"])]
            assert d.value == o.value and d.key == o.key
        assert_no_ledger_trouble(second)
    finally:
        second.stop_and_check()


def test_after_retention_empties_the_dlt_a_restart_starts_at_the_log_start_and_rewrites_once(
        workdir, tmp_path):
    """`retention.ms` on the DLT, enforced by a broker that checks every
    300 ms (from its start: `log.initial.task.delay.ms` 0, not 30 s). DLT
    records keep their origin record's CreateTime (2023 here), so an hour's
    retention deletes them at the next check: the retention of a DLT runs
    on the origin records' timestamps, like the origin topic's own."""
    broker = h.KafkaBroker(workdir / "retention", extra_properties={
        "log.retention.check.interval.ms": "300", "log.initial.task.delay.ms": "0"})
    broker.start()
    try:
        ep = c.Endpoint(broker.bootstrap)
        policy_file = ps.write_policies(tmp_path)
        topic = ps.unique_topic(ps.JSON_PREFIX, "ret")
        dlt = f"{topic}.dlt"
        c.ck_create_topic(ep, topic, 1)
        create_topic(ep, dlt, {"retention.ms": str(3600 * 1000)})
        recs = produce_layout(ep, topic)

        first = start_proxy(workdir, broker, policy_file, "antidote-ret-a")
        try:
            got = read_valid(first, topic, len(VALID))
            assert [r.offset for r in got] == VALID
            # Retention takes the diversions (the DLT's end stays where it was).
            deadline = time.monotonic() + 30
            while origins(dlt_records(ep, dlt)) and time.monotonic() < deadline:
                time.sleep(0.3)
            assert origins(dlt_records(ep, dlt)) == [], "retention did not delete the DLT's records"
            start, end = watermarks(ep, dlt)
            assert start > 0
            # The running proxy still knows what it wrote: nothing again.
            got = read_valid(first, topic, len(VALID))
            assert [r.offset for r in got] == VALID
            assert watermarks(ep, dlt)[1] == end
            # check --connect names the promise this DLT breaks.
            r = cli("check", "--config", str(first.config_path), "--connect")
            ok(r)
            assert f"{dlt}: retention.ms 3600000 is shorter than {topic}'s" in r.stderr, r.stderr
        finally:
            first.stop_and_check()
        # The operator follows the warning: the DLT keeps records from now on.
        alter_config(ep, dlt, "retention.ms", "-1")

        second = start_proxy(workdir, broker, policy_file, "antidote-ret-b",
                             bootstrap_port=first.bootstrap_port, port_base=first.port_base)
        try:
            log = wait_log(second, f"dead-letter ledger loaded from DLT dlt={dlt} ")
            assert re.search(rf"dlt={re.escape(dlt)} records=0 entries=0", log), log[-3000:]
            for _ in range(2):
                got = read_valid(second, topic, len(VALID))
                assert [(r.offset, r.value) for r in got] == [(i, recs[i].value) for i in VALID]
            # Each poison record written again, once (two readers), after
            # the old end of the DLT, and kept now.
            new = dlt_records(ep, dlt)
            assert origins(new) == POISON, [ps.hdict(r) for r in new]
            assert min(r.offset for r in new) >= end
            assert_no_ledger_trouble(second)
        finally:
            second.stop_and_check()
    finally:
        broker.stop()


# ---------------------------------------------------------------------------
# max.message.bytes
# ---------------------------------------------------------------------------

def big_poison(i: int, size: int) -> c.Rec:
    """A poison record (lat 91.5) with `size` bytes of incompressible text
    in a field the schema forbids (so gzip cannot shrink it under a limit)."""
    d = ps.trigger(i, lat=91.5)
    d["pad"] = base64.b64encode(os.urandom(size * 3 // 4)).decode()
    return c.Rec(0, i, f"k-{i}".encode(), json.dumps(d).encode(),
                 (("idempotency-key", f"idem-{i}".encode()),), 1_700_000_000_000 + i)


def test_many_poison_records_of_one_fetch_are_split_into_batches_the_dlt_accepts(
        workdir, broker, broker_endpoint, tmp_path, monkeypatch):
    policy_file = ps.write_policies(tmp_path)
    topic = ps.unique_topic(ps.JSON_PREFIX, "split")
    dlt = f"{topic}.dlt"
    c.ck_create_topic(broker_endpoint, topic, 1)
    create_topic(broker_endpoint, dlt, {"max.message.bytes": str(DLT_LIMIT)})
    recs = []
    for i in range(48):
        recs.append(big_poison(i, 1500) if i % 4 != 3 else ps.json_rec("valid", i))
    poison = [r.offset for r in recs if r.offset % 4 != 3]
    valid = [r.offset for r in recs if r.offset % 4 == 3]
    c.ck_produce(broker_endpoint, topic, recs, **{"linger.ms": 2000})
    # One Fetch response holds them all.
    first = ps.split_batches(ps.fetch_partition(broker.port, topic).records)
    assert sum(b.count for b in first) == len(recs), [(b.base_offset, b.count) for b in first]

    # The writer's splits are logged at debug level.
    monkeypatch.setenv("ANTIDOTE_LOG", "info,antidote::dlt::writer::once=debug")
    proxy = start_proxy(workdir, broker, policy_file, "antidote-split")
    try:
        got = read_valid(proxy, topic, len(valid))
        assert [r.offset for r in got] == valid
        dl = dlt_records(broker_endpoint, dlt)
        assert origins(dl) == poison
        for d in dl:
            assert d.value == recs[int(ps.hdict(d)["x-original-offset"])].value
        batches = [b for b in ps.split_batches(
            ps.fetch_partition(broker.port, dlt, 0, 0).records) if b.count]
        # 36 records of ~1.5 KB (about 50 KB gzipped) in batches of at most 16 KiB.
        assert len(batches) >= 4, [(b.base_offset, b.count, len(b.bytes)) for b in batches]
        assert all(len(b.bytes) <= DLT_LIMIT for b in batches)
        assert "batch too large for the DLT: splitting" in proxy.log.read_text()
        text = scrape(proxy)
        assert h.metric(text, "antidote_dlt_writes_total", result="too_large") == 0
        assert h.metric(text, "antidote_held_partitions") == 0
    finally:
        proxy.stop_and_check()


def test_a_record_larger_than_the_dlt_limit_holds_its_partition_until_the_limit_is_raised(
        workdir, broker, broker_endpoint, tmp_path):
    policy_file = ps.write_policies(tmp_path)
    topic = ps.unique_topic(ps.JSON_PREFIX, "huge")
    dlt = f"{topic}.dlt"
    c.ck_create_topic(broker_endpoint, topic, 1)
    create_topic(broker_endpoint, dlt, {"max.message.bytes": str(DLT_LIMIT)})
    recs = [ps.json_rec("valid", 0), ps.json_rec("valid", 1), big_poison(2, 40000),
            ps.json_rec("valid", 3), ps.json_rec("lat", 4), ps.json_rec("valid", 5)]
    c.ck_produce(broker_endpoint, topic, recs, **{"linger.ms": 2000})

    proxy = start_proxy(workdir, broker, policy_file, "antidote-huge",
                        dead_letter={"timeout": "2s"})
    cons = proxy_consumer(proxy, topic, "huge")
    try:
        got = c._ck_poll(cons, 2, 60)
        assert [r.offset for r in got] == [0, 1]
        # Held: nothing past the record too large for the DLT, for a while.
        wait_log(proxy, "a single dead-letter record is too large for its DLT")
        t0, text0 = time.monotonic(), scrape(proxy)
        end0 = watermarks(broker_endpoint, dlt)[1]
        assert _drain(cons, 8) == []
        text1, window = scrape(proxy), time.monotonic() - t0
        # The retries write nothing to the DLT (each used to take a new
        # lease and write a lease marker: ~3 records a second while held).
        assert watermarks(broker_endpoint, dlt)[1] == end0
        assert h.metric(text1, "antidote_held_partitions", topic=topic, partition="0") == 1
        tries = (h.metric(text1, "antidote_dlt_writes_total", result="too_large")
                 - h.metric(text0, "antidote_dlt_writes_total", result="too_large"))
        # Retried, at a bounded rate (every 250-500 ms while a fetch waits,
        # about 3 a second), not in a hot loop (hundreds a second).
        assert 1 <= tries <= 8 * window, f"{tries} too-large writes in {window:.1f}s"
        assert 2 not in origins(dlt_records(broker_endpoint, dlt))

        # The operator raises the DLT's limit: the record lands once, the
        # partition flows again.
        alter_config(broker_endpoint, dlt, "max.message.bytes", str(1 << 20))
        more = c._ck_poll(cons, 2, 60)
        assert [r.offset for r in more] == [3, 5]
        assert _drain(cons, 2) == []
    finally:
        cons.close()
    try:
        assert origins(dlt_records(broker_endpoint, dlt)) == [2, 4]
        text = scrape(proxy)
        assert h.metric(text, "antidote_held_partitions", topic=topic, partition="0") == 0
    finally:
        proxy.stop_and_check()


def test_never_both_holds_while_the_dlt_keeps_the_copy_and_ends_with_it(
        workdir, broker, broker_endpoint):
    """The boundary of "consumers get the replayed copy, never both": the
    proxy hides the original of a diverted record because its ledger, rebuilt
    from the DLT, names it. Once retention (here DeleteRecords) took the DLT
    copy of a record that was fixed and replayed, a restarted proxy no longer
    knows it was diverted, judges the original valid under the fixed policy
    and delivers it beside its replayed copy. So a DLT must keep its records
    at least as long as the origin topic keeps the originals (`check
    --connect` warns when its retention.ms is shorter; docs/operations.md)."""
    from test_ops import POLICY, OpsAntidote
    topic = f"never-both-{os.urandom(4).hex()}"
    dlt = f"{topic}.dlt"
    c.ck_create_topic(broker_endpoint, topic, 1)
    policy = workdir / f"{topic}.policy.yaml"
    policy.write_text(POLICY.format(topic=topic, max_lat=90))
    c.ck_produce(broker_endpoint, topic, [
        c.Rec(0, -1, b"a", b'{"lat": 10}', (), 1_700_000_000_001),
        c.Rec(0, -1, b"b", b'{"lat": 95}', (), 1_700_000_000_002),
        c.Rec(0, -1, b"c", b'{"lat": 20}', (), 1_700_000_000_003)])

    def run(name: str) -> list[tuple[int, bytes]]:
        import conftest
        p = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                        name=name)
        conftest._PROXIES.append(p)
        p.start()
        try:
            return [(r.offset, r.key) for r in read_valid(p, topic, 1)]
        finally:
            p.stop_and_check()

    assert run(f"nb-strict-{topic}") == [(0, b"a"), (2, b"c")]
    policy.write_text(POLICY.format(topic=topic, max_lat=100))  # the fix
    cfg = OpsAntidote(workdir, upstream=[broker.bootstrap], policy_files=(str(policy),),
                      name=f"nb-replay-{topic}")
    cfg.config_path.write_text(cfg.config_yaml())
    ok(cli("dlt", "replay", "--config", str(cfg.config_path), "--topic", dlt, "--execute"))
    # The DLT keeps the copy: the replayed copy, never the original.
    kept = run(f"nb-kept-{topic}")
    assert [k for _, k in kept] == [b"a", b"c", b"b"] and kept[2][0] > 2, kept
    # The DLT's copy deleted: the original comes back beside its replay.
    delete_records(broker_endpoint, dlt, watermarks(broker_endpoint, dlt)[1])
    assert run(f"nb-deleted-{topic}") == [(0, b"a"), (1, b"b"), (2, b"c"), kept[2]]


# ---------------------------------------------------------------------------
# A DLT deleted and created again under two running instances
# ---------------------------------------------------------------------------

def test_a_dlt_deleted_and_recreated_under_two_instances_holds_each_new_diversion_once(
        workdir, broker, broker_endpoint, tmp_path):
    """Two instances have read a DLT to offset 11 or so; the DLT is deleted
    and created again by the next diversion (through B), so it ends below
    where they had read to. Instance A must read the new DLT from its start
    (its tail and the read before a write), learn B's diversion, and not
    write it again when its own consumer reads that record."""
    h.ensure_transaction_coordinator(broker.bootstrap)
    policy_file = ps.write_policies(tmp_path)
    topic = ps.unique_topic(ps.JSON_PREFIX, "recreate")
    dlt = f"{topic}.dlt"
    c.ck_create_topic(broker_endpoint, topic, 1)
    c.ck_produce(broker_endpoint, topic, [ps.json_rec("lat", i) for i in range(10)]
                 + [ps.json_rec("valid", 10)])
    a = start_proxy(workdir, broker, policy_file, "antidote-recreate-a")
    b = start_proxy(workdir, broker, policy_file, "antidote-recreate-b")
    try:
        assert [r.offset for r in read_valid(a, topic, 1)] == [10]
        assert origins(dlt_records(broker_endpoint, dlt)) == list(range(10))
        old_end = watermarks(broker_endpoint, dlt)[1]
        time.sleep(1)  # B's tail learns A's ten diversions
        assert [r.offset for r in read_valid(b, topic, 1)] == [10]
        admin = AdminClient(broker_endpoint.ck())
        admin.delete_topics([dlt], operation_timeout=30)[dlt].result(30)
        deadline = time.monotonic() + 30
        while ps.topic_exists(broker_endpoint, dlt) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not ps.topic_exists(broker_endpoint, dlt)

        c.ck_produce(broker_endpoint, topic, [ps.json_rec("lat", 11), ps.json_rec("valid", 12)])
        assert [r.offset for r in read_valid(b, topic, 2)] == [10, 12]
        assert origins(dlt_records(broker_endpoint, dlt)) == [11]
        new_end = watermarks(broker_endpoint, dlt)[1]
        assert new_end < old_end, (new_end, old_end)
        for _ in range(2):
            assert [r.offset for r in read_valid(a, topic, 2)] == [10, 12]
        assert origins(dlt_records(broker_endpoint, dlt)) == [11], "written again by A"
    finally:
        a.stop_and_check()
        b.stop_and_check()


def test_records_deleted_from_the_origin_are_never_diverted(
        workdir, broker, broker_endpoint, tmp_path):
    """DeleteRecords cuts the origin's one batch at offset 5: Kafka still
    returns the whole batch, but records 0-4 are deleted. A consumer from
    the earliest offset gets the valid records from 5 on; only the poison
    records from 5 on (6 and 9) reach the DLT, never the deleted 1, 3, 4
    (a DLT copy of a deleted record would bring it back through a replay)."""
    policy_file = ps.write_policies(tmp_path)
    topic = ps.unique_topic(ps.JSON_PREFIX, "origdel")
    dlt = f"{topic}.dlt"
    c.ck_create_topic(broker_endpoint, topic, 1)
    recs = produce_layout(broker_endpoint, topic)
    assert delete_records(broker_endpoint, topic, 5) == 5
    proxy = start_proxy(workdir, broker, policy_file, "antidote-origdel")
    try:
        got = read_valid(proxy, topic, len([i for i in VALID if i >= 5]))
        assert [r.offset for r in got] == [i for i in VALID if i >= 5]
        assert [r.value for r in got] == [recs[i].value for i in VALID if i >= 5]
        assert origins(dlt_records(broker_endpoint, dlt)) == [i for i in POISON if i >= 5]
        proxy.assert_running()
    finally:
        proxy.stop_and_check()


def test_a_poison_record_stamped_beyond_the_dlts_timestamp_limit_is_diverted_not_held(
        workdir, broker, broker_endpoint, tmp_path):
    """Kafka refuses a CreateTime record stamped more than
    `message.timestamp.after.max.ms` (1 hour by default since Kafka 4.0)
    ahead of the broker's clock. A topic that allows such stamps (or a
    LogAppendTime topic, whose producers stamp what they like) can hold a
    poison record the DLT, created with the defaults, refuses as it is. It is
    written with the time of its diversion instead (the original stays in
    `x-original-timestamp`), so its partition flows; it is not held forever
    with a lease taken and marked on every retry."""
    policy_file = ps.write_policies(tmp_path)
    topic = ps.unique_topic(ps.JSON_PREFIX, "future")
    dlt = f"{topic}.dlt"
    create_topic(broker_endpoint, topic,
                 {"message.timestamp.after.max.ms": str(10 * 365 * 86_400_000)})
    now = int(time.time() * 1000)
    future = now + 2 * 86_400_000
    poison = dataclasses.replace(ps.json_rec("lat", 1, ts0=now), timestamp=future)
    recs = [ps.json_rec("valid", 0, ts0=now), poison, ps.json_rec("valid", 2, ts0=now)]
    c.ck_produce(broker_endpoint, topic, recs)
    proxy = start_proxy(workdir, broker, policy_file, "antidote-future",
                        dead_letter={"timeout": "2s"})
    cons = proxy_consumer(proxy, topic, "future")
    try:
        got = c._ck_poll(cons, 2, 60)
        assert [r.offset for r in got] == [0, 2]
    finally:
        cons.close()
    written = dlt_records(broker_endpoint, dlt)
    assert origins(written) == [1]
    (r,) = written
    assert int(ps.hdict(r)["x-original-timestamp"]) == future
    assert now - 60_000 <= r.timestamp <= time.time() * 1000 + 60_000, \
        "written with the time of its diversion"
    # One lease (epoch 0 writes no marker): not one per retry.
    markers = watermarks(broker_endpoint, dlt)[1] - len(written)
    assert markers <= 1, f"{markers} lease markers"
    proxy.stop_and_check()
