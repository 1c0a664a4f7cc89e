"""Clients may not write to dead-letter topics through the proxy (by default).

Whoever writes to a DLT can forge the `x-original-*` headers the once-only
ledger is rebuilt from, and so make a restarted proxy hide chosen valid
records. The partitions of a DLT topic in a client's Produce get
TOPIC_AUTHORIZATION_FAILED; other topics in the same request are written and
answered as the broker answers them; with acks=0 the connection is closed
after the refusal, as Kafka closes it. `dead_letter.allow_client_produce:
true` turns the refusal off. Real clients (librdkafka, kafka-python) against the suite's broker (Apache Kafka).
"""

from __future__ import annotations

import time

import confluent_kafka as ck
import kafka as kp
import kafka.errors as kerr
import pytest

import clients as c
import poison_support as ps

TOPIC_AUTHORIZATION_FAILED = 29


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return ps.write_policies(tmp_path_factory.mktemp("edge-dlt-policies"))


@pytest.fixture(scope="module")
def guarded(workdir, broker, policy_file):
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                              name="antidote-dlt-guard")
    yield p
    p.stop_and_check()


@pytest.fixture
def topics(broker_endpoint):
    """A policy topic's DLT (created up front, so only the proxy can refuse
    the write) and an ordinary topic."""
    dlt = ps.unique_topic(ps.JSON_PREFIX, "guard") + ".dlt"
    plain = ps.unique_topic("edge-plain.")
    c.ck_create_topic(broker_endpoint, dlt)
    c.ck_create_topic(broker_endpoint, plain)
    return dlt, plain


def ck_send_both(ep: c.Endpoint, dlt: str, plain: str, **conf) -> dict[str, object]:
    """One librdkafka producer, one record to each topic, flushed together
    (one Produce request to the single broker); returns topic -> error."""
    p = ck.Producer(ep.ck(**{"linger.ms": 100, "message.send.max.retries": 0, **conf}))
    errors: dict[str, object] = {}

    def report(err, msg):
        errors[msg.topic()] = err

    p.produce(dlt, value=b"forged", headers=[("x-original-offset", b"3")], on_delivery=report)
    p.produce(plain, value=b"ordinary", on_delivery=report)
    assert p.flush(30) == 0, "records left undelivered"
    return errors


def test_librdkafka_write_to_a_dlt_is_refused_and_the_other_topic_is_written(
        guarded, broker, topics):
    dlt, plain = topics
    errors = ck_send_both(c.Endpoint(guarded.bootstrap, "proxy"), dlt, plain)
    assert errors[plain] is None
    assert errors[dlt] is not None
    assert errors[dlt].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[dlt]
    assert ps.high_watermark(broker.port, plain) == 1
    assert ps.high_watermark(broker.port, dlt) == 0, "the forged record reached the DLT"
    guarded.assert_running()


def test_librdkafka_acks_zero_write_to_a_dlt_is_dropped_and_the_connection_closed(
        guarded, broker, topics):
    """acks=0: the producer cannot be told of the refusal, so the proxy
    closes the connection after it, as Kafka does for an acks=0 request it
    refuses (requests pipelined behind it on that connection are lost, as
    with Kafka: acks=0 promises nothing). librdkafka reconnects by itself
    and later records land."""
    dlt, plain = topics
    ep = c.Endpoint(guarded.bootstrap, "proxy")
    p = ck.Producer(ep.ck(**{"linger.ms": 0, "acks": 0}))
    p.produce(plain, value=b"before")
    assert p.flush(30) == 0
    p.produce(dlt, value=b"forged", headers=[("x-original-offset", b"3")])
    assert p.flush(30) == 0
    time.sleep(0.5)
    deadline = time.monotonic() + 20
    while ps.high_watermark(broker.port, plain) < 2 and time.monotonic() < deadline:
        p.produce(plain, value=b"after")
        p.flush(30)
        time.sleep(0.5)
    assert ps.high_watermark(broker.port, plain) >= 2
    assert ps.high_watermark(broker.port, dlt) == 0


def test_kafka_python_write_to_a_dlt_is_refused_and_the_other_topic_is_written(
        guarded, broker, topics):
    dlt, plain = topics
    ep = c.Endpoint(guarded.bootstrap, "proxy")
    p = kp.KafkaProducer(**ep.kp(linger_ms=100, retries=0))
    try:
        forged = p.send(dlt, value=b"forged", headers=[("x-original-offset", b"3")])
        ordinary = p.send(plain, value=b"ordinary")
        p.flush(30)
        assert ordinary.get(timeout=30).offset == 0
        with pytest.raises(kerr.TopicAuthorizationFailedError):
            forged.get(timeout=30)
    finally:
        p.close(10)
    assert ps.high_watermark(broker.port, plain) == 1
    assert ps.high_watermark(broker.port, dlt) == 0


def test_allow_client_produce_lets_dlt_writes_through(workdir, broker, policy_file, topics):
    dlt, plain = topics
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[policy_file],
                              dead_letter={"allow_client_produce": "true"},
                              name="antidote-dlt-allowed")
    try:
        errors = ck_send_both(c.Endpoint(p.bootstrap, "proxy"), dlt, plain)
        assert errors == {dlt: None, plain: None}
        assert ps.high_watermark(broker.port, dlt) == 1
    finally:
        p.stop_and_check()


def test_an_acks_zero_write_to_a_dlt_closes_the_connection_after_the_pending_answers(
        guarded, broker, topics):
    """On the wire: a Metadata request, then an acks=0 Produce v3 to the DLT,
    then another Metadata. The first is answered, then the connection closes
    without an answer to the last (nothing written to the DLT)."""
    import socket
    import struct
    import harness as h
    from test_kafka_edges import batch, closed_within, metadata_v1, produce_v3_parts
    dlt, _plain = topics
    with socket.create_connection((h.HOST, guarded.broker_port()), timeout=10) as s:
        s.sendall(h.request_frame(3, 1, 71, metadata_v1(dlt))
                  + h.request_frame(0, 3, 72, produce_v3_parts(dlt, [(0, batch([b"forged"]))], 0))
                  + h.request_frame(3, 1, 73, metadata_v1(dlt)))
        s.settimeout(10)
        size = struct.unpack(">i", h.recv_exact(s, 4))[0]
        assert struct.unpack(">i", h.recv_exact(s, size)[:4])[0] == 71
        assert closed_within(s, 10), "the connection stayed open after the refused acks=0 write"
    assert ps.high_watermark(broker.port, dlt) == 0
