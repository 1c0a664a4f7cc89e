//! The zero-copy claim of the clean path, asserted where `cargo test` runs
//! it (benches/filter.rs asserts it too, but benches never run in CI): a
//! batch with nothing to remove is a slice of the response, splicing it with
//! every record kept returns those same bytes (same pointer, not a copy), and
//! a partition with nothing to change is not rebuilt at all (the interceptor
//! then forwards the response as it arrived). In a partition that is rebuilt,
//! the clean batches keep their bytes.

#[path = "../benches/common/mod.rs"]
mod common;

use std::sync::Arc;

use antidote::kafka::batch::{segments, Segment};
use antidote::kafka::compression::Compression;
use antidote::kafka::splice::splice;
use antidote::plan::verdicts::VerdictCache;
use antidote::plan::{plan_partition, PartitionInput, PartitionPlan, Visibility};
use bytes::Bytes;

const CODECS: [Compression; 3] = [Compression::None, Compression::Lz4, Compression::Zstd];

fn batches(section: &Bytes) -> Vec<Bytes> {
    segments(section)
        .into_iter()
        .map(|seg| match seg {
            Segment::Batch(b) => b.bytes().clone(),
            _ => panic!("test sections hold whole batches only"),
        })
        .collect()
}

#[test]
fn a_clean_batch_is_a_slice_of_the_response_and_splices_to_the_same_bytes() {
    for codec in CODECS {
        let section = common::json_section(3, 50, 0, codec);
        let mut n = 0;
        for seg in segments(&section) {
            let Segment::Batch(batch) = seg else {
                panic!("unexpected segment")
            };
            let start = section.as_ptr() as usize;
            let at = batch.bytes().as_ptr() as usize;
            assert!(
                at >= start && at + batch.bytes().len() <= start + section.len(),
                "{codec:?}: the batch is a copy, not a slice of the response"
            );
            let decoded = batch.decode().expect("decode");
            let out = splice(&batch, &decoded, &vec![true; decoded.len()], None).expect("splice");
            assert_eq!(
                out.as_ptr(),
                batch.bytes().as_ptr(),
                "{codec:?}: clean splice copied"
            );
            assert_eq!(out.len(), batch.bytes().len());
            n += 1;
        }
        assert_eq!(n, 3);
    }
}

/// Plan `section` as partition 0 of the reference topic, nothing cached.
fn plan_fresh(section: &Bytes) -> PartitionPlan {
    let policy = common::load_policy("geofence.yaml");
    let topic: Arc<str> = Arc::from("geofence.triggers");
    let input = PartitionInput {
        policy: &policy,
        topic: &topic,
        partition: 0,
        records: section,
        visibility: &Visibility::new(false, None),
        now_ms: common::NOW_MS,
        deadline: None,
    };
    plan_partition(&input, &VerdictCache::new(64))
}

#[test]
fn a_clean_partition_is_not_rebuilt() {
    for codec in CODECS {
        let section = common::json_section(3, 50, 0, codec);
        let plan = plan_fresh(&section);
        assert_eq!(
            plan.stats.validated as usize, 150,
            "{codec:?}: every record judged"
        );
        assert!(plan.diversions.is_empty());
        assert!(
            !plan.changes_anything(),
            "{codec:?}: a clean partition was rebuilt"
        );
    }
}

#[test]
fn in_a_rebuilt_partition_the_clean_batches_keep_their_bytes() {
    // Poison one in 50: record 25 of each 50-record batch; batch 1 is built
    // clean by hand in the middle, so batches 0 and 2 change and 1 must not.
    let poisoned = common::json_section(3, 50, 50, Compression::None);
    let clean = common::json_section(3, 50, 0, Compression::None);
    let (p, c) = (batches(&poisoned), batches(&clean));
    let section = Bytes::from([&p[0][..], &c[1][..], &p[2][..]].concat());
    let plan = plan_fresh(&section);
    assert_eq!(plan.diversions.len(), 2);
    assert!(plan.changes_anything());
    let out = plan.apply(None).expect("apply");
    let got = batches(&out);
    assert_eq!(
        got.len(),
        3,
        "no batch lost its last record here, so no marker"
    );
    assert_ne!(got[0], p[0]);
    assert_eq!(
        got[1], c[1],
        "the clean batch between two rebuilt ones changed"
    );
    assert_ne!(got[2], p[2]);
}
