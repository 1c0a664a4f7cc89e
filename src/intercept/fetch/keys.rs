//! What a Fetch plan teaches the blocked-key set (`ordering: per_key`):
//! the keys of acknowledged diversions are parked, and keys whose replayed
//! records were delivered are released. Only what lies before the plan's
//! hold counts: past it nothing was diverted or delivered.

use crate::clock::now_ms;
use crate::dlt::blocked::{head_class, BlockedKeys, Parked};
use crate::plan::PartitionPlan;
use crate::policy::KeyOrdering;

/// Apply `plan`'s parked keys and releases before `held_from`.
pub(super) fn learn(set: &BlockedKeys, plan: &PartitionPlan, held_from: Option<i64>) {
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
