//! `max_age` rules: a field holding an event time (in `unit`s since the
//! epoch) must be at most `max_age` old; older is class `stale`. Judged
//! after every other rule.

use super::{finite, number_at, Doc, Pointer};
use crate::policy::{Class, Invalid};

/// Time units of a `max_age` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TimeUnit {
    S,
    Ms,
    Us,
    Ns,
}

impl TimeUnit {
    pub(crate) fn to_ms(self, t: f64) -> f64 {
        match self {
            TimeUnit::S => t * 1000.0,
            TimeUnit::Ms => t,
            TimeUnit::Us => t / 1000.0,
            TimeUnit::Ns => t / 1_000_000.0,
        }
    }
}

/// A `max_age` rule: judged after everything else.
#[derive(Debug)]
pub(crate) struct MaxAge {
    pub(crate) id: String,
    pub(crate) ptr: Pointer,
    pub(crate) max_age_ms: f64,
    /// The duration as written, for messages (`15m`).
    pub(crate) written: String,
    pub(crate) unit: TimeUnit,
}

impl MaxAge {
    pub(crate) fn new(ptr: Pointer, max_age_ms: f64, written: String, unit: TimeUnit) -> Self {
        MaxAge {
            id: format!("max_age:{}", ptr.as_str()),
            ptr,
            max_age_ms,
            written,
            unit,
        }
    }

    /// Whether [`Self::check`] is `Ok`: the same comparison, negated (so
    /// an age that is not a number fails neither).
    #[inline]
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub(crate) fn holds<D: Doc + ?Sized>(&self, v: &D, now_ms: i64) -> bool {
        finite(v.field(&self.ptr))
            .is_some_and(|t| !(now_ms as f64 - self.unit.to_ms(t) > self.max_age_ms))
    }

    /// Poison when the field is missing or not a number; stale when too old.
    pub(crate) fn check<D: Doc + ?Sized>(&self, v: &D, now_ms: i64) -> Result<(), Invalid> {
        let t = number_at(&self.ptr, v).map_err(|r| Invalid::poison(&self.id, r))?;
        let t_ms = self.unit.to_ms(t);
        let age_ms = now_ms as f64 - t_ms;
        if age_ms > self.max_age_ms {
            return Err(Invalid {
                class: Class::Stale,
                rule: self.id.clone(),
                reason: format!(
                    "{}: event is {} old, older than max_age {}",
                    self.ptr.as_str(),
                    human_ms(age_ms),
                    self.written
                ),
                contract: None,
            });
        }
        Ok(())
    }
}

/// `93.5s`, `16m 40s`, `2h 5m`, `3d 1h`.
pub(super) fn human_ms(ms: f64) -> String {
    let s = (ms / 1000.0).max(0.0);
    if s < 60.0 {
        return format!("{:.1}s", s);
    }
    let total = s as u64;
    let (d, h, m, sec) = (
        total / 86400,
        total / 3600 % 24,
        total / 60 % 60,
        total % 60,
    );
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else {
        format!("{m}m {sec}s")
    }
}
