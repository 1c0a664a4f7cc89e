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

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub mod breaker;
pub mod contract;
mod dlt;
pub use dlt::{DltWriteSeen, FollowerSeen, Produced};
pub mod history;
mod judged;
pub use judged::{DoorSeen, Judged};
mod observation;
pub use observation::Observation;
pub mod keys;
pub mod requests;
mod series;
pub mod share;
pub use share::ShareSeen;
pub mod snapshot;
use series::*;
mod guard;
pub use guard::ConnectionGuard;

pub mod names;
pub use judged::InvalidAction;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Every metric the proxy exports. Share one instance ([`global`]).
pub struct Metrics {
    registry: Registry,
    validated: Cached<TopicPartitionPolicy, Counter>,
    evaluated: Cached<PolicyLabel, Counter>,
    fetch_rewrite_cpu: Counter<f64, AtomicU64>,
    judged_ahead: Counter,
    deadline_cuts: Counter,
    passed: Cached<TopicPartitionPolicy, Counter>,
    invalid: Cached<InvalidLabels, Counter>,
    dlt_writes: Cached<ResultLabel, Counter>,
    dlt_write_seconds: Cached<ResultLabel, Histogram, LatencyCtor>,
    held: Cached<TopicPartition, Gauge>,
    held_batches: Cached<HeldBatchLabels, Counter>,
    fetch_rewrite_seconds: Histogram,
    response_relay_seconds: Cached<ResponseLabel, Histogram, LatencyCtor>,
    connections_open: Cached<ListenerLabel, Gauge>,
    connections_accepted: Cached<ListenerLabel, Counter>,
    upstream_errors: Cached<KindLabel, Counter>,
    connections_refused: Counter,
    registry_requests: Cached<KindLabel, Counter>,
    /// Blocked keys and re-drive (`keys`).
    pub keys: keys::KeyMetrics,
    /// The diversion circuit breaker (`breaker`).
    pub breaker: breaker::BreakerMetrics,
    /// How long diverting Fetch responses are held, by cause (`hold`).
    pub hold: observation::HoldMetrics,
    /// Client requests by API and version (`requests`).
    pub requests: requests::RequestMetrics,
    /// Share consumers: the proxy's acknowledgements, withheld records (`share`).
    pub share: share::ShareMetrics,
    /// Data-contract rules with onFailure NONE (`contract`).
    contract: contract::ContractMetrics,
    diversions: Cached<SourceLabel, Counter>,
    ledger_lag: Gauge,
    dlt_refused: Cached<RefusedLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Metrics {
            registry: Registry::default(),
            validated: Cached::new(),
            evaluated: Cached::new(),
            fetch_rewrite_cpu: Counter::default(),
            judged_ahead: Counter::default(),
            deadline_cuts: Counter::default(),
            passed: Cached::new(),
            invalid: Cached::new(),
            dlt_writes: Cached::new(),
            dlt_write_seconds: Cached::with_constructor(latency_histogram as LatencyCtor),
            held: Cached::new(),
            held_batches: Cached::new(),
            fetch_rewrite_seconds: latency_histogram(),
            response_relay_seconds: Cached::with_constructor(relay_histogram as LatencyCtor),
            connections_open: Cached::new(),
            connections_accepted: Cached::new(),
            upstream_errors: Cached::new(),
            connections_refused: Counter::default(),
            registry_requests: Cached::new(),
            keys: keys::KeyMetrics::default(),
            breaker: breaker::BreakerMetrics::default(),
            hold: observation::HoldMetrics::default(),
            requests: requests::RequestMetrics::default(),
            share: share::ShareMetrics::default(),
            contract: contract::ContractMetrics::default(),
            diversions: Cached::new(),
            ledger_lag: Gauge::default(),
            dlt_refused: Cached::new(),
        };
        m.registered()
    }

    /// Register every metric, in the order the old hand-written exposition
    /// had (operators diff scrapes).
    fn registered(mut self) -> Self {
        use names::*;
        register_process(&mut self.registry);
        let r = &mut self.registry;
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
            "Records judged invalid, by class, failing rule and action (diverted, dropped, passed_invalid, rejected).",
            self.invalid.family.clone(),
        );
        self.register_dlt_and_connections();
        self.keys.register(&mut self.registry);
        self.register_fleet();
        self.breaker.register(&mut self.registry);
        register(
            &mut self.registry,
            names::JUDGED_AHEAD,
            "Records judged by a helper thread ahead of their partition's planner (one large partition on several cores), or behind a response cut by limits.judge_deadline; part of antidote_records_evaluated_total once a planner uses them.",
            self.judged_ahead.clone(),
        );
        register(
            &mut self.registry,
            names::DEADLINE_CUTS,
            "Partitions of Fetch responses cut short by limits.judge_deadline: the client got the batches judged in time and fetches the rest, judged meanwhile in the background, again.",
            self.deadline_cuts.clone(),
        );
        self.hold.register(&mut self.registry);
        self.requests.register(&mut self.registry);
        self.share.register(&mut self.registry);
        self.contract.register(&mut self.registry);
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
            RESPONSE_RELAY_SECONDS,
            "Time from a broker response's last byte arriving to the proxy being ready to write it (until=ready: rewriting and diversions) and to its last byte written to the client (until=sent), by response (forwarded as it arrived, rewritten).",
            self.response_relay_seconds.family.clone(),
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
        register(
            r,
            REGISTRY_REQUESTS,
            "Schema registry requests, by outcome (ok, not_found, error, timeout).",
            self.registry_requests.family.clone(),
        );
    }

    /// `n` records judged ahead of their planner (`plan::judge_ahead`).
    pub fn judged_ahead(&self, n: u64) {
        self.judged_ahead.inc_by(n);
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

    /// One broker response was relayed to its client (rewritten or
    /// forwarded as it arrived): `ready` after its last byte arrived it was
    /// ready to write (rewriting and diversions included), `sent` after it
    /// its last byte was written (the client's reading included).
    ///
    /// Call site: `proxy::relay::response_pump`, from the whole frame read
    /// to the write starting and to the write flushed.
    pub fn response_relayed(&self, rewritten: bool, ready: Duration, sent: Duration) {
        let response = if rewritten { "rewritten" } else { "forwarded" };
        for (until, d) in [("ready", ready), ("sent", sent)] {
            self.response_relay_seconds
                .with(&ResponseLabel { response, until }, |h| {
                    h.observe(d.as_secs_f64())
                });
        }
    }

    /// A forwarded response was spliced socket to socket; `sent` runs from
    /// its head arriving to its last byte written (the body streams through,
    /// so there is no "ready" moment).
    ///
    /// Call site: `proxy::relay::response_pump`.
    pub fn response_spliced(&self, sent: Duration) {
        self.response_relay_seconds.with(
            &ResponseLabel {
                response: "spliced",
                until: "sent",
            },
            |h| h.observe(sent.as_secs_f64()),
        );
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

    /// One schema registry request ended with `kind`: `ok`, `not_found`,
    /// `error` (connect, TLS, 5xx, bad answer) or `timeout`.
    ///
    /// Call site: `registry::Registry`, once per request per URL tried.
    pub fn registry_request(&self, kind: &str) {
        let labels = KindLabel {
            kind: kind.to_owned(),
        };
        self.registry_requests.with(&labels, |c| c.inc());
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
        self.contract.sync();
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail; an encoder error would mean a
        // bug in the crate, and a partial page is still worth serving.
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// The process-wide registry the data path records into.
pub fn global() -> &'static Arc<Metrics> {
    static GLOBAL: OnceLock<Arc<Metrics>> = OnceLock::new();
    GLOBAL.get_or_init(|| Arc::new(Metrics::new()))
}

/// The process's own series: which build runs, and since when.
fn register_process(r: &mut Registry) {
    use names::*;
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
}

#[cfg(test)]
mod tests;
