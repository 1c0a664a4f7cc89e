"""Aborted transactions end to end, against Apache Kafka: real transactional
producers, and read_committed and read_uncommitted consumers through the
proxy. Kafka lists `[(producer id, first offset)]` of each aborted
transaction in read_committed Fetch responses (tansu 0.6 sent an empty list,
so this file used to put a relay in front of tansu that added it; Kafka's
own list retired that relay).

The proxy must pass the list through, divert only committed poison (an
aborted record is never delivered to a read_committed reader, so it is not
judged into a DLT), and clients reading through it must see exactly the
committed valid records."""

from __future__ import annotations

import struct
import uuid

import confluent_kafka as ck
import pytest

import clients as c
import harness as h
import poison_support as ps

pytestmark = h.needs_kafka


@pytest.fixture
def txn_proxy(workdir, broker, tmp_path):
    """A policy proxy in front of the session's broker."""
    pfile = ps.write_policies(tmp_path / "policies")
    proxy = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[pfile],
                                  name="antidote-aborted")
    yield broker, proxy
    proxy.stop_and_check()


def _produce_transactions(ep: c.Endpoint, topic: str, txns) -> None:
    """One librdkafka transactional producer; `txns` is [(commit, kinds)]."""
    p = ck.Producer(ep.ck(**{"transactional.id": f"ab-{uuid.uuid4().hex[:8]}"}))
    p.init_transactions(30)
    i = 0
    for commit, kinds in txns:
        p.begin_transaction()
        for k in kinds:
            r = ps.json_rec(k, i)
            p.produce(topic, key=r.key, value=r.value, headers=list(r.headers), partition=0,
                      timestamp=r.timestamp)
            i += 1
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    h.wait_transactions_settled(int(ep.bootstrap.rsplit(":", 1)[1]), topic)


TXNS = [(True, ["valid", "lat", "valid"]),     # committed poison: diverted
        (False, ["nan", "valid", "enum"]),     # aborted poison: never seen, never diverted
        (True, ["garbage", "valid"])]
COMMITTED_KEYS = [b"k-0-0", b"k-0-1", b"k-0-2", b"k-0-6", b"k-0-7"]
COMMITTED_POISON = [b"k-0-1", b"k-0-6"]


def _pid(batch: ps.BatchHeader) -> int:
    return struct.unpack_from(">q", batch.bytes, 43)[0]


def test_aborted_poison_is_neither_delivered_nor_diverted_committed_poison_is(txn_proxy):
    broker, proxy = txn_proxy
    ep = c.Endpoint(broker.bootstrap, "direct")
    topic = ps.unique_topic(ps.JSON_PREFIX, "aborted")
    c.ck_create_topic(ep, topic, 1)
    _produce_transactions(ep, topic, TXNS)
    # The aborted transaction: the second data batch (control batches are markers).
    data = [b for b in ps.split_batches(ps.fetch_partition(broker.port, topic).records)
            if not b.attributes & 0x20]
    assert len(data) == 3, data
    # Premise: Kafka lists it under read_committed, and direct readers skip it.
    direct_fetch = ps.fetch_partition(broker.port, topic, isolation_level=1)
    assert direct_fetch.aborted == [(_pid(data[1]), data[1].base_offset)]
    direct = c.kp_consume_assign(ep, topic, [0], 5, timeout=30, isolation_level="read_committed")
    assert [r.key for r in direct] == COMMITTED_KEYS

    expected = [r for r in direct if r.key not in set(COMMITTED_POISON)]
    via = c.Endpoint(proxy.bootstrap, "proxy")
    last = expected[-1].offset
    until = lambda got: any(r.offset >= last for r in got)  # noqa: E731
    got = c.kp_consume_assign(via, topic, [0], len(expected), timeout=30,
                              isolation_level="read_committed", until=until)
    assert got == expected
    got = c.ck_consume_assign(via, topic, [0], len(expected), timeout=30,
                              **{"isolation.level": "read_committed"}, until=until)
    assert got == expected
    # Through the proxy, the aborted list arrives as the broker sent it.
    fp = ps.fetch_partition(proxy.broker_port(), topic, isolation_level=1)
    assert fp.aborted == direct_fetch.aborted
    assert (fp.high_watermark, fp.last_stable_offset) == (direct_fetch.high_watermark,
                                                          direct_fetch.last_stable_offset)
    dlt = ps.sorted_by_origin(ps.read_dlt(ep, f"{topic}.dlt"))
    assert [d.key for d in dlt] == COMMITTED_POISON, "only committed poison is diverted"


def test_read_uncommitted_reader_through_the_proxy_gets_no_poison_committed_or_aborted(
        txn_proxy):
    """A read_uncommitted reader sees aborted records (Kafka hands them out and
    lists no aborted transaction), so the proxy judges them like any record:
    the reader gets every valid record, the aborted one included, and no poison.
    What this means for the DLT, as it is today: the aborted poison that such
    a reader was spared is diverted too, so "aborted records never reach the
    DLT" holds only while every reader of the topic is read_committed (the
    test above)."""
    broker, proxy = txn_proxy
    ep = c.Endpoint(broker.bootstrap, "direct")
    topic = ps.unique_topic(ps.JSON_PREFIX, "uncommitted")
    c.ck_create_topic(ep, topic, 1)
    _produce_transactions(ep, topic, TXNS)
    direct = c.kp_consume_assign(ep, topic, [0], 8, timeout=30,
                                 isolation_level="read_uncommitted")
    assert [r.key for r in direct] == [f"k-0-{i}".encode() for i in range(8)]
    assert ps.fetch_partition(broker.port, topic, isolation_level=0).aborted is None
    poison = {b"k-0-1", b"k-0-3", b"k-0-5", b"k-0-6"}
    expected = [r for r in direct if r.key not in poison]
    via = c.Endpoint(proxy.bootstrap, "proxy")
    last = expected[-1].offset
    until = lambda got: any(r.offset >= last for r in got)  # noqa: E731
    got = c.ck_consume_assign(via, topic, [0], len(expected), timeout=30,
                              **{"isolation.level": "read_uncommitted"}, until=until)
    assert got == expected
    got = c.kp_consume_assign(via, topic, [0], len(expected), timeout=30,
                              isolation_level="read_uncommitted", until=until)
    assert got == expected
    dlt = ps.sorted_by_origin(ps.read_dlt(ep, f"{topic}.dlt"))
    assert [d.key for d in dlt] == sorted(poison)
