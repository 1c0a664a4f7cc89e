//! What one Fetch or ShareFetch response came to, as the data path saw
//! it: the filter fills one [`Observation`] while it judges and rewrites a
//! response and hands it over once ([`Metrics::observe`]); turning it into
//! series (counters, gauges, histograms, the console's history) is this
//! module's job, not the data path's. Among them, how long a Fetch
//! response with diversions was held, split by cause
//! (`antidote_fetch_diverting_hold_seconds`): the proxy's own work
//! (decoding, judging, splicing) and the wait for the DLT to acknowledge
//! the diversions, which the no-loss guarantee requires; the relay
//! histogram (`antidote_response_relay_duration_seconds`) shows only
//! their sum.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::series::{register, relay_histogram, LatencyCtor};
use super::*;

/// One response's judging and rewriting, reported once.
pub struct Observation {
    started: Instant,
    /// CPU time of the proxy's threads (decoding, judging, splicing,
    /// encoding), the dead-letter wait excluded.
    pub cpu: Duration,
    /// Time spent waiting for the dead-letter topic, when diversions were
    /// written (`antidote_fetch_diverting_hold_seconds`).
    pub dlt_wait: Option<Duration>,
    /// Partitions cut short by the judging deadline.
    pub deadline_cuts: u64,
    /// Each planned partition's judging.
    pub partitions: Vec<super::Judged>,
    /// Batches that could not be judged, so their partition was held at
    /// them: topic, partition and reason, in order.
    pub held_batches: Vec<(Arc<str>, i32, &'static str)>,
    /// Whether each planned partition of a Fetch is held after it
    /// (noted after the held batches: the console reads the reason first).
    pub held: Vec<(Arc<str>, i32, bool)>,
    /// A ShareFetch answer's share bookkeeping: acknowledgement errors
    /// settled, records withheld, acknowledgements owed or dropped.
    pub share: super::ShareSeen,
}

impl Observation {
    /// A response's observation, its clock started now.
    pub fn start() -> Self {
        Observation {
            started: Instant::now(),
            cpu: Duration::ZERO,
            dlt_wait: None,
            deadline_cuts: 0,
            partitions: Vec::new(),
            held_batches: Vec::new(),
            held: Vec::new(),
            share: super::ShareSeen::default(),
        }
    }

    /// `n` acquired records withheld from the member for `reason`.
    pub fn withheld(&mut self, reason: &'static str, n: u64) {
        self.share.withheld(reason, n);
    }
}

impl Metrics {
    /// Turn one response's observation into series.
    ///
    /// Call site: `intercept::fetch::FetchFilter::{filter, filter_share}`,
    /// once per judged response, whatever its outcome.
    pub fn observe(&self, seen: Observation) {
        self.fetch_rewrite_cpu(seen.cpu);
        self.deadline_cuts.inc_by(seen.deadline_cuts);
        for j in &seen.partitions {
            self.partition_judged(j);
        }
        for (topic, partition, reason) in &seen.held_batches {
            self.held_batch(topic, *partition, reason);
        }
        for (topic, partition, held) in &seen.held {
            self.set_held(topic, *partition, *held);
        }
        self.share_seen(seen.share);
        let total = seen.started.elapsed();
        if let Some(dlt) = seen.dlt_wait {
            self.hold.diverting_response(total, dlt);
        }
        self.fetch_rewrite_latency(total);
    }

    /// CPU time (of the calling thread) spent decoding, judging, splicing
    /// and re-encoding one Fetch response, the dead-letter wait excluded.
    ///
    /// Call sites: `Metrics::observe` (a response's), and judging ahead
    /// for a later response (`intercept::fetch::parallel`).
    pub fn fetch_rewrite_cpu(&self, d: Duration) {
        self.fetch_rewrite_cpu.inc_by(d.as_secs_f64());
    }

    /// Set whether `topic`/`partition` is held (a diversion failed).
    ///
    /// Call site: `Metrics::observe`, for each partition a Fetch planned:
    /// `true` where it is held, `false` once a later response for the same
    /// partition was delivered whole.
    pub fn set_held(&self, topic: &str, partition: i32, held: bool) {
        self.held
            .with(&(topic, partition), |g| g.set(i64::from(held)));
        history::global().set_held(topic, partition, held);
    }

    /// A batch of `topic`/`partition` could not be judged (`reason`:
    /// `undecodable`, `legacy` or `budget`), so the partition was held at it.
    ///
    /// Call sites: `Metrics::observe`, once per response per held partition;
    /// the Produce door for a transient verdict.
    pub fn held_batch(&self, topic: &str, partition: i32, reason: &'static str) {
        history::global().note_hold(topic, partition, reason);
        let labels = HeldBatchLabels {
            topic: topic.to_owned(),
            partition,
            reason: reason.to_owned(),
        };
        self.held_batches.with(&labels, |c| c.inc());
    }

    /// One Fetch response was inspected and rewritten in `d`.
    ///
    /// Call site: `Metrics::observe`, from the filter's start to its report
    /// (only for responses that were actually inspected).
    pub fn fetch_rewrite_latency(&self, d: Duration) {
        self.fetch_rewrite_seconds.observe(d.as_secs_f64());
    }
}

pub const FETCH_HOLD_SECONDS: &str = "antidote_fetch_diverting_hold_seconds";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PartLabel {
    part: &'static str,
}

/// The series of this module.
pub struct HoldMetrics {
    seconds: Family<PartLabel, Histogram, LatencyCtor>,
}

impl Default for HoldMetrics {
    fn default() -> Self {
        HoldMetrics {
            seconds: Family::new_with_constructor(relay_histogram as LatencyCtor),
        }
    }
}

impl HoldMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        register(
            r,
            FETCH_HOLD_SECONDS,
            "Time a Fetch response with diversions was held by the proxy, by part: proxy (decoding, judging, splicing) and dlt (waiting for the dead-letter topic to acknowledge its diversions).",
            self.seconds.clone(),
        );
    }

    /// A Fetch response with diversions was held `total`, of which `dlt`
    /// waiting for their acknowledgements.
    ///
    /// Call site: `Metrics::observe`, for a response with diversions.
    pub fn diverting_response(&self, total: Duration, dlt: Duration) {
        for (part, d) in [("proxy", total.saturating_sub(dlt)), ("dlt", dlt)] {
            self.seconds
                .get_or_create(&PartLabel { part })
                .observe(d.as_secs_f64());
        }
    }
}
