//! Metrics of the diversion circuit breaker (`breaker:` of a policy): which
//! partitions it holds now, and how often it tripped.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::series::register;

pub const BREAKER_OPEN: &str = "antidote_breaker_open";
pub const BREAKER_TRIPS: &str = "antidote_breaker_trips_total";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BreakerLabels {
    topic: String,
    partition: i32,
    policy: String,
}

/// The series of this module.
#[derive(Default)]
pub struct BreakerMetrics {
    open: Family<BreakerLabels, Gauge>,
    trips: Family<BreakerLabels, Counter>,
}

impl BreakerMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        register(
            r,
            BREAKER_OPEN,
            "1 while a partition is held by its policy's diversion circuit breaker, else 0.",
            self.open.clone(),
        );
        register(
            r,
            BREAKER_TRIPS,
            "Times a partition's diversion circuit breaker opened.",
            self.trips.clone(),
        );
    }

    fn labels(topic: &str, partition: i32, policy: &str) -> BreakerLabels {
        BreakerLabels {
            topic: topic.to_string(),
            partition,
            policy: policy.to_string(),
        }
    }

    /// The breaker of `topic`/`partition` opened.
    pub fn tripped(&self, topic: &str, partition: i32, policy: &str) {
        let l = Self::labels(topic, partition, policy);
        self.trips.get_or_create(&l).inc();
        self.open.get_or_create(&l).set(1);
    }

    /// The breaker of `topic`/`partition` opened by another instance's (or
    /// this one's) marker: held here too, no trip counted.
    pub fn opened(&self, topic: &str, partition: i32, policy: &str) {
        self.open
            .get_or_create(&Self::labels(topic, partition, policy))
            .set(1);
    }

    /// The breaker of `topic`/`partition` closed.
    pub fn closed(&self, topic: &str, partition: i32, policy: &str) {
        self.open
            .get_or_create(&Self::labels(topic, partition, policy))
            .set(0);
    }

    /// Every breaker closed (a policy reload).
    pub fn close_all(&self) {
        // Families cannot be iterated: each gauge is set to 0 by removing
        // them all; a partition that trips again sets its own.
        self.open.clear();
    }
}
