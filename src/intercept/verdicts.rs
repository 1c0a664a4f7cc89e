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

    /// The invalid records of `batch` (index in the batch, verdict), and
    /// whether they came from the cache.
    pub fn judge(
        &self,
        policy: &Arc<Policy>,
        topic: &Arc<str>,
        partition: i32,
        batch: &Batch,
        decoded: &DecodedBatch,
        now_ms: i64,
    ) -> (Arc<Vec<(usize, Invalid)>>, bool) {
        let key = (topic.clone(), partition, batch.base_offset());
        if let Some(e) = self.map.get(&key) {
            if e.crc == batch.crc() && Arc::ptr_eq(&e.policy, policy) {
                return (e.invalid.clone(), true);
            }
        }
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
            key,
            Entry { crc: batch.crc(), policy: policy.clone(), invalid: invalid.clone() },
        );
        (invalid, false)
    }

    /// Forget everything (after a policy reload, to free memory early).
    pub fn clear(&self) {
        self.map.clear();
    }
}
