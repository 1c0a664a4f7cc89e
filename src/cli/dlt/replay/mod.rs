//! `antidote dlt replay`: re-drive dead-lettered records to their original
//! topic (or `--to TOPIC`) once their cause is fixed.
//!
//! The replay decision for one DLT record ([`decide`], pure) is the core's
//! (`antidote_core::replay`), shared with re-drive; this module owns the
//! command's flags and selection, and the small acks=all producer that
//! writes replays. Dry-run unless `--execute`.
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

use std::path::PathBuf;

pub use run::{produce, run};

use super::{DltRecord, Filters};
pub use crate::replay::{decide, replay_record, Decision, Rule};

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

impl From<&ReplayArgs> for Rule {
    fn from(a: &ReplayArgs) -> Rule {
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

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
