//! Marker records: the few records antidote writes into a dead-letter topic
//! that are not diverted records. They keep the state of per-key ordering
//! and re-drive in Kafka, so that a restart, or another instance, reads the
//! same state back from the DLTs:
//!
//! - `release` (written by `dlt replay` after it wrote a blocked key's
//!   records back) and `discard` (`dlt discard`): every diverted record of
//!   key K of origin partition P up to origin offset `through` is home or
//!   given up; K is released if nothing newer of it was diverted.
//! - `attempt` (the re-drive loop): DLT record C was re-validated for the
//!   N-th time, with this outcome.
//! - `breaker-open` / `breaker-close` (the diversion circuit breaker): the
//!   breaker of origin partition P opened at origin offset `through` (an
//!   instance tripped), or closed (an operator's `antidote breaker close`;
//!   with `--divert-through`, diversions up to that offset are accepted).
//!   Every instance follows them, so a fleet holds the same partitions.
//! - `lease` (the DLT writer): a writer took the DLT partition's producer
//!   lease with a new epoch; the marker makes the partition refuse older
//!   epochs' writes (`dlt::writer::lease` in the proxy). It says nothing
//!   else and is parsed as no marker ([`Marker::parse`] gives `None`).
//!
//! A marker never carries `x-original-offset`, so the ledger (which counts
//! DLT records naming an origin) never takes one for a diversion. Owns the
//! header names and their parsing; must never accept a marker with a
//! missing or malformed field (it is ignored instead).

use bytes::Bytes;

use crate::dlt_context::{Context, Seal};
use crate::kafka::builder::NewRecord;

/// `release`, `discard` or `attempt`: what kind of marker this record is.
pub const H_MARKER: &str = "x-antidote-marker";
pub const H_MARKER_TOPIC: &str = "x-marker-topic";
pub const H_MARKER_PARTITION: &str = "x-marker-partition";
/// Release/discard: the highest origin offset released.
pub const H_MARKER_THROUGH: &str = "x-marker-through";
/// Attempt: `<dlt-topic>/<partition>/<offset>` of the DLT record re-driven.
pub const H_MARKER_OF: &str = "x-marker-of";
/// Attempt: which attempt this was (1 after the first delay).
pub const H_MARKER_ATTEMPT: &str = "x-marker-attempt";
/// Attempt: `redriven` or `still-invalid`, and why.
pub const H_MARKER_OUTCOME: &str = "x-marker-outcome";
pub const H_MARKER_REASON: &str = "x-marker-reason";

/// What a release marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub topic: String,
    pub partition: i32,
    pub key: Bytes,
    pub through: i64,
    /// Written by `dlt discard` (the records were given up, not replayed).
    pub discard: bool,
}

/// What a breaker marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerMark {
    pub topic: String,
    pub partition: i32,
    /// `breaker-open` (true) or `breaker-close`.
    pub open: bool,
    /// Open: the origin offset held. Close: the offset it closes at, or
    /// through which diversions are accepted (`--divert-through`).
    pub through: i64,
    /// Close: diversions up to `through` are accepted (re-armed after).
    pub divert: bool,
}

/// What an attempt marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The DLT coordinate of the record re-driven.
    pub of: String,
    pub attempt: u32,
    pub redriven: bool,
    pub reason: String,
}

/// A marker record, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    Release(Release),
    Attempt(Attempt),
    Breaker(BreakerMark),
}

/// Whether a record's context makes it a marker (of any kind, well-formed
/// or not).
pub fn is_marker(ctx: &Context<'_>) -> bool {
    ctx.get(H_MARKER).is_some()
}

impl Marker {
    /// The marker a record's context carries (`key` is the record's key),
    /// if it is a well-formed one.
    pub fn parse(ctx: &Context<'_>, key: Option<&[u8]>) -> Option<Marker> {
        let num = |k| ctx.num(k);
        let text = |k| ctx.text(k);
        match text(H_MARKER)? {
            kind @ ("release" | "discard") => Some(Marker::Release(Release {
                topic: text(H_MARKER_TOPIC)?.to_string(),
                partition: i32::try_from(num(H_MARKER_PARTITION)?).ok()?,
                key: Bytes::copy_from_slice(key?),
                through: num(H_MARKER_THROUGH)?,
                discard: kind == "discard",
            })),
            kind @ ("breaker-open" | "breaker-close" | "breaker-divert") => {
                Some(Marker::Breaker(BreakerMark {
                    topic: text(H_MARKER_TOPIC)?.to_string(),
                    partition: i32::try_from(num(H_MARKER_PARTITION)?).ok()?,
                    open: kind == "breaker-open",
                    through: num(H_MARKER_THROUGH)?,
                    divert: kind == "breaker-divert",
                }))
            }
            "attempt" => Some(Marker::Attempt(Attempt {
                of: text(H_MARKER_OF)?.to_string(),
                attempt: u32::try_from(num(H_MARKER_ATTEMPT)?).ok()?,
                redriven: text(H_MARKER_OUTCOME)? == "redriven",
                reason: text(H_MARKER_REASON).unwrap_or_default().to_string(),
            })),
            _ => None,
        }
    }

    /// The record written to the DLT, framed for where `seal` says.
    pub fn to_record(&self, now_ms: i64, seal: &Seal<'_>) -> NewRecord {
        let h = |k: &str, v: String| (k.to_string(), Some(Bytes::from(v)));
        let (key, headers) = match self {
            Marker::Release(r) => (
                Some(r.key.clone()),
                vec![
                    h(
                        H_MARKER,
                        if r.discard { "discard" } else { "release" }.into(),
                    ),
                    h(H_MARKER_TOPIC, r.topic.clone()),
                    h(H_MARKER_PARTITION, r.partition.to_string()),
                    h(H_MARKER_THROUGH, r.through.to_string()),
                ],
            ),
            Marker::Breaker(b) => (
                None,
                vec![
                    h(
                        H_MARKER,
                        match (b.open, b.divert) {
                            (true, _) => "breaker-open",
                            (false, false) => "breaker-close",
                            (false, true) => "breaker-divert",
                        }
                        .into(),
                    ),
                    h(H_MARKER_TOPIC, b.topic.clone()),
                    h(H_MARKER_PARTITION, b.partition.to_string()),
                    h(H_MARKER_THROUGH, b.through.to_string()),
                ],
            ),
            Marker::Attempt(a) => (
                None,
                vec![
                    h(H_MARKER, "attempt".into()),
                    h(H_MARKER_OF, a.of.clone()),
                    h(H_MARKER_ATTEMPT, a.attempt.to_string()),
                    h(
                        H_MARKER_OUTCOME,
                        if a.redriven {
                            "redriven"
                        } else {
                            "still-invalid"
                        }
                        .into(),
                    ),
                    h(
                        H_MARKER_REASON,
                        crate::dlt_record::bound_reason(&a.reason).into_owned(),
                    ),
                ],
            ),
        };
        seal.frame(now_ms, key, None, Vec::new(), headers)
    }
}

/// The lease marker: no key, no value, one context header.
pub fn lease_record(now_ms: i64, seal: &Seal<'_>) -> NewRecord {
    seal.frame(
        now_ms,
        None,
        None,
        Vec::new(),
        vec![(H_MARKER.to_string(), Some(Bytes::from_static(b"lease")))],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlt_context::{open, Keys};
    use crate::kafka::record::Record;

    fn view(n: &NewRecord) -> Record<'_> {
        n.as_record()
    }

    #[test]
    fn markers_round_trip_and_malformed_ones_are_ignored() {
        let rel = Marker::Release(Release {
            topic: "geo".into(),
            partition: 2,
            key: Bytes::from_static(b"dev-1"),
            through: 41,
            discard: true,
        });
        let att = Marker::Attempt(Attempt {
            of: "geo.dlt/0/7".into(),
            attempt: 2,
            redriven: false,
            reason: "schema id 9".into(),
        });
        let keys = Keys::none();
        let seal = Seal::new(&keys, "geo.dlt", 0);
        let ctx = |n: &NewRecord| -> (Option<Marker>, bool) {
            let r = view(n);
            let c = open(&r, "geo.dlt", 0, &keys).unwrap();
            (Marker::parse(&c, r.key), is_marker(&c))
        };
        let brk = Marker::Breaker(BreakerMark {
            topic: "geo".into(),
            partition: 1,
            open: false,
            through: 99,
            divert: true,
        });
        for m in [rel, att, brk] {
            let rec = m.to_record(5, &seal);
            assert_eq!(ctx(&rec), (Some(m), true));
        }
        let mut bad = Marker::Release(Release {
            topic: "geo".into(),
            partition: 2,
            key: Bytes::new(),
            through: 1,
            discard: false,
        })
        .to_record(0, &seal);
        bad.headers.retain(|(k, _)| k != H_MARKER_THROUGH);
        let n = bad.headers.len();
        bad.headers[n - 1].1 = Some(Bytes::from(format!("2 {}", n - 1)));
        assert_eq!(ctx(&bad), (None, true));
        let lease = lease_record(5, &seal);
        assert_eq!(ctx(&lease), (None, true));
    }
}
