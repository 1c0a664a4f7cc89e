//! The re-drive loop (`dead_letter.redrive`): records of the listed
//! classes are re-validated after each delay (counted from their diversion,
//! `x-failed-at`) against the policies in force, and those now valid are
//! written back to their original topic and partition exactly as
//! `dlt replay --execute` writes them (`replay::decide`, in the core).
//!
//! Every attempt is an attempt marker in the record's DLT partition
//! (`dlt_marker`), written BEFORE the write-back: the markers are the
//! loop's only state, read back from the DLTs on start, so a restart
//! neither repeats nor forgets an attempt. Several instances may run the
//! loop: the first marker for (record, attempt) in the partition's log
//! wins, and only its writer writes the record back. A crash between the
//! marker and the write-back leaves the record in its DLT (marked
//! re-driven, never written twice): `dlt replay` writes it then.
//!
//! Memory: at most [`MAX_PENDING`] records wait for an attempt; past that
//! the loop stops reading further (it reads them once room is made), it
//! never forgets one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use tracing::{info, warn};

use crate::client::{ClientError, Cluster};
use crate::config::Redrive;
use crate::dlt::backoff;
use crate::dlt::read::{follow, Event};
use crate::dlt::trust::{self, Reader};
use crate::dlt::write::{produce_plain as produce, WriteError as DltError};
use crate::dlt_marker::{Attempt, Marker};
use crate::kafka::builder::build_batch;
use crate::metrics;
use crate::policy::{Class, PolicySet};
use crate::replay::{decide, Decision, DltRecord, Rule};

/// Records waiting for an attempt, at most, and their bytes.
pub const MAX_PENDING: usize = 10_000;
pub const MAX_PENDING_BYTES: usize = 64 << 20;

/// One attempt marker seen: which attempt, where, and its outcome.
#[derive(Debug, Clone, Copy)]
struct Seen {
    attempt: u32,
    offset: i64,
    redriven: bool,
}

/// Re-drive's state, fed by the DLT follower (`dlt::follower`):
/// the records waiting for an attempt and the attempt markers seen.
pub struct Scheduler {
    cfg: Redrive,
    /// DLT records of the re-driven classes, by DLT coordinate.
    pending: BTreeMap<String, DltRecord>,
    /// Key, value and header bytes held by `pending`.
    pending_bytes: usize,
    /// Attempt markers, by the coordinate they name, in log order.
    attempts: HashMap<String, Vec<Seen>>,
    /// Attempts that failed in a row, and when to try again.
    failures: u32,
    retry_at: Option<tokio::time::Instant>,
}

impl Scheduler {
    pub fn new(cfg: Redrive) -> Self {
        Scheduler {
            cfg,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            attempts: HashMap::new(),
            failures: 0,
            retry_at: None,
        }
    }

    /// The classes re-driven.
    pub fn classes(&self) -> &[Class] {
        &self.cfg.classes
    }

    /// Learn one record of `dlt`/`p`: a record of a re-driven class waits
    /// for its attempts; an attempt marker of a waiting record counts.
    /// False when out of room: the follower gives this record again later.
    pub fn observe(&mut self, (dlt, p): (&str, i32), offset: i64, event: &Event<'_>) -> bool {
        let (ctx, r) = match event {
            // A record's markers follow it in its partition: only those of
            // records waiting here matter.
            Event::Marker(Marker::Attempt(a)) => {
                if self.pending.contains_key(&a.of) {
                    self.attempts
                        .entry(a.of.clone())
                        .or_default()
                        .push(Seen::of(a, offset));
                }
                return true;
            }
            Event::Marker(_) => return true,
            Event::Diverted { ctx, record } => (ctx, record),
        };
        let d = DltRecord::from_context(dlt, p, r, ctx, trust::keys());
        if self.pending.contains_key(&d.coordinate()) {
            return true; // given again (a reader's position went back)
        }
        if d.origin_topic.is_none() || !self.cfg.classes.iter().any(|c| c.as_str() == d.class) {
            return true;
        }
        let size = record_bytes(&d);
        if self.pending.len() >= MAX_PENDING || self.pending_bytes + size > MAX_PENDING_BYTES {
            return false; // out of room: read again once some are done
        }
        self.pending_bytes += size;
        self.pending.insert(d.coordinate(), d);
        true
    }

    /// Make the attempts that are due, then forget the records that are
    /// done. `position(dlt, p)` is where the follower reads `dlt`/`p` on
    /// from. A failure is logged and tried again after a pause.
    pub async fn attempt_due(
        &mut self,
        policies: &PolicySet,
        dlt: &mut Cluster,
        target: &mut Cluster,
        position: impl Fn(&str, i32) -> Option<i64>,
    ) {
        if self
            .retry_at
            .is_some_and(|at| tokio::time::Instant::now() < at)
        {
            return;
        }
        match self.attempts_now(policies, dlt, target, position).await {
            Ok(()) => {
                self.failures = 0;
                self.retry_at = None;
            }
            Err(e) => {
                warn!(error = %e, "re-drive failed; retrying");
                dlt.reset();
                target.reset();
                let pause = backoff(
                    self.failures,
                    Duration::from_millis(200),
                    Duration::from_secs(5),
                );
                self.retry_at = Some(tokio::time::Instant::now() + pause);
                self.failures = self.failures.saturating_add(1);
            }
        }
    }

    async fn attempts_now(
        &mut self,
        policies: &PolicySet,
        dlt: &mut Cluster,
        target: &mut Cluster,
        position: impl Fn(&str, i32) -> Option<i64>,
    ) -> Result<(), DltError> {
        let now = crate::clock::now_ms();
        let due: Vec<(String, u32)> = self
            .pending
            .iter()
            .filter_map(|(c, r)| self.due(c, r, now).map(|n| (c.clone(), n)))
            .collect();
        for (coord, n) in due {
            if let Some(r) = self.pending.get(&coord).cloned() {
                let from = position(&r.dlt_topic, r.dlt_partition);
                self.attempt(policies, (dlt, target), &r, n, from).await?;
            }
        }
        let done: Vec<String> = self
            .pending
            .keys()
            .filter(|c| self.finished(c))
            .cloned()
            .collect();
        for c in done {
            if let Some(r) = self.pending.remove(&c) {
                self.pending_bytes = self.pending_bytes.saturating_sub(record_bytes(&r));
            }
            self.attempts.remove(&c);
        }
        Ok(())
    }

    /// The attempt markers for `coord` from where this partition was read
    /// to its end, without reading further records: whose marker came
    /// first for an attempt just written.
    async fn markers_since(
        &self,
        cluster: &mut Cluster,
        r: &DltRecord,
        from: Option<i64>,
    ) -> Result<Vec<Seen>, ClientError> {
        let (dlt, p) = (r.dlt_topic.clone(), r.dlt_partition);
        let coord = r.coordinate();
        let mut out = self.attempts.get(&coord).cloned().unwrap_or_default();
        let mut f = |rec: &crate::kafka::record::Record<'_>| {
            let ctx = trust::open(Reader::Follower, &dlt, p, rec);
            if let Some(Marker::Attempt(a)) = ctx.and_then(|c| Marker::parse(&c, rec.key)) {
                if a.of == coord {
                    out.push(Seen::of(&a, rec.offset));
                }
            }
            true
        };
        follow(cluster, &dlt, p, from, &mut f).await?;
        Ok(out)
    }

    /// Attempts made (distinct numbers), and whether one wrote it back.
    fn progress(&self, coord: &str) -> (u32, bool) {
        let seen = self.attempts.get(coord).map(Vec::as_slice).unwrap_or(&[]);
        let made: HashSet<u32> = seen.iter().map(|s| s.attempt).collect();
        (made.len() as u32, seen.iter().any(|s| s.redriven))
    }

    fn finished(&self, coord: &str) -> bool {
        let (made, redriven) = self.progress(coord);
        redriven || made as usize >= self.cfg.delays.len()
    }

    /// The attempt due now for `r`, if any.
    fn due(&self, coord: &str, r: &DltRecord, now_ms: i64) -> Option<u32> {
        if self.finished(coord) {
            return None;
        }
        let n = self.progress(coord).0 + 1;
        let delay = self.cfg.delays.get(n as usize - 1)?;
        let since = r.failed_at.unwrap_or(r.timestamp);
        (now_ms >= since.saturating_add(delay.as_millis() as i64)).then_some(n)
    }

    /// Attempt `n` for `r`: judge, record the attempt, and (if this
    /// instance's marker is the first for it) write the record back.
    async fn attempt(
        &mut self,
        policies: &PolicySet,
        (dlt, target): (&mut Cluster, &mut Cluster),
        r: &DltRecord,
        n: u32,
        from: Option<i64>,
    ) -> Result<(), DltError> {
        let topic = r.origin_topic.clone().unwrap_or_default();
        let parts = target.partitions(&topic).await?;
        let d = decide(
            Rule::redrive(),
            policies,
            trust::keys(),
            r,
            |_| parts,
            &HashSet::new(),
            crate::clock::now_ms(),
        );
        let (redriven, reason) = match &d {
            Decision::Replay { .. } => (true, String::new()),
            Decision::StillInvalid {
                class,
                rule,
                reason,
            } => (false, format!("{class} {rule}: {reason}")),
            other => (false, format!("{other:?}")),
        };
        let marker = Marker::Attempt(Attempt {
            of: r.coordinate(),
            attempt: n,
            redriven,
            reason,
        });
        let batch = build_batch(
            &[marker.to_record(
                crate::clock::now_ms(),
                &trust::seal(&r.dlt_topic, r.dlt_partition),
            )],
            &Default::default(),
        )
        .map_err(|e| DltError::Produce(e.to_string()))?;
        let resp = dlt.produce(&r.dlt_topic, r.dlt_partition, batch).await?;
        if resp.error_code != 0 {
            return Err(DltError::Produce(format!(
                "attempt marker: error {}",
                resp.error_code
            )));
        }
        // Read up to our marker: the first marker for this attempt wins.
        let seen = self.markers_since(dlt, r, from).await?;
        let first = seen.iter().find(|s| s.attempt == n).copied();
        if first.is_none_or(|s| s.offset != resp.base_offset) {
            return Ok(()); // another instance made this attempt
        }
        metrics::global().keys.redriven(redriven, n);
        if let Decision::Replay {
            topic,
            partition,
            record,
            ..
        } = d
        {
            let at = produce(target, &topic, partition, &record).await?;
            info!(from = %r.coordinate(), to = %format!("{topic}-{partition}@{at}"), attempt = n, "record re-driven");
        } else {
            info!(record = %r.coordinate(), attempt = n, "re-driven record still invalid");
        }
        Ok(())
    }
}

impl Seen {
    fn of(a: &Attempt, offset: i64) -> Self {
        Seen {
            attempt: a.attempt,
            offset,
            redriven: a.redriven,
        }
    }
}

/// What one waiting record holds in memory, roughly.
fn record_bytes(r: &DltRecord) -> usize {
    let h: usize = r
        .headers
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
        .sum();
    r.key.as_ref().map_or(0, |k| k.len()) + r.value.as_ref().map_or(0, |v| v.len()) + h + 256
}

#[cfg(test)]
mod tests {
    use super::*;

    fn looping(delays: &[u64]) -> Scheduler {
        Scheduler::new(Redrive {
            classes: vec![crate::policy::Class::Unknown],
            delays: delays.iter().map(|s| Duration::from_secs(*s)).collect(),
        })
    }

    fn record(failed_at: i64) -> DltRecord {
        let r = crate::kafka::record::Record {
            offset: 4,
            timestamp: 0,
            key: None,
            value: None,
            headers: vec![crate::kafka::record::Header {
                key: b"x-failed-at",
                value: Some(b"1000"),
            }],
        };
        let mut d = crate::dlt::trust::dlt_record(Reader::Follower, "t.dlt", 0, &r).unwrap();
        d.failed_at = Some(failed_at);
        d
    }

    /// One attempt after each delay, counted from the diversion; a record
    /// written back, or past its last attempt, is done.
    #[tokio::test]
    async fn attempts_are_due_after_each_delay_and_never_after_the_last() {
        let mut l = looping(&[2, 4, 6]);
        let (r, c) = (record(1_000), "t.dlt/0/4".to_string());
        assert_eq!(l.due(&c, &r, 2_999), None);
        assert_eq!(l.due(&c, &r, 3_000), Some(1));
        let mark = |l: &mut Scheduler, attempt, offset, redriven| {
            l.attempts.entry(c.clone()).or_default().push(Seen {
                attempt,
                offset,
                redriven,
            })
        };
        mark(&mut l, 1, 10, false);
        // The same attempt twice (two instances) counts once.
        mark(&mut l, 1, 11, false);
        assert_eq!(l.due(&c, &r, 4_999), None);
        assert_eq!(l.due(&c, &r, 5_000), Some(2));
        mark(&mut l, 2, 12, false);
        mark(&mut l, 3, 13, false);
        assert!(l.finished(&c));
        assert_eq!(l.due(&c, &r, 1 << 40), None);
        let mut l = looping(&[2, 4, 6]);
        l.attempts.entry(c.clone()).or_default().push(Seen {
            attempt: 1,
            offset: 3,
            redriven: true,
        });
        assert!(l.finished(&c) && l.due(&c, &r, 1 << 40).is_none());
    }
}
