"""The dead-letter topic: each poison record lands there exactly once, with its
context, across several readers and a proxy restart; and when the DLT cluster
is down, the affected partition is held (nothing past the poison is
delivered) while other partitions flow, until the DLT cluster is back.

These tests start their own proxies (and a second tansu), so they can stop
and restart them."""

from __future__ import annotations

import time
import uuid

import pytest

import clients as c
import harness as h
import poison_support as ps
from test_poison import CkReader, KpReader, has_offsets


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return ps.write_policies(tmp_path_factory.mktemp("dlt-policies"))


def _valid_of(recs, kinds):
    return [r for r, k in zip(recs, kinds) if k == "valid"]


def test_dlt_holds_each_poison_once_with_context_after_three_readers_and_proxy_restart(
        workdir, broker, broker_endpoint, policy_file):
    topic = ps.unique_topic(ps.JSON_PREFIX, "once")
    c.ck_create_topic(broker_endpoint, topic, 2)
    kinds = {0: ["valid", "lat", "valid", "nan", "valid"],
             1: ["enum", "valid", "valid", "noheader"]}       # p1 ends in poison
    recs = {p: [ps.json_rec(k, i, partition=p) for i, k in enumerate(ks)]
            for p, ks in kinds.items()}
    c.ck_produce(broker_endpoint, topic, recs[0] + recs[1], **{"linger.ms": 200})
    valid = _valid_of(recs[0], kinds[0]) + _valid_of(recs[1], kinds[1])
    poison = [r for p in (0, 1) for r, k in zip(recs[p], kinds[p]) if k != "valid"]
    t0 = int(time.time() * 1000)

    first = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                                  name="antidote-once-a")
    ep = c.Endpoint(first.bootstrap, "proxy")
    done = lambda got: has_offsets(4, 0)(got) and has_offsets(2, 1)(got)  # noqa: E731
    # Reader 1: librdkafka, assign().
    r1 = CkReader(ep, topic, [0, 1])
    try:
        assert c.by_partition_in_order(r1.read_until(done, 30)) == c.by_partition_in_order(valid)
    finally:
        r1.close()
    # Reader 2: kafka-python, assign(); its positions reach the partitions' ends.
    r2 = KpReader(ep, topic, [0, 1])
    try:
        assert c.by_partition_in_order(r2.read_until(done, 30)) == c.by_partition_in_order(valid)
        r2.wait_position(0, 5)
        r2.wait_position(1, 4)
    finally:
        r2.close()
    # Reader 3: a kafka-python consumer group that commits.
    group = f"pz-once-{uuid.uuid4().hex[:8]}"
    got = c.kp_consume_group(ep, topic, group, len(valid), timeout=90)
    assert c.by_partition_in_order(got) == c.by_partition_in_order(valid)
    assert c.kp_committed(ep, topic, group, [0, 1]) == {0: 5, 1: 4}
    first.stop_and_check()  # SIGTERM: exit 0

    # The same ports and config again: the ledger is rebuilt from the DLT.
    second = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                                   bootstrap_port=first.bootstrap_port,
                                   port_base=first.port_base, name="antidote-once-b")
    try:
        got = c.ck_consume_assign(ep, topic, [0, 1], len(valid), timeout=30)
        assert c.by_partition_in_order(got) == c.by_partition_in_order(valid)
        got = c.kp_consume_assign(ep, topic, [0, 1], len(valid), timeout=30)
        assert c.by_partition_in_order(got) == c.by_partition_in_order(valid)
    finally:
        second.stop_and_check()

    dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt")
    assert sorted(ps.origin_offsets(dlt)) == sorted((r.partition, r.offset) for r in poison), \
        "each poison record exactly once"
    by_origin = {o: d for o, d in zip(ps.origin_offsets(dlt), dlt)}
    all_kinds = {(p, i): k for p, ks in kinds.items() for i, k in enumerate(ks)}
    for orig in poison:
        ps.check_dlt_record(by_origin[(orig.partition, orig.offset)], orig, topic, "pz-json",
                            ps.JSON_RULE[all_kinds[(orig.partition, orig.offset)]],
                            t_before_ms=t0)


def test_dlt_cluster_down_holds_partition_others_flow_and_resumes_when_back(
        workdir, broker, broker_endpoint, policy_file):
    dlt_dir = workdir / f"dltbroker-{uuid.uuid4().hex[:6]}"
    dlt_dir.mkdir()
    dlt_broker = h.Tansu(dlt_dir).start()
    dlt_ep = c.Endpoint(dlt_broker.bootstrap)
    proxy = ps.start_policy_proxy(
        workdir, upstream=[broker.bootstrap], policies=[policy_file], name="antidote-dltdown",
        dead_letter={"bootstrap_servers": [dlt_broker.bootstrap], "timeout": "2s"})
    ep = c.Endpoint(proxy.bootstrap, "proxy")
    topic = ps.unique_topic(ps.JSON_PREFIX, "held")
    other = ps.unique_topic(ps.JSON_PREFIX, "flows")
    c.ck_create_topic(broker_endpoint, topic, 2)
    c.ck_create_topic(broker_endpoint, other, 1)
    reader = KpReader(ep, topic, [0, 1])
    try:
        # Phase 0, DLT cluster up: the DLT topic is created there.
        c.ck_produce(broker_endpoint, topic, [ps.json_rec("lat", 0), ps.json_rec("valid", 1)])
        reader.read_until(has_offsets(1, 0), 30)
        assert ps.origin_offsets(ps.read_dlt(dlt_ep, f"{topic}.dlt", settle=0)) == [(0, 0)]
        assert not ps.topic_exists(broker_endpoint, f"{topic}.dlt")

        # Phase 1, DLT cluster killed.
        dlt_broker.proc.kill()
        dlt_broker.proc.wait(10)
        p0 = [ps.json_rec(k, i) for i, k in enumerate(["valid", "nan", "valid", "valid"], 2)]
        p1 = [ps.json_rec("valid", i, partition=1) for i in range(5)]
        c.ck_produce(broker_endpoint, topic, p0 + p1, **{"linger.ms": 200})
        oth = [ps.json_rec("valid", i) for i in range(3)]
        c.ck_produce(broker_endpoint, other, oth)
        got = reader.read_until(lambda g: has_offsets(4, 1)(g) and has_offsets(2, 0)(g), 40)
        # Another topic flows meanwhile, through the same proxy.
        assert c.kp_consume_assign(ep, other, [0], 3, timeout=20) == oth
        # Several DLT timeouts later, still nothing at or past the poison on p0.
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            for _tp, msgs in reader.c.poll(timeout_ms=500).items():
                reader.got.extend(c._kp_rec(m) for m in msgs)
        got = reader.got
        assert [r.offset for r in got if r.partition == 0] == [1, 2], got
        assert [r for r in got if r.partition == 1] == p1
        assert "partition held" in h.read_log(proxy.log)

        # Phase 2, DLT cluster back (empty, same port): the held partition resumes.
        dlt_broker = h.Tansu(dlt_dir, port=dlt_broker.port).start()
        got = reader.read_until(has_offsets(5, 0), 30)
        assert [r for r in got if r.partition == 0][1:] == [p0[0], p0[2], p0[3]]
        dlt = ps.read_dlt(dlt_ep, f"{topic}.dlt", settle=0.5)
        assert ps.origin_offsets(dlt) == [(0, 3)]
        ps.check_dlt_record(dlt[0], p0[1], topic, "pz-json", "decode")
    finally:
        reader.close()
        proxy.stop_and_check(timeout=15)
        dlt_broker.stop()
