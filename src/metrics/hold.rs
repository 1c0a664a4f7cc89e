//! How long antidote holds a Fetch response it diverts from, split by
//! cause: its own work (decoding, judging, splicing) and the wait for the
//! dead-letter topic to acknowledge the diversions, which the no-loss
//! guarantee requires. Issue 30's target for rewritten responses is on the
//! first part ("≤ 2 ms plus the DLT round trip"); the relay histogram
//! (`antidote_response_relay_duration_seconds`) shows only their sum.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::series::{register, relay_histogram, LatencyCtor};

pub const FETCH_HOLD_SECONDS: &str = "antidote_fetch_diverting_hold_seconds";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PartLabel {
    part: &'static str,
}

/// The series of this module.
pub struct HoldMetrics {
    seconds: Family<PartLabel, Histogram, LatencyCtor>,
}

impl Default for HoldMetrics {
    fn default() -> Self {
        HoldMetrics {
            seconds: Family::new_with_constructor(relay_histogram as LatencyCtor),
        }
    }
}

impl HoldMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        register(
            r,
            FETCH_HOLD_SECONDS,
            "Time a Fetch response with diversions was held by the proxy, by part: proxy (decoding, judging, splicing) and dlt (waiting for the dead-letter topic to acknowledge its diversions).",
            self.seconds.clone(),
        );
    }

    /// A Fetch response with diversions was held `total`, of which `dlt`
    /// waiting for their acknowledgements.
    ///
    /// Call site: `intercept::fetch::FetchFilter::filter`, around its
    /// diversions.
    pub fn diverting_response(&self, total: Duration, dlt: Duration) {
        for (part, d) in [("proxy", total.saturating_sub(dlt)), ("dlt", dlt)] {
            self.seconds
                .get_or_create(&PartLabel { part })
                .observe(d.as_secs_f64());
        }
    }
}
