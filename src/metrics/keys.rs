//! Metrics of per-key ordering and re-drive: how many keys are blocked and
//! for how long the oldest has been (the alert), and what re-drive did, by
//! outcome and attempt.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::series::register;

pub const BLOCKED_KEYS: &str = "antidote_blocked_keys";
pub const BLOCKED_KEY_OLDEST_AGE: &str = "antidote_blocked_key_oldest_age_seconds";
pub const REDRIVEN: &str = "antidote_redrive_total";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RedriveLabels {
    /// `redriven` (written back) or `still_invalid`.
    outcome: &'static str,
    attempt: u32,
}

/// The series of this module.
#[derive(Default)]
pub struct KeyMetrics {
    blocked: Gauge,
    oldest_age: Gauge<f64, AtomicU64>,
    redrive: Family<RedriveLabels, Counter>,
}

impl KeyMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        register(
            r,
            BLOCKED_KEYS,
            "Keys blocked behind a diverted record (ordering: per_key), all partitions.",
            self.blocked.clone(),
        );
        register(
            r,
            BLOCKED_KEY_OLDEST_AGE,
            "Seconds since the oldest blocked key's first record was diverted (0 when none is blocked).",
            self.oldest_age.clone(),
        );
        register(r, REDRIVEN, "Records re-validated by dead_letter.redrive, by outcome (redriven, still_invalid) and attempt.", self.redrive.clone());
    }

    /// The blocked-key set now: how many, and the oldest block's start (ms).
    pub(super) fn set_blocked(&self, keys: usize, oldest_ms: Option<i64>, now_ms: i64) {
        self.blocked.set(keys as i64);
        let age = oldest_ms.map_or(0.0, |o| (now_ms - o).max(0) as f64 / 1000.0);
        self.oldest_age.set(age);
    }

    /// A re-drive attempt ended.
    pub fn redriven(&self, redriven: bool, attempt: u32) {
        let outcome = if redriven {
            "redriven"
        } else {
            "still_invalid"
        };
        self.redrive
            .get_or_create(&RedriveLabels { outcome, attempt })
            .inc();
    }
}
