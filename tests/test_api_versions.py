"""ApiVersions as seen by clients (protocol-notes.md section 5): every advertised
range is one the broker supports too, Produce keeps min v0, and the SASL keys
stay so clients never fall back to raw SASL framing. The consumer group
protocol of KIP-848 (ConsumerGroupHeartbeat 68, ConsumerGroupDescribe 69) is
offered as the broker offers it; none of the share-group APIs of KIP-932 is
(src/proxy/versions.rs, SHARE_GROUP_APIS), though Kafka 4.1 lists them."""

from __future__ import annotations

import socket

import harness as h

PRODUCE, FETCH, SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 0, 1, 17, 36, 18
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
# ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge, the
# share coordinator's state APIs (83-87), Describe/Alter/DeleteShareGroupOffsets.
SHARE_GROUP_APIS = (76, 77, 78, 79, 83, 84, 85, 86, 87, 90, 91, 92)


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


def test_kip_848_group_apis_are_offered_and_no_share_group_api_is(proxy, broker):
    seen, upstream = versions(proxy.bootstrap_port), versions(broker.port)
    for key in (CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE):
        assert key in upstream, f"the broker does not offer api key {key}"
        assert seen.get(key) == upstream[key], f"api key {key}: {seen.get(key)} != {upstream[key]}"
    listed = [k for k in SHARE_GROUP_APIS if k in upstream]
    assert listed, "the broker lists no share-group API: the check below would be empty"
    assert [k for k in SHARE_GROUP_APIS if k in seen] == [], seen
    # The per-broker port offers the same as the bootstrap.
    assert versions(proxy.broker_port()) == seen
