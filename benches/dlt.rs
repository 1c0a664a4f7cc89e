//! Encoding dead-letter records: `Diversion::new` (copying the poison
//! record out of the fetched buffer), `Diversion::to_record` (context
//! headers) and `build_batch` (one record per batch, as the dead-letter
//! producer sends them, and 100 per batch). Throughput is in records.

mod common;

use std::sync::Arc;

use antidote::dlt::Diversion;
use antidote::kafka::batch::Batch;
use antidote::kafka::builder::{build_batch, BuildOptions};
use antidote::kafka::record::{Header, Record};
use antidote::policy::Verdict;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

fn bench_dlt(c: &mut Criterion) {
    let policy = common::load_policy("geofence.yaml");
    let topic: Arc<str> = Arc::from("geofence.triggers");
    let value = common::json_value(&common::trigger(3, true));
    let key = Bytes::from_static(b"device-00000003");
    let record = Record {
        offset: 123_456,
        timestamp: common::NOW_MS,
        key: Some(&key),
        value: Some(&value),
        headers: vec![Header {
            key: b"idempotency-key",
            value: Some(&b"k-000000000003"[..]),
        }],
    };
    let Verdict::Invalid(invalid) = policy.judge(&record, common::NOW_MS) else {
        panic!("record must be poison")
    };
    let diversion = Diversion::new(&policy, &topic, 2, &record, &invalid);
    let keys = antidote::dlt_context::Keys::none();
    let seal = antidote::dlt_context::Seal::new(&keys, "geo.dlt", 0);
    // Sanity: the encoded batch parses and carries the original value.
    let batch = build_batch(
        &[diversion.to_record(common::NOW_MS, None, &seal)],
        &BuildOptions::default(),
    )
    .unwrap();
    let parsed = Batch::new(batch).unwrap();
    assert!(parsed.crc_valid());
    let decoded = parsed.decode().unwrap();
    assert_eq!(decoded.record(0).unwrap().value, Some(&value[..]));
    eprintln!("dlt: one-record batch is {} bytes", parsed.bytes().len());

    let mut group = c.benchmark_group("dlt");
    group.throughput(Throughput::Elements(1));
    group.bench_function("diversion_new", |b| {
        b.iter(|| {
            black_box(Diversion::new(
                &policy,
                &topic,
                2,
                black_box(&record),
                &invalid,
            ))
        })
    });
    group.bench_function("to_record+build_batch/1", |b| {
        b.iter(|| {
            let r = black_box(&diversion).to_record(common::NOW_MS, None, &seal);
            black_box(build_batch(std::slice::from_ref(&r), &BuildOptions::default()).unwrap())
        })
    });
    group.throughput(Throughput::Elements(100));
    group.bench_function("to_record+build_batch/100", |b| {
        b.iter(|| {
            let rs: Vec<_> = (0..100)
                .map(|_| black_box(&diversion).to_record(common::NOW_MS, None, &seal))
                .collect();
            black_box(build_batch(&rs, &BuildOptions::default()).unwrap())
        })
    });
    group.finish();
}

criterion_group!(benches, bench_dlt);
criterion_main!(benches);
