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
//! Registry-backed policies: a batch whose schema ids the registry has not
//! given yet is never accepted and never refused as invalid. The relay asks
//! the registry (at most its `timeout`) and judges the request again; a
//! batch still waiting then gets a retriable error (NOT_ENOUGH_REPLICAS with
//! a message naming the registry), so producers retry by themselves and
//! lose nothing within their `delivery.timeout.ms`. A batch refused only
//! for an earlier registry answer (an unknown id, an id not under the
//! subject) is judged again after asking past the negative cache.
//!
//! Counts and logs are [`Notes`] applied once the answer is final, so a
//! request judged twice is counted once. [`Marks`] keep, per connection,
//! the partitions answered retriably: later batches of such a partition get
//! the same answer until the refused batch's retry arrives, so a producer
//! with several requests in flight neither reorders records nor
//! (idempotent) meets OUT_OF_ORDER_SEQUENCE_NUMBER.
//!
//! This module never touches the request's bytes; [`wire`] does.

pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tracing::{debug, info, warn};

use crate::clock::now_ms;
use crate::metrics::{self, DoorSeen};
use crate::plan::budget::DecodeBudget;
use crate::plan::produce::{judge_produce, retry_identity, DoorVerdict, Rejection};
use crate::plan::HoldReason;
use crate::policy::{Class, OnProduce, Policy, PolicySet};
use wire::{Refusal, INVALID_RECORD};

pub use crate::client::errors::{NOT_ENOUGH_REPLICAS, UNKNOWN_TOPIC_ID};

/// Longest text of one record error or error message, in bytes: reasons
/// can quote a whole value.
const MAX_TEXT: usize = 1024;

/// What the door does with one topic of a Produce request.
#[derive(Debug)]
pub(crate) enum Gate<'p> {
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
pub(crate) fn gate<'p>(policies: &'p PolicySet, topic: Option<&str>) -> Gate<'p> {
    let Some(topic) = topic else {
        return match policies.rejects_at_produce() {
            true => Gate::UnknownTopic,
            false => Gate::Open,
        };
    };
    match policies.policing(topic) {
        Some(p) if p.on_produce == OnProduce::Reject => Gate::Judge(p),
        _ => Gate::Open,
    }
}

/// A negative registry answer younger than this is not asked again at the
/// door: it bounds the registry requests a producer of bad ids can cause.
pub(crate) const RECHECK_FLOOR_MS: i64 = 1_000;

/// What judging one Produce request left to do: ask the registry and judge
/// again, and the counts and logs of the final answer.
#[derive(Default)]
pub(crate) struct Notes {
    /// Some partition waits for a schema the registry has not given.
    wait: bool,
    /// Schema ids to ask about again before refusing.
    recheck: Vec<u32>,
    /// Partitions answered retriably, and how.
    retriable: Vec<((String, i32), Retriable)>,
    effects: Vec<Effect>,
}

enum Effect {
    Rejected(Arc<Policy>, String, i32, Rejection),
    Unjudgeable(Arc<Policy>, String, i32, HoldReason),
    Waiting(Arc<Policy>, String, i32, String),
}

/// The registry outage (`Registry::outages`) the door last logged: each
/// outage is logged once, by the first batch answered retriably in it.
static LOGGED_OUTAGE: AtomicU64 = AtomicU64::new(u64::MAX);

impl Notes {
    /// Whether asking the registry could change the answer.
    pub(crate) fn ask_registry(&self) -> bool {
        self.wait || !self.recheck.is_empty()
    }

    /// Schema ids to ask about again past the negative cache.
    pub(crate) fn recheck(&self) -> &[u32] {
        &self.recheck
    }

    /// The answer is final: count and log it, and mark the partitions
    /// answered retriably. `outage` numbers the registry's outages, so that
    /// each is logged once.
    pub(crate) fn apply(self, marks: Option<&Marks>, outage: u64) {
        let mut seen = DoorSeen::default();
        for e in self.effects {
            match e {
                Effect::Rejected(p, topic, partition, r) => {
                    for (class, rule, n) in &r.tally {
                        seen.refused((&topic, partition), &p.name, *class, rule, *n);
                    }
                    log_rejection(&p, &topic, partition, &r);
                }
                Effect::Unjudgeable(p, topic, partition, reason) => {
                    unjudgeable_effects(&p, &topic, partition, &reason, &mut seen)
                }
                Effect::Waiting(p, topic, partition, reason) => {
                    seen.waiting(&topic, partition);
                    if LOGGED_OUTAGE.swap(outage, Ordering::Relaxed) != outage {
                        warn!(%topic, partition, policy = %p.name, %reason,
                            "Produce batches answered retriably: the schema registry has not given a schema they need");
                    }
                }
            }
        }
        metrics::global().door_seen(seen);
        if let Some(marks) = marks {
            for (at, r) in self.retriable {
                marks.mark(at, r);
            }
        }
    }
}

/// Partitions of one connection answered retriably at the door.
///
/// Until the refused batch's retry arrives (a batch starting with the same
/// record: producers retry in order), every batch of that partition gets
/// the same answer: those already in flight when the refusal was sent must
/// not be written before the records refused ahead of them. A producer that
/// gave up on the refused records never sends that retry: the mark lapses
/// [`RETRY_WINDOW`] after the refusal (producers retry within about a
/// second: librdkafka's and Java's `retry.backoff.max.ms` is 1 s).
#[derive(Default)]
pub(crate) struct Marks {
    marked: Mutex<HashMap<(String, i32), Mark>>,
}

struct Mark {
    retry: Option<(i64, i32, i64, u64)>,
    refusal: Refusal,
    at: std::time::Instant,
}

/// How long a partition's later batches wait for the retry of its refused one.
pub(crate) const RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

impl Marks {
    fn mark(&self, at: (String, i32), retriable: Retriable) {
        let mut m = self.marked.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(
            at,
            Mark {
                retry: retriable.retry,
                refusal: retriable.refusal,
                at: std::time::Instant::now(),
            },
        );
    }

    /// The same retriable answer for a batch of a partition answered
    /// retriably, unless it is the refused batch's retry or the mark lapsed.
    pub(crate) fn still_refused(
        &self,
        topic: &str,
        partition: i32,
        records: &Bytes,
    ) -> Option<Refusal> {
        let mut m = self.marked.lock().unwrap_or_else(|p| p.into_inner());
        if m.is_empty() {
            return None;
        }
        let key = (topic.to_string(), partition);
        let mark = m.get(&key)?;
        let lapsed = mark.at.elapsed() >= RETRY_WINDOW;
        if !lapsed && (mark.retry.is_none() || retry_identity(records) != mark.retry) {
            return Some(mark.refusal.clone());
        }
        m.remove(&key);
        None
    }
}

/// One partition answered retriably: the answer and what its retry looks like.
struct Retriable {
    refusal: Refusal,
    retry: Option<(i64, i32, i64, u64)>,
}

fn retriable(refusal: &Refusal, records: &Bytes) -> Retriable {
    Retriable {
        refusal: refusal.clone(),
        retry: retry_identity(records),
    }
}

/// Judge one partition's records under `policy`; `None` when they may be
/// forwarded. What is left to do (ask the registry, count, log) goes to
/// `notes`.
pub(crate) fn judge(
    policy: &Arc<Policy>,
    topic: &str,
    partition: i32,
    records: &Bytes,
    budget: &Arc<DecodeBudget>,
    notes: &mut Notes,
) -> Option<Refusal> {
    let at = (topic.to_string(), partition);
    match judge_produce(policy, topic, records, budget, now_ms()) {
        DoorVerdict::Accept { .. } => None,
        DoorVerdict::Reject(r) => {
            for id in &r.recheck {
                if !notes.recheck.contains(id) {
                    notes.recheck.push(*id);
                }
            }
            let refusal = rejection(policy, &r);
            notes
                .effects
                .push(Effect::Rejected(policy.clone(), at.0, partition, r));
            Some(refusal)
        }
        DoorVerdict::Wait { reason, .. } => {
            notes.wait = true;
            let refusal = Refusal {
                code: NOT_ENOUGH_REPLICAS,
                message: cut(format!(
                    "antidote: policy {} is waiting for the schema registry ({reason}); retry",
                    policy.name
                )),
                record_errors: Vec::new(),
            };
            notes
                .retriable
                .push((at.clone(), retriable(&refusal, records)));
            notes
                .effects
                .push(Effect::Waiting(policy.clone(), at.0, partition, reason));
            Some(refusal)
        }
        DoorVerdict::Unjudgeable(reason) => {
            let refusal = unjudgeable(policy, &reason);
            if refusal.code == NOT_ENOUGH_REPLICAS {
                notes
                    .retriable
                    .push((at.clone(), retriable(&refusal, records)));
            }
            notes
                .effects
                .push(Effect::Unjudgeable(policy.clone(), at.0, partition, reason));
            Some(refusal)
        }
    }
}

/// The answer for a topic id the proxy does not know.
pub(crate) fn unknown_topic_id() -> Refusal {
    Refusal {
        code: UNKNOWN_TOPIC_ID,
        message: "antidote: topic id not known to the proxy yet; retry".into(),
        record_errors: Vec::new(),
    }
}

/// The reason a producer is told: its own bytes may be quoted back to it,
/// except under a `redact` rule, whose answer names the rule only (an
/// answer may reach logs and dashboards the value must never reach).
fn answer_reason(v: &crate::policy::Invalid) -> &str {
    if v.class == Class::Redact {
        "withheld (class redact)"
    } else {
        &v.reason
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
                policy.name,
                v.rule,
                v.class,
                answer_reason(v)
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
            answer_reason(&d.invalid)
        ),
        None => format!("antidote: policy {} rejected the batch", policy.name),
    };
    Refusal {
        code: INVALID_RECORD,
        message: cut(message),
        record_errors,
    }
}

fn unjudgeable(policy: &Policy, reason: &HoldReason) -> Refusal {
    if *reason == HoldReason::Budget {
        return Refusal {
            code: NOT_ENOUGH_REPLICAS,
            message: "antidote: decode budget spent by requests in flight; retry".into(),
            record_errors: Vec::new(),
        };
    }
    Refusal {
        code: INVALID_RECORD,
        message: cut(format!(
            "antidote: policy {} cannot judge the batch ({reason}); rejected",
            policy.name
        )),
        record_errors: Vec::new(),
    }
}

fn unjudgeable_effects(
    policy: &Policy,
    topic: &str,
    partition: i32,
    reason: &HoldReason,
    seen: &mut DoorSeen,
) {
    let name = &policy.name;
    if *reason == HoldReason::Budget {
        debug!(%topic, partition, policy = %name, "Produce batch refused for now: decode budget spent");
        return;
    }
    info!(%topic, partition, policy = %name, reason = %reason, "Produce batch rejected: it cannot be judged");
    seen.refused((topic, partition), name, Class::Poison, "batch", 1);
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
    use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};

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
    fn a_partition_answered_retriably_stays_refused_until_its_retry() {
        let batch = |value: &str| {
            let record = NewRecord {
                timestamp: 1_700_000_000_000,
                key: None,
                value: Some(Bytes::copy_from_slice(value.as_bytes())),
                headers: vec![],
            };
            build_batch(&[record], &BuildOptions::default()).expect("batch")
        };
        let marks = Marks::default();
        let refused = batch("a");
        let refusal = Refusal {
            code: NOT_ENOUGH_REPLICAS,
            message: "wait".into(),
            record_errors: Vec::new(),
        };
        marks.mark(("t".into(), 0), retriable(&refusal, &refused));
        // Another partition, and the same partition's later batch.
        assert_eq!(marks.still_refused("t", 1, &batch("b")), None);
        assert_eq!(
            marks.still_refused("t", 0, &batch("b")),
            Some(refusal.clone())
        );
        // The retry is judged, and the mark is gone.
        assert_eq!(marks.still_refused("t", 0, &refused), None);
        assert_eq!(marks.still_refused("t", 0, &batch("b")), None);
    }

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        let t = cut("é".repeat(MAX_TEXT));
        assert!(t.len() <= MAX_TEXT);
        assert!(t.ends_with('…'));
        assert_eq!(cut("short".into()), "short");
    }
}
