//! Replay's decision for one DLT record, shared by `antidote dlt replay`
//! (the operator's flags) and the proxy's re-drive (its own [`Rule`]): a
//! DLT record read back and owned ([`DltRecord`]), what to do with it
//! ([`decide`], pure), and the record a replay writes ([`replay_record`]).
//!
//! Safety rules, in order: a record past its attempts is refused; a
//! `stale` one unless the rule includes them; a `redact` one and a whole
//! undecodable batch always; a record already replayed into the target is
//! skipped; and the record, as it would be written, is judged by the
//! target topic's CURRENT policy: still invalid means left alone.

use std::collections::HashSet;

use bytes::Bytes;

use crate::dlt_context::{Context, Keys, Seal};
use crate::dlt_marker::Attempt;
use crate::dlt_record::{
    H_ATTEMPT, H_CLASS, H_ERROR, H_FAILED_AT, H_OFFSET, H_PARTITION, H_POLICY, H_RELEASED_THROUGH,
    H_REPLAYED_FROM, H_RULE, H_TIMESTAMP, H_TOPIC, RULE_WHOLE_BATCH,
};
use crate::kafka::builder::NewRecord;
use crate::kafka::record::Record;
use crate::policy::{Class, PolicySet, Verdict};

/// One DLT record, owned, with its context headers parsed.
#[derive(Debug, Clone)]
pub struct DltRecord {
    pub dlt_topic: String,
    pub dlt_partition: i32,
    pub dlt_offset: i64,
    pub timestamp: i64,
    pub origin_topic: Option<String>,
    pub origin_partition: Option<i32>,
    pub origin_offset: Option<i64>,
    pub origin_timestamp: Option<i64>,
    pub class: String,
    pub rule: String,
    pub reason: String,
    pub policy: String,
    pub failed_at: Option<i64>,
    /// The previous replay's attempt number carried by the record, 0 if none.
    pub attempt: u32,
    /// A record classed `redact`: context headers only.
    pub redacted: bool,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    /// The original record's headers, in order, as its producer sent them
    /// (duplicates and null values kept; no context header of antidote's).
    pub headers: Vec<(String, Option<Bytes>)>,
    /// The re-drive attempts recorded for it (attempt markers in its DLT).
    pub redrive: Vec<Attempt>,
    /// The failed data-contract rule, when antidote's own (framed, and
    /// with signing keys signed) context names one; never read from the
    /// original record's headers, which anyone could have written.
    pub contract_rule: Option<ContractRule>,
}

/// A failed data-contract rule as a diversion's context names it:
/// Confluent's DLQ headers (`__rule.name`, `__rule.mode`,
/// `__rule.subject`, `__rule.topic`, `__rule.exception`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContractRule {
    pub name: String,
    pub mode: String,
    pub subject: String,
    pub topic: String,
    pub exception: String,
}

impl ContractRule {
    /// The rule `ctx`'s context section names, if it holds `__rule.name`.
    /// `ctx.text` reads the context only, never the original headers.
    pub fn of(ctx: &Context<'_>) -> Option<ContractRule> {
        use crate::dlt_context::{
            H_RULE_EXCEPTION, H_RULE_MODE, H_RULE_NAME, H_RULE_SUBJECT, H_RULE_TOPIC,
        };
        let text = |k: &str| ctx.text(k).unwrap_or_default().to_string();
        ctx.text(H_RULE_NAME)?;
        Some(ContractRule {
            name: text(H_RULE_NAME),
            mode: text(H_RULE_MODE),
            subject: text(H_RULE_SUBJECT),
            topic: text(H_RULE_TOPIC),
            exception: text(H_RULE_EXCEPTION),
        })
    }
}

impl DltRecord {
    /// The DLT record `r` read at `topic`/`partition`, whose frame opened
    /// as `ctx` (see the proxy's `dlt::trust`); markers give a record too
    /// (with no origin). `headers` are the original record's own headers,
    /// byte for byte, without any frame of a previous replay (opened with
    /// `keys`).
    pub fn from_context(
        topic: &str,
        partition: i32,
        r: &Record<'_>,
        ctx: &Context<'_>,
        keys: &Keys,
    ) -> Self {
        let text = |k: &str| ctx.text(k).map(str::to_string);
        let num = |k: &str| ctx.num(k);
        let origin_topic = text(H_TOPIC);
        let origin_partition = num(H_PARTITION).and_then(|p| i32::try_from(p).ok());
        // A record replayed before and diverted again: its own headers end
        // in the replay's frame (format 2), which says which attempt it
        // was. Format 1 kept `x-attempt` among the context headers.
        let mut originals = ctx.originals.clone();
        let mut attempt = num(H_ATTEMPT);
        if let (2, Some(t), Some(p)) = (ctx.format, &origin_topic, origin_partition) {
            let inner = Record {
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key,
                value: r.value,
                headers: originals.clone(),
            };
            if let Some(prev) = crate::dlt_context::open(&inner, t, p, keys)
                .ok()
                .filter(|c| c.format == 2 && c.get(H_REPLAYED_FROM).is_some())
            {
                attempt = prev.num(H_ATTEMPT);
                originals = prev.originals;
            }
        }
        DltRecord {
            dlt_topic: topic.to_string(),
            dlt_partition: partition,
            dlt_offset: r.offset,
            timestamp: r.timestamp,
            origin_topic,
            origin_partition,
            origin_offset: num(H_OFFSET),
            origin_timestamp: num(H_TIMESTAMP),
            class: text(H_CLASS).unwrap_or_default(),
            rule: text(H_RULE).unwrap_or_default(),
            reason: text(H_ERROR).unwrap_or_default(),
            policy: text(H_POLICY).unwrap_or_default(),
            failed_at: num(H_FAILED_AT),
            redacted: ctx.get(crate::dlt_record::H_REDACTED).is_some(),
            attempt: attempt.and_then(|a| u32::try_from(a).ok()).unwrap_or(0),
            key: r.key.map(Bytes::copy_from_slice),
            value: r.value.map(Bytes::copy_from_slice),
            headers: originals
                .iter()
                .map(|h| {
                    (
                        String::from_utf8_lossy(h.key).into_owned(),
                        h.value.map(Bytes::copy_from_slice),
                    )
                })
                .collect(),
            redrive: Vec::new(),
            contract_rule: ContractRule::of(ctx),
        }
    }

    /// `<dlt-topic>/<partition>/<offset>`: the value of `x-replayed-from-dlt`.
    pub fn coordinate(&self) -> String {
        format!(
            "{}/{}/{}",
            self.dlt_topic, self.dlt_partition, self.dlt_offset
        )
    }

    /// `topic-partition@offset` of the original record, or `-`.
    pub fn origin(&self) -> String {
        match (
            &self.origin_topic,
            self.origin_partition,
            self.origin_offset,
        ) {
            (Some(t), Some(p), Some(o)) => format!("{t}-{p}@{o}"),
            _ => "-".into(),
        }
    }
}

/// What a replay decision goes by besides the record and the policies:
/// the operator's choices (`dlt replay`'s flags) or re-drive's, so that the
/// runtime never builds command-line arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Write to this topic instead of each record's original topic.
    pub to: Option<String>,
    /// Refuse records already replayed this many times.
    pub max_attempts: u32,
    /// Also replay `stale` records.
    pub include_stale: bool,
}

impl From<&Rule> for Rule {
    fn from(r: &Rule) -> Rule {
        r.clone()
    }
}

impl Rule {
    /// Re-drive's rule: back to the original topic, stale records too, no
    /// cap on earlier replays (its delays are the ceiling).
    pub fn redrive() -> Rule {
        Rule {
            to: None,
            max_attempts: u32::MAX,
            include_stale: true,
        }
    }
}

/// What replay does with one DLT record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Write `record` to `topic`/`partition`.
    Replay {
        topic: String,
        partition: i32,
        attempt: u32,
        record: NewRecord,
    },
    AlreadyReplayed {
        topic: String,
    },
    StillInvalid {
        class: String,
        rule: String,
        reason: String,
    },
    RefusedStale,
    /// A `redact` record: its DLT entry holds no contents, and it must
    /// never come back.
    RefusedRedacted,
    /// A whole batch that could not be decoded (rule `batch`): its value is
    /// the raw batch, not a record; recover its records by hand.
    RefusedWholeBatch,
    RefusedMaxAttempts {
        attempts: u32,
    },
    /// No `x-original-topic` and no `--to`.
    NoOrigin,
    TargetMissing {
        topic: String,
    },
}

impl Decision {
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Replay { .. } => "replay",
            Decision::AlreadyReplayed { .. } => "already-replayed",
            Decision::StillInvalid { .. } => "still-invalid",
            Decision::RefusedStale => "refused-stale",
            Decision::RefusedRedacted => "refused-redacted",
            Decision::RefusedWholeBatch => "refused-whole-batch",
            Decision::RefusedMaxAttempts { .. } => "refused-max-attempts",
            Decision::NoOrigin => "no-origin",
            Decision::TargetMissing { .. } => "target-missing",
        }
    }
}

/// The record a replay writes to `seal`'s topic and partition: the
/// original key, value and headers, exactly, plus a frame of
/// `x-replayed-from-dlt`, `x-attempt` and, on the last record of a blocked
/// key, `x-released-through` (signed with keys, so that no producer of the
/// topic can pass its own record off as a replay).
pub fn replay_record(
    r: &DltRecord,
    attempt: u32,
    timestamp: i64,
    released_through: Option<i64>,
    seal: &Seal<'_>,
) -> NewRecord {
    let mut context = vec![
        (
            H_REPLAYED_FROM.to_string(),
            Some(Bytes::from(r.coordinate())),
        ),
        (
            H_ATTEMPT.to_string(),
            Some(Bytes::from(attempt.to_string())),
        ),
    ];
    if let Some(t) = released_through {
        context.push((
            H_RELEASED_THROUGH.to_string(),
            Some(Bytes::from(t.to_string())),
        ));
    }
    seal.frame(
        timestamp,
        r.key.clone(),
        r.value.clone(),
        r.headers.clone(),
        context,
    )
}

/// Decide what to do with one selected DLT record. Pure.
///
/// `partitions(topic)` is the target's partition count (`None`: missing);
/// `replayed` holds the DLT coordinates already found in the target; the
/// replayed record is sealed with `keys`.
pub fn decide(
    rule: impl Into<Rule>,
    policies: &PolicySet,
    keys: &Keys,
    r: &DltRecord,
    partitions: impl Fn(&str) -> Option<usize>,
    replayed: &HashSet<String>,
    now_ms: i64,
) -> Decision {
    let args = rule.into();
    let Some(topic) = args.to.clone().or_else(|| r.origin_topic.clone()) else {
        return Decision::NoOrigin;
    };
    if r.attempt >= args.max_attempts {
        return Decision::RefusedMaxAttempts {
            attempts: r.attempt,
        };
    }
    if r.class == Class::Stale.as_str() && !args.include_stale {
        return Decision::RefusedStale;
    }
    if r.class == Class::Redact.as_str() || r.redacted {
        return Decision::RefusedRedacted;
    }
    if r.rule == RULE_WHOLE_BATCH {
        return Decision::RefusedWholeBatch;
    }
    let Some(n) = partitions(&topic).filter(|&n| n > 0) else {
        return Decision::TargetMissing { topic };
    };
    if replayed.contains(&r.coordinate()) {
        return Decision::AlreadyReplayed { topic };
    }
    let attempt = r.attempt + 1;
    let partition = match r.origin_partition {
        Some(p) if p >= 0 && (p as usize) < n => p,
        _ => 0,
    };
    let record = replay_record(
        r,
        attempt,
        now_ms,
        None,
        &Seal::new(keys, &topic, partition),
    );
    if let Some(policy) = policies.policing(&topic) {
        let view = record.as_record();
        if let Verdict::Invalid(inv) = policy.judge_in(&topic, &view, now_ms) {
            return Decision::StillInvalid {
                class: inv.class.as_str().to_string(),
                rule: inv.rule,
                reason: inv.reason,
            };
        }
    }
    Decision::Replay {
        topic,
        partition,
        attempt,
        record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlt_context::NO_KEYS;
    use std::path::Path;

    const POLICY: &str = r#"
policies:
  - name: p
    topics: ["geo"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: 90
"#;

    fn rule() -> Rule {
        Rule {
            to: None,
            max_attempts: 3,
            include_stale: false,
        }
    }

    fn rec(value: &str, class: &str, attempt: Option<u32>) -> DltRecord {
        // The original record's own headers: the context is in the fields.
        let headers = vec![
            ("trace".to_string(), Some(Bytes::from_static(b"t1"))),
            ("x-request-id".to_string(), Some(Bytes::from_static(b"r1"))),
        ];
        DltRecord {
            dlt_topic: "geo.dlt".into(),
            dlt_partition: 0,
            dlt_offset: 4,
            timestamp: 1,
            origin_topic: Some("geo".into()),
            origin_partition: Some(2),
            origin_offset: Some(40),
            origin_timestamp: Some(1),
            class: class.into(),
            rule: "x".into(),
            reason: "y".into(),
            policy: "p".into(),
            failed_at: Some(2),
            attempt: attempt.unwrap_or(0),
            redacted: false,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from(value.to_string())),
            headers,
            redrive: Vec::new(),
            contract_rule: None,
        }
    }

    fn policies() -> PolicySet {
        PolicySet::parse(POLICY, Path::new("p.yaml")).unwrap()
    }

    #[test]
    fn replays_valid_records_with_replay_headers() {
        let d = decide(
            rule(),
            &policies(),
            &NO_KEYS,
            &rec(r#"{"lat": 10}"#, "poison", None),
            |_| Some(3),
            &HashSet::new(),
            99,
        );
        let Decision::Replay {
            topic,
            partition,
            attempt,
            record,
        } = d
        else {
            panic!("{d:?}")
        };
        assert_eq!((topic.as_str(), partition, attempt), ("geo", 2, 1));
        let keys: Vec<&str> = record.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "trace",
                "x-request-id",
                "x-replayed-from-dlt",
                "x-attempt",
                "x-antidote-context"
            ]
        );
        assert_eq!(record.headers[4].1.as_deref(), Some(&b"2 2"[..]));
        assert_eq!(record.headers[2].1.as_deref(), Some(&b"geo.dlt/0/4"[..]));
        assert_eq!(record.headers[3].1.as_deref(), Some(&b"1"[..]));
        assert_eq!(record.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(record.timestamp, 99);
    }

    #[test]
    fn counts_attempts_and_refuses_past_the_limit() {
        let d = decide(
            rule(),
            &policies(),
            &NO_KEYS,
            &rec(r#"{"lat": 10}"#, "poison", Some(2)),
            |_| Some(3),
            &HashSet::new(),
            0,
        );
        assert!(matches!(d, Decision::Replay { attempt: 3, .. }), "{d:?}");
        let d = decide(
            rule(),
            &policies(),
            &NO_KEYS,
            &rec(r#"{"lat": 10}"#, "poison", Some(3)),
            |_| Some(3),
            &HashSet::new(),
            0,
        );
        assert_eq!(d, Decision::RefusedMaxAttempts { attempts: 3 });
    }

    #[test]
    fn a_whole_undecodable_batch_is_never_replayed_as_a_record() {
        let mut r = rec(r#"{"lat": 1}"#, "poison", None);
        r.rule = RULE_WHOLE_BATCH.into();
        let d = decide(
            rule(),
            &policies(),
            &NO_KEYS,
            &r,
            |_| Some(3),
            &HashSet::new(),
            0,
        );
        assert_eq!(d, Decision::RefusedWholeBatch);
    }

    #[test]
    fn still_invalid_stale_missing_and_already_replayed_are_left_alone() {
        let p = policies();
        let d = decide(
            rule(),
            &p,
            &NO_KEYS,
            &rec(r#"{"lat": 91}"#, "poison", None),
            |_| Some(3),
            &HashSet::new(),
            0,
        );
        assert!(matches!(d, Decision::StillInvalid { .. }), "{d:?}");
        let d = decide(
            rule(),
            &p,
            &NO_KEYS,
            &rec(r#"{"lat": 1}"#, "stale", None),
            |_| Some(3),
            &HashSet::new(),
            0,
        );
        assert_eq!(d, Decision::RefusedStale);
        let a = Rule {
            include_stale: true,
            ..rule()
        };
        assert!(matches!(
            decide(
                &a,
                &p,
                &NO_KEYS,
                &rec(r#"{"lat": 1}"#, "stale", None),
                |_| Some(3),
                &HashSet::new(),
                0
            ),
            Decision::Replay { .. }
        ));
        let d = decide(
            rule(),
            &p,
            &NO_KEYS,
            &rec(r#"{"lat": 1}"#, "poison", None),
            |_| None,
            &HashSet::new(),
            0,
        );
        assert_eq!(
            d,
            Decision::TargetMissing {
                topic: "geo".into()
            }
        );
        let done: HashSet<String> = ["geo.dlt/0/4".to_string()].into();
        let d = decide(
            rule(),
            &p,
            &NO_KEYS,
            &rec(r#"{"lat": 1}"#, "poison", None),
            |_| Some(3),
            &done,
            0,
        );
        assert_eq!(
            d,
            Decision::AlreadyReplayed {
                topic: "geo".into()
            }
        );
    }

    #[test]
    fn partition_falls_back_to_zero_and_to_overrides_topic() {
        let a = Rule {
            to: Some("other".into()),
            ..rule()
        };
        let d = decide(
            &a,
            &policies(),
            &NO_KEYS,
            &rec(r#"{"lat": 91}"#, "poison", None),
            |_| Some(1),
            &HashSet::new(),
            0,
        );
        // `other` has no policy, so nothing judges the record there.
        assert!(
            matches!(d, Decision::Replay { ref topic, partition: 0, .. } if topic == "other"),
            "{d:?}"
        );
    }

    /// `dlt inspect` and the console show a data-contract rule from the
    /// (signed) context only: a record's own `__rule.*` headers stay its
    /// headers.
    #[test]
    fn the_contract_rule_is_read_from_the_context_never_from_the_headers() {
        use crate::dlt_context::open;
        use crate::dlt_record::ruled_diversion;
        use crate::kafka::record::Header;
        let keys = Keys::new(&[b"0123456789abcdef0123"], false);
        let own = vec![(
            Bytes::from_static(b"__rule.name"),
            Some(Bytes::from_static(b"forged")),
        )];
        let shown = |contract: bool| {
            let d = ruled_diversion(contract, own.clone());
            let out = d.to_record(2, None, &Seal::new(&keys, "geo.dlt", 0));
            let r = Record {
                offset: 0,
                timestamp: out.timestamp,
                key: None,
                value: out.value.as_deref(),
                headers: out
                    .headers
                    .iter()
                    .map(|(k, v)| Header {
                        key: k.as_bytes(),
                        value: v.as_deref(),
                    })
                    .collect(),
            };
            let ctx = open(&r, "geo.dlt", 0, &keys).expect("verifies");
            DltRecord::from_context("geo.dlt", 0, &r, &ctx, &keys)
        };
        let ruled = shown(true);
        let rule = ruled
            .contract_rule
            .clone()
            .expect("the context names the rule");
        assert_eq!(
            (
                rule.name.as_str(),
                rule.mode.as_str(),
                rule.subject.as_str()
            ),
            ("north", "READ", "geo-value")
        );
        assert_eq!(rule.topic, "geo");
        assert!(rule.exception.contains("rule north"), "{rule:?}");
        let plain = shown(false);
        assert_eq!(plain.contract_rule, None);
        for d in [&ruled, &plain] {
            assert_eq!(d.headers, [("__rule.name".to_string(), own[0].1.clone())]);
        }
    }
}
