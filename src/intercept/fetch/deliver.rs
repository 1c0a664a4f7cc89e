//! How a Fetch delivers a judged partition, by offset: where it is held
//! (a diversion not acknowledged in time, a `transient` record, an open
//! breaker's cut, a batch that cannot be judged), what the blocked-key
//! set learns, the records section the client gets, and what it counted.
//!
//! A `transient` record is one whose schema the registry has not given
//! even after the pipeline asked again (`pipeline.rs: resolve_transient`;
//! registry down, 5xx, timeout): it holds its partition exactly as a
//! failed DLT write does. Records before it are delivered, nothing at or
//! after it, and the partition resumes by itself on a later fetch once the
//! registry answers. A transient record is never written to a DLT.
//!
//! One client connection remembers where its partitions were held
//! ([`Holds`]), so a repeated hold at the same offset sends no records.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tracing::warn;

use super::pipeline::Postponed;
use crate::clock::now_ms;
use crate::dlt::blocked::{head_class, BlockedKeys, Parked};
use crate::kafka::batch::BatchError;
use crate::metrics::{Judged, Observation};
use crate::plan::PartitionPlan;
use crate::policy::KeyOrdering;

/// Deliver `plan` once its diversions are done (`failed`: the offsets of
/// those not acknowledged in time; `transient`: its first transient
/// record's): held where it must be, its keys learnt, its records section.
pub(super) fn deliver(
    holds: &mut Holds,
    blocked: &BlockedKeys,
    plan: &PartitionPlan,
    (failed, transient): (&[i64], Option<i64>),
    seen: &mut Observation,
) -> Result<Vec<Bytes>, BatchError> {
    let failed_from = hold_from(holds, plan, failed.first().copied(), transient, seen);
    let held_from = plan.held_from(failed_from);
    learn_keys(blocked, plan, held_from);
    apply_outcome(holds, plan, (failed_from, held_from), seen)
}

/// Partitions this connection has been answered with a hold, and where.
///
/// The first time a partition is held at offset C, the client gets the
/// records before C (it may not have them yet). Held at the same C again,
/// the client is already at C, so it gets no records at all: an answer
/// whose records all lie below the fetch offset looks to librdkafka like a
/// record too large to fetch (it doubles its fetch size and ends in
/// MSG_SIZE_TOO_LARGE), whereas no records is an ordinary "nothing new".
#[derive(Debug, Default)]
pub struct Holds {
    at: HashMap<(Arc<str>, i32), i64>,
}

impl Holds {
    /// Record a hold at `offset`; whether records before it should be sent.
    fn hold(&mut self, topic: &Arc<str>, partition: i32, offset: i64) -> bool {
        self.at.insert((topic.clone(), partition), offset) != Some(offset)
    }

    fn release(&mut self, topic: &Arc<str>, partition: i32) {
        if !self.at.is_empty() {
            self.at.remove(&(topic.clone(), partition));
        }
    }
}

/// Where delivery stops: the lower of the first failed diversion and the
/// first transient record; a transient hold is noted (`note_hold`).
fn hold_from(
    holds: &Holds,
    plan: &PartitionPlan,
    failed_from: Option<i64>,
    transient: Option<i64>,
    seen: &mut Observation,
) -> Option<i64> {
    let Some(t) = transient else {
        return failed_from;
    };
    note_hold(holds, plan, t, seen);
    Some(failed_from.map_or(t, |f| f.min(t)))
}

/// Count a transient hold and log it once per hold (per connection and
/// offset), never with the record's contents.
fn note_hold(holds: &Holds, plan: &PartitionPlan, offset: i64, seen: &mut Observation) {
    let (topic, partition) = (&*plan.topic, plan.partition);
    (seen.held_batches).push((plan.topic.clone(), partition, "transient"));
    if holds.at.get(&(plan.topic.clone(), partition)) != Some(&offset) {
        warn!(
            topic,
            partition,
            offset,
            policy = %plan.policy.name,
            "schema registry has not answered for this record's schema: partition held at it"
        );
    }
}

/// Where a Fetch holds for what was postponed: at an open breaker's cut
/// (`plan.held`), and at a transient verdict before it (returned: noted
/// when the hold is applied). No diversion from either on is written.
pub(super) fn hold_postponed(plan: &mut PartitionPlan, postponed: &[Postponed]) -> Option<i64> {
    let first = |why: &str| {
        (postponed.iter())
            .find(|(_, r)| *r == why)
            .map(|((o, _), _)| *o)
    };
    let cut = first("breaker");
    let transient = first("transient").filter(|t| cut.is_none_or(|c| *t < c));
    if let Some(cut) = cut {
        if plan.held.as_ref().is_none_or(|h| h.offset > cut) {
            plan.held = Some(crate::plan::Hold {
                offset: cut,
                reason: crate::plan::HoldReason::Breaker,
            });
        }
    }
    if let Some(stop) = transient.or(cut) {
        plan.diversions.retain(|d| d.origin_offset < stop);
    }
    transient
}

/// The records section a changed partition gets, once its diversions are
/// done: everything planned, or (when held from `held_from`, here or by a
/// failed diversion from `failed_from`) what comes before the hold, if
/// this connection may receive it.
fn apply_outcome(
    holds: &mut Holds,
    plan: &PartitionPlan,
    (failed_from, held_from): (Option<i64>, Option<i64>),
    seen: &mut Observation,
) -> Result<Vec<Bytes>, BatchError> {
    log_hold(plan, failed_from, seen);
    seen.partitions.push(count(plan, held_from));
    (seen.held).push((plan.topic.clone(), plan.partition, held_from.is_some()));
    match held_from {
        None => {
            holds.release(&plan.topic, plan.partition);
            plan.apply_chunks(None)
        }
        Some(offset) if holds.hold(&plan.topic, plan.partition, offset) => {
            plan.apply_chunks(Some(offset))
        }
        Some(_) => Ok(Vec::new()),
    }
}

/// Say why a partition is held: a batch that could not be judged (counted
/// by reason) or a diversion that was not acknowledged in time.
fn log_hold(plan: &PartitionPlan, failed_from: Option<i64>, seen: &mut Observation) {
    let (topic, partition) = (&*plan.topic, plan.partition);
    if let Some(h) = &plan.held {
        (seen.held_batches).push((plan.topic.clone(), partition, h.reason.as_str()));
        warn!(topic, partition, offset = h.offset, reason = %h.reason,
            "batch cannot be judged: partition held at it");
    }
    if let Some(offset) = failed_from {
        warn!(
            topic,
            partition, offset, "dead-letter write failed: partition held before this offset"
        );
    }
}

/// Count what a plan judged. Diversions count once acknowledged; those
/// at or past a hold are judged again on the next fetch. Holds are the
/// caller's to report: only a Fetch holds a partition
/// (`antidote_held_partitions`); a ShareFetch withholds records
/// (`antidote_share_withheld_records_total`), and must not clear a hold a
/// Fetch of the same partition has.
pub(super) fn count(plan: &PartitionPlan, held_from: Option<i64>) -> Judged {
    let held_back = (plan.diversions.iter())
        .filter(|d| held_from.is_some_and(|h| d.origin_offset >= h))
        .count() as u64;
    let invalid = (plan.diversions.len() + plan.settled.len()) as u64;
    let counted = |o: i64| held_from.is_none_or(|h| o < h);
    Judged::of(
        plan,
        plan.stats.judged.saturating_sub(held_back),
        plan.stats.judged.saturating_sub(invalid),
        |o, is_diversion| !is_diversion || counted(o),
    )
}

/// Apply `plan`'s parked keys and releases before `held_from`
/// (`ordering: per_key`): the keys of acknowledged diversions are parked,
/// and keys whose replayed records were delivered are released. Past the
/// hold nothing was diverted or delivered.
pub(super) fn learn_keys(set: &BlockedKeys, plan: &PartitionPlan, held_from: Option<i64>) {
    if plan.policy.ordering != KeyOrdering::PerKey {
        return;
    }
    let before = |o: i64| held_from.is_none_or(|h| o < h);
    let (topic, partition) = (&*plan.topic, plan.partition);
    let at_ms = now_ms();
    for d in plan.diversions.iter().filter(|d| before(d.origin_offset)) {
        let Some(key) = d.key.as_deref() else {
            continue;
        };
        let class = head_class(&plan.policy, topic, &d.dlt_topic, d.invalid.class);
        let parked = Parked {
            key,
            offset: d.origin_offset,
            class,
            blocked_by: d.blocked_by,
            at_ms,
        };
        set.parked(topic, partition, &parked);
    }
    for r in plan.releases.iter().filter(|r| before(r.offset)) {
        set.release(topic, partition, &r.key, r.through);
    }
}
