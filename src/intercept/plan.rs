//! Planning one partition's records: which batches pass as they are, which
//! lose records, and which records go to a dead-letter topic. Pure: no I/O,
//! so it is unit-tested and fuzzed without sockets.
//!
//! Visibility comes first (protocol-notes §4): under READ_COMMITTED a
//! transactional batch of an aborted transaction is never surfaced to the
//! client, so it is neither judged nor dead-lettered; it is forwarded as it
//! is and the client drops it, as it would without the proxy.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::deadletter::Diversion;
use crate::intercept::verdicts::VerdictCache;
use crate::kafka::batch::{self, Batch, BatchError, DecodedBatch, Segment};
use crate::policy::{Action, Policy};

/// Which transactional batches the requesting consumer will see.
pub struct Visibility {
    read_committed: bool,
    /// (producer id, first offset), sorted by first offset.
    aborted: Vec<(i64, i64)>,
}

impl Visibility {
    pub fn new(
        read_committed: bool,
        aborted: Option<&[kafka_protocol::messages::fetch_response::AbortedTransaction]>,
    ) -> Self {
        let mut aborted: Vec<(i64, i64)> = aborted
            .unwrap_or_default()
            .iter()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect();
        aborted.sort_by_key(|a| a.1);
        Visibility { read_committed, aborted }
    }
}

/// Tracks aborted producers while walking batches in offset order, the way
/// the Java consumer does (CompletedFetch.consumeAbortedTransactionsUpTo).
struct AbortTracker<'a> {
    vis: &'a Visibility,
    next: usize,
    open: Vec<i64>,
}

impl<'a> AbortTracker<'a> {
    fn new(vis: &'a Visibility) -> Self {
        AbortTracker { vis, next: 0, open: Vec::new() }
    }

    /// Whether the client will drop `batch` as part of an aborted transaction.
    fn is_aborted(&mut self, batch: &Batch) -> bool {
        if !self.vis.read_committed {
            return false;
        }
        let last = batch.next_offset() - 1;
        while let Some(&(pid, first)) = self.vis.aborted.get(self.next) {
            if first > last {
                break;
            }
            self.open.push(pid);
            self.next += 1;
        }
        if batch.is_control() {
            // An abort marker closes its producer's aborted transaction; a
            // commit marker for a producer in the list cannot occur.
            self.open.retain(|&p| p != batch.producer_id());
            return false;
        }
        batch.is_transactional() && self.open.contains(&batch.producer_id())
    }
}

/// What happens to one segment of the records section.
enum SegmentPlan {
    /// Forwarded as the bytes that arrived.
    Keep { bytes: Bytes, base: i64 },
    /// Rebuilt without the records whose `keep` is false.
    Splice { batch: Batch, decoded: DecodedBatch, keep: Vec<bool> },
}

/// The plan for one partition of one Fetch response.
pub struct PartitionPlan {
    pub topic: Arc<str>,
    pub partition: i32,
    segments: Vec<SegmentPlan>,
    /// Records to write to dead-letter topics before the response is released.
    pub diversions: Vec<Diversion>,
    /// Counts for logs and metrics.
    pub stats: PlanStats,
}

/// What a plan found, for counting.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PlanStats {
    pub validated: u64,
    pub diverted: u64,
    pub dropped: u64,
    pub passed_invalid: u64,
    pub undecodable_batches: u64,
    pub cached_batches: u64,
}

impl PartitionPlan {
    /// Whether the records section must be rebuilt.
    pub fn changes_anything(&self) -> bool {
        self.segments.iter().any(|s| matches!(s, SegmentPlan::Splice { .. }))
    }

    /// Build the new records section. `held_from`: the lowest offset whose
    /// diversion failed; nothing at or after it is delivered, and the batch
    /// containing it ends just before it so the client fetches it again.
    pub fn apply(&self, held_from: Option<i64>) -> Result<Bytes, BatchError> {
        let cut = held_from.unwrap_or(i64::MAX);
        let mut out = BytesMut::new();
        for seg in &self.segments {
            match seg {
                SegmentPlan::Keep { bytes, base } => {
                    if *base >= cut {
                        break;
                    }
                    out.extend_from_slice(bytes);
                }
                SegmentPlan::Splice { batch, decoded, keep } => {
                    let base = batch.base_offset();
                    if base >= cut {
                        break;
                    }
                    let within = cut < batch.next_offset();
                    let spliced = batch::splice(batch, decoded, keep, within.then_some(cut))?;
                    out.extend_from_slice(&spliced);
                    if within {
                        break;
                    }
                }
            }
        }
        Ok(out.freeze())
    }
}

/// Plan one partition: judge (or recall) every visible record of every batch.
pub fn plan_partition(
    policy: &Arc<Policy>,
    topic: &Arc<str>,
    partition: i32,
    records: &Bytes,
    vis: &Visibility,
    now_ms: i64,
    cache: &VerdictCache,
) -> PartitionPlan {
    let mut plan = PartitionPlan {
        topic: topic.clone(),
        partition,
        segments: Vec::new(),
        diversions: Vec::new(),
        stats: PlanStats::default(),
    };
    let mut aborts = AbortTracker::new(vis);
    for seg in batch::segments(records) {
        let batch = match seg {
            Segment::Batch(b) => b,
            Segment::Legacy(bytes) => {
                let base = bytes.get(..8).map(|b| i64::from_be_bytes(b.try_into().unwrap_or([0; 8]))).unwrap_or(0);
                plan.segments.push(SegmentPlan::Keep { bytes, base });
                continue;
            }
            Segment::Partial(bytes) => {
                plan.segments.push(SegmentPlan::Keep { bytes, base: i64::MAX });
                continue;
            }
        };
        if batch.is_control() || aborts.is_aborted(&batch) {
            plan.segments.push(keep(&batch));
            continue;
        }
        let decoded = match batch.decode() {
            Ok(d) => d,
            Err(e) => {
                // A batch the proxy cannot read is forwarded: the client
                // would fail on it too, but dropping it would lose records.
                tracing::warn!(%topic, partition, base_offset = batch.base_offset(), error = %e,
                    "batch cannot be decoded; forwarded unfiltered");
                plan.stats.undecodable_batches += 1;
                plan.segments.push(keep(&batch));
                continue;
            }
        };
        let (invalid, cached) = cache.judge(policy, topic, partition, &batch, &decoded, now_ms);
        if cached {
            plan.stats.cached_batches += 1;
        } else {
            plan.stats.validated += decoded.len() as u64;
        }
        if invalid.is_empty() {
            plan.segments.push(keep(&batch));
            continue;
        }
        let mut keep_mask = vec![true; decoded.len()];
        let mut divert = vec![None; decoded.len()];
        for (index, verdict) in invalid.iter() {
            let Some(k) = keep_mask.get_mut(*index) else { continue };
            match policy.on_invalid {
                Action::Pass => plan.stats.passed_invalid += 1,
                Action::Drop => {
                    plan.stats.dropped += 1;
                    *k = false;
                }
                Action::Divert => {
                    *k = false;
                    divert[*index] = Some(verdict);
                }
            }
        }
        if divert.iter().any(Option::is_some) {
            for (record, verdict) in decoded.records().zip(&divert) {
                if let Some(verdict) = verdict {
                    plan.stats.diverted += 1;
                    plan.diversions.push(Diversion::new(policy, topic, partition, &record, verdict));
                }
            }
        }
        if keep_mask.iter().all(|k| *k) {
            plan.segments.push(keep(&batch));
        } else {
            plan.segments.push(SegmentPlan::Splice { batch, decoded, keep: keep_mask });
        }
    }
    plan
}

fn keep(batch: &Batch) -> SegmentPlan {
    SegmentPlan::Keep { bytes: batch.bytes().clone(), base: batch.base_offset() }
}
