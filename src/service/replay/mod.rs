//! `antidote dlt replay`: re-drive dead-lettered records to their original
//! topic (or `--to TOPIC`) once their cause is fixed.
//!
//! The replay decision for one DLT record ([`decide`], pure) is the core's
//! (`antidote_core::replay`), shared with re-drive; this module owns the
//! selection ([`ReplayPlan`], the command's flags), what happened to each
//! record ([`Outcome`], a line of the command, a row of the console's
//! preview), and the small acks=all producer that writes replays. Dry-run
//! unless `execute`.
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

pub use run::{produce, run};

use super::{DltRecord, Filters, H_REPLAYED_FROM};
pub use crate::replay::{decide, replay_record, Decision, Rule};

/// What to replay and how: the flags of `antidote dlt replay` (besides
/// its config), the console's preview and execute requests.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayPlan {
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
    #[arg(long, default_value_t = DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// Consider at most N records (after filtering).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Consider records only while their keys and values fit in this many
    /// bytes (the console; the command has no such bound).
    #[arg(skip)]
    pub max_bytes: Option<usize>,
    #[command(flatten)]
    pub filters: Filters,
}

/// `--max-attempts` when not given.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

impl ReplayPlan {
    /// A dry run of every record of `topic`, with the command's defaults.
    pub fn new(topic: impl Into<String>) -> ReplayPlan {
        ReplayPlan {
            topic: topic.into(),
            to: None,
            execute: false,
            rate: None,
            from_offset: None,
            to_offset: None,
            include_stale: false,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            limit: None,
            max_bytes: None,
            filters: Filters::default(),
        }
    }
}

impl From<&ReplayPlan> for Rule {
    fn from(a: &ReplayPlan) -> Rule {
        Rule {
            to: a.to.clone(),
            max_attempts: a.max_attempts,
            include_stale: a.include_stale,
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
    /// The progress line: `replay: N considered, ...`.
    pub fn line(&self, execute: bool) -> String {
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

/// What a replay did (or, in a dry run, would do) with one DLT record or a
/// blocked key: one line of `dlt replay`'s output ([`Outcome::line`]), one
/// row of the console's preview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    WouldReplay {
        coord: String,
        topic: String,
        partition: i32,
        origin: String,
        attempt: u32,
    },
    Replayed {
        coord: String,
        topic: String,
        partition: i32,
        offset: i64,
        origin: String,
        attempt: u32,
    },
    /// Found in the target already: by the read before the run, or
    /// (`partition`) written by a concurrent replay meanwhile.
    AlreadyReplayed {
        coord: String,
        topic: String,
        partition: Option<i32>,
    },
    /// Re-validated against the current policy: still invalid.
    StillInvalid {
        coord: String,
        class: String,
        rule: String,
        reason: String,
    },
    Refused {
        coord: String,
        why: String,
    },
    /// A blocked key's record not replayed because another of the key's
    /// records (`blocker`) would not be.
    HeldBack {
        coord: String,
        key: String,
        topic: String,
        partition: i32,
        blocker: String,
        why: &'static str,
    },
    Failed {
        coord: String,
        topic: String,
        partition: i32,
        error: String,
    },
    /// A blocked key's records were all written; its release marker too.
    Released {
        key: String,
        topic: String,
        partition: i32,
        through: i64,
    },
}

impl Outcome {
    /// A short name of what happened (`would_replay`, `replayed`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::WouldReplay { .. } => "would_replay",
            Outcome::Replayed { .. } => "replayed",
            Outcome::AlreadyReplayed { .. } => "already_replayed",
            Outcome::StillInvalid { .. } => "still_invalid",
            Outcome::Refused { .. } => "refused",
            Outcome::HeldBack { .. } => "held_back",
            Outcome::Failed { .. } => "failed",
            Outcome::Released { .. } => "released",
        }
    }

    /// The DLT record's coordinate (`dlt/partition/offset`); none for a
    /// released key.
    pub fn coordinate(&self) -> Option<&str> {
        match self {
            Outcome::WouldReplay { coord, .. }
            | Outcome::Replayed { coord, .. }
            | Outcome::AlreadyReplayed { coord, .. }
            | Outcome::StillInvalid { coord, .. }
            | Outcome::Refused { coord, .. }
            | Outcome::HeldBack { coord, .. }
            | Outcome::Failed { coord, .. } => Some(coord),
            Outcome::Released { .. } => None,
        }
    }

    /// The line `dlt replay` prints for it.
    pub fn line(&self) -> String {
        match self {
            Outcome::WouldReplay { coord, topic, partition, origin, attempt } => format!(
                "would replay      {coord} -> {topic}-{partition} (origin {origin}, attempt {attempt})"
            ),
            Outcome::Replayed { coord, topic, partition, offset, origin, attempt } => format!(
                "replayed          {coord} -> {topic}-{partition}@{offset} (origin {origin}, attempt {attempt})"
            ),
            Outcome::AlreadyReplayed { coord, topic, partition: None } => format!(
                "already replayed  {coord} (a record in {topic} carries {H_REPLAYED_FROM}: {coord})"
            ),
            Outcome::AlreadyReplayed { coord, topic, partition: Some(p) } => format!(
                "already replayed  {coord} (a concurrent replay wrote it to {topic}-{p})"
            ),
            Outcome::StillInvalid { coord, class, rule, reason } => {
                format!("still invalid     {coord}: {class} {rule}: {reason}")
            }
            Outcome::Refused { coord, why } => format!("refused           {coord}: {why}"),
            Outcome::HeldBack { coord, key, topic, partition, blocker, why } => format!(
                "held back         {coord}: key {key} of {topic}-{partition} stays blocked ({blocker}: {why}); nothing of it replayed"
            ),
            Outcome::Failed { coord, topic, partition, error } => {
                format!("failed            {coord} -> {topic}-{partition}: {error}")
            }
            Outcome::Released { key, topic, partition, through } => format!(
                "released          key {key} of {topic}-{partition} through offset {through}"
            ),
        }
    }
}

/// Where a replay's outcomes go, as they happen: the command prints each
/// line and a progress line; the console keeps them for its page.
pub trait Sink {
    /// One record's outcome; `report` counts it already.
    fn outcome(&mut self, o: Outcome, report: &Report) -> Result<(), super::DltError>;
    /// A remark on the run as a whole (e.g. later copies skipped).
    fn notice(&mut self, _text: &str) {}
    /// A record, or a blocked key's records, is done (progress).
    fn progress(&mut self, _report: &Report) {}
}

/// Whether `r` passes the selection (filters and origin offsets).
pub fn selected(args: &ReplayPlan, r: &DltRecord) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn args() -> ReplayPlan {
        ReplayPlan {
            topic: "geo.dlt".into(),
            to: None,
            execute: false,
            rate: None,
            from_offset: None,
            to_offset: None,
            include_stale: false,
            max_attempts: 3,
            limit: None,
            max_bytes: None,
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
            contract_rule: None,
        }
    }

    #[test]
    fn origin_offset_range_selects() {
        let a = ReplayPlan {
            from_offset: Some(41),
            ..args()
        };
        assert!(!selected(&a, &rec("{}", "poison", None)));
        let a = ReplayPlan {
            from_offset: Some(40),
            to_offset: Some(40),
            ..args()
        };
        assert!(selected(&a, &rec("{}", "poison", None)));
    }
}
