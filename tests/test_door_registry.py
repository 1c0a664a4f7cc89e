"""Registry-backed policies at the door (`registry: true` with
`on_produce: reject`), against the suite's broker, with records serialized by
confluent-kafka's own `confluent_kafka.schema_registry` serializers through
the registry stub (tests/registry_stub.py) and produced through the proxy by
librdkafka and kafka-python; the tests that are not about outages or a
lagging registry run against Apicurio Registry too (tests/registry_support.py).

What each verdict class gets at the door:
- valid (and stale): written;
- poison (a rule, an id under another subject), unknown (an id the registry
  does not have), redact: INVALID_RECORD; a redact answer names the rule only;
- an id refused as unknown is asked about again past the negative cache, so a
  registry replica that lagged does not refuse it for `cache_ttl`;
- transient (the registry is down): NOT_ENOUGH_REPLICAS, retriable; the
  producers' own retries land every record once, in order, once the registry
  answers again (idempotent with several requests in flight, and not
  idempotent with one in flight).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
import uuid

import confluent_kafka as ck
import kafka as kp
import kafka.errors as kerr
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import clients as c
import harness as h
import registry_support as rs
from registry_support import apicurio, registry  # noqa: F401 (fixtures)
from registry_stub import Registry

INVALID_RECORD = 87
NOT_ENOUGH_REPLICAS = 19

POLICIES = """
policies:
  - name: door-sr-avro
    topics: ["dsr.avro.*"]
    value: { format: avro, wire: confluent, registry: true, subject: "{topic}-value" }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
      - field: /ssn
        absent: true
        class: redact
    on_produce: reject
  - name: door-sr-proto
    topics: ["dsr.proto.*"]
    value: { format: protobuf, wire: confluent, registry: true, subject: "{topic}-value", message: geo.Trigger }
    rules:
      - coordinates: { lat: /at/lat, lon: /at/lon }
    on_produce: reject
  - name: door-sr-json
    topics: ["dsr.json.*"]
    value: { format: json, wire: confluent, registry: true, subject: "{topic}-value" }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
    on_produce: reject
  - name: door-sr-keyed
    topics: ["dsr.keyed.*"]
    key: { format: avro, wire: confluent, registry: true, subject: "{topic}-key", allow_null: false }
    value: { format: bytes }
    on_produce: reject
"""

TRIGGER = json.dumps({"type": "record", "name": "Trigger", "namespace": "geo", "fields": [
    {"name": "device_id", "type": "string"},
    {"name": "lat", "type": "double"}, {"name": "lon", "type": "double"},
    {"name": "ssn", "type": ["null", "string"], "default": None}]})
TRIGGER_JSON = json.dumps({"type": "object", "required": ["device_id", "lat", "lon"],
                           "properties": {"device_id": {"type": "string"},
                                          "lat": {"type": "number"},
                                          "lon": {"type": "number"}}})
KEY = json.dumps({"type": "record", "name": "DeviceKey", "namespace": "geo",
                  "fields": [{"name": "device_id", "type": "string"}]})


@pytest.fixture(scope="module")
def stub():
    r = Registry().start()
    yield r
    r.stop()


def start_door(workdir, broker, registry, tmp_path_factory):
    d = tmp_path_factory.mktemp("door-sr")
    (d / "door-sr.yaml").write_text(POLICIES)
    import conftest
    p = rs.RegistryPolicyProxy(workdir, upstream=[broker.bootstrap], policies=[d / "door-sr.yaml"],
                          name=f"antidote-door-sr-{getattr(registry, 'kind', 'stub')}",
                          registry_url=registry.url, admin_port=h.free_port())
    conftest._PROXIES.append(p)
    p.start()
    return p


@pytest.fixture(scope="module")
def stub_door(workdir, broker, stub, tmp_path_factory):
    p = start_door(workdir, broker, stub, tmp_path_factory)
    yield p
    p.stop_and_check()


@pytest.fixture(scope="module")
def apicurio_door(workdir, broker, apicurio, tmp_path_factory):
    p = start_door(workdir, broker, apicurio, tmp_path_factory)
    yield p
    p.stop_and_check()


@pytest.fixture
def door(request, registry):
    """The door proxy whose `schema_registry` is `registry`."""
    return request.getfixturevalue("stub_door" if rs.is_stub(registry) else "apicurio_door")


@pytest.fixture(autouse=True)
def registry_ok(stub, door):
    stub.mode = "ok"
    door.assert_running()
    yield
    stub.mode = "ok"
    door.assert_running()


def sr(registry) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry.url, "timeout": 30})


def new_topic(broker, prefix: str) -> str:
    t = f"{prefix}{uuid.uuid4().hex[:10]}"
    c.ck_create_topic(c.Endpoint(broker.bootstrap), t, 1)
    return t


def proxy_ep(door) -> c.Endpoint:
    return c.Endpoint(door.bootstrap, "proxy")


def avro_values(registry, topic: str, docs: list[dict]) -> list[bytes]:
    ser = AvroSerializer(sr(registry), TRIGGER, conf={"auto.register.schemas": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [ser(d, ctx) for d in docs]


def trigger(i: int, lat: float = 52.1, ssn: str | None = None) -> dict:
    return {"device_id": f"d-{i}", "lat": lat, "lon": 4.3, "ssn": ssn}


def framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


def read_back(broker, topic: str, n: int, partition: int = 0) -> list[bytes]:
    """The partition's values read from the broker itself (test_produce_door's
    reader: until its end once at least `n` were read, so extras show)."""
    from test_produce_door import read_back as read_records
    return [r.value for r in read_records(broker, topic, partition, n)]


def ck_send_each(ep: c.Endpoint, topic: str, values: list[bytes], keys=None, **conf) -> list:
    """One batch per record, in order; each record's delivery error (or None)."""
    p = ck.Producer(ep.ck(**{"linger.ms": 0, "message.send.max.retries": 0, **conf}))
    errors: list = [None] * len(values)
    keys = keys or [None] * len(values)
    for i, (k, v) in enumerate(zip(keys, values)):
        def report(err, _msg, i=i):
            errors[i] = err
        p.produce(topic, value=v, key=k, on_delivery=report)
        assert p.flush(30) == 0
    return errors


def metrics(door) -> str:
    with urllib.request.urlopen(f"http://{h.HOST}:{door.admin_port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric_sum(door, name: str, pattern: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics(door).splitlines()
               if line.startswith(name) and re.search(pattern, line))


# ---------------------------------------------------------------------------
# Valid records land, poison is refused: each format, both producers
# ---------------------------------------------------------------------------

def json_and_proto_values(registry, fmt: str, topic: str) -> list[bytes]:
    """valid, poison (latitude 95), valid, serialized by the client's own
    serializer for `fmt`."""
    ctx = SerializationContext(topic, MessageField.VALUE)
    if fmt == "json":
        ser = JSONSerializer(TRIGGER_JSON, sr(registry), conf={"auto.register.schemas": True})
        return [ser({"device_id": f"d-{i}", "lat": lat, "lon": 4.3}, ctx)
                for i, lat in enumerate([52.1, 95.0, 52.2])]
    from test_schema_registry import proto_classes
    Trigger, _ = proto_classes(uuid.uuid4().hex[:6])
    ser = ProtobufSerializer(Trigger, sr(registry), {"auto.register.schemas": True,
                                                     "use.deprecated.format": False})
    out = []
    for i, lat in enumerate([52.1, 95.0, 52.2]):
        m = Trigger(device_id=f"d-{i}")
        m.at.lat, m.at.lon = lat, 4.3
        out.append(ser(m, ctx))
    return out


@rs.parametrize_registry
@pytest.mark.parametrize("fmt", ["avro", "json", "proto"])
def test_librdkafka_valid_records_land_and_poison_is_refused_in_each_format(
        door, broker, registry, fmt):
    topic = new_topic(broker, f"dsr.{fmt}.")
    if fmt == "avro":
        values = avro_values(registry, topic, [trigger(0), trigger(1, lat=95.0), trigger(2)])
    else:
        values = json_and_proto_values(registry, fmt, topic)
    errors = ck_send_each(proxy_ep(door), topic, values)
    assert errors[0] is None and errors[2] is None, errors
    assert errors[1] is not None and errors[1].code() == ck.KafkaError.INVALID_RECORD, errors
    assert read_back(broker, topic, 2) == [values[0], values[2]]


@rs.parametrize_registry
def test_kafka_python_sees_which_rule_refused_the_record(door, broker, registry):
    topic = new_topic(broker, "dsr.avro.")
    values = avro_values(registry, topic, [trigger(0), trigger(1, lat=95.0), trigger(2)])
    errors = c.kp_send_each(proxy_ep(door), topic, values)
    assert errors[0] is None and errors[2] is None, errors
    assert isinstance(errors[1], kerr.InvalidRecordError), errors
    assert "door-sr-avro, rule coordinates (poison)" in str(errors[1]), errors[1]
    assert read_back(broker, topic, 2) == [values[0], values[2]]


@rs.parametrize_registry
def test_a_redact_refusal_names_the_rule_and_never_the_value(door, broker, registry):
    topic = new_topic(broker, "dsr.avro.")
    secret = f"SSN-{uuid.uuid4().hex[:8]}"
    values = avro_values(registry, topic, [trigger(0, ssn=secret)])
    errors = c.kp_send_each(proxy_ep(door), topic, values)
    assert isinstance(errors[0], kerr.InvalidRecordError), errors
    text = str(errors[0])
    assert "(redact)" in text, text
    assert secret not in text, text
    assert "withheld" in text, text
    assert secret not in h.read_log(door.log, limit=10**7)
    assert read_back(broker, topic, 0) == []


# ---------------------------------------------------------------------------
# Ids: another subject's, unknown ones, and one registered late
# ---------------------------------------------------------------------------

@rs.parametrize_registry
def test_an_id_of_another_subject_and_an_unknown_id_are_refused(door, broker, registry):
    topic = new_topic(broker, "dsr.avro.")
    other = new_topic(broker, "other.")
    good = avro_values(registry, topic, [trigger(0)])[0]
    # Registered under `other`'s subject only (a different schema, so a new id).
    foreign_schema = TRIGGER.replace('"Trigger"', '"Foreign"')
    ser = AvroSerializer(sr(registry), foreign_schema, conf={"auto.register.schemas": True})
    foreign = ser(trigger(1), SerializationContext(other, MessageField.VALUE))
    unknown = framed(4_000_000 + int(uuid.uuid4().int % 1000), good[5:])
    errors = c.kp_send_each(proxy_ep(door), topic, [good, foreign, unknown])
    assert errors[0] is None, errors
    assert isinstance(errors[1], kerr.InvalidRecordError), errors
    assert "rule subject (poison)" in str(errors[1]) and f"{topic}-value" in str(errors[1]), errors[1]
    assert isinstance(errors[2], kerr.InvalidRecordError), errors
    assert "rule schema-id (unknown)" in str(errors[2]), errors[2]
    assert read_back(broker, topic, 1) == [good]


def test_an_id_refused_as_unknown_is_asked_again_and_accepted_once_registered(
        door, broker, registry):
    """A replica that lags: the id is not there at the first Produce, then
    is. With `cache_ttl: 1h` the Fetch side would trust the 404 for an hour;
    the door asks again (answers under 1 s old are trusted) and accepts."""
    topic = new_topic(broker, "dsr.avro.")
    schema = TRIGGER.replace('"Trigger"', f'"Late{uuid.uuid4().hex[:6]}"')
    payload = avro_values(registry, topic, [trigger(0)])[0][5:]
    late_id = registry.next_id          # the id the next new schema gets
    value = framed(late_id, payload)
    first = ck_send_each(proxy_ep(door), topic, [value])
    assert first[0] is not None and first[0].code() == ck.KafkaError.INVALID_RECORD, first
    asked = registry.id_requests(late_id)
    assert asked >= 1
    assert sr(registry).register_schema(f"{topic}-value", Schema(schema, "AVRO")) == late_id
    time.sleep(1.2)                     # past the door's 1 s floor
    second = ck_send_each(proxy_ep(door), topic, [value])
    assert second == [None], second
    assert registry.id_requests(late_id) > asked
    assert read_back(broker, topic, 1) == [value]


@rs.parametrize_registry
def test_keys_are_judged_through_the_registry_at_the_door(door, broker, registry):
    topic = new_topic(broker, "dsr.keyed.")
    ser = AvroSerializer(sr(registry), KEY, conf={"auto.register.schemas": True})
    key = ser({"device_id": "d-1"}, SerializationContext(topic, MessageField.KEY))
    # The same key schema registered under the value subject only: wrong subject.
    other = new_topic(broker, "other.")
    wrong = AvroSerializer(sr(registry), KEY.replace("DeviceKey", "OtherKey"),
                           conf={"auto.register.schemas": True})(
        {"device_id": "d-2"}, SerializationContext(other, MessageField.KEY))
    errors = ck_send_each(proxy_ep(door), topic, [b"v0", b"v1", b"v2"], keys=[key, wrong, None])
    assert errors[0] is None, errors
    assert [e is not None and e.code() == ck.KafkaError.INVALID_RECORD for e in errors[1:]] \
        == [True, True], errors
    assert read_back(broker, topic, 1) == [b"v0"]


# ---------------------------------------------------------------------------
# Registry outage: retriable, and every record lands once, in order
# ---------------------------------------------------------------------------

def outage_values(registry, topic: str, n: int) -> list[bytes]:
    """`n` valid values under a schema id the proxy has never seen
    (serialized while the registry answers: the serializer needs it)."""
    schema = TRIGGER.replace('"Trigger"', f'"Outage{uuid.uuid4().hex[:6]}"')
    ser = AvroSerializer(sr(registry), schema, conf={"auto.register.schemas": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [ser(trigger(i), ctx) for i in range(n)]


def back_up_after(registry, seconds: float) -> threading.Timer:
    t = threading.Timer(seconds, lambda: setattr(registry, "mode", "ok"))
    t.start()
    return t


@pytest.mark.parametrize("producer", ["idempotent", "in_flight_1"])
def test_librdkafka_retries_through_a_registry_outage_land_every_record_once_in_order(
        door, broker, registry, producer):
    """Records of two schemas, one batch each: one schema the proxy knows,
    one it has never seen. While the registry is down, a batch of the
    unknown schema is answered retriably; the known schema's batches behind
    it, already in flight, get the same answer (else they would be written
    first: reordered, and for an idempotent producer out of sequence)."""
    topic = new_topic(broker, "dsr.avro.")
    known = avro_values(registry, topic, [trigger(i) for i in range(30)])
    fresh = outage_values(registry, topic, 30)
    assert ck_send_each(proxy_ep(door), topic, known[:1]) == [None]   # now cached
    values = [v for pair in zip(fresh, known) for v in pair][:-1]     # fresh first
    conf = ({"enable.idempotence": True, "max.in.flight.requests.per.connection": 5}
            if producer == "idempotent" else
            {"enable.idempotence": False, "max.in.flight.requests.per.connection": 1})
    before = metric_sum(door, "antidote_held_batches_total", 'reason="transient"')
    registry.mode = "down"
    timer = back_up_after(registry, 4.0)
    p = ck.Producer(proxy_ep(door).ck(**{"linger.ms": 0, "batch.num.messages": 1,
                                         "retry.backoff.ms": 100, "retry.backoff.max.ms": 500,
                                         "message.timeout.ms": 60000, **conf}))
    errors: list = []
    try:
        for v in values:
            p.produce(topic, value=v, on_delivery=lambda err, _m: errors.append(err))
            p.poll(0)
        assert p.flush(60) == 0, "records left undelivered"
    finally:
        timer.cancel()
    assert errors == [None] * len(values), [e for e in errors if e][:3]
    assert read_back(broker, topic, 1 + len(values)) == known[:1] + values
    assert metric_sum(door, "antidote_held_batches_total", 'reason="transient"') > before
    log = h.read_log(door.log, limit=10**7)
    assert "answered retriably: the schema registry has not given a schema" in log


@pytest.mark.parametrize("idempotent", [True, False])
def test_kafka_python_retries_through_a_registry_outage(door, broker, registry, idempotent):
    topic = new_topic(broker, "dsr.avro.")
    values = outage_values(registry, topic, 10)
    before = metric_sum(door, "antidote_held_batches_total", 'reason="transient"')
    registry.mode = "down"
    timer = back_up_after(registry, 3.0)
    extra = ({"enable_idempotence": True, "acks": "all",
              "max_in_flight_requests_per_connection": 5} if idempotent else
             {"enable_idempotence": False, "max_in_flight_requests_per_connection": 1})
    p = kp.KafkaProducer(**proxy_ep(door).kp(linger_ms=5, retries=50, retry_backoff_ms=200,
                                             delivery_timeout_ms=60000, request_timeout_ms=30000,
                                             **extra))
    try:
        futs = [p.send(topic, value=v) for v in values]
        p.flush(60)
        offsets = [f.get(timeout=60).offset for f in futs]
    finally:
        timer.cancel()
        p.close(10)
    assert offsets == list(range(len(values)))
    assert read_back(broker, topic, len(values)) == values
    # The outage took effect: some batch was answered retriably while the
    # registry was down (not all sent after it came back).
    assert metric_sum(door, "antidote_held_batches_total", 'reason="transient"') > before


def test_without_retries_the_producer_sees_a_retriable_error_naming_the_registry(
        door, broker, registry):
    topic = new_topic(broker, "dsr.avro.")
    values = outage_values(registry, topic, 1)
    registry.mode = "down"
    errors = c.kp_send_each(proxy_ep(door), topic, values)
    assert isinstance(errors[0], kerr.NotEnoughReplicasError), errors
    assert errors[0].retriable
    assert "waiting for the schema registry" in str(errors[0]), errors[0]
    registry.mode = "ok"
    assert read_back(broker, topic, 0) == []
    # Once it answers, the same record is written. The proxy learns that
    # the registry answers again from its next lookup, which the send
    # itself starts: until then a send may still get the retriable answer
    # (a producer with retries would simply retry; this one does by hand).
    deadline = time.monotonic() + 15
    while (errors := c.kp_send_each(proxy_ep(door), topic, values)) != [None]:
        assert isinstance(errors[0], kerr.NotEnoughReplicasError), errors
        assert time.monotonic() < deadline, f"still refused 15 s after the registry came back: {errors}"
        time.sleep(0.5)
    assert read_back(broker, topic, 1) == values


def test_a_request_writes_the_partitions_whose_ids_are_known_while_another_waits(
        door, broker, registry):
    """One Produce request, two partitions: partition 0's schema is cached,
    partition 1's is not and the registry is down. Partition 0 is written
    by that request; partition 1 gets the retriable answer."""
    topic = f"dsr.avro.{uuid.uuid4().hex[:10]}"
    c.ck_create_topic(c.Endpoint(broker.bootstrap), topic, 2)
    known = avro_values(registry, topic, [trigger(0), trigger(1)])
    fresh = outage_values(registry, topic, 1)
    first = ck.Producer(proxy_ep(door).ck(**{"linger.ms": 0}))
    first.produce(topic, value=known[0], partition=0)
    assert first.flush(30) == 0                       # id of `known` now cached
    registry.mode = "down"
    p = ck.Producer(proxy_ep(door).ck(**{"linger.ms": 200, "message.send.max.retries": 0}))
    errors: dict[int, object] = {}
    p.produce(topic, value=known[1], partition=0,
              on_delivery=lambda err, _m: errors.__setitem__(0, err))
    p.produce(topic, value=fresh[0], partition=1,
              on_delivery=lambda err, _m: errors.__setitem__(1, err))
    assert p.flush(30) == 0
    assert errors[0] is None, errors
    assert errors[1] is not None and errors[1].code() == ck.KafkaError.NOT_ENOUGH_REPLICAS, errors
    registry.mode = "ok"
    assert read_back(broker, topic, 2) == known[:2]
