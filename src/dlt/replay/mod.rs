//! `antidote dlt replay`: re-drive dead-lettered records to their original
//! topic (or `--to TOPIC`) once their cause is fixed.
//!
//! Owns the replay decision for one DLT record ([`decide`], pure) and the
//! small acks=all producer that writes replays. Dry-run unless `--execute`.
//!
//! A replayed record keeps the original key, value and headers, minus the
//! proxy's context headers ([`super::CONTEXT_HEADERS`]), plus
//! `x-replayed-from-dlt: <dlt-topic>/<partition>/<offset>` and
//! `x-attempt: N` (the DLT record's own `x-attempt` + 1, so a record that was
//! replayed, judged invalid again and dead-lettered again counts up). Its
//! timestamp is the time of the replay (CreateTime); the original timestamp
//! stays in the DLT.
//!
//! Safety rules, in order:
//! 1. Filters choose records (`--class`, `--reason`, `--key`, origin offsets, times).
//! 2. A record whose attempt count reached `--max-attempts` is refused.
//! 3. A `stale` record is refused unless `--include-stale` (it would only be
//!    stale again).
//! 4. The record, as it would be written, is judged by the CURRENT policy of
//!    the target topic; still invalid means reported and left alone.
//! 5. No double replays: before producing, every record of the target topic
//!    that carries `x-replayed-from-dlt` is read and the DLT coordinates
//!    already replayed are skipped. This makes running the same replay twice
//!    safe; it costs one read of the target topic per run, and two replays
//!    of the same records running at the same moment can still both write.
//!    If a produce fails with an unknown outcome (timeout, lost connection),
//!    run the replay again: what landed is skipped.
//!
//! Records go to the original partition when the target has it, else to
//! partition 0; Produce v3..=9, acks=all, one record per request, in DLT
//! order, at most `--rate` per second.
//!
//! The decision is here; running it against the clusters (reading targets,
//! producing, the progress line) is in `run`.

pub mod keys;
mod run;
mod targets;

use std::collections::HashSet;
use std::path::PathBuf;

use bytes::Bytes;

pub use run::{produce, run};

use super::{DltRecord, Filters, H_ATTEMPT, H_REPLAYED_FROM};
use crate::deadletter::trust;
use crate::dlt_context::Seal;
use crate::kafka::builder::NewRecord;
use crate::policy::{PolicySet, Verdict};

/// Arguments of `antidote dlt replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// The proxy's config file (the cluster and the CURRENT policies).
    #[arg(long, short)]
    pub config: PathBuf,
    /// The dead-letter topic to replay from.
    #[arg(long)]
    pub topic: String,
    /// Write to this topic instead of each record's original topic.
    #[arg(long)]
    pub to: Option<String>,
    /// Really produce; without it nothing is written (dry run).
    #[arg(long)]
    pub execute: bool,
    /// At most N records per second.
    #[arg(long, value_name = "N")]
    pub rate: Option<f64>,
    /// Only records whose ORIGINAL offset is at least this.
    #[arg(long)]
    pub from_offset: Option<i64>,
    /// Only records whose ORIGINAL offset is at most this.
    #[arg(long)]
    pub to_offset: Option<i64>,
    /// Also replay `stale` records (refused by default).
    #[arg(long)]
    pub include_stale: bool,
    /// Refuse records already replayed this many times.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Consider at most N records (after filtering).
    #[arg(long)]
    pub limit: Option<usize>,
    #[command(flatten)]
    pub filters: Filters,
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

impl From<&ReplayArgs> for Rule {
    fn from(a: &ReplayArgs) -> Rule {
        Rule {
            to: a.to.clone(),
            max_attempts: a.max_attempts,
            include_stale: a.include_stale,
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
    fn label(&self) -> &'static str {
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

/// What a replay run did, by outcome.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub considered: u64,
    pub replayed: u64,
    pub would_replay: u64,
    pub already_replayed: u64,
    pub still_invalid: u64,
    pub refused: u64,
    pub failed: u64,
}

impl Report {
    fn line(&self, execute: bool) -> String {
        let sent = if execute {
            format!("{} replayed", self.replayed)
        } else {
            format!("{} would be replayed", self.would_replay)
        };
        format!(
            "replay: {} considered, {sent}, {} already replayed, {} still invalid, {} refused, {} failed",
            self.considered, self.already_replayed, self.still_invalid, self.refused, self.failed
        )
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
            crate::dlt_record::H_RELEASED_THROUGH.to_string(),
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

/// Whether `r` passes the command-line selection (filters and origin offsets).
pub fn selected(args: &ReplayArgs, r: &DltRecord) -> bool {
    if !args.filters.matches(r) {
        return false;
    }
    let off = r.origin_offset;
    if args.from_offset.is_some_and(|f| off.is_none_or(|o| o < f)) {
        return false;
    }
    if args.to_offset.is_some_and(|t| off.is_none_or(|o| o > t)) {
        return false;
    }
    true
}

/// Decide what to do with one selected DLT record. Pure.
///
/// `partitions(topic)` is the target's partition count (`None`: missing);
/// `replayed` holds the DLT coordinates already found in the target.
pub fn decide(
    rule: impl Into<Rule>,
    policies: &PolicySet,
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
    if r.class == crate::policy::Class::Stale.as_str() && !args.include_stale {
        return Decision::RefusedStale;
    }
    if r.class == crate::policy::Class::Redact.as_str() || r.redacted {
        return Decision::RefusedRedacted;
    }
    if r.rule == crate::deadletter::RULE_WHOLE_BATCH {
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
    let record = replay_record(r, attempt, now_ms, None, &trust::seal(&topic, partition));
    if let Some(policy) = policies
        .for_topic(&topic)
        .filter(|_| !policies.is_dead_letter_topic(&topic))
    {
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

    fn args() -> ReplayArgs {
        ReplayArgs {
            config: PathBuf::from("x.yaml"),
            topic: "geo.dlt".into(),
            to: None,
            execute: false,
            rate: None,
            from_offset: None,
            to_offset: None,
            include_stale: false,
            max_attempts: 3,
            limit: None,
            filters: Filters::default(),
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
        }
    }

    fn policies() -> PolicySet {
        PolicySet::parse(POLICY, Path::new("p.yaml")).unwrap()
    }

    #[test]
    fn replays_valid_records_with_replay_headers() {
        let d = decide(
            &args(),
            &policies(),
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
            &args(),
            &policies(),
            &rec(r#"{"lat": 10}"#, "poison", Some(2)),
            |_| Some(3),
            &HashSet::new(),
            0,
        );
        assert!(matches!(d, Decision::Replay { attempt: 3, .. }), "{d:?}");
        let d = decide(
            &args(),
            &policies(),
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
        r.rule = crate::deadletter::RULE_WHOLE_BATCH.into();
        let d = decide(&args(), &policies(), &r, |_| Some(3), &HashSet::new(), 0);
        assert_eq!(d, Decision::RefusedWholeBatch);
    }

    #[test]
    fn still_invalid_stale_missing_and_already_replayed_are_left_alone() {
        let p = policies();
        let d = decide(
            &args(),
            &p,
            &rec(r#"{"lat": 91}"#, "poison", None),
            |_| Some(3),
            &HashSet::new(),
            0,
        );
        assert!(matches!(d, Decision::StillInvalid { .. }), "{d:?}");
        let d = decide(
            &args(),
            &p,
            &rec(r#"{"lat": 1}"#, "stale", None),
            |_| Some(3),
            &HashSet::new(),
            0,
        );
        assert_eq!(d, Decision::RefusedStale);
        let a = ReplayArgs {
            include_stale: true,
            ..args()
        };
        assert!(matches!(
            decide(
                &a,
                &p,
                &rec(r#"{"lat": 1}"#, "stale", None),
                |_| Some(3),
                &HashSet::new(),
                0
            ),
            Decision::Replay { .. }
        ));
        let d = decide(
            &args(),
            &p,
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
            &args(),
            &p,
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
        let a = ReplayArgs {
            to: Some("other".into()),
            ..args()
        };
        let d = decide(
            &a,
            &policies(),
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

    #[test]
    fn origin_offset_range_selects() {
        let a = ReplayArgs {
            from_offset: Some(41),
            ..args()
        };
        assert!(!selected(&a, &rec("{}", "poison", None)));
        let a = ReplayArgs {
            from_offset: Some(40),
            to_offset: Some(40),
            ..args()
        };
        assert!(selected(&a, &rec("{}", "poison", None)));
    }
}
