//! What judging records came to, as series: records judged, run through a
//! validator, delivered valid, and each invalid record with its class,
//! rule and action. The Fetch and ShareFetch paths report them per
//! partition of a response ([`Judged`], in an `Observation`); the Produce
//! door reports a request's refusals at once ([`DoorSeen`]). The `action`
//! label is [`InvalidAction`]: what happened to an invalid record (on
//! fetch, its policy action's own label, `policy::Action::label`).

use std::sync::Arc;

use super::*;
use crate::plan::PartitionPlan;
use crate::policy::{Action, Class, Invalid, Policy};

/// One partition's judging in one response.
pub struct Judged {
    pub topic: Arc<str>,
    pub partition: i32,
    pub policy: Arc<Policy>,
    /// Records run through the validator (verdict cache misses).
    pub evaluated: u64,
    /// Records judged (those judged again on a later fetch not counted).
    pub judged: u64,
    /// Records judged valid and delivered.
    pub passed: u64,
    /// Invalid records counted now: class, rule, what became of them, how many.
    pub invalid: Vec<(Class, String, InvalidAction, u64)>,
}

impl Judged {
    /// `plan`'s judging: `judged` records, `passed` of them valid, and each
    /// invalid record whose offset `counts` (with whether it is a diversion
    /// written now), with what became of it: diverted now or by an earlier
    /// fetch (batches resent as spliced), dropped, or passed.
    pub fn of(
        plan: &PartitionPlan,
        judged: u64,
        passed: u64,
        counts: impl Fn(i64, bool) -> bool,
    ) -> Judged {
        let mut j = Judged {
            topic: plan.topic.clone(),
            partition: plan.partition,
            policy: plan.policy.clone(),
            evaluated: plan.stats.validated,
            judged,
            passed,
            invalid: Vec::new(),
        };
        for d in (plan.diversions.iter()).filter(|d| counts(d.origin_offset, true)) {
            j.invalid(&d.invalid, InvalidAction::Met(Action::Divert));
        }
        for s in (plan.settled.iter()).filter(|s| counts(s.offset, false)) {
            j.invalid(&s.invalid, s.action.into());
        }
        j
    }

    /// Count one more invalid record (`inv`, `action`).
    pub fn invalid(&mut self, inv: &Invalid, action: InvalidAction) {
        let same = |(c, r, a, _): &&mut (Class, String, InvalidAction, u64)| {
            *c == inv.class && *a == action && *r == inv.rule
        };
        match self.invalid.iter_mut().find(same) {
            Some((.., n)) => *n += 1,
            None => self.invalid.push((inv.class, inv.rule.clone(), action, 1)),
        }
    }
}

impl Metrics {
    /// What judging one partition of one response came to: records run
    /// through the validator, judged, delivered valid, and each invalid
    /// one with what became of it.
    pub(super) fn partition_judged(&self, j: &Judged) {
        let (topic, partition, policy) = (&*j.topic, j.partition, j.policy.name.as_str());
        self.record_evaluated(policy, j.evaluated);
        self.record_validated(topic, partition, policy, j.judged);
        self.record_passed(topic, partition, policy, j.passed);
        for (class, rule, action, n) in &j.invalid {
            self.record_invalid_n(topic, partition, policy, *class, rule, *action, *n);
        }
    }

    /// `n` records of `topic`/`partition` were judged under `policy`.
    ///
    /// Call site: `Metrics::observe`, once per partition with the number of
    /// records judged in this response, including those whose verdict came
    /// from the `VerdictCache` (the DLT rate is per delivered record, not
    /// per validation run). Not called for aborted transactional batches.
    pub fn record_validated(&self, topic: &str, partition: i32, policy: &str, n: u64) {
        self.validated
            .with(&(topic, partition, policy), |c| c.inc_by(n));
    }

    /// `n` records were run through `policy`'s validator, i.e. judged
    /// without a verdict from the `VerdictCache`. With several consumer
    /// groups reading the same records, this stays near one group's
    /// `antidote_records_validated_total`.
    ///
    /// Call site: `Metrics::observe`, with `PlanStats::validated`.
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

    /// One record judged invalid: `record_invalid_n` of one (tests).
    #[cfg(test)]
    pub(super) fn record_invalid(
        &self,
        topic: &str,
        partition: i32,
        policy: &str,
        class: crate::policy::Class,
        rule: &str,
        action: InvalidAction,
    ) {
        self.record_invalid_n(topic, partition, policy, class, rule, action, 1);
    }

    /// `n` records judged invalid alike (`class`, failing `rule`) and what
    /// was done with them.
    ///
    /// Call sites: `Metrics::door_seen` (`Rejected` at the Produce door),
    /// and `Metrics::observe` for the invalid records of a plan once its
    /// diversions are done, each with its policy's action (`Met`): a
    /// diversion counts once acknowledged. A diversion that failed is not
    /// counted here (its partition is held and the record will be judged
    /// again); see [`Metrics::dlt_written`].
    #[allow(clippy::too_many_arguments)]
    pub fn record_invalid_n(
        &self,
        topic: &str,
        partition: i32,
        policy: &str,
        class: crate::policy::Class,
        rule: &str,
        action: InvalidAction,
        n: u64,
    ) {
        let class = class.as_str();
        let labels = InvalidRef {
            topic,
            partition,
            policy,
            class,
            rule,
            action: action.as_str(),
        };
        self.invalid.with(&labels, |c| c.inc_by(n));
        if action.diverted() {
            history::global().diverted(topic, class, n, crate::clock::now_ms());
        }
    }
}

/// What the Produce door did with one request's refused and waiting
/// partitions, reported once.
#[derive(Debug, Default)]
pub struct DoorSeen {
    /// Refused records: topic, partition, policy, class, rule, how many.
    refused: Vec<(String, i32, String, Class, String, u64)>,
    /// Partitions answered retriably for want of a schema (`transient`).
    waiting: Vec<(String, i32)>,
}

impl DoorSeen {
    /// `n` records of `topic`/`partition` refused under `policy`, as
    /// `class` by `rule`.
    pub fn refused(&mut self, at: (&str, i32), policy: &str, class: Class, rule: &str, n: u64) {
        let (topic, partition) = at;
        let row = (
            topic.into(),
            partition,
            policy.into(),
            class,
            rule.into(),
            n,
        );
        self.refused.push(row);
    }

    /// A batch of `topic`/`partition` answered retriably: the registry has
    /// not given a schema it needs.
    pub fn waiting(&mut self, topic: &str, partition: i32) {
        self.waiting.push((topic.into(), partition));
    }
}

impl Metrics {
    /// Turn what the Produce door did with one request into series.
    ///
    /// Call site: `intercept::produce::Notes::apply`, once per request.
    pub fn door_seen(&self, seen: DoorSeen) {
        for (topic, partition, policy, class, rule, n) in &seen.refused {
            let action = InvalidAction::Rejected;
            self.record_invalid_n(topic, *partition, policy, *class, rule, action, *n);
        }
        for (topic, partition) in &seen.waiting {
            self.held_batch(topic, *partition, "transient");
        }
    }
}

/// What happened to an invalid record (the `action` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidAction {
    /// Met on fetch by its policy's action (`on_invalid`): diverted now or
    /// by an earlier fetch, dropped, or passed.
    Met(Action),
    /// Refused at Produce (`on_produce: reject`): never written.
    Rejected,
}

impl InvalidAction {
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidAction::Met(a) => a.label(),
            InvalidAction::Rejected => "rejected",
        }
    }

    /// Whether the record went to a dead-letter topic (the history's
    /// diverted series).
    pub fn diverted(self) -> bool {
        matches!(self, InvalidAction::Met(a) if a.writes())
    }
}

impl From<Action> for InvalidAction {
    fn from(a: Action) -> Self {
        InvalidAction::Met(a)
    }
}
