//! Batches that cannot be decoded (corrupt, unknown codec, over the
//! decompression cap): never forwarded unjudged, never dropped, but
//! diverted whole (`on_undecodable: divert`: one DLT record of the raw
//! bytes, an empty batch and a commit marker in its place) or held.

use std::ops::ControlFlow;

use super::{Hold, HoldReason, PartitionPlan, SegmentPlan, Settled};
use crate::dlt_record::Diversion;
use crate::kafka::batch::Batch;
use crate::kafka::splice::Rebuilt;
use crate::policy::{Action, Undecodable};

/// A batch that cannot be decoded is never forwarded unjudged, never
/// dropped: diverted whole (if the policy says so) or held here.
pub(super) fn plan_undecodable(
    plan: &mut PartitionPlan,
    batch: &Batch,
    reason: HoldReason,
    earlier: &[i64],
) -> ControlFlow<()> {
    if let HoldReason::Undecodable(why) = &reason {
        plan.stats.undecodable_batches += 1;
        if plan.policy.on_undecodable == Undecodable::Divert {
            if let Some(seg) = divert_whole(plan, batch, why, earlier) {
                plan.segments.push(seg);
                return ControlFlow::Continue(());
            }
        }
    }
    plan.held = Some(Hold {
        offset: batch.base_offset(),
        reason,
    });
    ControlFlow::Break(())
}

/// Plan `batch`, which cannot be decoded, as diverted whole: one DLT record
/// holding its raw bytes (unless an earlier fetch wrote it: its base offset
/// is in the ledger), and an empty batch plus a commit marker in its place.
/// `None` if even its header is unusable for that (then it is held).
fn divert_whole(
    plan: &mut PartitionPlan,
    batch: &Batch,
    why: &str,
    earlier: &[i64],
) -> Option<SegmentPlan> {
    let bytes = crate::kafka::marker::replace_whole(batch).ok()?;
    let reason = format!("batch cannot be decoded: {why}");
    let d = Diversion::whole_batch(&plan.policy, &plan.topic, plan.partition, batch, reason);
    plan.whole_batches
        .push((batch.base_offset(), batch.last_offset()));
    if earlier.contains(&batch.base_offset()) {
        plan.settled.push(Settled {
            offset: batch.base_offset(),
            invalid: d.invalid,
            action: Action::Divert,
        });
    } else {
        tracing::warn!(topic = %plan.topic, partition = plan.partition,
            base_offset = batch.base_offset(), last_offset = batch.last_offset(),
            error = why, "batch cannot be decoded: diverted whole");
        plan.diversions.push(d);
    }
    Some(SegmentPlan::Spliced {
        batch: batch.bytes().clone(),
        rebuilt: Rebuilt::whole(bytes),
        next: batch.next_offset(),
    })
}
