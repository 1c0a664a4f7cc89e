"""A partition that ends in diverted records: every client's position and
committed offset must reach the high watermark (lag 0), and no client may
deliver, skip or re-read a valid record on the way (issue 9, item 8).

Without help librdkafka stops short: its position and stored offset are
"last delivered offset + 1" (rdkafka_queue.c, app position updated per
delivered message), so a removed tail is never counted (measured before the
fix: position {0: 4, 1: 2} for high watermarks {0: 5, 1: 4}). kafkajs
resolves offsets from the records it sees too: it crept past a partly
removed tail one offset per fetch but stayed at 2 of 4 behind a wholly
emptied last batch. kafka-python follows the batch's lastOffsetDelta.
librdkafka does store the offset of a control record it reads
(rd_kafka_op_handle_std: "we need to store their offsets", librdkafka issue
2539, fixed in 1.4), and kafkajs resolves one, so the proxy ends a batch that
lost its tail with a commit marker at the removed tail offset
(crates/core/src/kafka/marker.rs).

Layout, produced one batch per flush:
  partition 0: [valid, lat] [valid, valid, enum]  -> HW 5, a batch's tail removed
  partition 1: [valid, valid] [lat, schema]       -> HW 4, a whole last batch removed
Each client and isolation level runs two members of one consumer group in
turn: the first reads the valid records and commits; then more valid records
are produced and the second must get exactly those (nothing re-read, nothing
skipped) and reach the new end too. Two more: a committed transaction that
ends in poison (our marker sits just before the broker's own), and
librdkafka's consume() batch path with its auto-commit timer.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import confluent_kafka as ck
import kafka as kp
import pytest

import clients as c
import poison_support as ps

JS = Path(__file__).resolve().parent / "js"
HAVE_KAFKAJS = shutil.which("node") is not None and (JS / "node_modules" / "kafkajs").exists()

LAYOUT = {0: [["valid", "lat"], ["valid", "valid", "enum"]],
          1: [["valid", "valid"], ["lat", "schema"]]}
MORE = 2            # valid records produced per partition after the poison tail
SETTLE = 8.0        # seconds a client gets, after its last record, to reach the end


@pytest.fixture(scope="module")
def tproxy(workdir, broker, tmp_path_factory):
    pfile = ps.write_policies(tmp_path_factory.mktemp("tail-policies"))
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[pfile],
                              name="antidote-tail")
    yield p
    p.stop_and_check()


@pytest.fixture
def proxy_ep(tproxy) -> c.Endpoint:
    tproxy.assert_running()
    yield c.Endpoint(tproxy.bootstrap, "proxy")
    tproxy.assert_running()


def produce_layout(ep: c.Endpoint, topic: str, layout: dict, first: dict) -> dict:
    """Produce `layout` (one batch per list) from offset `first[p]`; returns
    the valid records per partition."""
    valid = {}
    for p, batches in layout.items():
        off, valid[p] = first[p], []
        for kinds in batches:
            recs = [ps.json_rec(k, off + i, partition=p) for i, k in enumerate(kinds)]
            c.ck_produce(ep, topic, recs, **{"linger.ms": 200})
            valid[p] += [r for r, k in zip(recs, kinds) if k == "valid"]
            off += len(kinds)
    return valid


def broker_port(ep: c.Endpoint) -> int:
    return int(ep.bootstrap.rsplit(":", 1)[1])


# ---------------------------------------------------------------------------
# One group member per client: read `n` records, settle, commit, report.
# Each returns (records, positions or None, committed offsets).
# ---------------------------------------------------------------------------

def run_librdkafka(ep, topic, group, isolation, n, hws):
    cons = ck.Consumer(ep.ck(**{"group.id": group, "enable.auto.commit": False,
                                "auto.offset.reset": "earliest", "isolation.level": isolation}))
    tps = [ck.TopicPartition(topic, p) for p in hws]
    got, settle_until = [], None
    deadline = time.monotonic() + 90
    try:
        cons.subscribe([topic])
        while time.monotonic() < deadline:
            m = cons.poll(0.2)
            if m is not None and not m.error():
                got.append(c._ck_rec(m))
            elif m is not None and m.error().code() != ck.KafkaError._PARTITION_EOF:
                raise AssertionError(f"consumer error: {m.error()}")
            if len(got) >= n and settle_until is None:
                settle_until = time.monotonic() + SETTLE
            if settle_until is not None:
                pos = {tp.partition: tp.offset for tp in cons.position(tps)}
                if pos == hws or time.monotonic() > settle_until:
                    break
        pos = {tp.partition: tp.offset for tp in cons.position(tps)}
        cons.commit(asynchronous=False)
        committed = {tp.partition: tp.offset for tp in cons.committed(tps, timeout=20)}
    finally:
        cons.close()
    return got, pos, committed


def run_kafka_python(ep, topic, group, isolation, n, hws):
    cons = kp.KafkaConsumer(**ep.kp(group_id=group, enable_auto_commit=False,
                                    auto_offset_reset="earliest", isolation_level=isolation))
    tps = [kp.TopicPartition(topic, p) for p in hws]
    got, settle_until = [], None
    deadline = time.monotonic() + 90
    def positions():
        # kafka-python raises IllegalStateError for a partition a rebalance
        # under way has taken back (its heartbeat thread can, between an
        # assignment() that listed it and position()): None until all held.
        if not set(tps) <= cons.assignment():
            return None
        try:
            return {tp.partition: cons.position(tp) for tp in tps}
        except kp.errors.IllegalStateError:
            return None

    try:
        c.kp_subscribe(cons, topic)
        while time.monotonic() < deadline:
            for _tp, msgs in cons.poll(timeout_ms=200).items():
                got.extend(c._kp_rec(m) for m in msgs)
            if len(got) >= n and settle_until is None:
                settle_until = time.monotonic() + SETTLE
            if settle_until is not None:
                pos = positions()
                if pos == hws or (pos is not None and time.monotonic() > settle_until):
                    break
        pos = positions()
        while pos is None and time.monotonic() < deadline + 30:
            for _tp, msgs in cons.poll(timeout_ms=200).items():
                got.extend(c._kp_rec(m) for m in msgs)
            pos = positions()
        cons.commit()
        committed = {tp.partition: cons.committed(tp) for tp in tps}
    finally:
        cons.close()
    return got, pos, committed


def run_kafkajs(ep, topic, group, isolation, n, hws):
    out = subprocess.run(["node", "tail.js", ep.bootstrap, topic, group, isolation, str(n),
                          json.dumps({str(p): o for p, o in hws.items()})],
                         cwd=JS, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    committed = {int(p): o for p, o in lines[-1]["committed"].items()}
    got = [c.Rec(x["partition"], x["offset"], x["key"].encode(), None) for x in lines[:-1]]
    return got, None, committed


RUNNERS = {"librdkafka": run_librdkafka, "kafka_python": run_kafka_python,
           "kafkajs": run_kafkajs}


def same_records(got: list[c.Rec], want: list[c.Rec], client: str) -> None:
    """Exactly `want`, in order per partition, no duplicates; kafkajs is
    compared by (partition, offset, key) since it prints only those."""
    def ident(r):
        return (r.partition, r.offset, r.key)
    if client == "kafkajs":
        got_ids = c.by_partition_in_order([c.Rec(*ident(r), None) for r in got])
        want_ids = c.by_partition_in_order([c.Rec(*ident(r), None) for r in want])
        assert got_ids == want_ids
    else:
        assert c.by_partition_in_order(got) == c.by_partition_in_order(want)


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
@pytest.mark.parametrize("client", [
    pytest.param("librdkafka"),
    "kafka_python",
    pytest.param("kafkajs", marks=pytest.mark.skipif(not HAVE_KAFKAJS,
                                                     reason="kafkajs not installed")),
])
def test_group_reaches_the_end_of_partitions_ending_in_diverted_records(
        client, isolation, broker_endpoint, proxy_ep):
    topic = ps.unique_topic(ps.JSON_PREFIX, "tail")
    c.ck_create_topic(broker_endpoint, topic, len(LAYOUT))
    valid = produce_layout(broker_endpoint, topic, LAYOUT, {p: 0 for p in LAYOUT})
    hws = {p: sum(len(b) for b in LAYOUT[p]) for p in LAYOUT}
    # The premise: the broker ends each partition where the layout says.
    for p, hw in hws.items():
        assert ps.wait_high_watermark(broker_port(broker_endpoint), topic, p, hw) == hw
    run = RUNNERS[client]
    group = f"tail-{client}-{uuid.uuid4().hex[:8]}"
    want = [r for p in sorted(valid) for r in valid[p]]

    got, pos, committed = run(proxy_ep, topic, group, isolation, len(want), hws)
    same_records(got, want, client)
    if pos is not None:
        assert pos == hws, f"{client} position {pos}, high watermarks {hws}"
    assert committed == hws, f"{client} committed {committed}, high watermarks {hws}"

    # Records after the tail: the next member of the group gets exactly these.
    more = produce_layout(broker_endpoint, topic, {p: [["valid"] * MORE] for p in LAYOUT}, hws)
    hws2 = {p: hw + MORE for p, hw in hws.items()}
    want2 = [r for p in sorted(more) for r in more[p]]
    got, pos, committed = run(proxy_ep, topic, group, isolation, len(want2), hws2)
    same_records(got, want2, client)
    if pos is not None:
        assert pos == hws2, f"{client} position {pos}, high watermarks {hws2}"
    assert committed == hws2, f"{client} committed {committed}, high watermarks {hws2}"

    dlt = ps.sorted_by_origin(ps.read_dlt(broker_endpoint, f"{topic}.dlt"))
    assert ps.origin_offsets(dlt) == [(0, 1), (0, 4), (1, 2), (1, 3)]


@pytest.mark.parametrize("client", [
    "librdkafka",
    "kafka_python",
    pytest.param("kafkajs", marks=pytest.mark.skipif(not HAVE_KAFKAJS,
                                                     reason="kafkajs not installed")),
])
def test_committed_transaction_ending_in_diverted_records_reads_to_the_end(
        client, broker_endpoint, proxy_ep):
    """Our marker (no producer) sits just before the broker's own commit
    marker: read_committed clients still deliver exactly the valid records
    of the transaction and end at the high watermark."""
    topic = ps.unique_topic(ps.JSON_PREFIX, "tailtxn")
    c.ck_create_topic(broker_endpoint, topic, 1)
    prod = ck.Producer(broker_endpoint.ck(**{"transactional.id": f"tail-{uuid.uuid4().hex[:8]}"}))
    prod.init_transactions(30)
    kinds = ["valid", "valid", "lat"]
    recs = [ps.json_rec(k, i) for i, k in enumerate(kinds)]
    prod.begin_transaction()
    for r in recs:
        prod.produce(topic, key=r.key, value=r.value, headers=list(r.headers), partition=0,
                     timestamp=r.timestamp)
    prod.flush(30)
    prod.commit_transaction(30)
    hws = {0: len(kinds) + 1}      # the broker's commit marker takes offset 3
    assert ps.wait_high_watermark(broker_port(broker_endpoint), topic, 0, hws[0]) == hws[0]
    want = [r for r, k in zip(recs, kinds) if k == "valid"]
    group = f"tailtxn-{client}-{uuid.uuid4().hex[:8]}"
    got, pos, committed = RUNNERS[client](proxy_ep, topic, group, "read_committed", len(want), hws)
    same_records(got, want, client)
    if pos is not None:
        assert pos == hws, f"{client} position {pos}, high watermarks {hws}"
    assert committed == hws, f"{client} committed {committed}, high watermarks {hws}"
    dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt")
    assert ps.origin_offsets(dlt) == [(0, 2)]


def test_librdkafka_auto_commit_with_batch_consume_reaches_the_end(broker_endpoint, proxy_ep):
    """The other librdkafka paths: consume(num_messages) (control records are
    served by rd_kafka_q_serve_rkmessages, not the poll path) and the
    auto-commit timer, which commits the offsets stored as records and
    control records are served."""
    topic = ps.unique_topic(ps.JSON_PREFIX, "tailauto")
    c.ck_create_topic(broker_endpoint, topic, len(LAYOUT))
    valid = produce_layout(broker_endpoint, topic, LAYOUT, {p: 0 for p in LAYOUT})
    hws = {p: sum(len(b) for b in LAYOUT[p]) for p in LAYOUT}
    for p, hw in hws.items():
        assert ps.wait_high_watermark(broker_port(broker_endpoint), topic, p, hw) == hw
    want = [r for p in sorted(valid) for r in valid[p]]
    group = f"tailauto-{uuid.uuid4().hex[:8]}"
    cons = ck.Consumer(proxy_ep.ck(**{"group.id": group, "enable.auto.commit": True,
                                      "auto.commit.interval.ms": 200,
                                      "auto.offset.reset": "earliest"}))
    tps = [ck.TopicPartition(topic, p) for p in hws]
    got, committed = [], {}
    deadline = time.monotonic() + 90
    try:
        cons.subscribe([topic])
        while time.monotonic() < deadline and not (len(got) >= len(want) and committed == hws):
            for m in cons.consume(num_messages=100, timeout=0.3):
                if m.error() is None:
                    got.append(c._ck_rec(m))
            if len(got) >= len(want):
                committed = {tp.partition: tp.offset for tp in cons.committed(tps, timeout=10)}
                deadline = min(deadline, time.monotonic() + SETTLE)
        pos = {tp.partition: tp.offset for tp in cons.position(tps)}
    finally:
        cons.close()
    same_records(got, want, "librdkafka")
    assert pos == hws, f"librdkafka position {pos}, high watermarks {hws}"
    assert committed == hws, f"librdkafka auto-committed {committed}, high watermarks {hws}"
