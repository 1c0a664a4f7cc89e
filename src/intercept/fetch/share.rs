//! ShareFetch responses (KIP-932): a share consumer's records judged with
//! the Fetch filter's planner, verdict cache, ledger and DLT writes, and
//! delivered by acquisition instead of by offset.
//!
//! A share consumer delivers exactly the acquired offsets whose records it
//! finds, in no promised order. So, per partition of a policy topic:
//!
//! - the records section is planned as a Fetch's and rebuilt without every
//!   invalid record (`PartitionPlan::apply_chunks`, no hold: nothing valid
//!   waits behind an invalid record);
//! - the invalid records the member acquired are diverted, and the
//!   response waits for their acknowledgements (records it did not acquire
//!   are another member's, or aborted: removed, not diverted);
//! - an acquired offset removed for good (diverted now or before, dropped)
//!   leaves the acquired ranges and is owed an acknowledgement
//!   (`intercept::share::acks`), sent in the client's next request;
//! - an acquired offset that cannot be decided now (diversion not
//!   acknowledged in time, `transient`, breaker open, a batch that cannot
//!   be judged and what follows it) leaves the acquired ranges without one:
//!   the broker delivers it again when its lock expires (each delivery
//!   counts towards `group.share.delivery.count.limit`; see docs/policies.md);
//! - a batch diverted whole (it cannot be decoded) is settled or withheld
//!   as one: every offset of it the member acquired, never only some.
//!
//! Offsets are handled as ranges throughout (`plan::share`): the work is
//! proportional to the ranges, never to the offsets they cover. A broker's
//! acquired ranges are believed only sorted, disjoint, inside the records
//! section and no more than its records need (`share::check_acquired`);
//! otherwise the partition is withheld whole and counted (`bad_ranges`).
//!
//! Topics whose id is not known yet are withheld whole the same way. A
//! topic whose DLTs are not read back yet is judged all the same, but
//! nothing of it is written or given (any record might be in its DLT
//! already), save valid records at their last delivery (`sort_out`). A
//! response nothing changes goes out as it came; one that changes is
//! written as the broker's bytes with the changed partitions' records and
//! acquired ranges patched in (`share_patch`). The acquisition locks run from
//! the response's arrival, so that is where the deadline of the proxy's
//! acknowledgements is taken, before any wait for a registry or a DLT.

use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::share_fetch_response::{AcquiredRecords, PartitionData};
use kafka_protocol::messages::ShareFetchResponse;
use kafka_protocol::protocol::Decodable;

use super::patch::Fresh;
use super::pipeline::{span_of, Judgement, Kind, Named, PartView, TopicView};
use super::share_patch::ShareSections;
use super::{cpu_of, timed, FetchContext, FetchFilter, FilterError};
use crate::clock::now_ms;
use crate::intercept::share::acks::{lock_deadline, Owed, ShareAcks};
use crate::intercept::share::withheld::Reasoned;
use crate::intercept::share::SessionKey;
use crate::kafka::batch::{segments, Segment};
use crate::metrics::{self, Judged, Observation, ShareSeen};
use crate::plan::share::{self, Acquired, Outcome, Settle, Span};
use crate::plan::{PartitionPlan, Visibility};

/// One ShareFetch response's context on the request side.
pub struct ShareCall<'a> {
    /// The session the request belongs to (`None`: no group or member named).
    pub session: Option<&'a SessionKey>,
    /// Where the proxy's acknowledgements wait.
    pub book: &'a ShareAcks,
    /// The acknowledge type for records removed for good.
    pub removed_ack: i8,
    /// The delivery count at which a record is the group's last delivery
    /// (`share_groups.last_delivery`): while its topic's DLTs are not read
    /// back, a valid record is given then rather than withheld.
    pub last_delivery: i16,
    /// What settling the answer's acknowledgement errors came to, reported
    /// with the answer's observation.
    pub settled: ShareSeen,
}

/// One planned partition: where it is in the response, its plan, what the
/// member acquired, and what becomes of those offsets.
struct Planned {
    at: (usize, usize),
    plan: PartitionPlan,
    acquired: Vec<Acquired>,
    settle: Settle,
}

/// A topic (partition `None`) or a partition withheld whole, and why.
type Withheld = (usize, Option<usize>, &'static str);

/// A partition's acquired ranges the proxy acknowledges, and those it
/// withholds, by reason.
type Settled = (Vec<Span>, Reasoned);

impl FetchFilter {
    /// Filter a ShareFetch response body; `Ok(None)` means forward it as it
    /// came. `call` says where the acknowledgements owed go. What it came
    /// to is reported once (`metrics::Observation`).
    pub async fn filter_share<C: FetchContext>(
        &self,
        ctx: &C,
        body: Bytes,
        version: i16,
        mut call: ShareCall<'_>,
    ) -> Result<Option<Vec<Bytes>>, FilterError> {
        let mut seen = Observation::start();
        seen.share = std::mem::take(&mut call.settled);
        let out = (self.filter_share_seen(ctx, body, version, call, &mut seen)).await;
        metrics::global().observe(seen);
        out
    }

    async fn filter_share_seen<C: FetchContext>(
        &self,
        ctx: &C,
        body: Bytes,
        version: i16,
        call: ShareCall<'_>,
        seen: &mut Observation,
    ) -> Result<Option<Vec<Bytes>>, FilterError> {
        // The locks run from the broker's answer: count from its arrival,
        // not from the end of the waits below.
        let arrived = Instant::now();
        let (mut resp, sections) = timed(seen, || -> Result<_, FilterError> {
            let resp = ShareFetchResponse::decode(&mut body.clone(), version)
                .map_err(FilterError::Decode)?;
            let sections = ShareSections::of(&body, &resp);
            Ok((resp, sections))
        })?;
        let (endpoints, learned) = ctx.rewrite_share_endpoints(&mut resp);
        let mut changed = endpoints;
        ctx.learn(learned).await;
        let fresh = Fresh {
            body: &body,
            version,
            sections: &sections,
            endpoints,
        };
        let kind = Kind {
            per_key: false,
            judge_unloaded: true,
            deadline: None,
        };
        let judged = (self.judge_response(ctx, views(&resp), &kind, now_ms(), seen)).await?;
        changed |= withhold(&mut resp, &judged.unjudged, seen);
        let plans = self.sort_out_all(&resp, judged.plans, call.last_delivery, seen);
        if plans.is_empty() {
            return timed(seen, || {
                changed
                    .then(|| fresh.body(&mut resp, Vec::new()))
                    .transpose()
            });
        }
        let failed = {
            let refs: Vec<&PartitionPlan> = plans.iter().map(|p| &p.plan).collect();
            self.divert(&refs).await
        };
        let (replaced, cpu) =
            cpu_of(|| self.deliver_all(&mut resp, plans, failed, &call, arrived, seen));
        seen.cpu += cpu;
        let replaced = replaced?;
        changed |= !replaced.is_empty();
        timed(seen, || {
            changed.then(|| fresh.body(&mut resp, replaced)).transpose()
        })
    }

    /// Each judged partition with what the member acquired of it and what
    /// becomes of those offsets (`sort_out`).
    fn sort_out_all(
        &self,
        resp: &ShareFetchResponse,
        judged: Vec<Judgement>,
        last_delivery: i16,
        seen: &mut Observation,
    ) -> Vec<Planned> {
        let mut plans = Vec::with_capacity(judged.len());
        for Judgement {
            at,
            mut plan,
            unloaded,
        } in judged
        {
            let acquired = acquired_of(&resp.responses[at.0].partitions[at.1].acquired_records);
            let settle = self.sort_out(&mut plan, &acquired, !unloaded, last_delivery, seen);
            plans.push(Planned {
                at,
                plan,
                acquired,
                settle,
            });
        }
        plans
    }

    /// Deliver every planned partition (`deliver`) once its diversions are
    /// written (`failed`, per plan): what the proxy withholds goes to the
    /// session's withheld book (renewed while it cannot be decided), what
    /// it removed for good is owed an acknowledgement (its deadline the
    /// lock's, counted from the response's `arrived`). The rebuilt
    /// partitions' records chunks.
    #[allow(clippy::type_complexity)]
    fn deliver_all(
        &self,
        resp: &mut ShareFetchResponse,
        plans: Vec<Planned>,
        failed: Vec<Vec<i64>>,
        call: &ShareCall<'_>,
        arrived: Instant,
        seen: &mut Observation,
    ) -> Result<Vec<((usize, usize), Vec<Bytes>)>, FilterError> {
        let lock_ms = resp.acquisition_lock_timeout_ms;
        let expires = lock_deadline(arrived, lock_ms);
        let (mut owed, mut replaced) = (Vec::new(), Vec::new());
        for (planned, failed) in plans.into_iter().zip(failed) {
            let at = planned.at;
            let topic_id = resp.responses[at.0].topic_id;
            let p = &mut resp.responses[at.0].partitions[at.1];
            let Some(((done, held), chunks)) = self.deliver(planned, &failed, p, seen)? else {
                continue; // a clean partition: its bytes and ranges as they came
            };
            if let Some(s) = call.session {
                let at = (topic_id, p.partition_index);
                let book = &call.book.withheld;
                book.withhold(s, at, &held, arrived, lock_ms, &mut seen.share);
            }
            replaced.push((at, chunks));
            owed.extend(done.into_iter().map(|span| Owed {
                topic_id,
                partition: p.partition_index,
                span,
                ack: call.removed_ack,
                expires,
            }));
        }
        if let Some(session) = call.session {
            seen.share.acks("overflow", call.book.owe(session, owed));
        }
        Ok(replaced)
    }

    /// Settle one planned partition once its diversions are written
    /// (`failed`: those not acknowledged in time): its records rebuilt, its
    /// acquired ranges without what the proxy removed, counted. The ranges
    /// the proxy acknowledges and the new records section's chunks, or
    /// `None` if nothing changes.
    fn deliver(
        &self,
        planned: Planned,
        failed: &[i64],
        p: &mut PartitionData,
        seen: &mut Observation,
    ) -> Result<Option<(Settled, Vec<Bytes>)>, FilterError> {
        let Planned {
            mut plan,
            acquired,
            mut settle,
            ..
        } = planned;
        // Diversions not acknowledged in time: withheld, whole batches whole.
        plan.diversions.retain(|d| {
            let ok = failed.binary_search(&d.origin_offset).is_err();
            if !ok {
                settle.withheld.push((span_of(d), "dlt"));
            }
            ok
        });
        settle.done.extend(plan.diversions.iter().map(span_of));
        let removed = plan.settled.iter().filter(|s| s.action.removes());
        settle.done.extend(removed.map(|s| (s.offset, s.offset)));
        settle
            .done
            .extend(plan.whole_batches.iter().map(|&(f, l)| (f, l.max(f))));
        // In its DLT before (this fetch or another, any instance). The
        // ranges were checked: at most one more than the section's records.
        let ledger = &self.ledger;
        for a in &acquired {
            let before = ledger.diverted_in(
                &plan.topic,
                plan.partition,
                a.first,
                a.last.saturating_add(1),
            );
            settle.done.extend(before.into_iter().map(|o| (o, o)));
        }
        let out = settle.outcome(&acquired);
        for &(span, reason) in &out.held {
            seen.withheld(reason, share::count(&[span]));
        }
        let left = &out.left;
        if let Some(records) = &p.records {
            let judged = count_acquired(&plan, records, &acquired, left, &out, settle.held_from);
            seen.partitions.push(judged);
        }
        if out.removed.is_empty() && !plan.changes_anything() {
            return Ok(None);
        }
        let chunks = plan.apply_chunks(None)?;
        p.acquired_records = to_wire(left);
        Ok(Some(((out.done, out.held), chunks)))
    }

    /// Keep in `plan.diversions` what is to be written now: invalid records
    /// the member acquired and that may be written now (`postpone`); the
    /// rest of its acquired offsets that cannot be decided now, withheld.
    /// Without `ledger_known` (the topic's DLTs not read back yet) nothing
    /// is written or given: whether a record is in its DLT already cannot
    /// be told, so every acquired offset is withheld, save valid records at
    /// their last delivery (`last_delivery`: delivered rather than left for
    /// the broker to archive).
    fn sort_out(
        &self,
        plan: &mut PartitionPlan,
        acquired: &[Acquired],
        ledger_known: bool,
        last_delivery: i16,
        seen: &mut Observation,
    ) -> Settle {
        let mut settle = Settle {
            held_from: plan.held.as_ref().map(|h| h.offset),
            ..Settle::default()
        };
        if let Some(h) = &plan.held {
            (seen.held_batches).push((plan.topic.clone(), plan.partition, h.reason.as_str()));
            tracing::warn!(topic = %plan.topic, partition = plan.partition, offset = h.offset,
                reason = %h.reason, "share fetch: batch cannot be judged: withheld from it on");
        }
        // Another member's invalid records: its fetch diverts them.
        plan.diversions
            .retain(|d| share::meets(acquired, span_of(d)));
        if !ledger_known {
            let (last, earlier): (Vec<Acquired>, Vec<Acquired>) =
                (acquired.iter()).partition(|a| a.delivery_count >= last_delivery);
            let earlier: Vec<Span> = earlier.iter().map(|a| (a.first, a.last)).collect();
            settle
                .withheld
                .extend(earlier.into_iter().map(|s| (s, "not_loaded")));
            let invalid = plan.diversions.drain(..).map(|d| span_of(&d));
            let invalid = share::within(&invalid.collect::<Vec<_>>(), &last);
            settle
                .withheld
                .extend(invalid.into_iter().map(|s| (s, "not_loaded")));
        }
        settle.withheld.extend(self.postpone(plan));
        settle
    }
}

/// Count what this member's part of the partition came to: the records
/// it acquired in this response (given to it, or settled by the proxy;
/// not those withheld, which are judged again when they come back), the
/// valid ones it is given, and each invalid one it acquired with what
/// became of it. Records it did not acquire are another member's (a batch
/// sent again for one released record holds records settled long ago):
/// the fetch that acquired them counts them. Offsets are counted within
/// the section's data batches (a compacted batch's gaps count as records).
fn count_acquired(
    plan: &PartitionPlan,
    records: &Bytes,
    acquired: &[Acquired],
    left: &[Acquired],
    out: &Outcome,
    held_from: Option<i64>,
) -> metrics::Judged {
    let data: Vec<Span> = segments(records)
        .iter()
        .filter_map(|s| match s {
            Segment::Batch(b) if !b.is_control() => {
                Some((b.base_offset(), b.last_offset().max(b.base_offset())))
            }
            _ => None,
        })
        .collect();
    let data = share::normalize(data);
    let withheld = share::minus(&out.removed, &out.done);
    let mine = share::minus(&share::within(&data, acquired), &withheld);
    let given = share::within(&data, left);
    let counted = |o: i64, is_diversion: bool| {
        is_diversion || (share::is_acquired(acquired, o) && held_from.is_none_or(|h| o < h))
    };
    let passed_invalid = (plan.settled.iter())
        .filter(|s| !s.action.removes() && counted(s.offset, false))
        .count() as u64;
    let given = share::count(&given).saturating_sub(passed_invalid);
    Judged::of(plan, share::count(&mine), given, counted)
}

/// A ShareFetch response's topics as the pipeline reads them: the
/// broker acquires only what the group's isolation level lets it deliver
/// (acquisition decides, not visibility), and a partition whose acquired
/// ranges cannot be believed is not judged.
fn views(resp: &ShareFetchResponse) -> Vec<TopicView<'_>> {
    fn part(p: &PartitionData) -> PartView<'_> {
        let records = p.records.as_ref().filter(|r| !r.is_empty());
        let refused = records.and_then(|r| believable(&p.acquired_records, r).err());
        if let Some(bad) = &refused {
            tracing::warn!(
                partition = p.partition_index,
                ranges = p.acquired_records.len(),
                why = bad.as_str(),
                "share fetch: acquired ranges not believed: partition withheld"
            );
        }
        PartView {
            index: p.partition_index,
            error: p.error_code,
            records: p.records.as_ref(),
            vis: Visibility::new(false, None),
            refused: refused.map(|_| "bad_ranges"),
        }
    }
    (resp.responses.iter())
        .map(|t| TopicView {
            named: Named::Id(t.topic_id),
            partitions: t.partitions.iter().map(part).collect(),
        })
        .collect()
}

/// Whether a broker's acquired ranges can be believed for `records`: its
/// complete batches give the section's offsets and record count.
fn believable(wire: &[AcquiredRecords], records: &Bytes) -> Result<(), share::BadRanges> {
    if wire.is_empty() {
        return Ok(());
    }
    let (mut section, mut n): (Option<Span>, u64) = (None, 0);
    for seg in segments(records) {
        if let Segment::Batch(b) = seg {
            let (first, last) = (b.base_offset(), b.last_offset().max(b.base_offset()));
            section = Some(section.map_or((first, last), |(f, l)| (f.min(first), l.max(last))));
            n = n.saturating_add(u64::try_from(b.records_count()).unwrap_or(0));
        }
    }
    share::check_acquired(&acquired_of(wire), section, n)
}

/// Withhold what `withheld` names: its acquired ranges and records go, no
/// acknowledgement (they come back when their locks expire). Whether
/// anything changed.
fn withhold(resp: &mut ShareFetchResponse, withheld: &[Withheld], seen: &mut Observation) -> bool {
    let mut changed = false;
    for &(ti, pi, reason) in withheld {
        let parts = &mut resp.responses[ti].partitions;
        let which = match pi {
            Some(pi) => pi..pi + 1,
            None => 0..parts.len(),
        };
        for p in &mut parts[which] {
            let n = acquired_count(&p.acquired_records);
            if n > 0 || p.records.as_ref().is_some_and(|r| !r.is_empty()) {
                seen.withheld(reason, n);
                p.acquired_records.clear();
                p.records = Some(Bytes::new());
                changed = true;
            }
        }
    }
    changed
}

/// The acquired ranges of a partition as the planner reads them.
fn acquired_of(wire: &[AcquiredRecords]) -> Vec<Acquired> {
    wire.iter()
        .map(|a| Acquired {
            first: a.first_offset,
            last: a.last_offset,
            delivery_count: a.delivery_count,
        })
        .collect()
}

/// Acquired ranges as the wire writes them.
fn to_wire(ranges: &[Acquired]) -> Vec<AcquiredRecords> {
    ranges
        .iter()
        .map(|a| {
            AcquiredRecords::default()
                .with_first_offset(a.first)
                .with_last_offset(a.last)
                .with_delivery_count(a.delivery_count)
        })
        .collect()
}

/// How many offsets the acquired ranges hold.
fn acquired_count(wire: &[AcquiredRecords]) -> u64 {
    let spans: Vec<Span> = wire
        .iter()
        .map(|a| (a.first_offset, a.last_offset))
        .collect();
    share::count(&spans)
}
