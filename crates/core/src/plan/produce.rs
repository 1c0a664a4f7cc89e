//! The door: judging the records of one partition of a client's Produce
//! request, for policies with `on_produce: reject`. Pure: bytes in, a
//! verdict on the whole batch out; the proxy turns it into INVALID_RECORD.
//!
//! Kafka writes a partition's batch all or nothing, so the verdict is on the
//! whole records section: it passes only if every record passes (records
//! classed `stale` pass: staleness is about age at read time). Every record
//! is judged by the same `Policy::judge` as on fetch, and compressed batches
//! are decoded under the same per-batch cap and shared `DecodeBudget`.
//!
//! Fail closed: a records section that cannot be judged (it does not
//! decode, it is a legacy magic 0/1 message set, it ends in a fragment) is
//! refused whole, never forwarded unjudged. Only a spent decode budget is
//! worth a retry; the caller answers it with a retriable error.
//!
//! Registry-backed policies (`registry: true`): a record whose schema the
//! registry has not given yet (class `transient`) is neither accepted nor
//! refused as invalid: the verdict is [`DoorVerdict::Wait`], which the
//! caller answers after asking the registry, or with a retriable error. A
//! batch refused only for what the registry said before (an id it did not
//! know, class `unknown`; an id not under the policy's subject) names those
//! ids in [`Rejection::recheck`], so that the caller can ask again past the
//! negative cache before refusing: a registry replica that lags is not a
//! bad record.
//!
//! Memory: the verdict keeps the details of at most [`MAX_DETAILED`]
//! invalid records and a count per (class, rule) for the rest, so a frame
//! full of tiny poison records cannot make it grow with the records.

use std::sync::Arc;

use bytes::Bytes;

use super::budget::decode_within;
use super::budget::DecodeBudget;
use super::HoldReason;
use crate::kafka::batch::{self, Segment};
use crate::policy::contract::Side;
use crate::policy::{Class, Invalid, Policy, Verdict};

/// Invalid records described one by one in a verdict (KIP-467
/// `record_errors`); the rest are only counted.
pub const MAX_DETAILED: usize = 100;

/// One refused record: its index among the request's records for this
/// partition (KIP-467 `batch_index`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRecord {
    pub index: i32,
    pub invalid: Invalid,
}

/// The verdict on one partition's records at the door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DoorVerdict {
    /// Nothing invalid (stale records included): forward as it arrived.
    Accept { records: u64 },
    /// At least one record is invalid: the whole batch is refused.
    Reject(Rejection),
    /// Some record's schema is not known yet (the registry has not
    /// answered): no record is invalid for another reason. `reason` names
    /// what is awaited, never a record's contents.
    Wait { records: u64, reason: String },
    /// The records cannot be judged: refused whole.
    Unjudgeable(HoldReason),
}

/// Most schema ids a rejection names for a second look at the registry.
pub const MAX_RECHECK: usize = 16;

/// What a refused batch held.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rejection {
    /// Records judged, valid ones included.
    pub records: u64,
    /// The first [`MAX_DETAILED`] invalid records, in order.
    pub detailed: Vec<RefusedRecord>,
    /// Every invalid record counted by (class, rule), first seen first.
    pub tally: Vec<(Class, String, u64)>,
    /// When every invalid record was refused only for an earlier registry
    /// answer (an unknown id, an id not under the subject): the schema ids
    /// their keys and values name, at most [`MAX_RECHECK`]. Empty when any
    /// record is invalid for another reason.
    pub recheck: Vec<u32>,
    /// Invalid records refused for a reason a registry answer cannot change.
    definite: u64,
}

impl Rejection {
    /// Invalid records in all.
    pub fn invalid(&self) -> u64 {
        self.tally.iter().map(|(_, _, n)| n).sum()
    }

    fn add(&mut self, index: i32, invalid: Invalid, record: &crate::kafka::record::Record<'_>) {
        if invalid.class == Class::Unknown || invalid.rule.ends_with("subject") {
            for id in [record.key, record.value]
                .into_iter()
                .flatten()
                .filter_map(framed_id)
            {
                if !self.recheck.contains(&id) && self.recheck.len() < MAX_RECHECK {
                    self.recheck.push(id);
                }
            }
        } else {
            self.definite += 1;
        }
        match self
            .tally
            .iter_mut()
            .find(|(c, r, _)| *c == invalid.class && *r == invalid.rule)
        {
            Some((_, _, n)) => *n += 1,
            None => self.tally.push((invalid.class, invalid.rule.clone(), 1)),
        }
        if self.detailed.len() < MAX_DETAILED {
            self.detailed.push(RefusedRecord { index, invalid });
        }
    }
}

/// What identifies the retry of a refused batch: the producer id and first
/// sequence of its first batch (-1 when the producer is not idempotent),
/// its first timestamp and, for an uncompressed batch, a digest of its
/// first record's bytes. Producers retry refused records in order, so a
/// retry starts with the same record even when its records are batched
/// anew. Read from the headers and the first record only: no decoding, so
/// it is known even while the decode budget is spent. `None` when the
/// section holds no record batch.
pub fn retry_identity(records: &Bytes) -> Option<(i64, i32, i64, u64)> {
    use std::hash::{Hash, Hasher};
    let b = batch::segments(records).into_iter().find_map(|s| match s {
        Segment::Batch(b) if !b.is_control() => Some(b),
        _ => None,
    })?;
    let mut digest = 0;
    if b.compression() == Some(crate::kafka::compression::Compression::None) {
        let section = b.records_section();
        if let Some(first) = first_record(&section) {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            first.hash(&mut h);
            digest = h.finish();
        }
    }
    Some((
        b.producer_id(),
        b.base_sequence(),
        b.base_timestamp(),
        digest,
    ))
}

/// The bytes of the first record of an uncompressed records section (its
/// zigzag varint length, then that many bytes).
fn first_record(section: &[u8]) -> Option<&[u8]> {
    let (mut value, mut shift, mut at) = (0u64, 0u32, 0usize);
    loop {
        let byte = *section.get(at)?;
        at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
    let len = usize::try_from((value >> 1) as i64 ^ -((value & 1) as i64)).ok()?;
    section.get(at..at.checked_add(len)?)
}

/// The schema id of a Confluent-framed key or value.
fn framed_id(bytes: &[u8]) -> Option<u32> {
    match bytes {
        [0, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// Judge every record of one partition's records section from a Produce
/// request. Control batches are not judged (they carry no client records;
/// the broker refuses them from clients anyway).
pub fn judge_produce(
    policy: &Policy,
    topic: &str,
    records: &Bytes,
    budget: &Arc<DecodeBudget>,
    now_ms: i64,
) -> DoorVerdict {
    let mut index: i32 = 0;
    let mut rejection = Rejection::default();
    let mut waiting: Option<String> = None;
    for seg in batch::segments(records) {
        let b = match seg {
            Segment::Batch(b) => b,
            Segment::Legacy(_) => return DoorVerdict::Unjudgeable(HoldReason::Legacy),
            Segment::Partial(bytes) => {
                return DoorVerdict::Unjudgeable(HoldReason::Undecodable(format!(
                    "{} trailing bytes are not a complete record batch",
                    bytes.len()
                )))
            }
        };
        if b.is_control() {
            continue;
        }
        let (decoded, _memory) = match decode_within(&b, budget) {
            Ok(d) => d,
            Err(reason) => return DoorVerdict::Unjudgeable(reason),
        };
        let walked = decoded.each_record(|_, record| {
            rejection.records += 1;
            if let Verdict::Invalid(invalid) = policy.judge_at(topic, record, now_ms, Side::Write) {
                match invalid.class {
                    Class::Stale => {}
                    // Judging goes on, so that one round of registry
                    // requests covers every id the batch needs.
                    Class::Transient => {
                        waiting.get_or_insert(invalid.reason);
                    }
                    _ => rejection.add(index, invalid, record),
                }
            }
            index = index.saturating_add(1);
        });
        if let Err(e) = walked {
            return DoorVerdict::Unjudgeable(HoldReason::Undecodable(e.to_string()));
        }
    }
    if rejection.definite > 0 {
        rejection.recheck.clear(); // refused whatever the registry says
        return DoorVerdict::Reject(rejection);
    }
    if let Some(reason) = waiting {
        return DoorVerdict::Wait {
            records: rejection.records,
            reason,
        };
    }
    if rejection.tally.is_empty() {
        DoorVerdict::Accept {
            records: rejection.records,
        }
    } else {
        DoorVerdict::Reject(rejection)
    }
}

#[cfg(test)]
#[path = "produce_registry_tests.rs"]
mod registry_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::compression::Compression;
    use crate::kafka::testutil::{RawBatch, RawRecord};
    use crate::policy::PolicySet;

    const NOW: i64 = 1_764_460_000_000;

    fn policy() -> Arc<Policy> {
        let text = "policies:\n  - name: door\n    topics: [t]\n    value:\n      format: json\n    rules:\n      - field: /n\n        min: 0\n      - field: /ts\n        max_age: 1m\n    on_produce: reject\n";
        let set = PolicySet::parse(text, std::path::Path::new("/tmp/door.yaml")).expect("policy");
        set.for_topic("t").expect("covers t").clone()
    }

    fn value(n: i64, ts: i64) -> String {
        format!("{{\"n\":{n},\"ts\":{ts}}}")
    }

    fn section(values: &[String], codec: Compression) -> Bytes {
        let mut b = RawBatch::compacted_five(codec, 0);
        b.records = values
            .iter()
            .enumerate()
            .map(|(i, v)| RawRecord::simple(i as i32, v))
            .collect();
        b.last_offset_delta = None;
        b.encode()
    }

    fn judge(records: &Bytes) -> DoorVerdict {
        judge_produce(&policy(), "t", records, &DecodeBudget::unlimited(), NOW)
    }

    #[test]
    fn a_batch_of_valid_records_is_accepted_with_every_codec() {
        for codec in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let s = section(&[value(1, NOW), value(2, NOW)], codec);
            assert_eq!(judge(&s), DoorVerdict::Accept { records: 2 }, "{codec:?}");
        }
    }

    #[test]
    fn one_invalid_record_refuses_the_batch_and_names_its_index_and_rule() {
        for codec in [Compression::None, Compression::Zstd] {
            let s = section(&[value(1, NOW), value(-5, NOW), value(3, NOW)], codec);
            let DoorVerdict::Reject(r) = judge(&s) else {
                panic!("expected a rejection with {codec:?}");
            };
            assert_eq!(r.records, 3);
            assert_eq!(r.invalid(), 1);
            assert_eq!(r.detailed.len(), 1);
            assert_eq!(r.detailed[0].index, 1);
            assert_eq!(r.detailed[0].invalid.rule, "range:/n");
            assert_eq!(r.tally, vec![(Class::Poison, "range:/n".to_string(), 1)]);
        }
    }

    #[test]
    fn stale_records_are_never_refused_at_the_door() {
        let old = value(1, NOW - 3_600_000);
        let r = crate::kafka::record::Record {
            offset: 0,
            timestamp: NOW,
            key: None,
            value: Some(old.as_bytes()),
            headers: vec![],
        };
        let Verdict::Invalid(v) = policy().judge(&r, NOW) else {
            panic!("the old record should be judged stale");
        };
        assert_eq!(v.class, Class::Stale);
        let s = section(&[old, value(2, NOW)], Compression::None);
        assert_eq!(judge(&s), DoorVerdict::Accept { records: 2 });
    }

    #[test]
    fn details_are_capped_and_the_rest_counted() {
        let values: Vec<String> = (0..MAX_DETAILED as i64 + 50)
            .map(|i| value(-1 - i, NOW))
            .collect();
        let DoorVerdict::Reject(r) = judge(&section(&values, Compression::Gzip)) else {
            panic!("expected a rejection");
        };
        assert_eq!(r.detailed.len(), MAX_DETAILED);
        assert_eq!(r.invalid(), MAX_DETAILED as u64 + 50);
        assert_eq!(
            r.detailed.last().map(|d| d.index),
            Some(MAX_DETAILED as i32 - 1)
        );
    }

    #[test]
    fn what_cannot_be_judged_is_refused_whole() {
        let good = section(&[value(1, NOW)], Compression::None);
        // A truncated batch.
        let cut = good.slice(..good.len() - 3);
        assert!(matches!(
            judge(&cut),
            DoorVerdict::Unjudgeable(HoldReason::Undecodable(_))
        ));
        // A flipped byte: the CRC no longer matches.
        let mut bad = good.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        assert!(matches!(
            judge(&Bytes::from(bad)),
            DoorVerdict::Unjudgeable(HoldReason::Undecodable(_))
        ));
        // A byte after the last record, CRC intact: found while judging.
        let trailing = crate::plan::tests::trailing_byte(good.to_vec());
        assert!(matches!(
            judge(&Bytes::from(trailing)),
            DoorVerdict::Unjudgeable(HoldReason::Undecodable(why)) if why.contains("bytes left")
        ));
        // A legacy magic 1 message set.
        let mut legacy = good.to_vec();
        legacy[16] = 1;
        assert_eq!(
            judge(&Bytes::from(legacy)),
            DoorVerdict::Unjudgeable(HoldReason::Legacy)
        );
    }

    #[test]
    fn a_retry_is_known_by_its_first_record_even_batched_anew() {
        let one = section(&[value(1, NOW)], Compression::None);
        let more = section(&[value(1, NOW), value(2, NOW)], Compression::None);
        let other = section(&[value(2, NOW), value(1, NOW)], Compression::None);
        assert!(retry_identity(&one).is_some());
        assert_eq!(retry_identity(&one), retry_identity(&more));
        assert_ne!(retry_identity(&one), retry_identity(&other));
        assert_eq!(retry_identity(&Bytes::new()), None);
    }

    #[test]
    fn a_compressed_batch_waits_for_the_decode_budget() {
        let s = section(&[value(1, NOW)], Compression::Gzip);
        let budget = DecodeBudget::new(1024);
        let _held = budget.try_reserve(1000).expect("first reservation");
        assert_eq!(
            judge_produce(&policy(), "t", &s, &budget, NOW),
            DoorVerdict::Unjudgeable(HoldReason::Budget)
        );
        assert_eq!(budget.used(), 1000, "nothing of the door's left reserved");
    }
}
