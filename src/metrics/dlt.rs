//! Metrics of the dead-letter side. One DLT partition's write, as the
//! writer saw it: the writer fills one [`DltWriteSeen`] while it takes the
//! partition's lease, reads the partition to its end and produces to it,
//! and hands it over once ([`Metrics::dlt_written`]): the series
//! `antidote_dlt_writes_total`, `antidote_dlt_write_duration_seconds`. A
//! fleet of instances sharing DLTs: where the ledger's entries come from
//! (`antidote_dlt_diversions_total`: written here, learned from another
//! instance's write by the tail, found in the DLT just before a write),
//! how far the tail is behind the DLTs' ends (one [`FollowerSeen`] per
//! follower round), and the records read back from DLTs (or replayed into
//! origin topics) that were refused as not antidote's.

use std::time::Duration;

use super::series::{RefusedLabels, ResultLabel, SourceLabel};
use super::{names, register, Metrics};

/// What one Produce of dead-letter records came to (its `result` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Produced {
    /// Acknowledged with acks=all.
    Ok,
    /// Refused or unanswered: the partition's remaining jobs fail.
    Error,
    /// A single record's timestamp refused: sent again, stamped anew.
    Retimed,
    /// A single record refused as too large for the DLT.
    TooLarge,
}

impl Produced {
    /// The `result` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Produced::Ok => "ok",
            Produced::Error => "error",
            Produced::Retimed => "retimed",
            Produced::TooLarge => "too_large",
        }
    }
}

/// One DLT partition's write (every lease attempt, catch-up read and
/// Produce of one `write_partition`), reported once.
#[derive(Debug, Default)]
pub struct DltWriteSeen {
    /// Each Produce of dead-letter records, in order: what it came to and
    /// how long it took, from its first attempt to its outcome.
    pub produced: Vec<(Produced, Duration)>,
    /// Records this instance wrote (acknowledged).
    pub written: u64,
    /// Diversions the catch-up read found in the DLT already (another
    /// instance's), so not written again.
    pub found_at_write: u64,
    /// Times another instance's newer epoch fenced the lease or a write,
    /// so the lease was taken again.
    pub fenced: u64,
    /// Times the lease could not be had (InitProducerId failed): the
    /// write waits, its partition held.
    pub lease_failed: u64,
}

impl Metrics {
    /// Turn one DLT partition's write into series.
    ///
    /// Call site: `dlt::writer::once::write_partition`, once per DLT
    /// partition per writer round, whatever its outcome.
    pub fn dlt_written(&self, seen: DltWriteSeen) {
        for (produced, latency) in seen.produced {
            self.dlt_write_result(produced.as_str(), latency);
        }
        for _ in 0..seen.fenced {
            self.dlt_write_result("fenced", Duration::ZERO);
        }
        for _ in 0..seen.lease_failed {
            self.dlt_write_result("lease_failed", Duration::ZERO);
        }
        self.diversions_add("written", seen.written);
        self.diversions_add("found_at_write", seen.found_at_write);
    }

    /// One dead-letter write step ended with `result` after `latency`: a
    /// Produce's ([`Produced`]), or `fenced` and `lease_failed` (zero).
    pub(super) fn dlt_write_result(&self, result: &str, latency: Duration) {
        let labels = ResultLabel {
            result: result.to_owned(),
        };
        self.dlt_writes.with(&labels, |c| c.inc());
        self.dlt_write_seconds
            .with(&labels, |h| h.observe(latency.as_secs_f64()));
    }
}

/// What one round of the DLT follower (`dlt::follower`) saw, reported once
/// by [`Metrics::follower_round`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FollowerSeen {
    /// Diversions of other instances the tail read that the ledger did not know.
    pub learned: u64,
    /// The tail's lag behind the DLTs' ends, in records, if the round read them.
    pub ledger_lag: Option<i64>,
    /// The blocked-key set (how many keys, the oldest block's start in ms),
    /// if the round followed it.
    pub blocked: Option<(usize, Option<i64>)>,
}

impl Metrics {
    pub(super) fn register_fleet(&mut self) {
        register(
            &mut self.registry,
            names::DIVERSIONS,
            "Diversions entered into the ledger, by source: written (by this instance), learned (another instance's, read by the DLT tail), found_at_write (another instance's, read just before writing it again).",
            self.diversions.family.clone(),
        );
        register(
            &mut self.registry,
            names::LEDGER_LAG,
            "DLT records not yet read by the ledger's tail, summed over DLT partitions (as of the last tail round).",
            self.ledger_lag.clone(),
        );
        register(
            &mut self.registry,
            names::DLT_REFUSED,
            "Records read back from a DLT that were refused as not antidote's own, by reader (ledger, tail, blocked_keys, redrive, replay, inspect, discard) and reason (bad_frame, duplicate_reserved_header, unexpected_reserved_header, unsigned, bad_signature).",
            self.dlt_refused.family.clone(),
        );
    }

    /// A reader refused a DLT record (`reason`: `Refusal::as_str`).
    pub fn dlt_record_refused(&self, reader: &'static str, reason: &'static str) {
        self.dlt_refused
            .with(&RefusedLabels { reader, reason }, |c| c.inc());
    }

    /// How many records `reader` refused for `reason` (tests, `check`).
    pub fn dlt_records_refused(&self, reader: &'static str, reason: &'static str) -> u64 {
        self.dlt_refused
            .with(&RefusedLabels { reader, reason }, |c| c.get())
    }

    fn diversions_add(&self, source: &'static str, n: u64) {
        if n > 0 {
            self.diversions
                .with(&SourceLabel { source }, |c| c.inc_by(n));
        }
    }

    /// What one follower round saw, as of `now_ms`: the diversions it
    /// learned, the ledger's lag and the blocked keys' gauges.
    pub fn follower_round(&self, seen: FollowerSeen, now_ms: i64) {
        self.diversions_add("learned", seen.learned);
        if let Some(lag) = seen.ledger_lag {
            self.ledger_lag.set(lag);
        }
        if let Some((keys, oldest)) = seen.blocked {
            self.keys.set_blocked(keys, oldest, now_ms);
        }
    }
}
