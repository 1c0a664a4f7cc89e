//! The planner: walks one partition's batches in offset order and decides,
//! batch by batch, keep / splice / resend as spliced / divert whole / hold.
//! Each step is one function below; `plan_partition_with` only dispatches.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::budget::{decode_within, DecodeBudget, Reservation};
use super::keyed::{divert_keyed, KeyedOutcome};
use super::keys::{KeyGate, KeyOrder, NoKeys};
use super::undecodable::plan_undecodable;
use super::verdicts::{Judged, Known, VerdictCache};
use super::visibility::{AbortTracker, Visibility};
use super::{Cut, Hold, HoldReason, PartitionPlan, SegmentPlan, Settled};
use crate::dlt_record::Diversion;
use crate::kafka::batch::{self, Batch, BatchError, DecodedBatch, Segment};
use crate::kafka::splice::Rebuilt;
use crate::policy::{Action, Class, Invalid, KeyOrdering, Policy};

/// One partition of a Fetch response, as the planner sees it.
pub struct PartitionInput<'a> {
    pub policy: &'a Arc<Policy>,
    pub topic: &'a Arc<str>,
    pub partition: i32,
    /// The partition's records section, as the broker sent it.
    pub records: &'a Bytes,
    pub visibility: &'a Visibility,
    /// Wall clock for staleness rules, in milliseconds since the epoch.
    pub now_ms: i64,
    /// When judging should stop (`limits.judge_deadline`): past it, the
    /// partition ends before the next batch that still needs judging, once
    /// it has delivered one (`PartitionPlan::cut`).
    pub deadline: Option<Instant>,
}

/// Offsets in `from..to` already in a dead-letter topic.
pub type AlreadyDiverted<'a> = &'a dyn Fn(i64, i64) -> Vec<i64>;

/// What planning consults besides the records: verdicts reached before, the
/// shared decode budget, and the ledger of records already diverted.
pub struct Env<'a> {
    pub verdicts: &'a VerdictCache,
    pub budget: &'a Arc<DecodeBudget>,
    pub already: AlreadyDiverted<'a>,
}

/// Plan one partition: judge (or recall) every visible record of every
/// batch, with no ledger and no decode budget.
pub fn plan_partition(input: &PartitionInput<'_>, cache: &VerdictCache) -> PartitionPlan {
    let env = Env {
        verdicts: cache,
        budget: &DecodeBudget::unlimited(),
        already: &|_, _| Vec::new(),
    };
    plan_partition_with(input, &env)
}

/// `plan_partition`, also removing records diverted earlier even if the
/// current policy finds them valid: once a record is in its DLT, that is its
/// home (a fixed copy comes back through `dlt replay`), so a policy fix does
/// not make the original reappear next to its replayed copy.
pub fn plan_partition_with(input: &PartitionInput<'_>, env: &Env<'_>) -> PartitionPlan {
    plan_partition_keyed(input, env, &NoKeys)
}

/// `plan_partition_with` under the partition's blocked keys `gate`: with
/// `ordering: per_key`, a record whose key is blocked is diverted too
/// (class `blocked`), and so is a later record of a key diverted here.
/// `gate` is not looked at for other policies.
pub fn plan_partition_keyed(
    input: &PartitionInput<'_>,
    env: &Env<'_>,
    gate: &dyn KeyGate,
) -> PartitionPlan {
    let mut plan = PartitionPlan::empty(input);
    let mut order = (input.policy.ordering == KeyOrdering::PerKey).then(|| KeyOrder::new(gate));
    let mut aborts = AbortTracker::new(input.visibility);
    let mut at = 0;
    for seg in batch::segments(input.records) {
        let start = at;
        at += seg.bytes().len();
        let step = match seg {
            // is_aborted first: it must see the abort markers (control batches).
            // An aborted transaction's batch in a READ_COMMITTED response is
            // neither judged nor diverted (it was never committed) and goes
            // out as it came: the client asked for read_committed and drops
            // it by the abort list beside it (emptying it instead would
            // leave librdkafka an empty batch it may not step past when it
            // ends a response; see kafka::marker).
            Segment::Batch(b)
                if aborts.is_aborted(&b)
                    || b.is_control()
                    || input.visibility.deleted(b.last_offset()) =>
            {
                plan.segments.push(keep(&b));
                ControlFlow::Continue(())
            }
            Segment::Batch(b) => {
                let (base, last) = (b.base_offset(), b.last_offset());
                let step = plan_batch(&mut plan, input, env, order.as_mut(), (b, start));
                if step.is_continue() {
                    plan.judged_from.get_or_insert(base);
                    plan.judged_to = Some(last);
                }
                step
            }
            Segment::Legacy(bytes) => {
                plan.held = Some(Hold::legacy(&bytes));
                ControlFlow::Break(())
            }
            Segment::Partial(bytes) => {
                plan.segments.push(SegmentPlan::Keep {
                    bytes,
                    base: i64::MAX,
                });
                ControlFlow::Continue(())
            }
        };
        if step.is_break() {
            break;
        }
    }
    plan
}

/// Whether the judging deadline has passed and this partition has
/// delivered a data batch (so the client moves on).
fn out_of_time(plan: &PartitionPlan, input: &PartitionInput<'_>) -> bool {
    plan.judged_to.is_some() && input.deadline.is_some_and(|d| Instant::now() >= d)
}

/// Plan one visible data batch, `start` bytes into the records section.
/// `Break` when the partition is held or cut here.
fn plan_batch(
    plan: &mut PartitionPlan,
    input: &PartitionInput<'_>,
    env: &Env<'_>,
    order: Option<&mut KeyOrder<'_>>,
    (batch, start): (Batch, usize),
) -> ControlFlow<()> {
    // A batch judged before (another consumer group, a re-fetch) with
    // nothing to remove passes without even being decoded; one whose
    // removals are all done may be sent as spliced before.
    let earlier = (env.already)(batch.base_offset(), batch.next_offset());
    let keyed = order.as_ref().is_some_and(|o| o.active());
    let (known, unread) = cached_verdicts(input, env, &batch, &earlier, (order.is_none(), keyed));
    // Past the judging deadline, a batch still to judge is left for the
    // client's next fetch; one whose verdicts are known still goes out.
    if known.is_none() && out_of_time(plan, input) {
        plan.cut = Some(Cut {
            offset: batch.base_offset(),
            at: start,
        });
        return ControlFlow::Break(());
    }
    // Verdicts a helper of this fetch reached count as reached here.
    let mut ahead = false;
    if let Some(k) = known.as_ref().filter(|_| unread) {
        ahead = count_known(plan, k, batch.records_count().max(0) as u64);
        if let Some(seg) = plan_from_cache(plan, &batch, k, &earlier) {
            plan.segments.push(seg);
            return ControlFlow::Continue(());
        }
    }
    let (decoded, memory) = match decode_within(&batch, env.budget) {
        Ok(d) => d,
        Err(reason) => return plan_undecodable(plan, &batch, reason, &earlier),
    };
    // Known verdicts of a batch read only now count once its CRC held.
    if let Some(k) = known.as_ref().filter(|_| !unread) {
        ahead = count_known(plan, k, batch.records_count().max(0) as u64);
    }
    // Judging reads the records for the first time: a malformed one is
    // found there. Verdicts from the cache were reached on these bytes,
    // but this copy's records are still read (once) before any is used.
    let judged = match known {
        Some(k) => decoded.check().map(|()| (k, !ahead)),
        None => judge_now(plan, input, env.verdicts, &batch, &decoded),
    };
    let (known, cached) = match judged {
        Ok(j) => j,
        Err(e) => {
            let reason = HoldReason::Undecodable(e.to_string());
            return plan_undecodable(plan, &batch, reason, &earlier);
        }
    };
    let invalid = known.verdicts().clone();
    if invalid.is_empty() && earlier.is_empty() && !keyed {
        plan.segments.push(keep(&batch));
        return ControlFlow::Continue(());
    }
    let decided = Decided {
        decoded,
        memory,
        known,
        cached,
        invalid,
    };
    plan_removals(plan, input, batch, decided, &earlier, order)
}

/// The verdicts the cache holds for `batch`, if they stand for these
/// bytes, and whether the batch may be answered for unread. A verdict was
/// reached on the bytes judged then: it stands for these only if their CRC
/// holds (a corrupt copy is decoded, fails and is held, never passed on the
/// good copy's verdict). A batch the cache may answer for unread has its
/// CRC read here; under per_key (`unkeyed` false) a batch with removals is
/// read record by record (which records its blocks take depends on keys,
/// not on the cache), and its decode reads the CRC, once.
fn cached_verdicts(
    input: &PartitionInput<'_>,
    env: &Env<'_>,
    batch: &Batch,
    earlier: &[i64],
    (unkeyed, keyed): (bool, bool),
) -> (Option<Known>, bool) {
    let (policy, topic, partition) = (input.policy, input.topic, input.partition);
    match env.verdicts.lookup(policy, topic, partition, batch) {
        Some(k) => {
            let plain = k.verdicts().is_empty() && earlier.is_empty() && !keyed;
            let unread = unkeyed || plain;
            (Some(k).filter(|_| !unread || batch.crc_valid()), unread)
        }
        None => (None, false),
    }
}

/// A decoded batch with its verdicts (`cached`: reached by an earlier
/// fetch), the budget its decoding holds, and its invalid records.
struct Decided {
    decoded: DecodedBatch,
    memory: Option<Reservation>,
    known: Known,
    cached: bool,
    invalid: Arc<Vec<Judged>>,
}

/// Plan a judged batch with something to remove (or keys to watch): kept,
/// or spliced without what its verdicts and the key order remove (kept
/// for later fetches when it removes exactly what the verdicts do); `Break`
/// when the partition's blocked keys are full here.
fn plan_removals(
    plan: &mut PartitionPlan,
    input: &PartitionInput<'_>,
    batch: Batch,
    d: Decided,
    earlier: &[i64],
    order: Option<&mut KeyOrder<'_>>,
) -> ControlFlow<()> {
    let Decided {
        decoded,
        memory,
        known,
        cached,
        invalid,
    } = d;
    let policy = input.policy;
    // Records below the log start are deleted: never judged into a DLT (a
    // batch cut by DeleteRecords or retention still comes whole).
    let visible = input.visibility.not_deleted(&invalid);
    let (keep_mask, keyed_out) = apply_verdicts(plan, &decoded, &visible, earlier, cached, order);
    if keep_mask.iter().all(|k| *k) {
        plan.segments.push(keep(&batch));
    } else {
        // Worth keeping for later fetches only if it removes exactly
        // what the verdicts remove (not also records diverted under an
        // earlier policy).
        let exact = policy.on_invalid.removes()
            && visible.len() == invalid.len()
            && !keyed_out.blocked_any
            && keyed_out.full_at.is_none()
            && earlier
                .iter()
                .all(|o| invalid.iter().any(|j| j.offset == *o));
        plan.segments.push(SegmentPlan::Splice {
            batch,
            decoded,
            keep: keep_mask,
            cache: exact.then_some(known),
            _memory: memory,
        });
    }
    match keyed_out.full_at {
        Some(offset) => {
            plan.held = Some(Hold {
                offset,
                reason: HoldReason::BlockedKeys,
            });
            ControlFlow::Break(())
        }
        None => ControlFlow::Continue(()),
    }
}

/// A batch whose verdicts are cached (and counted): `Some` when it needs
/// no decoding (nothing to remove, or resent as spliced before).
fn plan_from_cache(
    plan: &mut PartitionPlan,
    batch: &Batch,
    known: &Known,
    earlier: &[i64],
) -> Option<SegmentPlan> {
    if known.verdicts().is_empty() && earlier.is_empty() {
        return Some(keep(batch));
    }
    let rebuilt = resend_spliced(plan, known, earlier, batch.bytes().len())?;
    Some(SegmentPlan::Spliced {
        batch: batch.bytes().clone(),
        rebuilt,
        next: batch.next_offset(),
    })
}

/// Judge a decoded batch (or find another fetch's verdicts reached while
/// it was decoding). Returns the verdicts and whether they were cached;
/// `Err` for a batch whose records cannot be read.
fn judge_now(
    plan: &mut PartitionPlan,
    input: &PartitionInput<'_>,
    cache: &VerdictCache,
    batch: &Batch,
    decoded: &DecodedBatch,
) -> Result<(Known, bool), BatchError> {
    let (k, judged_here) = cache.judge(
        input.policy,
        input.topic,
        input.partition,
        batch,
        decoded,
        input.now_ms,
    )?;
    let fresh = if judged_here {
        plan.stats.judged += decoded.len() as u64;
        plan.stats.validated += decoded.len() as u64;
        true
    } else {
        count_known(plan, &k, decoded.len() as u64)
    };
    Ok((k, !fresh))
}

/// Counts `records` judged by verdicts found in the cache: validated now
/// (true) if a helper of this fetch judged them ahead (`judge_ahead`),
/// else recalled from an earlier judgement.
fn count_known(plan: &mut PartitionPlan, known: &Known, records: u64) -> bool {
    plan.stats.judged += records;
    let ahead = known.claim_judged_ahead();
    if ahead {
        plan.stats.validated += records;
    } else {
        plan.stats.cached_batches += 1;
    }
    ahead
}

/// Which records of `decoded` stay: not those diverted earlier, not the
/// invalid ones the policy drops or diverts, not those whose key is blocked
/// (`order`, per_key only). Counts them, queues the diversions, and logs
/// invalid records not diverted (once, when judged).
fn apply_verdicts(
    plan: &mut PartitionPlan,
    decoded: &DecodedBatch,
    invalid: &[Judged],
    earlier: &[i64],
    cached: bool,
    order: Option<&mut KeyOrder<'_>>,
) -> (Vec<bool>, KeyedOutcome) {
    // Offsets are read only when some were diverted before.
    let mut keep_mask: Vec<bool> = if earlier.is_empty() {
        vec![true; decoded.len()]
    } else {
        (0..decoded.len())
            .map(|i| (decoded.offset(i)).is_none_or(|o| earlier.binary_search(&o).is_err()))
            .collect()
    };
    let action = plan.policy.on_invalid;
    let divert = sort_invalid(plan, invalid, earlier, &mut keep_mask, order.is_some());
    if !cached && !action.writes() {
        log_not_diverted(plan, invalid);
    }
    let mut out = KeyedOutcome::default();
    if let Some(order) = order {
        let mut by_index: Vec<Option<&Invalid>> = vec![None; decoded.len()];
        for &(i, verdict) in &divert {
            by_index[i] = Some(verdict);
        }
        divert_keyed(
            plan,
            decoded,
            (&mut keep_mask, earlier),
            &by_index,
            order,
            &mut out,
        );
    } else {
        // Only the diverted records are read again (issue 30: a record
        // read for every one cost ~400 instructions).
        for &(i, verdict) in &divert {
            if let Some(record) = decoded.record(i) {
                let d = Diversion::new(&plan.policy, &plan.topic, plan.partition, &record, verdict);
                plan.diversions.push(d);
            }
        }
    }
    (keep_mask, out)
}

/// Take `invalid` out of `keep_mask` as the policy's action says: the
/// records to divert now, in batch order (as `invalid` is); the others
/// settled (`keyed`: per key, a record in its DLT already is the keyed
/// walk's to settle).
fn sort_invalid<'j>(
    plan: &mut PartitionPlan,
    invalid: &'j [Judged],
    earlier: &[i64],
    keep_mask: &mut [bool],
    keyed: bool,
) -> Vec<(usize, &'j Invalid)> {
    let mut divert = Vec::new();
    for j in invalid {
        let Some(k) = keep_mask.get_mut(j.index) else {
            continue;
        };
        // Transient: planned as a diversion so the filter sees its offset,
        // holds the partition there and never writes it (whatever the action).
        let action = match j.invalid.class {
            Class::Transient => Action::Divert,
            _ => plan.policy.on_invalid,
        };
        if action.writes() {
            *k = false;
            if !keyed && earlier.binary_search(&j.offset).is_ok() {
                // In its DLT already: settled as diverted, not written
                // again (as a batch resent as spliced is). Per key, the
                // record still blocks its key (`keyed::already_diverted`).
                settle(plan, j, action);
            } else {
                divert.push((j.index, &j.invalid));
            }
        } else {
            settle(plan, j, action);
            if action.removes() {
                *k = false; // out of the batch, written nowhere
            }
        }
    }
    divert
}

/// Note what became of an invalid record not written now.
fn settle(plan: &mut PartitionPlan, j: &Judged, action: Action) {
    plan.settled.push(Settled {
        offset: j.offset,
        invalid: j.invalid.clone(),
        action,
    });
}

fn log_not_diverted(plan: &PartitionPlan, invalid: &[Judged]) {
    let (topic, partition) = (&plan.topic, plan.partition);
    for j in invalid {
        let v = &j.invalid;
        tracing::info!(%topic, partition, offset = j.offset,
            class = v.class.as_str(), rule = %v.rule, reason = %v.log_reason(),
            action = ?plan.policy.on_invalid, "invalid record not diverted");
    }
}

/// The batch of `known` as spliced by an earlier fetch, if this fetch
/// would splice it the same way and has nothing left to divert in it:
/// every invalid record removed (and, when diverted, already in its DLT),
/// nothing else removed. Counts what it stands for as the full path does.
/// `known` came from a lookup of a batch whose CRC holds (`plan_batch`):
/// a corrupt copy is never replaced by the good one.
fn resend_spliced(
    plan: &mut PartitionPlan,
    known: &Known,
    earlier: &[i64],
    len: usize,
) -> Option<Rebuilt> {
    let invalid = known.verdicts();
    let action = plan.policy.on_invalid;
    // Removed exactly: by an action that writes, every invalid record and
    // nothing else was written before; by one that does not, no record
    // was removed but an invalid one.
    let removes_exactly = action.removes()
        && if action.writes() {
            invalid.len() == earlier.len()
                && invalid
                    .iter()
                    .all(|j| earlier.binary_search(&j.offset).is_ok())
        } else {
            earlier
                .iter()
                .all(|o| invalid.iter().any(|j| j.offset == *o))
        };
    if !removes_exactly {
        return None;
    }
    // The entry matched the batch's length and CRC, so its runs fit it.
    let rebuilt = known.spliced().filter(|r| r.fits(len))?;
    for j in invalid.iter() {
        settle(plan, j, action);
    }
    Some(rebuilt)
}

fn keep(batch: &Batch) -> SegmentPlan {
    SegmentPlan::Keep {
        bytes: batch.bytes().clone(),
        base: batch.base_offset(),
    }
}
