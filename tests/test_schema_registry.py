"""Policies backed by a schema registry (`registry: true`), against the suite's broker (Apache Kafka),
with records written by confluent-kafka's own `confluent_kafka.schema_registry`
serializers (AvroSerializer, ProtobufSerializer, JSONSerializer) registering
through a stub registry (tests/registry_stub.py), so the wire framing, the
magic byte and the Protobuf message indexes come from the real client. The
tests that are not about outages run against Apicurio Registry too
(tests/registry_support.py), through its Confluent API.

Covers: the three formats, two versions of one subject, references (an Avro
named type and a Protobuf import in another subject), an unknown id, an id
under the wrong subject, a soft-deleted version, keys, redaction, and a
registry outage mid-stream (down, 500, slow): the partition is held at the first record whose schema
is not known, nothing before it is lost, nothing from it on is delivered,
nothing is dead-lettered, and it resumes by itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

import clients as c
import harness as h
import poison_support as ps
import registry_support as rs
from registry_support import apicurio, registry  # noqa: F401 (fixtures)
from registry_stub import Registry

AUTH = ("antidote", "s3cret-reg")

POLICIES = """
policies:
  - name: sr-avro
    topics: ["sr.avro.*"]
    value: { format: avro, wire: confluent, registry: true, subject: "{topic}-value" }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
      - field: /ssn
        absent: true
        class: redact
    dead_letter: { topic: "{topic}.{class}.dlt" }
  - name: sr-proto
    topics: ["sr.proto.*"]
    value: { format: protobuf, wire: confluent, registry: true, subject: "{topic}-value", message: geo.Trigger }
    rules:
      - coordinates: { lat: /at/lat, lon: /at/lon }
  - name: sr-json
    topics: ["sr.json.*"]
    value: { format: json, wire: confluent, registry: true, subject: "{topic}-value" }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
  - name: sr-keyed
    topics: ["sr.keyed.*"]
    key: { format: avro, wire: confluent, registry: true, subject: "{topic}-key", allow_null: false }
    value: { format: avro, wire: confluent, registry: true }
"""


@pytest.fixture(scope="module")
def stub():
    r = Registry(auth=AUTH).start()
    yield r
    r.stop()


def start_rproxy(workdir, broker, registry, tmp_path_factory, monkeypatch_module):
    d = tmp_path_factory.mktemp("sr-policies")
    (d / "sr.yaml").write_text(POLICIES)
    monkeypatch_module.setenv("SR_TEST_PASSWORD", AUTH[1])
    import conftest
    p = rs.RegistryPolicyProxy(workdir, registry_user=AUTH[0], upstream=[broker.bootstrap], policies=[d / "sr.yaml"],
                      name=f"antidote-sr-{getattr(registry, 'kind', 'stub')}",
                      registry_url=registry.url, admin_port=h.free_port())
    conftest._PROXIES.append(p)
    p.start()
    return p


@pytest.fixture(scope="module")
def stub_proxy(workdir, broker, stub, tmp_path_factory, monkeypatch_module):
    p = start_rproxy(workdir, broker, stub, tmp_path_factory, monkeypatch_module)
    yield p
    p.stop_and_check()


@pytest.fixture(scope="module")
def apicurio_proxy(workdir, broker, apicurio, tmp_path_factory, monkeypatch_module):
    p = start_rproxy(workdir, broker, apicurio, tmp_path_factory, monkeypatch_module)
    yield p
    p.stop_and_check()


@pytest.fixture
def rproxy(request, registry):
    """The proxy whose `schema_registry` is `registry`."""
    return request.getfixturevalue("stub_proxy" if rs.is_stub(registry) else "apicurio_proxy")


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture
def proxy_ep(rproxy) -> c.Endpoint:
    rproxy.assert_running()
    yield c.Endpoint(rproxy.bootstrap, "proxy")
    rproxy.assert_running()


@pytest.fixture(autouse=True)
def registry_ok(stub):
    stub.mode = "ok"
    yield
    stub.mode = "ok"


def client(registry) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry.url, "timeout": 30,
                                 "basic.auth.user.info": f"{AUTH[0]}:{AUTH[1]}"})


def topic(broker_endpoint, prefix: str) -> str:
    t = f"{prefix}{uuid.uuid4().hex[:10]}"
    c.ck_create_topic(broker_endpoint, t, 1)
    return t


def produce(broker_endpoint, t: str, values: list[bytes], keys=None) -> None:
    keys = keys or [None] * len(values)
    recs = [c.Rec(0, i, k, v, (), 1_700_000_000_000 + i) for i, (k, v) in enumerate(zip(keys, values))]
    c.ck_produce(broker_endpoint, t, recs)


class Reader:
    """One librdkafka consumer through the proxy, kept across reads."""

    def __init__(self, ep: c.Endpoint, t: str):
        self.c = ck.Consumer(ep.ck(**{"group.id": f"sr-{uuid.uuid4().hex[:8]}",
                                      "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
        self.c.assign([ck.TopicPartition(t, 0, ck.OFFSET_BEGINNING)])
        self.got: list[c.Rec] = []

    def read(self, seconds: float, until: int | None = None) -> list[c.Rec]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (until is None or len(self.got) < until):
            m = self.c.poll(0.2)
            if m is None or (m.error() and m.error().code() == ck.KafkaError._PARTITION_EOF):
                continue
            assert not m.error(), m.error()
            self.got.append(c._ck_rec(m))
        return self.got

    def close(self):
        self.c.close()


def dlt(broker_endpoint, t: str, klass: str | None = None) -> list[c.Rec]:
    """The DLT of `klass` (sr-avro's template), or `{t}.dlt` (the default)."""
    name = f"{t}.{klass}.dlt" if klass else f"{t}.dlt"
    if not ps.topic_exists(broker_endpoint, name):
        return []
    return ps.read_dlt(broker_endpoint, name)


def metrics(rproxy) -> str:
    with urllib.request.urlopen(f"http://{h.HOST}:{rproxy.admin_port}/metrics", timeout=5) as r:
        return r.read().decode()


# ---------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------

LOCATION = {"type": "record", "name": "Location", "namespace": "geo",
            "fields": [{"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}]}


def trigger_avsc(name: str, v2: bool = False) -> str:
    fields = [{"name": "device_id", "type": "string"},
              {"name": "lat", "type": "double"}, {"name": "lon", "type": "double"},
              {"name": "home", "type": ["null", "geo.Location"], "default": None}]
    if v2:
        fields += [{"name": "speed", "type": ["null", "double"], "default": None},
                   {"name": "ssn", "type": ["null", "string"], "default": None}]
    return json.dumps({"type": "record", "name": name, "namespace": "geo", "fields": fields})


def avro_serializer(reg, schema_str: str, loc_subject: str) -> AvroSerializer:
    schema = Schema(schema_str, "AVRO", [SchemaReference("geo.Location", loc_subject, 1)])
    return AvroSerializer(client(reg), schema, conf={"auto.register.schemas": True})


def register_location(reg) -> str:
    subject = f"geo-location-{uuid.uuid4().hex[:6]}"
    client(reg).register_schema(subject, Schema(json.dumps(LOCATION), "AVRO"))
    return subject


# ---------------------------------------------------------------------------
# Avro: two versions, a reference, poison and redaction
# ---------------------------------------------------------------------------

@rs.parametrize_registry
def test_avro_two_versions_with_a_reference_poison_diverted_and_redact_has_no_contents(
        registry, rproxy, proxy_ep, broker_endpoint):
    t = topic(broker_endpoint, "sr.avro.")
    loc = register_location(registry)
    ctx = SerializationContext(t, MessageField.VALUE)
    v1 = avro_serializer(registry, trigger_avsc("Trigger"), loc)
    v2 = avro_serializer(registry, trigger_avsc("Trigger", v2=True), loc)
    ssn = "123-45-6789"
    values = [
        v1({"device_id": "a", "lat": 52.5, "lon": 13.4, "home": {"lat": 1.0, "lon": 2.0}}, ctx),
        v2({"device_id": "b", "lat": 48.1, "lon": 11.6, "home": None, "speed": 3.0, "ssn": None}, ctx),
        v1({"device_id": "c", "lat": 95.0, "lon": 13.4, "home": None}, ctx),         # poison
        v2({"device_id": "d", "lat": 40.0, "lon": 3.7, "home": None, "speed": None, "ssn": ssn}, ctx),
        v2({"device_id": "e", "lat": 41.0, "lon": 2.1, "home": None, "speed": 1.0, "ssn": None}, ctx),
    ]
    ids = {int.from_bytes(v[1:5], "big") for v in values}
    assert len(ids) == 2, "two versions, two ids"
    produce(broker_endpoint, t, values, keys=[b"k0", b"k1", b"k2", b"k3", b"k4"])
    r = Reader(proxy_ep, t)
    try:
        got = r.read(20, until=3)
        time.sleep(1)
        got = r.read(1)
    finally:
        r.close()
    assert [g.offset for g in got] == [0, 1, 4]
    assert [g.value for g in got] == [values[0], values[1], values[4]]
    poison = dlt(broker_endpoint, t, "poison")
    assert [ps.hdict(p)["x-original-offset"] for p in poison] == [b"2"]
    assert poison[0].value == values[2] and poison[0].key == b"k2"
    assert ps.hdict(poison[0])["x-error-rule"] == b"coordinates"
    redacted = dlt(broker_endpoint, t, "redact")
    assert len(redacted) == 1
    rec = redacted[0]
    hd = ps.hdict(rec)
    assert rec.key is None and rec.value is None
    assert hd["x-redacted"] == b"true" and hd["x-error-class"] == b"redact"
    assert hd["x-original-offset"] == b"3" and hd["x-error-rule"] == b"absent:/ssn"
    assert all(k.startswith("x-") for k, _ in rec.headers)
    assert ssn.encode() not in b"".join(v or b"" for _, v in rec.headers)
    assert ssn not in h.read_log(rproxy.log, limit=10_000_000)
    # Fetched once each, whatever the number of fetches and records.
    if rs.is_stub(registry):
        for i in ids:
            assert registry.id_requests(i) == 1, (i, registry.requests)


# ---------------------------------------------------------------------------
# Protobuf with an import, JSON Schema framing
# ---------------------------------------------------------------------------

def proto_classes(tag: str):
    F = descriptor_pb2.FieldDescriptorProto
    loc = descriptor_pb2.FileDescriptorProto(name=f"geo/location_{tag}.proto", package="geo",
                                             syntax="proto3")
    m = loc.message_type.add(name="Location")
    m.field.add(name="lat", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    m.field.add(name="lon", number=2, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    trig = descriptor_pb2.FileDescriptorProto(name=f"geo/trigger_{tag}.proto", package="geo",
                                              syntax="proto3", dependency=[loc.name])
    trig.message_type.add(name="Other").field.add(name="x", number=1, type=F.TYPE_INT32,
                                                   label=F.LABEL_OPTIONAL)
    t = trig.message_type.add(name="Trigger")
    t.field.add(name="device_id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    t.field.add(name="at", number=2, type=F.TYPE_MESSAGE, type_name=".geo.Location",
                label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(loc)
    pool.Add(trig)
    get = message_factory.GetMessageClass
    return get(pool.FindMessageTypeByName("geo.Trigger")), get(pool.FindMessageTypeByName("geo.Other"))


@rs.parametrize_registry
def test_protobuf_with_an_import_in_another_subject(registry, proxy_ep, broker_endpoint):
    t = topic(broker_endpoint, "sr.proto.")
    Trigger, Other = proto_classes(uuid.uuid4().hex[:6])
    ctx = SerializationContext(t, MessageField.VALUE)
    conf = {"auto.register.schemas": True, "use.deprecated.format": False}
    ser = ProtobufSerializer(Trigger, client(registry), conf)
    other = ProtobufSerializer(Other, client(registry), conf)
    ok = ser(Trigger(device_id="a", **{"at": {"lat": 52.5, "lon": 13.4}}), ctx)
    bad = ser(Trigger(device_id="b", **{"at": {"lat": 52.5, "lon": 190.0}}), ctx)
    wrong_type = other(Other(x=3), SerializationContext(t, MessageField.VALUE))
    # The message index says Trigger is the second message of its file.
    assert ok[5] != 0, "message indexes written by the client"
    produce(broker_endpoint, t, [ok, bad, wrong_type, ok])
    r = Reader(proxy_ep, t)
    try:
        got = r.read(20, until=2)
        time.sleep(1)
        got = r.read(1)
    finally:
        r.close()
    assert [g.offset for g in got] == [0, 3]
    poison = dlt(broker_endpoint, t)
    rules = {ps.hdict(p)["x-original-offset"]: ps.hdict(p)["x-error-rule"] for p in poison}
    assert rules == {b"1": b"coordinates", b"2": b"schema"}, rules


@rs.parametrize_registry
def test_json_schema_framing(registry, proxy_ep, broker_endpoint):
    t = topic(broker_endpoint, "sr.json.")
    schema = json.dumps({"type": "object", "required": ["lat", "lon"],
                         "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}})
    ser = JSONSerializer(schema, client(registry), conf={"auto.register.schemas": True})
    ctx = SerializationContext(t, MessageField.VALUE)
    ok = ser({"lat": 1.5, "lon": 2.5}, ctx)
    far = ser({"lat": 91.0, "lon": 2.5}, ctx)
    # The serializer refuses what its schema refuses: frame one by hand.
    missing = ok[:5] + b'{"lat": 1.5}'
    produce(broker_endpoint, t, [ok, far, missing, ok])
    r = Reader(proxy_ep, t)
    try:
        got = r.read(20, until=2)
    finally:
        r.close()
    assert [g.offset for g in got] == [0, 3]
    rules = {ps.hdict(p)["x-original-offset"]: ps.hdict(p)["x-error-rule"]
             for p in dlt(broker_endpoint, t)}
    assert rules == {b"1": b"coordinates", b"2": b"schema"}, rules


# ---------------------------------------------------------------------------
# Unknown id, wrong subject, keys
# ---------------------------------------------------------------------------

@rs.parametrize_registry
def test_unknown_id_is_class_unknown_and_an_id_of_another_subject_is_poison(
        registry, proxy_ep, broker_endpoint):
    t = topic(broker_endpoint, "sr.avro.")
    loc = register_location(registry)
    ctx = SerializationContext(t, MessageField.VALUE)
    ok = avro_serializer(registry, trigger_avsc("Trigger"), loc)(
        {"device_id": "a", "lat": 1.0, "lon": 2.0, "home": None}, ctx)
    elsewhere = avro_serializer(registry, trigger_avsc("Elsewhere"), loc)(
        {"device_id": "a", "lat": 1.0, "lon": 2.0, "home": None},
        SerializationContext(f"other-{t}", MessageField.VALUE))
    unknown = b"\x00" + (987_654).to_bytes(4, "big") + ok[5:]
    produce(broker_endpoint, t, [ok, unknown, elsewhere, ok])
    r = Reader(proxy_ep, t)
    try:
        got = r.read(20, until=2)
    finally:
        r.close()
    assert [g.offset for g in got] == [0, 3]
    u = dlt(broker_endpoint, t, "unknown")
    assert [(ps.hdict(x)["x-original-offset"], ps.hdict(x)["x-error-rule"]) for x in u] == \
        [(b"1", b"schema-id")]
    p = dlt(broker_endpoint, t, "poison")
    assert [(ps.hdict(x)["x-original-offset"], ps.hdict(x)["x-error-rule"]) for x in p] == \
        [(b"2", b"subject")]


@rs.parametrize_registry
def test_an_id_whose_only_version_is_soft_deleted_is_poison_under_its_subject(
        registry, proxy_ep, broker_endpoint):
    """A soft-deleted version: the registry still serves its schema by id,
    but no longer lists the id under the subject (`/schemas/ids/{id}/versions`
    leaves soft-deleted versions out), so a record written with it is judged
    as one of another subject; the live version's records are delivered."""
    t = topic(broker_endpoint, "sr.avro.")
    loc = register_location(registry)
    ctx = SerializationContext(t, MessageField.VALUE)
    v1 = avro_serializer(registry, trigger_avsc("Trigger"), loc)(
        {"device_id": "old", "lat": 1.0, "lon": 2.0, "home": None}, ctx)
    v2 = avro_serializer(registry, trigger_avsc("Trigger", v2=True), loc)(
        {"device_id": "new", "lat": 1.0, "lon": 2.0, "home": None, "speed": None, "ssn": None}, ctx)
    sr_client = client(registry)
    assert sr_client.delete_version(f"{t}-value", 1) == 1
    assert sr_client.get_versions(f"{t}-value") == [2]
    assert sr_client.get_schema(int.from_bytes(v1[1:5], "big")) is not None, "still served by id"
    produce(broker_endpoint, t, [v2, v1, v2])
    r = Reader(proxy_ep, t)
    try:
        got = r.read(20, until=2)
    finally:
        r.close()
    assert [g.offset for g in got] == [0, 2]
    p = dlt(broker_endpoint, t, "poison")
    assert [(ps.hdict(x)["x-original-offset"], ps.hdict(x)["x-error-rule"]) for x in p] == \
        [(b"1", b"subject")]


@rs.parametrize_registry
def test_keys_are_validated_through_the_registry(registry, proxy_ep, broker_endpoint):
    t = topic(broker_endpoint, "sr.keyed.")
    kser = AvroSerializer(client(registry), '"string"', conf={"auto.register.schemas": True})
    vser = AvroSerializer(client(registry), json.dumps(LOCATION), conf={"auto.register.schemas": True})
    kctx, vctx = SerializationContext(t, MessageField.KEY), SerializationContext(t, MessageField.VALUE)
    v = vser({"lat": 1.0, "lon": 2.0}, vctx)
    keys = [kser("dev-1", kctx), b"plain-text-key", None, kser("dev-2", kctx)]
    produce(broker_endpoint, t, [v, v, v, v], keys=keys)
    r = Reader(proxy_ep, t)
    try:
        got = r.read(20, until=2)
    finally:
        r.close()
    assert [g.offset for g in got] == [0, 3]
    rules = [(ps.hdict(x)["x-original-offset"], ps.hdict(x)["x-error-rule"])
             for x in ps.read_dlt(broker_endpoint, f"{t}.dlt")]
    assert rules == [(b"1", b"key.decode"), (b"2", b"key.allow_null")], rules


# ---------------------------------------------------------------------------
# A registry outage mid-stream
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["down", "500", "slow"])
def test_registry_outage_holds_at_the_first_unknown_schema_and_resumes(
        fault, registry, rproxy, proxy_ep, broker_endpoint):
    t = topic(broker_endpoint, "sr.avro.")
    loc = register_location(registry)
    ctx = SerializationContext(t, MessageField.VALUE)
    a = avro_serializer(registry, trigger_avsc("Trigger"), loc)
    # A schema of its own (new id) the proxy has never asked for.
    b = avro_serializer(registry, trigger_avsc(f"New{uuid.uuid4().hex[:6]}"), loc)
    rec = lambda ser, i: ser({"device_id": f"d{i}", "lat": 1.0, "lon": 2.0, "home": None}, ctx)
    first = [rec(a, 0), rec(a, 1)]
    later = [rec(a, 2), rec(b, 3), rec(a, 4), rec(b, 5)]   # registered now, while it answers
    produce(broker_endpoint, t, first)
    r = Reader(proxy_ep, t)
    try:
        assert [g.offset for g in r.read(20, until=2)] == [0, 1]
        registry.mode = fault
        c.ck_produce(broker_endpoint, t, [c.Rec(0, 0, None, v, (), None) for v in later])
        got = r.read(6)
        assert [g.offset for g in got] == [0, 1, 2], "held at offset 3, nothing past it"
        text = metrics(rproxy)
        assert f'topic="{t}",partition="0",reason="transient"' in text
        registry.mode = "ok"
        got = r.read(20, until=6)
    finally:
        r.close()
    assert [g.offset for g in got] == [0, 1, 2, 3, 4, 5], "nothing lost, in order"
    assert [g.value for g in got[2:]] == later
    for klass in ("poison", "unknown", "redact"):
        assert dlt(broker_endpoint, t, klass) == [], f"a transient record reached the {klass} DLT"
    log = h.read_log(rproxy.log, limit=10_000_000)
    holds = [l for l in log.splitlines() if t in l and "partition held at it" in l]
    assert 1 <= len(holds) <= 2, holds  # once per hold (per connection)


# ---------------------------------------------------------------------------
# The commands: dlt inspect --decode, dlt replay, check --connect
# ---------------------------------------------------------------------------

def run_cli(rproxy, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SR_TEST_PASSWORD=AUTH[1])
    return subprocess.run([str(h.ANTIDOTE_BIN), *args], capture_output=True, text=True,
                          timeout=60, env=env)


@rs.parametrize_registry
def test_dlt_inspect_decodes_through_the_registry_and_replay_revalidates_and_skips_redact(
        registry, rproxy, proxy_ep, broker_endpoint):
    t = topic(broker_endpoint, "sr.avro.")
    loc = register_location(registry)
    ctx = SerializationContext(t, MessageField.VALUE)
    v2 = avro_serializer(registry, trigger_avsc("Trigger", v2=True), loc)
    values = [v2({"device_id": "p", "lat": 95.0, "lon": 1.0, "home": None, "speed": None, "ssn": None}, ctx),
              v2({"device_id": "r", "lat": 1.0, "lon": 1.0, "home": None, "speed": None, "ssn": "999-00-1111"}, ctx),
              v2({"device_id": "ok", "lat": 1.0, "lon": 1.0, "home": None, "speed": None, "ssn": None}, ctx)]
    produce(broker_endpoint, t, values)
    r = Reader(proxy_ep, t)
    try:
        assert [g.offset for g in r.read(20, until=1)] == [2]
    finally:
        r.close()
    cfg = str(rproxy.config_path)
    out = run_cli(rproxy, "dlt", "inspect", "--config", cfg, "--topic", f"{t}.poison.dlt", "--decode")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.splitlines()[0])
    assert rec["decoded"]["value"]["device_id"] == "p" and rec["decoded"]["value"]["lat"] == 95.0, rec
    # A fresh process: its schema cache is empty, so re-validation goes to the registry.
    out = run_cli(rproxy, "dlt", "replay", "--config", cfg, "--topic", f"{t}.poison.dlt")
    assert out.returncode == 0, out.stderr
    assert "still invalid" in out.stdout and "coordinates" in out.stdout, out.stdout
    out = run_cli(rproxy, "dlt", "replay", "--config", cfg, "--topic", f"{t}.redact.dlt", "--execute")
    assert out.returncode == 0, out.stderr
    assert "class redact: never replayed" in out.stdout, out.stdout
    assert "999-00-1111" not in out.stdout + out.stderr


def test_check_reports_the_registry_and_connect_sees_it_answer_or_not(registry, rproxy):
    cfg = str(rproxy.config_path)
    out = run_cli(rproxy, "check", "--config", cfg, "--connect")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"schema_registry: {registry.url}" in out.stdout and "basic (antidote)" in out.stdout
    assert AUTH[1] not in out.stdout + out.stderr
    assert f"schema registry {registry.url}: answers" in out.stdout, out.stdout
    registry.mode = "500"
    out = run_cli(rproxy, "check", "--config", cfg, "--connect")
    assert out.returncode != 0 and "answers HTTP 500" in out.stderr, out.stdout + out.stderr


def test_the_registry_reference_policies_check_and_need_a_registry(registry, rproxy, tmp_path):
    ref = h.REPO / "policies" / "registry"
    base = (f"listen:\n  bootstrap: 127.0.0.1:29092\n  broker_port_base: 29100\n"
            f"upstream:\n  bootstrap_servers: [127.0.0.1:9092]\npolicies: [{ref}]\n")
    cfg = tmp_path / "with.yaml"
    cfg.write_text(base + f"schema_registry:\n  url: {registry.url}\n")
    out = run_cli(rproxy, "check", "--config", str(cfg))
    assert out.returncode == 0, out.stdout + out.stderr
    cfg = tmp_path / "without.yaml"
    cfg.write_text(base)
    out = run_cli(rproxy, "check", "--config", str(cfg))
    assert out.returncode != 0 and "`schema_registry` is required" in out.stderr, out.stderr
