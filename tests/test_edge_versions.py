"""Requests outside the API versions the proxy advertises are refused, never
relayed blind: UNSUPPORTED_VERSION (35) from the proxy itself where the
response has a top-level error code, otherwise the connection is closed (as a
Kafka broker does). Frames are built by hand: no client sends these after
reading the proxy's ApiVersions.

Share groups (KIP-932) are offered unless `share_groups.enabled: false`;
then none of their APIs is (src/proxy/versions.rs, SHARE_GROUP_APIS): a
ShareGroupHeartbeat, ShareFetch, ShareAcknowledge or
Alter/DeleteShareGroupOffsets gets the proxy's UNSUPPORTED_VERSION with its
reason, the others (ShareGroupDescribe, DescribeShareGroupOffsets) close the
connection. The share coordinator's inter-broker state APIs (83-87) are
never offered."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

import pytest

import harness as h
from test_robustness import api_versions_ok, closed_by_peer

UNSUPPORTED_VERSION = 35
SHARE_GROUPS_REFUSED = ("share groups (KIP-932) are turned off in antidote "
                        "(share_groups.enabled: false)")


@dataclass
class NoShareProxy(h.Antidote):
    """The proxy with `share_groups.enabled: false`."""

    def config_yaml(self) -> str:
        return super().config_yaml() + "share_groups:\n  enabled: false\n"


@pytest.fixture(scope="module")
def noshare(workdir, broker):
    import conftest
    p = NoShareProxy(workdir, upstream=[broker.bootstrap], name="antidote-noshare")
    conftest._PROXIES.append(p)
    p.start()
    yield p
    p.stop_and_check()


def compact_str(s: str | None) -> bytes:
    """A compact (nullable) string of a flexible version; lengths under 127."""
    if s is None:
        return b"\x00"
    b = s.encode()
    assert len(b) < 127
    return bytes([len(b) + 1]) + b


def compact_str_at(body: bytes, pos: int) -> tuple[str | None, int]:
    n = body[pos]
    assert n < 128, "one-byte varint lengths only"
    if n == 0:
        return None, pos + 1
    return body[pos + 1:pos + n].decode(), pos + n


def share_group_heartbeat_v1(group: str, topic: str) -> bytes:
    """ShareGroupHeartbeat v1: GroupId, MemberId, MemberEpoch 0 (join), RackId
    null, SubscribedTopicNames [topic], no tags."""
    member = "0123456789abcdefABCDEF"  # the client generates its member id (KIP-1082)
    return (compact_str(group) + compact_str(member) + struct.pack(">i", 0) + b"\x00"
            + b"\x02" + compact_str(topic) + b"\x00")


def flexible_request(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    """Size-prefixed request with a v2 (flexible) header: no tagged fields."""
    header = struct.pack(">hhi", api_key, version, correlation_id) + h.kstr("edge-test") + b"\x00"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def flexible_answer(sock: socket.socket, correlation_id: int) -> bytes:
    """The body of a response with a v1 (flexible) header and no tagged fields."""
    size = struct.unpack(">i", h.recv_exact(sock, 4))[0]
    resp = h.recv_exact(sock, size)
    assert struct.unpack(">i", resp[:4])[0] == correlation_id
    assert resp[4] == 0, "no tagged fields in the header"
    return resp[5:]


def test_describe_quorum_v2_is_answered_unsupported_version_by_the_proxy(proxy):
    with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=5) as s:
        s.settimeout(5)
        assert h.api_versions(s).get(55, (0, 1))[1] <= 1, "v2+ must not be advertised"
        # DescribeQuorum v2 body: topics (compact array, empty), no tags.
        s.sendall(flexible_request(55, 2, 41, b"\x01\x00"))
        body = flexible_answer(s, 41)
        assert struct.unpack(">h", body[:2])[0] == UNSUPPORTED_VERSION
        # The connection stays usable.
        assert 0 in h.api_versions(s)


def test_share_group_apis_are_offered_by_default_and_the_state_apis_never(proxy, broker):
    with socket.create_connection((h.HOST, broker.port), timeout=5) as s:
        upstream = h.api_versions(s)
    with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=5) as s:
        offered = h.api_versions(s)
    for key in (76, 77, 78, 79, 90, 91, 92):
        if key in upstream:
            assert offered.get(key) == upstream[key], key
    assert [k for k in (83, 84, 85, 86, 87) if k in offered] == []


def test_share_fetch_turned_off_is_answered_unsupported_version_by_the_proxy(noshare):
    proxy = noshare
    with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=5) as s:
        s.settimeout(5)
        assert 78 not in h.api_versions(s), "ShareFetch must not be advertised"
        s.sendall(flexible_request(78, 1, 42, b"\x00" * 16))
        body = flexible_answer(s, 42)
        throttle, err = struct.unpack(">ih", body[:6])
        assert err == UNSUPPORTED_VERSION


def test_a_refused_request_without_a_top_level_error_code_closes_only_its_connection(proxy):
    with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=5) as s:
        # Fetch v3: below the proxy's Fetch range; its response has no
        # top-level error code, so the proxy hangs up, as a broker would.
        s.sendall(h.request_frame(1, 3, 43, h.fetch_v11_body("t", 0, 0)[:20]))
        assert closed_by_peer(s, 5)
    assert api_versions_ok(proxy.bootstrap_port)
    log = h.read_log(proxy.log)
    assert "Fetch v3 is outside the versions the proxy offers" in log


def test_share_group_heartbeat_turned_off_gets_the_proxys_refusal(noshare):
    """A share consumer that ignored ApiVersions: no member is created through
    the proxy (a Java share consumer against a broker with share groups on,
    directly and through the proxy, is in test_group_protocols.py)."""
    proxy = noshare
    with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=5) as s:
        s.settimeout(5)
        assert 76 not in h.api_versions(s), "ShareGroupHeartbeat must not be advertised"
        s.sendall(flexible_request(76, 1, 44, share_group_heartbeat_v1("edge-share", "t")))
        body = flexible_answer(s, 44)
        throttle, err = struct.unpack(">ih", body[:6])
        msg, pos = compact_str_at(body, 6)
        member, _ = compact_str_at(body, pos)
        assert (err, msg, member) == (UNSUPPORTED_VERSION, SHARE_GROUPS_REFUSED, None)
        assert 0 in h.api_versions(s), "the connection stays usable"


def test_share_acknowledge_and_share_offsets_turned_off_are_refused_with_the_reason(noshare):
    proxy = noshare
    frames = {
        # ShareAcknowledge v1: GroupId, MemberId, ShareSessionEpoch, no topics.
        79: (1, compact_str("g") + compact_str("m") + struct.pack(">i", 1) + b"\x01\x00"),
        # AlterShareGroupOffsets v0: GroupId, no topics.
        91: (0, compact_str("g") + b"\x01\x00"),
        # DeleteShareGroupOffsets v0: GroupId, no topics.
        92: (0, compact_str("g") + b"\x01\x00"),
    }
    with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=5) as s:
        s.settimeout(5)
        offered = h.api_versions(s)
        for i, (key, (version, body)) in enumerate(frames.items()):
            assert key not in offered
            s.sendall(flexible_request(key, version, 50 + i, body))
            answer = flexible_answer(s, 50 + i)
            _, err = struct.unpack(">ih", answer[:6])
            msg, _ = compact_str_at(answer, 6)
            assert (key, err, msg) == (key, UNSUPPORTED_VERSION, SHARE_GROUPS_REFUSED)


def test_share_group_describe_turned_off_closes_only_its_connection(noshare):
    """ShareGroupDescribe's response has no top-level error code: the proxy
    hangs up, logs why, and serves the next connection."""
    proxy = noshare
    with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=5) as s:
        s.settimeout(5)
        assert 77 not in h.api_versions(s)
        # ShareGroupDescribe v1: GroupIds ["g"], IncludeAuthorizedOperations false.
        s.sendall(flexible_request(77, 1, 60, b"\x02" + compact_str("g") + b"\x00\x00"))
        assert closed_by_peer(s, 5)
    assert api_versions_ok(proxy.bootstrap_port)
    assert "ShareGroupDescribe v1 is outside the versions the proxy offers" in \
        h.read_log(proxy.log)


@h.needs_kafka
def test_kafka_4_4_0_offers_exactly_the_ranges_the_version_table_names(broker):
    """docs/protocol-versions.md's "Kafka 4.4.0" column is Kafka 4.4.0's
    own ApiVersions on a client listener, key for key, range for range:
    equality (test_api_versions.py checks that any broker's ranges are
    within it, which a table wider than 4.4.0 would pass)."""
    from test_api_versions import version_table, versions
    if h.KAFKA_VERSION != "4.4.0":
        pytest.skip(f"the table names Kafka 4.4.0's ranges; the broker is {h.KAFKA_VERSION}")
    table = {k: kafka for k, (kafka, _offers) in version_table().items() if kafka is not None}
    upstream = versions(broker.port)
    differ = {k: (table.get(k), upstream.get(k)) for k in set(table) | set(upstream)
              if table.get(k) != upstream.get(k)}
    assert not differ, ("api key: (the table's Kafka 4.4.0 range, what Kafka 4.4.0 offers): "
                        f"{dict(sorted(differ.items()))}")
