//! The proxy's metrics: a small Prometheus text-format registry with typed
//! methods for the data path, and nothing else.
//!
//! Owns every metric name antidote exports (see [`names`]); the alert rules
//! in `ops/prometheus-alerts.yaml` and the dashboard in
//! `ops/grafana-dashboard.json` use these names and must follow them.
//! It never does I/O: the admin listener (`crate::admin`) renders it.
//!
//! Hand-written rather than a metrics crate because the needs are small:
//! counters, gauges and histograms with labels. Recording is lock-light: a
//! series is an atomic found in a sharded map (`DashMap`, a read lock on one
//! shard); only the first sighting of a label set takes a write lock.
//! Rendering sorts series so the output is stable.
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

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;

/// Every exported metric name, in one place.
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
}

/// What happened to an invalid record (the `action` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidAction {
    /// Written to its dead-letter topic and removed from the response.
    Diverted,
    /// Removed from the response, not written anywhere (`on_invalid: drop`).
    Dropped,
    /// Delivered to the consumer although invalid (`on_invalid: pass`).
    PassedInvalid,
    /// Refused at Produce (`on_produce: reject`): never written.
    Rejected,
}

impl InvalidAction {
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidAction::Diverted => "diverted",
            InvalidAction::Dropped => "dropped",
            InvalidAction::PassedInvalid => "passed_invalid",
            InvalidAction::Rejected => "rejected",
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

/// Latency buckets in seconds: 0.5 ms .. 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

type LabelValues = Box<[String]>;

fn key(values: &[&str]) -> LabelValues {
    values.iter().map(|v| v.to_string()).collect()
}

/// What a family's series hold: `AtomicU64` for counters, `AtomicI64` for
/// gauges.
trait Cell: Default {
    type Value: Copy + Ord + std::fmt::Display;
    /// The Prometheus type name.
    const KIND: &'static str;
    fn add(&self, v: Self::Value);
    fn load(&self) -> Self::Value;
}

impl Cell for AtomicU64 {
    type Value = u64;
    const KIND: &'static str = "counter";
    fn add(&self, v: u64) {
        self.fetch_add(v, Ordering::Relaxed);
    }
    fn load(&self) -> u64 {
        AtomicU64::load(self, Ordering::Relaxed)
    }
}

impl Cell for AtomicI64 {
    type Value = i64;
    const KIND: &'static str = "gauge";
    fn add(&self, v: i64) {
        self.fetch_add(v, Ordering::Relaxed);
    }
    fn load(&self) -> i64 {
        AtomicI64::load(self, Ordering::Relaxed)
    }
}

/// A family of counters (only go up) or gauges (go up and down).
struct Family<C: Cell> {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    series: DashMap<LabelValues, C>,
}

type CounterFamily = Family<AtomicU64>;
type GaugeFamily = Family<AtomicI64>;

impl<C: Cell> Family<C> {
    fn new(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Family {
            name,
            help,
            labels,
            series: DashMap::new(),
        }
    }

    /// Run `f` on the series of `values`, creating it at zero if new.
    fn with<R>(&self, values: &[&str], f: impl FnOnce(&C) -> R) -> R {
        debug_assert_eq!(values.len(), self.labels.len(), "{}", self.name);
        let k = key(values);
        if let Some(c) = self.series.get(&k) {
            return f(&c);
        }
        let c = self.series.entry(k).or_default();
        f(&c)
    }

    fn add(&self, values: &[&str], v: C::Value) {
        self.with(values, |c| c.add(v));
    }

    fn get(&self, values: &[&str]) -> C::Value {
        self.series
            .get(&key(values))
            .map_or_else(|| C::default().load(), |c| c.load())
    }

    fn render(&self, out: &mut String) {
        header(out, self.name, self.help, C::KIND);
        for (labels, v) in sorted(&self.series, |c| c.load()) {
            sample(
                out,
                self.name,
                "",
                self.labels,
                &labels,
                None,
                &v.to_string(),
            );
        }
    }
}

impl GaugeFamily {
    fn set(&self, values: &[&str], v: i64) {
        self.with(values, |g| g.store(v, Ordering::Relaxed));
    }
}

/// One histogram series: cumulative-at-render bucket counts, sum and count.
struct HistogramSeries {
    /// Non-cumulative counts; one per bucket plus +Inf.
    buckets: Box<[AtomicU64]>,
    /// Sum of observations in seconds, as f64 bits.
    sum_bits: AtomicU64,
    count: AtomicU64,
}

impl HistogramSeries {
    fn new(n: usize) -> Self {
        HistogramSeries {
            buckets: (0..=n).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
            count: AtomicU64::new(0),
        }
    }
}

/// A family of latency histograms (seconds).
struct HistogramFamily {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    bounds: &'static [f64],
    series: DashMap<LabelValues, HistogramSeries>,
}

impl HistogramFamily {
    fn new(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        HistogramFamily {
            name,
            help,
            labels,
            bounds: LATENCY_BUCKETS,
            series: DashMap::new(),
        }
    }

    fn observe(&self, values: &[&str], d: Duration) {
        let secs = d.as_secs_f64();
        let k = key(values);
        let idx = self
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.bounds.len());
        let record = |s: &HistogramSeries| {
            if let Some(b) = s.buckets.get(idx) {
                b.fetch_add(1, Ordering::Relaxed);
            }
            let _ = s
                .sum_bits
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                    Some((f64::from_bits(bits) + secs).to_bits())
                });
            s.count.fetch_add(1, Ordering::Relaxed);
        };
        if let Some(s) = self.series.get(&k) {
            return record(&s);
        }
        let s = self
            .series
            .entry(k)
            .or_insert_with(|| HistogramSeries::new(self.bounds.len()));
        record(&s);
    }

    fn count(&self, values: &[&str]) -> u64 {
        self.series
            .get(&key(values))
            .map_or(0, |s| s.count.load(Ordering::Relaxed))
    }

    fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "histogram");
        let mut rows: Vec<(LabelValues, Vec<u64>, f64, u64)> = self
            .series
            .iter()
            .map(|e| {
                let s = e.value();
                (
                    e.key().clone(),
                    s.buckets
                        .iter()
                        .map(|b| b.load(Ordering::Relaxed))
                        .collect(),
                    f64::from_bits(s.sum_bits.load(Ordering::Relaxed)),
                    s.count.load(Ordering::Relaxed),
                )
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        for (labels, buckets, sum, count) in rows {
            let mut cumulative = 0u64;
            for (i, n) in buckets.iter().enumerate() {
                cumulative += n;
                let le = match self.bounds.get(i) {
                    Some(b) => format_float(*b),
                    None => "+Inf".to_string(),
                };
                sample(
                    out,
                    self.name,
                    "_bucket",
                    self.labels,
                    &labels,
                    Some(&le),
                    &cumulative.to_string(),
                );
            }
            sample(
                out,
                self.name,
                "_sum",
                self.labels,
                &labels,
                None,
                &format_float(sum),
            );
            sample(
                out,
                self.name,
                "_count",
                self.labels,
                &labels,
                None,
                &count.to_string(),
            );
        }
    }
}

fn sorted<V, T: Ord + Copy>(
    map: &DashMap<LabelValues, V>,
    load: impl Fn(&V) -> T,
) -> Vec<(LabelValues, T)> {
    let mut rows: Vec<(LabelValues, T)> = map
        .iter()
        .map(|e| (e.key().clone(), load(e.value())))
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    label_names: &[&str],
    label_values: &[String],
    le: Option<&str>,
    value: &str,
) {
    out.push_str(name);
    out.push_str(suffix);
    let mut pairs: Vec<(&str, &str)> = label_names
        .iter()
        .copied()
        .zip(label_values.iter().map(String::as_str))
        .collect();
    if let Some(le) = le {
        pairs.push(("le", le));
    }
    if !pairs.is_empty() {
        out.push('{');
        for (i, (k, v)) in pairs.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            out.push_str(&escape_label_value(v));
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(value);
    out.push('\n');
}

/// Escape a label value for the text format: backslash, double quote, newline.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escape HELP text: backslash and newline.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn format_float(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if v.is_nan() {
        return "NaN".into();
    }
    format!("{v}")
}

/// Every metric the proxy exports. Share one instance ([`global`]).
pub struct Metrics {
    validated: CounterFamily,
    evaluated: CounterFamily,
    /// Nanoseconds; exported in seconds.
    fetch_rewrite_cpu_ns: AtomicU64,
    passed: CounterFamily,
    invalid: CounterFamily,
    dlt_writes: CounterFamily,
    dlt_write_seconds: HistogramFamily,
    held: GaugeFamily,
    held_batches: CounterFamily,
    fetch_rewrite_seconds: HistogramFamily,
    connections_open: GaugeFamily,
    connections_accepted: CounterFamily,
    upstream_errors: CounterFamily,
    connections_refused: CounterFamily,
    start_time: f64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        use names::*;
        const TPP: &[&str] = &["topic", "partition", "policy"];
        Metrics {
            validated: CounterFamily::new(VALIDATED, "Records judged against a policy.", TPP),
            evaluated: CounterFamily::new(
                EVALUATED,
                "Records run through a policy's validator (verdict cache misses).",
                &["policy"],
            ),
            fetch_rewrite_cpu_ns: AtomicU64::new(0),
            passed: CounterFamily::new(PASSED, "Records judged valid and delivered to the consumer.", TPP),
            invalid: CounterFamily::new(
                INVALID,
                "Records judged invalid, by class, failing rule and action (diverted, dropped, passed_invalid).",
                &["topic", "partition", "policy", "class", "rule", "action"],
            ),
            dlt_writes: CounterFamily::new(DLT_WRITES, "Dead-letter produce requests, by result (ok, error).", &["result"]),
            dlt_write_seconds: HistogramFamily::new(
                DLT_WRITE_SECONDS,
                "Time from a dead-letter write starting to its acks=all acknowledgement (or failure).",
                &["result"],
            ),
            held: GaugeFamily::new(
                HELD_PARTITIONS,
                "1 while a partition is held because a diversion failed, else 0.",
                &["topic", "partition"],
            ),
            held_batches: CounterFamily::new(
                HELD_BATCHES,
                "Fetch responses in which a batch could not be judged and its partition was held there, by reason (undecodable, legacy, budget).",
                &["topic", "partition", "reason"],
            ),
            fetch_rewrite_seconds: HistogramFamily::new(
                FETCH_REWRITE_SECONDS,
                "Time spent inspecting and rewriting one Fetch response, diversions included.",
                &[],
            ),
            connections_open: GaugeFamily::new(CONNECTIONS_OPEN, "Client connections open, by listener.", &["listener"]),
            connections_accepted: CounterFamily::new(
                CONNECTIONS_ACCEPTED,
                "Client connections accepted, by listener.",
                &["listener"],
            ),
            upstream_errors: CounterFamily::new(
                UPSTREAM_ERRORS,
                "Errors talking to upstream brokers, by kind (connect, tls, io, protocol, timeout, ...).",
                &["kind"],
            ),
            connections_refused: CounterFamily::new(
                CONNECTIONS_REFUSED,
                "Client connections closed at once because limits.max_connections was reached.",
                &[],
            ),
            start_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        }
    }

    /// `n` records of `topic`/`partition` were judged under `policy`.
    ///
    /// Call site: `intercept::plan::plan_partition` (or `Interceptor::rewrite`
    /// right after it), once per partition with the number of records judged
    /// in this response, including those whose verdict came from the
    /// `VerdictCache` (the DLT rate is per delivered record, not per
    /// validation run). Not called for aborted transactional batches.
    pub fn record_validated(&self, topic: &str, partition: i32, policy: &str, n: u64) {
        self.validated
            .add(&[topic, &partition.to_string(), policy], n);
    }

    /// `n` records were run through `policy`'s validator, i.e. judged
    /// without a verdict from the `VerdictCache`. With several consumer
    /// groups reading the same records, this stays near one group's
    /// `antidote_records_validated_total`.
    ///
    /// Call site: `Interceptor::rewrite`, with `PlanStats::validated`.
    pub fn record_evaluated(&self, policy: &str, n: u64) {
        if n > 0 {
            self.evaluated.add(&[policy], n);
        }
    }

    /// CPU time (of the calling thread) spent decoding, judging, splicing
    /// and re-encoding one Fetch response, the dead-letter wait excluded.
    ///
    /// Call site: `Interceptor::rewrite`, around its synchronous parts.
    pub fn fetch_rewrite_cpu(&self, d: Duration) {
        self.fetch_rewrite_cpu_ns.fetch_add(
            d.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    /// `n` valid records of `topic`/`partition` were delivered.
    ///
    /// Call site: same place as [`Metrics::record_validated`], with the count
    /// of records whose verdict was `Valid`.
    pub fn record_passed(&self, topic: &str, partition: i32, policy: &str, n: u64) {
        self.passed.add(&[topic, &partition.to_string(), policy], n);
    }

    /// One record judged invalid (`class`, failing `rule`) and what was done
    /// with it.
    ///
    /// Call site: `Interceptor::rewrite` after `divert_all`, once per invalid
    /// record of a plan: `Diverted` for diversions that were acknowledged,
    /// `Dropped` for `on_invalid: drop`, `PassedInvalid` for `on_invalid:
    /// pass`. A diversion that failed is not counted here (its partition is
    /// held and the record will be judged again); see [`Metrics::dlt_write`].
    #[allow(clippy::too_many_arguments)]
    pub fn record_invalid(
        &self,
        topic: &str,
        partition: i32,
        policy: &str,
        class: crate::policy::Class,
        rule: &str,
        action: InvalidAction,
    ) {
        self.invalid.add(
            &[
                topic,
                &partition.to_string(),
                policy,
                class.as_str(),
                rule,
                action.as_str(),
            ],
            1,
        );
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
        self.dlt_writes.add(&[result], 1);
        self.dlt_write_seconds.observe(&[result], latency);
    }

    /// Set whether `topic`/`partition` is held (a diversion failed).
    ///
    /// Call site: `Interceptor::rewrite`: `true` where `failed_from` is
    /// `Some` (the "partition held" warning), `false` when a later response
    /// for the same partition was applied with `failed_from == None`.
    pub fn set_held(&self, topic: &str, partition: i32, held: bool) {
        self.held
            .set(&[topic, &partition.to_string()], i64::from(held));
    }

    /// A batch of `topic`/`partition` could not be judged (`reason`:
    /// `undecodable`, `legacy` or `budget`), so the partition was held at it.
    ///
    /// Call site: `Interceptor::rewrite`, once per response per held partition.
    pub fn held_batch(&self, topic: &str, partition: i32, reason: &str) {
        self.held_batches
            .add(&[topic, &partition.to_string(), reason], 1);
    }

    /// Add `delta` (+1 / -1) to the held gauge of `topic`/`partition`, for
    /// call sites that count holders rather than set a state.
    pub fn held_partitions_add(&self, topic: &str, partition: i32, delta: i64) {
        self.held.add(&[topic, &partition.to_string()], delta);
    }

    /// Partitions currently held (sum over the gauge).
    pub fn held_partitions(&self) -> i64 {
        self.held
            .series
            .iter()
            .map(|g| g.value().load(Ordering::Relaxed))
            .sum()
    }

    /// One Fetch response was inspected and rewritten in `d`.
    ///
    /// Call site: `proxy::relay::respond`, around `Interceptor::rewrite`
    /// (only for responses that were actually inspected).
    pub fn fetch_rewrite_latency(&self, d: Duration) {
        self.fetch_rewrite_seconds.observe(&[], d);
    }

    /// A client connection on `listener` opened (`+1`) or closed (`-1`).
    /// `listener` is `bootstrap` or `broker-<node id>`.
    ///
    /// Call site: `proxy::serve`: `+1` on entry, `-1` on every exit path
    /// (a guard that calls `-1` on drop is easiest). `+1` also counts
    /// `antidote_connections_accepted_total`.
    pub fn connections_open(&self, listener: &str, delta: i64) {
        self.connections_open.add(&[listener], delta);
        if delta > 0 {
            self.connections_accepted
                .add(&[listener], delta.unsigned_abs());
        }
    }

    /// An error talking to an upstream broker, e.g. `connect`, `tls`, `io`,
    /// `protocol`, `timeout`, `metadata`.
    ///
    /// Call sites: `proxy::connect_upstream` (connect failed),
    /// `proxy::metadata_loop` (refresh failed, kind `metadata`), relay errors
    /// on the broker side (kind `io`).
    pub fn upstream_error(&self, kind: &str) {
        self.upstream_errors.add(&[kind], 1);
    }

    /// A client connection closed at once: `limits.max_connections` reached.
    pub fn connection_refused(&self) {
        self.connections_refused.add(&[], 1);
    }

    /// Counter value, for tests and the `dlt` commands' summaries.
    pub fn validated(&self, topic: &str, partition: i32, policy: &str) -> u64 {
        self.validated.get(&[topic, &partition.to_string(), policy])
    }

    /// Current open connections of `listener`.
    pub fn open_connections(&self, listener: &str) -> i64 {
        self.connections_open.get(&[listener])
    }

    /// Observations so far of the DLT write histogram for `ok`.
    pub fn dlt_writes_observed(&self, ok: bool) -> u64 {
        self.dlt_write_seconds
            .count(&[if ok { "ok" } else { "error" }])
    }

    /// Everything, in the Prometheus text exposition format (0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        header(
            &mut out,
            names::BUILD_INFO,
            "Always 1; the version label says which antidote runs.",
            "gauge",
        );
        sample(
            &mut out,
            names::BUILD_INFO,
            "",
            &["version"],
            &[env!("CARGO_PKG_VERSION").to_string()],
            None,
            "1",
        );
        header(
            &mut out,
            names::START_TIME,
            "Start time of the process, seconds since the epoch.",
            "gauge",
        );
        sample(
            &mut out,
            names::START_TIME,
            "",
            &[],
            &[],
            None,
            &format_float(self.start_time),
        );
        self.validated.render(&mut out);
        self.evaluated.render(&mut out);
        header(
            &mut out,
            names::FETCH_REWRITE_CPU,
            "CPU seconds spent decoding, judging, splicing and re-encoding Fetch responses.",
            "counter",
        );
        let cpu = self.fetch_rewrite_cpu_ns.load(Ordering::Relaxed) as f64 / 1e9;
        sample(
            &mut out,
            names::FETCH_REWRITE_CPU,
            "",
            &[],
            &[],
            None,
            &format_float(cpu),
        );
        self.passed.render(&mut out);
        self.invalid.render(&mut out);
        self.dlt_writes.render(&mut out);
        self.dlt_write_seconds.render(&mut out);
        self.held.render(&mut out);
        self.held_batches.render(&mut out);
        self.fetch_rewrite_seconds.render(&mut out);
        self.connections_open.render(&mut out);
        self.connections_accepted.render(&mut out);
        self.upstream_errors.render(&mut out);
        self.connections_refused.render(&mut out);
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
        assert_eq!(escape_label_value(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label_value("line\nbreak"), "line\\nbreak");
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
        assert!(text.contains("antidote_dlt_write_duration_seconds_sum{result=\"error\"} 60\n"));
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
        let m = Metrics::new();
        m.fetch_rewrite_latency(Duration::from_millis(1));
        m.dlt_write(true, Duration::from_millis(1));
        let exported: std::collections::HashSet<String> = m
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
}
