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
//! the partitions answered retriably: a later batch of such a partition
//! already in flight gets the same answer, so a producer with several
//! requests in flight neither reorders records nor (idempotent) meets
//! OUT_OF_ORDER_SEQUENCE_NUMBER.
//!
//! This module never touches the request's bytes; `produce` does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tracing::{debug, info, warn};

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

/// A negative registry answer younger than this is not asked again at the
/// door: it bounds the registry requests a producer of bad ids can cause.
pub(super) const RECHECK_FLOOR_MS: i64 = 1_000;

/// What judging one Produce request left to do: ask the registry and judge
/// again, and the counts and logs of the final answer.
#[derive(Default)]
pub(super) struct Notes {
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
    Accepted(bool),
}

/// Set while registry-backed batches are answered retriably: the outage is
/// logged once, when it begins.
static WAITING: AtomicBool = AtomicBool::new(false);

impl Notes {
    /// Whether asking the registry could change the answer.
    pub(super) fn ask_registry(&self) -> bool {
        self.wait || !self.recheck.is_empty()
    }

    /// Schema ids to ask about again past the negative cache.
    pub(super) fn recheck(&self) -> &[u32] {
        &self.recheck
    }

    /// The answer is final: count and log it, and mark the partitions
    /// answered retriably (request number `request` of the connection).
    pub(super) fn apply(self, marks: Option<&Marks>, request: u64) {
        for e in self.effects {
            match e {
                Effect::Rejected(p, topic, partition, r) => {
                    count(&p, &topic, partition, &r);
                    log_rejection(&p, &topic, partition, &r);
                }
                Effect::Unjudgeable(p, topic, partition, reason) => {
                    unjudgeable_effects(&p, &topic, partition, &reason)
                }
                Effect::Waiting(p, topic, partition, reason) => {
                    metrics::global().held_batch(&topic, partition, "transient");
                    if !WAITING.swap(true, Ordering::Relaxed) {
                        warn!(%topic, partition, policy = %p.name, %reason,
                            "Produce batches answered retriably: the schema registry has not given a schema they need");
                    }
                }
                Effect::Accepted(registry) => {
                    if registry && WAITING.swap(false, Ordering::Relaxed) {
                        info!("schema registry answers again: Produce batches are judged");
                    }
                }
            }
        }
        if let Some(marks) = marks {
            for (at, r) in self.retriable {
                marks.mark(at, request, r);
            }
        }
    }
}

/// Partitions of one connection answered retriably at the door, and how
/// many of its requests have been answered.
#[derive(Default)]
pub(super) struct Marks {
    marked: Mutex<HashMap<(String, i32), Mark>>,
    /// Requests expecting an answer, classified so far.
    asked: AtomicU64,
    /// Answers written to the client so far.
    answered: AtomicU64,
}

struct Mark {
    /// The request answered retriably, numbered in the connection's order.
    request: u64,
    /// The refused batch's producer id and first sequence (-1 when the
    /// producer is not idempotent).
    producer_id: i64,
    base_sequence: i32,
    refusal: Refusal,
    at: std::time::Instant,
}

/// A mark outlives no producer's delivery timeout (Java's default: 120 s).
const MARK_LIFETIME: std::time::Duration = std::time::Duration::from_secs(300);

impl Marks {
    /// The number the next request expecting an answer gets.
    pub(super) fn next_request(&self) -> u64 {
        self.asked.load(Ordering::SeqCst)
    }

    /// A request expecting an answer was classified.
    pub(super) fn asked(&self) {
        self.asked.fetch_add(1, Ordering::SeqCst);
    }

    /// An answer was written to the client.
    pub(super) fn answered(&self) {
        self.answered.fetch_add(1, Ordering::SeqCst);
    }

    fn mark(&self, at: (String, i32), request: u64, retriable: Retriable) {
        let mut m = self.marked.lock().unwrap_or_else(|p| p.into_inner());
        let (producer_id, base_sequence) = retriable.identity;
        m.insert(
            at,
            Mark {
                request,
                producer_id,
                base_sequence,
                refusal: retriable.refusal,
                at: std::time::Instant::now(),
            },
        );
    }

    /// The same retriable answer for a later batch of a partition answered
    /// retriably, while that batch was already in flight: for an idempotent
    /// producer, a batch with a later sequence than the refused one (its
    /// retry, with the same sequence, is judged); for others, a batch read
    /// before the refusal was written to the client.
    pub(super) fn still_refused(
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
        let (producer_id, base_sequence) = batch_identity(records);
        let sequenced = mark.producer_id >= 0
            && producer_id == mark.producer_id
            && mark.base_sequence >= 0
            && base_sequence >= 0;
        let in_flight = if sequenced {
            base_sequence > mark.base_sequence
        } else {
            self.answered.load(Ordering::SeqCst) <= mark.request
        };
        if in_flight && mark.at.elapsed() < MARK_LIFETIME {
            return Some(mark.refusal.clone());
        }
        m.remove(&key);
        None
    }
}

/// One partition answered retriably: the answer and the refused batch's
/// producer id and first sequence.
struct Retriable {
    refusal: Refusal,
    identity: (i64, i32),
}

/// The producer id and first sequence of a records section's first batch.
fn batch_identity(records: &Bytes) -> (i64, i32) {
    match crate::kafka::batch::segments(records).into_iter().next() {
        Some(crate::kafka::batch::Segment::Batch(b)) => (b.producer_id(), b.base_sequence()),
        _ => (-1, -1),
    }
}

fn retriable(refusal: &Refusal, records: &Bytes) -> Retriable {
    Retriable {
        refusal: refusal.clone(),
        identity: batch_identity(records),
    }
}

/// Judge one partition's records under `policy`; `None` when they may be
/// forwarded. What is left to do (ask the registry, count, log) goes to
/// `notes`.
pub(super) fn judge(
    policy: &Arc<Policy>,
    topic: &str,
    partition: i32,
    records: &Bytes,
    budget: &Arc<DecodeBudget>,
    notes: &mut Notes,
) -> Option<Refusal> {
    let registry = policy.uses_registry();
    let at = (topic.to_string(), partition);
    match judge_produce(policy, topic, records, budget, now_ms()) {
        DoorVerdict::Accept { .. } => {
            notes.effects.push(Effect::Accepted(registry));
            None
        }
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

fn unjudgeable_effects(policy: &Policy, topic: &str, partition: i32, reason: &HoldReason) {
    let name = &policy.name;
    if *reason == HoldReason::Budget {
        debug!(%topic, partition, policy = %name, "Produce batch refused for now: decode budget spent");
        return;
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
