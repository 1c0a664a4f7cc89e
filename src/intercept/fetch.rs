//! Fetch interception: the only place response records are inspected.
//!
//! For each partition of a policy-covered topic in a Fetch response, the
//! records section is split into batches; batches that a policy finds
//! nothing wrong with are forwarded as their original bytes; batches that
//! lose records are spliced (`kafka::batch`). Diverted records are written
//! to their dead-letter topic and the response is released only once every
//! diversion is acknowledged. A diversion that fails holds its partition:
//! the data is cut just before the first record not safely diverted, so the
//! client fetches it again later; nothing past it is delivered, other
//! partitions flow on.
//!
//! With `limits.judge_deadline`, a partition may go out cut short at a
//! batch boundary (`plan::Cut`), the rest judged in the background for the
//! client's next fetch (`parallel::judge_behind`).
//!
//! Planning (`plan`) is pure; this module adds running it for the
//! partitions of a response (on several cores when there is enough data:
//! `parallel`), the awaiting of diversions, the re-encoding of the
//! response, and the accounting of the CPU all that takes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::FetchableTopicResponse;
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::protocol::Decodable;
use tracing::debug;
use uuid::Uuid;

use crate::clock::now_ms;
use crate::dlt::blocked::BlockedKeys;
use crate::dlt::breaker::Breakers;
use crate::dlt::ledger::Ledger;
use crate::dlt::DeadLetter;
use crate::engine::Engine;
use crate::kafka::batch::BatchError;
use crate::metrics::{self, Observation};
pub use crate::plan::verdicts::VerdictCache;
use crate::plan::{PartitionPlan, Visibility};
use crate::policy::PolicySet;
pub use deliver::Holds;
use pipeline::{Judgement, Kind, Named, PartView, TopicView};

/// Fetch isolation levels (request field, v4+).
pub const READ_COMMITTED: i8 = 1;

/// Why a Fetch response could not be filtered; the relay ends that
/// connection (the client reconnects and fetches again), never forwards it.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("Fetch response does not decode: {0}")]
    Decode(anyhow::Error),
    #[error("Fetch response does not encode: {0}")]
    Encode(anyhow::Error),
    #[error("records section cannot be rebuilt: {0}")]
    Splice(#[from] BatchError),
    #[error("planning task failed: {0}")]
    Planner(#[from] tokio::task::JoinError),
}

/// What the Fetch filter asks of the proxy around it: broker addresses and
/// topic names. The filter never reaches into the proxy's state, so it
/// depends only on the layers below it (the proxy implements this).
pub trait FetchContext: Send + Sync {
    /// What rewriting a response's endpoints learned about the cluster.
    type Learned: Send + Default;
    /// Point the broker endpoints a Fetch v16+ response names (KIP-951) at
    /// the proxy; whether anything changed, and what was learned.
    fn rewrite_endpoints(&self, resp: &mut FetchResponse) -> (bool, Self::Learned);
    /// The same for a ShareFetch response's NodeEndpoints (KIP-932).
    fn rewrite_share_endpoints(
        &self,
        _resp: &mut kafka_protocol::messages::ShareFetchResponse,
    ) -> (bool, Self::Learned) {
        (false, Self::Learned::default())
    }
    /// Record what `rewrite_endpoints` learned (may open broker listeners).
    fn learn(&self, learned: Self::Learned) -> impl Future<Output = ()> + Send;
    /// Look up topic ids not known yet (Fetch v13+ names topics by id).
    fn resolve_topic_ids(&self, ids: &[Uuid]) -> impl Future<Output = ()> + Send;
    /// The name of topic `id`, if known.
    fn topic_name(&self, id: &Uuid) -> Option<String>;
}

/// Fetch interception, one of the engine's two handlers (the other is the
/// Produce door): what the Fetch path needs besides the engine.
pub struct FetchFilter {
    /// The policy snapshot, verdict cache, decode budget and registry.
    pub engine: Arc<Engine>,
    pub dead_letter: Arc<DeadLetter>,
    /// The dead-letter writer's ledger: what planning asks (which records
    /// are in their DLT already) and the breaker's cut skips.
    ledger: Arc<Ledger>,
    /// How long a response waits for its diversions to be acknowledged.
    pub timeout: Duration,
    /// Keys parked behind a diverted record (`ordering: per_key`).
    pub blocked: Arc<BlockedKeys>,
    /// Idle cores judge ahead in large partitions (`filter::parallel`).
    judge_ahead: bool,
    /// How long a response waits for judging (`limits.judge_deadline`).
    judge_deadline: Option<Duration>,
    /// The diversion circuit breakers (`breaker:` of a policy).
    pub breakers: Arc<Breakers>,
}

impl FetchFilter {
    pub fn new(
        engine: Arc<Engine>,
        dead_letter: Arc<DeadLetter>,
        (blocked, breakers): (Arc<BlockedKeys>, Arc<Breakers>),
        timeout: Duration,
    ) -> Self {
        FetchFilter {
            engine,
            ledger: dead_letter.ledger().clone(),
            dead_letter,
            timeout,
            blocked,
            judge_ahead: true,
            judge_deadline: None,
            breakers,
        }
    }

    /// Whether idle cores judge ahead in large partitions
    /// (`limits.judge_ahead`, on by default).
    pub fn with_judge_ahead(mut self, on: bool) -> Self {
        self.judge_ahead = on;
        self
    }

    /// How long a response waits for its records to be judged before each
    /// partition is cut at its next batch still to judge
    /// (`limits.judge_deadline`; unset by default: until all are judged).
    pub fn with_judge_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.judge_deadline = deadline;
        self
    }

    /// Swap in a new, fully compiled policy set: the dead-letter side
    /// learns it first, then the engine swaps its snapshot (dropping
    /// verdicts of the old one; the DLT follower reads the new one), then
    /// breakers of policies whose text changed close.
    pub fn replace_policies(&self, new: PolicySet) {
        let new = Arc::new(new);
        self.dead_letter.policies_changed(new.clone());
        let old = self.engine.swap(new.clone());
        self.breakers.reset(&old, &new);
    }

    /// Filter a Fetch response body; `Ok(None)` means forward it unchanged.
    /// What it came to is reported once (`metrics::Observation`).
    pub async fn filter<C: FetchContext>(
        &self,
        ctx: &C,
        holds: &mut Holds,
        body: Bytes,
        version: i16,
        isolation: i8,
    ) -> Result<Option<Vec<Bytes>>, FilterError> {
        let mut seen = Observation::start();
        let out = (self.filter_seen(ctx, holds, body, version, isolation, &mut seen)).await;
        metrics::global().observe(seen);
        out
    }

    async fn filter_seen<C: FetchContext>(
        &self,
        ctx: &C,
        holds: &mut Holds,
        body: Bytes,
        version: i16,
        isolation: i8,
        seen: &mut Observation,
    ) -> Result<Option<Vec<Bytes>>, FilterError> {
        let kind = Kind {
            per_key: true,
            judge_unloaded: false,
            deadline: (self.judge_deadline).map(|d| std::time::Instant::now() + d),
        };
        let (mut resp, sections, endpoints, learned) =
            timed(seen, || -> Result<_, FilterError> {
                let mut resp = FetchResponse::decode(&mut body.clone(), version)
                    .map_err(FilterError::Decode)?;
                let sections = patch::Sections::of(&body, &resp);
                let (endpoints, learned) = ctx.rewrite_endpoints(&mut resp);
                Ok((resp, sections, endpoints, learned))
            })?;
        let mut changed = endpoints;
        ctx.learn(learned).await;
        let views = views(&resp, version, isolation);
        let judged = (self.judge_response(ctx, views, &kind, now_ms(), seen)).await?;
        for &(ti, _, why) in &judged.unjudged {
            changed |= hold_topic(&mut resp.responses[ti], why);
        }
        let plans = self.hold_or_count(judged.plans, seen);
        let out = |resp: &mut FetchResponse, replaced: Vec<_>| {
            let fresh = patch::Fresh {
                body: &body,
                version,
                sections: &sections,
                endpoints,
            };
            fresh.body(resp, replaced)
        };
        if plans.is_empty() {
            return timed(seen, || {
                changed.then(|| out(&mut resp, Vec::new())).transpose()
            });
        }
        // Divert everything first, concurrently, then apply the outcome.
        let waiting = std::time::Instant::now();
        let failed = {
            let refs: Vec<&PartitionPlan> = plans.iter().map(|(_, p, _)| p).collect();
            self.divert(&refs).await
        };
        if plans.iter().any(|(_, p, _)| !p.diversions.is_empty()) {
            seen.dlt_wait = Some(waiting.elapsed());
        }
        let (filtered, cpu) = cpu_of(|| {
            let mut replaced = Vec::with_capacity(plans.len());
            for ((at, plan, transient), failed) in plans.into_iter().zip(failed) {
                let outcome = (&failed[..], transient);
                let chunks = deliver::deliver(holds, &self.blocked, &plan, outcome, seen)?;
                replaced.push((at, chunks));
            }
            Ok(Some(out(&mut resp, replaced)?))
        });
        seen.cpu += cpu;
        filtered
    }

    /// What may not be written now is postponed (`pipeline`), and the
    /// partition held there. The plans that change their partition, each
    /// with its first transient record's offset; the others are counted
    /// now and their holds cleared.
    #[allow(clippy::type_complexity)]
    fn hold_or_count(
        &self,
        judged: Vec<Judgement>,
        seen: &mut Observation,
    ) -> Vec<((usize, usize), PartitionPlan, Option<i64>)> {
        let mut plans = Vec::new();
        for Judgement { at, mut plan, .. } in judged {
            let postponed = self.postpone(&mut plan);
            let transient = deliver::hold_postponed(&mut plan, &postponed);
            if plan.changes_anything() || transient.is_some() {
                // Its blocks are learnt once its diversions are done.
                plans.push((at, plan, transient));
            } else {
                deliver::learn_keys(&self.blocked, &plan, None);
                seen.partitions.push(deliver::count(&plan, None));
                seen.held.push((plan.topic.clone(), plan.partition, false));
            }
        }
        plans
    }
}

/// A Fetch response's topics as the pipeline reads them.
fn views(resp: &FetchResponse, version: i16, isolation: i8) -> Vec<TopicView<'_>> {
    (resp.responses.iter())
        .map(|t| TopicView {
            named: match version >= 13 {
                true => Named::Id(t.topic_id),
                false => Named::Name(t.topic.0.as_str()),
            },
            partitions: (t.partitions.iter())
                .map(|p| PartView {
                    index: p.partition_index,
                    error: p.error_code,
                    records: p.records.as_ref(),
                    vis: Visibility::new(
                        isolation == READ_COMMITTED,
                        p.aborted_transactions.as_deref(),
                    )
                    .with_log_start(p.log_start_offset),
                    refused: None,
                })
                .collect(),
        })
        .collect()
}

/// Withhold every partition's records of `topic`, not judged because
/// `why` (its id not known yet, its DLTs or blocked keys not read back):
/// the client fetches them again later. Whether anything changed.
fn hold_topic(topic: &mut FetchableTopicResponse, why: &str) -> bool {
    let mut changed = false;
    for p in topic.partitions.iter_mut() {
        if p.records.as_ref().is_some_and(|r| !r.is_empty()) {
            debug!(
                topic_id = %topic.topic_id,
                partition = p.partition_index,
                why,
                "records withheld: not judged yet"
            );
            p.records = Some(Bytes::new());
            changed = true;
        }
    }
    changed
}

/// Run `f` and add the CPU time it took on this thread to `seen`. `f` is
/// synchronous, so the task cannot move to another thread while it runs.
fn timed<R>(seen: &mut Observation, f: impl FnOnce() -> R) -> R {
    let (out, cpu) = cpu_of(f);
    seen.cpu += cpu;
    out
}

/// Run `f`: its result and the CPU time it took on this thread.
fn cpu_of<R>(f: impl FnOnce() -> R) -> (R, Duration) {
    let start = thread_cpu_time();
    let out = f();
    (out, thread_cpu_time().saturating_sub(start))
}

fn thread_cpu_time() -> Duration {
    cpu_time::ThreadTime::try_now().map_or(Duration::ZERO, |t| t.as_duration())
}

mod deliver;
mod divert;
mod parallel;
mod patch;
mod pipeline;
pub mod share;
mod share_patch;

// FetchFilter::filter end to end against a dead-letter writer on the mock broker.
#[cfg(test)]
mod fetch_tests;
// FetchFilter::filter_share likewise.
#[cfg(test)]
mod share_tests;
