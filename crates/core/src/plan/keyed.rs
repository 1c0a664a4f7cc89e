//! The planner's per-key step (`ordering: per_key`): a batch's diversions
//! queued in offset order, records parked behind their key's block, and
//! keys released by replayed records delivered here. The blocked keys
//! themselves are `keys`'s.

use std::ops::ControlFlow;

use bytes::Bytes;

use super::keys::{blocked_invalid, KeyOrder, KeyStep, KeyedRecord, Release};
use super::PartitionPlan;
use crate::dlt_record::Diversion;
use crate::kafka::batch::DecodedBatch;
use crate::kafka::record::Record;
use crate::policy::Invalid;

/// What per-key ordering did to one batch.
#[derive(Default)]
pub(super) struct KeyedOutcome {
    /// Some record was diverted because its key is blocked.
    pub(super) blocked_any: bool,
    /// The offset where a new block would pass the cap: held from here.
    pub(super) full_at: Option<i64>,
}

/// A delivered replayed record that carries `x-released-through` frees its
/// key for the rest of this response, and (once delivered) in the proxy.
fn note_release(
    plan: &mut PartitionPlan,
    order: &mut KeyOrder<'_>,
    record: &Record<'_>,
    through: Option<i64>,
) {
    let (Some(key), Some(through)) = (record.key, through) else {
        return;
    };
    if order.release(key, through) {
        plan.releases.push(Release {
            key: Bytes::copy_from_slice(key),
            through,
            offset: record.offset,
        });
    }
}

/// Queue the diversions of a per_key batch in offset order: records
/// diverted by their own verdict (starting a block on their key), and
/// records still to deliver (or diverted) whose key is blocked. Stops at a
/// record whose block would pass the cap (`out.full_at`).
pub(super) fn divert_keyed(
    plan: &mut PartitionPlan,
    decoded: &DecodedBatch,
    (keep_mask, earlier): (&mut [bool], &[i64]),
    divert: &[Option<&Invalid>],
    order: &mut KeyOrder<'_>,
    out: &mut KeyedOutcome,
) {
    // The planner read every record of these bytes before (judging or
    // checking them), so this walk over the same bytes cannot fail.
    let _ = decoded.try_each_record(|i, record| {
        let own = divert.get(i).copied().flatten();
        let live = keep_mask.get(i).copied().unwrap_or(false);
        if earlier.binary_search(&record.offset).is_ok() {
            return already_diverted(plan, record, own, order, out);
        }
        if !live && own.is_none() {
            return ControlFlow::Continue(()); // dropped
        }
        let homecoming = order.homecoming(record, &plan.topic, plan.partition);
        let replayed = homecoming.is_some();
        let step = order.step(&KeyedRecord {
            key: record.key,
            offset: record.offset,
            diverted: own.map(|v| v.class),
            replayed,
        });
        let (verdict, blocked_by, class) = match step {
            KeyStep::Full => {
                out.full_at = Some(record.offset);
                return ControlFlow::Break(());
            }
            KeyStep::Free => match own {
                Some(v) => (v.clone(), None, v.class),
                None => {
                    if let Some(through) = homecoming {
                        note_release(plan, order, record, through);
                    }
                    return ControlFlow::Continue(());
                }
            },
            KeyStep::Blocked(b) => {
                out.blocked_any = true;
                (blocked_invalid(b, own), Some(b.first), b.class)
            }
        };
        if let Some(k) = keep_mask.get_mut(i) {
            *k = false;
        }
        let mut d = Diversion::new(&plan.policy, &plan.topic, plan.partition, record, &verdict);
        // Parked records go where their key's first record went.
        d.dlt_topic = plan.policy.dead_letter_topic(&plan.topic, class);
        d.blocked_by = blocked_by;
        plan.diversions.push(d);
        ControlFlow::Continue(())
    });
}

/// A record in its DLT already: re-queue its diversion (the ledger finds
/// it done; the plain path settles it instead). Invalid by its own
/// verdict, it still blocks its key from here unless a release covers it:
/// the blocked-key set may not know of it yet (the ledger records a write,
/// or one found in the DLT, before the set learns the key), and a later
/// record of the key must not pass meanwhile (Jepsen seed 579903503 saw
/// one pass). `Break` where that block would pass the cap (`out.full_at`).
fn already_diverted(
    plan: &mut PartitionPlan,
    record: &Record<'_>,
    own: Option<&Invalid>,
    order: &mut KeyOrder<'_>,
    out: &mut KeyedOutcome,
) -> ControlFlow<()> {
    let Some(v) = own else {
        return ControlFlow::Continue(());
    };
    if !order.released(record.key, record.offset) {
        let step = order.step(&KeyedRecord {
            key: record.key,
            offset: record.offset,
            diverted: Some(v.class),
            replayed: false,
        });
        if step == KeyStep::Full {
            out.full_at = Some(record.offset);
            return ControlFlow::Break(());
        }
    }
    let d = Diversion::new(&plan.policy, &plan.topic, plan.partition, record, v);
    plan.diversions.push(d);
    ControlFlow::Continue(())
}
