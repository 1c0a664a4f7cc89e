//! The DLT record format: what a diverted record is (`Diversion`), the one
//! place that names the context headers a dead-letter record carries,
//! writes them (`Diversion::to_record`) and parses them back (`Origin::of`,
//! and the `antidote dlt` commands' `DltRecord`, which use these names).
//!
//! Must never let one record's context grow without bound: `x-error` is cut
//! to [`MAX_ERROR_BYTES`], so a reason that quotes a huge value can never
//! make a DLT record too large for its topic.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use uuid::Uuid;

use crate::dlt_context::{
    Context, Seal, H_RULE_EXCEPTION, H_RULE_MODE, H_RULE_NAME, H_RULE_SUBJECT, H_RULE_TOPIC,
};
use crate::kafka::batch::Batch;
use crate::kafka::builder::NewRecord;
use crate::kafka::record::Record;
use crate::policy::{Class, Invalid, Policy};

pub const H_TOPIC: &str = "x-original-topic";
/// The origin topic's id (UUID text) when metadata knew it at write time:
/// tells a record of a deleted and recreated topic from one of the current.
pub const H_TOPIC_ID: &str = "x-original-topic-id";
pub const H_PARTITION: &str = "x-original-partition";
pub const H_OFFSET: &str = "x-original-offset";
pub const H_TIMESTAMP: &str = "x-original-timestamp";
pub const H_CLASS: &str = "x-error-class";
pub const H_ERROR: &str = "x-error";
pub const H_RULE: &str = "x-error-rule";
pub const H_POLICY: &str = "x-policy";
pub const H_FAILED_AT: &str = "x-failed-at";
/// The last offset of a whole batch diverted as one record (rule `batch`);
/// `x-original-offset` is its first.
pub const H_LAST_OFFSET: &str = "x-original-last-offset";
/// `x-error-rule` of a whole batch diverted because it cannot be decoded.
pub const RULE_WHOLE_BATCH: &str = "batch";
/// `<dlt-topic>/<partition>/<offset>` of the DLT record a replay came from.
pub const H_REPLAYED_FROM: &str = "x-replayed-from-dlt";
/// How many times this record has been replayed (1 on the first replay).
pub const H_ATTEMPT: &str = "x-attempt";
/// `true` on the DLT record of a record classed `redact`: it carries the
/// context headers only (no key, value or original headers), and replay
/// skips it.
pub const H_REDACTED: &str = "x-redacted";

/// The origin offset of the first diverted record of this record's key
/// (`ordering: per_key`): set on every diverted record that is parked
/// behind an earlier one of its key.
pub const H_BLOCKED_BY: &str = "x-blocked-by";
/// `x-error-rule` of a record diverted because its key is blocked.
pub const RULE_KEY: &str = "key";
/// On the last record `dlt replay` writes back for a blocked key: every
/// diverted record of the key up to this origin offset is home, so the
/// proxy releases the key as this record passes (the DLT gets a release
/// marker too, for restarts and other instances).
pub const H_RELEASED_THROUGH: &str = "x-released-through";

/// Context headers the proxy adds to a DLT record (plus the replay
/// headers). Every one is a reserved name (`dlt_context::is_reserved`).
pub const CONTEXT_HEADERS: &[&str] = &[
    H_TOPIC,
    H_TOPIC_ID,
    H_PARTITION,
    H_OFFSET,
    H_TIMESTAMP,
    H_CLASS,
    H_ERROR,
    H_RULE,
    H_POLICY,
    H_FAILED_AT,
    H_LAST_OFFSET,
    H_REPLAYED_FROM,
    H_ATTEMPT,
    H_REDACTED,
    H_BLOCKED_BY,
    H_RELEASED_THROUGH,
];

/// Longest `x-error` value written, in bytes.
pub const MAX_ERROR_BYTES: usize = 1024;
/// Appended to a cut `x-error` so a reader knows the text is incomplete.
const CUT_MARK: &str = "…[truncated]";

/// `reason` as written to `x-error`: at most [`MAX_ERROR_BYTES`] bytes, cut
/// on a UTF-8 boundary and marked when cut.
pub fn bound_reason(reason: &str) -> Cow<'_, str> {
    if reason.len() <= MAX_ERROR_BYTES {
        return Cow::Borrowed(reason);
    }
    let mut end = MAX_ERROR_BYTES - CUT_MARK.len();
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{CUT_MARK}", &reason[..end]))
}

/// The origin a DLT record names: where the diverted record came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    /// `None` for records written before the header existed, or when the
    /// id was unknown at write time.
    pub topic_id: Option<Uuid>,
}

impl Origin {
    /// The origin named by a DLT record's context, if it names a whole one.
    /// Only a context [`crate::dlt_context::open`] accepted is read, never
    /// a header of the original record.
    pub fn of(ctx: &Context<'_>) -> Option<Origin> {
        Some(Origin {
            topic: Arc::from(ctx.text(H_TOPIC)?),
            partition: i32::try_from(ctx.num(H_PARTITION)?).ok()?,
            offset: ctx.num(H_OFFSET)?,
            topic_id: ctx
                .text(H_TOPIC_ID)
                .and_then(|t| Uuid::parse_str(t.trim()).ok()),
        })
    }
}

/// One record on its way to a dead-letter topic, with its context.
#[derive(Debug, Clone)]
pub struct Diversion {
    pub dlt_topic: String,
    pub origin_topic: Arc<str>,
    pub origin_partition: i32,
    pub origin_offset: i64,
    pub origin_timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
    pub invalid: Invalid,
    pub policy: Arc<str>,
    /// `x-blocked-by`: set when the record is parked behind its key's
    /// first diverted record (`ordering: per_key`).
    pub blocked_by: Option<i64>,
    /// `x-original-last-offset`: the last offset of a whole batch diverted
    /// as one record (rule `batch`).
    pub last_offset: Option<i64>,
}

impl Diversion {
    pub fn new(
        policy: &Policy,
        topic: &Arc<str>,
        partition: i32,
        record: &Record<'_>,
        invalid: &Invalid,
    ) -> Self {
        if invalid.class == Class::Redact {
            return Self::redacted(policy, topic, partition, record, invalid);
        }
        Diversion {
            dlt_topic: policy.dead_letter_topic(topic, invalid.class),
            origin_topic: topic.clone(),
            origin_partition: partition,
            origin_offset: record.offset,
            origin_timestamp: record.timestamp,
            key: record.key.map(Bytes::copy_from_slice),
            value: record.value.map(Bytes::copy_from_slice),
            headers: record
                .headers
                .iter()
                .map(|h| {
                    (
                        Bytes::copy_from_slice(h.key),
                        h.value.map(Bytes::copy_from_slice),
                    )
                })
                .collect(),
            invalid: invalid.clone(),
            policy: Arc::from(policy.name.as_str()),
            blocked_by: None,
            last_offset: None,
        }
    }

    /// A record classed `redact`: nothing of its contents is kept, not even
    /// in the reason (which may quote a field's value).
    fn redacted(
        policy: &Policy,
        topic: &Arc<str>,
        partition: i32,
        record: &Record<'_>,
        invalid: &Invalid,
    ) -> Self {
        Diversion {
            dlt_topic: policy.dead_letter_topic(topic, invalid.class),
            origin_topic: topic.clone(),
            origin_partition: partition,
            origin_offset: record.offset,
            origin_timestamp: record.timestamp,
            key: None,
            value: None,
            headers: Vec::new(),
            invalid: Invalid {
                class: Class::Redact,
                rule: invalid.rule.clone(),
                reason: format!("rule {} (class redact: contents withheld)", invalid.rule),
                contract: invalid.contract.clone(),
            },
            policy: Arc::from(policy.name.as_str()),
            blocked_by: None,
            last_offset: None,
        }
    }

    /// Whether this is a `redact` record (context headers only).
    pub fn is_redacted(&self) -> bool {
        self.invalid.class == Class::Redact
    }

    /// A whole batch whose records cannot be read (`on_undecodable:
    /// divert`): its raw bytes as the value, class poison, rule `batch`,
    /// its offset range in `x-original-offset` and `x-original-last-offset`.
    pub fn whole_batch(
        policy: &Policy,
        topic: &Arc<str>,
        partition: i32,
        batch: &Batch,
        reason: String,
    ) -> Self {
        let last = batch.last_offset();
        Diversion {
            dlt_topic: policy.dead_letter_topic(topic, Class::Poison),
            origin_topic: topic.clone(),
            origin_partition: partition,
            origin_offset: batch.base_offset(),
            origin_timestamp: batch.base_timestamp(),
            key: None,
            value: Some(batch.bytes().clone()),
            headers: Vec::new(),
            invalid: Invalid::poison(RULE_WHOLE_BATCH, reason),
            policy: Arc::from(policy.name.as_str()),
            blocked_by: None,
            last_offset: Some(last),
        }
    }

    /// The record written to the DLT: original key, value and headers, plus
    /// the context headers an operator needs to act on it, framed (and
    /// signed) for the DLT partition `seal` names. `topic_id` is the origin
    /// topic's id, when metadata knows it.
    pub fn to_record(
        &self,
        failed_at_ms: i64,
        topic_id: Option<Uuid>,
        seal: &Seal<'_>,
    ) -> NewRecord {
        let originals: Vec<(String, Option<Bytes>)> = self
            .headers
            .iter()
            .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
            .collect();
        let mut context: Vec<(String, Option<Bytes>)> = Vec::with_capacity(12);
        let mut add = |k: &str, v: String| context.push((k.to_string(), Some(Bytes::from(v))));
        add(H_TOPIC, self.origin_topic.to_string());
        if let Some(id) = topic_id.filter(|id| !id.is_nil()) {
            add(H_TOPIC_ID, id.to_string());
        }
        add(H_PARTITION, self.origin_partition.to_string());
        add(H_OFFSET, self.origin_offset.to_string());
        add(H_TIMESTAMP, self.origin_timestamp.to_string());
        add(H_CLASS, self.invalid.class.as_str().to_string());
        add(H_ERROR, bound_reason(&self.invalid.reason).into_owned());
        add(H_RULE, self.invalid.rule.clone());
        add(H_POLICY, self.policy.to_string());
        add(H_FAILED_AT, failed_at_ms.to_string());
        if let Some(last) = self.last_offset {
            add(H_LAST_OFFSET, last.to_string());
        }
        if self.is_redacted() {
            add(H_REDACTED, "true".to_string());
        }
        if let Some(first) = self.blocked_by {
            add(H_BLOCKED_BY, first.to_string());
        }
        if let Some(rule) = &self.invalid.contract {
            // Confluent's DLQ action's headers, inside the signed context.
            add(H_RULE_NAME, rule.name.clone());
            add(H_RULE_MODE, rule.mode.to_string());
            add(H_RULE_SUBJECT, rule.subject.clone());
            add(H_RULE_TOPIC, self.origin_topic.to_string());
            add(
                H_RULE_EXCEPTION,
                bound_reason(&self.invalid.reason).into_owned(),
            );
        }
        seal.frame(
            self.origin_timestamp,
            self.key.clone(),
            self.value.clone(),
            originals,
            context,
        )
    }
}

/// A diversion of `geo` offset 7 by data-contract rule `north` (READ, subject
/// `geo-value`) when `contract`, else by a policy rule of that name, with the
/// record's own `headers`: for the tests that a rule's `__rule.*` fields are
/// read from antidote's signed context only.
#[cfg(test)]
pub(crate) fn ruled_diversion(contract: bool, headers: Vec<(Bytes, Option<Bytes>)>) -> Diversion {
    let mut invalid = Invalid::poison("rule:north", "data-contract rule north: false");
    if contract {
        invalid.contract = Some(Box::new(crate::policy::contract::RuleFailure {
            name: "north".into(),
            mode: "READ",
            subject: "geo-value".into(),
        }));
    }
    Diversion {
        dlt_topic: "geo.dlt".into(),
        origin_topic: Arc::from("geo"),
        origin_partition: 0,
        origin_offset: 7,
        origin_timestamp: 1,
        key: None,
        value: Some(Bytes::from_static(b"v")),
        headers,
        invalid,
        policy: Arc::from("p"),
        blocked_by: None,
        last_offset: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_context_header_is_a_reserved_name() {
        for n in CONTEXT_HEADERS {
            assert!(crate::dlt_context::is_reserved(n.as_bytes()), "{n}");
        }
    }

    #[test]
    fn a_rules_headers_are_inside_the_signed_context() {
        use crate::dlt_context::{open, Keys};
        use crate::kafka::record::Header;
        let own = (
            Bytes::from_static(b"__rule.name"),
            Some(Bytes::from_static(b"own")),
        );
        let d = ruled_diversion(true, vec![own]);
        let keys = Keys::new(&[b"0123456789abcdef0123"], false);
        let out = d.to_record(2, None, &Seal::new(&keys, "geo.dlt", 0));
        let read = |hs: &[(String, Option<Bytes>)]| -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
            hs.iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_ref().map(|b| b.to_vec())))
                .collect()
        };
        let owned = read(&out.headers);
        fn record<'a>(out: &'a NewRecord, hs: &'a [(Vec<u8>, Option<Vec<u8>>)]) -> Record<'a> {
            Record {
                offset: 0,
                timestamp: out.timestamp,
                key: out.key.as_deref(),
                value: out.value.as_deref(),
                headers: hs
                    .iter()
                    .map(|(k, v)| Header {
                        key: k,
                        value: v.as_deref(),
                    })
                    .collect(),
            }
        }
        let back = record(&out, &owned);
        let ctx = open(&back, "geo.dlt", 0, &keys).expect("verifies");
        assert!(ctx.signed);
        assert_eq!(ctx.text("__rule.name"), Some("north"));
        assert_eq!(ctx.text("__rule.mode"), Some("READ"));
        assert_eq!(ctx.text("__rule.subject"), Some("geo-value"));
        assert_eq!(ctx.text("__rule.topic"), Some("geo"));
        assert!(ctx
            .text("__rule.exception")
            .is_some_and(|e| e.contains("rule north")));
        // The record's own __rule.name stays among its original headers.
        assert_eq!(ctx.originals.len(), 1);
        assert_eq!(ctx.originals[0].value, Some(&b"own"[..]));
        // Another rule name in the context does not verify.
        let mut forged = owned.clone();
        for (k, v) in forged.iter_mut() {
            if k == b"__rule.name" && v.as_deref() == Some(b"north") {
                *v = Some(b"other".to_vec());
            }
        }
        assert!(open(&record(&out, &forged), "geo.dlt", 0, &keys).is_err());
        // A plain record with __rule.* headers: they are its own, not context.
        let plain = Record {
            headers: vec![Header {
                key: b"__rule.name",
                value: Some(b"x"),
            }],
            ..record(&out, &[])
        };
        let ctx = open(&plain, "t", 0, &Keys::none()).expect("plain");
        assert!(ctx.is_empty() && ctx.originals.len() == 1);
    }

    #[test]
    fn a_short_reason_is_kept_whole() {
        assert_eq!(bound_reason("/lat: 91 is outside"), "/lat: 91 is outside");
        let exact = "a".repeat(MAX_ERROR_BYTES);
        assert_eq!(bound_reason(&exact), exact);
    }

    #[test]
    fn a_long_reason_is_cut_on_a_char_boundary_and_marked() {
        // 3-byte characters, so the cut point falls inside one.
        let long = "€".repeat(5000);
        let cut = bound_reason(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES, "{}", cut.len());
        assert!(cut.ends_with(CUT_MARK));
        assert!(cut.trim_end_matches(CUT_MARK).chars().all(|c| c == '€'));
        assert!(cut.len() > MAX_ERROR_BYTES - 16);
    }
}
