//! Verdicts already reached, per batch, so a batch fetched again (by another
//! consumer group, a restarted consumer, or a fetch starting mid-batch) is
//! not validated again.
//!
//! Keyed by (topic, partition, base offset) and checked against the batch's
//! CRC, so a different batch at the same offset (after a truncation) is
//! judged afresh. An entry remembers the policy it was judged under (by
//! `Arc` identity, kept alive by the entry): after a policy reload old
//! verdicts are never reused. A staleness verdict is fixed when first made:
//! every consumer sees the same records for the same batch. The cache is
//! bounded; when full it is cleared, costing only re-validation.

use std::sync::Arc;

use dashmap::DashMap;

use crate::kafka::batch::{Batch, DecodedBatch};
use crate::policy::{Invalid, Policy, Verdict};

type Key = (Arc<str>, i32, i64);

/// The invalid records of one batch: (index in the batch, verdict).
pub type Verdicts = Arc<Vec<(usize, Invalid)>>;

struct Entry {
    crc: u32,
    policy: Arc<Policy>,
    invalid: Arc<Vec<(usize, Invalid)>>,
}

/// Per-batch verdicts, shared by all connections.
pub struct VerdictCache {
    map: DashMap<Key, Entry>,
    capacity: usize,
}

impl VerdictCache {
    pub fn new(capacity: usize) -> Self {
        VerdictCache { map: DashMap::new(), capacity }
    }

    /// The invalid records of `batch` (index in the batch, verdict) if it
    /// was judged before under `policy`; needs no decoding.
    pub fn lookup(&self, policy: &Arc<Policy>, topic: &Arc<str>, partition: i32, batch: &Batch) -> Option<Verdicts> {
        let e = self.map.get(&(topic.clone(), partition, batch.base_offset()))?;
        (e.crc == batch.crc() && Arc::ptr_eq(&e.policy, policy)).then(|| e.invalid.clone())
    }

    /// Judge every record of a decoded batch and remember the outcome.
    pub fn judge(
        &self,
        policy: &Arc<Policy>,
        topic: &Arc<str>,
        partition: i32,
        batch: &Batch,
        decoded: &DecodedBatch,
        now_ms: i64,
    ) -> Verdicts {
        let invalid: Vec<(usize, Invalid)> = decoded
            .records()
            .enumerate()
            .filter_map(|(i, r)| match policy.judge(&r, now_ms) {
                Verdict::Valid => None,
                Verdict::Invalid(inv) => Some((i, inv)),
            })
            .collect();
        let invalid = Arc::new(invalid);
        if self.map.len() >= self.capacity {
            self.map.clear();
        }
        self.map.insert(
            (topic.clone(), partition, batch.base_offset()),
            Entry { crc: batch.crc(), policy: policy.clone(), invalid: invalid.clone() },
        );
        invalid
    }

    /// Forget everything (after a policy reload, to free memory early).
    pub fn clear(&self) {
        self.map.clear();
    }
}
