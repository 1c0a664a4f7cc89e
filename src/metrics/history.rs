//! What the admin console shows beyond the counters: the last hour of
//! diversions per minute, per topic and class (the overview's chart), and
//! why each held partition was last held.
//!
//! Bounded whatever the number of topics: at most [`MAX_SERIES`] (topic,
//! class) series of [`MINUTES`] per-minute counts each (8 bytes a minute,
//! ~96 KiB in all plus the topic names); the diversions of series beyond
//! the cap are added to one `other` row per class, so the chart's total
//! still matches the counters. A series with nothing in the last hour is
//! dropped at the next minute's turn, which frees its place. Hold reasons
//! are kept for held partitions only (a partition's entry goes when it is
//! released), which the held-partitions gauge bounds the same way.
//!
//! Recording takes one mutex (uncontended in practice: diversions are
//! rare, and each is already a DLT write); it never does I/O.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Minutes of history.
pub const MINUTES: usize = 60;
/// (topic, class) series kept at most; the rest go to `other`.
pub const MAX_SERIES: usize = 200;

type Counts = Box<[u64; MINUTES]>;

fn zeros() -> Counts {
    Box::new([0; MINUTES])
}

/// Per-minute diversion counts of the last hour.
#[derive(Default)]
struct Ring {
    /// The minute (since the epoch) the newest slot holds.
    minute: i64,
    /// topic -> (class, counts), slot `minute % MINUTES`.
    series: HashMap<Box<str>, Vec<(&'static str, Counts)>>,
    count: usize,
    /// class -> counts of the series over the cap.
    other: Vec<(&'static str, Counts)>,
}

fn slot(minute: i64) -> usize {
    minute.rem_euclid(MINUTES as i64) as usize
}

impl Ring {
    /// Move the newest slot to `minute`, zeroing the minutes skipped, and
    /// drop the series left empty.
    fn turn(&mut self, minute: i64) {
        if minute <= self.minute {
            return;
        }
        let skipped = (minute - self.minute).min(MINUTES as i64);
        let clear = |c: &mut Counts| {
            for m in 0..skipped {
                c[slot(minute - m)] = 0;
            }
        };
        for v in self.series.values_mut() {
            v.iter_mut().for_each(|(_, c)| clear(c));
            v.retain(|(_, c)| c.iter().any(|n| *n > 0));
        }
        self.series.retain(|_, v| !v.is_empty());
        self.count = self.series.values().map(Vec::len).sum();
        self.other.iter_mut().for_each(|(_, c)| clear(c));
        self.other.retain(|(_, c)| c.iter().any(|n| *n > 0));
        self.minute = minute;
    }

    fn add(&mut self, topic: &str, class: &'static str, n: u64, minute: i64) {
        self.turn(minute);
        if minute < self.minute - (MINUTES as i64 - 1) {
            return; // older than the hour (a clock step back)
        }
        let s = slot(minute);
        if let Some(v) = self.series.get_mut(topic) {
            if let Some((_, c)) = v.iter_mut().find(|(k, _)| *k == class) {
                c[s] += n;
                return;
            }
        }
        let counts = if self.count < MAX_SERIES {
            self.count += 1;
            let v = self.series.entry(topic.into()).or_default();
            v.push((class, zeros()));
            v.last_mut().map(|(_, c)| c)
        } else {
            if !self.other.iter().any(|(k, _)| *k == class) {
                self.other.push((class, zeros()));
            }
            self.other
                .iter_mut()
                .find(|(k, _)| *k == class)
                .map(|(_, c)| c)
        };
        if let Some(c) = counts {
            c[s] += n;
        }
    }
}

/// One series of a snapshot: counts oldest minute first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// `None`: the `other` row (series over the cap).
    pub topic: Option<String>,
    pub class: &'static str,
    pub counts: Vec<u64>,
}

/// The last hour as the console draws it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Start of the oldest minute, ms since the epoch.
    pub first_minute_ms: i64,
    pub series: Vec<Series>,
}

/// The console's history: the diversion ring and the hold reasons.
#[derive(Default)]
pub struct History {
    ring: Mutex<Ring>,
    holds: Mutex<HashMap<(Box<str>, i32), Hold>>,
}

/// Why a partition is held, as last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    /// The last batch-level reason noted since its last release
    /// (`undecodable`, `legacy`, `budget`, `transient`, `breaker`).
    noted: Option<&'static str>,
    held: bool,
}

impl History {
    /// `n` diversions of `topic` of `class` acknowledged at `now_ms`.
    pub fn diverted(&self, topic: &str, class: &'static str, n: u64, now_ms: i64) {
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        r.add(topic, class, n, now_ms.div_euclid(60_000));
    }

    /// The last hour up to `now_ms`, series by topic then class.
    pub fn snapshot(&self, now_ms: i64) -> Snapshot {
        let minute = now_ms.div_euclid(60_000);
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        r.turn(minute);
        let first = minute - (MINUTES as i64 - 1);
        let ordered = |c: &Counts| (first..=minute).map(|m| c[slot(m)]).collect::<Vec<_>>();
        let mut series: Vec<Series> = r
            .series
            .iter()
            .flat_map(|(t, v)| {
                v.iter().map(|(class, c)| Series {
                    topic: Some(t.to_string()),
                    class,
                    counts: ordered(c),
                })
            })
            .collect();
        series.sort_by(|a, b| (&a.topic, a.class).cmp(&(&b.topic, b.class)));
        series.extend(r.other.iter().map(|(class, c)| Series {
            topic: None,
            class,
            counts: ordered(c),
        }));
        Snapshot {
            first_minute_ms: first * 60_000,
            series,
        }
    }

    /// A batch of `topic`/`partition` was held for `reason`.
    pub fn note_hold(&self, topic: &str, partition: i32, reason: &'static str) {
        let mut h = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        let e = h.entry((topic.into(), partition)).or_insert(Hold {
            noted: None,
            held: false,
        });
        e.noted = Some(reason);
    }

    /// The partition's response was held (or not). A hold with no reason
    /// noted is a diversion the DLT has not acknowledged.
    pub fn set_held(&self, topic: &str, partition: i32, held: bool) {
        let mut h = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        if held {
            h.entry((topic.into(), partition))
                .or_insert(Hold {
                    noted: None,
                    held: true,
                })
                .held = true;
        } else {
            h.remove(&(Box::<str>::from(topic), partition));
        }
    }

    /// Why `topic`/`partition` is held: the noted batch reason, else
    /// `dlt_write` (a diversion not acknowledged).
    pub fn hold_reason(&self, topic: &str, partition: i32) -> &'static str {
        let h = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        h.get(&(Box::<str>::from(topic), partition))
            .and_then(|e| e.noted)
            .unwrap_or("dlt_write")
    }
}

/// The process-wide history the data path records into.
pub fn global() -> &'static History {
    static GLOBAL: OnceLock<History> = OnceLock::new();
    GLOBAL.get_or_init(History::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: i64 = 60_000;

    #[test]
    fn counts_land_in_their_minute_and_age_out() {
        let h = History::default();
        let t0 = 1_000 * M;
        h.diverted("geo", "poison", 2, t0);
        h.diverted("geo", "poison", 1, t0 + 30_000);
        h.diverted("geo", "stale", 1, t0 + M);
        let s = h.snapshot(t0 + M);
        assert_eq!(s.first_minute_ms, t0 + M - 59 * M);
        assert_eq!(s.series.len(), 2);
        assert_eq!(s.series[0].class, "poison");
        assert_eq!(s.series[0].counts[58], 3);
        assert_eq!(s.series[1].counts[59], 1);
        assert_eq!(s.series[0].counts.iter().sum::<u64>(), 3);
        // An hour later everything is gone, series included.
        let s = h.snapshot(t0 + 61 * M);
        assert!(s.series.is_empty(), "{s:?}");
        // A long idle gap clears every slot once.
        h.diverted("geo", "poison", 5, t0 + 500 * M);
        let s = h.snapshot(t0 + 500 * M);
        assert_eq!(s.series[0].counts.iter().sum::<u64>(), 5);
    }

    #[test]
    fn series_are_capped_and_the_rest_is_other() {
        let h = History::default();
        let t = 7 * M;
        for i in 0..MAX_SERIES + 50 {
            h.diverted(&format!("t{i}"), "poison", 1, t);
        }
        h.diverted("t0", "poison", 1, t);
        let s = h.snapshot(t);
        assert_eq!(s.series.len(), MAX_SERIES + 1);
        let other = s.series.last().unwrap();
        assert_eq!((other.topic.as_deref(), other.counts[59]), (None, 50));
        let total: u64 = s.series.iter().map(|x| x.counts.iter().sum::<u64>()).sum();
        assert_eq!(total, (MAX_SERIES + 51) as u64);
        // Once the hour has passed the places are free again.
        h.diverted("late", "poison", 1, t + 60 * M);
        let s = h.snapshot(t + 60 * M);
        assert_eq!(s.series.len(), 1);
        assert_eq!(s.series[0].topic.as_deref(), Some("late"));
    }

    #[test]
    fn hold_reasons_follow_the_gauge() {
        let h = History::default();
        h.set_held("geo", 0, true);
        assert_eq!(h.hold_reason("geo", 0), "dlt_write");
        h.note_hold("geo", 1, "breaker");
        h.set_held("geo", 1, true);
        assert_eq!(h.hold_reason("geo", 1), "breaker");
        h.set_held("geo", 1, false);
        assert_eq!(h.hold_reason("geo", 1), "dlt_write");
    }
}
