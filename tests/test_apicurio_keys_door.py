"""Apicurio Registry's own framings on record keys, and at the door
(`on_produce: reject`), written by Apicurio's own 3.x Java serializers
(apicurio-registry-avro-serde-kafka 3.1.7, tests/java/apicurio/
ApicurioProducer.java) against a real Apicurio Registry 3.3.3, as in
tests/test_apicurio_serdes.py (which covers values on fetch):

- keys on fetch: `keys-headers` (Avro keys and values, each id in its own
  header: `apicurio.key.contentId`, `apicurio.value.contentId`) and
  `keys-8byte` (both Legacy8ByteIdHandler with global ids), judged by a
  policy with `key:` and `value:` in that wire. The key schema (geo.DeviceKey)
  is not the value's (geo.Trigger), so a key read with the value's id does
  not decode: a policy reading the key with the value's header, or the
  8-byte key as 4 bytes, diverts every record (checked, the controls).
  Poison keys mixed in by librdkafka: bytes that are no datum, the value's
  id for a key datum, an unknown id, a missing or short key header, another
  magic byte; each in its DLT with rule `key.*`, the valid records
  delivered once, in order.
- the door: the Java serializers produce through the proxy (headers and
  8-byte, values alone and with keys): the records that break the
  coordinates rule fail with InvalidRecordException naming the rule, the
  others are written; then a librdkafka batch of valid records with one
  poison record (value or key) is refused whole and never written, the
  same batch without it lands.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import confluent_kafka as ck
import pytest

import clients as c
import poison_support as ps
import registry_support as rs
from registry_support import apicurio  # noqa: F401 (fixture)
from test_apicurio_serdes import (COUNT, GARBAGE, PRODUCER, UNKNOWN_ID,  # noqa: F401
                                  apicurio_proxy, check_dlts, http_json, serdes_lib)
from test_produce_door import ck_send, read_back

HEADERS = "{ format: avro, registry: true, wire: apicurio-headers }"
EIGHT = "{ format: avro, registry: true, wire: apicurio-8byte }"
# name, topics, key, value, on_produce
POLICY_ROWS = [
    ("apk-keys-headers", "apk.keys-headers.*", HEADERS, HEADERS, ""),
    ("apk-keys-8byte", "apk.keys-8byte.*", EIGHT, EIGHT, ""),
    # Controls: the key read with the value's id (its header; 4 of its 8 bytes).
    ("apk-wrong-header", "apk.wrong-header.*",
     "{ format: avro, registry: true, wire: apicurio-headers, id_header: apicurio.value.contentId }",
     HEADERS, ""),
    ("apk-wrong-8byte", "apk.wrong-8byte.*",
     "{ format: avro, registry: true, wire: apicurio-4byte, id: global }", EIGHT, ""),
    ("apd-headers-content", "apd.headers-content.*", "", HEADERS, "reject"),
    ("apd-8byte", "apd.8byte.*", "", EIGHT, "reject"),
    ("apd-keys-headers", "apd.keys-headers.*", HEADERS, HEADERS, "reject"),
    ("apd-keys-8byte", "apd.keys-8byte.*", EIGHT, EIGHT, "reject"),
]
POLICIES = "policies:\n" + "".join(
    f"""
  - name: {name}
    topics: ["{topics}"]
""" + (f"    key: {key}\n" if key else "") + f"""    value: {value}
    rules:
      - coordinates: {{ lat: /lat, lon: /lon }}
    dead_letter: {{ topic: "{{topic}}.{{class}}.dlt" }}
""" + (f"    on_produce: {door}\n" if door else "")
    for name, topics, key, value, door in POLICY_ROWS)
KEY_MODES = ["keys-headers", "keys-8byte"]
DOOR_MODES = ["headers-content", "8byte", "keys-headers", "keys-8byte"]
VALID = [n for n in range(COUNT) if n % 4 != 3]


@pytest.fixture(scope="module")
def kproxy(workdir, broker, apicurio, tmp_path_factory):
    p = apicurio_proxy(workdir, broker, apicurio, tmp_path_factory,
                       "antidote-apicurio-keys-door", POLICIES)
    yield p
    p.stop_and_check()


def run_producer(serdes_lib, apicurio, bootstrap: str, runs: list[tuple[str, str]]) -> dict:
    v3 = apicurio.url.removesuffix("/apis/ccompat/v7") + "/apis/registry/v3"
    java = rs.apicurio_java() or "java"
    out = subprocess.run([java, "-cp", f"{serdes_lib}/*", str(PRODUCER), bootstrap, v3,
                          str(COUNT)] + [f"{m}={t}" for m, t in runs],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def produced(serdes_lib, apicurio, broker) -> dict[str, str]:
    """The key modes' topics, written straight to the broker. A seed topic
    registers both schemas first and is deleted after, so that the content
    ids the headers carry are no global id (test_apicurio_serdes.produced)."""
    ep = c.Endpoint(broker.bootstrap, "direct")
    seed = f"apk.seed.{uuid.uuid4().hex[:10]}"
    topics = {m: f"apk.{m}.{uuid.uuid4().hex[:10]}" for m in KEY_MODES}
    runs = [("keys-headers", seed)] + list(topics.items())
    for _, t in runs:
        c.ck_create_topic(ep, t, 1)
    sent = run_producer(serdes_lib, apicurio, ep.bootstrap, runs)
    assert sent == {"sent": COUNT * len(runs), "refused": {}}, sent
    for side in ("key", "value"):
        for q in ("", "?permanent=true"):
            assert http_json(f"{apicurio.url}/subjects/{seed}-{side}{q}", method="DELETE") == [1]
    return topics


def key_extras(mode: str, first: c.Rec) -> list[tuple[c.Rec, str, str]]:
    """Records with the first record's valid value and a bad key, with the
    class and rule each must get."""
    def rec(tag: str, key: bytes, headers=first.headers) -> c.Rec:
        return c.Rec(0, None, key, first.value, tuple(headers), 0)

    if mode == "keys-headers":
        hd = ps.hdict(first)
        kid, vid = hd["apicurio.key.contentId"], hd["apicurio.value.contentId"]
        assert len(kid) == 8 and kid != vid, first.headers

        def with_key_id(v):
            return [(k, v if k == "apicurio.key.contentId" else x) for k, x in first.headers
                    if v is not None or k != "apicurio.key.contentId"]
        return [(rec("garbage", GARBAGE), "poison", "key.decode"),
                (rec("value-id", first.key, with_key_id(vid)), "poison", "key.decode"),
                (rec("short", first.key, with_key_id(kid[4:])), "poison", "key.decode"),
                (rec("unknown", first.key, with_key_id(UNKNOWN_ID.to_bytes(8, "big"))),
                 "unknown", "key.schema-id"),
                (rec("bare", first.key, with_key_id(None)), "unknown", "key.schema-id")]
    assert first.key[0] == 0 and first.value[0] == 0 and not first.headers, first
    assert first.key[1:9] != first.value[1:9], first
    return [(rec("garbage", first.key[:9] + GARBAGE), "poison", "key.decode"),
            (rec("value-id", first.value[:9] + first.key[9:]), "poison", "key.decode"),
            (rec("magic", b"\x01" + first.key[1:]), "poison", "key.decode"),
            (rec("unknown", b"\x00" + UNKNOWN_ID.to_bytes(8, "big") + first.key[9:]),
             "unknown", "key.schema-id")]


def consume_through(proxy, topic: str, last: int) -> list[c.Rec]:
    ep = c.Endpoint(proxy.bootstrap, "proxy")
    return c.ck_consume_assign(ep, topic, [0], 10**9, timeout=60,
                               until=lambda g: any(r.offset == last for r in g))


@pytest.mark.parametrize("mode", KEY_MODES)
def test_apicurio_keys_valid_once_poison_and_unknown_keys_diverted(
        mode, produced, kproxy, broker_endpoint):
    t = produced[mode]
    written = ps.read_dlt(broker_endpoint, t)
    assert len(written) == COUNT
    first = written[0]
    added = key_extras(mode, first)
    last = COUNT + len(added)  # a copy of the first record last: all before it judged
    c.ck_produce(broker_endpoint, t, [r for r, _, _ in added]
                 + [c.Rec(0, None, first.key, first.value, first.headers, 0)])
    got = consume_through(kproxy, t, last)
    assert [g.offset for g in got] == VALID + [last]
    assert [(g.key, g.value) for g in got] == \
        [(written[n].key, written[n].value) for n in VALID] + [(first.key, first.value)]
    check_dlts(broker_endpoint, t, written, added, f"apk-{mode}")


@pytest.mark.parametrize("mode,control,klass,rule", [
    ("keys-headers", "wrong-header", "poison", "key.decode"),  # a DeviceKey read as a Trigger
    ("keys-8byte", "wrong-8byte", "unknown", "key.schema-id"),  # global id 0: the top 4 bytes
])
def test_a_key_read_with_the_values_id_is_diverted(mode, control, klass, rule, produced, kproxy,
                                                   broker_endpoint):
    """The controls: the same valid records under a policy that reads the
    key with the value's id (header, or 4 of the 8 bytes) are all diverted,
    so the tests above would see a key framing read wrongly."""
    written = [r for r in ps.read_dlt(broker_endpoint, produced[mode]) if r.offset in VALID]
    t = f"apk.{control}.{uuid.uuid4().hex[:10]}"
    c.ck_create_topic(broker_endpoint, t, 1)
    c.ck_produce(broker_endpoint, t, [c.Rec(0, None, r.key, r.value, r.headers, 0)
                                      for r in written])
    # To the end of the partition through the proxy: past every record.
    assert ps.read_to_end(c.Endpoint(kproxy.bootstrap, "proxy"), t, 0, 0) == []
    dlt = [ps.hdict(x) for x in ps.read_dlt(broker_endpoint, f"{t}.{klass}.dlt")]
    assert [(int(x["x-original-offset"]), x["x-error-rule"].decode()) for x in dlt] == \
        [(n, rule) for n in range(len(VALID))]


# ---------------------------------------------------------------------------
# The door
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def door_produced(serdes_lib, apicurio, kproxy, broker) -> tuple[dict, dict]:
    """One Java run through the proxy's door: every door mode's topic and
    what the producer reported."""
    topics = {m: f"apd.{m}.{uuid.uuid4().hex[:10]}" for m in DOOR_MODES}
    for t in topics.values():
        c.ck_create_topic(c.Endpoint(broker.bootstrap), t, 1)
    return topics, run_producer(serdes_lib, apicurio, kproxy.bootstrap, list(topics.items()))


@pytest.mark.parametrize("mode", DOOR_MODES)
def test_apicurio_serializers_at_the_door_poison_refused_naming_the_rule(
        mode, door_produced, broker):
    topics, report = door_produced
    t = topics[mode]
    refused = report["refused"].get(t, [])
    assert [int(r.split(" ", 1)[0]) for r in refused] == [3, 7], report
    for r in refused:
        assert "InvalidRecordException" in r and "rule coordinates (poison)" in r, r
        assert f"apd-{mode}" in r, r
    got = read_back(broker, t, 0, len(VALID))
    assert len(got) == len(VALID)
    # What was written is the serializer's framing, unchanged.
    if mode.endswith("8byte"):
        assert all(r.value[0] == 0 and not r.headers for r in got), got
    else:
        assert all("apicurio.value.contentId" in ps.hdict(r) for r in got), got
    if mode.startswith("keys"):
        assert all(r.key is not None and r.key != b"" for r in got), got


def door_poison(mode: str, first: c.Rec) -> c.Rec:
    """The first record with no datum where its value (or, key modes, its
    key) should be."""
    cut = 0 if "headers" in mode else 9
    if mode.startswith("keys"):
        return c.Rec(0, None, first.key[:cut] + GARBAGE, first.value, first.headers, 0)
    return c.Rec(0, None, first.key, first.value[:cut] + GARBAGE, first.headers, 0)


@pytest.mark.parametrize("mode", DOOR_MODES)
def test_a_batch_with_one_apicurio_poison_record_is_refused_whole(
        mode, door_produced, kproxy, broker):
    topics, _ = door_produced
    t = topics[mode]
    written = read_back(broker, t, 0, len(VALID))
    assert len(written) == len(VALID)
    again = [c.Rec(0, None, r.key, r.value, r.headers, 0) for r in written[:3]]
    batch = again[:2] + [door_poison(mode, written[0])] + again[2:]
    ep = c.Endpoint(kproxy.bootstrap, "proxy")
    errors = ck_send(ep, t, batch, flush_each=False, **{"linger.ms": 200})
    assert all(e is not None and e.code() == ck.KafkaError.INVALID_RECORD for e in errors), errors
    assert len(read_back(broker, t, 0, len(VALID))) == len(VALID)
    errors = ck_send(ep, t, again, flush_each=False, **{"linger.ms": 200})
    assert errors == [None] * len(again), errors
    after = read_back(broker, t, 0, len(VALID) + len(again))
    assert [(r.key, r.value, r.headers) for r in after[len(VALID):]] == \
        [(r.key, r.value, r.headers) for r in again]
