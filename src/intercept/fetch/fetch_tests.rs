//! `FetchFilter::filter` end to end: a Fetch response in, a response out,
//! with a dead-letter writer against the in-process mock broker (a DLT that
//! acknowledges, and one that refuses every write).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchResponse, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use uuid::Uuid;

use super::*;
use crate::client;
use crate::client::mock_broker::MockBroker;
use crate::config::{DeadLetterConfig, DltCompression};
use crate::dlt::Origin;
use crate::kafka::batch::{segments, Batch, Segment};
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};

/// A proxy that knows topic `t` by the ids `.0` (none: Fetch v12 names
/// topics, so it is never asked).
pub(super) struct Topics(pub &'static [Uuid]);

impl FetchContext for Topics {
    type Learned = ();
    fn rewrite_endpoints(&self, _: &mut FetchResponse) -> (bool, ()) {
        (false, ())
    }
    async fn learn(&self, _: ()) {}
    async fn resolve_topic_ids(&self, _: &[Uuid]) {}
    fn topic_name(&self, id: &Uuid) -> Option<String> {
        self.0.contains(id).then(|| "t".to_string())
    }
}

const BY_NAME: Topics = Topics(&[]);

/// One batch of `values` at `base`.
pub(super) fn batch(values: &[&str], base: i64) -> Bytes {
    let records: Vec<NewRecord> = values
        .iter()
        .map(|v| NewRecord {
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: vec![],
        })
        .collect();
    let batch = build_batch(&records, &BuildOptions::default()).expect("batch");
    let mut batch = batch.to_vec();
    batch[..8].copy_from_slice(&base.to_be_bytes()); // baseOffset: not under the CRC
    Bytes::from(batch)
}

const VERSION: i16 = 12;
pub(super) const POISON: &str = "not json";

/// A filter for topic `t` (JSON values), its DLT `t.dlt` on `mock`.
pub(super) async fn filter_on(mock: &MockBroker, timeout: Duration) -> FetchFilter {
    filter_with(mock, timeout, "").await
}

/// The same with `extra` lines added to the policy (indented by four).
pub(super) async fn filter_with(mock: &MockBroker, timeout: Duration, extra: &str) -> FetchFilter {
    mock.add_topic("t", 1);
    let text =
        format!("policies:\n  - name: p\n    topics: [t]\n    value: {{ format: json }}\n{extra}");
    let text = text.as_str();
    let policies = Arc::new(PolicySet::parse(text, Path::new("p.yaml")).expect("policy"));
    let ep = client::Endpoint {
        tls: None,
        sasl: None,
        timeout: Duration::from_secs(2),
        max_frame: 1 << 20,
    };
    let cfg = DeadLetterConfig {
        timeout,
        compression: DltCompression::None,
        ..Default::default()
    };
    let dl = DeadLetter::start(
        &cfg,
        std::slice::from_ref(&mock.addr),
        ep.clone(),
        ep,
        policies.clone(),
    );
    FetchFilter::new(
        crate::engine::Engine::new(policies, 1 << 26, None),
        dl,
        Default::default(),
        timeout,
    )
}

/// A Fetch v12 response body: topic `t`, partition 0, one batch at offset 0.
fn response(values: &[&str]) -> Bytes {
    let batch = batch(values, 0);
    let resp = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(TopicName(StrBytes::from_static_str("t")))
        .with_partitions(vec![PartitionData::default()
            .with_partition_index(0)
            .with_high_watermark(values.len() as i64)
            .with_records(Some(batch))])]);
    let mut out = bytes::BytesMut::new();
    resp.encode(&mut out, VERSION).expect("encode");
    out.freeze()
}

/// (offset, value) of every record a filtered response delivers.
fn delivered(body: Vec<Bytes>) -> Vec<(i64, String)> {
    let mut whole = bytes::BytesMut::new();
    for chunk in &body {
        whole.extend_from_slice(chunk);
    }
    let resp = FetchResponse::decode(&mut whole.freeze(), VERSION).expect("decode");
    let records = resp.responses[0].partitions[0]
        .records
        .clone()
        .unwrap_or_default();
    let mut out = Vec::new();
    for seg in segments(&records) {
        let Segment::Batch(b) = seg else {
            panic!("not a whole batch")
        };
        let d = b.decode().expect("decode batch");
        for r in d.records() {
            let v = String::from_utf8_lossy(r.value.unwrap_or_default()).into_owned();
            out.push((r.offset, v));
        }
    }
    out
}

/// Origin offsets of the records in `t.dlt`.
pub(super) fn in_dlt(mock: &MockBroker) -> Vec<i64> {
    if !mock.state().topics.contains_key("t.dlt") {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (_, b) in mock.records("t.dlt", 0) {
        let d = Batch::new(b).expect("batch").decode().expect("decode");
        for r in d.records() {
            let ctx = crate::dlt_context::open(&r, "t.dlt", 0, crate::dlt::trust::keys())
                .expect("antidote's frame");
            if crate::dlt_marker::is_marker(&ctx) {
                continue; // the writer's lease marker
            }
            out.push(Origin::of(&ctx).expect("origin headers").offset);
        }
    }
    out
}

#[tokio::test]
async fn a_poison_record_is_removed_and_in_the_dlt_before_the_response_is_released() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let body = response(&[r#"{"a":0}"#, POISON, r#"{"a":2}"#]);
    let out = f
        .filter(&BY_NAME, &mut Holds::default(), body, VERSION, 0)
        .await
        .expect("filter")
        .expect("the response changes");
    // Looked at the moment the response is released: the write is acknowledged.
    assert_eq!(in_dlt(&mock), [1], "the poison is in its DLT already");
    assert_eq!(
        delivered(out),
        [(0, r#"{"a":0}"#.to_string()), (2, r#"{"a":2}"#.to_string())]
    );
}

#[tokio::test]
async fn a_dlt_that_refuses_writes_holds_the_partition_at_the_poison() {
    let mock = MockBroker::start().await;
    mock.state().fail.insert(("t.dlt".into(), 0), 19); // NOT_ENOUGH_REPLICAS
    let f = filter_on(&mock, Duration::from_millis(800)).await;
    let body = response(&[r#"{"a":0}"#, r#"{"a":1}"#, POISON, r#"{"a":3}"#]);
    let mut holds = Holds::default();
    let out = f
        .filter(&BY_NAME, &mut holds, body.clone(), VERSION, 0)
        .await
        .expect("filter")
        .expect("the response changes");
    // Records before the poison are delivered, nothing from it on.
    assert_eq!(
        delivered(out),
        [(0, r#"{"a":0}"#.to_string()), (1, r#"{"a":1}"#.to_string())]
    );
    assert!(in_dlt(&mock).is_empty());
    // Fetched again while still refused: held at the same offset, the
    // client (already past offset 1) gets no records rather than old ones.
    let out = f
        .filter(&BY_NAME, &mut holds, body.clone(), VERSION, 0)
        .await
        .expect("filter")
        .expect("the response changes");
    assert!(delivered(out).is_empty());
    // The DLT recovers: the next fetch diverts the poison, delivers the rest.
    mock.state().fail.clear();
    let out = f
        .filter(&BY_NAME, &mut holds, body, VERSION, 0)
        .await
        .expect("filter")
        .expect("the response changes");
    assert_eq!(in_dlt(&mock), [2]);
    let offsets: Vec<i64> = delivered(out).into_iter().map(|r| r.0).collect();
    assert_eq!(offsets, [0, 1, 3]);
}

#[tokio::test]
async fn a_clean_response_is_forwarded_unchanged() {
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let body = response(&[r#"{"a":0}"#, r#"{"a":1}"#]);
    let out = f
        .filter(&BY_NAME, &mut Holds::default(), body, VERSION, 0)
        .await
        .expect("filter");
    assert!(out.is_none(), "forwarded as its original bytes");
    assert!(in_dlt(&mock).is_empty());
}

#[tokio::test]
async fn records_of_a_still_unknown_topic_id_are_withheld() {
    const KNOWN: Uuid = Uuid::from_u128(1);
    const UNKNOWN: Uuid = Uuid::from_u128(2);
    let mock = MockBroker::start().await;
    let f = filter_on(&mock, Duration::from_secs(3)).await;
    let batch = batch(&[r#"{"a":0}"#], 0);
    let topic = |id: Uuid, parts: usize| {
        FetchableTopicResponse::default()
            .with_topic_id(id)
            .with_partitions(
                (0..parts)
                    .map(|i| {
                        PartitionData::default()
                            .with_partition_index(i as i32)
                            .with_records(Some(batch.clone()))
                    })
                    .collect(),
            )
    };
    const V13: i16 = 13;
    let body = |resp: FetchResponse| {
        let mut out = bytes::BytesMut::new();
        resp.encode(&mut out, V13).expect("encode");
        out.freeze()
    };
    let resp = FetchResponse::default().with_responses(vec![topic(KNOWN, 1), topic(UNKNOWN, 2)]);
    let out = f
        .filter(&Topics(&[KNOWN]), &mut Holds::default(), body(resp), V13, 0)
        .await
        .expect("filter")
        .expect("the response changes");
    let mut whole = bytes::BytesMut::new();
    out.iter().for_each(|c| whole.extend_from_slice(c));
    let got = FetchResponse::decode(&mut whole.freeze(), V13).expect("decode");
    let records = |t: usize, p: usize| got.responses[t].partitions[p].records.clone();
    assert_eq!(
        records(0, 0),
        Some(batch.clone()),
        "the known topic is judged"
    );
    assert_eq!(records(1, 0), Some(Bytes::new()));
    assert_eq!(records(1, 1), Some(Bytes::new()));
    // Once the id is known nothing more is withheld.
    let resp = FetchResponse::default().with_responses(vec![topic(UNKNOWN, 1)]);
    let out = f
        .filter(
            &Topics(&[KNOWN, UNKNOWN]),
            &mut Holds::default(),
            body(resp),
            V13,
            0,
        )
        .await
        .expect("filter");
    assert!(out.is_none(), "forwarded as it came");
}
