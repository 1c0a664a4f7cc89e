//! Verdicts already reached, per batch, so a batch fetched again (by another
//! consumer group, a restarted consumer, or a fetch starting mid-batch) is
//! not validated again.
//!
//! Keyed by (topic, partition, base offset) and checked against the batch's
//! CRC, so a different batch at the same offset (after a truncation) is
//! judged afresh. An entry remembers the policy it was judged under (by
//! `Arc` identity, kept alive by the entry): after a policy reload old
//! verdicts are never reused. A staleness verdict is fixed when first made:
//! every consumer sees the same records for the same batch. Consumers that
//! fetch the same batch at the same moment (several groups reading in step)
//! share one validation: the first computes, the others wait for it. The
//! cache is bounded; when full it is cleared, costing only re-validation.

use std::sync::{Arc, OnceLock};

use dashmap::DashMap;

use crate::kafka::batch::{Batch, DecodedBatch};
use crate::policy::{Invalid, Policy, Verdict};

type Key = (Arc<str>, i32, i64);

/// The invalid records of one batch: (index in the batch, verdict).
pub type Verdicts = Arc<Vec<(usize, Invalid)>>;

struct Entry {
    crc: u32,
    policy: Arc<Policy>,
    /// Set once, by whichever fetch judges the batch first.
    invalid: OnceLock<Verdicts>,
}

impl Entry {
    fn matches(&self, batch: &Batch, policy: &Arc<Policy>) -> bool {
        self.crc == batch.crc() && Arc::ptr_eq(&self.policy, policy)
    }
}

/// Per-batch verdicts, shared by all connections.
pub struct VerdictCache {
    map: DashMap<Key, Arc<Entry>>,
    capacity: usize,
}

impl Entry {
    fn new(batch: &Batch, policy: &Arc<Policy>) -> Self {
        Entry {
            crc: batch.crc(),
            policy: policy.clone(),
            invalid: OnceLock::new(),
        }
    }
}

impl VerdictCache {
    pub fn new(capacity: usize) -> Self {
        VerdictCache {
            map: DashMap::new(),
            capacity,
        }
    }

    /// The invalid records of `batch` (index in the batch, verdict) if it
    /// was judged before under `policy`; needs no decoding.
    pub fn lookup(
        &self,
        policy: &Arc<Policy>,
        topic: &Arc<str>,
        partition: i32,
        batch: &Batch,
    ) -> Option<Verdicts> {
        let e = self
            .map
            .get(&(topic.clone(), partition, batch.base_offset()))?;
        if e.matches(batch, policy) {
            e.invalid.get().cloned()
        } else {
            None
        }
    }

    /// The verdicts of a decoded batch: judged now, or taken from (or
    /// awaited from) a fetch that judges it at the same time. The flag says
    /// whether this call did the judging.
    pub fn judge(
        &self,
        policy: &Arc<Policy>,
        topic: &Arc<str>,
        partition: i32,
        batch: &Batch,
        decoded: &DecodedBatch,
        now_ms: i64,
    ) -> (Verdicts, bool) {
        let key = (topic.clone(), partition, batch.base_offset());
        let entry = {
            if self.map.len() >= self.capacity {
                self.map.clear();
            }
            let mut slot = self
                .map
                .entry(key)
                .or_insert_with(|| Arc::new(Entry::new(batch, policy)));
            if !slot.matches(batch, policy) {
                *slot = Arc::new(Entry::new(batch, policy));
            }
            slot.clone()
        }; // the map's shard lock is released before judging
        let mut judged_here = false;
        let invalid = entry
            .invalid
            .get_or_init(|| {
                judged_here = true;
                Arc::new(
                    decoded
                        .records()
                        .enumerate()
                        .filter_map(|(i, r)| match policy.judge(&r, now_ms) {
                            Verdict::Valid => None,
                            Verdict::Invalid(inv) => Some((i, inv)),
                        })
                        .collect(),
                )
            })
            .clone();
        (invalid, judged_here)
    }

    /// Forget everything (after a policy reload, to free memory early).
    pub fn clear(&self) {
        self.map.clear();
    }
}
