"""Requests outside the API versions the proxy advertises are refused, never
relayed blind: UNSUPPORTED_VERSION (35) from the proxy itself where the
response has a top-level error code, otherwise the connection is closed (as a
Kafka broker does). Frames are built by hand: no client sends these after
reading the proxy's ApiVersions."""

from __future__ import annotations

import socket
import struct

import harness as h
from test_robustness import api_versions_ok, closed_by_peer

UNSUPPORTED_VERSION = 35


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


def test_share_fetch_is_answered_unsupported_version_by_the_proxy(proxy):
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
