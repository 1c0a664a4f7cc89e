//! The ledger: which origin records are in a dead-letter topic already, which
//! are being written, which DLTs have been read back into it, and the topic
//! id each origin topic had when its entries were recorded.
//!
//! Memory is the point of this module's shape: entries never expire, so an
//! entry costs about 4 bytes (a sorted `u32` list per origin partition and
//! 2^32-offset window), not a map node with a topic name. Only writes under
//! way (a few at a time) live in a hash map. Pure data: no I/O; it is
//! read back from the DLTs by [`rebuild`] and kept in step by [`tail`].

pub(crate) mod rebuild;
pub(crate) mod tail;

use std::collections::BTreeMap;
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use tokio::sync::watch;
use uuid::Uuid;

/// (original topic, partition, offset).
pub type LedgerKey = (Arc<str>, i32, i64);

/// A set of offsets of one partition: offsets are grouped by their high 32
/// bits into sorted lists of their low 32 bits. Diversions arrive in offset
/// order almost always (one producer, writes sorted by origin), so an
/// insert is an append; an out-of-order one costs a shift of its window.
#[derive(Debug, Default, Clone)]
pub struct OffsetSet {
    windows: BTreeMap<i64, Vec<u32>>,
    len: usize,
}

fn split(offset: i64) -> (i64, u32) {
    (offset >> 32, (offset & 0xffff_ffff) as u32)
}

fn join(hi: i64, lo: u32) -> i64 {
    (hi << 32) | i64::from(lo)
}

impl OffsetSet {
    /// Add `offset`; false if it was there already.
    pub fn insert(&mut self, offset: i64) -> bool {
        let (hi, lo) = split(offset);
        let w = self.windows.entry(hi).or_default();
        match w.last() {
            None => w.push(lo),
            Some(&last) if last < lo => w.push(lo),
            _ => match w.binary_search(&lo) {
                Ok(_) => return false,
                Err(i) => w.insert(i, lo),
            },
        }
        self.len += 1;
        true
    }

    pub fn contains(&self, offset: i64) -> bool {
        let (hi, lo) = split(offset);
        self.windows
            .get(&hi)
            .is_some_and(|w| w.binary_search(&lo).is_ok())
    }

    /// Offsets in `from..to`, ascending.
    pub fn range(&self, from: i64, to: i64) -> Vec<i64> {
        let mut out = Vec::new();
        if from >= to {
            return out;
        }
        let ((from_hi, _), (to_hi, _)) = (split(from), split(to - 1));
        for (&hi, w) in self.windows.range(from_hi..=to_hi) {
            let start = w.partition_point(|&lo| join(hi, lo) < from);
            out.extend(
                w[start..]
                    .iter()
                    .map(|&lo| join(hi, lo))
                    .take_while(|&o| o < to),
            );
        }
        out
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Give back the growth slack of the lists (after a rebuild).
    pub fn shrink(&mut self) {
        self.windows.values_mut().for_each(Vec::shrink_to_fit);
    }

    /// Heap bytes held by the lists (their capacity), for measurements.
    pub fn list_bytes(&self) -> usize {
        self.windows.values().map(|w| w.capacity() * 4).sum()
    }
}

/// Every record diverted (or being diverted), by origin coordinates.
#[derive(Default)]
pub struct Ledger {
    /// Writes under way; resolve to Some(true) on success, Some(false) on failure.
    in_flight: DashMap<LedgerKey, watch::Receiver<Option<bool>>>,
    /// Offsets in a DLT, per origin (topic, partition).
    done: DashMap<(Arc<str>, i32), OffsetSet>,
    /// The id each origin topic had when its entries were recorded.
    topic_ids: DashMap<Arc<str>, Uuid>,
    /// DLTs read back into the ledger (true) or waiting to be (false).
    dlts: DashMap<String, bool>,
    /// Woken whenever a DLT has been read back.
    loads: tokio::sync::Notify,
    /// Per DLT partition, the offset read to (by the rebuild, then the tail).
    tail: DashMap<(String, i32), i64>,
}

/// What `Ledger::claim` found.
pub enum Claim {
    /// Already in its DLT.
    Done,
    /// Being written: wait on this.
    InFlight(watch::Receiver<Option<bool>>),
    /// Nobody is writing it: the caller must, and report through this.
    Mine(watch::Sender<Option<bool>>, watch::Receiver<Option<bool>>),
}

impl Ledger {
    /// Whether the record is in its DLT.
    pub fn contains(&self, key: &LedgerKey) -> bool {
        self.done
            .get(&(key.0.clone(), key.1))
            .is_some_and(|s| s.contains(key.2))
    }

    /// Join a write of `key`, or register a new one.
    pub fn claim(&self, key: LedgerKey) -> Claim {
        if self.contains(&key) {
            return Claim::Done;
        }
        match self.in_flight.entry(key) {
            Entry::Occupied(e) => Claim::InFlight(e.get().clone()),
            Entry::Vacant(v) => {
                // `finish` records the entry before it frees the slot, so
                // looking again while holding the slot cannot miss it.
                if self.contains(v.key()) {
                    return Claim::Done;
                }
                let (tx, rx) = watch::channel(None);
                v.insert(rx.clone());
                Claim::Mine(tx, rx)
            }
        }
    }

    /// A write of `key` ended: record it if it succeeded, free its slot
    /// either way (a failed one is tried again by the next fetch).
    pub fn finish(&self, key: &LedgerKey, ok: bool) {
        if ok {
            self.insert(key);
        }
        self.in_flight.remove(key);
    }

    /// Record that the origin record `key` is in a DLT.
    pub fn insert(&self, key: &LedgerKey) {
        self.done
            .entry((key.0.clone(), key.1))
            .or_default()
            .insert(key.2);
    }

    /// Record `key`, read from a DLT by the tail; true if it was new and no
    /// write of it by this instance is in flight (another instance diverted
    /// it). The tail can read this instance's own write between its
    /// acknowledgement and `finish`: that one is not another's. (Had another
    /// instance written it meanwhile, this instance's write is fenced and
    /// finds it there: `found_at_write` counts it then.)
    pub fn learn(&self, key: &LedgerKey) -> bool {
        let new = self
            .done
            .entry((key.0.clone(), key.1))
            .or_default()
            .insert(key.2);
        new && !self.in_flight.contains_key(key)
    }

    /// DLTs read back whole (the ones the tail follows).
    pub fn loaded_dlts(&self) -> Vec<String> {
        self.dlts
            .iter()
            .filter(|e| *e.value())
            .map(|e| e.key().clone())
            .collect()
    }

    /// Where the reading of DLT partition `key` stopped, if it was read.
    pub fn tail_position(&self, key: &(String, i32)) -> Option<i64> {
        self.tail.get(key).map(|r| *r)
    }

    pub fn set_tail_position(&self, key: (String, i32), offset: i64) {
        self.tail.insert(key, offset);
    }

    /// Offsets in `from..to` of `topic`/`partition` already in a DLT.
    pub fn diverted_in(&self, topic: &Arc<str>, partition: i32, from: i64, to: i64) -> Vec<i64> {
        if self.done.is_empty() || from >= to {
            return Vec::new();
        }
        match self.done.get(&(topic.clone(), partition)) {
            Some(set) => set.range(from, to),
            None => Vec::new(),
        }
    }

    /// Learn `topic`'s current id. A different id than the one its entries
    /// were recorded under means the topic was deleted and recreated: its
    /// entries name records that no longer exist, so they are dropped (else
    /// valid records at those offsets of the new topic would be hidden).
    pub fn observe_topic_id(&self, topic: &Arc<str>, id: Uuid) {
        if id.is_nil() || self.topic_ids.get(topic).is_some_and(|known| *known == id) {
            return;
        }
        let old = self.topic_ids.insert(topic.clone(), id);
        if old.is_some_and(|old| old != id) {
            self.done.retain(|(t, _), _| t != topic);
        }
    }

    /// The id `topic` had when its entries were recorded, if known.
    pub fn topic_id(&self, topic: &str) -> Option<Uuid> {
        self.topic_ids.get(topic).map(|r| *r)
    }

    /// Whether DLT `dlt` has been read back into the ledger.
    pub fn is_loaded(&self, dlt: &str) -> bool {
        self.dlts.get(dlt).is_some_and(|l| *l)
    }

    /// Note that `dlt` must be read; true if it was not known before.
    pub fn want(&self, dlt: &str) -> bool {
        if self.dlts.contains_key(dlt) {
            return false;
        }
        self.dlts.entry(dlt.to_string()).or_insert(false);
        true
    }

    /// `dlt` must be read again (its trusted origins changed).
    pub fn unload(&self, dlt: &str) {
        self.dlts.insert(dlt.to_string(), false);
    }

    /// `dlt` has been read back whole.
    pub fn loaded(&self, dlt: &str) {
        self.dlts.insert(dlt.to_string(), true);
        self.loads.notify_waiters();
    }

    /// Wait until `is_loaded(dlt)` for every DLT of `dlts`, or `deadline`;
    /// whether they all are.
    pub async fn wait_loaded(&self, dlts: &[String], deadline: tokio::time::Instant) -> bool {
        loop {
            let notified = self.loads.notified();
            tokio::pin!(notified);
            // Registered before looking, so a load in between is not missed.
            notified.as_mut().enable();
            if dlts.iter().all(|d| self.is_loaded(d)) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// DLTs still waiting to be read back.
    pub fn pending(&self) -> Vec<String> {
        self.dlts
            .iter()
            .filter(|e| !*e.value())
            .map(|e| e.key().clone())
            .collect()
    }

    /// Give back growth slack after a rebuild.
    pub fn shrink(&self) {
        self.done.iter_mut().for_each(|mut s| s.shrink());
    }

    /// Entries recorded, and heap bytes of their offset lists.
    pub fn footprint(&self) -> (usize, usize) {
        self.done
            .iter()
            .fold((0, 0), |(n, b), s| (n + s.len(), b + s.list_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_set_inserts_in_any_order_and_ranges() {
        let mut s = OffsetSet::default();
        for o in [5, 1, 9, 3, 1 << 33, (1 << 33) + 2, 0, 9] {
            s.insert(o);
        }
        assert_eq!(s.len(), 7);
        assert_eq!(s.range(0, 10), [0, 1, 3, 5, 9]);
        assert_eq!(s.range(2, 9), [3, 5]);
        assert_eq!(s.range(8, (1 << 33) + 2), [9, 1 << 33]);
        assert!(s.contains((1 << 33) + 2) && !s.contains(2));
        assert!(s.range(4, 4).is_empty());
    }

    #[test]
    fn a_claimed_write_is_joined_then_done() {
        let l = Ledger::default();
        let k: LedgerKey = (Arc::from("t"), 0, 7);
        let Claim::Mine(tx, _) = l.claim(k.clone()) else {
            panic!("first claim must be mine")
        };
        assert!(matches!(l.claim(k.clone()), Claim::InFlight(_)));
        l.finish(&k, true);
        let _ = tx.send(Some(true));
        assert!(matches!(l.claim(k.clone()), Claim::Done));
        assert_eq!(l.diverted_in(&k.0, 0, 0, 100), [7]);
    }

    #[test]
    fn a_failed_write_is_forgotten() {
        let l = Ledger::default();
        let k: LedgerKey = (Arc::from("t"), 0, 7);
        let _mine = l.claim(k.clone());
        l.finish(&k, false);
        assert!(matches!(l.claim(k), Claim::Mine(..)));
    }

    #[test]
    fn the_tail_reading_this_instances_own_write_before_it_finishes_learns_nothing_new() {
        let l = Ledger::default();
        let k: LedgerKey = (Arc::from("t"), 0, 7);
        let _mine = l.claim(k.clone());
        // Acknowledged, read back by the tail, then finished.
        assert!(!l.learn(&k));
        l.finish(&k, true);
        assert!(matches!(l.claim(k.clone()), Claim::Done));
        // Another instance's record, nothing in flight here: learned once.
        let other: LedgerKey = (Arc::from("t"), 0, 8);
        assert!(l.learn(&other));
        assert!(!l.learn(&other));
    }

    #[test]
    fn a_recreated_topic_loses_its_old_entries() {
        let l = Ledger::default();
        let t: Arc<str> = Arc::from("t");
        l.observe_topic_id(&t, Uuid::from_u128(1));
        l.insert(&(t.clone(), 0, 3));
        l.observe_topic_id(&t, Uuid::from_u128(1));
        assert_eq!(l.diverted_in(&t, 0, 0, 10), [3]);
        l.observe_topic_id(&t, Uuid::from_u128(2));
        assert!(l.diverted_in(&t, 0, 0, 10).is_empty());
    }

    fn rss_kb() -> usize {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    }

    /// The layout this module replaced (one map entry with an `Arc<str>`
    /// topic per diversion, plus a `BTreeSet` index), for comparison: RSS
    /// growth per diversion at 10 M diversions. Run alone (RSS is per
    /// process): `cargo test --lib measure_old_layout -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn measure_old_layout_bytes_per_diversion_at_10m() {
        #[allow(dead_code)]
        enum Slot {
            Done,
            InFlight(watch::Receiver<Option<bool>>),
        }
        let before = rss_kb();
        let slots: DashMap<LedgerKey, Slot> = DashMap::new();
        let index: DashMap<(Arc<str>, i32), std::collections::BTreeSet<i64>> = DashMap::new();
        let topic: Arc<str> = Arc::from("geofence.triggers");
        const N: i64 = 10_000_000;
        for i in 0..N {
            let (p, o) = ((i % 100) as i32, (i / 100) * 7);
            index.entry((topic.clone(), p)).or_default().insert(o);
            slots.insert((topic.clone(), p, o), Slot::Done);
        }
        let grown = rss_kb().saturating_sub(before);
        println!(
            "old ledger layout: {} diversions, RSS growth {grown} KiB = {:.1} B/diversion",
            slots.len(),
            grown as f64 * 1024.0 / N as f64
        );
    }

    /// Bytes per diversion at 10 M diversions (run alone, see above:
    /// `cargo test --lib measure_bytes_per_diversion -- --ignored --nocapture`):
    /// heap bytes of the offset lists and the process's RSS growth, over 100
    /// partitions with one diversion every 7 offsets.
    #[test]
    #[ignore]
    fn measure_bytes_per_diversion_at_10m() {
        let before = rss_kb();
        let l = Ledger::default();
        let topic: Arc<str> = Arc::from("geofence.triggers");
        const N: i64 = 10_000_000;
        for i in 0..N {
            l.insert(&(topic.clone(), (i % 100) as i32, (i / 100) * 7));
        }
        let grown = rss_kb().saturating_sub(before);
        l.shrink();
        let (n, bytes) = l.footprint();
        assert_eq!(n, N as usize);
        let after_shrink = rss_kb().saturating_sub(before);
        println!(
            "ledger: {n} diversions, offset lists {bytes} B = {:.2} B/diversion; \
             RSS growth {} KiB = {:.2} B/diversion ({} KiB = {:.2} B/diversion after shrink)",
            bytes as f64 / n as f64,
            grown,
            grown as f64 * 1024.0 / n as f64,
            after_shrink,
            after_shrink as f64 * 1024.0 / n as f64,
        );
        assert!(bytes as f64 / (n as f64) < 8.0);
    }
}
