//! The blocked-key set of `ordering: per_key` policies: for each origin
//! partition, the keys whose records are parked in a DLT, with the offset
//! of each key's first diverted record. The planner asks it through
//! [`Gate`] (`plan::keys::KeyGate`); the Fetch filter adds a key once a
//! diversion is acknowledged and releases one when a replayed record
//! carrying `x-released-through` is delivered.
//!
//! Its state lives in Kafka, not in memory only: [`Follower`] reads the
//! DLTs of per_key policies from their log start at start (the filter holds
//! those topics until it has), then follows them, so diversions and
//! release/discard markers written by another instance (or `dlt replay`,
//! `dlt discard`) reach this one within [`FOLLOW_EVERY`]. A record counts
//! only if read from the DLT its origin topic's policy writes to
//! (`rebuild::trusted`), as for the ledger.
//!
//! Memory: one entry per blocked key (the key's bytes and four numbers);
//! the planner holds a partition rather than block more than
//! `plan::keys::MAX_BLOCKED_KEYS_PER_PARTITION` keys in it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{backoff, follow, trusted};
use crate::client::{ClientError, Cluster};
use crate::dlt_marker::Marker;
use crate::dlt_record::{Origin, H_BLOCKED_BY, H_CLASS, H_FAILED_AT};
use crate::kafka::record::Record;
use crate::metrics;
use crate::plan::keys::{Block, KeyGate, MAX_BLOCKED_KEYS_PER_PARTITION};
use crate::policy::{Class, KeyOrdering, Policy, PolicySet};

/// How often the DLTs of per_key policies are read for what is new.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy)]
struct KeyState {
    first: i64,
    class: Class,
    /// The highest origin offset of the key parked so far.
    last: i64,
    /// When the first record was diverted (ms since the epoch).
    since_ms: i64,
}

#[derive(Default)]
struct PartitionKeys {
    keys: HashMap<Bytes, KeyState>,
    /// Keys released lately, and through which offset: a diverted record
    /// of theirs read late from a DLT (the follower lags the filter) must
    /// not block them again. Bounded like `keys`; cleared when full.
    released: HashMap<Bytes, i64>,
}

type Part = Arc<RwLock<PartitionKeys>>;

/// Every blocked key, by origin (topic, partition).
pub struct BlockedKeys {
    parts: DashMap<(Arc<str>, i32), Part>,
    loaded: watch::Sender<bool>,
    /// The policies in force, for the follower (replaced on reload).
    policies: watch::Sender<Arc<PolicySet>>,
}

impl Default for BlockedKeys {
    fn default() -> Self {
        BlockedKeys {
            parts: DashMap::new(),
            loaded: watch::channel(false).0,
            policies: watch::channel(Arc::new(PolicySet::default())).0,
        }
    }
}

/// One diverted record of a per_key policy, as the set learns it.
pub struct Parked<'a> {
    pub key: &'a [u8],
    pub offset: i64,
    /// The class of the key's first record (whose DLT the key's records go to).
    pub class: Class,
    pub blocked_by: Option<i64>,
    pub at_ms: i64,
}

impl BlockedKeys {
    fn part(&self, topic: &str, partition: i32) -> Part {
        if let Some(p) = self.parts.get(&(Arc::from(topic), partition)) {
            return p.clone();
        }
        self.parts
            .entry((Arc::from(topic), partition))
            .or_default()
            .clone()
    }

    /// A record of `topic`/`partition` is in a DLT: block its key (or
    /// extend the key's block).
    pub fn parked(&self, topic: &str, partition: i32, p: &Parked<'_>) {
        let part = self.part(topic, partition);
        let Ok(mut part) = part.write() else { return };
        if part.released.get(p.key).is_some_and(|t| p.offset <= *t) {
            return;
        }
        if let Some(s) = part.keys.get_mut(p.key) {
            s.last = s.last.max(p.offset);
            return;
        }
        let state = KeyState {
            first: p.blocked_by.unwrap_or(p.offset).min(p.offset),
            class: p.class,
            last: p.offset,
            since_ms: p.at_ms,
        };
        part.keys.insert(Bytes::copy_from_slice(p.key), state);
    }

    /// Every parked record of `key` up to origin offset `through` is home
    /// (replayed) or given up (discarded); whether that released the key.
    pub fn release(&self, topic: &str, partition: i32, key: &[u8], through: i64) -> bool {
        let part = self.part(topic, partition);
        let Ok(mut part) = part.write() else {
            return false;
        };
        if part.released.len() >= MAX_BLOCKED_KEYS_PER_PARTITION {
            part.released.clear();
        }
        let t = part
            .released
            .entry(Bytes::copy_from_slice(key))
            .or_insert(through);
        *t = (*t).max(through);
        match part.keys.get(key) {
            Some(s) if s.last <= through => {
                part.keys.remove(key);
                true
            }
            _ => false,
        }
    }

    /// The planner's view of `topic`/`partition`.
    pub fn gate(&self, topic: &str, partition: i32) -> Gate {
        Gate(
            self.parts
                .get(&(Arc::from(topic), partition))
                .map(|p| p.clone()),
        )
    }

    /// New policies are in force: the follower reads the DLTs they add.
    pub fn policies_changed(&self, policies: Arc<PolicySet>) {
        self.policies.send_replace(policies);
    }

    /// Whether the DLTs of per_key policies have been read once.
    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    /// Wait up to `wait` for [`BlockedKeys::is_loaded`].
    pub async fn wait_loaded(&self, wait: Duration) -> bool {
        let mut rx = self.loaded.subscribe();
        tokio::time::timeout(wait, rx.wait_for(|l| *l))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Blocked keys in all, and when the oldest block began (ms).
    pub fn summary(&self) -> (usize, Option<i64>) {
        let (mut n, mut oldest) = (0, None::<i64>);
        for p in self.parts.iter() {
            if let Ok(p) = p.read() {
                n += p.keys.len();
                for s in p.keys.values() {
                    oldest = Some(oldest.map_or(s.since_ms, |o| o.min(s.since_ms)));
                }
            }
        }
        (n, oldest)
    }
}

/// One partition's blocked keys, for the planner.
pub struct Gate(Option<Part>);

impl Gate {
    fn read<R>(&self, f: impl FnOnce(&PartitionKeys) -> R) -> Option<R> {
        let p = self.0.as_ref()?;
        let guard = p.read().ok()?;
        Some(f(&guard))
    }
}

impl KeyGate for Gate {
    fn blocked(&self, key: &[u8]) -> Option<Block> {
        self.read(|p| {
            p.keys.get(key).map(|s| Block {
                first: s.first,
                class: s.class,
            })
        })
        .flatten()
    }
    fn releases(&self, key: &[u8], through: i64) -> bool {
        self.read(|p| p.keys.get(key).is_some_and(|s| s.last <= through))
            .unwrap_or(false)
    }
    fn len(&self) -> usize {
        self.read(|p| p.keys.len()).unwrap_or(0)
    }
    fn signing_keys(&self) -> &crate::dlt_context::Keys {
        super::trust::keys()
    }
}

/// The class whose DLT `dlt` is for `topic` under `policy` (the class of a
/// key's first record, when a parked record says only `blocked`).
pub fn head_class(policy: &Policy, topic: &str, dlt: &str, class: Class) -> Class {
    if class != Class::Blocked {
        return class;
    }
    Class::ALL
        .into_iter()
        .filter(|c| *c != Class::Blocked)
        .find(|c| policy.dead_letter_topic(topic, *c) == dlt)
        .unwrap_or(Class::Poison)
}

fn class_of(text: &str) -> Class {
    Class::ALL
        .into_iter()
        .find(|c| c.as_str() == text)
        .unwrap_or(Class::Poison)
}

/// Keeps [`BlockedKeys`] in step with the DLTs of per_key policies.
pub struct Follower {
    pub set: Arc<BlockedKeys>,
    /// The diversion circuit breakers: their markers are read and written
    /// here too.
    pub breakers: Arc<super::breaker::Breakers>,
    /// The dead-letter cluster and the upstream cluster (origin topics).
    pub dlt: Cluster,
    pub upstream: Cluster,
    /// Where reading each DLT partition goes on.
    next: HashMap<(String, i32), i64>,
    /// The DLTs followed, as of the last lookup, and under which policies.
    known: Vec<String>,
    seen_policies: Arc<PolicySet>,
    passes: u64,
}

/// Passes between two lookups of the topic list (10 s at FOLLOW_EVERY).
const REFRESH_EVERY: u64 = 20;

impl Follower {
    pub fn new(
        set: Arc<BlockedKeys>,
        breakers: Arc<super::breaker::Breakers>,
        dlt: Cluster,
        upstream: Cluster,
    ) -> Self {
        Follower {
            set,
            breakers,
            dlt,
            upstream,
            next: HashMap::new(),
            known: Vec::new(),
            seen_policies: Arc::new(PolicySet::default()),
            passes: 0,
        }
    }

    pub async fn run(mut self) {
        let mut attempt = 0u32;
        loop {
            match self.pass().await {
                Ok(()) => {
                    let (keys, oldest) = self.set.summary();
                    metrics::global()
                        .keys
                        .set_blocked(keys, oldest, crate::clock::now_ms());
                    if !self.set.is_loaded() {
                        info!(
                            keys = self.set.summary().0,
                            "blocked keys read back from the DLTs"
                        );
                        self.set.loaded.send_replace(true);
                    }
                    attempt = 0;
                    tokio::time::sleep(FOLLOW_EVERY).await;
                }
                Err(e) => {
                    warn!(error = %e, "reading blocked keys from the DLTs failed; retrying");
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

    /// Read what is new in every DLT of a per_key policy topic.
    async fn pass(&mut self) -> Result<(), ClientError> {
        let policies = self.set.policies.borrow().clone();
        if !policies.policies().iter().any(followed) {
            return Ok(());
        }
        self.write_breaker_marks(&policies).await;
        // The topic list changes rarely: looked up every REFRESH_EVERY passes.
        if self.passes % REFRESH_EVERY == 0 || !Arc::ptr_eq(&policies, &self.seen_policies) {
            self.known = self.dlts(&policies).await?;
            self.seen_policies = policies.clone();
        }
        self.passes = self.passes.wrapping_add(1);
        for dlt in self.known.clone() {
            let Some(n) = self.dlt.partitions(&dlt).await? else {
                continue;
            };
            for partition in 0..n as i32 {
                let from = self.next.get(&(dlt.clone(), partition)).copied();
                let (set, pol, brk) = (&self.set, &policies, &self.breakers);
                let mut f = |r: &Record<'_>| {
                    observe((set, brk), pol, (&dlt, partition), r);
                    true
                };
                let next = follow::follow(&mut self.dlt, &dlt, partition, from, &mut f).await?;
                self.next.insert((dlt.clone(), partition), next);
            }
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
                    .to_record(crate::clock::now_ms(), &super::trust::seal(&dlt, partition));
                let batch = crate::kafka::builder::build_batch(&[record], &Default::default()).ok()?;
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

    /// The DLTs of the upstream's per_key policy topics.
    async fn dlts(&mut self, policies: &PolicySet) -> Result<Vec<String>, ClientError> {
        let meta = self.upstream.metadata(None).await?;
        let mut out = Vec::new();
        for t in meta.topics.iter().filter(|t| t.error_code == 0) {
            let Some(name) = t.name.as_ref().map(|n| n.to_string()) else {
                continue;
            };
            if policies.is_dead_letter_topic(&name) {
                continue;
            }
            let Some(p) = policies.for_topic(&name).filter(|p| followed(p)) else {
                continue;
            };
            for c in Class::ALL {
                let dlt = p.dead_letter_topic(&name, c);
                if !out.contains(&dlt) {
                    out.push(dlt);
                }
            }
        }
        Ok(out)
    }
}

/// Whether the follower reads `p`'s DLTs: for blocked keys (per_key) or
/// for breaker markers.
fn followed(p: &Arc<crate::policy::Policy>) -> bool {
    p.ordering == KeyOrdering::PerKey || p.breaker.is_some()
}

/// Learn one DLT record: a parked record of a per_key topic, or a
/// release/discard marker.
fn observe(
    (set, breakers): (&BlockedKeys, &super::breaker::Breakers),
    policies: &PolicySet,
    (dlt, p): (&str, i32),
    r: &Record<'_>,
) {
    let Some(ctx) = super::trust::open(super::trust::Reader::BlockedKeys, dlt, p, r) else {
        return;
    };
    if let Some(Marker::Breaker(m)) = Marker::parse(&ctx, r.key) {
        if let Some(policy) = policies.for_topic(&m.topic).filter(|p| {
            Class::ALL
                .iter()
                .any(|c| p.dead_letter_topic(&m.topic, *c) == dlt)
        }) {
            breakers.apply(&m, &policy.name);
        }
        return;
    }
    if let Some(Marker::Release(m)) = Marker::parse(&ctx, r.key) {
        let writes_here = policies.for_topic(&m.topic).is_some_and(|p| {
            Class::ALL
                .iter()
                .any(|c| p.dead_letter_topic(&m.topic, *c) == dlt)
        });
        if writes_here {
            set.release(&m.topic, m.partition, &m.key, m.through);
        }
        return;
    }
    let (Some(o), Some(key)) = (Origin::of(&ctx), r.key) else {
        return;
    };
    if !trusted(policies, dlt, &o, None) {
        return;
    }
    let Some(policy) = policies
        .for_topic(&o.topic)
        .filter(|p| p.ordering == KeyOrdering::PerKey)
    else {
        return;
    };
    let text = |k| ctx.text(k);
    let class = head_class(policy, &o.topic, dlt, class_of(text(H_CLASS).unwrap_or("")));
    let parked = Parked {
        key,
        offset: o.offset,
        class,
        blocked_by: text(H_BLOCKED_BY).and_then(|t| t.trim().parse().ok()),
        at_ms: text(H_FAILED_AT)
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(r.timestamp),
    };
    set.parked(&o.topic, o.partition, &parked);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(key: &[u8], offset: i64, blocked_by: Option<i64>) -> Parked<'_> {
        Parked {
            key,
            offset,
            class: Class::Poison,
            blocked_by,
            at_ms: 7,
        }
    }

    #[test]
    fn a_key_is_released_only_when_its_last_parked_record_is_covered() {
        let s = BlockedKeys::default();
        s.parked("t", 0, &parked(b"A", 3, None));
        s.parked("t", 0, &parked(b"A", 5, Some(3)));
        let g = s.gate("t", 0);
        assert_eq!(
            g.blocked(b"A"),
            Some(Block {
                first: 3,
                class: Class::Poison
            })
        );
        assert!(g.releases(b"A", 5) && !g.releases(b"A", 4));
        assert!(s.gate("t", 1).blocked(b"A").is_none());
        assert!(!s.release("t", 0, b"A", 4));
        assert!(s.release("t", 0, b"A", 5));
        assert!(s.gate("t", 0).blocked(b"A").is_none());
        // A parked record read late (at or below the release) does not block again.
        s.parked("t", 0, &parked(b"A", 5, Some(3)));
        assert!(s.gate("t", 0).blocked(b"A").is_none());
        // A new block after the release does.
        s.parked("t", 0, &parked(b"A", 9, None));
        assert_eq!(s.gate("t", 0).blocked(b"A").map(|b| b.first), Some(9));
        assert_eq!(s.summary(), (1, Some(7)));
    }
}
