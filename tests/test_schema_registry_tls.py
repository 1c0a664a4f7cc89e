"""A schema registry served over https (issue 11): antidote verifies the
registry's certificate against `schema_registry.tls.ca`.

The producer is confluent-kafka's own JSONSerializer, registering through
the https stub with the same CA. A proxy given the CA resolves the ids and
judges (valid records delivered, poison diverted); a proxy given another
CA (an https URL needs one: antidote does not fall back to system roots)
cannot verify the registry, so its verdicts are `transient`: the partition
is held at the first record, nothing is delivered or dead-lettered."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import clients as c
import harness as h
import poison_support as ps
from registry_stub import Registry
from test_schema_registry import Reader, dlt, produce, topic

POLICY = """
policies:
  - name: sr-tls
    topics: ["srtls.*"]
    value: { format: json, wire: confluent, registry: true }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
"""


@dataclass
class TlsRegistryProxy(ps.PolicyProxy):
    registry_url: str = ""
    ca: str = ""

    def config_yaml(self) -> str:
        text = ps.PolicyProxy.config_yaml(self)
        return text + (f"schema_registry:\n  url: {self.registry_url}\n  timeout: 1s\n"
                       f"  tls: {{ ca: {self.ca} }}\n")


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory):
    certs = h.make_certs(tmp_path_factory.mktemp("sr-certs"))
    r = Registry(tls=(str(certs.server_cert), str(certs.server_key))).start()
    yield r, certs
    r.stop()


def start_proxy(workdir, broker, tmp_path, url: str, ca: str) -> TlsRegistryProxy:
    (tmp_path / "sr-tls.yaml").write_text(POLICY)
    import conftest
    p = TlsRegistryProxy(workdir, upstream=[broker.bootstrap], policies=[tmp_path / "sr-tls.yaml"],
                         name=f"antidote-sr-tls-{uuid.uuid4().hex[:6]}", registry_url=url, ca=ca)
    conftest._PROXIES.append(p)
    return p.start()


def serialized(reg: Registry, ca, t: str) -> list[bytes]:
    """Valid, poison (latitude 91), valid: JSON Schema framing, registered
    over https by the real serializer."""
    client = SchemaRegistryClient({"url": reg.url, "ssl.ca.location": str(ca)})
    schema = json.dumps({"type": "object", "required": ["lat", "lon"],
                         "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}})
    ser = JSONSerializer(schema, client, conf={"auto.register.schemas": True})
    ctx = SerializationContext(t, MessageField.VALUE)
    return [ser({"lat": 1.5, "lon": 2.5}, ctx), ser({"lat": 91.0, "lon": 2.5}, ctx),
            ser({"lat": 3.5, "lon": 4.5}, ctx)]


def test_an_https_registry_is_used_with_its_ca_and_refused_with_another(
        workdir, broker, broker_endpoint, tls_registry, tmp_path):
    reg, certs = tls_registry
    other = h.make_certs(tmp_path / "other-ca")
    t = topic(broker_endpoint, "srtls.")
    produce(broker_endpoint, t, serialized(reg, certs.ca, t))
    before = reg.id_requests(1) + reg.id_requests(2)

    untrusting = start_proxy(workdir, broker, tmp_path, reg.url, ca=str(other.ca))
    try:
        r = Reader(c.Endpoint(untrusting.bootstrap, "proxy"), t)
        try:
            got = r.read(6)
        finally:
            r.close()
        assert got == [], "records delivered although the registry could not be verified"
        assert dlt(broker_endpoint, t) == [], "a record dead-lettered without a verdict"
        assert reg.id_requests(1) + reg.id_requests(2) == before, \
            "an id was fetched although the handshake must fail"
        # The fault took effect: the proxy did ask, and the handshake failed
        # (not a proxy that never reached the registry).
        refused = [line for line in h.read_log(untrusting.log, limit=10**7).splitlines()
                   if "schema registry cannot be used" in line]
        assert refused and "certificate" in refused[0].lower(), refused
        untrusting.assert_running()
    finally:
        untrusting.stop_and_check()

    trusting = start_proxy(workdir, broker, tmp_path, reg.url, ca=str(certs.ca))
    try:
        r = Reader(c.Endpoint(trusting.bootstrap, "proxy"), t)
        try:
            got = r.read(20, until=2)
        finally:
            r.close()
        assert [g.offset for g in got] == [0, 2]
        assert [ps.hdict(d)["x-original-offset"] for d in dlt(broker_endpoint, t)] == [b"1"]
    finally:
        trusting.stop_and_check()
