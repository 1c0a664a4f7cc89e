"""ApiVersions as seen by clients (protocol-notes.md section 5): every advertised
range is one the broker supports too, Produce keeps min v0, and the SASL keys
stay so clients never fall back to raw SASL framing."""

from __future__ import annotations

import socket

import harness as h

PRODUCE, FETCH, SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 0, 1, 17, 36, 18


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
