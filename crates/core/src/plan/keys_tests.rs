//! Per-key ordering in the planner: blocked keys from the gate, keys
//! blocked within one response, null keys, partial batches, the cap.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::keys::{Block, KeyGate, MAX_BLOCKED_KEYS_PER_PARTITION};
use super::verdicts::VerdictCache;
use super::*;
use crate::kafka::batch::{self as kbatch, Segment};
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
use crate::policy::{Class, PolicySet};

const POLICY: &str = "policies:\n  - name: p\n    topics: [t]\n    value: { format: json }\n    rules:\n      - coordinates: { lat: /lat, lon: /lon }\n";

fn policy(ordering: &str) -> Arc<Policy> {
    let text = format!(
        "{POLICY}    ordering: {ordering}\n    dead_letter: {{ topic: \"{{topic}}.{{class}}\" }}\n"
    );
    let set = PolicySet::parse(&text, Path::new("p.yaml")).unwrap();
    set.for_topic("t").unwrap().clone()
}

/// One batch at `base`: (key, poison?) per record.
fn batch(base: i64, recs: &[(Option<&str>, bool)]) -> Vec<u8> {
    let records: Vec<NewRecord> = recs
        .iter()
        .map(|(k, poison)| NewRecord {
            timestamp: 1_000,
            key: k.map(|k| Bytes::from(k.to_string())),
            value: Some(if *poison {
                r#"{"lat":91.5,"lon":4}"#.into()
            } else {
                r#"{"lat":52,"lon":4}"#.into()
            }),
            headers: vec![],
        })
        .collect();
    let mut b = build_batch(&records, &BuildOptions::default())
        .unwrap()
        .to_vec();
    b[..8].copy_from_slice(&base.to_be_bytes());
    b
}

/// Blocks by key; each block's last parked offset; keys released lately
/// and through which offset.
#[derive(Default)]
struct Gate(
    HashMap<Vec<u8>, Block>,
    HashMap<Vec<u8>, i64>,
    HashMap<Vec<u8>, i64>,
);

impl KeyGate for Gate {
    fn blocked(&self, key: &[u8]) -> Option<Block> {
        self.0.get(key).copied()
    }
    fn releases(&self, key: &[u8], through: i64) -> bool {
        self.1.get(key).is_some_and(|last| *last <= through)
    }
    fn released_through(&self, key: &[u8]) -> Option<i64> {
        self.2.get(key).copied()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn plan(p: &Arc<Policy>, records: &[u8], gate: &Gate) -> PartitionPlan {
    plan_with(p, records, gate, &VerdictCache::new(100))
}

/// [`plan`] with the verdict cache `cache`.
fn plan_with(p: &Arc<Policy>, records: &[u8], gate: &Gate, cache: &VerdictCache) -> PartitionPlan {
    let topic: Arc<str> = Arc::from("t");
    let records = Bytes::copy_from_slice(records);
    let vis = Visibility::new(false, None);
    let input = PartitionInput {
        policy: p,
        topic: &topic,
        partition: 0,
        records: &records,
        visibility: &vis,
        now_ms: 0,
        deadline: None,
    };
    let env = Env {
        verdicts: cache,
        budget: &budget::DecodeBudget::unlimited(),
        already: &|_, _| Vec::new(),
    };
    plan_partition_keyed(&input, &env, gate)
}

/// The keys of the records delivered by `plan`.
fn delivered(plan: &PartitionPlan) -> Vec<Option<String>> {
    let out = plan.apply(None).unwrap();
    let mut keys = Vec::new();
    for seg in kbatch::segments(&out) {
        if let Segment::Batch(b) = seg {
            if b.is_control() {
                continue;
            }
            for r in b.decode().unwrap().records() {
                keys.push(r.key.map(|k| String::from_utf8_lossy(k).into_owned()));
            }
        }
    }
    keys
}

fn diverted(plan: &PartitionPlan) -> Vec<(i64, Class, Option<i64>, String)> {
    plan.diversions
        .iter()
        .map(|d| {
            (
                d.origin_offset,
                d.invalid.class,
                d.blocked_by,
                d.dlt_topic.clone(),
            )
        })
        .collect()
}

fn some(k: &str) -> Option<String> {
    Some(k.to_string())
}

/// Under per_key a batch with removals is read record by record even when
/// its verdicts are cached, and its CRC is read by that decode only. A
/// corrupt copy of it (same stored CRC, another body) is held there, never
/// passed on the good copy's verdicts, and counts no cached verdicts.
#[test]
fn a_corrupt_copy_of_a_cached_batch_with_removals_is_held_under_per_key() {
    let p = policy("per_key");
    let cache = VerdictCache::new(100);
    let good = batch(
        0,
        &[(Some("a"), false), (Some("b"), true), (Some("c"), false)],
    );
    let first = plan_with(&p, &good, &Gate::default(), &cache);
    assert_eq!(delivered(&first), [some("a"), some("c")]);
    assert_eq!(first.stats.cached_batches, 0);
    let again = plan_with(&p, &good, &Gate::default(), &cache);
    assert_eq!(delivered(&again), [some("a"), some("c")]);
    assert_eq!(
        again.stats.cached_batches, 1,
        "its verdicts came from the cache"
    );
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x55;
    let held = plan_with(&p, &bad, &Gate::default(), &cache);
    assert_eq!(
        held.held.as_ref().map(|h| h.offset),
        Some(0),
        "held, not passed"
    );
    assert!(matches!(
        held.held.as_ref().map(|h| &h.reason),
        Some(HoldReason::Undecodable(_))
    ));
    assert_eq!(held.stats.undecodable_batches, 1);
    assert_eq!(held.stats.cached_batches, 0);
    assert!(held.diversions.is_empty());
    assert_eq!(held.apply(held.held_from(None)).unwrap(), Bytes::new());
}

#[test]
fn a_poison_record_blocks_its_key_within_one_response() {
    // A1 poison, B1, A2, C1, A3: B1 and C1 delivered; A1..A3 diverted in order.
    let b = batch(
        0,
        &[
            (Some("A"), true),
            (Some("B"), false),
            (Some("A"), false),
            (Some("C"), false),
            (Some("A"), false),
        ],
    );
    let p = plan(&policy("per_key"), &b, &Gate::default());
    assert_eq!(delivered(&p), [some("B"), some("C")]);
    assert_eq!(
        diverted(&p),
        [
            (0, Class::Poison, None, "t.poison".into()),
            (2, Class::Blocked, Some(0), "t.poison".into()),
            (4, Class::Blocked, Some(0), "t.poison".into()),
        ]
    );
    assert_eq!(p.diversions[1].invalid.rule, "key");
    assert!(p.held.is_none());
}

#[test]
fn without_per_key_later_records_of_the_key_flow() {
    let b = batch(0, &[(Some("A"), true), (Some("A"), false)]);
    let p = plan(&policy("none"), &b, &Gate::default());
    assert_eq!(delivered(&p), [some("A")]);
    assert_eq!(p.diversions.len(), 1);
}

#[test]
fn a_key_blocked_in_one_batch_blocks_it_in_the_next_of_the_same_response() {
    let mut b = batch(0, &[(Some("A"), true), (Some("B"), false)]);
    b.extend(batch(2, &[(Some("A"), false), (Some("B"), false)]));
    let p = plan(&policy("per_key"), &b, &Gate::default());
    assert_eq!(delivered(&p), [some("B"), some("B")]);
    assert_eq!(diverted(&p)[1].0, 2);
    assert_eq!(diverted(&p)[1].2, Some(0));
}

#[test]
fn a_blocked_key_from_the_gate_is_diverted_to_its_first_records_dlt() {
    let mut gate = Gate::default();
    gate.0.insert(
        b"A".to_vec(),
        Block {
            first: 3,
            class: Class::Unknown,
        },
    );
    // Offset 2 precedes the block: it is delivered. 5 follows it.
    let b = batch(
        2,
        &[(Some("A"), false), (Some("B"), false), (Some("A"), true)],
    );
    let p = plan(&policy("per_key"), &b, &gate);
    assert_eq!(delivered(&p), [some("A"), some("B")]);
    let d = diverted(&p);
    assert_eq!(d, [(4, Class::Blocked, Some(3), "t.unknown".into())]);
    // Its own verdict is kept in the reason.
    assert!(
        p.diversions[0]
            .invalid
            .reason
            .contains("own verdict: poison"),
        "{}",
        p.diversions[0].invalid.reason
    );
}

#[test]
fn null_keys_never_block() {
    let b = batch(0, &[(None, true), (None, false), (Some("A"), false)]);
    let p = plan(&policy("per_key"), &b, &Gate::default());
    assert_eq!(delivered(&p), [None, some("A")]);
    assert_eq!(diverted(&p), [(0, Class::Poison, None, "t.poison".into())]);
}

#[test]
fn the_same_key_twice_poison_keeps_the_first_block() {
    let b = batch(
        0,
        &[(Some("A"), true), (Some("A"), true), (Some("A"), false)],
    );
    let p = plan(&policy("per_key"), &b, &Gate::default());
    assert!(delivered(&p).is_empty());
    let d = diverted(&p);
    assert_eq!(
        d.iter().map(|x| x.2).collect::<Vec<_>>(),
        [None, Some(0), Some(0)]
    );
}

#[test]
fn a_trailing_partial_batch_is_passed_as_it_is() {
    let mut b = batch(0, &[(Some("A"), true), (Some("B"), false)]);
    let next = batch(2, &[(Some("A"), false)]);
    b.extend_from_slice(&next[..next.len() - 5]);
    let p = plan(&policy("per_key"), &b, &Gate::default());
    assert_eq!(delivered(&p), [some("B")]);
    assert_eq!(p.diversions.len(), 1);
    let out = p.apply(None).unwrap();
    assert!(out.ends_with(&next[..next.len() - 5]));
}

#[test]
fn a_partition_with_no_blocked_keys_and_valid_records_is_kept_whole() {
    let b = batch(0, &[(Some("A"), false), (Some("B"), false)]);
    let p = plan(&policy("per_key"), &b, &Gate::default());
    assert!(!p.changes_anything());
}

#[test]
fn past_the_cap_the_partition_is_held_at_the_new_key() {
    let mut gate = Gate::default();
    for i in 0..MAX_BLOCKED_KEYS_PER_PARTITION {
        gate.0.insert(
            format!("x{i}").into_bytes(),
            Block {
                first: 0,
                class: Class::Poison,
            },
        );
    }
    let b = batch(
        10,
        &[
            (Some("B"), false),
            (Some("x1"), false),
            (Some("A"), true),
            (Some("C"), false),
        ],
    );
    let p = plan(&policy("per_key"), &b, &gate);
    let hold = p.held.clone().unwrap();
    assert_eq!((hold.offset, hold.reason), (12, HoldReason::BlockedKeys));
    // Only the record of an already blocked key is diverted; A and C wait.
    assert_eq!(
        diverted(&p),
        [(11, Class::Blocked, Some(0), "t.poison".into())]
    );
    let out = p.apply(Some(12)).unwrap();
    let keys: Vec<_> = kbatch::segments(&out)
        .into_iter()
        .filter_map(|s| match s {
            Segment::Batch(b) => Some(b),
            _ => None,
        })
        .flat_map(|b| {
            b.decode()
                .unwrap()
                .records()
                .map(|r| r.offset)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(keys, [10]);
}

/// A record of `key` as `dlt replay` writes it back: `x-replayed-from-dlt`,
/// and on the key's last one `x-released-through`.
fn replayed(key: &str, through: Option<i64>) -> NewRecord {
    let mut headers = vec![(
        "x-replayed-from-dlt".to_string(),
        Some(Bytes::from_static(b"t.poison/0/1")),
    )];
    if let Some(t) = through {
        headers.push((
            "x-released-through".to_string(),
            Some(Bytes::from(t.to_string())),
        ));
    }
    NewRecord {
        timestamp: 1_000,
        key: Some(Bytes::from(key.to_string())),
        value: Some(r#"{"lat":52,"lon":4}"#.into()),
        headers,
    }
}

fn plain(key: &str) -> NewRecord {
    NewRecord {
        timestamp: 1_000,
        key: Some(Bytes::from(key.to_string())),
        value: Some(r#"{"lat":52,"lon":4}"#.into()),
        headers: vec![],
    }
}

#[test]
fn replayed_records_pass_and_the_last_one_releases_the_key() {
    let mut gate = Gate::default();
    let block = Block {
        first: 0,
        class: Class::Poison,
    };
    gate.0.insert(b"A".to_vec(), block);
    gate.1.insert(b"A".to_vec(), 5);
    // A1' A2' (through 5), then A5: all delivered; the release is reported.
    let recs = [replayed("A", None), replayed("A", Some(5)), plain("A")];
    let mut b = build_batch(&recs, &BuildOptions::default())
        .unwrap()
        .to_vec();
    b[..8].copy_from_slice(&10i64.to_be_bytes());
    let p = plan(&policy("per_key"), &b, &gate);
    assert_eq!(delivered(&p), [some("A"), some("A"), some("A")]);
    assert!(p.diversions.is_empty());
    assert_eq!(p.releases.len(), 1);
    assert_eq!((p.releases[0].through, p.releases[0].offset), (5, 11));
    // A release that does not cover the block's last record frees nothing.
    gate.1.insert(b"A".to_vec(), 7);
    let p = plan(&policy("per_key"), &b, &gate);
    assert_eq!(delivered(&p), [some("A"), some("A")]);
    assert!(p.releases.is_empty());
    assert_eq!(p.diversions.len(), 1);
}

#[test]
fn records_already_in_their_dlt_block_their_key_unless_released() {
    // K1 (poison) and K2 were diverted by an earlier fetch. The blocked-key
    // set may not know K yet (the ledger learns a write first): K3 is
    // parked behind K1 all the same. Once K is released through K2, K3 is
    // delivered although K1's verdict is still poison.
    let b = batch(
        0,
        &[
            (Some("K"), true),
            (Some("K"), false),
            (Some("B"), false),
            (Some("K"), false),
        ],
    );
    let p = policy("per_key");
    let topic: Arc<str> = Arc::from("t");
    let records = Bytes::copy_from_slice(&b);
    let vis = Visibility::new(false, None);
    let input = PartitionInput {
        policy: &p,
        topic: &topic,
        partition: 0,
        records: &records,
        visibility: &vis,
        now_ms: 0,
        deadline: None,
    };
    let cache = VerdictCache::new(100);
    let env = Env {
        verdicts: &cache,
        budget: &budget::DecodeBudget::unlimited(),
        already: &|from, to| {
            [0i64, 1]
                .into_iter()
                .filter(|o| (from..to).contains(o))
                .collect()
        },
    };
    let unknown = plan_partition_keyed(&input, &env, &Gate::default());
    assert_eq!(delivered(&unknown), [some("B")]);
    let parked: Vec<_> = (unknown.diversions.iter())
        .map(|d| (d.origin_offset, d.blocked_by))
        .collect();
    assert_eq!(parked, [(0, None), (3, Some(0))]);
    let mut released = Gate::default();
    released.2.insert(b"K".to_vec(), 1);
    let plan = plan_partition_keyed(&input, &env, &released);
    assert_eq!(delivered(&plan), [some("B"), some("K")]);
    assert!(plan.diversions.iter().all(|d| d.blocked_by.is_none()));
}

/// Planning cost per record with and without per_key, on 1,000-record
/// batches (one poison record) judged afresh each time, and with 10,000
/// blocked keys in the gate. Debug build numbers, for the ratio only:
/// `cargo test -p antidote-core measure_per_key -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_per_key_planning_cost() {
    let recs: Vec<(String, bool)> = (0..1000).map(|i| (format!("dev-{i}"), i == 0)).collect();
    let refs: Vec<(Option<&str>, bool)> =
        recs.iter().map(|(k, p)| (Some(k.as_str()), *p)).collect();
    let b = batch(0, &refs);
    let mut big = Gate::default();
    for i in 0..MAX_BLOCKED_KEYS_PER_PARTITION - 1 {
        big.0.insert(
            format!("x{i}").into_bytes(),
            Block {
                first: 0,
                class: Class::Poison,
            },
        );
    }
    let rounds = 200;
    for (name, p, gate) in [
        ("none", policy("none"), Gate::default()),
        ("per_key", policy("per_key"), Gate::default()),
        ("per_key, 9,999 blocked keys", policy("per_key"), big),
    ] {
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            let out = plan(&p, &b, &gate);
            assert_eq!(out.diversions.len(), 1);
        }
        let per = start.elapsed().as_nanos() as f64 / (rounds * 1000) as f64;
        println!("{name}: {per:.0} ns/record");
    }
}
