"""ApiVersions as seen by clients (protocol-notes.md section 5): every advertised
range is one the broker supports too, Produce keeps min v0, and the SASL keys
stay so clients never fall back to raw SASL framing. The consumer group
protocol of KIP-848 (ConsumerGroupHeartbeat 68, ConsumerGroupDescribe 69) is
offered as the broker offers it, and so are the share groups' client APIs
(KIP-932; src/proxy/versions.rs, SHARE_GROUP_APIS), but never the share
coordinator's inter-broker state APIs (83-87), though Kafka lists them.

docs/protocol-versions.md names every API key and version Kafka 4.4.0 offers
and what antidote does with it: the broker's own ApiVersions must be within
it, and the proxy must offer exactly what it says. ApiVersions v5 (KIP-1242)
through the per-broker and bootstrap ports: the node id a client sends is
that of the broker the port leads to."""

from __future__ import annotations

import socket
import struct
from typing import Optional

import pytest

import harness as h

PRODUCE, FETCH, SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 0, 1, 17, 36, 18
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
# ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge,
# Describe/Alter/DeleteShareGroupOffsets; the share coordinator's state APIs.
SHARE_GROUP_APIS = (76, 77, 78, 79, 90, 91, 92)
SHARE_STATE_APIS = (83, 84, 85, 86, 87)


def versions(port: int) -> dict[int, tuple[int, int]]:
    with socket.create_connection((h.HOST, port), timeout=10) as s:
        s.settimeout(10)
        return h.api_versions(s)


def test_api_versions_stay_within_broker_ranges_and_keep_produce_v0_and_sasl(endpoint, broker):
    port = int(endpoint.bootstrap.rsplit(":", 1)[1])
    seen, upstream = versions(port), versions(broker.port)
    for key, (lo, hi) in seen.items():
        assert key in upstream, f"api key {key} advertised but unknown to the broker"
        ulo, uhi = upstream[key]
        assert ulo <= lo <= hi <= uhi, f"api key {key}: {lo}-{hi} not within broker {ulo}-{uhi}"
    for key in (PRODUCE, FETCH, API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE):
        assert key in seen, f"api key {key} missing"
    assert seen[PRODUCE][0] == 0, "Produce minimum raised above v0 (KAFKA-18659)"


def test_kip_848_and_share_group_apis_are_offered_and_no_share_state_api_is(proxy, broker):
    seen, upstream = versions(proxy.bootstrap_port), versions(broker.port)
    for key in (CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE):
        assert key in upstream, f"the broker does not offer api key {key}"
        assert seen.get(key) == upstream[key], f"api key {key}: {seen.get(key)} != {upstream[key]}"
    listed = [k for k in SHARE_STATE_APIS if k in upstream]
    assert listed, "the broker lists no share state API: the check below would be empty"
    assert [k for k in SHARE_STATE_APIS if k in seen] == [], seen
    for key in SHARE_GROUP_APIS:
        if key in upstream:
            assert seen.get(key) == upstream[key], f"api key {key}"
    # The per-broker port offers the same as the bootstrap.
    assert versions(proxy.broker_port()) == seen


# ---------------------------------------------------------------------------
# docs/protocol-versions.md: every version the broker offers is named
# ---------------------------------------------------------------------------

TABLE = h.REPO / "docs" / "protocol-versions.md"


def _range(text: str) -> Optional[tuple[int, int]]:
    if text == "—":
        return None
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def version_table() -> dict[int, tuple[tuple[int, int], Optional[tuple[int, int]]]]:
    """{api key: (Kafka 4.4.0's range, the range antidote offers or None)}."""
    rows = {}
    for line in TABLE.read_text().splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].isdigit():
            rows[int(cells[0])] = (_range(cells[2]), _range(cells[3]))
    assert len(rows) > 50, f"{TABLE} has {len(rows)} rows"
    return rows


def test_every_version_the_broker_offers_is_named_in_the_version_table(broker):
    table = version_table()
    upstream = versions(broker.port)
    unnamed = {k: r for k, r in upstream.items()
               if k not in table or not (table[k][0][0] <= r[0] and r[1] <= table[k][0][1])}
    assert not unnamed, (f"the broker ({h.KAFKA_VERSION}) offers versions {TABLE.name} does not "
                         f"name: {unnamed}")


def test_the_proxy_offers_what_the_version_table_says(proxy, broker):
    table, upstream = version_table(), versions(broker.port)
    want = {}
    for k, (lo, hi) in upstream.items():
        offered = table[k][1]
        if offered is None:
            continue
        # The broker's own minimum for Produce (KAFKA-18659), else the meet.
        a = lo if k == PRODUCE else max(lo, offered[0])
        b = min(hi, offered[1])
        if a <= b:
            want[k] = (a, b)
    assert versions(proxy.bootstrap_port) == want
    assert versions(proxy.broker_port()) == want


# ---------------------------------------------------------------------------
# ApiVersions v5 (KIP-1242): cluster and node ids the client expects
# ---------------------------------------------------------------------------

REBOOTSTRAP_REQUIRED = 129


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _compact(s: Optional[str]) -> bytes:
    if s is None:
        return b"\x00"
    b = s.encode()
    return _uvarint(len(b) + 1) + b


def api_versions_v5(port: int, cluster_id: Optional[str], node_id: int) -> int:
    """Send ApiVersions v5 (flexible request header v2) naming the cluster
    and node the client expects; return the answer's error code."""
    header = struct.pack(">hhi", API_VERSIONS, 5, 7) + h.kstr("antidote-kip1242") + b"\x00"
    body = (_compact("antidote-test") + _compact("1") + _compact(cluster_id)
            + struct.pack(">i", node_id) + b"\x00")
    with socket.create_connection((h.HOST, port), timeout=10) as s:
        s.settimeout(10)
        s.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        size = struct.unpack(">i", h.recv_exact(s, 4))[0]
        resp = h.recv_exact(s, size)
    assert struct.unpack(">i", resp[:4])[0] == 7
    return struct.unpack(">h", resp[4:6])[0]  # the response header is v0 for ApiVersions


@h.needs_kafka
def test_api_versions_v5_names_the_node_each_proxy_port_leads_to(proxy, broker):
    if versions(broker.port)[API_VERSIONS][1] < 5:
        pytest.skip(f"Kafka {h.KAFKA_VERSION} has no ApiVersions v5")
    cluster, node = h.KAFKA_CLUSTER_ID, h.BROKER_NODE_ID
    # Directly, for reference: the broker checks both ids.
    assert api_versions_v5(broker.port, cluster, node) == 0
    assert api_versions_v5(broker.port, cluster, node + 1) == REBOOTSTRAP_REQUIRED
    # Through the per-broker port of node N: node N answers, so the ids match.
    assert api_versions_v5(proxy.broker_port(), cluster, node) == 0
    assert api_versions_v5(proxy.broker_port(), None, -1) == 0
    # What the broker says when the client's metadata is wrong goes through.
    assert api_versions_v5(proxy.broker_port(), cluster, node + 1) == REBOOTSTRAP_REQUIRED
    assert api_versions_v5(proxy.broker_port(), "AnotherCluster00000000", node) \
        == REBOOTSTRAP_REQUIRED
    # The bootstrap listener: no node id before metadata.
    assert api_versions_v5(proxy.bootstrap_port, None, -1) == 0
    # (A cluster id without a node id is the client's error: INVALID_REQUEST.)
    assert api_versions_v5(proxy.bootstrap_port, cluster, -1) == 42
