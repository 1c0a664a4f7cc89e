//! Client Produce requests: partitions the proxy answers itself, cut out of
//! the request, and their answers merged back into the broker's.
//!
//! Two reasons to answer a partition locally, both decided per partition by
//! the caller's [`Topics`]:
//! - **Dead-letter topics.** The once-only ledger is rebuilt from the
//!   `x-original-*` headers of the records in the DLTs, so whoever can write
//!   to a DLT can forge them and make the proxy hide chosen offsets (threat
//!   model, "DLT contents"). Unless `dead_letter.allow_client_produce` is set,
//!   the partitions of DLT topics get TOPIC_AUTHORIZATION_FAILED (29).
//! - **The door** (`on_produce: reject`): a partition whose batch holds a
//!   record its policy judges invalid gets INVALID_RECORD (87) with KIP-467
//!   `record_errors` and an `error_message` (both Produce v8+ only).
//!
//! Kafka writes a partition's batch all or nothing, so a partition is
//! forwarded or refused whole. The other partitions are forwarded (the
//! request is re-encoded without the refused ones) and the answer is merged
//! in request order. A request with nothing refused is forwarded as its
//! original bytes, never re-encoded; with acks=0 refused partitions are
//! simply dropped (the producer cannot be told).
//!
//! This module decodes client Produce requests (the vendored crate never
//! reserves more memory than the frame holds); it must never change the
//! records it forwards.

use std::collections::{HashMap, VecDeque};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use uuid::Uuid;

use crate::transport::frame;

pub use crate::client::errors::{INVALID_RECORD, TOPIC_AUTHORIZATION_FAILED};

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

/// The proxy's answer for one partition it does not forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: i16,
    /// `error_message` (Produce v8+).
    pub message: String,
    /// KIP-467 `record_errors`: (batch index, message), Produce v8+.
    pub record_errors: Vec<(i32, String)>,
}

impl Refusal {
    /// A write to a dead-letter topic.
    pub fn dead_letter(topic: &str) -> Self {
        Refusal {
            code: TOPIC_AUTHORIZATION_FAILED,
            message: format!("antidote: clients may not write to dead-letter topics ({topic})"),
            record_errors: Vec::new(),
        }
    }
}

/// What the proxy knows about topics and policies, as the check needs it.
pub trait Topics {
    /// Whether client writes to `name` are refused as a dead-letter topic.
    fn is_dead_letter(&self, name: &str) -> bool;
    /// The name of a topic id (Produce v13+ names topics by id).
    fn name_of(&self, id: &Uuid) -> Option<String>;
    /// The door's answer for one partition's records, `None` to forward
    /// them. `topic` is `None` for a topic id the proxy does not know.
    fn at_door(&self, topic: Option<&str>, partition: i32, records: &Bytes) -> Option<Refusal>;
}

/// One partition of the request, in request order, and the proxy's own
/// answer for it when it is not forwarded.
#[derive(Debug, Clone)]
struct Slot {
    name: TopicName,
    id: Uuid,
    index: i32,
    refusal: Option<Refusal>,
}

/// Every partition of one request in order, the refused ones with their
/// answers, to be merged into the broker's answer.
#[derive(Debug, Clone, Default)]
pub struct Refused {
    slots: Vec<Slot>,
}

impl Refused {
    fn any(&self) -> bool {
        self.slots.iter().any(|s| s.refusal.is_some())
    }
}

/// What to do with one Produce request.
#[derive(Debug)]
pub enum Decision {
    /// Nothing refused: forward the original bytes.
    Untouched,
    /// Forward `request` (the frame without the refused partitions); `acks`
    /// says whether an answer will come, into which `refused` is merged.
    Split {
        request: Bytes,
        refused: Refused,
        acks: i16,
    },
    /// Every partition was refused: nothing is forwarded; answer with `body`
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
    let refused = cut_refused(&mut req, version, topics);
    if !refused.any() {
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

/// Take the refused partitions out of `req` (and topics left with none),
/// recording every partition in request order.
fn cut_refused(req: &mut ProduceRequest, version: i16, topics: &dyn Topics) -> Refused {
    let mut refused = Refused::default();
    let empty = Bytes::new();
    for t in &mut req.topic_data {
        let name = if version >= 13 {
            topics.name_of(&t.topic_id)
        } else {
            Some(t.name.0.to_string())
        };
        let dlt = name.as_deref().is_some_and(|n| topics.is_dead_letter(n));
        let mut kept = Vec::with_capacity(t.partition_data.len());
        for p in std::mem::take(&mut t.partition_data) {
            let refusal = match &name {
                Some(n) if dlt => Some(Refusal::dead_letter(n)),
                _ => topics.at_door(
                    name.as_deref(),
                    p.index,
                    p.records.as_ref().unwrap_or(&empty),
                ),
            };
            refused.slots.push(Slot {
                name: t.name.clone(),
                id: t.topic_id,
                index: p.index,
                refusal: refusal.clone(),
            });
            if refusal.is_none() {
                kept.push(p);
            }
        }
        t.partition_data = kept;
    }
    req.topic_data.retain(|t| !t.partition_data.is_empty());
    refused
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

/// Add the refused partitions to the broker's Produce response body, in
/// the order the request named them.
pub fn merge(body: Bytes, version: i16, refused: &Refused) -> Result<BytesMut, ProduceError> {
    let resp = ProduceResponse::decode(&mut body.clone(), version)
        .map_err(|e| ProduceError::Response(e.to_string()))?;
    merge_into(resp, version, refused)
}

type PartitionKey = (TopicName, Uuid, i32);

fn merge_into(
    mut resp: ProduceResponse,
    version: i16,
    refused: &Refused,
) -> Result<BytesMut, ProduceError> {
    // The broker's answers by (topic, partition), in the order it gave them.
    let mut answered: HashMap<PartitionKey, VecDeque<PartitionProduceResponse>> = HashMap::new();
    let mut broker_order: Vec<PartitionKey> = Vec::new();
    for t in std::mem::take(&mut resp.responses) {
        for p in t.partition_responses {
            let key = (t.name.clone(), t.topic_id, p.index);
            broker_order.push(key.clone());
            answered.entry(key).or_default().push_back(p);
        }
    }
    let mut out: Vec<TopicProduceResponse> = Vec::new();
    for s in &refused.slots {
        let key = (s.name.clone(), s.id, s.index);
        let p = match &s.refusal {
            Some(r) => refusal_response(s.index, r, version),
            None => match answered.get_mut(&key).and_then(VecDeque::pop_front) {
                Some(p) => p,
                None => continue, // the broker did not answer it: neither do we
            },
        };
        push_partition(&mut out, &s.name, s.id, p);
    }
    // Anything the broker answered that the request did not name, as it came.
    for key in broker_order {
        if let Some(p) = answered.get_mut(&key).and_then(VecDeque::pop_front) {
            push_partition(&mut out, &key.0, key.1, p);
        }
    }
    resp.responses = out;
    let mut buf = BytesMut::new();
    resp.encode(&mut buf, version)
        .map_err(|e| ProduceError::Response(e.to_string()))?;
    Ok(buf)
}

/// Append `p` to the last topic of `out` if it is `name`/`id`, else to a
/// new topic entry.
fn push_partition(
    out: &mut Vec<TopicProduceResponse>,
    name: &TopicName,
    id: Uuid,
    p: PartitionProduceResponse,
) {
    match out.last_mut() {
        Some(t) if t.name == *name && t.topic_id == id => t.partition_responses.push(p),
        _ => out.push(
            TopicProduceResponse::default()
                .with_name(name.clone())
                .with_topic_id(id)
                .with_partition_responses(vec![p]),
        ),
    }
}

/// The answer for one refused partition; the texts only where the version
/// has fields for them (v8+).
fn refusal_response(index: i32, r: &Refusal, version: i16) -> PartitionProduceResponse {
    let p = PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(r.code)
        .with_base_offset(-1);
    if version < 8 {
        return p;
    }
    let errors = r
        .record_errors
        .iter()
        .map(|(i, m)| {
            BatchIndexAndErrorMessage::default()
                .with_batch_index(*i)
                .with_batch_index_error_message(Some(StrBytes::from_string(m.clone())))
        })
        .collect();
    p.with_error_message(Some(StrBytes::from_string(r.message.clone())))
        .with_record_errors(errors)
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
        /// Topics named `door.*` refuse records whose bytes say `bad`.
        fn at_door(&self, topic: Option<&str>, _: i32, records: &Bytes) -> Option<Refusal> {
            let door = topic.is_some_and(|t| t.starts_with("door."));
            (door && records.as_ref() == b"bad").then(|| Refusal {
                code: INVALID_RECORD,
                message: "antidote: policy p rejected the batch".into(),
                record_errors: vec![(2, "rule r: reason".into())],
            })
        }
    }

    fn topic(name: &str, id: u128, partitions: &[i32]) -> TopicProduceData {
        let records: Vec<(i32, &'static [u8])> =
            partitions.iter().map(|&i| (i, &b"batch"[..])).collect();
        topic_with(name, id, &records)
    }

    fn topic_with(name: &str, id: u128, partitions: &[(i32, &'static [u8])]) -> TopicProduceData {
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(name.into())))
            .with_topic_id(Uuid::from_u128(id))
            .with_partition_data(
                partitions
                    .iter()
                    .map(|&(i, r)| {
                        PartitionProduceData::default()
                            .with_index(i)
                            .with_records(Some(Bytes::from_static(r)))
                    })
                    .collect(),
            )
    }

    /// The broker's answer: success for every partition of `topics`.
    fn broker_ok(version: i16, topics: &[(&'static str, &[i32])]) -> Bytes {
        let mut b = BytesMut::new();
        ProduceResponse::default()
            .with_responses(
                topics
                    .iter()
                    .map(|(n, ps)| {
                        TopicProduceResponse::default()
                            .with_name(TopicName(StrBytes::from_static_str(n)))
                            .with_partition_responses(
                                ps.iter()
                                    .map(|&i| PartitionProduceResponse::default().with_index(i))
                                    .collect(),
                            )
                    })
                    .collect(),
            )
            .encode(&mut b, version)
            .unwrap();
        b.freeze()
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
    fn a_refused_partition_is_cut_out_and_answered_in_request_order() {
        let f = frame(
            9,
            -1,
            vec![
                topic_with("door.a", 0, &[(0, b"good"), (1, b"bad"), (2, b"good")]),
                topic("plain", 0, &[0]),
            ],
        );
        let Decision::Split {
            request, refused, ..
        } = check(&f, 9, &Names).unwrap()
        else {
            panic!("expected a split");
        };
        let start = frame::request_body_offset(&request, true).unwrap();
        let req = ProduceRequest::decode(&mut request.slice(start..), 9).unwrap();
        let sent: Vec<(String, i32)> = req
            .topic_data
            .iter()
            .flat_map(|t| {
                t.partition_data
                    .iter()
                    .map(move |p| (t.name.0.to_string(), p.index))
            })
            .collect();
        assert_eq!(
            sent,
            vec![
                ("door.a".into(), 0),
                ("door.a".into(), 2),
                ("plain".into(), 0)
            ]
        );
        let broker = broker_ok(9, &[("door.a", &[0, 2]), ("plain", &[0])]);
        let merged = merge(broker, 9, &refused).unwrap();
        assert_eq!(
            refused_codes(merged.clone(), 9),
            vec![
                ("door.a".into(), 0, 0),
                ("door.a".into(), 1, INVALID_RECORD),
                ("door.a".into(), 2, 0),
                ("plain".into(), 0, 0),
            ]
        );
        let r = ProduceResponse::decode(&mut merged.freeze(), 9).unwrap();
        assert_eq!(r.responses.len(), 2, "one entry per topic");
        let p = &r.responses[0].partition_responses[1];
        assert_eq!(p.base_offset, -1);
        assert_eq!(
            p.error_message.as_ref().map(|m| m.as_str()),
            Some("antidote: policy p rejected the batch")
        );
        assert_eq!(p.record_errors.len(), 1);
        assert_eq!(p.record_errors[0].batch_index, 2);
        assert_eq!(
            p.record_errors[0]
                .batch_index_error_message
                .as_ref()
                .map(|m| m.as_str()),
            Some("rule r: reason")
        );
    }

    #[test]
    fn before_v8_a_refusal_is_the_error_code_alone() {
        let f = frame(7, 1, vec![topic_with("door.a", 0, &[(0, b"bad")])]);
        let Decision::AllRefused { body: Some(body) } = check(&f, 7, &Names).unwrap() else {
            panic!("expected a local answer");
        };
        let r = ProduceResponse::decode(&mut body.freeze(), 7).unwrap();
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(p.error_code, INVALID_RECORD);
        assert!(p.error_message.is_none() && p.record_errors.is_empty());
    }

    #[test]
    fn with_acks_zero_a_refused_partition_is_dropped_and_no_answer_expected() {
        let f = frame(
            9,
            0,
            vec![
                topic_with("door.a", 0, &[(0, b"bad")]),
                topic("plain", 0, &[0]),
            ],
        );
        let Decision::Split { request, acks, .. } = check(&f, 9, &Names).unwrap() else {
            panic!("expected a split");
        };
        assert_eq!(acks, 0);
        let start = frame::request_body_offset(&request, true).unwrap();
        let req = ProduceRequest::decode(&mut request.slice(start..), 9).unwrap();
        assert_eq!(req.topic_data.len(), 1);
        assert_eq!(req.topic_data[0].name.0.as_str(), "plain");
        let f = frame(9, 0, vec![topic_with("door.a", 0, &[(0, b"bad")])]);
        assert!(matches!(
            check(&f, 9, &Names).unwrap(),
            Decision::AllRefused { body: None }
        ));
    }

    #[test]
    fn valid_batches_at_the_door_leave_the_request_untouched() {
        let f = frame(
            9,
            -1,
            vec![topic_with("door.a", 0, &[(0, b"good"), (1, b"good")])],
        );
        assert!(matches!(check(&f, 9, &Names).unwrap(), Decision::Untouched));
    }

    #[test]
    fn old_and_malformed_requests_are_errors() {
        assert!(check(&frame(9, 1, vec![]), 2, &Names).is_err());
        let f = frame(9, 1, vec![topic("a.dlt", 0, &[0])]);
        assert!(check(&f.slice(..f.len() - 3), 9, &Names).is_err());
    }
}
