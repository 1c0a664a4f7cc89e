//! `transient` verdicts in a Fetch response: records whose schema the
//! registry has not given yet. After planning, what the judges asked for
//! is fetched (bounded by the registry's `timeout`, or 200 ms while it is
//! known to be down) and the partitions
//! concerned are planned again. A record still `transient` then (registry
//! down, 5xx, timeout) holds its partition exactly as a failed DLT write
//! does: records before it are delivered, nothing at or after it, and the
//! partition resumes by itself on a later fetch once the registry answers.
//! A transient record is never written to a DLT.

use std::sync::Arc;

use tracing::warn;

use super::{FetchFilter, FilterError, Holds, PartitionJob};
use crate::metrics::Observation;
use crate::plan::PartitionPlan;
use crate::policy::Class;
use crate::registry::Registry;

/// Rounds of fetch-then-replan per response: the second covers a subject
/// list asked for only once the schema was known.
const ROUNDS: usize = 2;

fn has_transient(plan: &PartitionPlan) -> bool {
    plan.diversions
        .iter()
        .any(|d| d.invalid.class == Class::Transient)
}

impl FetchFilter {
    /// Resolve registry misses of `planned` and plan those partitions again.
    pub(super) async fn resolve_transient(
        &self,
        registry: &Arc<Registry>,
        jobs: &[Arc<PartitionJob>],
        planned: &mut [((usize, usize), PartitionPlan)],
        now_ms: i64,
    ) -> Result<(), FilterError> {
        let deadline = tokio::time::Instant::now() + registry.wait();
        for _ in 0..ROUNDS {
            if !planned.iter().any(|(_, p)| has_transient(p)) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !registry.resolve_wants(left).await {
                return Ok(());
            }
            for (at, plan) in planned.iter_mut() {
                if !has_transient(plan) {
                    continue;
                }
                if let Some(job) = jobs.iter().find(|j| j.at == *at) {
                    *plan = job.plan(
                        now_ms,
                        &self.engine.verdicts,
                        &self.engine.budget,
                        &self.dead_letter,
                    );
                }
            }
        }
        Ok(())
    }
}

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
