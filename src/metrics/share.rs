//! Share consumers (KIP-932): what the proxy settles with the broker for
//! them, and what it withholds.
//!
//! `antidote_share_acks_total{result}`: the proxy's own acknowledgements of
//! records it removed for good: `sent` (offsets merged into a client's
//! request), `refused` (partitions whose acknowledgement the broker refused:
//! the records come back when their locks expire), `overflow` (offsets not
//! kept: bounds reached).
//! `antidote_share_withheld_records_total{reason}`: acquired records kept
//! from a share consumer without an acknowledgement, so the broker delivers
//! them again when their locks expire: `dlt` (the diversion was not
//! acknowledged), `transient` (the registry did not answer), `breaker`,
//! `held` (a batch that cannot be judged, and what follows it),
//! `unknown_topic` (a topic id not known yet), `not_loaded` (the DLT not
//! read back yet), `bad_ranges` (acquired ranges not believed: unsorted,
//! overlapping, outside the records, or too many).
//! `antidote_share_renewals_total{result}`: withheld ranges the proxy kept
//! acquired (KIP-1222) in its own ShareAcknowledge of the member's session:
//! `sent` (ranges renewed), `released` (ranges released once their reason
//! cleared, or their renewals were spent: delivered and judged again),
//! `refused` (renewed ranges the broker refused: back on lock expiry).
//! `antidote_share_renew_fallbacks_total{reason}`: withheld ranges left to
//! their locks (they come back when the lock expires, a delivery counted):
//! `no_v2` (the broker has no ShareAcknowledge v2), `disabled`
//! (`share_groups.renew_withheld: false`), `member_gone` (the session
//! ended or started again, or its connection closed: the broker released
//! them), `budget` (`share_groups.withheld_budget` spent), `refused` (the
//! broker refused the renewal), `expired` (no request of the session came
//! before the lock ran out), `renewals_spent` (released after
//! `share_groups.max_renewals` renewals, the reason not known to have
//! cleared).
//! `antidote_share_withheld_ranges` and `antidote_share_withheld_bytes`:
//! the withheld ranges kept for renewal now, and the bytes they take.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::series::register;
use super::Metrics;

pub const SHARE_ACKS: &str = "antidote_share_acks_total";
pub const SHARE_WITHHELD: &str = "antidote_share_withheld_records_total";
pub const SHARE_RENEWALS: &str = "antidote_share_renewals_total";
pub const SHARE_RENEW_FALLBACKS: &str = "antidote_share_renew_fallbacks_total";
pub const SHARE_WITHHELD_RANGES: &str = "antidote_share_withheld_ranges";
pub const SHARE_WITHHELD_BYTES: &str = "antidote_share_withheld_bytes";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// What the proxy's share-group bookkeeping did for one request, one
/// answer or one renewal of its own: filled by the data path as it goes,
/// reported once (`Metrics::share_seen`, or inside a ShareFetch answer's
/// `Observation`). A count of 0 is not noted: most answers note nothing,
/// and allocate nothing.
#[derive(Debug, Default)]
pub struct ShareSeen {
    acks: Vec<(&'static str, u64)>,
    withheld: Vec<(&'static str, u64)>,
    renewals: Vec<(&'static str, u64)>,
    fallbacks: Vec<(&'static str, u64)>,
    kept: Option<(u64, usize, usize)>,
}

impl ShareSeen {
    /// `n` of the proxy's acknowledgements ended with `result` (`sent`,
    /// `refused`, `overflow`).
    pub fn acks(&mut self, result: &'static str, n: u64) {
        note(&mut self.acks, result, n);
    }

    /// `n` acquired records withheld from the member for `reason`.
    pub fn withheld(&mut self, reason: &'static str, n: u64) {
        note(&mut self.withheld, reason, n);
    }

    /// `n` withheld ranges ended with `result` in a renewal of the proxy's.
    pub fn renewals(&mut self, result: &'static str, n: u64) {
        note(&mut self.renewals, result, n);
    }

    /// `n` withheld ranges left to their locks for `reason`.
    pub fn fallback(&mut self, reason: &'static str, n: u64) {
        note(&mut self.fallbacks, reason, n);
    }

    /// The withheld book holds `ranges` ranges in `bytes` bytes now, as its
    /// `reading`th reading (readings are reported in any order; the latest
    /// wins).
    pub fn kept(&mut self, reading: u64, ranges: usize, bytes: usize) {
        self.kept = Some((reading, ranges, bytes));
    }
}

fn note(counts: &mut Vec<(&'static str, u64)>, label: &'static str, n: u64) {
    if n > 0 {
        counts.push((label, n));
    }
}

impl Metrics {
    /// Turn what share bookkeeping did into series.
    ///
    /// Call sites: a share request's (`proxy::exchange::share`), a
    /// ShareAcknowledge answer's, a renewal answer's
    /// (`intercept::share::renew::answered`), a connection's end
    /// (`proxy::relay`), and `Metrics::observe` for a ShareFetch answer's.
    pub fn share_seen(&self, seen: ShareSeen) {
        let s = &self.share;
        (seen.acks.into_iter()).for_each(|(r, n)| s.acks(r, n));
        (seen.withheld.into_iter()).for_each(|(r, n)| s.withheld(r, n));
        (seen.renewals.into_iter()).for_each(|(r, n)| s.renewals(r, n));
        (seen.fallbacks.into_iter()).for_each(|(r, n)| s.fallback(r, n));
        if let Some((reading, ranges, bytes)) = seen.kept {
            s.withheld_kept(reading, ranges, bytes);
        }
    }
}

/// The series of this module.
#[derive(Default)]
pub struct ShareMetrics {
    acks: Family<ResultLabel, Counter>,
    withheld: Family<ReasonLabel, Counter>,
    renewals: Family<ResultLabel, Counter>,
    fallbacks: Family<ReasonLabel, Counter>,
    kept_ranges: Gauge,
    kept_bytes: Gauge,
    /// The latest reading the two gauges show.
    kept_reading: std::sync::Mutex<u64>,
}

impl ShareMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        register(
            r,
            SHARE_ACKS,
            "The proxy's acknowledgements of records it removed from share consumers' responses for good, by result: sent (offsets), refused (partitions the broker refused), overflow (offsets not kept).",
            self.acks.clone(),
        );
        register(
            r,
            SHARE_WITHHELD,
            "Acquired records withheld from share consumers without an acknowledgement (delivered again when their locks expire), by reason.",
            self.withheld.clone(),
        );
        register(
            r,
            SHARE_RENEWALS,
            "Withheld ranges the proxy kept acquired in the member's share session (KIP-1222), by result: sent (renewed), released (released to be delivered and judged again), refused (the broker refused the renewal).",
            self.renewals.clone(),
        );
        register(
            r,
            SHARE_RENEW_FALLBACKS,
            "Withheld ranges left to their acquisition locks instead of renewed (each comes back on lock expiry, a delivery counted), by reason.",
            self.fallbacks.clone(),
        );
        register(
            r,
            SHARE_WITHHELD_RANGES,
            "Withheld ranges of share consumers kept for renewal now.",
            self.kept_ranges.clone(),
        );
        register(
            r,
            SHARE_WITHHELD_BYTES,
            "Bytes the withheld ranges kept for renewal take (share_groups.withheld_budget bounds them).",
            self.kept_bytes.clone(),
        );
    }

    pub(super) fn renewals(&self, result: &'static str, n: u64) {
        if n > 0 {
            self.renewals
                .get_or_create(&ResultLabel { result })
                .inc_by(n);
        }
    }

    pub(super) fn fallback(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.fallbacks
                .get_or_create(&ReasonLabel { reason })
                .inc_by(n);
        }
    }

    pub(super) fn withheld_kept(&self, reading: u64, ranges: usize, bytes: usize) {
        let mut shown = self.kept_reading.lock().unwrap_or_else(|p| p.into_inner());
        if reading <= *shown {
            return;
        }
        *shown = reading;
        self.kept_ranges
            .set(i64::try_from(ranges).unwrap_or(i64::MAX));
        self.kept_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub(super) fn acks(&self, result: &'static str, n: u64) {
        if n > 0 {
            self.acks.get_or_create(&ResultLabel { result }).inc_by(n);
        }
    }

    pub(super) fn withheld(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.withheld
                .get_or_create(&ReasonLabel { reason })
                .inc_by(n);
        }
    }
}
