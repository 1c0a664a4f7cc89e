//! The proxy's metrics: a `prometheus-client` registry with typed methods
//! for the data path, and nothing else.
//!
//! Owns every metric name antidote exports (see [`names`]); the alert rules
//! in `ops/prometheus-alerts.yaml`, the dashboard in
//! `ops/grafana-dashboard.json` and the README's metrics table use these
//! names and must follow them. It never does I/O: the admin listener
//! (`crate::admin`) serves [`Metrics::render`].
//!
//! Exposition: the Prometheus text format 0.0.4 (`prometheus-client`'s
//! `prometheus_text` encoder), as before the crate was adopted, so every
//! `# TYPE` line keeps its `_total` name. Counters are registered without
//! `_total` because the encoder appends it.
//!
//! Recording stays an atomic add: each label set is resolved in the
//! crate's `Family` once and the metric handle is cached in a sharded map
//! ([`Cached`]), so a hit is a read lock on one shard plus the add; only
//! the first sighting of a label set takes the family's write lock.
//!
//! Cardinality: labels are topic, partition, policy, class, rule (bounded by
//! the policy files), action, listener and error kind. Topic-partition labels
//! exist only for policy topics, which is what operators need to find the
//! partition that is producing poison.
//!
//! The DLT rate is derived, not stored:
//!
//! ```text
//! sum(rate(antidote_records_invalid_total{action="diverted"}[5m]))
//!   / sum(rate(antidote_records_validated_total[5m]))
//! ```

use std::hash::Hash;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use prometheus_client::encoding::{prometheus_text, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};

/// Every exported metric name, in one place (as scraped: counters with
/// their `_total`).
pub mod names {
    pub const VALIDATED: &str = "antidote_records_validated_total";
    pub const PASSED: &str = "antidote_records_passed_total";
    pub const EVALUATED: &str = "antidote_records_evaluated_total";
    pub const FETCH_REWRITE_CPU: &str = "antidote_fetch_rewrite_cpu_seconds_total";
    pub const INVALID: &str = "antidote_records_invalid_total";
    pub const DLT_WRITES: &str = "antidote_dlt_writes_total";
    pub const DLT_WRITE_SECONDS: &str = "antidote_dlt_write_duration_seconds";
    pub const HELD_PARTITIONS: &str = "antidote_held_partitions";
    pub const HELD_BATCHES: &str = "antidote_held_batches_total";
    pub const FETCH_REWRITE_SECONDS: &str = "antidote_fetch_rewrite_duration_seconds";
    pub const CONNECTIONS_OPEN: &str = "antidote_connections_open";
    pub const CONNECTIONS_ACCEPTED: &str = "antidote_connections_accepted_total";
    pub const UPSTREAM_ERRORS: &str = "antidote_upstream_errors_total";
    pub const CONNECTIONS_REFUSED: &str = "antidote_connections_refused_total";
    pub const BUILD_INFO: &str = "antidote_build_info";
    pub const START_TIME: &str = "antidote_process_start_time_seconds";

    /// The name a counter is registered under: the encoder adds `_total`.
    pub(super) fn counter_base(name: &'static str) -> &'static str {
        name.strip_suffix("_total").unwrap_or(name)
    }
}

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// What happened to an invalid record (the `action` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidAction {
    /// Written to its dead-letter topic and removed from the response.
    Diverted,
    /// Removed from the response, not written anywhere (`on_invalid: drop`).
    Dropped,
    /// Delivered to the consumer although invalid (`on_invalid: pass`).
    PassedInvalid,
}

impl InvalidAction {
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidAction::Diverted => "diverted",
            InvalidAction::Dropped => "dropped",
            InvalidAction::PassedInvalid => "passed_invalid",
        }
    }
}

impl From<crate::policy::Action> for InvalidAction {
    fn from(a: crate::policy::Action) -> Self {
        match a {
            crate::policy::Action::Divert => InvalidAction::Diverted,
            crate::policy::Action::Drop => InvalidAction::Dropped,
            crate::policy::Action::Pass => InvalidAction::PassedInvalid,
        }
    }
}

/// Latency buckets in seconds: 0.5 ms .. 10 s (the dashboard's quantiles
/// assume these).
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS.iter().copied())
}

type LatencyCtor = fn() -> Histogram;

// Label sets. Field order is label order in the output.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicPartitionPolicy {
    topic: String,
    partition: i32,
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InvalidLabels {
    topic: String,
    partition: i32,
    policy: String,
    class: &'static str,
    rule: String,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicPartition {
    topic: String,
    partition: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeldBatchLabels {
    topic: String,
    partition: i32,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// Label values as a call site holds them, matched against the cache
/// without building the owned label set: on the data path a known series
/// costs a hash, one shard's read lock and the atomic add, no allocation.
trait LabelsRef<S>: Hash {
    fn is(&self, owned: &S) -> bool;
    fn to_labels(&self) -> S;
}

impl<S: Clone + Hash + Eq> LabelsRef<S> for S {
    fn is(&self, owned: &S) -> bool {
        self == owned
    }
    fn to_labels(&self) -> S {
        self.clone()
    }
}

impl LabelsRef<TopicPartitionPolicy> for (&str, i32, &str) {
    fn is(&self, o: &TopicPartitionPolicy) -> bool {
        (o.topic.as_str(), o.partition, o.policy.as_str()) == *self
    }
    fn to_labels(&self) -> TopicPartitionPolicy {
        TopicPartitionPolicy {
            topic: self.0.to_owned(),
            partition: self.1,
            policy: self.2.to_owned(),
        }
    }
}

impl LabelsRef<TopicPartition> for (&str, i32) {
    fn is(&self, o: &TopicPartition) -> bool {
        (o.topic.as_str(), o.partition) == *self
    }
    fn to_labels(&self) -> TopicPartition {
        TopicPartition {
            topic: self.0.to_owned(),
            partition: self.1,
        }
    }
}

/// [`InvalidLabels`], borrowed.
#[derive(Hash)]
struct InvalidRef<'a> {
    topic: &'a str,
    partition: i32,
    policy: &'a str,
    class: &'static str,
    rule: &'a str,
    action: &'static str,
}

impl LabelsRef<InvalidLabels> for InvalidRef<'_> {
    fn is(&self, o: &InvalidLabels) -> bool {
        o.topic == self.topic
            && o.partition == self.partition
            && o.policy == self.policy
            && o.class == self.class
            && o.rule == self.rule
            && o.action == self.action
    }
    fn to_labels(&self) -> InvalidLabels {
        InvalidLabels {
            topic: self.topic.to_owned(),
            partition: self.partition,
            policy: self.policy.to_owned(),
            class: self.class,
            rule: self.rule.to_owned(),
            action: self.action,
        }
    }
}

/// A stable hash of label values (SipHash with fixed keys), the cache key.
/// Each family is always looked up through one [`LabelsRef`] type, so one
/// series always has one hash.
fn labels_hash(labels: &impl Hash) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    labels.hash(&mut h);
    std::hash::Hasher::finish(&h)
}

/// A labelled family plus a cache of its resolved series.
///
/// The family's own lookup takes its single `RwLock` and needs the owned
/// label set; the cache is sharded, keyed by [`labels_hash`] (series with
/// equal hashes share a bucket), and holds the same `Arc`-backed handle the
/// family encodes, so recording through it is seen by the scrape.
struct Cached<S, M, C = fn() -> M> {
    family: Family<S, M, C>,
    cache: DashMap<u64, Vec<(S, M)>>,
}

impl<S, M> Cached<S, M>
where
    S: Clone + Hash + Eq,
    M: Default,
{
    fn new() -> Self {
        Cached {
            family: Family::default(),
            cache: DashMap::new(),
        }
    }
}

impl<S, M, C> Cached<S, M, C>
where
    S: Clone + Hash + Eq,
    M: Clone,
    C: MetricConstructor<M>,
{
    fn with_constructor(c: C) -> Self {
        Cached {
            family: Family::new_with_constructor(c),
            cache: DashMap::new(),
        }
    }

    /// Run `f` on the series of `labels`, creating it if new.
    fn with<R>(&self, labels: &impl LabelsRef<S>, f: impl FnOnce(&M) -> R) -> R {
        let h = labels_hash(labels);
        if let Some(bucket) = self.cache.get(&h) {
            if let Some((_, m)) = bucket.iter().find(|(s, _)| labels.is(s)) {
                return f(m);
            }
        }
        let owned = labels.to_labels();
        let m = self.family.get_or_create_owned(&owned);
        let mut bucket = self.cache.entry(h).or_default();
        // Another thread may have added it between the two locks.
        let i = match bucket.iter().position(|(s, _)| labels.is(s)) {
            Some(i) => i,
            None => {
                bucket.push((owned, m));
                bucket.len() - 1
            }
        };
        f(&bucket[i].1)
    }

    /// Run `f` on the series of `labels` if it exists.
    fn peek<R>(&self, labels: &impl LabelsRef<S>, f: impl FnOnce(&M) -> R) -> Option<R> {
        let bucket = self.cache.get(&labels_hash(labels))?;
        bucket.iter().find(|(s, _)| labels.is(s)).map(|(_, m)| f(m))
    }

    /// Run `f` on every series.
    fn for_each(&self, mut f: impl FnMut(&M)) {
        for bucket in self.cache.iter() {
            bucket.value().iter().for_each(|(_, m)| f(m));
        }
    }
}

/// A family that is declared (`# HELP`, `# TYPE`) even before its first
/// series, as the hand-written registry did: a scrape then shows every
/// name antidote exports, and a test can check them on a fresh proxy.
/// `prometheus-client` leaves empty families out.
#[derive(Debug)]
struct Declared<M>(M);

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// Every metric the proxy exports. Share one instance ([`global`]).
pub struct Metrics {
    registry: Registry,
    validated: Cached<TopicPartitionPolicy, Counter>,
    evaluated: Cached<PolicyLabel, Counter>,
    fetch_rewrite_cpu: Counter<f64, AtomicU64>,
    passed: Cached<TopicPartitionPolicy, Counter>,
    invalid: Cached<InvalidLabels, Counter>,
    dlt_writes: Cached<ResultLabel, Counter>,
    dlt_write_seconds: Cached<ResultLabel, Histogram, LatencyCtor>,
    held: Cached<TopicPartition, Gauge>,
    held_batches: Cached<HeldBatchLabels, Counter>,
    fetch_rewrite_seconds: Histogram,
    connections_open: Cached<ListenerLabel, Gauge>,
    connections_accepted: Cached<ListenerLabel, Counter>,
    upstream_errors: Cached<KindLabel, Counter>,
    connections_refused: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Register `metric` under `name`, stripping a counter's `_total` and the
/// help text's final period (the encoder appends both).
fn register(registry: &mut Registry, name: &'static str, help: &str, metric: impl Metric) {
    let help = help.strip_suffix('.').unwrap_or(help);
    registry.register(names::counter_base(name), help, Declared(metric));
}

impl Metrics {
    pub fn new() -> Self {
        let m = Metrics {
            registry: Registry::default(),
            validated: Cached::new(),
            evaluated: Cached::new(),
            fetch_rewrite_cpu: Counter::default(),
            passed: Cached::new(),
            invalid: Cached::new(),
            dlt_writes: Cached::new(),
            dlt_write_seconds: Cached::with_constructor(latency_histogram as LatencyCtor),
            held: Cached::new(),
            held_batches: Cached::new(),
            fetch_rewrite_seconds: latency_histogram(),
            connections_open: Cached::new(),
            connections_accepted: Cached::new(),
            upstream_errors: Cached::new(),
            connections_refused: Counter::default(),
        };
        m.registered()
    }

    /// Register every metric, in the order the old hand-written exposition
    /// had (operators diff scrapes).
    fn registered(mut self) -> Self {
        use names::*;
        let r = &mut self.registry;
        let build: Family<VersionLabel, Gauge> = Family::default();
        build
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        register(
            r,
            BUILD_INFO,
            "Always 1; the version label says which antidote runs.",
            build,
        );
        let start: Gauge<f64, AtomicU64> = Gauge::default();
        start.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        );
        register(
            r,
            START_TIME,
            "Start time of the process, seconds since the epoch.",
            start,
        );
        register(
            r,
            VALIDATED,
            "Records judged against a policy.",
            self.validated.family.clone(),
        );
        register(
            r,
            EVALUATED,
            "Records run through a policy's validator (verdict cache misses).",
            self.evaluated.family.clone(),
        );
        register(
            r,
            FETCH_REWRITE_CPU,
            "CPU seconds spent decoding, judging, splicing and re-encoding Fetch responses.",
            self.fetch_rewrite_cpu.clone(),
        );
        register(
            r,
            PASSED,
            "Records judged valid and delivered to the consumer.",
            self.passed.family.clone(),
        );
        register(
            r,
            INVALID,
            "Records judged invalid, by class, failing rule and action (diverted, dropped, passed_invalid).",
            self.invalid.family.clone(),
        );
        self.register_dlt_and_connections();
        self
    }

    fn register_dlt_and_connections(&mut self) {
        use names::*;
        let r = &mut self.registry;
        register(
            r,
            DLT_WRITES,
            "Dead-letter produce requests, by result (ok, error).",
            self.dlt_writes.family.clone(),
        );
        register(
            r,
            DLT_WRITE_SECONDS,
            "Time from a dead-letter write starting to its acks=all acknowledgement (or failure).",
            self.dlt_write_seconds.family.clone(),
        );
        register(
            r,
            HELD_PARTITIONS,
            "1 while a partition is held because a diversion failed, else 0.",
            self.held.family.clone(),
        );
        register(
            r,
            HELD_BATCHES,
            "Fetch responses in which a batch could not be judged and its partition was held there, by reason (undecodable, legacy, budget).",
            self.held_batches.family.clone(),
        );
        register(
            r,
            FETCH_REWRITE_SECONDS,
            "Time spent inspecting and rewriting one Fetch response, diversions included.",
            self.fetch_rewrite_seconds.clone(),
        );
        register(
            r,
            CONNECTIONS_OPEN,
            "Client connections open, by listener.",
            self.connections_open.family.clone(),
        );
        register(
            r,
            CONNECTIONS_ACCEPTED,
            "Client connections accepted, by listener.",
            self.connections_accepted.family.clone(),
        );
        register(
            r,
            UPSTREAM_ERRORS,
            "Errors talking to upstream brokers, by kind (connect, tls, io, protocol, timeout, ...).",
            self.upstream_errors.family.clone(),
        );
        register(
            r,
            CONNECTIONS_REFUSED,
            "Client connections closed at once because limits.max_connections was reached.",
            self.connections_refused.clone(),
        );
    }

    /// `n` records of `topic`/`partition` were judged under `policy`.
    ///
    /// Call site: `plan::plan_partition` (or `FetchFilter::filter`
    /// right after it), once per partition with the number of records judged
    /// in this response, including those whose verdict came from the
    /// `VerdictCache` (the DLT rate is per delivered record, not per
    /// validation run). Not called for aborted transactional batches.
    pub fn record_validated(&self, topic: &str, partition: i32, policy: &str, n: u64) {
        self.validated
            .with(&(topic, partition, policy), |c| c.inc_by(n));
    }

    /// `n` records were run through `policy`'s validator, i.e. judged
    /// without a verdict from the `VerdictCache`. With several consumer
    /// groups reading the same records, this stays near one group's
    /// `antidote_records_validated_total`.
    ///
    /// Call site: `Interceptor::rewrite`, with `PlanStats::validated`.
    pub fn record_evaluated(&self, policy: &str, n: u64) {
        if n > 0 {
            let labels = PolicyLabel {
                policy: policy.to_owned(),
            };
            self.evaluated.with(&labels, |c| c.inc_by(n));
        }
    }

    /// CPU time (of the calling thread) spent decoding, judging, splicing
    /// and re-encoding one Fetch response, the dead-letter wait excluded.
    ///
    /// Call site: `Interceptor::rewrite`, around its synchronous parts.
    pub fn fetch_rewrite_cpu(&self, d: Duration) {
        self.fetch_rewrite_cpu.inc_by(d.as_secs_f64());
    }

    /// `n` valid records of `topic`/`partition` were delivered.
    ///
    /// Call site: same place as [`Metrics::record_validated`], with the count
    /// of records whose verdict was `Valid`.
    pub fn record_passed(&self, topic: &str, partition: i32, policy: &str, n: u64) {
        self.passed
            .with(&(topic, partition, policy), |c| c.inc_by(n));
    }

    /// One record judged invalid (`class`, failing `rule`) and what was done
    /// with it.
    ///
    /// Call site: `Interceptor::rewrite` after `divert_all`, once per invalid
    /// record of a plan: `Diverted` for diversions that were acknowledged,
    /// `Dropped` for `on_invalid: drop`, `PassedInvalid` for `on_invalid:
    /// pass`. A diversion that failed is not counted here (its partition is
    /// held and the record will be judged again); see [`Metrics::dlt_write`].
    pub fn record_invalid(
        &self,
        topic: &str,
        partition: i32,
        policy: &str,
        class: crate::policy::Class,
        rule: &str,
        action: InvalidAction,
    ) {
        let labels = InvalidRef {
            topic,
            partition,
            policy,
            class: class.as_str(),
            rule,
            action: action.as_str(),
        };
        self.invalid.with(&labels, |c| c.inc());
    }

    /// One dead-letter Produce request finished (`ok` = acknowledged with
    /// acks=all), after `latency`.
    ///
    /// Call site: `deadletter::producer::Producer`, around each
    /// `produce(topic, partition, records)` call (one per DLT batch),
    /// measured from the first attempt to the final outcome.
    pub fn dlt_write(&self, ok: bool, latency: Duration) {
        self.dlt_write_result(if ok { "ok" } else { "error" }, latency);
    }

    /// Like [`Metrics::dlt_write`] with a named result: `too_large` when the
    /// broker refused a single record as too large (it cannot be split).
    pub fn dlt_write_result(&self, result: &str, latency: Duration) {
        let labels = ResultLabel {
            result: result.to_owned(),
        };
        self.dlt_writes.with(&labels, |c| c.inc());
        self.dlt_write_seconds
            .with(&labels, |h| h.observe(latency.as_secs_f64()));
    }

    /// Set whether `topic`/`partition` is held (a diversion failed).
    ///
    /// Call site: `Interceptor::rewrite`: `true` where `failed_from` is
    /// `Some` (the "partition held" warning), `false` when a later response
    /// for the same partition was applied with `failed_from == None`.
    pub fn set_held(&self, topic: &str, partition: i32, held: bool) {
        self.held
            .with(&(topic, partition), |g| g.set(i64::from(held)));
    }

    /// A batch of `topic`/`partition` could not be judged (`reason`:
    /// `undecodable`, `legacy` or `budget`), so the partition was held at it.
    ///
    /// Call site: `Interceptor::rewrite`, once per response per held partition.
    pub fn held_batch(&self, topic: &str, partition: i32, reason: &str) {
        let labels = HeldBatchLabels {
            topic: topic.to_owned(),
            partition,
            reason: reason.to_owned(),
        };
        self.held_batches.with(&labels, |c| c.inc());
    }

    /// Add `delta` (+1 / -1) to the held gauge of `topic`/`partition`, for
    /// call sites that count holders rather than set a state.
    pub fn held_partitions_add(&self, topic: &str, partition: i32, delta: i64) {
        self.held.with(&(topic, partition), |g| g.inc_by(delta));
    }

    /// Partitions currently held (sum over the gauge).
    pub fn held_partitions(&self) -> i64 {
        let mut sum = 0;
        self.held.for_each(|g| sum += g.get());
        sum
    }

    /// One Fetch response was inspected and rewritten in `d`.
    ///
    /// Call site: `proxy::relay::respond`, around `Interceptor::rewrite`
    /// (only for responses that were actually inspected).
    pub fn fetch_rewrite_latency(&self, d: Duration) {
        self.fetch_rewrite_seconds.observe(d.as_secs_f64());
    }

    /// A client connection on `listener` opened (`+1`) or closed (`-1`).
    /// `listener` is `bootstrap` or `broker-<node id>`.
    ///
    /// Call site: `proxy::serve`: `+1` on entry, `-1` on every exit path
    /// (a guard that calls `-1` on drop is easiest). `+1` also counts
    /// `antidote_connections_accepted_total`.
    pub fn connections_open(&self, listener: &str, delta: i64) {
        let labels = ListenerLabel {
            listener: listener.to_owned(),
        };
        if delta > 0 {
            self.connections_accepted
                .with(&labels, |c| c.inc_by(delta.unsigned_abs()));
        }
        self.connections_open.with(&labels, |g| g.inc_by(delta));
    }

    /// An error talking to an upstream broker, e.g. `connect`, `tls`, `io`,
    /// `protocol`, `timeout`, `metadata`.
    ///
    /// Call sites: `proxy::connect_upstream` (connect failed),
    /// `proxy::metadata_loop` (refresh failed, kind `metadata`), relay errors
    /// on the broker side (kind `io`).
    pub fn upstream_error(&self, kind: &str) {
        let labels = KindLabel {
            kind: kind.to_owned(),
        };
        self.upstream_errors.with(&labels, |c| c.inc());
    }

    /// A client connection closed at once: `limits.max_connections` reached.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// Counter value, for tests and the `dlt` commands' summaries.
    pub fn validated(&self, topic: &str, partition: i32, policy: &str) -> u64 {
        self.validated
            .peek(&(topic, partition, policy), |c| c.get())
            .unwrap_or(0)
    }

    /// Current open connections of `listener`.
    pub fn open_connections(&self, listener: &str) -> i64 {
        let labels = ListenerLabel {
            listener: listener.to_owned(),
        };
        self.connections_open
            .peek(&labels, |g| g.get())
            .unwrap_or(0)
    }

    /// Everything, in the Prometheus text exposition format (0.0.4), served
    /// with [`CONTENT_TYPE`].
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail; an encoder error would mean a
        // bug in the crate, and a partial page is still worth serving.
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// Counts one open connection of a listener for as long as it lives:
/// `+1` when made, `-1` when dropped, whichever way the connection ends.
///
/// Call site: `proxy::serve`, first line:
/// `let _open = ConnectionGuard::new(metrics::global().clone(), listener_name);`
pub struct ConnectionGuard {
    metrics: Arc<Metrics>,
    listener: String,
}

impl ConnectionGuard {
    pub fn new(metrics: Arc<Metrics>, listener: impl Into<String>) -> Self {
        let listener = listener.into();
        metrics.connections_open(&listener, 1);
        ConnectionGuard { metrics, listener }
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.metrics.connections_open(&self.listener, -1);
    }
}

/// The process-wide registry the data path records into.
pub fn global() -> &'static Arc<Metrics> {
    static GLOBAL: OnceLock<Arc<Metrics>> = OnceLock::new();
    GLOBAL.get_or_init(|| Arc::new(Metrics::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Class;

    #[test]
    fn renders_help_type_and_samples() {
        let m = Metrics::new();
        m.record_validated("geo", 0, "p", 10);
        m.record_validated("geo", 0, "p", 5);
        m.record_passed("geo", 0, "p", 14);
        m.record_invalid(
            "geo",
            0,
            "p",
            Class::Poison,
            "schema",
            InvalidAction::Diverted,
        );
        let text = m.render();
        assert!(text.contains(
            "# HELP antidote_records_validated_total Records judged against a policy.\n"
        ));
        assert!(text.contains("# TYPE antidote_records_validated_total counter\n"));
        assert!(
            text.contains(
                "antidote_records_validated_total{topic=\"geo\",partition=\"0\",policy=\"p\"} 15\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "antidote_records_passed_total{topic=\"geo\",partition=\"0\",policy=\"p\"} 14\n"
        ));
        assert!(text.contains(
            "antidote_records_invalid_total{topic=\"geo\",partition=\"0\",policy=\"p\",class=\"poison\",rule=\"schema\",action=\"diverted\"} 1\n"
        ));
        assert!(text.contains("antidote_build_info{version=\""));
        // Every non-comment line is `name{labels} value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap_or("");
            assert!(
                value.parse::<f64>().is_ok() || value == "+Inf",
                "bad line {line}"
            );
        }
        assert_eq!(m.validated("geo", 0, "p"), 15);
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.record_invalid(
            "t",
            1,
            "p",
            Class::Unknown,
            "rule \"x\"\n\\",
            InvalidAction::Dropped,
        );
        let text = m.render();
        assert!(
            text.contains(r#"rule="rule \"x\"\n\\",action="dropped"} 1"#),
            "{text}"
        );
        assert!(
            !text.lines().any(|l| l.ends_with('\\')),
            "no raw newline inside a sample"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new();
        m.dlt_write(true, Duration::from_micros(300));
        m.dlt_write(true, Duration::from_millis(30));
        m.dlt_write(false, Duration::from_secs(60));
        let text = m.render();
        assert!(text.contains("# TYPE antidote_dlt_write_duration_seconds histogram\n"));
        assert!(
            text.contains(
                "antidote_dlt_write_duration_seconds_bucket{result=\"ok\",le=\"0.0005\"} 1\n"
            ),
            "{text}"
        );
        assert!(text
            .contains("antidote_dlt_write_duration_seconds_bucket{result=\"ok\",le=\"0.05\"} 2\n"));
        assert!(text
            .contains("antidote_dlt_write_duration_seconds_bucket{result=\"ok\",le=\"+Inf\"} 2\n"));
        assert!(text.contains(
            "antidote_dlt_write_duration_seconds_bucket{result=\"error\",le=\"10\"} 0\n"
        ));
        assert!(text.contains(
            "antidote_dlt_write_duration_seconds_bucket{result=\"error\",le=\"+Inf\"} 1\n"
        ));
        assert!(text.contains("antidote_dlt_write_duration_seconds_count{result=\"ok\"} 2\n"));
        assert!(text.contains("antidote_dlt_write_duration_seconds_sum{result=\"error\"} 60.0\n"));
        assert!(text.contains("antidote_dlt_writes_total{result=\"error\"} 1\n"));
        m.fetch_rewrite_latency(Duration::from_millis(2));
        assert!(m
            .render()
            .contains("antidote_fetch_rewrite_duration_seconds_count 1\n"));
    }

    #[test]
    fn gauges_go_up_and_down() {
        let m = Metrics::new();
        m.connections_open("bootstrap", 1);
        m.connections_open("bootstrap", 1);
        m.connections_open("bootstrap", -1);
        assert_eq!(m.open_connections("bootstrap"), 1);
        m.set_held("geo", 3, true);
        m.set_held("geo", 4, true);
        m.set_held("geo", 4, false);
        assert_eq!(m.held_partitions(), 1);
        let text = m.render();
        assert!(text.contains("antidote_connections_open{listener=\"bootstrap\"} 1\n"));
        assert!(text.contains("antidote_connections_accepted_total{listener=\"bootstrap\"} 2\n"));
        assert!(text.contains("antidote_held_partitions{topic=\"geo\",partition=\"3\"} 1\n"));
        assert!(text.contains("antidote_held_partitions{topic=\"geo\",partition=\"4\"} 0\n"));
    }

    #[test]
    fn connection_guard_counts_while_alive() {
        let m = Arc::new(Metrics::new());
        let a = ConnectionGuard::new(m.clone(), "broker-111");
        {
            let _b = ConnectionGuard::new(m.clone(), "broker-111");
            assert_eq!(m.open_connections("broker-111"), 2);
        }
        assert_eq!(m.open_connections("broker-111"), 1);
        drop(a);
        assert_eq!(m.open_connections("broker-111"), 0);
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        let m = Arc::new(Metrics::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        m.record_validated("t", i % 3, "p", 1);
                        m.upstream_error("io");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let total: u64 = (0..3).map(|p| m.validated("t", p, "p")).sum();
        assert_eq!(total, 4000);
        assert!(m
            .render()
            .contains("antidote_upstream_errors_total{kind=\"io\"} 4000\n"));
    }

    /// Every `antidote_*` name used by the shipped alert rules and dashboard
    /// is one this registry exports, and both files parse.
    #[test]
    fn ops_files_parse_and_use_exported_names() {
        let alerts = include_str!("../ops/prometheus-alerts.yaml");
        let dashboard = include_str!("../ops/grafana-dashboard.json");
        let yaml: serde_yaml::Value = serde_yaml::from_str(alerts).unwrap();
        assert!(yaml["groups"].as_sequence().is_some_and(|g| !g.is_empty()));
        let json: serde_json::Value = serde_json::from_str(dashboard).unwrap();
        assert!(json["panels"].as_array().is_some_and(|p| !p.is_empty()));
        let exported: std::collections::HashSet<String> = every_series_once()
            .render()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .flat_map(|n| {
                [
                    n.to_string(),
                    format!("{n}_bucket"),
                    format!("{n}_sum"),
                    format!("{n}_count"),
                ]
            })
            .collect();
        for text in [alerts, dashboard] {
            let mut rest = text;
            while let Some(i) = rest.find("antidote_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    exported.contains(&name),
                    "{name} is not exported by src/metrics.rs"
                );
                rest = &rest[i + name.len()..];
            }
        }
    }

    /// A registry with one series in every family.
    fn every_series_once() -> Metrics {
        let m = Metrics::new();
        m.record_validated("t", 0, "p", 1);
        m.record_evaluated("p", 1);
        m.record_passed("t", 0, "p", 1);
        m.record_invalid("t", 0, "p", Class::Poison, "r", InvalidAction::Dropped);
        m.dlt_write(true, Duration::from_millis(1));
        m.set_held("t", 0, false);
        m.held_batch("t", 0, "budget");
        m.connections_open("bootstrap", 1);
        m.upstream_error("io");
        m
    }

    /// The `# TYPE` lines, on a fresh registry with no series yet, are
    /// exactly those of the hand-written registry this one replaced (scraped
    /// before the switch), in the same order: names with `_total`, same
    /// types.
    #[test]
    fn type_lines_are_those_of_the_old_exposition() {
        let want = [
            "antidote_build_info gauge",
            "antidote_process_start_time_seconds gauge",
            "antidote_records_validated_total counter",
            "antidote_records_evaluated_total counter",
            "antidote_fetch_rewrite_cpu_seconds_total counter",
            "antidote_records_passed_total counter",
            "antidote_records_invalid_total counter",
            "antidote_dlt_writes_total counter",
            "antidote_dlt_write_duration_seconds histogram",
            "antidote_held_partitions gauge",
            "antidote_held_batches_total counter",
            "antidote_fetch_rewrite_duration_seconds histogram",
            "antidote_connections_open gauge",
            "antidote_connections_accepted_total counter",
            "antidote_upstream_errors_total counter",
            "antidote_connections_refused_total counter",
        ];
        let text = Metrics::new().render();
        let got: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .collect();
        assert_eq!(got, want, "{text}");
        // Label-less counters are exported from the start, at zero.
        assert!(
            text.contains("\nantidote_connections_refused_total 0\n"),
            "{text}"
        );
        assert!(
            text.contains("\nantidote_fetch_rewrite_cpu_seconds_total 0.0\n"),
            "{text}"
        );
    }

    /// Every `antidote_*` name the README documents is exported, so a
    /// metric cannot disappear while the docs still promise it.
    #[test]
    fn every_metric_named_in_the_readme_is_exported() {
        let readme = include_str!("../README.md");
        let text = every_series_once().render();
        let exported: std::collections::HashSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let mut documented = 0;
        let mut rest = readme;
        while let Some(i) = rest.find("antidote_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let histogram = format!("{name}_count");
            assert!(
                exported.contains(name.as_str()) || exported.contains(histogram.as_str()),
                "README documents {name}, which /metrics does not export"
            );
            documented += 1;
            rest = &rest[i + name.len()..];
        }
        assert!(
            documented >= 14,
            "README metric table not found ({documented} names)"
        );
    }

    /// Recording on a known label set goes through the cache: the family
    /// and the cache hold the same series, and a scrape sees later adds.
    #[test]
    fn cached_series_are_the_ones_scraped() {
        let m = Metrics::new();
        m.record_validated("t", 0, "p", 1);
        assert_eq!(m.validated.cache.len(), 1);
        for _ in 0..10 {
            m.record_validated("t", 0, "p", 1);
        }
        assert_eq!(m.validated.cache.len(), 1);
        assert!(m.render().contains(
            "antidote_records_validated_total{topic=\"t\",partition=\"0\",policy=\"p\"} 11\n"
        ));
    }

    /// Borrowed label values find the series their owned form created, and
    /// series whose hashes collide share a bucket without mixing counts.
    #[test]
    fn borrowed_lookups_hit_and_collisions_stay_apart() {
        let m = Metrics::new();
        for _ in 0..3 {
            m.record_invalid("t", 1, "p", Class::Poison, "r1", InvalidAction::Diverted);
        }
        m.record_invalid("t", 1, "p", Class::Poison, "r2", InvalidAction::Diverted);
        assert_eq!(m.invalid.cache.len(), 2);
        let text = m.render();
        assert!(
            text.contains("rule=\"r1\",action=\"diverted\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("rule=\"r2\",action=\"diverted\"} 1\n"),
            "{text}"
        );

        /// A listener name whose hash is always the same.
        struct Colliding<'a>(&'a str);
        impl Hash for Colliding<'_> {
            fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
        }
        impl LabelsRef<ListenerLabel> for Colliding<'_> {
            fn is(&self, o: &ListenerLabel) -> bool {
                o.listener == self.0
            }
            fn to_labels(&self) -> ListenerLabel {
                ListenerLabel {
                    listener: self.0.to_owned(),
                }
            }
        }
        let c: Cached<ListenerLabel, Counter> = Cached::new();
        c.with(&Colliding("a"), |c| c.inc_by(2));
        c.with(&Colliding("b"), |c| c.inc());
        c.with(&Colliding("a"), |c| c.inc());
        assert_eq!(c.cache.len(), 1, "one bucket");
        assert_eq!(c.peek(&Colliding("a"), |c| c.get()), Some(3));
        assert_eq!(c.peek(&Colliding("b"), |c| c.get()), Some(1));
        assert_eq!(c.peek(&Colliding("z"), |c| c.get()), None);
    }
}
