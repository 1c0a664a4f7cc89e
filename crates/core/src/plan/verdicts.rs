//! Verdicts already reached, per batch, so a batch fetched again (by another
//! consumer group, a restarted consumer, or a fetch starting mid-batch) is
//! not validated again.
//!
//! Keyed by (topic, partition, base offset) and checked against the batch's
//! length and CRC, so a different batch at the same offset (after a
//! truncation) is judged afresh. A verdict is only for the bytes judged:
//! the planner takes one from the cache only for a batch whose CRC holds
//! (a corrupt copy is decoded, fails, and is held). CRC32C is not a
//! cryptographic hash: a broker that forges a batch with the same length
//! and CRC at an offset already judged gets it past the cache (docs/guarantees.md,
//! Limitations). An entry remembers the policy it was judged under (by
//! `Arc` identity, kept alive by the entry): after a policy reload old
//! verdicts are never reused. A staleness verdict is fixed when first made:
//! every consumer sees the same records for the same batch. Consumers that
//! fetch the same batch at the same moment (several groups reading in step)
//! share one validation: the first computes, the others wait for it. The
//! cache is bounded; when full it is cleared, costing only re-validation.
//!
//! A batch may be judged ahead, by a helper of the fetch that plans it
//! ([`super::judge_ahead`](crate::plan::judge_ahead)); the entry says so until a planner claims it
//! ([`Known::claim_judged_ahead`]), so the records count as validated once
//! and are not mistaken for verdicts recalled from an earlier fetch.
//!
//! An entry may also hold the batch as it is sent once its invalid records
//! are removed ([`Known::spliced`]), so a later fetch whose invalid records
//! are all dead-lettered already gets it without decoding or splicing. Those
//! bytes are bounded separately ([`SPLICED_BUDGET`]), oldest dropped first.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use dashmap::DashMap;

use crate::kafka::batch::{Batch, BatchError, DecodedBatch};
use crate::kafka::splice::Rebuilt;
use crate::policy::{Class, Invalid, Policy, Verdict};

type Key = (Arc<str>, i32, i64);

/// One invalid record of a batch.
#[derive(Debug, Clone)]
pub struct Judged {
    /// Index in the batch.
    pub index: usize,
    pub offset: i64,
    pub invalid: Invalid,
}

/// The invalid records of one batch, in batch order.
pub type Verdicts = Arc<Vec<Judged>>;

/// Bytes of spliced batches kept across all entries: their new bytes (a
/// header, a recompressed batch, a marker) and ranges, never a copy of
/// the runs of records they keep.
pub const SPLICED_BUDGET: usize = 32 << 20;

struct Entry {
    crc: u32,
    len: usize,
    policy: Arc<Policy>,
    /// Set once, by whichever fetch judges the batch first: the verdicts,
    /// or why its records cannot be read (the entry is then dropped).
    invalid: OnceLock<Result<Verdicts, BatchError>>,
    /// Judged by a helper ahead of the planner, and not yet claimed by one.
    ahead: AtomicBool,
    /// The batch without its removed records (see [`Known::spliced`]).
    spliced: Mutex<Option<Rebuilt>>,
}

impl Entry {
    fn new(batch: &Batch, policy: &Arc<Policy>) -> Self {
        Entry {
            crc: batch.crc(),
            len: batch.bytes().len(),
            policy: policy.clone(),
            invalid: OnceLock::new(),
            ahead: AtomicBool::new(false),
            spliced: Mutex::new(None),
        }
    }

    fn matches(&self, batch: &Batch, policy: &Arc<Policy>) -> bool {
        self.crc == batch.crc()
            && self.len == batch.bytes().len()
            && Arc::ptr_eq(&self.policy, policy)
    }
}

/// Spliced batches held by entries, oldest first, with their total size.
#[derive(Default)]
struct SplicedStore {
    budget: usize,
    bytes: usize,
    order: VecDeque<(Weak<Entry>, usize)>,
}

/// Per-batch verdicts, shared by all connections.
pub struct VerdictCache {
    map: DashMap<Key, Arc<Entry>>,
    capacity: usize,
    spliced: Arc<Mutex<SplicedStore>>,
}

/// A batch's cache entry, judged.
#[derive(Clone)]
pub struct Known {
    entry: Arc<Entry>,
    verdicts: Verdicts,
    store: Arc<Mutex<SplicedStore>>,
}

impl Known {
    pub fn verdicts(&self) -> &Verdicts {
        &self.verdicts
    }

    /// Whether a helper judged this batch ahead of the planner and no
    /// planner has counted it yet; true for the first caller only.
    pub fn claim_judged_ahead(&self) -> bool {
        self.entry.ahead.swap(false, Ordering::AcqRel)
    }

    /// The batch as sent once the records its verdicts remove are removed
    /// (every invalid record, unless the policy passes them), if a fetch
    /// spliced it so before: its pieces, the runs of kept records as
    /// ranges of this batch (whose length and CRC the entry matched).
    pub fn spliced(&self) -> Option<Rebuilt> {
        self.entry.spliced.lock().ok()?.clone()
    }

    /// Keep `rebuilt` as this batch spliced, dropping the oldest kept
    /// batches past the cache's budget (counted in [`Rebuilt::memory`]:
    /// new bytes, and ranges for the runs kept as they are).
    pub fn keep_spliced(&self, rebuilt: Rebuilt) {
        let len = rebuilt.memory();
        let Ok(mut store) = self.store.lock() else {
            return;
        };
        if len > store.budget {
            return;
        }
        match self.entry.spliced.lock() {
            Ok(mut s) if s.is_none() => *s = Some(rebuilt),
            _ => return,
        }
        store.bytes += len;
        store.order.push_back((Arc::downgrade(&self.entry), len));
        while store.bytes > store.budget {
            let Some((old, n)) = store.order.pop_front() else {
                break;
            };
            store.bytes -= n;
            if let Some(e) = old.upgrade() {
                if let Ok(mut s) = e.spliced.lock() {
                    *s = None;
                }
            }
        }
    }
}

impl VerdictCache {
    pub fn new(capacity: usize) -> Self {
        Self::with_spliced_budget(capacity, SPLICED_BUDGET)
    }

    pub fn with_spliced_budget(capacity: usize, spliced_budget: usize) -> Self {
        VerdictCache {
            map: DashMap::new(),
            capacity,
            spliced: Arc::new(Mutex::new(SplicedStore {
                budget: spliced_budget,
                ..SplicedStore::default()
            })),
        }
    }

    /// The entry of `batch` if it was judged before under `policy`; needs
    /// no decoding.
    pub fn lookup(
        &self,
        policy: &Arc<Policy>,
        topic: &Arc<str>,
        partition: i32,
        batch: &Batch,
    ) -> Option<Known> {
        let e = self
            .map
            .get(&(topic.clone(), partition, batch.base_offset()))?;
        if !e.matches(batch, policy) {
            return None;
        }
        let verdicts = e.invalid.get()?.as_ref().ok()?.clone();
        Some(self.known(e.clone(), verdicts))
    }

    /// The verdicts of a decoded batch: judged now, or taken from (or
    /// awaited from) a fetch that judges it at the same time. The flag says
    /// whether this call did the judging. `Err` when the batch's records
    /// cannot be read (a malformed record found as they are judged).
    pub fn judge(
        &self,
        policy: &Arc<Policy>,
        topic: &Arc<str>,
        partition: i32,
        batch: &Batch,
        decoded: &DecodedBatch,
        now_ms: i64,
    ) -> Result<(Known, bool), BatchError> {
        self.judge_as(policy, (topic, partition), (batch, decoded), now_ms, false)
    }

    /// [`VerdictCache::judge`] by a helper judging ahead of the planner:
    /// when this call judges, the entry is marked for the planner to claim
    /// (marked before the verdicts are visible, so no planner misses it).
    /// False also for a batch whose records cannot be read: its planner
    /// finds that out again and holds there.
    pub fn judge_ahead(
        &self,
        policy: &Arc<Policy>,
        (topic, partition): (&Arc<str>, i32),
        batch: &Batch,
        decoded: &DecodedBatch,
        now_ms: i64,
    ) -> bool {
        self.judge_as(policy, (topic, partition), (batch, decoded), now_ms, true)
            .is_ok_and(|(_, here)| here)
    }

    fn judge_as(
        &self,
        policy: &Arc<Policy>,
        (topic, partition): (&Arc<str>, i32),
        (batch, decoded): (&Batch, &DecodedBatch),
        now_ms: i64,
        ahead: bool,
    ) -> Result<(Known, bool), BatchError> {
        let key = (topic.clone(), partition, batch.base_offset());
        let entry = {
            if self.map.len() >= self.capacity {
                self.clear();
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
        let verdicts = entry
            .invalid
            .get_or_init(|| {
                judged_here = true;
                entry.ahead.store(ahead, Ordering::Release);
                let mut invalid = Vec::new();
                decoded.each_record(|index, r| {
                    if let Verdict::Invalid(v) = policy.judge_in(topic, r, now_ms) {
                        invalid.push(Judged {
                            index,
                            offset: r.offset,
                            invalid: v,
                        });
                    }
                })?;
                Ok(Arc::new(invalid))
            })
            .clone();
        // This entry, unless another fetch has replaced it since.
        let forget = || {
            let key = (topic.clone(), partition, batch.base_offset());
            self.map.remove_if(&key, |_, e| Arc::ptr_eq(e, &entry));
        };
        let verdicts = match verdicts {
            Ok(v) => v,
            Err(why) => {
                forget();
                return Err(why);
            }
        };
        // A `transient` verdict (the schema registry has not answered) is
        // never kept: the next fetch judges the batch again.
        if verdicts.iter().any(|j| j.invalid.class == Class::Transient) {
            forget();
        }
        Ok((self.known(entry, verdicts), judged_here))
    }

    fn known(&self, entry: Arc<Entry>, verdicts: Verdicts) -> Known {
        Known {
            entry,
            verdicts,
            store: self.spliced.clone(),
        }
    }

    /// Bytes of spliced batches currently accounted for.
    pub fn spliced_bytes(&self) -> usize {
        self.spliced.lock().map_or(0, |s| s.bytes)
    }

    /// Forget everything (after a policy reload, to free memory early).
    pub fn clear(&self) {
        self.map.clear();
        if let Ok(mut s) = self.spliced.lock() {
            s.bytes = 0;
            s.order.clear();
        }
    }
}
