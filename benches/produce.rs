//! The door (`on_produce: reject`): what judging a client's Produce costs
//! per record. Throughput is in records.
//!
//! - `judge`: `plan::produce::judge_produce` on one partition's batch of
//!   1,000 JSON triggers under the reference policy (`geofence.yaml`, with
//!   JSON Schema): CRC, decompression, record index, `Policy::judge` of
//!   every record.
//! - `request`: the whole door for one Produce request carrying that batch:
//!   decode the request (`intercept::produce::wire::check`), judge, and either forward
//!   it untouched (clean) or re-encode it without the refused partition and
//!   build the INVALID_RECORD answer (one poison record).
//!
//! Variants: clean / one poison record, uncompressed / lz4 / zstd.

mod common;

use std::sync::Arc;

use antidote::intercept::produce::wire::{check, Decision, Refusal, Topics, INVALID_RECORD};
use antidote::kafka::compression::Compression;
use antidote::plan::budget::DecodeBudget;
use antidote::plan::produce::{judge_produce, DoorVerdict};
use antidote::policy::Policy;
use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use std::hint::black_box;

const RECORDS: usize = 1000;
const TOPIC: &str = "geofence.triggers";
const VERSION: i16 = 9;

/// The proxy's door as `ProduceGuard` wires it, minus logging and metrics.
struct Door {
    policy: Arc<Policy>,
    budget: Arc<DecodeBudget>,
}

impl Topics for Door {
    fn is_dead_letter(&self, _: &str) -> bool {
        false
    }
    fn name_of(&self, _: &uuid::Uuid) -> Option<String> {
        None
    }
    fn at_door(&self, _: Option<&str>, _: i32, records: &Bytes) -> Option<Refusal> {
        match judge_produce(&self.policy, "", records, &self.budget, common::NOW_MS) {
            DoorVerdict::Accept { .. } => None,
            _ => Some(Refusal {
                code: INVALID_RECORD,
                message: "rejected".into(),
                record_errors: vec![(0, "rule".into())],
            }),
        }
    }
}

/// A Produce v9 frame: `section` for partition 0 of the policy topic and
/// a small clean batch for partition 1, so a refusal splits the request.
fn request(section: &Bytes, other: &Bytes) -> Bytes {
    let mut b = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(0)
        .with_request_api_version(VERSION)
        .with_correlation_id(1)
        .encode(&mut b, ApiKey::Produce.request_header_version(VERSION))
        .expect("header");
    let part = |i: i32, r: &Bytes| {
        PartitionProduceData::default()
            .with_index(i)
            .with_records(Some(r.clone()))
    };
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_data(vec![part(0, section), part(1, other)])])
        .encode(&mut b, VERSION)
        .expect("body");
    let mut framed = BytesMut::with_capacity(b.len() + 4);
    framed.extend_from_slice(&(b.len() as i32).to_be_bytes());
    framed.extend_from_slice(&b);
    framed.freeze()
}

fn bench_door(c: &mut Criterion) {
    let door = Door {
        policy: common::load_policy("geofence.yaml"),
        budget: DecodeBudget::unlimited(),
    };
    let other = common::json_section(1, 10, 0, Compression::None);
    let mut group = c.benchmark_group("door");
    group.throughput(Throughput::Elements(RECORDS as u64));
    for (codec_name, codec) in [
        ("none", Compression::None),
        ("lz4", Compression::Lz4),
        ("zstd", Compression::Zstd),
    ] {
        // One poison record in 1,000 (`is_poison` with every = RECORDS).
        for (poison_name, every) in [("clean", 0usize), ("one_poison", RECORDS)] {
            let section = common::json_section(1, RECORDS, every, codec);
            let verdict = judge_produce(&door.policy, "", &section, &door.budget, common::NOW_MS);
            match (every, &verdict) {
                (0, DoorVerdict::Accept { records }) => assert_eq!(*records, RECORDS as u64),
                (_, DoorVerdict::Reject(r)) => assert_eq!(r.invalid(), 1),
                _ => panic!("{codec_name}/{poison_name}: unexpected {verdict:?}"),
            }
            let frame = request(&section, &other);
            let decision = check(&frame, VERSION, &door).expect("check");
            assert_eq!(
                matches!(decision, Decision::Untouched),
                every == 0,
                "{codec_name}/{poison_name}"
            );
            let id = format!("{codec_name}/{poison_name}");
            group.bench_with_input(BenchmarkId::new("judge", &id), &section, |b, s| {
                b.iter(|| {
                    black_box(judge_produce(
                        &door.policy,
                        "",
                        s,
                        &door.budget,
                        common::NOW_MS,
                    ))
                })
            });
            group.bench_with_input(BenchmarkId::new("request", &id), &frame, |b, f| {
                b.iter(|| black_box(check(f, VERSION, &door).expect("check")))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_door);
criterion_main!(benches);
