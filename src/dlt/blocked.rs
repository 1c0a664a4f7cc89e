//! The blocked-key set of `ordering: per_key` policies: for each origin
//! partition, the keys whose records are parked in a DLT, with the offset
//! of each key's first diverted record. The planner asks it through
//! [`Gate`] (`plan::keys::KeyGate`); the Fetch filter adds a key once a
//! diversion is acknowledged and releases one when a replayed record
//! carrying `x-released-through` is delivered.
//!
//! Its state lives in Kafka, not in memory only: the DLT follower
//! (`follower`) reads the DLTs of per_key policies from their log start at
//! start (the filter holds those topics until it has), then follows them
//! and hands each record to [`BlockedKeys::observe`], so diversions and
//! release/discard markers written by another instance (or `dlt replay`,
//! `dlt discard`) reach this one within about `TAIL_INTERVAL` (200 ms). A record
//! counts only if read from the DLT its origin topic's policy writes to
//! (`rebuild::trusted`), as for the ledger.
//!
//! A key blocked by another instance is known here only once the follower
//! has read it, so the filter plans a per_key partition only while the
//! set is current for its topic ([`BlockedKeys::is_current_for`]): the
//! follower follows the topic's DLTs (the filter asks for them, without
//! waiting for the follower's next listing of the upstream's topics) and
//! its last read of them all to their ends began at most [`MAX_STALE`]
//! ago. A follower that cannot read them (this instance cut off from a
//! DLT's leader) holds per_key topics instead of delivering a later record
//! of a key blocked by another instance.
//!
//! Memory: one entry per blocked key (the key's bytes and four numbers);
//! the planner holds a partition rather than block more than
//! `plan::keys::MAX_BLOCKED_KEYS_PER_PARTITION` keys in it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::watch;
use tokio::time::Instant;

use super::breaker::Breakers;
use super::ledger::rebuild::trusted;
use super::read::Event;
use crate::dlt_marker::Marker;
use crate::dlt_record::{Origin, H_BLOCKED_BY, H_CLASS, H_FAILED_AT};
use crate::plan::keys::{Block, KeyGate, MAX_BLOCKED_KEYS_PER_PARTITION};
use crate::policy::{Class, KeyOrdering, Policy, PolicySet};

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

/// How old the follower's last complete read of the DLTs may be for the
/// set to count as current: five follower rounds (`TAIL_INTERVAL`, 200 ms).
pub const MAX_STALE: Duration = Duration::from_secs(1);

/// Every blocked key, by origin (topic, partition).
pub struct BlockedKeys {
    parts: DashMap<(Arc<str>, i32), Part>,
    loaded: watch::Sender<bool>,
    /// When the follower's last read that reached the end of every DLT
    /// partition it follows for the blocked keys began.
    read_through: watch::Sender<Option<Instant>>,
    /// The DLTs that read followed.
    followed: RwLock<HashSet<String>>,
    /// DLTs of per_key topics the filter served, for the follower to follow.
    asked: Mutex<HashSet<String>>,
}

impl Default for BlockedKeys {
    fn default() -> Self {
        BlockedKeys {
            parts: DashMap::new(),
            loaded: watch::channel(false).0,
            read_through: watch::channel(None).0,
            followed: RwLock::default(),
            asked: Mutex::default(),
        }
    }
}

/// Every DLT `policy` writes `topic`'s records to (one per class at most).
pub fn dlts_of(policy: &Policy, topic: &str) -> Vec<String> {
    let mut out: Vec<String> = Class::ALL
        .iter()
        .map(|&c| policy.dead_letter_topic(topic, c))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
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

    /// The DLTs of per_key policies have been read once (the follower).
    pub fn set_loaded(&self) {
        self.loaded.send_replace(true);
    }

    /// Whether the DLTs of per_key policies have been read once.
    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    /// The follower read every DLT of `followed` to its end, in a read
    /// that began at `began`: every diversion to them acknowledged before
    /// then is in the set.
    pub fn set_read_through(&self, began: Instant, followed: HashSet<String>) {
        if let Ok(mut f) = self.followed.write() {
            *f = followed;
        }
        self.read_through.send_replace(Some(began));
    }

    /// The DLTs the filter asked to be followed (per_key topics it served).
    pub fn asked(&self) -> Vec<String> {
        self.asked
            .lock()
            .map(|a| a.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether the set holds every key blocked in `dlts` (a per_key topic's
    /// DLTs) as of at most [`MAX_STALE`] ago.
    pub fn is_current_for(&self, dlts: &[String]) -> bool {
        self.current(*self.read_through.borrow(), dlts)
    }

    fn current(&self, read_through: Option<Instant>, dlts: &[String]) -> bool {
        read_through.is_some_and(|t| t.elapsed() <= MAX_STALE)
            && self
                .followed
                .read()
                .is_ok_and(|f| dlts.iter().all(|d| f.contains(d)))
    }

    /// Wait up to `wait` for [`BlockedKeys::is_current_for`], asking the
    /// follower to follow `dlts` if it does not yet.
    pub async fn wait_current_for(&self, dlts: &[String], wait: Duration) -> bool {
        if let Ok(mut a) = self.asked.lock() {
            for d in dlts {
                if !a.contains(d) {
                    a.insert(d.clone());
                }
            }
        }
        let mut rx = self.read_through.subscribe();
        tokio::time::timeout(wait, rx.wait_for(|t| self.current(*t, dlts)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Up to `max` blocked keys, oldest block first (the console).
    pub fn list(&self, max: usize) -> Vec<BlockedKey> {
        let mut out = Vec::new();
        for e in self.parts.iter() {
            let ((topic, partition), part) = e.pair();
            let Ok(p) = part.read() else { continue };
            out.extend(p.keys.iter().map(|(k, s)| BlockedKey {
                topic: topic.to_string(),
                partition: *partition,
                key: k.clone(),
                first: s.first,
                last: s.last,
                since_ms: s.since_ms,
                class: s.class,
            }));
        }
        out.sort_by_key(|k| k.since_ms);
        out.truncate(max);
        out
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

/// One blocked key as [`BlockedKeys::list`] shows it.
#[derive(Debug, Clone)]
pub struct BlockedKey {
    pub topic: String,
    pub partition: i32,
    pub key: Bytes,
    /// The origin offset its block starts at, and the highest parked.
    pub first: i64,
    pub last: i64,
    pub since_ms: i64,
    pub class: Class,
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
    fn released_through(&self, key: &[u8]) -> Option<i64> {
        self.read(|p| p.released.get(key).copied()).flatten()
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

impl BlockedKeys {
    /// Learn one DLT record read from `dlt` (its frame opened): a
    /// parked record of a per_key topic, or a release/discard or breaker
    /// marker for a topic whose policy writes to this DLT.
    pub fn observe(&self, breakers: &Breakers, policies: &PolicySet, dlt: &str, event: &Event<'_>) {
        let writes_here = |topic: &str| {
            policies.for_topic(topic).filter(|p| {
                Class::ALL
                    .iter()
                    .any(|c| p.dead_letter_topic(topic, *c) == dlt)
            })
        };
        let (ctx, r) = match event {
            Event::Marker(Marker::Breaker(m)) => {
                if let Some(policy) = writes_here(&m.topic) {
                    breakers.apply(m, &policy.name);
                }
                return;
            }
            Event::Marker(Marker::Release(m)) => {
                if writes_here(&m.topic).is_some() {
                    self.release(&m.topic, m.partition, &m.key, m.through);
                }
                return;
            }
            Event::Marker(_) => return,
            Event::Diverted { ctx, record } => (ctx, record),
        };
        let (Some(o), Some(key)) = (Origin::of(ctx), r.key) else {
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
        self.parked(&o.topic, o.partition, &parked);
    }
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

    /// The set is current for a topic's DLTs only while the follower
    /// follows them and its last complete read is under `MAX_STALE` old; a
    /// waiter asks for them to be followed and wakes when a read completes.
    #[tokio::test]
    async fn the_set_is_current_only_while_the_last_complete_read_is_recent() {
        let s = Arc::new(BlockedKeys::default());
        let dlts = vec!["t.dlt".to_string()];
        let followed = || dlts.iter().cloned().collect::<HashSet<_>>();
        assert!(!s.is_current_for(&dlts), "never read");
        s.set_read_through(Instant::now(), HashSet::new());
        assert!(
            s.is_current_for(&[]) && !s.is_current_for(&dlts),
            "not followed"
        );
        assert!(!s.wait_current_for(&dlts, Duration::from_millis(50)).await);
        assert_eq!(s.asked(), dlts, "asked to follow it");
        s.set_read_through(Instant::now(), followed());
        assert!(s.is_current_for(&dlts));
        let old = Instant::now() - MAX_STALE - Duration::from_millis(1);
        s.set_read_through(old, followed());
        assert!(!s.is_current_for(&dlts), "a follower that stopped reading");
        let (s2, d2) = (s.clone(), dlts.clone());
        let waiter =
            tokio::spawn(async move { s2.wait_current_for(&d2, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.set_read_through(Instant::now(), followed());
        assert!(waiter.await.expect("waiter"));
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
