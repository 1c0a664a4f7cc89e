//! Metrics of a fleet of instances sharing DLTs: where the ledger's entries
//! come from (written here, learned from another instance's write by the
//! tail, found in the DLT just before a write) and how far the tail is
//! behind the DLTs' ends; and the records read back from DLTs (or replayed
//! into origin topics) that were refused as not antidote's.

use super::series::{RefusedLabels, SourceLabel};
use super::{names, register, Metrics};

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

    /// `n` records this instance wrote to a DLT (acknowledged).
    ///
    /// Call site: `Metrics::dlt_written`, once per DLT partition's write.
    pub(super) fn fleet_written(&self, n: u64) {
        self.diversions_add("written", n);
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

    /// `n` diversions found in the DLT by the catch-up read before a write,
    /// so not written again.
    ///
    /// Call site: `Metrics::dlt_written`, once per DLT partition's write.
    pub(super) fn fleet_found_at_write(&self, n: u64) {
        self.diversions_add("found_at_write", n);
    }
}
