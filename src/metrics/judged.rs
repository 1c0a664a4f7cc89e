//! What judging records came to, as series: records judged, run through a
//! validator, delivered valid, and each invalid record with its class,
//! rule and action. The Fetch and ShareFetch paths report one
//! [`PartitionJudged`] per partition of a response; the Produce door
//! reports its refusals record by record.

use super::*;

/// One partition's judging in one response (`Metrics::partition_judged`).
pub struct PartitionJudged<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub policy: &'a str,
    /// Records run through the validator (verdict cache misses).
    pub evaluated: u64,
    /// Records judged (those judged again on a later fetch not counted).
    pub judged: u64,
    /// Records judged valid and delivered.
    pub passed: u64,
    /// Each invalid record counted now, and what became of it.
    pub invalid: Vec<(&'a crate::policy::Invalid, InvalidAction)>,
}

impl Metrics {
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

    /// What judging one partition of one response came to, reported once:
    /// records run through the validator, judged, delivered valid, and each
    /// invalid one with what became of it.
    ///
    /// Call site: `intercept::fetch::count`, once per planned partition of
    /// a Fetch or ShareFetch response.
    pub fn partition_judged(&self, j: &PartitionJudged<'_>) {
        let (topic, partition, policy) = (j.topic, j.partition, j.policy);
        self.record_evaluated(policy, j.evaluated);
        self.record_validated(topic, partition, policy, j.judged);
        self.record_passed(topic, partition, policy, j.passed);
        for (inv, action) in &j.invalid {
            self.record_invalid(topic, partition, policy, inv.class, &inv.rule, *action);
        }
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
        if action == InvalidAction::Diverted {
            history::global().diverted(topic, class.as_str(), 1, crate::clock::now_ms());
        }
    }
}
