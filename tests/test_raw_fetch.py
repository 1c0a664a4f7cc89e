"""Hand-built Fetch v11 requests (non-flexible, topic by name) sent over raw
sockets: what comes back through antidote must be byte-identical to what the
broker answers directly, for batches that no policy touches."""

from __future__ import annotations

import socket
import uuid

import pytest

import clients as c
import harness as h


def raw_fetch(port: int, topic: str, isolation_level: int = 0) -> bytes:
    """Fetch v11 of partition 0 from offset 0; the response after its correlation id."""
    with socket.create_connection((h.HOST, port), timeout=10) as s:
        s.settimeout(10)
        return h.roundtrip(s, 1, 11, 42, h.fetch_v11_body(topic, 0, 0, isolation_level))


def fetch_port(path: str, broker, request) -> int:
    """Port of the broker's node on this path (the proxy serves node N at base + N)."""
    if path == "direct":
        return broker.port
    return request.getfixturevalue("proxy").broker_port()


def test_raw_fetch_v11_returns_exactly_the_produced_records(path, broker, broker_endpoint,
                                                            new_topic, request):
    topic = new_topic(1)
    recs = c.sample_records(12, tag="raw")
    c.kp_produce(broker_endpoint, topic, recs)  # uncompressed by default
    err, topics = h.parse_fetch_v11(raw_fetch(fetch_port(path, broker, request), topic))
    assert err == 0
    [part] = topics[topic]
    assert (part.partition, part.error_code, part.high_watermark) == (0, 0, len(recs))
    decoded = [c.Rec(0, r.offset, r.key, r.value, tuple(r.headers), r.timestamp)
               for r in h.decode_uncompressed_batches(part.records)]
    assert decoded == recs


def _produce_plain(ep, topic):
    c.kp_produce(ep, topic, c.sample_records(12, tag="plain"))


def _produce_codec(codec):
    def produce(ep, topic):
        c.ck_produce(ep, topic, c.sample_records(25, tag=codec),
                     **{"compression.type": codec, "linger.ms": 100})
        c.kp_produce(ep, topic, c.sample_records(5, tag="kp" + codec), compression_type=codec)
    return produce


def _produce_transactions(ep, topic):
    import confluent_kafka as ck
    p = ck.Producer(ep.ck(**{"transactional.id": f"raw-{uuid.uuid4().hex[:8]}"}))
    p.init_transactions(30)
    for i, commit in enumerate((True, False, True)):
        p.begin_transaction()
        for j in range(4):
            p.produce(topic, key=f"k{i}{j}".encode(), value=f"v{i}{j}".encode(), partition=0)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    h.wait_transactions_settled(int(ep.bootstrap.rsplit(":", 1)[1]), topic)


DATASETS = {"plain": _produce_plain, "gzip": _produce_codec("gzip"),
            "snappy": _produce_codec("snappy"), "lz4": _produce_codec("lz4"),
            "zstd": _produce_codec("zstd"), "transactions": _produce_transactions}


@pytest.mark.parametrize("isolation_level", [0, 1], ids=["read_uncommitted", "read_committed"])
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_raw_fetch_response_through_proxy_is_byte_identical_to_broker(dataset, isolation_level,
                                                                     broker, broker_endpoint,
                                                                     proxy, new_topic):
    topic = new_topic(1)
    DATASETS[dataset](broker_endpoint, topic)
    direct = raw_fetch(broker.port, topic, isolation_level)
    via_proxy = raw_fetch(proxy.broker_port(), topic, isolation_level)
    _, d_topics = h.parse_fetch_v11(direct)
    err, p_topics = h.parse_fetch_v11(via_proxy)
    assert err == 0
    assert d_topics[topic][0].records, "broker returned no records: test data missing"
    # The records section first, for a readable failure; then every other byte.
    assert p_topics[topic][0].records == d_topics[topic][0].records
    assert via_proxy == direct
