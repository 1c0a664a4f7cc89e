//! Planning one partition's records: which batches pass as they are, which
//! lose records, and which records go to a dead-letter topic. Pure: no I/O,
//! so it is unit-tested and fuzzed without sockets.
//!
//! Fail closed: a batch that cannot be judged (it does not decode, it is a
//! legacy magic 0/1 message set, or the decode budget is spent) is never
//! forwarded unjudged. The plan stops there and holds the partition at that
//! batch's base offset: the client gets the records before it and fetches
//! it again. Undecodable and legacy batches stay held until an operator acts
//! (the `antidote_held_partitions` alert); a budget hold clears by itself.
//!
//! A judging deadline (`PartitionInput::deadline`, `limits.judge_deadline`)
//! may end a partition early, at a batch boundary, once it has delivered a
//! data batch (`Cut`): not a hold, since nothing is wrong there; the client
//! fetches the rest again, usually judged meanwhile (`judge_ahead`).
//!
//! Visibility comes first (docs/design/protocol-notes.md §4): under READ_COMMITTED a
//! transactional batch of an aborted transaction is never surfaced to the
//! client, so it is neither judged nor dead-lettered; it is forwarded as it
//! is and the client drops it, as it would without the proxy.

mod ahead;
pub mod budget;
mod keyed;
pub mod keys;
mod planner;
pub mod produce;
pub mod share;
mod undecodable;
pub mod verdicts;
mod visibility;

use std::sync::Arc;

use bytes::Bytes;

use crate::dlt_record::Diversion;
use crate::kafka::batch::{Batch, BatchError, DecodedBatch};
use crate::kafka::splice::{self, Rebuilt};
use crate::policy::{Action, Invalid, Policy};
use budget::Reservation;
use verdicts::Known;

pub use ahead::{judge_ahead, stretches};
pub use planner::{
    plan_partition, plan_partition_keyed, plan_partition_with, AlreadyDiverted, Env, PartitionInput,
};
pub use visibility::Visibility;

/// What happens to one segment of the records section.
enum SegmentPlan {
    /// Forwarded as the bytes that arrived.
    Keep { bytes: Bytes, base: i64 },
    /// Rebuilt without the records whose `keep` is false. `cache`: where
    /// to keep the result for later fetches, when `keep` removes exactly
    /// what the verdicts remove.
    Splice {
        batch: Batch,
        decoded: DecodedBatch,
        keep: Vec<bool>,
        cache: Option<Known>,
        /// The decode budget held by `decoded` until the plan is dropped.
        _memory: Option<Reservation>,
    },
    /// Spliced by an earlier fetch (nothing in it left to divert), or
    /// replaced whole: `rebuilt`'s pieces, its runs sliced from `batch`
    /// (the batch as it arrived); `next` is the batch's next offset.
    Spliced {
        batch: Bytes,
        rebuilt: Rebuilt,
        next: i64,
    },
}

/// An invalid record a plan does not write now, and what became of it:
/// its policy's action (`removes` tells a delivery whether it left the
/// batch). A record to write now is a `Diversion`; a `Divert` here was
/// written by an earlier fetch (any instance; batches resent as spliced).
#[derive(Debug, Clone)]
pub struct Settled {
    pub offset: i64,
    pub invalid: Invalid,
    pub action: Action,
}

/// The plan for one partition of one Fetch response.
pub struct PartitionPlan {
    pub topic: Arc<str>,
    pub partition: i32,
    pub policy: Arc<Policy>,
    segments: Vec<SegmentPlan>,
    /// Records to write to dead-letter topics before the response is released.
    pub diversions: Vec<Diversion>,
    /// Every other invalid record, in offset order within each batch, and
    /// its action: dropped, passed, or diverted by an earlier fetch (a
    /// batch diverted whole: its base offset).
    pub settled: Vec<Settled>,
    /// The offsets (`first..=last`) of each batch replaced whole because it
    /// cannot be decoded (`on_undecodable: divert`), diverted now or by an
    /// earlier fetch: a share consumer's proxy settles or withholds each
    /// as one, never part of it.
    pub whole_batches: Vec<(i64, i64)>,
    /// Keys released by replayed records delivered in this response
    /// (`ordering: per_key`), in offset order.
    pub releases: Vec<keys::Release>,
    /// Counts for logs and metrics.
    pub stats: PlanStats,
    /// The first batch that could not be judged: nothing from it on is
    /// delivered in this response.
    pub held: Option<Hold>,
    /// The base offset of the first data batch judged whole, and the last
    /// offset of the last one (the circuit breaker counts judged offsets).
    pub judged_from: Option<i64>,
    pub judged_to: Option<i64>,
    /// Where the judging deadline ended this partition (`PartitionInput::
    /// deadline`): nothing from there on is in this response, and the rest
    /// of the records section is left to judge in the background.
    pub cut: Option<Cut>,
}

/// A partition cut short by the judging deadline, at a batch boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The base offset of the first batch not delivered: the client's next
    /// fetch starts here.
    pub offset: i64,
    /// Where that batch starts in the records section.
    pub at: usize,
}

/// Where and why a partition is held because a batch could not be judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The base offset of the batch that could not be judged.
    pub offset: i64,
    pub reason: HoldReason,
}

impl Hold {
    /// A magic 0/1 message set is not judged: hold at its first offset.
    pub(crate) fn legacy(bytes: &Bytes) -> Hold {
        let base = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, i64::from_be_bytes);
        Hold {
            offset: base,
            reason: HoldReason::Legacy,
        }
    }
}

/// Why a batch could not be judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldReason {
    /// Corrupt (CRC), unknown codec, malformed records, or decompressing
    /// past the per-batch cap.
    Undecodable(String),
    /// A magic 0/1 message set: the proxy does not judge the legacy format.
    Legacy,
    /// The decode budget is spent by other responses in flight.
    Budget,
    /// Diverting the record would block one key more than
    /// [`keys::MAX_BLOCKED_KEYS_PER_PARTITION`] (`ordering: per_key`).
    BlockedKeys,
    /// The policy's diversion circuit breaker is open (`breaker:`).
    Breaker,
}

impl HoldReason {
    /// The `reason` label of `antidote_held_batches_total`.
    pub fn as_str(&self) -> &'static str {
        match self {
            HoldReason::Undecodable(_) => "undecodable",
            HoldReason::Legacy => "legacy",
            HoldReason::Budget => "budget",
            HoldReason::BlockedKeys => "blocked_keys",
            HoldReason::Breaker => "breaker",
        }
    }
}

impl std::fmt::Display for HoldReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HoldReason::Undecodable(e) => write!(f, "batch cannot be decoded: {e}"),
            HoldReason::Legacy => f.write_str("legacy (magic 0/1) message set"),
            HoldReason::Budget => f.write_str("decode budget spent by responses in flight"),
            HoldReason::Breaker => f.write_str("diversion circuit breaker open"),
            HoldReason::BlockedKeys => f.write_str("too many blocked keys in this partition"),
        }
    }
}

/// What a plan found, for counting.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PlanStats {
    /// Records judged in this response, verdicts from the cache included.
    pub judged: u64,
    /// Records validated now (not from the cache).
    pub validated: u64,
    pub undecodable_batches: u64,
    pub cached_batches: u64,
}

impl PartitionPlan {
    /// A plan that keeps nothing yet, for `input`'s partition.
    fn empty(input: &PartitionInput<'_>) -> Self {
        PartitionPlan {
            topic: input.topic.clone(),
            partition: input.partition,
            policy: input.policy.clone(),
            segments: Vec::new(),
            diversions: Vec::new(),
            settled: Vec::new(),
            whole_batches: Vec::new(),
            releases: Vec::new(),
            stats: PlanStats::default(),
            held: None,
            judged_from: None,
            judged_to: None,
            cut: None,
        }
    }

    /// The invalid records this plan meets with `action`: the diversions
    /// to write now (for an action that writes) and those settled with it.
    pub fn invalid_count(&self, action: Action) -> usize {
        let now = if action.writes() {
            self.diversions.len()
        } else {
            0
        };
        now + self.settled.iter().filter(|s| s.action == action).count()
    }

    /// Whether the records section must be rebuilt.
    pub fn changes_anything(&self) -> bool {
        self.held.is_some()
            || self.cut.is_some()
            || self
                .segments
                .iter()
                .any(|s| !matches!(s, SegmentPlan::Keep { .. }))
    }

    /// Where delivery must stop: the lower of this plan's own hold and
    /// `failed_from` (the first diversion that did not succeed).
    pub fn held_from(&self, failed_from: Option<i64>) -> Option<i64> {
        match (self.held.as_ref().map(|h| h.offset), failed_from) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Build the new records section. `held_from`: the lowest offset whose
    /// diversion failed; nothing at or after it is delivered, and the batch
    /// containing it ends just before it so the client fetches it again.
    pub fn apply(&self, held_from: Option<i64>) -> Result<Bytes, BatchError> {
        Ok(crate::kafka::splice::join(&self.apply_chunks(held_from)?))
    }

    /// [`Self::apply`] as the pieces of the new section, in order: kept
    /// batches as slices of the response (not copied) and spliced batches.
    /// The Fetch filter writes them out as they are.
    pub fn apply_chunks(&self, held_from: Option<i64>) -> Result<Vec<Bytes>, BatchError> {
        let cut = held_from.unwrap_or(i64::MAX);
        let mut out = Vec::with_capacity(self.segments.len());
        for seg in &self.segments {
            match seg {
                SegmentPlan::Keep { bytes, base } => {
                    // Without a hold everything kept goes out, the trailing
                    // partial batch included (its `base` is unknown).
                    if held_from.is_some() && *base >= cut {
                        break;
                    }
                    out.push(bytes.clone());
                }
                SegmentPlan::Splice {
                    batch,
                    decoded,
                    keep,
                    cache: slot,
                    ..
                } => {
                    let base = batch.base_offset();
                    if held_from.is_some() && base >= cut {
                        break;
                    }
                    let within = cut < batch.next_offset();
                    // Outside a hold a removed tail ends in a commit marker,
                    // so librdkafka's position reaches the batch's end.
                    let rebuilt = if within {
                        splice::splice_runs(batch, decoded, keep, Some(cut))?
                    } else {
                        crate::kafka::marker::splice_marking_tail_runs(batch, decoded, keep)?
                    };
                    out.extend(rebuilt.pieces(batch.bytes()));
                    if within {
                        break;
                    }
                    if let Some(known) = slot {
                        known.keep_spliced(rebuilt);
                    }
                }
                SegmentPlan::Spliced {
                    batch,
                    rebuilt,
                    next,
                } => {
                    // Holds are at records still to divert, never in here;
                    // should one be, the batch waits whole for the refetch.
                    if held_from.is_some() && cut < *next {
                        break;
                    }
                    out.extend(rebuilt.pieces(batch));
                }
            }
        }
        out.retain(|c| !c.is_empty());
        Ok(out)
    }
}

#[cfg(test)]
mod ahead_tests;
#[cfg(test)]
mod deadline_tests;
#[cfg(test)]
mod keys_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod transient_tests;
