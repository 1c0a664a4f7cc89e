//! The DLT follower: one task that reads the DLTs of the policies in force
//! from their log start and then follows them, for the two readers that act
//! on what is there besides the ledger:
//!
//! - the blocked-key set of `ordering: per_key` policies and the diversion
//!   circuit breakers (`dlt::blocked`, `dlt::breaker`): parked records,
//!   release/discard markers, breaker markers;
//! - the re-drive scheduler (`dead_letter.redrive`, `dlt::redrive`):
//!   records of the re-driven classes and their attempt markers.
//!
//! One function ([`followed_dlts`]) decides which DLTs each reader wants;
//! one read loop (over [`follow`]) opens each record's frame once
//! ([`trust::open`]: a record antidote cannot show it wrote is never acted
//! on) and hands it to the readers as an [`Event`]. Each reader keeps its own
//! position per DLT partition: a reader out of room (re-drive's pending cap)
//! stops at a record and reads it again later, while the other goes on.
//! One dead-letter cluster client and one upstream client serve both.
//!
//! The ledger's own reader (`dlt::ledger::rebuild` and `tail`) stays
//! apart: it loads a DLT on demand before the first write to it and reads
//! many partitions per Fetch on the write path's clock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::client::{ClientError, Cluster, Endpoint};
use crate::config::Config;
use crate::dlt::backoff;
use crate::dlt::blocked::BlockedKeys;
use crate::dlt::breaker::Breakers;
use crate::dlt::read::{follow, Event};
use crate::dlt::redrive::Scheduler;
use crate::dlt::trust::{self, Reader};
use crate::dlt_marker::Marker;
use crate::engine::Engine;
use crate::kafka::record::Record;
use crate::metrics;
use crate::policy::{Class, KeyOrdering, PolicySet};

/// How often the DLTs are read for what is new.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(500);
/// Passes between two listings of the upstream's topics (10 s) when no
/// re-drive is configured (re-drive lists them every pass).
const REFRESH_EVERY: u64 = 20;

/// Which readers want a DLT.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Readers {
    pub blocked: bool,
    pub redrive: bool,
}

/// Where each reader goes on in one DLT partition (`None`: its log start).
#[derive(Debug, Default, Clone, Copy)]
struct Positions {
    blocked: Option<i64>,
    redrive: Option<i64>,
}

/// Whether the blocked-key reader follows `policy`'s DLTs: for blocked keys
/// (per_key) or for breaker markers.
pub fn follows_keys(policy: &crate::policy::Policy) -> bool {
    policy.ordering == KeyOrdering::PerKey || policy.breaker.is_some()
}

/// The DLTs each reader follows, given the upstream's `topics`: every
/// class's DLT of a per_key or breaker policy topic (blocked keys), and the
/// `redrive` classes' DLTs of every policy topic.
pub fn followed_dlts<'t>(
    policies: &PolicySet,
    topics: impl IntoIterator<Item = &'t str>,
    redrive: &[Class],
) -> BTreeMap<String, Readers> {
    let mut out: BTreeMap<String, Readers> = BTreeMap::new();
    for topic in topics {
        if policies.is_dead_letter_topic(topic) {
            continue;
        }
        let Some(p) = policies.for_topic(topic) else {
            continue;
        };
        if follows_keys(p) {
            for c in Class::ALL {
                out.entry(p.dead_letter_topic(topic, c))
                    .or_default()
                    .blocked = true;
            }
        }
        for c in redrive {
            out.entry(p.dead_letter_topic(topic, *c))
                .or_default()
                .redrive = true;
        }
    }
    out
}

pub struct Follower {
    engine: Arc<Engine>,
    blocked: Arc<BlockedKeys>,
    breakers: Arc<Breakers>,
    redrive: Option<Scheduler>,
    /// The dead-letter cluster and the upstream cluster (origin topics,
    /// re-drive's writes).
    dlt: Cluster,
    upstream: Cluster,
    next: HashMap<(String, i32), Positions>,
    /// The DLTs followed, as of the last listing, and under which policies.
    known: BTreeMap<String, Readers>,
    seen_policies: Arc<PolicySet>,
    passes: u64,
}

impl Follower {
    pub fn new(
        engine: Arc<Engine>,
        (blocked, breakers): (Arc<BlockedKeys>, Arc<Breakers>),
        redrive: Option<Scheduler>,
        dlt: Cluster,
        upstream: Cluster,
    ) -> Self {
        Follower {
            engine,
            blocked,
            breakers,
            redrive,
            dlt,
            upstream,
            next: HashMap::new(),
            known: BTreeMap::new(),
            seen_policies: Arc::new(PolicySet::default()),
            passes: 0,
        }
    }

    /// The follower of `config` (with the re-drive scheduler when
    /// `dead_letter.redrive` is set): one client of the dead-letter
    /// cluster, one of the upstream. Not started: [`Follower::run`].
    pub fn from_config(
        config: &Config,
        engine: Arc<Engine>,
        keys: (Arc<BlockedKeys>, Arc<Breakers>),
        (upstream, dlt): (&Endpoint, &Endpoint),
    ) -> Self {
        let upstream_bootstrap = config.upstream.bootstrap_servers.clone();
        let dlt_bootstrap = config
            .dead_letter
            .bootstrap_servers
            .clone()
            .unwrap_or_else(|| upstream_bootstrap.clone());
        Follower::new(
            engine,
            keys,
            config.dead_letter.redrive.clone().map(Scheduler::new),
            Cluster::new(dlt_bootstrap, dlt.clone()),
            Cluster::new(upstream_bootstrap, upstream.clone()),
        )
    }

    pub async fn run(mut self) {
        let mut attempt = 0u32;
        loop {
            match self.pass().await {
                Ok(policies) => {
                    let (keys, oldest) = self.blocked.summary();
                    metrics::global()
                        .keys
                        .set_blocked(keys, oldest, crate::clock::now_ms());
                    if !self.blocked.is_loaded() {
                        info!(keys, "blocked keys read back from the DLTs");
                        self.blocked.set_loaded();
                    }
                    attempt = 0;
                    if let Some(r) = self.redrive.as_mut() {
                        r.attempt_due(&policies, &mut self.dlt, &mut self.upstream, |dlt, p| {
                            self.next.get(&(dlt.to_string(), p)).and_then(|n| n.redrive)
                        })
                        .await;
                    }
                    tokio::time::sleep(FOLLOW_EVERY).await;
                }
                Err(e) => {
                    warn!(error = %e, "following the DLTs (blocked keys, re-drive) failed; retrying");
                    self.dlt.reset();
                    self.upstream.reset();
                    let pause =
                        backoff(attempt, Duration::from_millis(200), Duration::from_secs(5));
                    tokio::time::sleep(pause).await;
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }

    /// Read what is new in every followed DLT; the policies it read under.
    async fn pass(&mut self) -> Result<Arc<PolicySet>, ClientError> {
        let policies = self.engine.policies();
        let redrive: Vec<Class> = self
            .redrive
            .as_ref()
            .map(|r| r.classes().to_vec())
            .unwrap_or_default();
        if redrive.is_empty() && !policies.policies().iter().any(|p| follows_keys(p)) {
            return Ok(policies);
        }
        self.write_breaker_marks(&policies).await;
        let due = !redrive.is_empty() || self.passes % REFRESH_EVERY == 0;
        if due || !Arc::ptr_eq(&policies, &self.seen_policies) {
            let meta = self.upstream.metadata(None).await?;
            let topics = meta
                .topics
                .iter()
                .filter(|t| t.error_code == 0)
                .filter_map(|t| t.name.as_deref().map(|n| -> &str { n }));
            self.known = followed_dlts(&policies, topics, &redrive);
            self.seen_policies = policies.clone();
        }
        self.passes = self.passes.wrapping_add(1);
        for (dlt, readers) in self.known.clone() {
            let Some(n) = self.dlt.partitions(&dlt).await? else {
                continue;
            };
            for partition in 0..n as i32 {
                self.read(&policies, &dlt, partition, readers).await?;
            }
        }
        Ok(policies)
    }

    /// Read `dlt`/`partition` from the lowest position of its `readers`,
    /// handing each reader the records at or after its own position.
    async fn read(
        &mut self,
        policies: &PolicySet,
        dlt: &str,
        partition: i32,
        readers: Readers,
    ) -> Result<(), ClientError> {
        let at = self
            .next
            .get(&(dlt.to_string(), partition))
            .copied()
            .unwrap_or_default();
        let wanted = [
            readers.blocked.then_some(at.blocked),
            readers.redrive.then_some(at.redrive),
        ];
        // The lowest wanted position; a reader that has not read yet reads
        // from the log start.
        let from = wanted
            .iter()
            .flatten()
            .try_fold(i64::MAX, |lo, p| p.map(|p| lo.min(p)));
        let (blocked, breakers) = (&self.blocked, &self.breakers);
        let mut redrive = self.redrive.as_mut().filter(|_| readers.redrive);
        // Where the re-drive reader ran out of room, if it did.
        let mut stopped: Option<i64> = None;
        let at_or_after = |pos: Option<i64>, offset| pos.is_none_or(|p| offset >= p);
        let mut f = |r: &Record<'_>| {
            let Some(ctx) = trust::open(Reader::Follower, dlt, partition, r) else {
                return true;
            };
            let event = match Marker::parse(&ctx, r.key) {
                Some(m) => Event::Marker(m),
                None => Event::Diverted {
                    ctx: &ctx,
                    record: r,
                },
            };
            if readers.blocked && at_or_after(at.blocked, r.offset) {
                blocked.observe(breakers, policies, dlt, &event);
            }
            if let Some(s) = redrive.as_mut() {
                if stopped.is_none()
                    && at_or_after(at.redrive, r.offset)
                    && !s.observe((dlt, partition), r.offset, &event)
                {
                    stopped = Some(r.offset);
                }
            }
            true
        };
        let next = follow(&mut self.dlt, dlt, partition, from, &mut f).await?;
        let pos = self.next.entry((dlt.to_string(), partition)).or_default();
        if readers.blocked {
            pos.blocked = Some(next);
        }
        if readers.redrive {
            pos.redrive = Some(stopped.unwrap_or(next));
        }
        Ok(())
    }

    /// Write the breaker markers this instance owes (it tripped) to the
    /// DLT of their topic's policy; those that fail are tried next pass.
    async fn write_breaker_marks(&mut self, policies: &PolicySet) {
        for m in self.breakers.take_outbox() {
            let Some(p) = policies.for_topic(&m.topic) else {
                continue;
            };
            let dlt = p.dead_letter_topic(&m.topic, Class::Poison);
            let written = async {
                let n = self.dlt.partitions(&dlt).await.ok().flatten()?;
                let partition = m.partition.rem_euclid(i32::try_from(n).ok()?.max(1));
                let record = Marker::Breaker(m.clone())
                    .to_record(crate::clock::now_ms(), &trust::seal(&dlt, partition));
                let batch =
                    crate::kafka::builder::build_batch(&[record], &Default::default()).ok()?;
                let resp = self.dlt.produce(&dlt, partition, batch).await.ok()?;
                (resp.error_code == 0).then_some(())
            }
            .await;
            if written.is_none() {
                self.breakers.owe(m);
                break; // the next pass tries again
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies(yaml: &str) -> PolicySet {
        PolicySet::parse(yaml, std::path::Path::new("p.yaml")).unwrap()
    }

    /// One function decides which DLTs each reader follows: every class's
    /// DLT of per_key topics for blocked keys, the re-driven classes' DLTs
    /// of every policy topic for re-drive, never a DLT's own DLT.
    #[test]
    fn each_reader_follows_the_dlts_its_policies_use() {
        let p = policies(
            "policies:\n  - name: keyed\n    topics: [\"k\"]\n    value: { format: json }\n    ordering: per_key\n    dead_letter: { topic: \"{topic}.{class}.dlt\" }\n  - name: plain\n    topics: [\"t\"]\n    value: { format: json }\n    dead_letter: { topic: \"{topic}.{class}.dlt\" }\n",
        );
        let got = followed_dlts(&p, ["k", "t", "k.poison.dlt", "other"], &[Class::Unknown]);
        let both = Readers {
            blocked: true,
            redrive: true,
        };
        let keys = Readers {
            blocked: true,
            redrive: false,
        };
        let redrive = Readers {
            blocked: false,
            redrive: true,
        };
        assert_eq!(got.get("k.unknown.dlt"), Some(&both));
        assert_eq!(got.get("k.poison.dlt"), Some(&keys));
        assert_eq!(got.get("t.unknown.dlt"), Some(&redrive));
        assert_eq!(got.get("t.poison.dlt"), None);
        assert_eq!(got.len(), Class::ALL.len() + 1);
        assert!(followed_dlts(&p, ["t"], &[]).is_empty());
    }
}
