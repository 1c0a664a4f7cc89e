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
//!   counts towards `group.share.delivery.count.limit`; see docs/policies.md).
//!
//! Topics whose id is not known yet are withheld whole the same way. A
//! topic whose DLTs are not read back yet is judged all the same: its
//! valid records are delivered, its invalid ones withheld (whether one is
//! in its DLT already cannot be told yet, so none is written). A response nothing changes goes out
//! as it came; one that changes is decoded and encoded again whole
//! (records included).

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::share_fetch_response::AcquiredRecords;
use kafka_protocol::messages::ShareFetchResponse;
use kafka_protocol::protocol::{Decodable, Encodable};
use uuid::Uuid;

use super::gate::TopicGate;
use super::parallel::PartitionJob;
use super::{count, timed, FetchContext, FetchFilter, FilterError};
use crate::clock::now_ms;
use crate::intercept::share::acks::{lock_deadline, Owed, SessionKey, ShareAcks};
use crate::metrics;
use crate::plan::share::{self, Acquired};
use crate::plan::{PartitionPlan, Visibility};
use crate::policy::Class;

/// One ShareFetch response's context on the request side.
pub struct ShareCall<'a> {
    /// The session the request belongs to (`None`: no group or member named).
    pub session: Option<&'a SessionKey>,
    /// Where the proxy's acknowledgements wait.
    pub book: &'a ShareAcks,
    /// The acknowledge type for records removed for good.
    pub removed_ack: i8,
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

/// What `share_jobs` makes of a response.
struct ShareJobs {
    jobs: Vec<std::sync::Arc<PartitionJob>>,
    withheld: Vec<Withheld>,
    /// Topics (indexes) judged while their DLTs are not read back yet.
    unloaded: Vec<usize>,
}

/// What to do with one partition's acquired offsets.
#[derive(Default)]
struct Settle {
    /// Removed for good: acknowledged by the proxy.
    done: Vec<i64>,
    /// Not decided now: withheld, no acknowledgement, by reason.
    withheld: Vec<(i64, &'static str)>,
    /// Withheld from this offset on (a batch that cannot be judged).
    held_from: Option<i64>,
}

impl FetchFilter {
    /// Filter a ShareFetch response body; `Ok(None)` means forward it as it
    /// came. `call` says where the acknowledgements owed go.
    pub async fn filter_share<C: FetchContext>(
        &self,
        ctx: &C,
        body: Bytes,
        version: i16,
        call: ShareCall<'_>,
    ) -> Result<Option<Bytes>, FilterError> {
        let mut resp = timed(|| ShareFetchResponse::decode(&mut body.clone(), version))
            .map_err(FilterError::Decode)?;
        let (mut changed, learned) = ctx.rewrite_share_endpoints(&mut resp);
        ctx.learn(learned).await;
        let ids: Vec<Uuid> = resp.responses.iter().map(|t| t.topic_id).collect();
        ctx.resolve_topic_ids(&ids).await;
        let now = now_ms();
        let ShareJobs {
            jobs,
            withheld,
            unloaded,
        } = self.share_jobs(ctx, &resp).await;
        for (ti, pi, reason) in withheld {
            let parts = &mut resp.responses[ti].partitions;
            let which = match pi {
                Some(pi) => pi..pi + 1,
                None => 0..parts.len(),
            };
            for p in &mut parts[which] {
                let n = acquired_count(&p.acquired_records);
                if n > 0 || p.records.as_ref().is_some_and(|r| !r.is_empty()) {
                    metrics::global().share.withheld(reason, n);
                    p.acquired_records.clear();
                    p.records = Some(Bytes::new());
                    changed = true;
                }
            }
        }
        let mut planned = self.plan_all(jobs.clone(), now).await?;
        if let Some(registry) = self.engine.registry() {
            self.resolve_transient(registry, &jobs, &mut planned, now)
                .await?;
        }
        // Which records each plan diverts, and which it cannot decide now.
        let mut plans: Vec<Planned> = Vec::new();
        for (at, mut plan) in planned {
            metrics::global().record_evaluated(&plan.policy.name, plan.stats.validated);
            let acquired = acquired_of(&resp.responses[at.0].partitions[at.1].acquired_records);
            let ledger_known = !unloaded.contains(&at.0);
            let settle = self.sort_out(&mut plan, &acquired, ledger_known);
            plans.push(Planned {
                at,
                plan,
                acquired,
                settle,
            });
        }
        if plans.is_empty() {
            return timed(|| changed.then(|| encode(&resp, version)).transpose());
        }
        let failed = {
            let refs: Vec<&PartitionPlan> = plans.iter().map(|p| &p.plan).collect();
            self.divert(&refs).await
        };
        let ledger = self.dead_letter.ledger();
        let expires = lock_deadline(Instant::now(), resp.acquisition_lock_timeout_ms);
        let mut owed = Vec::new();
        timed(|| -> Result<_, FilterError> {
            for (planned, failed) in plans.into_iter().zip(failed) {
                let Planned {
                    at,
                    mut plan,
                    acquired,
                    mut settle,
                } = planned;
                // Diversions not acknowledged in time: withheld.
                plan.diversions.retain(|d| {
                    let ok = failed.binary_search(&d.origin_offset).is_err();
                    if ok {
                        settle.done.extend(whole_range(d, &acquired));
                    } else {
                        settle.withheld.push((d.origin_offset, "dlt"));
                    }
                    ok
                });
                settle.done.extend(
                    plan.dropped
                        .iter()
                        .filter(|&&o| share::is_acquired(&acquired, o)),
                );
                // In its DLT before (this fetch or another, any instance).
                for a in &acquired {
                    settle.done.extend(ledger.diverted_in(
                        &plan.topic,
                        plan.partition,
                        a.first,
                        a.last.saturating_add(1),
                    ));
                }
                let topic_id = resp.responses[at.0].topic_id;
                let p = &mut resp.responses[at.0].partitions[at.1];
                let (removed, withheld, cut) = settle.offsets(&acquired);
                // Withheld records are judged again when they come back.
                plan.stats.judged = plan.stats.judged.saturating_sub(withheld);
                count(&plan, None);
                metrics::global().set_held(&plan.topic, plan.partition, withheld + cut > 0);
                if removed.is_empty() && cut == 0 && !plan.changes_anything() {
                    continue; // a clean partition: its bytes and ranges as they came
                }
                changed = true;
                let chunks = plan.apply_chunks(None)?;
                let left = share::subtract(&acquired, &removed);
                p.acquired_records = to_wire(&cut_ranges(left, settle.held_from));
                p.records = Some(join(chunks));
                owed.extend(settle.done.iter().map(|&offset| Owed {
                    topic_id,
                    partition: plan.partition,
                    offset,
                    ack: call.removed_ack,
                    expires,
                }));
            }
            Ok(())
        })?;
        if let Some(session) = call.session {
            let dropped = call.book.owe(session, owed);
            metrics::global().share.acks("overflow", dropped as u64);
        }
        timed(|| changed.then(|| encode(&resp, version)).transpose())
    }

    /// One planning job per partition of a policy topic with records; the
    /// topics and partitions withheld whole, with why.
    async fn share_jobs<C: FetchContext>(&self, ctx: &C, resp: &ShareFetchResponse) -> ShareJobs {
        let policies = self.policies();
        let mut jobs = Vec::new();
        let mut withheld = Vec::new();
        let mut unloaded = Vec::new();
        for (ti, topic) in resp.responses.iter().enumerate() {
            let Some(name) = ctx.topic_name(&topic.topic_id) else {
                withheld.push((ti, None, "unknown_topic"));
                continue;
            };
            let policy = match self.topic_gate(&policies, &name).await {
                TopicGate::Unpoliced => continue,
                // Judged all the same: share groups promise no order, so
                // the valid records need not wait for the ledger; the
                // invalid ones do (`sort_out`).
                TopicGate::Unloaded(policy) => {
                    unloaded.push(ti);
                    policy
                }
                TopicGate::Judge(policy) => policy,
            };
            let topic_name: std::sync::Arc<str> = std::sync::Arc::from(name.as_str());
            self.dead_letter
                .ledger()
                .observe_topic_id(&topic_name, topic.topic_id);
            for (pi, p) in topic.partitions.iter().enumerate() {
                let Some(records) = p.records.as_ref().filter(|r| !r.is_empty()) else {
                    continue;
                };
                if p.acquired_records.len() > MAX_ACQUIRED_RANGES {
                    tracing::warn!(topic = %name, partition = p.partition_index,
                        ranges = p.acquired_records.len(),
                        "share fetch: more acquired ranges than records could need: withheld");
                    withheld.push((ti, Some(pi), "held"));
                    continue;
                }
                jobs.push(std::sync::Arc::new(PartitionJob {
                    at: (ti, pi),
                    policy: policy.clone(),
                    topic: topic_name.clone(),
                    partition: p.partition_index,
                    records: records.clone(),
                    // The broker acquires only what the group's isolation
                    // level lets it deliver; acquisition decides here.
                    vis: Visibility::new(false, None),
                    // Share groups promise no order: no key is blocked.
                    gate: None,
                    deadline: None,
                }));
            }
        }
        ShareJobs {
            jobs,
            withheld,
            unloaded,
        }
    }

    /// Keep in `plan.diversions` what is to be written now: invalid records
    /// the member acquired, not transient, not past an open breaker; the
    /// rest of its acquired offsets that cannot be decided now, withheld.
    /// Without `ledger_known` (the topic's DLTs not read back yet) nothing
    /// is written: whether a record is in its DLT already cannot be told,
    /// so every invalid record the member acquired is withheld.
    fn sort_out(
        &self,
        plan: &mut PartitionPlan,
        acquired: &[Acquired],
        ledger_known: bool,
    ) -> Settle {
        let mut settle = Settle {
            held_from: plan.held.as_ref().map(|h| h.offset),
            ..Settle::default()
        };
        if let Some(h) = &plan.held {
            metrics::global().held_batch(&plan.topic, plan.partition, h.reason.as_str());
            tracing::warn!(topic = %plan.topic, partition = plan.partition, offset = h.offset,
                reason = %h.reason, "share fetch: batch cannot be judged: withheld from it on");
        }
        let mine = |d: &crate::dlt_record::Diversion| {
            share::is_acquired(acquired, d.origin_offset)
                || d.last_offset.is_some_and(|last| {
                    acquired
                        .iter()
                        .any(|a| a.first <= last && d.origin_offset <= a.last)
                })
        };
        plan.diversions.retain(|d| {
            if !mine(d) {
                return false;
            }
            if d.invalid.class == Class::Transient {
                settle.withheld.push((d.origin_offset, "transient"));
                return false;
            }
            if !ledger_known {
                settle.withheld.push((d.origin_offset, "not_loaded"));
                return false;
            }
            true
        });
        let ledger = self.dead_letter.ledger();
        if let Some(cut) = self.breakers.cut(plan, |d| {
            ledger.contains(&(d.origin_topic.clone(), d.origin_partition, d.origin_offset))
        }) {
            plan.diversions.retain(|d| {
                let before = d.origin_offset < cut;
                if !before {
                    settle.withheld.push((d.origin_offset, "breaker"));
                }
                before
            });
        }
        settle
    }
}

impl Settle {
    /// The acquired offsets leaving the acquired ranges one by one
    /// (sorted, once each: removed for good or withheld), how many of them
    /// are withheld, and how many `held_from` withholds (it cuts the ranges
    /// as a whole: `cut_ranges`); counts the withheld.
    fn offsets(&mut self, acquired: &[Acquired]) -> (Vec<i64>, u64, u64) {
        let held = |o: i64| self.held_from.is_some_and(|h| o >= h);
        let mut withheld: Vec<i64> = Vec::new();
        for &(o, reason) in &self.withheld {
            if share::is_acquired(acquired, o) && !held(o) {
                metrics::global().share.withheld(reason, 1);
                withheld.push(o);
            }
        }
        withheld.sort_unstable();
        withheld.dedup();
        let held_from = self.held_from;
        self.done
            .retain(|&o| withheld.binary_search(&o).is_err() && held_from.is_none_or(|h| o < h));
        self.done.sort_unstable();
        self.done.dedup();
        let mut all: Vec<i64> = self.done.iter().chain(&withheld).copied().collect();
        all.sort_unstable();
        all.dedup();
        let mut cut = 0;
        if let Some(from) = self.held_from {
            cut = count_from(acquired, from);
            metrics::global().share.withheld("held", cut);
        }
        (all, withheld.len() as u64, cut)
    }
}

/// How many acquired offsets are at or after `from` (saturating: a broker
/// may claim any range).
fn count_from(acquired: &[Acquired], from: i64) -> u64 {
    acquired
        .iter()
        .filter(|a| a.last >= from)
        .map(|a| span(a.first.max(from), a.last))
        .fold(0u64, u64::saturating_add)
}

/// How many offsets `first..=last` holds (0 if none), saturating.
fn span(first: i64, last: i64) -> u64 {
    (i128::from(last) - i128::from(first) + 1).clamp(0, i128::from(u64::MAX)) as u64
}

/// `ranges` without anything at or after `from`.
fn cut_ranges(ranges: Vec<Acquired>, from: Option<i64>) -> Vec<Acquired> {
    let Some(from) = from else { return ranges };
    ranges
        .into_iter()
        .filter(|a| a.first < from)
        .map(|a| Acquired {
            last: a.last.min(from.saturating_sub(1)),
            ..a
        })
        .collect()
}

/// A partition with more acquired ranges than this is not believed (a
/// broker gives about one per batch or gap) and is withheld whole.
const MAX_ACQUIRED_RANGES: usize = 100_000;

/// At most this many acquired offsets of one batch diverted whole are
/// acknowledged one by one; a broker claiming more is not believed, and
/// the rest are withheld (they come back when their locks expire).
const MAX_WHOLE_BATCH_OFFSETS: i64 = 1 << 20;

/// The offsets of a diversion the member acquired: its record, or the
/// acquired part of a batch diverted whole (at most
/// [`MAX_WHOLE_BATCH_OFFSETS`] of it).
fn whole_range(d: &crate::dlt_record::Diversion, acquired: &[Acquired]) -> Vec<i64> {
    let last = d
        .last_offset
        .unwrap_or(d.origin_offset)
        .min(d.origin_offset.saturating_add(MAX_WHOLE_BATCH_OFFSETS - 1));
    // Enumerated below: at most MAX_WHOLE_BATCH_OFFSETS per acquired range.
    let mut out = Vec::new();
    for a in acquired {
        out.extend(a.first.max(d.origin_offset)..=a.last.min(last));
    }
    out
}

fn acquired_of(wire: &[AcquiredRecords]) -> Vec<Acquired> {
    wire.iter()
        .map(|a| Acquired {
            first: a.first_offset,
            last: a.last_offset,
            delivery_count: a.delivery_count,
        })
        .collect()
}

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

fn acquired_count(wire: &[AcquiredRecords]) -> u64 {
    wire.iter()
        .map(|a| span(a.first_offset, a.last_offset))
        .fold(0u64, u64::saturating_add)
}

fn join(chunks: Vec<Bytes>) -> Bytes {
    if let [one] = &chunks[..] {
        return one.clone();
    }
    let mut out = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in &chunks {
        out.extend_from_slice(c);
    }
    out.freeze()
}

fn encode(resp: &ShareFetchResponse, version: i16) -> Result<Bytes, FilterError> {
    let mut out = BytesMut::with_capacity(resp.compute_size(version).map_err(FilterError::Encode)?);
    resp.encode(&mut out, version)
        .map_err(FilterError::Encode)?;
    Ok(out.freeze())
}
