"""Transparency: with no policies, a client through antidote sees exactly what it
sees talking to the broker directly. Each test runs on both paths (`direct`
validates the test itself against the broker; `proxy` is the claim)."""

from __future__ import annotations

import uuid

import pytest

import clients as c
from harness import needs_kafka

CODECS = ["gzip", "snappy", "lz4", "zstd"]


def expected(recs: list[c.Rec]) -> list[c.Rec]:
    return list(recs)


# --- admin -------------------------------------------------------------------

def test_admin_create_topics_librdkafka_creates_requested_partitions(endpoint, broker_endpoint):
    name = f"admin-ck-{uuid.uuid4().hex[:8]}"
    c.ck_create_topic(endpoint, name, partitions=3)
    assert c.ck_partition_count(broker_endpoint, name) == 3


def test_admin_create_topics_kafka_python_creates_requested_partitions(endpoint, broker_endpoint):
    name = f"admin-kp-{uuid.uuid4().hex[:8]}"
    c.kp_create_topic(endpoint, name, partitions=2)
    assert c.ck_partition_count(broker_endpoint, name) == 2


# --- produce and assign() consume ---------------------------------------------

def test_librdkafka_produce_then_assign_reads_same_records_on_every_partition(endpoint, new_topic):
    topic = new_topic(3)
    recs = [r for p in range(3) for r in c.sample_records(6, partition=p, tag=f"p{p}")]
    c.ck_produce(endpoint, topic, recs)
    got = c.ck_consume_assign(endpoint, topic, [0, 1, 2], len(recs))
    assert c.by_partition_in_order(got) == c.by_partition_in_order(recs)


def test_kafka_python_produce_then_assign_reads_same_records_on_every_partition(endpoint,
                                                                                 new_topic):
    topic = new_topic(2)
    recs = [r for p in range(2) for r in c.sample_records(6, partition=p, tag=f"p{p}")]
    offsets = c.kp_produce(endpoint, topic, recs)
    assert offsets == [r.offset for r in recs]
    got = c.kp_consume_assign(endpoint, topic, [0, 1], len(recs))
    assert c.by_partition_in_order(got) == c.by_partition_in_order(recs)


def test_idempotent_librdkafka_producer_writes_each_record_once(endpoint, new_topic, broker_endpoint):
    topic = new_topic(1)
    recs = c.sample_records(20, tag="idem")
    c.ck_produce(endpoint, topic, recs, **{"enable.idempotence": True})
    got = c.kp_consume_assign(broker_endpoint, topic, [0], len(recs))
    assert got == recs


# --- consumer groups with commits --------------------------------------------

def test_librdkafka_group_consumer_reads_all_and_commits_offsets(endpoint, new_topic):
    topic = new_topic(2)
    recs = [r for p in range(2) for r in c.sample_records(4, partition=p, tag=f"g{p}")]
    c.ck_produce(endpoint, topic, recs)
    group = f"grp-ck-{uuid.uuid4().hex[:8]}"
    got = c.ck_consume_group(endpoint, topic, group, len(recs), timeout=120)
    assert c.by_partition_in_order(got) == c.by_partition_in_order(recs)
    assert c.ck_committed(endpoint, topic, group, [0, 1]) == {0: 4, 1: 4}


def test_kafka_python_group_consumer_reads_all_and_commits_offsets(endpoint, new_topic):
    topic = new_topic(2)
    recs = [r for p in range(2) for r in c.sample_records(4, partition=p, tag=f"g{p}")]
    c.kp_produce(endpoint, topic, recs)
    group = f"grp-kp-{uuid.uuid4().hex[:8]}"
    got = c.kp_consume_group(endpoint, topic, group, len(recs), timeout=120)
    assert c.by_partition_in_order(got) == c.by_partition_in_order(recs)
    assert c.kp_committed(endpoint, topic, group, [0, 1]) == {0: 4, 1: 4}


# --- compression ----------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_compressed_batches_read_back_exactly_by_both_clients(endpoint, new_topic,
                                                                          codec):
    topic = new_topic(1)
    recs = c.sample_records(30, tag=codec)
    # One batch holding all records, so the codec really applies to a multi-record batch.
    c.ck_produce(endpoint, topic, recs, **{"compression.type": codec, "linger.ms": 200})
    assert c.ck_consume_assign(endpoint, topic, [0], len(recs)) == recs
    assert c.kp_consume_assign(endpoint, topic, [0], len(recs)) == recs


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_compressed_batches_read_back_exactly_by_both_clients(endpoint, new_topic,
                                                                            codec):
    topic = new_topic(1)
    recs = c.sample_records(30, tag=codec)
    c.kp_produce(endpoint, topic, recs, compression_type=codec, linger_ms=200)
    assert c.kp_consume_assign(endpoint, topic, [0], len(recs)) == recs
    assert c.ck_consume_assign(endpoint, topic, [0], len(recs)) == recs


# --- transactions ----------------------------------------------------------------

def _broker_lists_aborted_transactions(broker, topic: str) -> bool:
    """Does the broker's own read_committed Fetch name any aborted transaction?"""
    import socket
    import harness as h
    with socket.create_connection((h.HOST, broker.port), timeout=10) as s:
        body = h.roundtrip(s, 1, 11, 1, h.fetch_v11_body(topic, 0, 0, isolation_level=1))
    _err, topics = h.parse_fetch_v11(body)
    return bool(topics[topic][0].aborted)


@needs_kafka
def test_read_committed_consumers_see_only_committed_transactions(endpoint, new_topic, broker,
                                                                  broker_endpoint):
    import confluent_kafka as ck
    topic = new_topic(1)
    committed = c.sample_records(5, tag="commit")
    aborted = c.sample_records(5, tag="abort")
    # A last committed record shows the consumer read past the aborted range.
    tail = c.Rec(0, 0, b"tail", b"after-abort", (), 1_700_000_999_000)
    p = ck.Producer(endpoint.ck(**{"transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                                   "transaction.timeout.ms": 60000}))
    p.init_transactions(30)
    for batch, commit in ((committed, True), (aborted, False), ([tail], True)):
        p.begin_transaction()
        for r in batch:
            p.produce(topic, key=r.key, value=r.value, headers=c._ck_headers(r.headers),
                      timestamp=r.timestamp)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)

    def content(recs):  # offsets include control records: compare content only
        return [(r.key, r.value, r.headers, r.timestamp) for r in recs]

    def saw_tail(recs):
        return any(r.key == b"tail" for r in recs)

    rc = {"isolation.level": "read_committed"}
    got_ck = c.ck_consume_assign(endpoint, topic, [0], 11, until=saw_tail, **rc)
    got_kp = c.kp_consume_assign(endpoint, topic, [0], 11, until=saw_tail,
                                 isolation_level="read_committed")
    # read_uncommitted sees everything, so the test can tell the two apart.
    got_all = c.ck_consume_assign(endpoint, topic, [0], 11,
                                  **{"isolation.level": "read_uncommitted"})
    assert content(got_all) == content(committed + aborted + [tail])
    # Whatever the broker decides, the path under test must agree with it exactly.
    assert got_ck == c.ck_consume_assign(broker_endpoint, topic, [0], 11, until=saw_tail, **rc)
    assert got_kp == c.kp_consume_assign(broker_endpoint, topic, [0], 11, until=saw_tail,
                                         isolation_level="read_committed")
    # The premise: the broker names the aborted transaction under read_committed
    # (Kafka does; tansu 0.6 sends an empty list, so this test needs Kafka).
    assert _broker_lists_aborted_transactions(broker, topic)
    assert content(got_ck) == content(committed + [tail])
    assert content(got_kp) == content(committed + [tail])


# --- acks=0 ---------------------------------------------------------------------

def test_acks_zero_producer_keeps_its_connection_when_the_broker_answers_anyway(
        tmp_path, broker, new_topic):
    """acks=0 through the proxy, every record lands in order. Kafka never
    answers a Produce with acks=0 (the default run shows acks=0 as Kafka does
    it); tansu 0.6 does answer, and under ANTIDOTE_TEST_BROKER=tansu this
    shows that the proxy drops that answer (the client expects none) instead
    of ending the connection over an unsolicited frame."""
    import time
    import confluent_kafka as ck
    from harness import Antidote
    topic = new_topic(1)
    proxy = Antidote(tmp_path, upstream=[broker.bootstrap], name="acks0").start()
    try:
        p = ck.Producer(c.Endpoint(proxy.bootstrap).ck(**{"acks": 0, "linger.ms": 0}))
        sent = [f"v{i}".encode() for i in range(10)]
        for v in sent:
            p.produce(topic, value=v, partition=0)
            assert p.flush(10) == 0
            time.sleep(0.1)  # the broker's answer arrives while the connection is open
        got = c.ck_consume_assign(c.Endpoint(broker.bootstrap), topic, [0], len(sent))
        assert [r.value for r in got] == sent
        log = proxy.log.read_text()
        assert "unsolicited" not in log, log
        del p
    finally:
        proxy.stop_and_check()
