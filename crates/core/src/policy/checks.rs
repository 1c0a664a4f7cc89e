//! The field rules and `max_age` rules compiled against the captured
//! layout (issue 30): one flat check per rule, reading capture slots
//! directly, asked for every record whose values were captured (JSON,
//! Avro and Protobuf fast paths). A check answers pass or fail only,
//! exactly as the rule's own `holds` does; a record that fails is
//! explained by the rules themselves (`Rule::check`, `MaxAge::check`),
//! the one place a reason is worded.
//!
//! What this saves over asking each rule: bounds kept as `f64` (±∞ for
//! a missing one) instead of `Option`s, a coordinates rule's ranges and
//! bounding box folded into one box, `one_of` over strings compared as
//! bytes without matching a `serde_json::Value` per allowed value, and
//! the captures' slots found once per record instead of once per field.

use super::json::Captures;
use super::rules::{MaxAge, Rule, TimeUnit};
use super::shape::same_bytes;

/// A policy's rules, compiled at load.
#[derive(Debug)]
pub(crate) struct Checks(Box<[Check]>);

#[derive(Debug)]
enum Check {
    /// A finite number in `[lo, hi]` (±∞ for a bound the rule does not
    /// set); missing or null passes when `optional`.
    Range {
        slot: usize,
        lo: f64,
        hi: f64,
        optional: bool,
    },
    /// Both finite, inside `[min_lat, min_lon, max_lat, max_lon]` (the
    /// bounding box within ±90, ±180), and not both zero when
    /// `null_island` is rejected.
    Coordinates {
        lat: usize,
        lon: usize,
        within: [f64; 4],
        null_island: bool,
    },
    /// A string among `allowed` (every allowed value is a string);
    /// missing or null passes when `optional`.
    Text {
        slot: usize,
        optional: bool,
        allowed: Box<[Box<[u8]>]>,
    },
    /// Missing or null.
    Absent { slot: usize },
    /// A finite time no older than `max_age_ms` at judging time.
    Fresh {
        slot: usize,
        unit: TimeUnit,
        max_age_ms: f64,
    },
    /// Any other rule (`one_of` over values that are not all strings),
    /// asked as it is: `rules[i]`.
    Rule(usize),
}

impl Checks {
    pub(crate) fn new(rules: &[Rule], stale: &[MaxAge]) -> Checks {
        let mut checks: Vec<Check> = rules.iter().enumerate().map(compile).collect();
        checks.extend(stale.iter().map(|s| Check::Fresh {
            slot: s.ptr.slot(),
            unit: s.unit,
            max_age_ms: s.max_age_ms,
        }));
        Checks(checks.into_boxed_slice())
    }

    /// Whether every rule holds for `caps`: what `Rule::holds` and
    /// `MaxAge::holds` answer, all of them (their comparisons, negated as
    /// theirs are, so that an age that is not a number fails neither).
    #[inline]
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub(crate) fn hold(&self, caps: &Captures<'_>, rules: &[Rule], now_ms: i64) -> bool {
        let fields = caps.fields();
        self.0.iter().all(|c| match c {
            Check::Range {
                slot,
                lo,
                hi,
                optional,
            } => match fields.number(*slot) {
                Some(x) => !(x < *lo || x > *hi),
                None => *optional && fields.missing_or_null(*slot),
            },
            Check::Coordinates {
                lat,
                lon,
                within: [min_lat, min_lon, max_lat, max_lon],
                null_island,
            } => {
                let (Some(lat), Some(lon)) = (fields.number(*lat), fields.number(*lon)) else {
                    return false;
                };
                !(lat < *min_lat || lat > *max_lat || lon < *min_lon || lon > *max_lon)
                    && !(*null_island && lat == 0.0 && lon == 0.0)
            }
            Check::Text {
                slot,
                optional,
                allowed,
            } => match fields.text(*slot) {
                Some(s) => allowed.iter().any(|a| same_bytes(a, s)),
                None => *optional && fields.missing_or_null(*slot),
            },
            Check::Absent { slot } => fields.missing_or_null(*slot),
            Check::Fresh {
                slot,
                unit,
                max_age_ms,
            } => fields
                .number(*slot)
                .is_some_and(|t| !(now_ms as f64 - unit.to_ms(t) > *max_age_ms)),
            Check::Rule(i) => rules.get(*i).is_some_and(|r| r.holds(caps)),
        })
    }
}

/// The check of rule `i`.
fn compile((i, rule): (usize, &Rule)) -> Check {
    match rule {
        Rule::Range {
            ptr,
            optional,
            min,
            max,
            ..
        } => Check::Range {
            slot: ptr.slot(),
            // A NaN bound never fails a number (`x < NaN` is false), as
            // no bound.
            lo: min.unwrap_or(f64::NEG_INFINITY),
            hi: max.unwrap_or(f64::INFINITY),
            optional: *optional,
        },
        Rule::Coordinates(c) => {
            let [min_lat, min_lon, max_lat, max_lon] =
                c.bbox.unwrap_or([-90.0, -180.0, 90.0, 180.0]);
            Check::Coordinates {
                lat: c.lat.slot(),
                lon: c.lon.slot(),
                // `f64::max` and `min` ignore a NaN side, as a NaN bound
                // is no constraint to the rule.
                within: [
                    min_lat.max(-90.0),
                    min_lon.max(-180.0),
                    max_lat.min(90.0),
                    max_lon.min(180.0),
                ],
                null_island: c.reject_null_island,
            }
        }
        Rule::OneOf {
            ptr,
            optional,
            allowed,
            ..
        } => {
            let text: Option<Box<[Box<[u8]>]>> = allowed
                .iter()
                .map(|v| v.as_str().map(|s| s.as_bytes().into()))
                .collect();
            match text {
                Some(allowed) => Check::Text {
                    slot: ptr.slot(),
                    optional: *optional,
                    allowed,
                },
                None => Check::Rule(i),
            }
        }
        Rule::Absent { ptr, .. } => Check::Absent { slot: ptr.slot() },
    }
}

#[cfg(test)]
mod tests;
