"""Confluent data-contract rules (a schema's `ruleSet`) honoured by the proxy,
against the suite's broker, with the schemas and their rules registered by
confluent-kafka's own `SchemaRegistryClient.register_schema` in the registry
stub (tests/registry_stub.py serves `ruleSet` as Confluent's API does) and
records written by its `AvroSerializer` with `use.latest.version` (the
version that carries the rules).

The producers here do not run the rules themselves (confluent-kafka's rule
override `disabled` for CEL and CEL_FIELD, as a client without CEL executors
or another client library would): the proxy is what enforces them.

Covers, for Avro (AvroSerializer) and JSON Schema (JSONSerializer): on fetch, records that satisfy the schema but break a READ rule are
diverted to the DLT with Confluent's `__rule.*` headers, valid ones delivered
once, in order; a NONE rule's failures are delivered and counted; a disabled
rule is ignored; at the door (`on_produce: reject`) a record breaking a WRITE
rule is refused with the rule named, a WRITE rule with NONE only counted; a rule antidote cannot honour (JSONATA)
makes the schema unusable (class `unknown`, naming subject and rule). And
what Apicurio Registry 3.3.3's Confluent API does with a `ruleSet`.
`antidote dlt inspect` (table and JSON) and the console's API show the
failed rule's `__rule.*` fields from antidote's signed context only: not a
record's own `__rule.*` headers, nor a stranger's record in the DLT.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.rule_registry import RuleOverride, RuleRegistry
from confluent_kafka.schema_registry.schema_registry_client import (
    Rule, RuleKind, RuleMode, RuleParams, RuleSet)
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

import clients as c
import harness as h
import poison_support as ps
import registry_support as rs
from registry_support import apicurio  # noqa: F401 (fixture)
from registry_stub import Registry

INVALID_RECORD = 87

POLICIES = """
policies:
  - name: contracts
    topics: ["dc.*"]
    value: { format: avro, wire: confluent, registry: true, subject: "{topic}-value" }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
    on_produce: reject
  - name: contracts-json
    topics: ["dcj.*"]
    value: { format: json, wire: confluent, registry: true, subject: "{topic}-value" }
"""

TRIGGER = json.dumps({"type": "record", "name": "Trigger", "namespace": "geo", "fields": [
    {"name": "device_id", "type": "string"},
    {"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}]})


@pytest.fixture(scope="module")
def stub():
    r = Registry().start()
    yield r
    r.stop()


class ContractsProxy(rs.RegistryPolicyProxy):
    """With the DLT console on (record contents withheld, the default)."""

    def config_yaml(self) -> str:
        text = rs.RegistryPolicyProxy.config_yaml(self)
        admin = f"admin:\n  listen: {h.HOST}:{self.admin_port}\n"
        assert admin in text
        return text.replace(admin, admin + "  console: true\n")


@pytest.fixture(scope="module")
def proxy(workdir, broker, stub, tmp_path_factory):
    d = tmp_path_factory.mktemp("contracts")
    (d / "contracts.yaml").write_text(POLICIES)
    # Signed DLT records: the __rule.* headers are inside the signed context,
    # and the proxy's own readers (ledger, follower) must accept them.
    (d / "signing.key").write_text("a-data-contracts-signing-key-0001")
    import conftest
    p = ContractsProxy(workdir, registry_timeout="2s", upstream=[broker.bootstrap], policies=[d / "contracts.yaml"],
                      name="antidote-contracts", registry_url=stub.url,
                      admin_port=h.free_port(),
                      dead_letter={"signing_keys": [f"file: {d / 'signing.key'}"]})
    conftest._PROXIES.append(p)
    p.start()
    yield p
    p.stop_and_check()


def sr(reg) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": reg.url, "timeout": 30})


def new_topic(broker) -> str:
    t = f"dc.{uuid.uuid4().hex[:10]}"
    c.ck_create_topic(c.Endpoint(broker.bootstrap), t, 1)
    return t


def cel(name, mode, expr, on_failure="ERROR", kind="CONDITION", rule_type="CEL",
        params=None, disabled=False) -> Rule:
    return Rule(name=name, doc=None, kind=RuleKind(kind), mode=RuleMode(mode), type=rule_type,
                tags=[], params=RuleParams(params or {}), expr=expr, on_success=None,
                on_failure=on_failure, disabled=disabled)


def register(reg, topic: str, rules: list[Rule]) -> int:
    """The trigger schema with `rules`, registered by confluent-kafka's client."""
    schema = Schema(TRIGGER, "AVRO", rule_set=RuleSet(migration_rules=[], domain_rules=rules))
    return sr(reg).register_schema(f"{topic}-value", schema)


def serialize(reg, topic: str, docs: list[dict]) -> list[bytes]:
    """The latest version of `{topic}-value` (its rules included), by a
    producer that does not run CEL rules itself."""
    rr = RuleRegistry()
    for t in ("CEL", "CEL_FIELD"):
        rr.register_override(RuleOverride(t, None, None, True))
    ser = AvroSerializer(sr(reg), None, conf={"auto.register.schemas": False,
                                              "use.latest.version": True},
                         rule_registry=rr)
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [ser(d, ctx) for d in docs]


def trig(i: int, lat: float = 52.1, lon: float = 4.3, device: str | None = None) -> dict:
    return {"device_id": device or f"d-{i}", "lat": lat, "lon": lon}


def metrics(proxy) -> str:
    with urllib.request.urlopen(f"http://{h.HOST}:{proxy.admin_port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric(proxy, name: str, pattern: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics(proxy).splitlines()
               if line.startswith(name) and re.search(pattern, line))


def rules_for(topic: str) -> list[Rule]:
    return [
        cel("north-of-60", "READ", "message.lat < 60.0", "DLQ",
            params={"dlq.topic": f"{topic}.dlt"}),
        cel("device-prefix", "WRITEREAD", 'name == "device_id" ; value.startsWith("d-")',
            rule_type="CEL_FIELD"),
        cel("lon-east", "READ", "message.lon > 0.0", "NONE"),
        cel("no-south", "WRITE", "message.lat > -60.0"),
        cel("lon-east-written", "WRITE", "message.lon > 0.0", "NONE"),
        cel("never", "WRITEREAD", "false", disabled=True),
    ]


def test_the_serializer_gets_the_rule_set_back_from_the_registry(stub):
    topic = f"dc.{uuid.uuid4().hex[:10]}"
    sid = register(stub, topic, rules_for(topic))
    latest = sr(stub).get_latest_version(f"{topic}-value")
    assert latest.schema_id == sid
    got = [r.name for r in latest.schema.rule_set.domain_rules]
    assert got == ["north-of-60", "device-prefix", "lon-east", "no-south", "lon-east-written",
                   "never"]
    by_id = sr(stub).get_schema(sid)
    assert by_id.rule_set.domain_rules[0].params.params == {"dlq.topic": f"{topic}.dlt"}
    # The serializer reads them too: without CEL executors (celpy is not
    # installed) and without the override, it refuses to write the record.
    ser = AvroSerializer(sr(stub), None, conf={"auto.register.schemas": False,
                                               "use.latest.version": True},
                         rule_registry=RuleRegistry())
    with pytest.raises(SerializationError) as refused:
        ser(trig(0), SerializationContext(topic, MessageField.VALUE))
    assert "Could not find rule executor of type CEL_FIELD" in str(refused.value.__cause__)


def test_records_breaking_a_read_rule_are_diverted_with_the_rule_headers(
        proxy, stub, broker, broker_endpoint):
    topic = new_topic(broker)
    register(stub, topic, rules_for(topic))
    values = serialize(stub, topic, [
        trig(0),                      # valid
        trig(1, lat=61.5),            # breaks north-of-60 (READ, DLQ)
        trig(2, lon=-3.0),            # breaks lon-east (NONE): delivered, counted
        trig(3, device="x-3"),        # breaks device-prefix (CEL_FIELD, WRITEREAD)
        trig(4),                      # valid; `never` (disabled) would refuse all
    ])
    before = metric(proxy, "antidote_contract_rule_none_total",
                    f'subject="{topic}-value".*rule="lon-east"')
    recs = [c.Rec(0, i, f"k{i}".encode(), v, (), 1_700_000_000_000 + i)
            for i, v in enumerate(values)]
    c.ck_produce(broker_endpoint, topic, recs)   # straight to the broker: no door
    got = ps.read_to_end(c.Endpoint(proxy.bootstrap, "proxy"), topic, 0, at_least=3)
    assert [(g.offset, g.value) for g in got] == [(0, values[0]), (2, values[2]), (4, values[4])]
    dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt")
    assert ps.origin_offsets(dlt) == [(0, 1), (0, 3)]
    for d, rule in zip(dlt, ["north-of-60", "device-prefix"]):
        hd = ps.hdict(d)
        orig = recs[int(hd["x-original-offset"])]
        assert d.value == orig.value and d.key == orig.key
        assert hd["x-error-class"] == b"poison"
        assert hd["x-error-rule"] == f"rule:{rule}".encode()
        assert hd["__rule.name"] == rule.encode()
        assert hd["__rule.mode"] == b"READ"
        assert hd["__rule.subject"] == f"{topic}-value".encode()
        assert hd["__rule.topic"] == topic.encode()
        assert f"data-contract rule {rule}".encode() in hd["__rule.exception"]
        # Inside the framed, signed context, not among the original headers.
        assert d.headers[-1][0] == "x-antidote-signature"
        n = int(d.headers[-2][1].split()[1])
        assert "__rule.name" in [k for k, _ in d.headers[-2 - n:-2]]
    after = metric(proxy, "antidote_contract_rule_none_total",
                   f'subject="{topic}-value".*rule="lon-east".*mode="READ"')
    assert after - before >= 1
    # Read back by the proxy's DLT follower, none refused as not its own.
    assert metric(proxy, "antidote_dlt_records_refused_total", "") == 0


def test_a_write_rule_refuses_the_produce_at_the_door_naming_the_rule(proxy, stub, broker):
    import kafka.errors as kerr
    topic = new_topic(broker)
    register(stub, topic, rules_for(topic))
    values = serialize(stub, topic, [
        trig(0),                      # valid
        trig(1, lat=-61.0),           # breaks no-south (WRITE)
        trig(2, device="x-2"),        # breaks device-prefix (WRITEREAD)
        trig(3, lat=61.0),            # breaks north-of-60, a READ rule: written
        trig(4, lon=-3.0),            # breaks lon-east (READ) and lon-east-written
    ])                                # (WRITE, NONE): written, counted
    counted = f'subject="{topic}-value".*rule="lon-east-written".*mode="WRITE"'
    assert metric(proxy, "antidote_contract_rule_none_total", counted) == 0
    errors = c.kp_send_each(c.Endpoint(proxy.bootstrap, "proxy"), topic, values)
    assert [e is None for e in errors] == [True, False, False, True, True], errors
    for e, rule in [(errors[1], "no-south"), (errors[2], "device-prefix")]:
        assert isinstance(e, kerr.InvalidRecordError), e
        assert f"rule:{rule}" in str(e) and f"data-contract rule {rule}" in str(e), str(e)
    from test_produce_door import read_back
    landed = [r.value for r in read_back(broker, topic, 0, 3)]
    assert landed == [values[0], values[3], values[4]]
    assert metric(proxy, "antidote_contract_rule_none_total", counted) == 1


TRIGGER_JSON = json.dumps({"type": "object", "required": ["device_id", "lat", "lon", "count"],
                           "properties": {"device_id": {"type": "string"},
                                          "lat": {"type": "number"}, "lon": {"type": "number"},
                                          "count": {"type": "integer"}}})


def test_json_schema_rules_by_field_type(proxy, stub, broker, broker_endpoint):
    """A JSON Schema's CEL_FIELD rule guarded by typeName (integer fields are
    INT, as Confluent's clients name them) and a CEL rule, with records by
    confluent-kafka's JSONSerializer."""
    topic = f"dcj.{uuid.uuid4().hex[:10]}"
    c.ck_create_topic(c.Endpoint(broker.bootstrap), topic, 1)
    rules = [cel("counts-positive", "READ", 'typeName == "INT" ; value >= 0',
                 rule_type="CEL_FIELD"),
             cel("named", "WRITEREAD", 'message.device_id != ""', "DLQ,ERROR")]
    schema = Schema(TRIGGER_JSON, "JSON", rule_set=RuleSet(migration_rules=[], domain_rules=rules))
    sr(stub).register_schema(f"{topic}-value", schema)
    rr = RuleRegistry()
    for t in ("CEL", "CEL_FIELD"):
        rr.register_override(RuleOverride(t, None, None, True))
    ser = JSONSerializer(None, sr(stub), conf={"auto.register.schemas": False,
                                               "use.latest.version": True}, rule_registry=rr)
    ctx = SerializationContext(topic, MessageField.VALUE)
    docs = [{"device_id": "d-0", "lat": 1.0, "lon": 2.0, "count": 3},
            {"device_id": "d-1", "lat": 1.0, "lon": 2.0, "count": -1},   # counts-positive
            {"device_id": "", "lat": 1.0, "lon": 2.0, "count": 1},       # named
            {"device_id": "d-3", "lat": -1.5, "lon": -2.0, "count": 0}]  # doubles unguarded
    values = [ser(d, ctx) for d in docs]
    c.ck_produce(broker_endpoint, topic, [c.Rec(0, i, None, v, (), 1_700_000_000_000 + i)
                                          for i, v in enumerate(values)])
    got = ps.read_to_end(c.Endpoint(proxy.bootstrap, "proxy"), topic, 0, at_least=2)
    assert [(g.offset, g.value) for g in got] == [(0, values[0]), (3, values[3])]
    dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt")
    assert ps.origin_offsets(dlt) == [(0, 1), (0, 2)]
    assert [ps.hdict(d)["__rule.name"] for d in dlt] == [b"counts-positive", b"named"]
    assert b"field count:" in ps.hdict(dlt[0])["x-error"]


def test_a_rule_antidote_cannot_honour_makes_the_schema_unknown(
        proxy, stub, broker, broker_endpoint):
    topic = new_topic(broker)
    register(stub, topic, [cel("reshape", "READ", "$", kind="TRANSFORM", rule_type="JSONATA")])
    rr = RuleRegistry()
    rr.register_override(RuleOverride("JSONATA", None, None, True))
    ser = AvroSerializer(sr(stub), None, conf={"auto.register.schemas": False,
                                               "use.latest.version": True}, rule_registry=rr)
    value = ser(trig(0), SerializationContext(topic, MessageField.VALUE))
    c.ck_produce(broker_endpoint, topic, [c.Rec(0, 0, b"k", value, (), 1_700_000_000_000)])
    got = ps.read_to_end(c.Endpoint(proxy.bootstrap, "proxy"), topic, 0, at_least=0)
    assert got == []
    dlt = ps.read_dlt(broker_endpoint, f"{topic}.dlt")
    assert len(dlt) == 1
    hd = ps.hdict(dlt[0])
    assert (hd["x-error-class"], hd["x-error-rule"]) == (b"unknown", b"schema-id")
    assert (f"subject {topic}-value, data-contract rule reshape: TRANSFORM rules are not "
            "supported").encode() in hd["x-error"], hd["x-error"]
    assert "__rule.name" not in hd


def test_apicurio_ccompat_accepts_a_rule_set_and_drops_it(apicurio):  # noqa: F811 (fixture)
    """Apicurio Registry 3.3.3's Confluent API (ccompat v7) accepts a schema
    registered with a ruleSet, but stores and serves none: neither by id nor
    by subject version, and the same text with other rules is the same id.
    So with Apicurio, data-contract rules never reach antidote (nor
    Confluent's own clients); docs/policies.md says so."""
    topic = f"dc.{uuid.uuid4().hex[:10]}"
    sid = register(apicurio, topic, [cel("north-of-60", "READ", "message.lat < 60.0")])
    other = register(apicurio, topic, [cel("south", "READ", "message.lat > 0.0")])
    assert other == sid, "another ruleSet is not another schema in Apicurio"
    answers = []
    for path in (f"/schemas/ids/{sid}", f"/subjects/{topic}-value/versions/latest"):
        with urllib.request.urlopen(f"{apicurio.url}{path}", timeout=10) as r:
            answers.append(json.loads(r.read()))
    assert all("ruleSet" not in a for a in answers), answers
    assert all(json.loads(a["schema"]) == json.loads(TRIGGER) for a in answers)
    latest = sr(apicurio).get_latest_version(f"{topic}-value")
    assert latest.schema.rule_set is None


# Last in the module: it writes a stranger's record into a DLT, which the
# proxy's DLT readers refuse and count (the read-rule test asserts none).
def test_dlt_inspect_and_the_console_show_the_rule_from_the_signed_context_only(
        proxy, stub, broker, broker_endpoint):
    """A READ rule's diversion shows its rule (name, mode, subject, topic,
    exception) as fields of its own; a record diverted by the policy's
    coordinates rule that carries `__rule.*` headers of its own (as one a
    Confluent client dead-lettered) shows none, its headers stay headers; a
    record a stranger wrote into the DLT with `__rule.*` headers is not
    antidote's (unsigned) and is not shown at all."""
    from test_ops import cli, ok
    topic = new_topic(broker)
    register(stub, topic, rules_for(topic))
    values = serialize(stub, topic, [trig(0), trig(1, lat=61.5), trig(2, lon=200.0)])
    forged = tuple((f"__rule.{k}", v.encode()) for k, v in [
        ("name", "forged-rule"), ("mode", "READ"), ("subject", "forged-value"),
        ("topic", topic), ("exception", "forged")])
    c.ck_produce(broker_endpoint, topic, [
        c.Rec(0, 0, b"k0", values[0], (), 1_700_000_000_000),
        c.Rec(0, 1, b"k1", values[1], (), 1_700_000_000_001),
        c.Rec(0, 2, b"k2", values[2], forged, 1_700_000_000_002)])
    got = ps.read_to_end(c.Endpoint(proxy.bootstrap, "proxy"), topic, 0, at_least=1)
    assert [g.offset for g in got] == [0]
    dlt = f"{topic}.dlt"
    assert ps.origin_offsets(ps.read_dlt(broker_endpoint, dlt)) == [(0, 1), (0, 2)]
    c.ck_produce(broker_endpoint, dlt, [c.Rec(0, 0, b"k9", values[1], forged + (
        ("x-original-topic", topic.encode()), ("x-error-class", b"poison")), 0)])
    shown = [json.loads(line) for line in ok(cli(
        "dlt", "inspect", "--config", str(proxy.config_path), "--topic", dlt, "--json"
    )).splitlines()]
    assert [(j["origin_offset"], j["rule"]) for j in shown] == \
        [(1, "rule:north-of-60"), (2, "coordinates")], shown
    rule = shown[0]["contract_rule"]
    assert {k: rule[k] for k in ("name", "mode", "subject", "topic")} == {
        "name": "north-of-60", "mode": "READ", "subject": f"{topic}-value", "topic": topic}
    assert "data-contract rule north-of-60" in rule["exception"], rule
    assert "(message.lat = 61.5)" in rule["exception"], rule
    assert shown[1]["contract_rule"] is None, shown[1]
    assert [h["key"] for h in shown[1]["headers"]] == [k for k, _ in forged]
    table = ok(cli("dlt", "inspect", "--config", str(proxy.config_path), "--topic", dlt))
    lines = table.splitlines()
    col = lines[0].index("CONTRACT RULE")
    assert lines[1][col:].startswith(f"north-of-60 READ {topic}-value"), table
    assert lines[2][col:].startswith("- "), table
    assert "forged" not in table and lines[-1] == "(2 records)", table
    # The console: the same fields; the exception, which quotes the record,
    # withheld with the contents (logging.record_contents is off).
    url = f"http://{h.HOST}:{proxy.admin_port}/console/api/records?topic={dlt}"
    with urllib.request.urlopen(url, timeout=20) as r:
        page = json.loads(r.read())["records"]
    assert [j["origin_offset"] for j in page] == [1, 2], page
    assert page[0]["contract_rule"] == {**{k: rule[k] for k in ("name", "mode", "subject",
                                                                 "topic")}, "exception": None}
    assert page[1]["contract_rule"] is None, page[1]
    # And the page itself, in headless Chromium: the rule's line in the
    # record's detail, without the exception.
    from test_console import _browse
    seen = _browse(proxy.admin_port, "data-contracts", dlt, "read")
    assert [r["rule"] for r in seen["records"]] == ["rule:north-of-60", "coordinates"], seen
    assert seen["records"][0]["contract_rule"] == (
        f"data-contract rule north-of-60 · mode READ · subject {topic}-value · topic {topic}")
    assert seen["records"][1]["contract_rule"] is None
    assert not seen["console_errors"], seen["console_errors"]
