"""CEL conditions (`- cel:` rules, issue 56) through the proxy, against the
suite's broker: records that meet the JSON Schema and the field rules but
break a condition across fields are diverted to the DLT naming the rule
(`cel:<name>`), valid ones reach a real consumer exactly once and in
order; at the door (`on_produce: reject`) the same records are refused
with the rule named and never land.
"""

from __future__ import annotations

import dataclasses
import json

import confluent_kafka as ck
import kafka as kp
import kafka.errors as kerr
import pytest

import clients as c
import poison_support as ps

FETCH_PREFIX = "celf."
DOOR_PREFIX = "celd."

# A dwelling device stands still; an unnamed condition over key and headers.
CEL_RULES = """      - cel: 'message.transition != "DWELL" || message.speed_mps < 1.0'
        name: dwell-is-still
      - cel: 'size(key) > 0 && headers["idempotency-key"] != b""'
"""


def cel_policies() -> str:
    def policy(name: str, prefix: str, extra: str) -> str:
        return (f"  - name: {name}\n"
                f"    topics: [\"{prefix}*\"]\n"
                f"    value:\n      format: json\n      schema: {ps.JSON_SCHEMA}\n"
                + ps.RULES.replace("    headers:\n", CEL_RULES + "    headers:\n")
                + extra)
    return ("policies:\n"
            + policy("cel-fetch", FETCH_PREFIX, "    dead_letter:\n      topic: \"{topic}.dlt\"\n")
            + policy("cel-door", DOOR_PREFIX, "    on_produce: reject\n"))


@pytest.fixture(scope="module")
def cel_proxy(workdir, broker, tmp_path_factory):
    d = tmp_path_factory.mktemp("cel-policies")
    (d / "cel.yaml").write_text(cel_policies())
    p = ps.start_policy_proxy(workdir, upstream=[broker.bootstrap], policies=[d / "cel.yaml"],
                              name="antidote-cel")
    yield p
    p.stop_and_check()


def rec(i: int, transition: str, speed) -> c.Rec:
    """Record `i`: valid by the schema and the field rules whatever the
    transition and speed (`None`: no speed_mps, which is optional)."""
    d = ps.trigger(i, transition=transition, speed=speed)
    if speed is None:
        del d["speed_mps"]
    return dataclasses.replace(ps.json_rec("valid", i), value=json.dumps(d).encode())


def test_records_breaking_a_condition_are_diverted_naming_it_and_valid_ones_delivered_once(
        cel_proxy, broker):
    ep = c.Endpoint(broker.bootstrap)
    topic = ps.unique_topic(FETCH_PREFIX)
    c.ck_create_topic(ep, topic, 1)
    recs = [rec(0, "ENTER", 3.5), rec(1, "DWELL", 3.5), rec(2, "DWELL", 0.2),
            rec(3, "DWELL", None), rec(4, "EXIT", 9.0)]
    c.ck_produce(ep, topic, recs)
    valid = [recs[0], recs[2], recs[4]]
    got = ps.read_to_end(c.Endpoint(cel_proxy.bootstrap, "proxy"), topic, 0, 3)
    assert [(r.offset, r.value) for r in got] == [(r.offset, r.value) for r in valid]

    dlt = ps.sorted_by_origin(ps.read_dlt(ep, f"{topic}.dlt"))
    assert ps.origin_offsets(dlt) == [(0, 1), (0, 3)]
    for d, orig in zip(dlt, [recs[1], recs[3]]):
        ps.check_dlt_record(d, orig, topic, "cel-fetch", "cel:dwell-is-still")
    false, error = (ps.hdict(d)["x-error"].decode() for d in dlt)
    assert "is false (message.transition = \"DWELL\", message.speed_mps = 3.5)" in false, false
    assert "column 34: no such field message.speed_mps" in error, error
    cel_proxy.assert_running()


def test_a_condition_over_key_and_headers_diverts_records_without_them(cel_proxy, broker):
    ep = c.Endpoint(broker.bootstrap)
    topic = ps.unique_topic(FETCH_PREFIX, "key")
    c.ck_create_topic(ep, topic, 1)
    keyless = dataclasses.replace(rec(1, "ENTER", 1.0), key=b"")
    recs = [rec(0, "ENTER", 1.0), keyless, rec(2, "ENTER", 1.0)]
    c.ck_produce(ep, topic, recs)
    got = ps.read_to_end(c.Endpoint(cel_proxy.bootstrap, "proxy"), topic, 0, 2)
    assert [r.offset for r in got] == [0, 2]
    dlt = ps.read_dlt(ep, f"{topic}.dlt")
    assert ps.origin_offsets(dlt) == [(0, 1)]
    rule = 'cel:size(key) > 0 && headers["idempotency-key"] != b""'
    ps.check_dlt_record(dlt[0], keyless, topic, "cel-fetch", rule)


def test_at_the_door_a_broken_condition_is_refused_naming_the_rule(cel_proxy, broker):
    ep = c.Endpoint(broker.bootstrap)
    topic = ps.unique_topic(DOOR_PREFIX)
    c.ck_create_topic(ep, topic, 1)
    p = kp.KafkaProducer(**c.Endpoint(cel_proxy.bootstrap, "proxy").kp(
        linger_ms=5, retries=0, max_in_flight_requests_per_connection=1))
    recs = [rec(0, "ENTER", 3.5), rec(1, "DWELL", 3.5), rec(2, "DWELL", 0.0)]
    try:
        futs = []
        for r in recs:
            futs.append(p.send(topic, value=r.value, key=r.key, headers=list(r.headers)))
            p.flush(30)
        assert futs[0].get(timeout=30).offset == 0
        assert futs[2].get(timeout=30).offset == 1
        with pytest.raises(kerr.InvalidRecordError) as refused:
            futs[1].get(timeout=30)
    finally:
        p.close(10)
    text = str(refused.value)
    assert "policy cel-door, rule cel:dwell-is-still (poison)" in text, text
    landed = c.ck_consume_assign(ep, topic, [0], 2, timeout=30)
    assert [r.value for r in landed] == [recs[0].value, recs[2].value]
    # librdkafka: the same refusal, as INVALID_RECORD.
    prod = ck.Producer(c.Endpoint(cel_proxy.bootstrap, "proxy").ck(
        **{"linger.ms": 5, "message.send.max.retries": 0}))
    errors = []
    bad = rec(3, "DWELL", 2.0)
    prod.produce(topic, value=bad.value, key=bad.key, headers=list(bad.headers),
                 on_delivery=lambda err, _m: errors.append(err))
    assert prod.flush(30) == 0
    assert errors and errors[0].code() == ck.KafkaError.INVALID_RECORD, errors
    cel_proxy.assert_running()
