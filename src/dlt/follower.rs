//! The DLT follower: the one task that reads the dead-letter topics back,
//! for every reader that acts on what is in them:
//!
//! - the ledger (`dlt::ledger`): which records are in their DLT already. A
//!   DLT is loaded whole before its first write (`ledger::rebuild`: at
//!   start, after a policy reload, for a DLT first asked about), then
//!   followed from there, so other instances' diversions reach this one
//!   within about [`TAIL_INTERVAL`];
//! - the blocked-key set of `ordering: per_key` policies and the diversion
//!   circuit breakers (`dlt::blocked`, `dlt::breaker`): parked records,
//!   release/discard markers, breaker markers, read from each DLT's start;
//! - the re-drive scheduler (`dead_letter.redrive`, `dlt::redrive`):
//!   records of the re-driven classes and their attempt markers.
//!
//! One function ([`followed_dlts`]) decides which DLTs the blocked keys and
//! re-drive follow (the ledger follows the DLTs it has loaded). One read
//! loop (`ledger::tail::read_new`: one Fetch per DLT leader per round, every
//! followed partition in it) opens each record's frame once
//! ([`trust::open`]: a record antidote cannot show it wrote is never acted
//! on) and hands it to the readers as an [`Event`]. Each reader keeps its
//! own position per DLT partition, and is given only records at or after
//! it: a reader out of room (re-drive's pending cap) stops at a record and
//! is given it again later, while the others go on. Loading, reading and
//! re-drive's writes run in this one task, one after the other, so a reload
//! (which may unload a DLT and read it again under new policies) never
//! races a read; one client of the dead-letter cluster and one of the
//! upstream serve them all.

mod hand;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::client::ClientError;
use crate::config::Config;
use crate::dlt::backoff;
use crate::dlt::blocked::BlockedKeys;
use crate::dlt::breaker::Breakers;
use crate::dlt::ledger::rebuild::{Loader, TAIL_INTERVAL};
use crate::dlt::ledger::tail::{read_new, DltPartition};
use crate::dlt::redrive::Scheduler;
use crate::dlt::trust;
use crate::dlt_marker::Marker;
use crate::kafka::record::Record;
use crate::metrics::{self, FollowerSeen};
use crate::policy::{Class, KeyOrdering, PolicySet};
use hand::{Hand, Handed, Positions, Start};

/// How often the upstream's topics are listed again for the blocked keys'
/// and re-drive's DLTs: re-drive's attempts wait on it, so it lists more
/// often than the ledger's discovery.
const LIST_EVERY: Duration = Duration::from_secs(10);
const LIST_EVERY_REDRIVE: Duration = Duration::from_millis(500);

/// Which readers want a DLT.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Readers {
    pub ledger: bool,
    pub blocked: bool,
    pub redrive: bool,
}

/// Whether the blocked-key reader follows `policy`'s DLTs: for blocked keys
/// (per_key) or for breaker markers.
pub fn follows_keys(policy: &crate::policy::Policy) -> bool {
    policy.ordering == KeyOrdering::PerKey || policy.breaker.is_some()
}

/// The DLTs the blocked keys and re-drive follow, given the upstream's
/// `topics`: every class's DLT of a per_key or breaker policy topic
/// (blocked keys), and the `redrive` classes' DLTs of every policy topic.
pub fn followed_dlts<'t>(
    policies: &PolicySet,
    topics: impl IntoIterator<Item = &'t str>,
    redrive: &[Class],
) -> BTreeMap<String, Readers> {
    let mut out: BTreeMap<String, Readers> = BTreeMap::new();
    for topic in topics {
        let Some(p) = policies.policing(topic) else {
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

/// The readers besides the ledger: blocked keys, breakers, re-drive.
pub struct KeyReaders {
    pub blocked: Arc<BlockedKeys>,
    pub breakers: Arc<Breakers>,
    pub redrive: Option<Scheduler>,
}

impl KeyReaders {
    /// The readers of `config` (re-drive when `dead_letter.redrive` is set).
    pub fn of(config: &Config, (blocked, breakers): (Arc<BlockedKeys>, Arc<Breakers>)) -> Self {
        KeyReaders {
            blocked,
            breakers,
            redrive: config.dead_letter.redrive.clone().map(Scheduler::new),
        }
    }
}

pub struct Follower {
    /// The ledger's loader; its two clients (dead-letter and upstream
    /// clusters) serve every reader, and re-drive's writes.
    loader: Loader,
    readers: Option<KeyReaders>,
    next: HashMap<DltPartition, Positions>,
    /// The DLTs the blocked keys and re-drive follow, as of the last
    /// listing, under which policies, and when.
    known: BTreeMap<String, Readers>,
    seen_policies: Arc<PolicySet>,
    listed: Option<Instant>,
    /// Failed rounds in a row, and when to read again.
    failures: u32,
    retry_at: Option<Instant>,
}

impl Follower {
    /// The follower of `loader`'s ledger and, when given, of `readers`.
    pub(crate) fn new(loader: Loader, readers: Option<KeyReaders>) -> Self {
        Follower {
            loader,
            readers,
            next: HashMap::new(),
            known: BTreeMap::new(),
            seen_policies: Arc::new(PolicySet::default()),
            listed: None,
            failures: 0,
            retry_at: None,
        }
    }

    /// Load the DLTs the policies use, then follow them; load again on a
    /// policy change, a DLT first asked about, or a policy topic new
    /// upstream.
    pub async fn run(mut self) {
        loop {
            self.loader.load_all().await;
            // Loaded: the write path and readiness may go on. The round
            // that follows at once gives the blocked keys their first read
            // (readiness waits for that too, on its own flag), without
            // holding the ledger's readiness behind reads of the DLTs.
            let _ = self.loader.started.send(true);
            self.round_or_pause().await;
            loop {
                tokio::select! {
                    r = self.loader.policies.changed() => if r.is_err() { return } else { break },
                    w = self.loader.wake.recv() => if w.is_none() { return } else { break },
                    _ = tokio::time::sleep(TAIL_INTERVAL) => {}
                }
                if self.loader.discover().await {
                    break; // a DLT to load
                }
                self.round_or_pause().await;
                self.redrive().await;
            }
        }
    }

    /// A round, unless failures asked for a pause; a failure is logged and
    /// pauses the next rounds (jittered, growing up to 5 s).
    async fn round_or_pause(&mut self) {
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let mut seen = FollowerSeen::default();
        let result = self.round(&mut seen).await;
        metrics::global().follower_round(seen, crate::clock::now_ms());
        match result {
            Ok(()) => {
                self.failures = 0;
                self.retry_at = None;
            }
            Err(e) => {
                warn!(error = %e, "following the DLTs failed; retrying");
                self.loader.dlt.reset();
                self.loader.upstream.reset();
                let pause = backoff(
                    self.failures,
                    Duration::from_millis(200),
                    Duration::from_secs(5),
                );
                self.retry_at = Some(Instant::now() + pause);
                self.failures = self.failures.saturating_add(1);
            }
        }
    }

    /// Load the wanted DLTs, then one round (unit tests drive the task's
    /// steps one by one).
    #[cfg(test)]
    pub(crate) async fn load_and_round(&mut self) {
        self.loader.load_all().await;
        let mut seen = FollowerSeen::default();
        self.round(&mut seen).await.expect("round");
        metrics::global().follower_round(seen, crate::clock::now_ms());
    }

    /// One round: list the blocked keys' and re-drive's DLTs when due, then
    /// read what every followed DLT partition gained, for its readers;
    /// what it saw goes in `seen`, reported once by the caller.
    async fn round(&mut self, seen: &mut FollowerSeen) -> Result<(), ClientError> {
        let began = Instant::now();
        let policies = self.loader.policies.borrow().clone();
        self.write_breaker_marks(&policies).await;
        self.list(&policies).await?;
        // The DLTs of per_key topics the filter served since the listing.
        if let Some(k) = &self.readers {
            for dlt in k.blocked.asked() {
                self.known.entry(dlt).or_default().blocked = true;
            }
        }
        if !self.known.values().any(|r| r.blocked) {
            // Nothing to read back for the blocked keys: loaded now, even
            // if the DLTs cannot be read.
            self.keys_loaded(&HashMap::new(), &HashMap::new(), began, seen)?;
        }
        let wanted = self.wanted().await?;
        let (mut positions, starts) = self.starts(&wanted).await?;
        if positions.is_empty() {
            return self.keys_loaded(&starts, &HashMap::new(), began, seen);
        }
        let (keys, redrive) = match self.readers.as_mut() {
            Some(k) => (Some((&*k.blocked, &*k.breakers)), k.redrive.as_mut()),
            None => (None, None),
        };
        let mut hand = Hand {
            policies: &policies,
            starts: &starts,
            ledger: &self.loader.ledger,
            ids: &self.loader.ids,
            keys,
            redrive,
            out: Handed::default(),
        };
        let mut give = |dlt: &str, p: i32, r: Option<&Record<'_>>| hand.give(dlt, p, r);
        let ends = read_new(&mut self.loader.dlt, &mut positions, &mut give).await?;
        let handed = hand.out;
        if handed.learned > 0 {
            debug!(
                learned = handed.learned,
                "diversions of other instances learned from the DLTs"
            );
        }
        let lag = self.advance(&positions, &ends, &starts, &handed);
        seen.learned = handed.learned;
        seen.ledger_lag = Some(lag);
        self.keys_loaded(&starts, &ends, began, seen)
    }

    /// The DLTs to read and their readers: those the blocked keys and
    /// re-drive follow, and those the ledger has loaded. The partitions of
    /// those not seen yet are asked for in one metadata request (most do
    /// not exist until a first diversion), not one per DLT.
    async fn wanted(&mut self) -> Result<BTreeMap<String, Readers>, ClientError> {
        let mut wanted: BTreeMap<String, Readers> = self.known.clone();
        for dlt in self.loader.ledger.loaded_dlts() {
            wanted.entry(dlt).or_default().ledger = true;
        }
        let unknown: Vec<String> = wanted
            .keys()
            .filter(|d| self.loader.dlt.known_partitions(d).is_none())
            .cloned()
            .collect();
        if !unknown.is_empty() {
            self.loader.dlt.metadata(Some(&unknown)).await?;
        }
        Ok(wanted)
    }

    /// Where each partition of the `wanted` DLTs is read from (the lowest
    /// position of its readers; `None`, a log start, asked for), and where
    /// each of its readers stands.
    async fn starts(
        &mut self,
        wanted: &BTreeMap<String, Readers>,
    ) -> Result<(HashMap<DltPartition, i64>, HashMap<DltPartition, Start>), ClientError> {
        let mut from: HashMap<DltPartition, i64> = HashMap::new();
        let mut starts: HashMap<DltPartition, Start> = HashMap::new();
        for (dlt, r) in wanted {
            let Some(n) = self.loader.dlt.known_partitions(dlt) else {
                continue;
            };
            for p in 0..n as i32 {
                let key = (dlt.clone(), p);
                let ledger = self.loader.ledger.tail_position(&key);
                let at = self.next.get(&key).copied().unwrap_or_default();
                let mut lowest = None::<i64>;
                for pos in [
                    r.ledger.then_some(ledger),
                    r.blocked.then_some(at.blocked),
                    r.redrive.then_some(at.redrive),
                ]
                .into_iter()
                .flatten()
                {
                    let pos = match pos {
                        Some(pos) => pos,
                        None => self.loader.dlt.log_start(dlt, p).await?,
                    };
                    lowest = Some(lowest.map_or(pos, |l| l.min(pos)));
                }
                if let Some(lowest) = lowest {
                    from.insert(key.clone(), lowest);
                    starts.insert(
                        key,
                        Start {
                            who: *r,
                            ledger,
                            at,
                        },
                    );
                }
            }
        }
        Ok((from, starts))
    }

    /// Move each reader of the partitions read on to where the read got
    /// (`positions`; `ends` are the partitions' ends), or re-drive to where
    /// it ran out of room; returns the ledger's lag behind the ends.
    fn advance(
        &mut self,
        positions: &HashMap<DltPartition, i64>,
        ends: &HashMap<DltPartition, i64>,
        starts: &HashMap<DltPartition, Start>,
        handed: &Handed,
    ) -> i64 {
        let mut lag = 0i64;
        for (key, &pos) in positions {
            let Some(start) = starts.get(key) else {
                continue;
            };
            let end = ends.get(key).copied();
            // A reader goes on from where the read got to, or from where it
            // was if that is further; a position past the partition's end
            // (recreated or truncated under a reader ahead of the others) is
            // void: read again from the start. After a reset every reader
            // goes on from the read.
            let advance = |old: Option<i64>| -> Option<i64> {
                match old {
                    _ if handed.reset.contains(key) => Some(pos),
                    Some(old) if end.is_some_and(|end| old > end) => None,
                    Some(old) => Some(old.max(pos)),
                    None => Some(pos),
                }
            };
            if start.who.ledger {
                let at = advance(start.ledger).unwrap_or(0);
                lag += end.map_or(0, |end| (end - at).max(0));
                self.loader.ledger.set_tail_position(key.clone(), at);
            }
            let next = self.next.entry(key.clone()).or_default();
            if start.who.blocked {
                next.blocked = advance(start.at.blocked);
            }
            if start.who.redrive {
                next.redrive = match handed.stopped.get(key) {
                    Some(&s) => Some(s),
                    None => advance(start.at.redrive),
                };
            }
        }
        lag
    }

    /// Once every partition the blocked keys follow has been read to its
    /// end, in the round that `began` then: say so (per_key topics wait for
    /// the first time, and hold while the last is too old), and note the
    /// blocked keys in `seen`.
    fn keys_loaded(
        &self,
        starts: &HashMap<DltPartition, Start>,
        ends: &HashMap<DltPartition, i64>,
        began: Instant,
        seen: &mut FollowerSeen,
    ) -> Result<(), ClientError> {
        let Some(k) = &self.readers else {
            return Ok(());
        };
        let (keys, oldest) = k.blocked.summary();
        seen.blocked = Some((keys, oldest));
        let caught_up = starts
            .iter()
            .filter(|(_, s)| s.who.blocked)
            .all(|(key, _)| {
                let at = self.next.get(key).and_then(|n| n.blocked);
                at.zip(ends.get(key)).is_some_and(|(at, end)| at >= *end)
            });
        if !caught_up {
            return Ok(());
        }
        let followed = self
            .known
            .iter()
            .filter(|(_, r)| r.blocked)
            .map(|(d, _)| d.clone())
            .collect();
        k.blocked.set_read_through(began, followed);
        if !k.blocked.is_loaded() {
            info!(keys, "blocked keys read back from the DLTs");
            k.blocked.set_loaded();
        }
        Ok(())
    }

    /// List the upstream's topics for the blocked keys' and re-drive's DLTs
    /// when the policies changed or the listing is due.
    async fn list(&mut self, policies: &Arc<PolicySet>) -> Result<(), ClientError> {
        let Some(k) = &self.readers else {
            return Ok(());
        };
        let redrive: Vec<Class> = k
            .redrive
            .as_ref()
            .map(|r| r.classes().to_vec())
            .unwrap_or_default();
        if redrive.is_empty() && !policies.policies().iter().any(|p| follows_keys(p)) {
            self.known.clear();
            self.seen_policies = policies.clone();
            return Ok(());
        }
        let every = if redrive.is_empty() {
            LIST_EVERY
        } else {
            LIST_EVERY_REDRIVE
        };
        let due = self.listed.is_none_or(|at| at.elapsed() >= every);
        if !due && Arc::ptr_eq(policies, &self.seen_policies) {
            return Ok(());
        }
        let meta = self.loader.upstream.metadata(None).await?;
        let topics = meta
            .topics
            .iter()
            .filter(|t| t.error_code == 0)
            .filter_map(|t| t.name.as_deref().map(|n| -> &str { n }));
        self.known = followed_dlts(policies, topics, &redrive);
        self.seen_policies = policies.clone();
        self.listed = Some(Instant::now());
        Ok(())
    }

    /// Re-drive's attempts that are due (its failures back off on their
    /// own).
    async fn redrive(&mut self) {
        let Some(s) = self.readers.as_mut().and_then(|k| k.redrive.as_mut()) else {
            return;
        };
        let policies = self.loader.policies.borrow().clone();
        let next = &self.next;
        s.attempt_due(
            &policies,
            &mut self.loader.dlt,
            &mut self.loader.upstream,
            |dlt, p| next.get(&(dlt.to_string(), p)).and_then(|n| n.redrive),
        )
        .await;
    }

    /// Write the breaker markers this instance owes (it tripped) to the
    /// DLT of their topic's policy; those that fail are tried next pass.
    async fn write_breaker_marks(&mut self, policies: &PolicySet) {
        let Some(breakers) = self.readers.as_ref().map(|k| k.breakers.clone()) else {
            return;
        };
        for m in breakers.take_outbox() {
            let Some(p) = policies.for_topic(&m.topic) else {
                continue;
            };
            let dlt = p.dead_letter_topic(&m.topic, Class::Poison);
            let written = async {
                let n = self.loader.dlt.partitions(&dlt).await.ok().flatten()?;
                let partition = m.partition.rem_euclid(i32::try_from(n).ok()?.max(1));
                let record = Marker::Breaker(m.clone())
                    .to_record(crate::clock::now_ms(), &trust::seal(&dlt, partition));
                let batch =
                    crate::kafka::builder::build_batch(&[record], &Default::default()).ok()?;
                let resp = self.loader.dlt.produce(&dlt, partition, batch).await.ok()?;
                (resp.error_code == 0).then_some(())
            }
            .await;
            if written.is_none() {
                breakers.owe(m);
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
            ..Readers::default()
        };
        let keys = Readers {
            blocked: true,
            ..Readers::default()
        };
        let redrive = Readers {
            redrive: true,
            ..Readers::default()
        };
        assert_eq!(got.get("k.unknown.dlt"), Some(&both));
        assert_eq!(got.get("k.poison.dlt"), Some(&keys));
        assert_eq!(got.get("t.unknown.dlt"), Some(&redrive));
        assert_eq!(got.get("t.poison.dlt"), None);
        assert_eq!(got.len(), Class::ALL.len() + 1);
        assert!(followed_dlts(&p, ["t"], &[]).is_empty());
    }
}
