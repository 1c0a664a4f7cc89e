//! The re-drive loop (`dead_letter.redrive`): records of the listed
//! classes are re-validated after each delay (counted from their diversion,
//! `x-failed-at`) against the policies in force, and those now valid are
//! written back to their original topic and partition exactly as
//! `dlt replay --execute` writes them (`dlt::replay::decide`).
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
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::client::{ClientError, Cluster};
use crate::config::Redrive;
use crate::deadletter::trust::{self, Reader};
use crate::deadletter::{backoff, follow};
use crate::dlt::replay::{decide, produce, Decision, Rule};
use crate::dlt::{DltError, DltRecord};
use crate::dlt_marker::{Attempt, Marker};
use crate::filter::FetchFilter;
use crate::kafka::builder::build_batch;
use crate::metrics;
use crate::policy::PolicySet;

/// Records waiting for an attempt, at most, and their bytes.
pub const MAX_PENDING: usize = 10_000;
pub const MAX_PENDING_BYTES: usize = 64 << 20;
/// How often the loop looks for new records and due attempts.
const TICK: Duration = Duration::from_millis(500);

/// One attempt marker seen: which attempt, where, and its outcome.
#[derive(Debug, Clone, Copy)]
struct Seen {
    attempt: u32,
    offset: i64,
    redriven: bool,
}

pub struct Loop {
    pub cfg: Redrive,
    pub filter: Arc<FetchFilter>,
    pub dlt: Cluster,
    pub target: Cluster,
    next: HashMap<(String, i32), i64>,
    /// DLT records of the re-driven classes, by DLT coordinate.
    pending: BTreeMap<String, DltRecord>,
    /// Key, value and header bytes held by `pending`.
    pending_bytes: usize,
    /// Attempt markers, by the coordinate they name, in log order.
    attempts: HashMap<String, Vec<Seen>>,
}

impl Loop {
    pub fn new(cfg: Redrive, filter: Arc<FetchFilter>, dlt: Cluster, target: Cluster) -> Self {
        Loop {
            cfg,
            filter,
            dlt,
            target,
            next: HashMap::new(),
            pending: BTreeMap::new(),
            pending_bytes: 0,
            attempts: HashMap::new(),
        }
    }

    pub async fn run(mut self) {
        let mut failures = 0u32;
        loop {
            match self.tick().await {
                Ok(()) => {
                    failures = 0;
                    tokio::time::sleep(TICK).await;
                }
                Err(e) => {
                    warn!(error = %e, "re-drive failed; retrying");
                    self.dlt.reset();
                    self.target.reset();
                    let pause =
                        backoff(failures, Duration::from_millis(200), Duration::from_secs(5));
                    tokio::time::sleep(pause).await;
                    failures = failures.saturating_add(1);
                }
            }
        }
    }

    async fn tick(&mut self) -> Result<(), DltError> {
        let policies = self.filter.policies();
        for dlt in self.dlts(&policies).await? {
            let Some(n) = self.dlt.partitions(&dlt).await? else {
                continue;
            };
            for p in 0..n as i32 {
                if self.pending.len() >= MAX_PENDING {
                    break;
                }
                self.follow(&dlt, p).await?;
            }
        }
        let now = crate::clock::now_ms();
        let due: Vec<(String, u32)> = self
            .pending
            .iter()
            .filter_map(|(c, r)| self.due(c, r, now).map(|n| (c.clone(), n)))
            .collect();
        for (coord, n) in due {
            if let Some(r) = self.pending.get(&coord).cloned() {
                self.attempt(&policies, &r, n).await?;
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

    /// The DLTs the listed classes of existing policy topics go to.
    async fn dlts(&mut self, policies: &PolicySet) -> Result<Vec<String>, ClientError> {
        let meta = self.target.metadata(None).await?;
        let mut out = Vec::new();
        for t in meta.topics.iter().filter(|t| t.error_code == 0) {
            let Some(name) = t.name.as_ref().map(|n| n.to_string()) else {
                continue;
            };
            if policies.is_dead_letter_topic(&name) {
                continue;
            }
            let Some(p) = policies.for_topic(&name) else {
                continue;
            };
            for c in &self.cfg.classes {
                let dlt = p.dead_letter_topic(&name, *c);
                if !out.contains(&dlt) {
                    out.push(dlt);
                }
            }
        }
        Ok(out)
    }

    /// Read what is new in `dlt`/`p`: records of the listed classes and
    /// attempt markers.
    async fn follow(&mut self, dlt: &str, p: i32) -> Result<(), ClientError> {
        let from = self.next.get(&(dlt.to_string(), p)).copied();
        let classes: Vec<&str> = self.cfg.classes.iter().map(|c| c.as_str()).collect();
        let (pending, attempts) = (&mut self.pending, &mut self.attempts);
        let bytes = &mut self.pending_bytes;
        let mut f = |r: &crate::kafka::record::Record<'_>| {
            let Some(ctx) = trust::open(Reader::Redrive, dlt, p, r) else {
                return true;
            };
            if let Some(m) = Marker::parse(&ctx, r.key) {
                // A record's markers follow it in its partition: only
                // those of records waiting here matter.
                if let Marker::Attempt(a) = m {
                    if pending.contains_key(&a.of) {
                        attempts
                            .entry(a.of.clone())
                            .or_default()
                            .push(Seen::of(&a, r.offset));
                    }
                }
                return true;
            }
            let d = DltRecord::from_context(dlt, p, r, &ctx);
            if d.origin_topic.is_none() || !classes.contains(&d.class.as_str()) {
                return true;
            }
            let size = record_bytes(&d);
            if pending.len() >= MAX_PENDING || *bytes + size > MAX_PENDING_BYTES {
                return false; // out of room: read again once some are done
            }
            *bytes += size;
            pending.insert(d.coordinate(), d);
            true
        };
        let next = follow::follow(&mut self.dlt, dlt, p, from, &mut f).await?;
        self.next.insert((dlt.to_string(), p), next);
        Ok(())
    }

    /// The attempt markers for `coord` from where this partition was read
    /// to its end, without reading further records: whose marker came
    /// first for an attempt just written.
    async fn markers_since(&mut self, r: &DltRecord) -> Result<Vec<Seen>, ClientError> {
        let (dlt, p) = (r.dlt_topic.clone(), r.dlt_partition);
        let from = self.next.get(&(dlt.clone(), p)).copied();
        let coord = r.coordinate();
        let mut out = self.attempts.get(&coord).cloned().unwrap_or_default();
        let mut f = |rec: &crate::kafka::record::Record<'_>| {
            let ctx = trust::open(Reader::Redrive, &dlt, p, rec);
            if let Some(Marker::Attempt(a)) = ctx.and_then(|c| Marker::parse(&c, rec.key)) {
                if a.of == coord {
                    out.push(Seen::of(&a, rec.offset));
                }
            }
            true
        };
        follow::follow(&mut self.dlt, &dlt, p, from, &mut f).await?;
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
        r: &DltRecord,
        n: u32,
    ) -> Result<(), DltError> {
        let target = r.origin_topic.clone().unwrap_or_default();
        let parts = self.target.partitions(&target).await?;
        let d = decide(
            Rule::redrive(),
            policies,
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
                &crate::deadletter::trust::seal(&r.dlt_topic, r.dlt_partition),
            )],
            &Default::default(),
        )
        .map_err(|e| DltError::Produce(e.to_string()))?;
        let resp = self
            .dlt
            .produce(&r.dlt_topic, r.dlt_partition, batch)
            .await?;
        if resp.error_code != 0 {
            return Err(DltError::Produce(format!(
                "attempt marker: error {}",
                resp.error_code
            )));
        }
        // Read up to our marker: the first marker for this attempt wins.
        let seen = self.markers_since(r).await?;
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
            let at = produce(&mut self.target, &topic, partition, &record).await?;
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
    use crate::client::Endpoint;

    fn looping(delays: &[u64]) -> Loop {
        let cfg = Redrive {
            classes: vec![crate::policy::Class::Unknown],
            delays: delays.iter().map(|s| Duration::from_secs(*s)).collect(),
        };
        let config = crate::config::Config::parse(
            "listen:\n  bootstrap: 127.0.0.1:1\n  broker_port_base: 2\nupstream:\n  bootstrap_servers: [127.0.0.1:3]\n",
            std::path::Path::new("c.yaml"),
        )
        .unwrap();
        let ep = Endpoint::upstream(&config).unwrap();
        let filter = Arc::new(FetchFilter::new(
            crate::engine::Engine::new(Arc::new(PolicySet::default()), 1 << 20, None),
            crate::deadletter::DeadLetter::start(
                &config.dead_letter,
                &config.upstream.bootstrap_servers,
                ep.clone(),
                ep.clone(),
                Arc::new(PolicySet::default()),
            ),
            Duration::from_secs(1),
        ));
        let cluster = || Cluster::new(config.upstream.bootstrap_servers.clone(), ep.clone());
        Loop::new(cfg, filter, cluster(), cluster())
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
        let mut d = DltRecord::from_record(Reader::Redrive, "t.dlt", 0, &r).unwrap();
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
        let mark = |l: &mut Loop, attempt, offset, redriven| {
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
