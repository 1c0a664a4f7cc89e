//! A Fetch's partition held at a `transient` record, one whose schema the
//! registry has not given even after the pipeline asked again
//! (`pipeline.rs: resolve_transient`; registry down, 5xx, timeout): it
//! holds its partition exactly as a failed DLT write does. Records before
//! it are delivered, nothing at or after it, and the partition resumes by
//! itself on a later fetch once the registry answers. A transient record
//! is never written to a DLT.

use tracing::warn;

use super::Holds;
use crate::metrics::Observation;
use crate::plan::PartitionPlan;

/// Where delivery stops: the lower of the first failed diversion and the
/// first transient record; a transient hold is noted (`note_hold`).
pub(super) fn hold_from(
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
