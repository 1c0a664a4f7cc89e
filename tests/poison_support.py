"""Helpers for the poison-interception tests (test_poison.py, test_deadletter.py):
test policies written to a tmp dir, an antidote started with them, geofence
payloads in JSON, Avro (fastavro) and Protobuf (hand-encoded wire format),
raw batch inspection and a direct DLT reader.

Nothing here changes harness.py or conftest.py: `PolicyProxy` extends
`harness.Antidote` with `policies` and `dead_letter` config keys.
"""

from __future__ import annotations

import io
import json
import math
import socket
import struct
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import clients as c
import harness as h

SCHEMAS = h.REPO / "policies" / "schemas"
AVSC = SCHEMAS / "trigger.avsc"
PROTO = SCHEMAS / "trigger.proto"
JSON_SCHEMA = SCHEMAS / "trigger.schema.json"
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]

# Topic prefixes; each test appends a unique suffix. The DLT of `T` is `T.dlt`,
# which also matches the policy's glob: the proxy must not police it.
JSON_PREFIX = "pzjson."
DROP_PREFIX = "pzdrop."
PASS_PREFIX = "pzpass."
AVRO_CONFLUENT_PREFIX = "pzavroc."
AVRO_RAW_PREFIX = "pzavror."
PROTO_RAW_PREFIX = "pzprotor."
PROTO_CONFLUENT_PREFIX = "pzprotoc."

RULES = """    rules:
      - coordinates: { lat: /lat, lon: /lon, reject_null_island: true }
      - field: /transition
        one_of: [ENTER, EXIT, DWELL]
      - field: /speed_mps
        min: 0
        max: 150
        optional: true
    headers:
      required: [idempotency-key]
"""


def policies_yaml() -> str:
    """Every test policy, with absolute schema paths into policies/schemas."""
    def json_policy(name: str, prefix: str, on_invalid: str) -> str:
        return (f"  - name: {name}\n"
                f"    topics: [\"{prefix}*\"]\n"
                f"    value:\n      format: json\n      schema: {JSON_SCHEMA}\n"
                + RULES + f"    on_invalid: {on_invalid}\n"
                "    dead_letter:\n      topic: \"{topic}.dlt\"\n")
    return ("policies:\n"
            + json_policy("pz-json", JSON_PREFIX, "divert")
            + json_policy("pz-drop", DROP_PREFIX, "drop")
            + json_policy("pz-pass", PASS_PREFIX, "pass")
            + f"  - name: pz-avro-confluent\n    topics: [\"{AVRO_CONFLUENT_PREFIX}*\"]\n"
              f"    value:\n      format: avro\n      wire: confluent\n"
              f"      schema_ids:\n        1: {AVSC}\n" + RULES
            + f"  - name: pz-avro-raw\n    topics: [\"{AVRO_RAW_PREFIX}*\"]\n"
              f"    value:\n      format: avro\n      schema: {AVSC}\n" + RULES
            + f"  - name: pz-proto-raw\n    topics: [\"{PROTO_RAW_PREFIX}*\"]\n"
              f"    value:\n      format: protobuf\n      schema: {PROTO}\n"
              f"      message: antidote.geofence.v1.Trigger\n" + RULES
            + f"  - name: pz-proto-confluent\n    topics: [\"{PROTO_CONFLUENT_PREFIX}*\"]\n"
              f"    value:\n      format: protobuf\n      wire: confluent\n      schema: {PROTO}\n"
              f"      message: antidote.geofence.v1.Trigger\n"
              f"      schema_ids:\n        1: {PROTO}\n" + RULES)


def write_policies(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / "test-policies.yaml"
    p.write_text(policies_yaml())
    return p


def unique_topic(prefix: str, tag: str = "") -> str:
    return f"{prefix}{tag}{'-' if tag else ''}{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------
# The proxy with policies
# ---------------------------------------------------------------------------

@dataclass
class PolicyProxy(h.Antidote):
    policies: list = field(default_factory=list)          # files or directories
    dead_letter: Optional[dict] = None                     # {bootstrap_servers: [..], timeout: "2s"}

    def config_yaml(self) -> str:
        base = h.Antidote.config_yaml(self)
        assert base.endswith("policies: []\n")
        lines = [base[:-len("policies: []\n")].rstrip("\n")]
        if self.policies:
            lines.append("policies:")
            lines += [f"  - {p}" for p in self.policies]
        else:
            lines.append("policies: []")
        if self.dead_letter:
            lines.append("dead_letter:")
            for k, v in self.dead_letter.items():
                if isinstance(v, list):
                    lines.append(f"  {k}:")
                    lines += [f"    - {x}" for x in v]
                else:
                    lines.append(f"  {k}: {v}")
        return "\n".join(lines) + "\n"


@dataclass
class AdminPolicyProxy(PolicyProxy):
    """A policy proxy with an admin listener (/metrics)."""
    admin_port: int = field(default_factory=h.free_port)

    def config_yaml(self) -> str:
        return super().config_yaml() + f"admin:\n  listen: {h.HOST}:{self.admin_port}\n"

    def metrics(self) -> str:
        import urllib.request
        with urllib.request.urlopen(f"http://{h.HOST}:{self.admin_port}/metrics",
                                    timeout=10) as r:
            return r.read().decode()


def start_policy_proxy(workdir: Path, **kw) -> PolicyProxy:
    """Start, registering the proxy so conftest attaches its log to failures
    (`admin=True`: with an admin listener, AdminPolicyProxy)."""
    import conftest
    p = (AdminPolicyProxy if kw.pop("admin", False) else PolicyProxy)(workdir, **kw)
    conftest._PROXIES.append(p)
    return p.start()


# ---------------------------------------------------------------------------
# Geofence payloads
# ---------------------------------------------------------------------------

def trigger(i: int, lat: float = 52.52, lon: float = 13.405, transition: str = "ENTER",
            speed: Optional[float] = 3.5) -> dict:
    return {"device_id": f"dev-{i}", "geofence_id": f"fence-{i % 3}", "lat": lat,
            "lon": lon + i * 1e-4, "transition": transition, "speed_mps": speed,
            "event_time_ms": 1_700_000_000_000 + i}


# Kinds of JSON records. Each is (value bytes, needs header?) builder.
def json_value(kind: str, i: int) -> bytes:
    if kind == "valid":
        return json.dumps(trigger(i)).encode()
    if kind == "nan":          # not JSON at all, by RFC 8259
        return json.dumps(trigger(i, lat=float("nan"))).encode()  # Python writes NaN
    if kind == "lat":
        return json.dumps(trigger(i, lat=91.5)).encode()
    if kind == "lon":
        return json.dumps(trigger(i, lon=-181.0)).encode()
    if kind == "enum":
        return json.dumps(trigger(i, transition="TELEPORT")).encode()
    if kind == "schema":       # a field the schema forbids
        d = trigger(i)
        d["extra"] = 1
        return json.dumps(d).encode()
    if kind == "garbage":
        return b"\x00\xffnot json"
    if kind == "noheader":
        return json.dumps(trigger(i)).encode()
    raise ValueError(kind)


# The rule each kind fails (x-error-rule).
JSON_RULE = {"nan": "decode", "lat": "coordinates", "lon": "coordinates",
             "enum": "one_of:/transition", "schema": "schema", "garbage": "decode",
             "noheader": "headers.required"}


def json_rec(kind: str, i: int, partition: int = 0, offset: Optional[int] = None,
             ts0: int = 1_700_000_000_000) -> c.Rec:
    """Record `i` of a partition (offset defaults to i) of the given kind."""
    headers = (("trace", f"t{i}".encode()),)
    if kind != "noheader":
        headers = (("idempotency-key", f"idem-{partition}-{i}".encode()),) + headers
    return c.Rec(partition, i if offset is None else offset, f"k-{partition}-{i}".encode(),
                 json_value(kind, i), headers, ts0 + i)


# --- Avro (fastavro) ---------------------------------------------------------

def _avro_schema():
    import fastavro
    return fastavro.parse_schema(json.loads(AVSC.read_text()))


def avro_datum(d: dict) -> bytes:
    import fastavro
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, _avro_schema(), d)
    return buf.getvalue()


def confluent(schema_id: int, payload: bytes, message_indexes: Optional[bytes] = None) -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + (message_indexes or b"") + payload


# --- Protobuf (hand-encoded wire format of policies/schemas/trigger.proto) --

def _uvarint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field_no: int, wire_type: int) -> bytes:
    return _uvarint((field_no << 3) | wire_type)


PROTO_TRANSITION = {"TRANSITION_UNSPECIFIED": 0, "ENTER": 1, "EXIT": 2, "DWELL": 3}


def proto_trigger(d: dict) -> bytes:
    """Trigger: device_id=1, geofence_id=2 (strings), lat=3, lon=4 (double),
    transition=5 (enum), speed_mps=6 (optional double), event_time_ms=7 (int64)."""
    out = bytearray()
    for no, name in ((1, "device_id"), (2, "geofence_id")):
        b = d[name].encode()
        out += _key(no, 2) + _uvarint(len(b)) + b
    out += _key(3, 1) + struct.pack("<d", d["lat"])
    out += _key(4, 1) + struct.pack("<d", d["lon"])
    out += _key(5, 0) + _uvarint(PROTO_TRANSITION[d["transition"]])
    if d.get("speed_mps") is not None:
        out += _key(6, 1) + struct.pack("<d", d["speed_mps"])
    out += _key(7, 0) + _uvarint(d["event_time_ms"])
    return bytes(out)


# ---------------------------------------------------------------------------
# Raw protocol helpers
# ---------------------------------------------------------------------------

def raw_fetch(port: int, topic: str, partition: int = 0, offset: int = 0,
              isolation_level: int = 0, timeout: float = 10) -> bytes:
    with socket.create_connection((h.HOST, port), timeout=10) as s:
        s.settimeout(timeout)
        return h.roundtrip(s, 1, 11, 42, h.fetch_v11_body(topic, partition, offset,
                                                          isolation_level))


def fetch_partition(port: int, topic: str, partition: int = 0, offset: int = 0,
                    isolation_level: int = 0, timeout: float = 10) -> h.FetchPartition:
    # A topic created a moment ago may not have its leader yet (Kafka:
    # NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION):
    # ask again for a few seconds.
    deadline = time.monotonic() + 10
    while True:
        err, topics = h.parse_fetch_v11(raw_fetch(port, topic, partition, offset, isolation_level,
                                                  timeout))
        assert err == 0, f"fetch error {err}"
        [p] = topics[topic]
        if p.error_code in (3, 5, 6) and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        assert p.error_code == 0, f"partition error {p.error_code}"
        return p


@dataclass(frozen=True)
class BatchHeader:
    base_offset: int
    last_offset_delta: int
    attributes: int
    count: int
    bytes: bytes


def split_batches(records: bytes) -> list[BatchHeader]:
    """Complete magic-2 batches of a records section, headers read, bytes kept."""
    out, pos = [], 0
    while pos + 12 <= len(records):
        base, blen = struct.unpack_from(">qi", records, pos)
        end = pos + 12 + blen
        if end > len(records):
            break
        attrs, lod = struct.unpack_from(">hi", records, pos + 21)
        count = struct.unpack_from(">i", records, pos + 57)[0]
        out.append(BatchHeader(base, lod, attrs, count, records[pos:end]))
        pos = end
    return out


def high_watermark(port: int, topic: str, partition: int = 0) -> int:
    return fetch_partition(port, topic, partition).high_watermark


def wait_high_watermark(port: int, topic: str, partition: int, at_least: int,
                        timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    hw = -1
    while time.monotonic() < deadline:
        try:
            hw = high_watermark(port, topic, partition)
        except (AssertionError, OSError):
            hw = -1
        if hw >= at_least:
            return hw
        time.sleep(0.2)
    raise AssertionError(f"{topic}-{partition}: high watermark {hw} < {at_least} after {timeout}s")


def topic_exists(ep: c.Endpoint, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient
    md = AdminClient(ep.ck()).list_topics(timeout=10)
    t = md.topics.get(topic)
    return t is not None and t.error is None


def is_lease_marker(r: c.Rec) -> bool:
    """A DLT partition's lease marker (written when a writer takes the lease
    with an epoch above 0): no key, no value, one context header in its frame
    (and a signature with signing keys)."""
    return (r.headers[:2] == (("x-antidote-marker", b"lease"), ("x-antidote-context", b"2 1"))
            and r.key is None and r.value is None)


def read_dlt(ep: c.Endpoint, topic: str, partitions: int = 1, settle: float = 1.0,
             timeout: float = 30, lease_markers: bool = False) -> list[c.Rec]:
    """Every record of `topic` read directly from the broker with kafka-python,
    up to the high watermark of each partition (ListOffsets is wrong on tansu);
    lease markers only if asked for."""
    port = int(ep.bootstrap.rsplit(":", 1)[1])
    time.sleep(settle)
    hws = {p: high_watermark(port, topic, p) for p in range(partitions)}
    total = sum(hws.values())
    if total == 0:
        return []
    got = c.kp_consume_assign(ep, topic, list(range(partitions)), total, timeout=timeout)
    return got if lease_markers else [r for r in got if not is_lease_marker(r)]


def read_to_end(ep: c.Endpoint, topic: str, partition: int, at_least: int,
                **conf) -> list[c.Rec]:
    """Every record of the partition a librdkafka consumer gets through `ep`,
    until the end of the partition once at least `at_least` were read (so a
    duplicate or an extra shows), at most 20 s. `conf`: extra settings."""
    import confluent_kafka as ck
    cons = ck.Consumer(ep.ck(**{"group.id": f"to-end-{time.monotonic_ns()}",
                                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                "enable.partition.eof": True, **conf}))
    got: list[c.Rec] = []
    try:
        cons.assign([ck.TopicPartition(topic, partition, ck.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == ck.KafkaError._PARTITION_EOF and len(got) >= at_least:
                    break
                continue
            got.append(c._ck_rec(m))
    finally:
        cons.close()
    return got


def without_markers(recs: list[c.Rec]) -> list[c.Rec]:
    """A DLT's records without its lease markers (every lease, epoch 0
    included, writes one before its first record: 47d1769)."""
    return [r for r in recs if not is_lease_marker(r)]


def read_dlt_records(ep: c.Endpoint, topic: str, n: int, timeout: float = 30,
                     **conf) -> list[c.Rec]:
    """The first `n` records of partition 0 of a DLT that are not lease
    markers, read directly with librdkafka (`conf`: extra client settings)."""
    def enough(got):
        return len(without_markers(got)) >= n
    got = c.ck_consume_assign(ep, topic, [0], 10**9, timeout=timeout, until=enough, **conf)
    return without_markers(got)[:n]


def hdict(rec: c.Rec) -> dict[str, bytes]:
    """Headers as a dict (last wins); use `rec.headers` for the full list."""
    return {k: v for k, v in rec.headers}


CONTEXT_HEADERS = ("x-original-topic", "x-original-topic-id", "x-original-partition", "x-original-offset",
                   "x-original-timestamp", "x-error-class", "x-error", "x-error-rule",
                   "x-policy", "x-failed-at")


def check_dlt_record(dlt: c.Rec, orig: c.Rec, topic: str, policy: str, rule: str,
                     klass: str = "poison", t_before_ms: Optional[int] = None) -> None:
    """A DLT record carries the original key, value and headers, then the
    context, then the trailer that frames it (`x-antidote-context: 2 <n>`)."""
    assert dlt.key == orig.key
    assert dlt.value == orig.value
    n = len(orig.headers)
    assert dlt.headers[:n] == tuple(orig.headers), "original headers not kept first, in order"
    assert dlt.headers[-1] == ("x-antidote-context", f"2 {len(dlt.headers) - n - 1}".encode())
    ctx = dict(dlt.headers[n:-1])
    assert sorted(k for k, _ in dlt.headers[n:-1]) == sorted(CONTEXT_HEADERS), dlt.headers[n:]
    assert ctx["x-original-topic"] == topic.encode()
    assert uuid.UUID(ctx["x-original-topic-id"].decode()).int != 0  # the broker's topic id
    assert ctx["x-original-partition"] == str(orig.partition).encode()
    assert ctx["x-original-offset"] == str(orig.offset).encode()
    assert ctx["x-original-timestamp"] == str(orig.timestamp).encode()
    assert ctx["x-error-class"] == klass.encode()
    assert ctx["x-error-rule"] == rule.encode(), (ctx["x-error-rule"], ctx["x-error"])
    assert ctx["x-error"], "empty x-error"
    assert ctx["x-policy"] == policy.encode()
    failed_at = int(ctx["x-failed-at"])
    now = int(time.time() * 1000)
    assert (t_before_ms or now - 600_000) <= failed_at <= now + 1000, failed_at
    assert dlt.timestamp == orig.timestamp


def origin_offsets(dlt: list[c.Rec]) -> list[tuple[int, int]]:
    return [(int(hdict(r)["x-original-partition"]), int(hdict(r)["x-original-offset"]))
            for r in dlt]


def is_nan_lat(v: bytes) -> bool:
    try:
        return math.isnan(json.loads(v)["lat"])
    except Exception:
        return False


def sorted_by_origin(dlt: list[c.Rec]) -> list[c.Rec]:
    """DLT records ordered by (original partition, offset); duplicates kept."""
    return sorted(dlt, key=lambda r: (int(hdict(r)["x-original-partition"]),
                                      int(hdict(r)["x-original-offset"])))
