//! ApiVersions negotiation: the client is offered the intersection of what
//! the broker supports and what the proxy can relay safely.
//!
//! Rules (docs/design/protocol-notes.md §5, docs/protocol-versions.md): API
//! keys the proxy does not know are dropped (it could not find their header
//! versions); APIs whose responses carry broker addresses the proxy does not
//! rewrite are dropped or capped (DescribeQuorum v2+); the share groups' API
//! (KIP-932) is offered unless `share_groups.enabled: false`, but never the
//! share coordinator's inter-broker state APIs (`SHARE_STATE_APIS`); Produce
//! keeps the broker's minimum (raising it made older librdkafka stop
//! compressing, KAFKA-18659); SASL keys are kept. The response header is
//! always v0, and a client asking for a newer ApiVersions than the broker
//! knows gets the broker's UNSUPPORTED_VERSION answer in v0 form (KIP-511),
//! which is decoded at v0 here.
//!
//! A request outside these ranges is refused, never relayed blind (the
//! broker would answer with addresses the proxy does not rewrite):
//! `refusal` builds the UNSUPPORTED_VERSION answer when the response has a
//! top-level error code the crate can encode; otherwise the relay closes
//! the connection, as a Kafka broker does.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    AlterShareGroupOffsetsResponse, ApiKey, ApiVersionsResponse, DeleteShareGroupOffsetsResponse,
    DescribeQuorumResponse, FetchResponse, ShareAcknowledgeResponse, ShareFetchResponse,
    ShareGroupHeartbeatResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::protocol::{Decodable, Encodable};

/// The share groups' client APIs (KIP-932): offered unless
/// `share_groups.enabled: false` (then a share consumer fails at its first
/// poll, in the client, before it joins a group).
pub const SHARE_GROUP_APIS: [ApiKey; 7] = [
    ApiKey::ShareGroupHeartbeat,       // 76
    ApiKey::ShareGroupDescribe,        // 77
    ApiKey::ShareFetch,                // 78
    ApiKey::ShareAcknowledge,          // 79
    ApiKey::DescribeShareGroupOffsets, // 90
    ApiKey::AlterShareGroupOffsets,    // 91
    ApiKey::DeleteShareGroupOffsets,   // 92
];

/// The share coordinator's inter-broker state APIs (83-87), which a broker
/// lists on its client listener too: brokers send them to each other,
/// clients never, so they are not offered.
pub const SHARE_STATE_APIS: [ApiKey; 5] = [
    ApiKey::InitializeShareGroupState,  // 83
    ApiKey::ReadShareGroupState,        // 84
    ApiKey::WriteShareGroupState,       // 85
    ApiKey::DeleteShareGroupState,      // 86
    ApiKey::ReadShareGroupStateSummary, // 87
];

/// The message of the proxy's refusal of a share-group request while
/// `share_groups.enabled` is false.
pub const SHARE_GROUPS_REFUSED: &str =
    "share groups (KIP-932) are turned off in antidote (share_groups.enabled: false)";

/// What the proxy offers besides the broker's own limits: from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// `limits.fetch_max_version`.
    pub fetch_max: Option<i16>,
    /// `share_groups.enabled`.
    pub share_groups: bool,
}

impl Default for Offer {
    fn default() -> Self {
        Offer {
            fetch_max: None,
            share_groups: true,
        }
    }
}

impl Offer {
    pub fn of(config: &crate::config::Config) -> Self {
        Offer {
            fetch_max: config.limits.fetch_max_version,
            share_groups: config.share_groups.enabled,
        }
    }
}

/// The versions of `key` the proxy relays, or `None` if it must not be
/// offered.
pub fn proxy_range(key: ApiKey, offer: Offer) -> Option<(i16, i16)> {
    let r = key.valid_versions();
    match key {
        ApiKey::Fetch => Some((r.min, offer.fetch_max.map_or(r.max, |m| m.min(r.max)))),
        k if SHARE_STATE_APIS.contains(&k) => None,
        k if SHARE_GROUP_APIS.contains(&k) && !offer.share_groups => None,
        // v2 added listener endpoints that are not rewritten.
        ApiKey::DescribeQuorum => Some((r.min, r.max.min(1))),
        // Produce requests are relayed opaquely; only v10+ responses are
        // decoded, and the crate decodes those.
        ApiKey::Produce => Some((0, r.max)),
        _ => Some((r.min, r.max)),
    }
}

/// Whether a request for `key` at `version` may be relayed.
pub fn in_proxy_range(key: ApiKey, version: i16, offer: Offer) -> bool {
    proxy_range(key, offer).is_some_and(|(lo, hi)| (lo..=hi).contains(&version))
}

/// The body of an UNSUPPORTED_VERSION answer to a refused `key`/`version`,
/// for the APIs whose responses carry a top-level error code; `None` when
/// the crate cannot encode one at that version (the caller then closes the
/// connection).
pub fn refusal(key: ApiKey, version: i16) -> Option<BytesMut> {
    fn encode<M: Encodable>(m: M, version: i16) -> Option<BytesMut> {
        crate::transport::frame::encode(&m, version).ok()
    }
    let code = UNSUPPORTED_VERSION;
    let why = || Some(StrBytes::from_static_str(SHARE_GROUPS_REFUSED));
    match key {
        ApiKey::ShareGroupHeartbeat => encode(
            ShareGroupHeartbeatResponse::default()
                .with_error_code(code)
                .with_error_message(why()),
            version,
        ),
        ApiKey::ShareFetch => encode(
            ShareFetchResponse::default()
                .with_error_code(code)
                .with_error_message(why()),
            version,
        ),
        ApiKey::ShareAcknowledge => encode(
            ShareAcknowledgeResponse::default()
                .with_error_code(code)
                .with_error_message(why()),
            version,
        ),
        ApiKey::AlterShareGroupOffsets => encode(
            AlterShareGroupOffsetsResponse::default()
                .with_error_code(code)
                .with_error_message(why()),
            version,
        ),
        ApiKey::DeleteShareGroupOffsets => encode(
            DeleteShareGroupOffsetsResponse::default()
                .with_error_code(code)
                .with_error_message(why()),
            version,
        ),
        ApiKey::DescribeQuorum => encode(
            DescribeQuorumResponse::default().with_error_code(code),
            version,
        ),
        // v7+ (a Fetch above `limits.fetch_max_version`).
        ApiKey::Fetch => encode(FetchResponse::default().with_error_code(code), version),
        _ => None,
    }
}

/// Intersect one broker range with the proxy's; `None` if they do not meet.
fn intersect(v: &ApiVersion, offer: Offer) -> Option<ApiVersion> {
    let key = ApiKey::try_from(v.api_key).ok()?;
    let (min, max) = proxy_range(key, offer)?;
    let lo = if key == ApiKey::Produce {
        v.min_version
    } else {
        v.min_version.max(min)
    };
    let hi = v.max_version.min(max);
    (lo <= hi).then(|| v.clone().with_min_version(lo).with_max_version(hi))
}

use crate::client::errors::UNSUPPORTED_VERSION;

/// Rewrite an ApiVersions response body (after the v0 response header).
/// Returns the new body.
pub fn rewrite(body: Bytes, version: i16, offer: Offer) -> anyhow::Result<BytesMut> {
    // A broker that does not support `version` answers UNSUPPORTED_VERSION
    // in the v0 body format (KIP-511); error_code leads every version.
    let unsupported = body.get(..2) == Some(&UNSUPPORTED_VERSION.to_be_bytes()[..]);
    let v = if unsupported { 0 } else { version };
    let mut m = ApiVersionsResponse::decode(&mut body.clone(), v)?;
    m.api_keys = m
        .api_keys
        .iter()
        .filter_map(|k| intersect(k, offer))
        .collect();
    crate::transport::frame::encode(&m, v)
}

/// The broker's highest version of `key` in its ApiVersions answer `frame`
/// (the whole frame; the request was `version`), if it offers `key`.
pub fn broker_max(frame: &Bytes, version: i16, key: ApiKey) -> Option<i16> {
    let body = frame.slice(crate::transport::frame::RESPONSE_ID_END..);
    let unsupported = body.get(..2) == Some(&UNSUPPORTED_VERSION.to_be_bytes()[..]);
    let v = if unsupported { 0 } else { version };
    let m = ApiVersionsResponse::decode(&mut body.clone(), v).ok()?;
    (m.api_keys.iter())
        .find(|k| k.api_key == key as i16)
        .map(|k| k.max_version)
}

/// The highest ApiVersions version the proxy can decode.
pub fn max_api_versions_version() -> i16 {
    ApiKey::ApiVersions.valid_versions().max
}

/// An UNSUPPORTED_VERSION answer (v0 body) for an ApiVersions request newer
/// than the proxy decodes; the client retries with a version from the list.
pub fn unsupported_version_body() -> anyhow::Result<BytesMut> {
    let r = ApiKey::ApiVersions.valid_versions();
    let m = ApiVersionsResponse::default()
        .with_error_code(UNSUPPORTED_VERSION)
        .with_api_keys(vec![ApiVersion::default()
            .with_api_key(ApiKey::ApiVersions as i16)
            .with_min_version(r.min)
            .with_max_version(r.max)]);
    crate::transport::frame::encode(&m, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(keys: &[(i16, i16, i16)], v: i16) -> Bytes {
        let m = ApiVersionsResponse::default().with_api_keys(
            keys.iter()
                .map(|&(k, lo, hi)| {
                    ApiVersion::default()
                        .with_api_key(k)
                        .with_min_version(lo)
                        .with_max_version(hi)
                })
                .collect(),
        );
        let mut b = BytesMut::new();
        m.encode(&mut b, v).unwrap();
        b.freeze()
    }

    fn keys(body: BytesMut, v: i16) -> Vec<(i16, i16, i16)> {
        let m = ApiVersionsResponse::decode(&mut body.freeze(), v).unwrap();
        m.api_keys
            .iter()
            .map(|k| (k.api_key, k.min_version, k.max_version))
            .collect()
    }

    const OFF: Offer = Offer {
        fetch_max: None,
        share_groups: false,
    };

    fn capped(fetch_max: i16) -> Offer {
        Offer {
            fetch_max: Some(fetch_max),
            ..Offer::default()
        }
    }

    #[test]
    fn intersection_keeps_produce_min_and_sasl_and_drops_unknown_keys() {
        let body = response(
            &[
                (0, 0, 99),
                (1, 0, 99),
                (17, 0, 1),
                (36, 0, 2),
                (78, 0, 9),
                (84, 0, 1),
                (999, 0, 3),
            ],
            3,
        );
        let got = keys(rewrite(body, 3, Offer::default()).unwrap(), 3);
        let fetch_max = ApiKey::Fetch.valid_versions().max;
        let produce_max = ApiKey::Produce.valid_versions().max;
        let share_fetch = ApiKey::ShareFetch.valid_versions();
        assert_eq!(
            got,
            vec![
                (0, 0, produce_max),
                (1, 4, fetch_max),
                (17, 0, 1),
                (36, 0, 2),
                (78, share_fetch.min, share_fetch.max)
            ]
        );
    }

    #[test]
    fn fetch_is_offered_up_to_the_configured_version_and_refused_above_it() {
        let body = response(&[(1, 0, 99), (3, 0, 12)], 3);
        let got = keys(rewrite(body.clone(), 3, capped(15)).unwrap(), 3);
        assert_eq!(got, vec![(1, 4, 15), (3, 0, 12)]);
        // A cap above what the broker offers leaves the broker's maximum.
        let broker = response(&[(1, 0, 13)], 3);
        assert_eq!(
            keys(rewrite(broker, 3, capped(15)).unwrap(), 3),
            vec![(1, 4, 13)]
        );
        assert!(in_proxy_range(ApiKey::Fetch, 15, capped(15)));
        assert!(!in_proxy_range(ApiKey::Fetch, 16, capped(15)));
        assert!(in_proxy_range(ApiKey::Fetch, 16, Offer::default()));
        let body = refusal(ApiKey::Fetch, 16).unwrap();
        let m = FetchResponse::decode(&mut body.freeze(), 16).unwrap();
        assert_eq!(m.error_code, UNSUPPORTED_VERSION);
    }

    #[test]
    fn requests_outside_the_proxy_range_are_refused_with_a_top_level_error() {
        let on = Offer::default();
        assert!(in_proxy_range(ApiKey::ShareFetch, 1, on));
        assert!(!in_proxy_range(ApiKey::ShareFetch, 1, OFF));
        assert!(!in_proxy_range(ApiKey::DescribeQuorum, 2, on));
        assert!(in_proxy_range(ApiKey::DescribeQuorum, 1, on));
        assert!(in_proxy_range(ApiKey::Produce, 0, on));
        assert!(!in_proxy_range(ApiKey::Fetch, 3, on));
        let body = refusal(ApiKey::DescribeQuorum, 2).unwrap();
        let m = DescribeQuorumResponse::decode(&mut body.freeze(), 2).unwrap();
        assert_eq!(m.error_code, UNSUPPORTED_VERSION);
        let body = refusal(ApiKey::ShareFetch, 1).unwrap();
        let m = ShareFetchResponse::decode(&mut body.freeze(), 1).unwrap();
        assert_eq!(m.error_code, UNSUPPORTED_VERSION);
        // No top-level error code the crate can encode: the caller closes.
        assert!(refusal(ApiKey::Fetch, 3).is_none());
        assert!(refusal(ApiKey::ShareFetch, 0).is_none());
    }

    #[test]
    fn share_group_apis_are_offered_unless_turned_off_and_the_state_apis_never() {
        // The numbers as Kafka 4.4's ApiKeys has them.
        let nums: Vec<i16> = SHARE_GROUP_APIS.iter().map(|&k| k as i16).collect();
        assert_eq!(nums, [76, 77, 78, 79, 90, 91, 92]);
        let state: Vec<i16> = SHARE_STATE_APIS.iter().map(|&k| k as i16).collect();
        assert_eq!(state, [83, 84, 85, 86, 87]);
        // Every share API the crate knows is in one list or the other.
        for n in 0..=1000i16 {
            if let Ok(k) = ApiKey::try_from(n) {
                if format!("{k:?}").contains("Share") {
                    assert!(
                        SHARE_GROUP_APIS.contains(&k) || SHARE_STATE_APIS.contains(&k),
                        "{k:?} ({n}) is in neither list"
                    );
                }
            }
        }
        // What Apache Kafka 4.4.0 lists above key 60 on its client listener.
        let broker: Vec<(i16, i16, i16)> = vec![
            (60, 0, 2),
            (61, 0, 0),
            (68, 0, 1),
            (69, 0, 1),
            (76, 1, 1),
            (77, 1, 1),
            (78, 1, 2),
            (79, 1, 2),
            (83, 0, 0),
            (84, 0, 0),
            (85, 0, 1),
            (86, 0, 0),
            (87, 0, 1),
            (88, 0, 1),
            (90, 0, 1),
            (91, 0, 0),
            (92, 0, 0),
        ];
        let on = keys(
            rewrite(response(&broker, 3), 3, Offer::default()).unwrap(),
            3,
        );
        let want: Vec<_> = broker
            .iter()
            .copied()
            .filter(|&(k, _, _)| !state.contains(&k))
            .collect();
        assert_eq!(on, want);
        let off = keys(rewrite(response(&broker, 3), 3, OFF).unwrap(), 3);
        let want: Vec<_> = broker
            .iter()
            .copied()
            .filter(|&(k, _, _)| !state.contains(&k) && !nums.contains(&k))
            .collect();
        assert_eq!(off, want);
        for k in SHARE_STATE_APIS {
            let r = k.valid_versions();
            for v in r.min..=r.max {
                assert!(!in_proxy_range(k, v, Offer::default()), "{k:?} v{v}");
            }
        }
    }

    #[test]
    fn share_group_requests_turned_off_get_the_refusal_with_its_reason_or_close() {
        let why = Some(StrBytes::from_static_str(SHARE_GROUPS_REFUSED));
        let b = refusal(ApiKey::ShareGroupHeartbeat, 1).unwrap();
        let m = ShareGroupHeartbeatResponse::decode(&mut b.freeze(), 1).unwrap();
        assert_eq!(
            (m.error_code, &m.error_message),
            (UNSUPPORTED_VERSION, &why)
        );
        assert_eq!(m.member_id, None);
        let b = refusal(ApiKey::ShareAcknowledge, 1).unwrap();
        let m = ShareAcknowledgeResponse::decode(&mut b.freeze(), 1).unwrap();
        assert_eq!(
            (m.error_code, &m.error_message),
            (UNSUPPORTED_VERSION, &why)
        );
        let b = refusal(ApiKey::AlterShareGroupOffsets, 0).unwrap();
        let m = AlterShareGroupOffsetsResponse::decode(&mut b.freeze(), 0).unwrap();
        assert_eq!(
            (m.error_code, &m.error_message),
            (UNSUPPORTED_VERSION, &why)
        );
        let b = refusal(ApiKey::DeleteShareGroupOffsets, 0).unwrap();
        let m = DeleteShareGroupOffsetsResponse::decode(&mut b.freeze(), 0).unwrap();
        assert_eq!(
            (m.error_code, &m.error_message),
            (UNSUPPORTED_VERSION, &why)
        );
        // Responses without a top-level error code: the connection closes.
        for (k, v) in [
            (ApiKey::ShareGroupDescribe, 1),
            (ApiKey::InitializeShareGroupState, 0),
            (ApiKey::ReadShareGroupStateSummary, 0),
            (ApiKey::DescribeShareGroupOffsets, 0),
        ] {
            assert!(refusal(k, v).is_none(), "{k:?}");
        }
    }

    #[test]
    fn the_brokers_share_acknowledge_version_is_read_from_its_answer() {
        let frame = |body: Bytes| {
            let mut f = vec![0, 0, 0, 0, 0, 0, 0, 7];
            f.extend_from_slice(&body);
            Bytes::from(f)
        };
        let k = ApiKey::ShareAcknowledge;
        let v44 = frame(response(&[(18, 0, 4), (79, 1, 2)], 3));
        assert_eq!(broker_max(&v44, 3, k), Some(2));
        let v41 = frame(response(&[(18, 0, 4), (79, 1, 1)], 3));
        assert_eq!(broker_max(&v41, 3, k), Some(1));
        let none = frame(response(&[(18, 0, 4)], 3));
        assert_eq!(broker_max(&none, 3, k), None);
        assert_eq!(
            broker_max(&frame(Bytes::from_static(&[0, 0, 0xff])), 3, k),
            None
        );
    }

    #[test]
    fn an_unsupported_version_answer_in_v0_form_is_understood() {
        let body = response(&[(18, 0, 3)], 0);
        let mut body = BytesMut::from(&body[..]);
        body[..2].copy_from_slice(&35i16.to_be_bytes());
        let body = body.freeze();
        assert_eq!(
            keys(rewrite(body, 9, Offer::default()).unwrap(), 0),
            vec![(18, 0, 3)]
        );
    }
}
