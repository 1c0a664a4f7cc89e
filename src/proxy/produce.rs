//! Client Produce requests that name a dead-letter topic are refused.
//!
//! Why: the once-only ledger is rebuilt from the `x-original-*` headers of
//! the records in the DLTs, so whoever can write to a DLT can forge those
//! headers and make the proxy hide chosen offsets of a policy topic (threat
//! model, "DLT contents"). Unless `dead_letter.allow_client_produce` is set,
//! the partitions of DLT topics in a client's Produce get
//! TOPIC_AUTHORIZATION_FAILED (29); the other topics of the same request are
//! forwarded (the request is re-encoded without the DLT topics) and the
//! refused partitions are merged into the broker's answer. A request naming
//! no DLT topic is forwarded as its original bytes, never re-encoded.
//!
//! This module decodes client Produce requests (the vendored crate never
//! reserves more memory than the frame holds); it must never change the
//! records it forwards.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use uuid::Uuid;

use crate::transport::frame;

/// Kafka's TOPIC_AUTHORIZATION_FAILED.
pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;

/// Why a Produce request could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error("Produce v{0} cannot be checked for dead-letter topics (v3+ only)")]
    TooOld(i16),
    #[error("malformed Produce request: {0}")]
    Request(String),
    #[error("malformed Produce response: {0}")]
    Response(String),
}

/// What the proxy knows about topics, as the check needs it.
pub trait Topics {
    /// Whether `name` is a dead-letter topic of the current policies.
    fn is_dead_letter(&self, name: &str) -> bool;
    /// The name of a topic id (Produce v13+ names topics by id).
    fn name_of(&self, id: &Uuid) -> Option<String>;
}

/// The partitions refused in one request, to be merged into its answer.
#[derive(Debug, Clone, Default)]
pub struct Refused {
    topics: Vec<(TopicName, Uuid, Vec<i32>)>,
}

/// What to do with one Produce request.
#[derive(Debug)]
pub enum Decision {
    /// No dead-letter topic named: forward the original bytes.
    Untouched,
    /// Forward `request` (the frame without the refused topics); `acks`
    /// says whether an answer will come, into which `refused` is merged.
    Split {
        request: Bytes,
        refused: Refused,
        acks: i16,
    },
    /// Every topic was refused: nothing is forwarded; answer with `body`
    /// (`None` when acks=0: no answer at all).
    AllRefused { body: Option<BytesMut> },
}

/// Check one Produce request frame (length prefix included).
pub fn check(frame: &Bytes, version: i16, topics: &dyn Topics) -> Result<Decision, ProduceError> {
    if version < 3 {
        return Err(ProduceError::TooOld(version));
    }
    let bad = |e: anyhow::Error| ProduceError::Request(e.to_string());
    let flexible = ApiKey::Produce.request_header_version(version) >= 2;
    let start = frame::request_body_offset(frame, flexible)
        .ok_or_else(|| ProduceError::Request("truncated header".into()))?;
    let mut req = ProduceRequest::decode(&mut frame.slice(start..), version).map_err(bad)?;
    let mut refused = Refused::default();
    req.topic_data.retain(|t| {
        let name = if version >= 13 {
            topics.name_of(&t.topic_id)
        } else {
            Some(t.name.0.to_string())
        };
        let dlt = name.as_deref().is_some_and(|n| topics.is_dead_letter(n));
        if dlt {
            let partitions = t.partition_data.iter().map(|p| p.index).collect();
            refused
                .topics
                .push((t.name.clone(), t.topic_id, partitions));
        }
        !dlt
    });
    if refused.topics.is_empty() {
        return Ok(Decision::Untouched);
    }
    if req.topic_data.is_empty() {
        let body = (req.acks != 0)
            .then(|| merge_into(ProduceResponse::default(), version, &refused))
            .transpose()?;
        return Ok(Decision::AllRefused { body });
    }
    let mut out = BytesMut::new();
    out.extend_from_slice(&frame[frame::LENGTH_PREFIX..start]);
    req.encode(&mut out, version).map_err(bad)?;
    Ok(Decision::Split {
        request: frame::with_length_prefix(&out),
        refused,
        acks: req.acks,
    })
}

/// The topic ids a Produce v13+ request names (empty for older versions or
/// a malformed request, which `check` then reports).
pub fn topic_ids(frame: &Bytes, version: i16) -> Vec<Uuid> {
    if version < 13 {
        return Vec::new();
    }
    let flexible = ApiKey::Produce.request_header_version(version) >= 2;
    let Some(start) = frame::request_body_offset(frame, flexible) else {
        return Vec::new();
    };
    match ProduceRequest::decode(&mut frame.slice(start..), version) {
        Ok(req) => req.topic_data.iter().map(|t| t.topic_id).collect(),
        Err(_) => Vec::new(),
    }
}

/// Add the refused partitions to the broker's Produce response body.
pub fn merge(body: Bytes, version: i16, refused: &Refused) -> Result<BytesMut, ProduceError> {
    let resp = ProduceResponse::decode(&mut body.clone(), version)
        .map_err(|e| ProduceError::Response(e.to_string()))?;
    merge_into(resp, version, refused)
}

fn merge_into(
    mut resp: ProduceResponse,
    version: i16,
    refused: &Refused,
) -> Result<BytesMut, ProduceError> {
    for (name, id, partitions) in &refused.topics {
        let message = format!(
            "antidote: clients may not write to dead-letter topics ({})",
            name.0
        );
        resp.responses.push(
            TopicProduceResponse::default()
                .with_name(name.clone())
                .with_topic_id(*id)
                .with_partition_responses(
                    partitions
                        .iter()
                        .map(|&index| {
                            PartitionProduceResponse::default()
                                .with_index(index)
                                .with_error_code(TOPIC_AUTHORIZATION_FAILED)
                                .with_base_offset(-1)
                                .with_error_message(Some(StrBytes::from_string(message.clone())))
                        })
                        .collect(),
                ),
        );
    }
    let mut out = BytesMut::new();
    resp.encode(&mut out, version)
        .map_err(|e| ProduceError::Response(e.to_string()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::RequestHeader;

    struct Names;
    impl Topics for Names {
        fn is_dead_letter(&self, name: &str) -> bool {
            name.ends_with(".dlt")
        }
        fn name_of(&self, id: &Uuid) -> Option<String> {
            (id.as_u128() == 7).then(|| "t.dlt".to_string())
        }
    }

    fn topic(name: &str, id: u128, partitions: &[i32]) -> TopicProduceData {
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(name.into())))
            .with_topic_id(Uuid::from_u128(id))
            .with_partition_data(
                partitions
                    .iter()
                    .map(|&i| {
                        PartitionProduceData::default()
                            .with_index(i)
                            .with_records(Some(Bytes::from_static(b"batch")))
                    })
                    .collect(),
            )
    }

    fn frame(version: i16, acks: i16, topics: Vec<TopicProduceData>) -> Bytes {
        let mut b = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(0)
            .with_request_api_version(version)
            .with_correlation_id(5)
            .encode(&mut b, ApiKey::Produce.request_header_version(version))
            .unwrap();
        ProduceRequest::default()
            .with_acks(acks)
            .with_topic_data(topics)
            .encode(&mut b, version)
            .unwrap();
        frame::with_length_prefix(&b)
    }

    fn refused_codes(body: BytesMut, version: i16) -> Vec<(String, i32, i16)> {
        let r = ProduceResponse::decode(&mut body.freeze(), version).unwrap();
        r.responses
            .iter()
            .flat_map(|t| {
                t.partition_responses
                    .iter()
                    .map(move |p| (t.name.0.to_string(), p.index, p.error_code))
            })
            .collect()
    }

    #[test]
    fn a_request_without_dead_letter_topics_is_untouched() {
        let f = frame(9, -1, vec![topic("orders", 1, &[0])]);
        assert!(matches!(check(&f, 9, &Names).unwrap(), Decision::Untouched));
    }

    #[test]
    fn dead_letter_partitions_are_cut_out_and_merged_back_refused() {
        let f = frame(
            9,
            -1,
            vec![topic("orders", 1, &[0]), topic("orders.dlt", 2, &[0, 1])],
        );
        let Decision::Split {
            request,
            refused,
            acks,
        } = check(&f, 9, &Names).unwrap()
        else {
            panic!("expected a split");
        };
        assert_eq!(acks, -1);
        let start = frame::request_body_offset(&request, true).unwrap();
        let req = ProduceRequest::decode(&mut request.slice(start..), 9).unwrap();
        assert_eq!(req.topic_data.len(), 1);
        assert_eq!(req.topic_data[0].name.0.as_str(), "orders");
        assert_eq!(&request[4..start], &f[4..start], "header kept");
        let mut broker = BytesMut::new();
        ProduceResponse::default()
            .with_responses(vec![TopicProduceResponse::default()
                .with_name(TopicName(StrBytes::from_static_str("orders")))
                .with_partition_responses(vec![PartitionProduceResponse::default()])])
            .encode(&mut broker, 9)
            .unwrap();
        let merged = merge(broker.freeze(), 9, &refused).unwrap();
        assert_eq!(
            refused_codes(merged, 9),
            vec![
                ("orders".into(), 0, 0),
                ("orders.dlt".into(), 0, 29),
                ("orders.dlt".into(), 1, 29)
            ]
        );
    }

    #[test]
    fn a_request_only_for_dead_letter_topics_is_answered_locally() {
        let f = frame(3, 1, vec![topic("x.dlt", 0, &[2])]);
        let Decision::AllRefused { body: Some(body) } = check(&f, 3, &Names).unwrap() else {
            panic!("expected a local answer");
        };
        assert_eq!(refused_codes(body, 3), vec![("x.dlt".into(), 2, 29)]);
        let f = frame(3, 0, vec![topic("x.dlt", 0, &[2])]);
        assert!(matches!(
            check(&f, 3, &Names).unwrap(),
            Decision::AllRefused { body: None }
        ));
    }

    #[test]
    fn v13_topic_ids_are_resolved_to_names() {
        let f = frame(13, -1, vec![topic("", 7, &[0])]);
        assert!(matches!(
            check(&f, 13, &Names).unwrap(),
            Decision::AllRefused { body: Some(_) }
        ));
        let f = frame(13, -1, vec![topic("", 8, &[0])]);
        assert!(matches!(
            check(&f, 13, &Names).unwrap(),
            Decision::Untouched
        ));
        assert_eq!(topic_ids(&f, 13), vec![Uuid::from_u128(8)]);
    }

    #[test]
    fn old_and_malformed_requests_are_errors() {
        assert!(check(&frame(9, 1, vec![]), 2, &Names).is_err());
        let f = frame(9, 1, vec![topic("a.dlt", 0, &[0])]);
        assert!(check(&f.slice(..f.len() - 3), 9, &Names).is_err());
    }
}
