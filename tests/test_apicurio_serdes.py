"""Apicurio Registry's own wire formats, written by Apicurio's own Kafka
serializer (io.apicurio.registry.serde.avro.AvroKafkaSerializer from
apicurio-registry-serdes-avro-serde 2.6.13.Final, Maven Central; the 3.x
Kafka serde artifacts are not served here) registering its schema in a real
Apicurio Registry 3.3.3 (its v2 API), and judged by antidote through
Apicurio's native v3 API:

- `wire: apicurio-headers`: the global id in the `apicurio.value.globalId`
  header, the value the bare Avro datum;
- `wire: apicurio-8byte`: magic byte 0, then the 8-byte global id (2.x's
  own framing).

Poison mixed in: records that break the policy's coordinates rule (written
by the serializer), raw bytes (librdkafka), and a record naming a global id
the registry does not have. Consumed through the proxy by librdkafka: every
valid record once, in order; each invalid one in its class's dead-letter
topic with antidote's context headers. One Apicurio and one Java producer
run per mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import clients as c
import harness as h
import poison_support as ps
import registry_support as rs
from registry_support import apicurio  # noqa: F401 (fixture)

SERDES_VERSION = "2.6.13.Final"
SERDES_LIB = Path(os.environ.get(
    "APICURIO_SERDES_LIB", h.REPO / ".tools" / f"apicurio-serdes-{SERDES_VERSION}" / "lib"))
PRODUCER = h.REPO / "tests" / "java" / "apicurio" / "ApicurioProducer.java"
UNKNOWN_ID = 987_654
COUNT = 8  # records n = 0..7; n % 4 == 3 breaks the coordinates rule

POLICIES = """
policies:
  - name: ap-headers
    topics: ["ap.headers.*"]
    value: { format: avro, registry: true, wire: apicurio-headers, id: global }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
    dead_letter: { topic: "{topic}.{class}.dlt" }
  - name: ap-8byte
    topics: ["ap.8byte.*"]
    value: { format: avro, registry: true, wire: apicurio-8byte }
    rules:
      - coordinates: { lat: /lat, lon: /lon }
    dead_letter: { topic: "{topic}.{class}.dlt" }
"""


@dataclass
class ApicurioProxy(ps.PolicyProxy):
    registry_url: str = ""

    def config_yaml(self) -> str:
        # `url` is Apicurio's Confluent API; the native API's URL is derived.
        return ps.PolicyProxy.config_yaml(self) + (
            f"schema_registry:\n  url: \"{self.registry_url}\"\n  timeout: 2s\n")


@pytest.fixture(scope="module")
def serdes_lib() -> Path:
    if not (SERDES_LIB.is_dir() and any(SERDES_LIB.glob("apicurio-registry-serdes-avro-serde-*.jar"))):
        why = f"Apicurio's serializers not found at {SERDES_LIB}: run scripts/setup.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return SERDES_LIB


@pytest.fixture(scope="module")
def aproxy(workdir, broker, apicurio, tmp_path_factory):
    d = tmp_path_factory.mktemp("apicurio-policies")
    (d / "ap.yaml").write_text(POLICIES)
    import conftest
    p = ApicurioProxy(workdir, upstream=[broker.bootstrap], policies=[d / "ap.yaml"],
                      name="antidote-apicurio-serdes", registry_url=apicurio.url)
    conftest._PROXIES.append(p)
    p.start()
    yield p
    p.stop_and_check()


def run_producer(lib: Path, bootstrap: str, topic: str, registry_v2: str, mode: str) -> None:
    java = rs.apicurio_java() or "java"
    out = subprocess.run([java, "-cp", f"{lib}/*", str(PRODUCER), bootstrap, topic,
                          registry_v2, mode, str(COUNT)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"sent": COUNT}, out.stdout


@pytest.mark.parametrize("mode", ["headers", "8byte"])
def test_apicurio_serializers_framings_valid_once_poison_and_unknown_diverted(
        mode, serdes_lib, aproxy, apicurio, broker_endpoint):
    t = f"ap.{mode}.{uuid.uuid4().hex[:10]}"
    c.ck_create_topic(broker_endpoint, t, 1)
    root = apicurio.url.removesuffix("/apis/ccompat/v7")
    run_producer(serdes_lib, broker_endpoint.bootstrap, t, f"{root}/apis/registry/v2", mode)
    written = ps.read_dlt(broker_endpoint, t)  # the topic itself, read directly
    assert len(written) == COUNT
    first = written[0]
    if mode == "headers":
        hd = ps.hdict(first)
        assert len(hd["apicurio.value.globalId"]) == 8, first.headers
        datum = first.value
        raw = c.Rec(0, None, b"k-raw", b"not an avro datum", (), 0)
        bogus = c.Rec(0, None, b"k-bogus", datum,
                      (("apicurio.value.globalId", UNKNOWN_ID.to_bytes(8, "big")),), 0)
    else:
        assert first.value[0] == 0 and not first.headers, first
        datum = first.value[9:]
        raw = c.Rec(0, None, b"k-raw", b"\x01not an avro datum", (), 0)
        bogus = c.Rec(0, None, b"k-bogus", b"\x00" + UNKNOWN_ID.to_bytes(8, "big") + datum, (), 0)
    # A byte-identical copy of the first record last (offset COUNT + 2):
    # once it arrives, every record before it has been judged.
    again = c.Rec(0, None, first.key, first.value, first.headers, 0)
    c.ck_produce(broker_endpoint, t, [raw, bogus, again])  # offsets COUNT .. COUNT + 2
    aproxy.assert_running()
    ep = c.Endpoint(aproxy.bootstrap, "proxy")
    got = c.ck_consume_assign(ep, t, [0], 10**9, timeout=60,
                              until=lambda g: any(r.offset == COUNT + 2 for r in g))
    valid = [n for n in range(COUNT) if n % 4 != 3]
    assert [g.offset for g in got] == valid + [COUNT + 2]
    assert [g.value for g in got] == [written[n].value for n in valid] + [first.value]
    by_offset = {r.offset: r for r in written}
    by_offset[COUNT] = c.Rec(0, COUNT, raw.key, raw.value, raw.headers, 0)
    by_offset[COUNT + 1] = c.Rec(0, COUNT + 1, bogus.key, bogus.value, bogus.headers, 0)
    poison = ps.read_dlt(broker_endpoint, f"{t}.poison.dlt")
    unknown = ps.read_dlt(broker_endpoint, f"{t}.unknown.dlt")
    raw_class, raw_rule = ("unknown", "schema-id") if mode == "headers" else ("poison", "decode")
    want_poison = [(3, "coordinates"), (7, "coordinates")] + (
        [(COUNT, raw_rule)] if raw_class == "poison" else [])
    want_unknown = ([(COUNT, raw_rule)] if raw_class == "unknown" else []) + [(COUNT + 1, "schema-id")]
    ctx = lambda x: ps.hdict(x)  # noqa: E731
    assert [(int(ctx(x)["x-original-offset"]), ctx(x)["x-error-rule"].decode()) for x in poison] \
        == want_poison
    assert [(int(ctx(x)["x-original-offset"]), ctx(x)["x-error-rule"].decode()) for x in unknown] \
        == want_unknown
    policy = f"ap-{mode}"
    for x in poison + unknown:
        off = int(ctx(x)["x-original-offset"])
        orig = by_offset[off]
        klass = ctx(x)["x-error-class"].decode()
        ps.check_dlt_record(x, c.Rec(0, off, orig.key, orig.value, orig.headers, x.timestamp),
                            t, policy, ctx(x)["x-error-rule"].decode(), klass)
