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
//! schema, say), at a policy reload (the held records are judged again
//! under the policies in force), or by an operator's close marker
//! (`antidote breaker close`), which may accept the diversions up to an
//! offset (`--divert-through`) and re-arm after it.
//!
//! A fleet holds the same partitions: an instance that trips owes an open
//! marker, which the DLT follower (`dlt::follower`) writes to the
//! policy's DLT; every instance's follower reads open and close markers
//! back and applies them here. A marker's effect is bound to the partition
//! and offset it names: an open marker at or below the partition's last
//! close is ignored, so a copy appended again changes nothing.
//!
//! Owns the per-partition windows and the markers owed; writes nothing
//! itself.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tracing::warn;

use crate::dlt_marker::BreakerMark;
use crate::dlt_record::{Diversion, RULE_KEY};
use crate::metrics;
use crate::plan::PartitionPlan;
use crate::policy::PolicySet;

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
    /// The highest offset a close named: open markers at or below it are
    /// spent.
    closed_through: Option<i64>,
    /// Diversions up to this offset are accepted, uncounted
    /// (`--divert-through`).
    accept_through: Option<i64>,
}

impl Window {
    fn trim(&mut self, over: i64) {
        let Some(high) = self.high else { return };
        while self
            .diverted
            .front()
            .is_some_and(|(o, _)| *o <= high - over)
        {
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
    /// Open markers owed to the DLTs (tripped here, not written yet).
    outbox: Mutex<Vec<BreakerMark>>,
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
        let accepted = w.accept_through;
        let mut new: Vec<&Diversion> = plan
            .diversions
            .iter()
            .filter(|d| d.invalid.rule != RULE_KEY && !already(d))
            .filter(|d| accepted.is_none_or(|a| d.origin_offset > a))
            .collect();
        new.sort_by_key(|d| d.origin_offset);
        if let Some(at) = w.open_at {
            let judged = plan.judged_to.is_some_and(|j| j >= at)
                && plan.judged_from.is_some_and(|f| f <= at);
            // The partition moved past the held record (another instance
            // closed and delivered it): this hold is stale.
            let past = plan.judged_from.is_some_and(|f| f > at);
            let held_before = plan.held.as_ref().is_some_and(|h| h.offset <= at);
            if !past && (!judged || held_before || new.iter().any(|d| d.origin_offset == at)) {
                return new.first().map(|d| d.origin_offset);
            }
            // The held record was judged again and is valid: close, and
            // count afresh from it.
            *w = Window {
                closed_through: Some(at),
                ..Window::default()
            };
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
            w.diverted
                .push_back((o, Arc::from(d.invalid.rule.as_str())));
            let n = w.diverted.len() as f64;
            let judged = (o - first + 1).clamp(1, over) as f64;
            if w.diverted.len() as u32 >= cfg.min_diverted && n / judged > cfg.max_ratio {
                w.diverted.pop_back();
                w.high = Some(o - 1);
                w.open_at = Some(o);
                self.tripped(plan, w, o, judged as i64);
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

    /// `plan`'s partition tripped at `o` (of `judged` records): counted,
    /// its open marker owed to its DLT, said.
    fn tripped(&self, plan: &PartitionPlan, w: &Window, o: i64, judged: i64) {
        metrics::global()
            .breaker
            .tripped(&plan.topic, plan.partition, &plan.policy.name);
        self.owe(BreakerMark {
            topic: plan.topic.to_string(),
            partition: plan.partition,
            open: true,
            through: o,
            divert: false,
        });
        warn!(topic = %plan.topic, partition = plan.partition, offset = o, policy = %plan.policy.name,
            diverted = w.diverted.len(), of = judged, rule = %w.dominant_rule(),
            "diversion circuit breaker open: the partition is held at this record instead of diverting it (closes when the record is valid again or policies are reloaded)");
    }

    /// The partitions held by their breaker now, and the offset each is
    /// held at (the console).
    pub fn open_now(&self) -> Vec<(String, i32, i64)> {
        let parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = parts
            .iter()
            .filter_map(|((t, p), w)| w.open_at.map(|at| (t.to_string(), *p, at)))
            .collect();
        out.sort();
        out
    }

    /// Markers owed to the DLTs, taken for writing.
    pub fn take_outbox(&self) -> Vec<BreakerMark> {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Owe `m` to the DLT (again, when a write failed).
    pub fn owe(&self, m: BreakerMark) {
        self.outbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(m);
    }

    /// A breaker marker read back from `policy`'s DLT (this instance's, or
    /// another's, or an operator's).
    pub fn apply(&self, m: &BreakerMark, policy: &str) {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let w = parts
            .entry((Arc::from(m.topic.as_str()), m.partition))
            .or_default();
        if m.open {
            if w.open_at.is_none() && w.closed_through.is_none_or(|c| m.through > c) {
                w.open_at = Some(m.through);
                metrics::global()
                    .breaker
                    .opened(&m.topic, m.partition, policy);
                warn!(topic = %m.topic, partition = m.partition, offset = m.through, policy,
                    "diversion circuit breaker open (marker in the DLT): the partition is held");
            }
            return;
        }
        // A close names the offset it closes at, or (divert) the offset
        // through which diversions are accepted: it closes an open breaker
        // at or below it, and is spent for later opens at or below it.
        if w.open_at.is_some_and(|at| at <= m.through) || m.divert {
            let was_open = w.open_at.is_some();
            *w = Window {
                closed_through: Some(m.through.max(w.closed_through.unwrap_or(i64::MIN))),
                accept_through: m.divert.then_some(m.through),
                high: m.divert.then_some(m.through),
                first: m.divert.then_some(m.through + 1),
                ..Window::default()
            };
            if was_open {
                metrics::global()
                    .breaker
                    .closed(&m.topic, m.partition, policy);
                warn!(topic = %m.topic, partition = m.partition, through = m.through, divert = m.divert, policy,
                    "diversion circuit breaker closed by an operator's marker");
            }
        }
    }

    /// Policies were reloaded: the breaker of every partition whose policy
    /// changed (or went) closes, and its held records are judged again
    /// under the policies in force; the others stay as they are.
    pub fn reset(&self, old: &PolicySet, new: &PolicySet) {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        for ((topic, partition), w) in parts.iter_mut() {
            let same = match (old.for_topic(topic), new.for_topic(topic)) {
                (Some(o), Some(n)) => o.name == n.name && o.revision == n.revision,
                _ => false,
            };
            if same {
                continue;
            }
            if let Some(at) = w.open_at {
                warn!(%topic, partition, offset = at, "diversion circuit breaker closed by a policy reload");
            }
            // Spent: an open marker at or below here (this trip's, read
            // back later) opens nothing.
            let spent = w.open_at.or(w.high);
            *w = Window {
                closed_through: spent.max(w.closed_through),
                ..Window::default()
            };
        }
        metrics::global().breaker.close_all();
    }
}
