//! The diversion circuit breaker (`breaker:` of a policy): when poison
//! turns systemic (a producer deploy breaks every record, a policy reloaded
//! too strict, a schema not registered yet), hold the partition instead of
//! draining it into its DLT.
//!
//! Per partition it keeps the diverted offsets among the last `over`
//! judged offsets. Offsets are counted once, however many consumer groups
//! read them (anything at or below the highest offset counted was counted
//! before), and records parked behind a blocked key (rule `key`) do not
//! count. The breaker trips inside a response, at the record whose
//! diversion would take the diverted share past `max_ratio` (with at least
//! `min_diverted` diverted): that record and everything after it are held,
//! exactly as when its DLT write fails; nothing more is written to the DLT.
//! While open, the partition holds at its first record that would be
//! diverted; valid records before it flow.
//!
//! It never closes because time passed (nothing new is judged while it
//! holds, so a rate would close it by itself and flap). It closes when the
//! held record is judged again and is valid (a registry that now knows its
//! schema, say), or at a policy reload: the held records are judged again
//! under the policies in force.
//!
//! Owns the per-partition windows; never writes anything itself.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tracing::warn;

use crate::dlt_record::{Diversion, RULE_KEY};
use crate::metrics;
use crate::plan::PartitionPlan;

/// One partition's window.
#[derive(Debug, Default)]
struct Window {
    /// Diverted offsets among the last `over` judged ones, with their rule.
    diverted: VecDeque<(i64, Arc<str>)>,
    /// The first and the highest offset counted (`None`: nothing yet).
    first: Option<i64>,
    high: Option<i64>,
    /// Where the partition is held while the breaker is open.
    open_at: Option<i64>,
}

impl Window {
    fn trim(&mut self, over: i64) {
        let Some(high) = self.high else { return };
        while self.diverted.front().is_some_and(|(o, _)| *o <= high - over) {
            self.diverted.pop_front();
        }
    }

    /// The rule most of the window's diversions failed.
    fn dominant_rule(&self) -> String {
        let mut n: HashMap<&str, usize> = HashMap::new();
        for (_, r) in &self.diverted {
            *n.entry(r).or_default() += 1;
        }
        n.into_iter()
            .max_by_key(|(_, c)| *c)
            .map_or_else(String::new, |(r, _)| r.to_string())
    }
}

/// Every partition's breaker.
#[derive(Debug, Default)]
pub struct Breakers {
    parts: Mutex<HashMap<(Arc<str>, i32), Window>>,
}

impl Breakers {
    /// Count what `plan` judged, and the offset from which its diversions
    /// must not be written because the breaker is open or trips here
    /// (`None`: write them all). `already(d)`: `d` is in its DLT already
    /// (a record read again), which is neither counted nor held.
    pub fn cut(&self, plan: &PartitionPlan, already: impl Fn(&Diversion) -> bool) -> Option<i64> {
        let cfg = plan.policy.breaker?;
        let over = i64::from(cfg.over);
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let w = parts
            .entry((plan.topic.clone(), plan.partition))
            .or_default();
        let mut new: Vec<&Diversion> = plan
            .diversions
            .iter()
            .filter(|d| d.invalid.rule != RULE_KEY && !already(d))
            .collect();
        new.sort_by_key(|d| d.origin_offset);
        if let Some(at) = w.open_at {
            let judged = plan.judged_to.is_some_and(|j| j >= at)
                && plan.judged_from.is_some_and(|f| f <= at);
            let held_before = plan.held.as_ref().is_some_and(|h| h.offset <= at);
            if !judged || held_before || new.iter().any(|d| d.origin_offset == at) {
                return new.first().map(|d| d.origin_offset);
            }
            // The held record was judged again and is valid: close, and
            // count afresh from it.
            *w = Window::default();
            metrics::global()
                .breaker
                .closed(&plan.topic, plan.partition, &plan.policy.name);
            warn!(topic = %plan.topic, partition = plan.partition, offset = at, policy = %plan.policy.name,
                "diversion circuit breaker closed: the held record is valid now");
        }
        if w.first.is_none() {
            w.first = plan
                .judged_from
                .or_else(|| new.first().map(|d| d.origin_offset));
        }
        let first = w.first.unwrap_or(0);
        for d in new {
            let o = d.origin_offset;
            if w.high.is_some_and(|h| o <= h) {
                continue; // counted when another reader fetched it
            }
            w.high = Some(o);
            w.trim(over);
            w.diverted.push_back((o, Arc::from(d.invalid.rule.as_str())));
            let n = w.diverted.len() as f64;
            let judged = (o - first + 1).clamp(1, over) as f64;
            if w.diverted.len() as u32 >= cfg.min_diverted && n / judged > cfg.max_ratio {
                w.diverted.pop_back();
                w.high = Some(o - 1);
                w.open_at = Some(o);
                metrics::global()
                    .breaker
                    .tripped(&plan.topic, plan.partition, &plan.policy.name);
                warn!(topic = %plan.topic, partition = plan.partition, offset = o, policy = %plan.policy.name,
                    diverted = w.diverted.len(), of = judged as i64, rule = %w.dominant_rule(),
                    "diversion circuit breaker open: the partition is held at this record instead of diverting it (closes when the record is valid again or policies are reloaded)");
                return Some(o);
            }
        }
        if let Some(j) = plan.judged_to {
            if w.high.is_none_or(|h| j > h) {
                w.high = Some(j);
                w.trim(over);
            }
        }
        None
    }

    /// Policies were reloaded: every breaker closes, and its held records
    /// are judged again under the policies in force.
    pub fn reset(&self) {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        for ((topic, partition), w) in parts.drain() {
            if w.open_at.is_some() {
                // The policy label is not known here: the gauge is reset
                // under every policy name it was set with when it trips
                // again; closing by reload logs instead.
                warn!(%topic, partition, "diversion circuit breaker closed by a policy reload");
            }
        }
        metrics::global().breaker.close_all();
    }
}
