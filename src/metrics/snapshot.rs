//! Reading the counters back, for the admin console's overview: the same
//! numbers `/metrics` serves, as values rather than text.

use super::series::Cached;
use super::Metrics;

/// One series of `antidote_records_invalid_total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCount {
    pub topic: String,
    pub partition: i32,
    pub policy: String,
    pub class: &'static str,
    pub rule: String,
    pub action: &'static str,
    pub count: u64,
}

impl<S, M, C> Cached<S, M, C> {
    /// Run `f` on every series with its labels.
    pub(super) fn each_labelled(&self, mut f: impl FnMut(&S, &M)) {
        for bucket in self.cache.iter() {
            bucket.value().iter().for_each(|(s, m)| f(s, m));
        }
    }
}

impl Metrics {
    /// Every series of `antidote_records_invalid_total` with its count.
    pub fn invalid_counts(&self) -> Vec<InvalidCount> {
        let mut out = Vec::new();
        self.invalid.each_labelled(|l, c| {
            out.push(InvalidCount {
                topic: l.topic.clone(),
                partition: l.partition,
                policy: l.policy.clone(),
                class: l.class,
                rule: l.rule.clone(),
                action: l.action,
                count: c.get(),
            })
        });
        out.sort_by(|a, b| {
            (&a.topic, a.partition, a.class, &a.rule, a.action).cmp(&(
                &b.topic,
                b.partition,
                b.class,
                &b.rule,
                b.action,
            ))
        });
        out
    }

    /// The partitions `antidote_held_partitions` says are held now.
    pub fn held_now(&self) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        self.held.each_labelled(|l, g| {
            if g.get() > 0 {
                out.push((l.topic.clone(), l.partition));
            }
        });
        out.sort();
        out
    }

    /// `antidote_dlt_ledger_lag_records`.
    pub fn ledger_lag(&self) -> i64 {
        self.ledger_lag.get()
    }
}
