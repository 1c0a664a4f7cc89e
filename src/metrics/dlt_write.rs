//! What one dead-letter write of one DLT partition came to, as the writer
//! saw it: the writer fills one [`DltWriteSeen`] while it takes the
//! partition's lease, reads the partition to its end and produces to it,
//! and hands it over once ([`Metrics::dlt_written`]); turning it into
//! series (`antidote_dlt_writes_total`, `antidote_dlt_write_duration_seconds`,
//! `antidote_dlt_diversions_total`) is this module's job, not the writer's.

use std::time::Duration;

use super::series::ResultLabel;
use super::Metrics;

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
        self.fleet_written(seen.written);
        self.fleet_found_at_write(seen.found_at_write);
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
