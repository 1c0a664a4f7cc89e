//! Numeric bounds of a shape (`minimum`, `maximum` and their exclusive
//! forms): converted once at load, compared exactly with a value as the
//! parser saw it (integer or float), or left to the full validator when
//! an exact answer would cost more.

use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::Seen;

/// The orderings a bound allows, one bit each.
pub(super) const LT: u8 = 1;
pub(super) const EQ: u8 = 2;
pub(super) const GT: u8 = 4;

#[inline]
pub(super) fn order_bit(o: Ordering) -> u8 {
    match o {
        Ordering::Less => LT,
        Ordering::Equal => EQ,
        Ordering::Greater => GT,
    }
}

/// Integers up to this size are floats exactly.
pub(super) const EXACT: i128 = 1 << 53;

/// A numeric bound, converted once at load.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limit {
    /// The limit, when it is an integer (i64 or u64).
    pub(super) whole: Option<i128>,
    /// The limit as a float (what `Number::as_f64` gives).
    pub(super) float: Option<f64>,
    /// `float` when a float compares with it exactly: the limit is a float,
    /// or an integer of at most 2^53.
    pub(super) exact_float: Option<f64>,
}

impl Limit {
    fn of(n: &Number) -> Limit {
        let whole = n.as_i64().map(i128::from).or(n.as_u64().map(i128::from));
        let float = n.as_f64();
        Limit {
            whole,
            float,
            exact_float: float.filter(|_| whole.is_none_or(|b| b.abs() <= EXACT)),
        }
    }
}

/// `v` compared with `limit`, when it can be decided exactly.
#[inline]
pub(super) fn compare(v: Seen<'_>, limit: &Limit) -> Option<Ordering> {
    // A float against a limit it compares with exactly (converted at load:
    // no i128 per value, which was 1 % of a judged record's CPU).
    if let Seen::F64(f) = v {
        return f.partial_cmp(&limit.exact_float?);
    }
    let whole = match v {
        Seen::I64(i) => Some(i128::from(i)),
        Seen::U64(u) => Some(i128::from(u)),
        _ => None,
    };
    match (whole, limit.whole) {
        (Some(a), Some(b)) => Some(a.cmp(&b)),
        (Some(a), None) if a.abs() <= EXACT => (a as f64).partial_cmp(&limit.float?),
        _ => None,
    }
}

pub(super) fn number(v: &Value) -> Option<Limit> {
    match v {
        Value::Number(n) => Some(Limit::of(n)),
        _ => None,
    }
}
