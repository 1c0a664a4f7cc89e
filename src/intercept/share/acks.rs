//! The proxy's own acknowledgements for share consumers, waiting for the
//! client's next ShareFetch or ShareAcknowledge of the same share session.
//!
//! A record the proxy removed from a ShareFetch response for good (diverted
//! and acknowledged by its DLT, in it already, or dropped) stays acquired by
//! the member until someone acknowledges it. The proxy does, in the client's
//! own next request of that session (same broker, group and member), so the
//! session epoch stays the client's: the wire module merges them into the
//! request. An acknowledgement whose acquisition lock has expired by then is
//! dropped: the broker has released that record, and its next delivery is
//! judged again (the ledger knows it is in its DLT; it is removed and
//! acknowledged again).
//!
//! Kept as ranges (first, last, type), as on the wire: a compressed batch
//! of a million tiny poison records is one entry. Bounded by bytes
//! (`share_groups.owed_acks_budget`): past it, new acknowledgements are not
//! kept (their records come back when their locks expire and are settled
//! then). Every operation's work is proportional to the entries it
//! inserts, takes or expires: expired entries leave in deadline order,
//! never by a scan of everything waiting.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::SessionKey;
use crate::plan::share::Span;

/// Acknowledgements the proxy owes for one range of offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owed {
    pub topic_id: Uuid,
    pub partition: i32,
    /// The offsets, `first..=last`.
    pub span: Span,
    /// The acknowledge type (`plan::share::REJECT` or `ACCEPT`).
    pub ack: i8,
    /// The acquisition lock runs out (with a margin) at this instant.
    pub expires: Instant,
}

/// What one waiting entry costs, for the budget.
const ENTRY_BYTES: usize = std::mem::size_of::<Owed>();

/// Acknowledgements waiting, by session; and what the proxy withheld and
/// keeps acquired by renewing its locks (`withheld`).
pub struct ShareAcks {
    inner: Mutex<Book>,
    pub withheld: super::withheld::Withheld,
}

#[derive(Default)]
struct Book {
    sessions: HashMap<SessionKey, Vec<Owed>>,
    /// Per session, its entries' latest deadline under a sequence number:
    /// the expiry queue. An entry here whose session was taken since, or
    /// whose deadline moved later, is skipped when it comes up.
    deadlines: BTreeMap<(Instant, u64), SessionKey>,
    /// Each session's place in `deadlines`.
    queued: HashMap<SessionKey, (Instant, u64)>,
    seq: u64,
    bytes: usize,
    budget: usize,
}

impl Default for ShareAcks {
    fn default() -> Self {
        ShareAcks::new(crate::config::DEFAULT_OWED_ACKS_BUDGET)
    }
}

/// When an acknowledgement sent now still finds its lock held: the
/// response's lock duration less a margin for the client's think time
/// before its next request reaches the broker (a quarter, at most 5 s).
/// `arrived` is when the response arrived from the broker: the lock runs
/// from the broker's answer, not from when the proxy is done with it.
pub fn lock_deadline(arrived: Instant, lock_timeout_ms: i32) -> Instant {
    let lock = Duration::from_millis(u64::try_from(lock_timeout_ms).unwrap_or(0));
    let margin = (lock / 4).min(Duration::from_secs(5));
    arrived + lock.saturating_sub(margin)
}

impl ShareAcks {
    /// A book that keeps at most `budget` bytes of acknowledgements.
    pub fn new(budget: usize) -> Self {
        ShareAcks {
            inner: Mutex::new(Book {
                budget,
                ..Book::default()
            }),
            withheld: Default::default(),
        }
    }

    /// The books `share_groups` asks for.
    pub fn of(config: &crate::config::ShareGroups) -> Self {
        ShareAcks {
            withheld: super::withheld::Withheld::new(config.withheld_budget),
            ..ShareAcks::new(config.owed_acks_budget)
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Owe `owed` in `key`'s session. Returns how many offsets could not be
    /// kept (the budget is spent).
    pub fn owe(&self, key: &SessionKey, owed: impl IntoIterator<Item = Owed>) -> u64 {
        let mut book = self.book();
        let now = Instant::now();
        book.expire(now);
        let mut dropped = 0u64;
        let mut latest = None;
        let mut fresh = Vec::new();
        for o in owed {
            if o.expires <= now {
                continue; // its lock is gone already: nothing to owe
            }
            let key_bytes = if book.sessions.contains_key(key) || !fresh.is_empty() {
                0
            } else {
                key.group.len() + key.member.len() + ENTRY_BYTES
            };
            if book.bytes + ENTRY_BYTES + key_bytes > book.budget {
                dropped = dropped.saturating_add(crate::plan::share::count(&[o.span]));
                continue;
            }
            book.bytes += ENTRY_BYTES + key_bytes;
            latest = latest.max(Some(o.expires));
            fresh.push(o);
        }
        if let Some(latest) = latest {
            book.sessions.entry(key.clone()).or_default().extend(fresh);
            book.queue(key, latest);
        }
        dropped
    }

    /// Everything `key`'s session is owed whose lock still holds at `now`
    /// (the rest is forgotten: those records come back by themselves).
    pub fn take(&self, key: &SessionKey, now: Instant) -> Vec<Owed> {
        let mut book = self.book();
        let mut owed = book.remove(key);
        owed.retain(|o| o.expires > now);
        owed
    }

    /// A new session replaced `key`'s (epoch 0): the broker released what
    /// the old one held, so nothing is owed for it any more.
    pub fn forget(&self, key: &SessionKey) {
        self.book().remove(key);
    }

    /// Acknowledgement entries waiting (ranges), over all sessions.
    pub fn waiting(&self) -> usize {
        self.book().sessions.values().map(Vec::len).sum()
    }

    /// Bytes of the budget in use.
    pub fn bytes(&self) -> usize {
        self.book().bytes
    }
}

impl Book {
    /// Remove `key`'s session and what it counted against the budget.
    fn remove(&mut self, key: &SessionKey) -> Vec<Owed> {
        if let Some(at) = self.queued.remove(key) {
            self.deadlines.remove(&at);
        }
        let owed = self.sessions.remove(key).unwrap_or_default();
        if !owed.is_empty() {
            let cost = owed.len() * ENTRY_BYTES + key.group.len() + key.member.len() + ENTRY_BYTES;
            self.bytes = self.bytes.saturating_sub(cost);
        }
        owed
    }

    /// Put `key` in the expiry queue at its latest deadline.
    fn queue(&mut self, key: &SessionKey, latest: Instant) {
        if let Some(&at) = self.queued.get(key) {
            if at.0 >= latest {
                return;
            }
            self.deadlines.remove(&at);
        }
        self.seq += 1;
        let at = (latest, self.seq);
        self.deadlines.insert(at, key.clone());
        self.queued.insert(key.clone(), at);
    }

    /// Drop every session whose latest deadline has passed: all its
    /// entries are expired. (A session still waiting keeps its expired
    /// entries until it is taken or expires whole; they count against the
    /// budget meanwhile, never past it.)
    fn expire(&mut self, now: Instant) {
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.queued.remove(&key);
            if let Some(owed) = self.sessions.remove(&key) {
                let cost =
                    owed.len() * ENTRY_BYTES + key.group.len() + key.member.len() + ENTRY_BYTES;
                self.bytes = self.bytes.saturating_sub(cost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(member: &str) -> SessionKey {
        SessionKey {
            node: 1,
            group: "g".into(),
            member: member.into(),
        }
    }

    fn owed(span: Span, expires: Instant) -> Owed {
        Owed {
            topic_id: Uuid::from_u128(7),
            partition: 0,
            span,
            ack: crate::plan::share::REJECT,
            expires,
        }
    }

    fn spans(owed: &[Owed]) -> Vec<Span> {
        owed.iter().map(|o| o.span).collect()
    }

    #[test]
    fn owed_acks_go_to_their_session_once_and_expired_ones_are_forgotten() {
        let book = ShareAcks::default();
        let now = Instant::now();
        let later = now + Duration::from_secs(30);
        let soon = now + Duration::from_millis(50);
        book.owe(&key("a"), [owed((1, 1), later), owed((2, 2), soon)]);
        book.owe(&key("b"), [owed((9, 9), later)]);
        assert_eq!(book.waiting(), 3);
        let got = book.take(&key("a"), soon + Duration::from_millis(1));
        assert_eq!(spans(&got), [(1, 1)]);
        assert!(book.take(&key("a"), now).is_empty(), "taken once");
        book.forget(&key("b"));
        assert_eq!((book.waiting(), book.bytes()), (0, 0));
    }

    #[test]
    fn a_million_offsets_in_one_range_are_one_entry() {
        let book = ShareAcks::new(1024);
        let later = Instant::now() + Duration::from_secs(30);
        let dropped = book.owe(&key("a"), [owed((0, 999_999), later)]);
        assert_eq!((dropped, book.waiting()), (0, 1));
        assert_eq!(spans(&book.take(&key("a"), Instant::now())), [(0, 999_999)]);
    }

    #[test]
    fn the_budget_bounds_the_bytes_over_all_sessions() {
        let budget = 64 * 1024;
        let book = ShareAcks::new(budget);
        // Far enough that no entry expires while ten million are offered
        // (a debug build on a loaded CI machine took over 30 s).
        let later = Instant::now() + Duration::from_secs(3600);
        let mut dropped = 0;
        // Ten thousand members that never come back, each owed a thousand
        // separate offsets.
        for m in 0..10_000 {
            let owed = (0..1000).map(|o| owed((o * 2, o * 2), later));
            dropped += book.owe(&key(&m.to_string()), owed);
        }
        assert!(book.bytes() <= budget, "{} bytes", book.bytes());
        assert!(book.waiting() * ENTRY_BYTES <= budget);
        assert_eq!(dropped as usize + book.waiting(), 10_000 * 1000);
        // Taking a session gives its bytes back.
        let before = book.bytes();
        let got = book.take(&key("0"), Instant::now());
        assert!(!got.is_empty());
        assert!(book.bytes() < before);
    }

    #[test]
    fn sessions_whose_locks_all_expired_leave_by_deadline_and_free_the_budget() {
        let book = ShareAcks::new(4 * 1024);
        let now = Instant::now();
        let soon = now + Duration::from_millis(20);
        for m in 0..20 {
            book.owe(&key(&m.to_string()), [owed((m, m), soon)]);
        }
        assert!(book.waiting() > 0);
        std::thread::sleep(Duration::from_millis(30));
        // The next owe expires what is due, whatever the session.
        let later = Instant::now() + Duration::from_secs(30);
        assert_eq!(book.owe(&key("new"), [owed((0, 0), later)]), 0);
        assert_eq!(book.waiting(), 1);
        // Already expired when owed: not kept at all.
        book.owe(&key("x"), [owed((5, 5), now)]);
        assert_eq!(book.waiting(), 1);
    }

    #[test]
    fn the_lock_deadline_keeps_a_margin() {
        let now = Instant::now();
        assert_eq!(
            lock_deadline(now, 30_000),
            now + Duration::from_millis(25_000)
        );
        assert_eq!(
            lock_deadline(now, 4_000),
            now + Duration::from_millis(3_000)
        );
        assert_eq!(lock_deadline(now, -1), now);
    }
}
