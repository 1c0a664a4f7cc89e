"""Apicurio Registry's own wire formats, written by Apicurio's own 3.x
Kafka serializers (io.apicurio.registry.serde.avro.AvroKafkaSerializer,
.protobuf.ProtobufKafkaSerializer and .jsonschema.JsonSchemaKafkaSerializer
from apicurio-registry-{avro,protobuf,jsonschema}-serde-kafka 3.1.7, Maven
Central; 3.3.3 has none) registering their schemas in a real Apicurio
Registry 3.3.3 (its v3 API), and judged by antidote:

- `default`: 3.x's default framing, magic byte 0 then the 4-byte content
  id (Default4ByteIdHandler), judged with `wire: confluent` through
  Apicurio's Confluent API, whose ids are content ids;
- `headers-content`: the content id in the `apicurio.value.contentId`
  header (`wire: apicurio-headers, id: content`), the value the bare datum;
- `headers-global`: `use-id=globalId`, the `apicurio.value.globalId`
  header (`id: global`);
- `8byte`: Legacy8ByteIdHandler with `use-id=globalId`, magic byte 0 then
  the 8-byte global id (2.x's default; `wire: apicurio-8byte`);
- `proto-headers`: Protobuf, the content id in the header and Apicurio's
  `Ref` (the type's name) before the message;
- `proto-default`: Protobuf with nothing set: the default framing, then
  the `Ref` where Confluent's indexes would be (`wire: apicurio-4byte`:
  `wire: confluent` would read the `Ref` as indexes, and every record,
  valid or not, would be `poison`);
- `proto-indexes`: Protobuf with `send-indexes=true, send-type-ref=false`:
  the default framing, then Confluent's message indexes instead of the
  `Ref` (`wire: confluent`);
- `json-headers`: JSON Schema, the content id in the header.

The ids antidote reads are resolved through Apicurio's native v3 API
(the Confluent API for `default` and `proto-indexes`). Each schema is
registered first under a seed subject deleted afterwards, so that no
global id equals a content id the records carry: an id read in the wrong
namespace names another schema or none (checked), and the valid records
would not arrive.

Poison mixed in: records that break the policy's coordinates rule (written
by the serializer), a record with the first record's id but bytes that are
no datum, for JSON a document its registered schema refuses, one naming an
id the registry does not have and, with headers, a datum without its
header (librdkafka). Consumed through the proxy by librdkafka: every valid
record once, in order; each invalid one in its class's dead-letter topic
with antidote's context headers. One Apicurio, one proxy and one Java run
for every mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import clients as c
import harness as h
import poison_support as ps
import registry_support as rs
from registry_support import apicurio  # noqa: F401 (fixture)

SERDES_VERSION = "3.1.7"
SERDES_LIB = Path(os.environ.get(
    "APICURIO_SERDES_LIB", h.REPO / ".tools" / f"apicurio-serdes-{SERDES_VERSION}" / "lib"))
PRODUCER = h.REPO / "tests" / "java" / "apicurio" / "ApicurioProducer.java"
UNKNOWN_ID = 987_654
COUNT = 8  # records n = 0..7; n % 4 == 3 breaks the coordinates rule
GARBAGE = b"\xff" * 11  # no Avro datum (a varint too long), no Ref, no indexes, no JSON

# mode -> the policy's `value:` (ApicurioProducer.java says what each writes)
MODES = {
    "default": "{ format: avro, registry: true, wire: confluent }",
    "headers-content": "{ format: avro, registry: true, wire: apicurio-headers, id: content }",
    "headers-global": "{ format: avro, registry: true, wire: apicurio-headers, id: global }",
    "8byte": "{ format: avro, registry: true, wire: apicurio-8byte, id: global }",
    "proto-headers": "{ format: protobuf, registry: true, wire: apicurio-headers, id: content }",
    "json-headers": "{ format: json, registry: true, wire: apicurio-headers, id: content }",
    "proto-indexes": "{ format: protobuf, registry: true, wire: confluent }",
    "proto-default": "{ format: protobuf, registry: true, wire: apicurio-4byte }",
}
# header modes -> (the id header, the version metadata's field it holds)
HEADER = {
    "headers-content": ("apicurio.value.contentId", "contentId"),
    "headers-global": ("apicurio.value.globalId", "globalId"),
    "proto-headers": ("apicurio.value.contentId", "contentId"),
    "json-headers": ("apicurio.value.contentId", "contentId"),
}
POLICIES = "policies:\n" + "".join(f"""
  - name: ap-{m}
    topics: ["ap.{m}.*"]
    value: {v}
    rules:
      - coordinates: {{ lat: /lat, lon: /lon }}
    dead_letter: {{ topic: "{{topic}}.{{class}}.dlt" }}
""" for m, v in MODES.items())


@dataclass
class ApicurioProxy(ps.PolicyProxy):
    registry_url: str = ""

    def config_yaml(self) -> str:
        # `url` is Apicurio's Confluent API; the native API's URL is derived.
        return ps.PolicyProxy.config_yaml(self) + (
            f"schema_registry:\n  url: \"{self.registry_url}\"\n  timeout: 2s\n")


@pytest.fixture(scope="module")
def serdes_lib() -> Path:
    jars = [f"apicurio-registry-{f}-serde-kafka-*.jar" for f in ("avro", "protobuf", "jsonschema")]
    if not (SERDES_LIB.is_dir() and all(any(SERDES_LIB.glob(j)) for j in jars)):
        why = f"Apicurio's serializers not found at {SERDES_LIB}: run scripts/setup.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return SERDES_LIB


def apicurio_proxy(workdir, broker, apicurio, tmp_path_factory, name: str, policies: str):
    """A proxy named `name` with `policies`, reading the real Apicurio: a
    module fixture's body (yield it, then `stop_and_check`)."""
    d = tmp_path_factory.mktemp(name)
    (d / "policies.yaml").write_text(policies)
    import conftest
    p = ApicurioProxy(workdir, upstream=[broker.bootstrap], policies=[d / "policies.yaml"],
                      name=name, registry_url=apicurio.url)
    conftest._PROXIES.append(p)
    p.start()
    return p


@pytest.fixture(scope="module")
def aproxy(workdir, broker, apicurio, tmp_path_factory):
    p = apicurio_proxy(workdir, broker, apicurio, tmp_path_factory,
                       "antidote-apicurio-serdes", POLICIES)
    yield p
    p.stop_and_check()


def check_dlts(broker_endpoint, t: str, written: list, added: list, policy: str) -> None:
    """The topic's poison and unknown DLTs hold exactly the written records
    3 and 7 (coordinates) and the `added` (record, class, rule) after them,
    each a faithful copy with antidote's context."""
    by_offset = {r.offset: r for r in written}
    want = {"poison": [(3, "coordinates"), (7, "coordinates")], "unknown": []}
    for i, (r, klass, rule) in enumerate(added):
        by_offset[COUNT + i] = c.Rec(0, COUNT + i, r.key, r.value, r.headers, 0)
        want[klass].append((COUNT + i, rule))
    for klass, expected in want.items():
        dlt = ps.read_dlt(broker_endpoint, f"{t}.{klass}.dlt")
        ctx = [ps.hdict(x) for x in dlt]
        assert [(int(x["x-original-offset"]), x["x-error-rule"].decode()) for x in ctx] == expected
        for x, hx in zip(dlt, ctx):
            orig = by_offset[int(hx["x-original-offset"])]
            assert hx["x-error-class"].decode() == klass
            ps.check_dlt_record(x, c.Rec(0, orig.offset, orig.key, orig.value, orig.headers,
                                         x.timestamp),
                                t, policy, hx["x-error-rule"].decode(), klass)


def http_json(url: str, method: str = "GET"):
    """The JSON answer of `method` on `url` (text if not JSON); None on 404."""
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
    try:
        return json.loads(text)
    except ValueError:
        return text.decode()


@pytest.fixture(scope="module")
def produced(serdes_lib, apicurio, broker) -> dict[str, str]:
    """Every mode's topic, written by one run of ApicurioProducer.java.
    Apicurio 3.3.3 draws content ids and global ids in step, so a schema's
    first version has global id == content id: seed topics register each
    schema first and are deleted after, leaving no global id equal to the
    content ids the modes carry (and the modes' global ids differ from them)."""
    ep = c.Endpoint(broker.bootstrap, "direct")
    seeds = {m: f"ap.seed-{m}.{uuid.uuid4().hex[:10]}"
             for m in ("headers-content", "proto-headers", "json-headers")}
    topics = {m: f"ap.{m}.{uuid.uuid4().hex[:10]}" for m in MODES}
    runs = list(seeds.items()) + list(topics.items())
    for _, t in runs:
        c.ck_create_topic(ep, t, 1)
    v3 = apicurio.url.removesuffix("/apis/ccompat/v7") + "/apis/registry/v3"
    java = rs.apicurio_java() or "java"
    out = subprocess.run([java, "-cp", f"{serdes_lib}/*", str(PRODUCER), ep.bootstrap,
                          v3, str(COUNT)] + [f"{m}={t}" for m, t in runs],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-4000:]
    sent = json.loads(out.stdout.strip().splitlines()[-1])
    assert sent == {"sent": COUNT * len(runs), "refused": {}}, out.stdout
    for t in seeds.values():
        for q in ("", "?permanent=true"):
            assert http_json(f"{apicurio.url}/subjects/{t}-value{q}", method="DELETE") == [1]
    return topics


def check_framing(mode: str, first: c.Rec, v3: str, topic: str) -> bytes:
    """Asserts that the serializer wrote the framing and the id `mode` says
    (against the registry's metadata of the version it registered), and that
    the same number read as the other kind of id names other content or
    none. Returns the id's bytes as framed."""
    meta = http_json(f"{v3}/groups/default/artifacts/{topic}-value/versions/1")
    assert meta is not None, f"Apicurio has no artifact {topic}-value"
    assert meta["contentId"] != meta["globalId"], meta
    hd = ps.hdict(first)
    if mode in HEADER:
        name, kind = HEADER[mode]
        framed = hd[name]
        assert len(framed) == 8, first.headers
        other = "apicurio.value.globalId" if kind == "contentId" else "apicurio.value.contentId"
        assert other not in hd, first.headers
    else:
        assert first.value[0] == 0 and not first.headers, first
        kind, framed = ("contentId", first.value[1:5]) if mode != "8byte" \
            else ("globalId", first.value[1:9])
        if mode == "proto-indexes":  # Confluent's indexes [0] (count 1, index 0), no Ref
            assert first.value[5:7] == b"\x02\x00", first.value
        if mode == "proto-default":  # Apicurio's Ref { name: "Trigger" }
            assert first.value[5:].startswith(b"\x09\x0a\x07Trigger"), first.value
    n = int.from_bytes(framed, "big")
    assert n == meta[kind], (mode, n, meta)
    own, misread = ("contentIds", "globalIds") if kind == "contentId" \
        else ("globalIds", "contentIds")
    assert http_json(f"{v3}/ids/{misread}/{n}") != http_json(f"{v3}/ids/{own}/{n}")
    return framed


def extras(mode: str, first: c.Rec, framed: bytes) -> list[tuple[c.Rec, str, str]]:
    """Records librdkafka adds after the serializer's, with the class and
    rule each must get: the first record's id before bytes that are no
    datum, (JSON) a document off its schema, an unknown id, and (header
    modes) the datum without its header."""
    unknown = UNKNOWN_ID.to_bytes(len(framed), "big")
    if mode in HEADER:
        name = HEADER[mode][0]
        other = tuple((k, unknown if k == name else v) for k, v in first.headers)
        # JSON: a document the registered JSON Schema refuses (n a string).
        off = c.Rec(0, None, b"k-off-schema", b'{"n": "x", "lat": 10, "lon": 20}', first.headers, 0)
        off_schema = [(off, "poison", "schema")] if mode == "json-headers" else []
        return [(c.Rec(0, None, b"k-garbage", GARBAGE, first.headers, 0), "poison", "decode"),
                *off_schema,
                (c.Rec(0, None, b"k-unknown", first.value, other, 0), "unknown", "schema-id"),
                (c.Rec(0, None, b"k-bare", first.value, (), 0), "unknown", "schema-id")]
    head = 1 + len(framed)
    return [(c.Rec(0, None, b"k-garbage", first.value[:head] + GARBAGE, (), 0), "poison", "decode"),
            (c.Rec(0, None, b"k-unknown", b"\x00" + unknown + first.value[head:], (), 0),
             "unknown", "schema-id")]


@pytest.mark.parametrize("mode", list(MODES))
def test_apicurio_3x_serializers_valid_once_poison_and_unknown_diverted(
        mode, produced, aproxy, apicurio, broker_endpoint):
    t = produced[mode]
    v3 = apicurio.url.removesuffix("/apis/ccompat/v7") + "/apis/registry/v3"
    written = ps.read_dlt(broker_endpoint, t)  # the topic itself, read directly
    assert len(written) == COUNT
    first = written[0]
    added = extras(mode, first, check_framing(mode, first, v3, t))
    # A byte-identical copy of the first record last: once it arrives,
    # every record before it has been judged.
    last = COUNT + len(added)
    again = c.Rec(0, None, first.key, first.value, first.headers, 0)
    c.ck_produce(broker_endpoint, t, [r for r, _, _ in added] + [again])
    aproxy.assert_running()
    ep = c.Endpoint(aproxy.bootstrap, "proxy")
    got = c.ck_consume_assign(ep, t, [0], 10**9, timeout=60,
                              until=lambda g: any(r.offset == last for r in g))
    valid = [n for n in range(COUNT) if n % 4 != 3]
    assert [g.offset for g in got] == valid + [last]
    assert [g.value for g in got] == [written[n].value for n in valid] + [first.value]
    check_dlts(broker_endpoint, t, written, added, f"ap-{mode}")
