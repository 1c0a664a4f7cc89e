//! One judging pipeline for every consumer kind: from a response's topics
//! and partitions to plans whose diversions may be written now. Fetch
//! (`fetch.rs`) and ShareFetch (`share.rs`) share every step here and
//! differ only in delivery: by offset (holds, per-key blocks, splices) and
//! by acquisition (acquired ranges, owed acknowledgements).
//!
//! The steps, in order: topic names (ids looked up), the topic gate
//! (dead-letter topics and topics no policy covers pass as they came), the
//! ledger (a topic whose DLTs are not read back yet is held whole, unless
//! the kind settles it by acquisition), blocked keys current (per-key
//! policies), topic ids observed (a recreated topic's ledger entries go),
//! one planning job per partition with records, planning (on idle cores;
//! transient verdicts tried again while the registry answers), and, per
//! plan, postponing the diversions that may not be written now (transient
//! verdicts, everything from an open breaker's cut on). What was judged is
//! reported once per partition when it is delivered (`deliver.rs: count`,
//! `share.rs: count_acquired`).
//!
//! `transient` verdicts are records whose schema the registry has not
//! given yet: after planning, what the judges asked for is fetched
//! (bounded by the registry's `timeout`, or 200 ms while it is known to be
//! down) and those partitions are planned again (`resolve_transient`). A
//! record still `transient` then holds a Fetch's partition (`deliver.rs`).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use uuid::Uuid;

use super::parallel::PartitionJob;
use super::{FetchContext, FetchFilter, FilterError};
use crate::dlt_record::Diversion;
use crate::metrics::Observation;
use crate::plan::share::Span;
use crate::plan::{PartitionPlan, Visibility};
use crate::policy::{Class, KeyOrdering, Policy, PolicySet};
use crate::registry::Registry;

/// How a response names a topic.
pub(super) enum Named<'r> {
    /// Fetch v13+ and ShareFetch.
    Id(Uuid),
    /// Fetch before v13.
    Name(&'r str),
}

/// One topic of a response, as the pipeline reads it.
pub(super) struct TopicView<'r> {
    pub named: Named<'r>,
    pub partitions: Vec<PartView<'r>>,
}

/// One partition of a response, as the pipeline reads it.
pub(super) struct PartView<'r> {
    pub index: i32,
    pub error: i16,
    pub records: Option<&'r Bytes>,
    pub vis: Visibility,
    /// Why it may not be judged (a ShareFetch's acquired ranges not
    /// believed): withheld whole.
    pub refused: Option<&'static str>,
}

/// What differs between consumer kinds before delivery.
pub(super) struct Kind {
    /// Per-key policies park keys (Fetch; share groups promise no order).
    pub per_key: bool,
    /// A topic whose DLTs are not read back is judged, its outcome settled
    /// by the delivery (ShareFetch), rather than held whole (Fetch).
    pub judge_unloaded: bool,
    /// When judging should stop (`limits.judge_deadline`, Fetch only).
    pub deadline: Option<Instant>,
}

/// One judged partition.
pub(super) struct Judgement {
    /// (topic index, partition index) in the response.
    pub at: (usize, usize),
    pub plan: PartitionPlan,
    /// Its topic's DLTs are not read back yet (only with `judge_unloaded`).
    pub unloaded: bool,
}

/// What the pipeline makes of a response.
pub(super) struct Judged {
    pub plans: Vec<Judgement>,
    /// Topics (partition `None`) and partitions not judged, and why; the
    /// delivery withholds their records.
    pub unjudged: Vec<(usize, Option<usize>, &'static str)>,
}

/// A diversion not to be written now, and why (`transient`, `breaker`).
pub(super) type Postponed = (Span, &'static str);

impl FetchFilter {
    /// Judge the topics of a response (`views`) of `kind`.
    pub(super) async fn judge_response<C: FetchContext>(
        &self,
        ctx: &C,
        views: Vec<TopicView<'_>>,
        kind: &Kind,
        now: i64,
        seen: &mut Observation,
    ) -> Result<Judged, FilterError> {
        let ids: Vec<Uuid> = (views.iter())
            .filter_map(|v| match v.named {
                Named::Id(id) => Some(id),
                Named::Name(_) => None,
            })
            .collect();
        if !ids.is_empty() {
            // Ids not seen yet are looked up (single-flight, negatively cached).
            ctx.resolve_topic_ids(&ids).await;
        }
        let (jobs, unloaded, unjudged) = self.jobs(ctx, views, kind).await;
        let plans = (self.judge(&jobs, now, seen).await?.into_iter())
            .map(|(at, plan)| Judgement {
                at,
                plan,
                unloaded: unloaded.contains(&at.0),
            })
            .collect();
        Ok(Judged { plans, unjudged })
    }

    /// One planning job per partition with records of a topic to judge;
    /// the topics judged though not loaded; the topics and partitions not
    /// judged, with why.
    #[allow(clippy::type_complexity)]
    async fn jobs<C: FetchContext>(
        &self,
        ctx: &C,
        views: Vec<TopicView<'_>>,
        kind: &Kind,
    ) -> (
        Vec<Arc<PartitionJob>>,
        Vec<usize>,
        Vec<(usize, Option<usize>, &'static str)>,
    ) {
        let policies = self.engine.policies();
        let (mut jobs, mut unloaded, mut unjudged) = (Vec::new(), Vec::new(), Vec::new());
        for (ti, view) in views.into_iter().enumerate() {
            let name = match view.named {
                Named::Id(id) => ctx.topic_name(&id),
                Named::Name(name) => Some(name.to_string()),
            };
            let Some(name) = name else {
                // A policy might cover it: nothing goes out unjudged.
                unjudged.push((ti, None, "unknown_topic"));
                continue;
            };
            let policy = match self.topic_gate(&policies, &name).await {
                TopicGate::Unpoliced => continue,
                TopicGate::Unloaded(policy) if kind.judge_unloaded => {
                    unloaded.push(ti);
                    policy
                }
                TopicGate::Unloaded(_) => {
                    unjudged.push((ti, None, "not_loaded"));
                    continue;
                }
                TopicGate::Judge(policy) => policy,
            };
            let per_key = kind.per_key && policy.ordering == KeyOrdering::PerKey;
            if per_key && !self.keys_current(policy, &name).await {
                unjudged.push((ti, None, "not_loaded"));
                continue;
            }
            let topic: Arc<str> = Arc::from(name.as_str());
            if let Named::Id(id) = view.named {
                // A new id for a known name: the topic was recreated.
                let parts = view.partitions.iter().map(|p| (p.error, p.records));
                self.observe_topic_id(&topic, id, parts);
            }
            for (pi, p) in view.partitions.into_iter().enumerate() {
                let Some(records) = p.records.filter(|r| !r.is_empty()) else {
                    continue;
                };
                if let Some(why) = p.refused {
                    unjudged.push((ti, Some(pi), why));
                    continue;
                }
                jobs.push(Arc::new(PartitionJob {
                    at: (ti, pi),
                    policy: policy.clone(),
                    topic: topic.clone(),
                    partition: p.index,
                    records: records.clone(),
                    vis: p.vis,
                    gate: per_key.then(|| self.blocked.gate(&name, p.index)),
                    deadline: kind.deadline,
                }));
            }
        }
        (jobs, unloaded, unjudged)
    }

    /// Whether the blocked keys of `policy`'s DLTs are read back and kept
    /// current (waiting up to the DLT timeout): a key another instance
    /// blocked is known only once read from its DLT.
    async fn keys_current(&self, policy: &crate::policy::Policy, name: &str) -> bool {
        let dlts = crate::dlt::blocked::dlts_of(policy, name);
        self.blocked.is_current_for(&dlts)
            || self.blocked.wait_current_for(&dlts, self.timeout).await
    }

    /// Take out of `plan.diversions` what may not be written now: each
    /// transient verdict (the registry did not answer), and everything
    /// from where an open (or now tripping) breaker cuts. Sorted by offset.
    pub(super) fn postpone(&self, plan: &mut PartitionPlan) -> Vec<Postponed> {
        let mut postponed = Vec::new();
        plan.diversions.retain(|d| {
            let transient = d.invalid.class == Class::Transient;
            if transient {
                postponed.push((span_of(d), "transient"));
            }
            !transient
        });
        if let Some(cut) = self.breaker_cut(plan) {
            plan.diversions.retain(|d| {
                let before = d.origin_offset < cut;
                if !before {
                    postponed.push((span_of(d), "breaker"));
                }
                before
            });
        }
        postponed.sort_unstable();
        postponed
    }

    /// Whether the records of topic `name` are judged, and under which
    /// policy. A glob may also cover a dead-letter topic: never police
    /// those. Until its DLTs are read back (given up to the DLT timeout),
    /// the ledger cannot say which records were diverted before.
    pub(super) async fn topic_gate<'p>(
        &self,
        policies: &'p PolicySet,
        name: &str,
    ) -> TopicGate<'p> {
        let Some(policy) = policies.policing(name) else {
            return TopicGate::Unpoliced;
        };
        if self
            .dead_letter
            .wait_loaded_for(policy, name, self.timeout)
            .await
        {
            TopicGate::Judge(policy)
        } else {
            TopicGate::Unloaded(policy)
        }
    }

    /// Plan `jobs` (with registry misses resolved, within the registry's
    /// wait); each plan with where it is in the response.
    pub(super) async fn judge(
        &self,
        jobs: &[Arc<PartitionJob>],
        now: i64,
        seen: &mut Observation,
    ) -> Result<Vec<((usize, usize), PartitionPlan)>, FilterError> {
        let mut planned = self.plan_all(jobs.to_vec(), now, seen).await?;
        if let Some(registry) = self.engine.registry() {
            self.resolve_transient(registry, jobs, &mut planned, now)
                .await?;
        }
        self.judge_behind(jobs, &planned, now, seen);
        Ok(planned)
    }

    /// The offset from which `plan`'s diversions must not be written: the
    /// circuit breaker is open or trips there (`None`: write them all).
    /// A record in its DLT already is neither counted nor cut.
    pub(super) fn breaker_cut(&self, plan: &PartitionPlan) -> Option<i64> {
        let ledger = &self.ledger;
        self.breakers.cut(plan, |d| {
            ledger.contains(&(d.origin_topic.clone(), d.origin_partition, d.origin_offset))
        })
    }

    /// Tell the ledger topic `name`'s id, as a response names it, but only
    /// from a topic entry that proves the id is live: a partition with
    /// records and no error. An entry that carries only an error (a client
    /// still asking by a deleted topic's id, answered UNKNOWN_TOPIC_ID)
    /// proves nothing, and believing it would wipe the ledger's entries of
    /// the topic recreated under that name.
    pub(super) fn observe_topic_id<'a>(
        &self,
        name: &Arc<str>,
        id: Uuid,
        partitions: impl IntoIterator<Item = (i16, Option<&'a Bytes>)>,
    ) {
        let live = partitions
            .into_iter()
            .any(|(error, records)| error == 0 && records.is_some_and(|r| !r.is_empty()));
        if live {
            self.ledger.observe_topic_id(name, id);
        }
    }

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
                        &self.ledger,
                    );
                }
            }
        }
        Ok(())
    }
}

/// The offsets a diversion covers: its record, or its whole batch.
pub(super) fn span_of(d: &Diversion) -> Span {
    let first = d.origin_offset;
    (first, d.last_offset.unwrap_or(first).max(first))
}

/// Where a topic's records stand before judging (`FetchFilter::topic_gate`).
pub(super) enum TopicGate<'p> {
    /// No policy covers the topic, or it is a dead-letter topic: forwarded.
    Unpoliced,
    /// Its DLTs are not read back yet: held (a Fetch), or judged without
    /// writing to them (a ShareFetch), under this policy.
    Unloaded(&'p Arc<Policy>),
    /// Judged under this policy.
    Judge(&'p Arc<Policy>),
}

/// Rounds of fetch-then-replan per response: the second covers a subject
/// list asked for only once the schema was known.
const ROUNDS: usize = 2;

fn has_transient(plan: &PartitionPlan) -> bool {
    plan.diversions
        .iter()
        .any(|d| d.invalid.class == Class::Transient)
}
