//! The door (`on_produce: reject`): the core's verdict on one partition of a
//! client's Produce (`plan::produce`) turned into the producer's answer,
//! logged once and counted.
//!
//! A batch holding an invalid record gets INVALID_RECORD (87), with one
//! KIP-467 record error per invalid record (capped by the core) and an
//! `error_message` naming the policy, rule and reason: the producer sent
//! those bytes, so quoting them back to it discloses nothing. Logs never
//! quote them unless `logging.record_contents` is on (`Invalid::log_reason`).
//! A batch that cannot be judged is refused whole (fail closed); only a
//! spent decode budget gets a retriable error, since it clears by itself.
//!
//! This module never touches the request's bytes; `produce` does.

use std::sync::Arc;

use bytes::Bytes;
use tracing::{debug, info};

use crate::clock::now_ms;
use crate::metrics::{self, InvalidAction};
use crate::plan::budget::DecodeBudget;
use crate::plan::produce::{judge_produce, DoorVerdict, Rejection};
use crate::plan::HoldReason;
use crate::policy::{Class, OnProduce, Policy, PolicySet};
use crate::proxy::produce::{Refusal, INVALID_RECORD};

pub use crate::client::errors::{NOT_ENOUGH_REPLICAS, UNKNOWN_TOPIC_ID};

/// Longest text of one record error or error message, in bytes: reasons
/// can quote a whole value.
const MAX_TEXT: usize = 1024;

/// What the door does with one topic of a Produce request.
#[derive(Debug)]
pub(super) enum Gate<'p> {
    /// No policy rejects at Produce for it (or it is a dead-letter topic,
    /// never policed): forward.
    Open,
    /// A topic id the proxy cannot resolve while some policy rejects at
    /// Produce: it may be a policy topic, so refuse retriably.
    UnknownTopic,
    /// Judge its records under this policy.
    Judge(&'p Arc<Policy>),
}

/// The gate for `topic` (`None`: a Produce v13+ topic id not known).
pub(super) fn gate<'p>(policies: &'p PolicySet, topic: Option<&str>) -> Gate<'p> {
    let Some(topic) = topic else {
        return match policies.rejects_at_produce() {
            true => Gate::UnknownTopic,
            false => Gate::Open,
        };
    };
    if policies.is_dead_letter_topic(topic) {
        return Gate::Open; // never policed, like on fetch
    }
    match policies.for_topic(topic) {
        Some(p) if p.on_produce == OnProduce::Reject => Gate::Judge(p),
        _ => Gate::Open,
    }
}

/// Judge one partition's records under `policy`; `None` when they may be
/// forwarded.
pub(super) fn judge(
    policy: &Arc<Policy>,
    topic: &str,
    partition: i32,
    records: &Bytes,
    budget: &Arc<DecodeBudget>,
) -> Option<Refusal> {
    match judge_produce(policy, records, budget, now_ms()) {
        DoorVerdict::Accept { .. } => None,
        DoorVerdict::Reject(r) => {
            count(policy, topic, partition, &r);
            log_rejection(policy, topic, partition, &r);
            Some(rejection(policy, &r))
        }
        DoorVerdict::Unjudgeable(reason) => Some(unjudgeable(policy, topic, partition, reason)),
    }
}

/// The answer for a topic id the proxy does not know.
pub(super) fn unknown_topic_id() -> Refusal {
    Refusal {
        code: UNKNOWN_TOPIC_ID,
        message: "antidote: topic id not known to the proxy yet; retry".into(),
        record_errors: Vec::new(),
    }
}

fn rejection(policy: &Policy, r: &Rejection) -> Refusal {
    let record_errors = r
        .detailed
        .iter()
        .map(|d| {
            let v = &d.invalid;
            let text = format!(
                "policy {}, rule {} ({}): {}",
                policy.name, v.rule, v.class, v.reason
            );
            (d.index, cut(text))
        })
        .collect();
    let message = match r.detailed.first() {
        Some(d) => format!(
            "antidote: policy {} rejected the batch: {} of {} records invalid; record {}: rule {} ({}): {}",
            policy.name,
            r.invalid(),
            r.records,
            d.index,
            d.invalid.rule,
            d.invalid.class,
            d.invalid.reason
        ),
        None => format!("antidote: policy {} rejected the batch", policy.name),
    };
    Refusal {
        code: INVALID_RECORD,
        message: cut(message),
        record_errors,
    }
}

fn unjudgeable(policy: &Policy, topic: &str, partition: i32, reason: HoldReason) -> Refusal {
    let name = &policy.name;
    if reason == HoldReason::Budget {
        debug!(%topic, partition, policy = %name, "Produce batch refused for now: decode budget spent");
        return Refusal {
            code: NOT_ENOUGH_REPLICAS,
            message: "antidote: decode budget spent by requests in flight; retry".into(),
            record_errors: Vec::new(),
        };
    }
    info!(%topic, partition, policy = %name, reason = %reason, "Produce batch rejected: it cannot be judged");
    metrics::global().record_invalid(
        topic,
        partition,
        name,
        Class::Poison,
        "batch",
        InvalidAction::Rejected,
    );
    Refusal {
        code: INVALID_RECORD,
        message: cut(format!(
            "antidote: policy {name} cannot judge the batch ({reason}); rejected"
        )),
        record_errors: Vec::new(),
    }
}

/// Count every refused record under its class and rule.
fn count(policy: &Policy, topic: &str, partition: i32, r: &Rejection) {
    let m = metrics::global();
    for (class, rule, n) in &r.tally {
        for _ in 0..*n {
            m.record_invalid(
                topic,
                partition,
                &policy.name,
                *class,
                rule,
                InvalidAction::Rejected,
            );
        }
    }
}

/// One line per refused batch; the reason only if the operator opted in.
fn log_rejection(policy: &Policy, topic: &str, partition: i32, r: &Rejection) {
    let Some(first) = r.detailed.first() else {
        return;
    };
    let v = &first.invalid;
    info!(%topic, partition, policy = %policy.name, records = r.records,
        invalid = r.invalid(), batch_index = first.index, class = v.class.as_str(),
        rule = %v.rule, reason = %v.log_reason(), "Produce batch rejected at the door");
}

/// `text` cut to at most `MAX_TEXT` bytes on a character boundary.
fn cut(mut text: String) -> String {
    if text.len() > MAX_TEXT {
        let mut end = MAX_TEXT - "…".len();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies() -> PolicySet {
        let text = "policies:\n  - name: door\n    topics: [\"geo.*\"]\n    on_produce: reject\n  - name: fetch-only\n    topics: [orders]\n";
        PolicySet::parse(text, std::path::Path::new("/tmp/p.yaml")).expect("policies")
    }

    #[test]
    fn only_topics_of_policies_that_reject_at_produce_are_judged() {
        let set = policies();
        assert!(matches!(gate(&set, Some("geo.x")), Gate::Judge(p) if p.name == "door"));
        assert!(matches!(gate(&set, Some("orders")), Gate::Open));
        assert!(matches!(gate(&set, Some("other")), Gate::Open));
    }

    #[test]
    fn dead_letter_topics_are_never_judged_even_under_a_glob() {
        assert!(matches!(gate(&policies(), Some("geo.x.dlt")), Gate::Open));
    }

    #[test]
    fn an_unknown_topic_id_is_refused_only_while_a_policy_rejects_at_produce() {
        assert!(matches!(gate(&policies(), None), Gate::UnknownTopic));
        let none = PolicySet::parse(
            "policies:\n  - name: f\n    topics: [orders]\n",
            std::path::Path::new("/tmp/p.yaml"),
        )
        .expect("policies");
        assert!(matches!(gate(&none, None), Gate::Open));
        assert_eq!(unknown_topic_id().code, UNKNOWN_TOPIC_ID);
    }

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        let t = cut("é".repeat(MAX_TEXT));
        assert!(t.len() <= MAX_TEXT);
        assert!(t.ends_with('…'));
        assert_eq!(cut("short".into()), "short");
    }
}
