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

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::series::register;

pub const SHARE_ACKS: &str = "antidote_share_acks_total";
pub const SHARE_WITHHELD: &str = "antidote_share_withheld_records_total";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The series of this module.
#[derive(Default)]
pub struct ShareMetrics {
    acks: Family<ResultLabel, Counter>,
    withheld: Family<ReasonLabel, Counter>,
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
    }

    /// `n` of the proxy's acknowledgements ended with `result`.
    ///
    /// Call site: `intercept::share::wire`.
    pub fn acks(&self, result: &'static str, n: u64) {
        if n > 0 {
            self.acks.get_or_create(&ResultLabel { result }).inc_by(n);
        }
    }

    /// `n` acquired records withheld for `reason`.
    ///
    /// Call site: `intercept::fetch::share`.
    pub fn withheld(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.withheld
                .get_or_create(&ReasonLabel { reason })
                .inc_by(n);
        }
    }
}
