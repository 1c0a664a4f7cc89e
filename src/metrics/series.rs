//! The building blocks of the registry: label sets, series looked up by
//! borrowed labels and cached (a repeat increment is a hash and an atomic
//! add), families declared before their first series, histogram buckets.

use dashmap::DashMap;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};
use std::hash::Hash;

/// Latency buckets in seconds: 0.5 ms .. 10 s (the dashboard's quantiles
/// assume these).
pub(super) const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Relay buckets in seconds: 0.1 ms .. 1 s, finer below 2 ms (issue 15's
/// targets: p99 at most 1 ms forwarded, 2 ms rewritten).
pub(super) const RELAY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1.0,
];

pub(super) fn relay_histogram() -> Histogram {
    Histogram::new(RELAY_BUCKETS.iter().copied())
}

pub(super) fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS.iter().copied())
}

pub(super) type LatencyCtor = fn() -> Histogram;

// Label sets. Field order is label order in the output.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TopicPartitionPolicy {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PolicyLabel {
    pub(super) policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct InvalidLabels {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) policy: String,
    pub(super) class: &'static str,
    pub(super) rule: String,
    pub(super) action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabel {
    pub(super) result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResponseLabel {
    pub(super) response: &'static str,
    pub(super) until: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SourceLabel {
    pub(super) source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RefusedLabels {
    pub(super) reader: &'static str,
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TopicPartition {
    pub(super) topic: String,
    pub(super) partition: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HeldBatchLabels {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ListenerLabel {
    pub(super) listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabel {
    pub(super) kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VersionLabel {
    pub(super) version: &'static str,
}

/// Label values as a call site holds them, matched against the cache
/// without building the owned label set: on the data path a known series
/// costs a hash, one shard's read lock and the atomic add, no allocation.
pub(super) trait LabelsRef<S>: Hash {
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
pub(super) struct InvalidRef<'a> {
    pub(super) topic: &'a str,
    pub(super) partition: i32,
    pub(super) policy: &'a str,
    pub(super) class: &'static str,
    pub(super) rule: &'a str,
    pub(super) action: &'static str,
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
pub(super) fn labels_hash(labels: &impl Hash) -> u64 {
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
pub(super) struct Cached<S, M, C = fn() -> M> {
    pub(super) family: Family<S, M, C>,
    pub(super) cache: DashMap<u64, Vec<(S, M)>>,
}

impl<S, M> Cached<S, M>
where
    S: Clone + Hash + Eq,
    M: Default,
{
    pub(super) fn new() -> Self {
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
    pub(super) fn with_constructor(c: C) -> Self {
        Cached {
            family: Family::new_with_constructor(c),
            cache: DashMap::new(),
        }
    }

    /// Run `f` on the series of `labels`, creating it if new.
    pub(super) fn with<R>(&self, labels: &impl LabelsRef<S>, f: impl FnOnce(&M) -> R) -> R {
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
    pub(super) fn peek<R>(&self, labels: &impl LabelsRef<S>, f: impl FnOnce(&M) -> R) -> Option<R> {
        let bucket = self.cache.get(&labels_hash(labels))?;
        bucket.iter().find(|(s, _)| labels.is(s)).map(|(_, m)| f(m))
    }

    /// Run `f` on every series.
    pub(super) fn for_each(&self, mut f: impl FnMut(&M)) {
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
pub(super) struct Declared<M>(M);

impl<M: EncodeMetric> EncodeMetric for Declared<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// Register `metric` under `name`, stripping a counter's `_total` and the
/// help text's final period (the encoder appends both).
pub(super) fn register(
    registry: &mut Registry,
    name: &'static str,
    help: &str,
    metric: impl Metric,
) {
    let help = help.strip_suffix('.').unwrap_or(help);
    registry.register(super::names::counter_base(name), help, Declared(metric));
}
