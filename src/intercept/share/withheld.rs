//! What the proxy withholds from share consumers, kept acquired by
//! renewing its locks (KIP-1222 RENEW) until it can be judged, then
//! released so that the broker delivers it again.
//!
//! A record the proxy cannot decide now (its diversion not acknowledged,
//! its DLTs not read back, a registry or a breaker) leaves the member's
//! acquired ranges with no acknowledgement. Left alone its lock expires,
//! the broker delivers it again and counts a delivery; past the group's
//! delivery limit it archives it, though no client got it and it is in no
//! DLT of antidote's. So each withheld range is written here, by share
//! session, with its lock's expiry. Before the client's next request of
//! that session the proxy takes what is due (`due`): ranges whose lock
//! runs out within half a lock duration are renewed, ranges whose reason
//! has cleared (or that were renewed `max_renewals` times) are released;
//! `renew` sends both in a ShareAcknowledge of the proxy's own, in the
//! member's session. Released, a record is delivered again and judged
//! again: one delivery more per outage, not one per lock duration.
//!
//! Bounded by bytes (`share_groups.withheld_budget`): past it a range is
//! not kept (its lock brings it back, as without renewals). Every
//! operation's work is proportional to the entries it inserts, takes or
//! expires: entries whose lock ran out leave in deadline order. What is
//! dropped without a renewal or a release is counted by reason
//! (`antidote_share_renew_fallbacks_total`); its records come back when
//! their locks expire, as they would without this book.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::SessionKey;
use crate::metrics::ShareSeen;
use crate::plan::share::Span;

/// One withheld range of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub topic_id: Uuid,
    pub partition: i32,
    pub span: Span,
    /// Why it was withheld (`antidote_share_withheld_records_total`).
    pub reason: &'static str,
    /// The group's acquisition lock duration.
    pub lock: Duration,
    /// When its lock runs out (at the latest renewal the proxy sent).
    pub expires: Instant,
    /// Renewals sent so far.
    pub renewals: u32,
}

/// Withheld spans of one partition, each with its reason.
pub type Reasoned = Vec<(Span, &'static str)>;

/// What one entry costs, for the budget (the entry and its queue place).
const ENTRY_BYTES: usize = std::mem::size_of::<Held>() + 48;

/// The rules `due` applies.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Renewals of one range before it is released all the same.
    pub max_renewals: u32,
}

/// What is due in one session: ranges to renew and ranges to release, each
/// with the id it has in the book until the broker answers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    pub renew: Vec<(u64, Held)>,
    pub release: Vec<Held>,
}

impl Due {
    pub fn is_empty(&self) -> bool {
        self.renew.is_empty() && self.release.is_empty()
    }
}

/// Withheld ranges, by share session.
pub struct Withheld {
    inner: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    sessions: HashMap<SessionKey, Session>,
    /// Every entry under its lock's expiry: the expiry queue.
    deadlines: BTreeMap<(Instant, u64), SessionKey>,
    next_id: u64,
    ranges: usize,
    bytes: usize,
    budget: usize,
    /// Counts the gauges' readings, so that a later reading reported
    /// first is not overwritten by an earlier one.
    reading: u64,
}

/// One session's entries, with what lets `due` skip them all: the
/// (topic, reason) pairs they were withheld for and the earliest instant
/// one of them is due for renewal.
#[derive(Default)]
struct Session {
    entries: BTreeMap<u64, Held>,
    reasons: HashMap<(Uuid, &'static str), usize>,
    next_due: Option<Instant>,
}

impl Session {
    fn add(&mut self, id: u64, held: Held) {
        let renew_at = held.expires - held.lock / 2;
        self.next_due = Some(self.next_due.map_or(renew_at, |d| d.min(renew_at)));
        *self
            .reasons
            .entry((held.topic_id, held.reason))
            .or_default() += 1;
        self.entries.insert(id, held);
    }

    fn take(&mut self, id: u64) -> Option<Held> {
        let held = self.entries.remove(&id)?;
        let key = (held.topic_id, held.reason);
        if let Some(n) = self.reasons.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.reasons.remove(&key);
            }
        }
        Some(held)
    }

    /// Whether `due` would find nothing at `now` without looking at every
    /// entry.
    fn quiet(&self, now: Instant, cleared: &dyn Fn(Uuid, &'static str) -> bool) -> bool {
        self.next_due.is_some_and(|d| now < d) && !self.reasons.keys().any(|&(t, r)| cleared(t, r))
    }
}

impl Default for Withheld {
    fn default() -> Self {
        Withheld::new(crate::config::DEFAULT_WITHHELD_BUDGET)
    }
}

impl Withheld {
    /// A book that keeps at most `budget` bytes of withheld ranges.
    pub fn new(budget: usize) -> Self {
        Withheld {
            inner: Mutex::new(Book {
                budget,
                ..Book::default()
            }),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `spans` of one partition were withheld from `session`'s member in a
    /// response that arrived at `arrived` with locks of `lock_ms`. A range
    /// the book had for the same offsets is replaced (its lock ran out and
    /// the record came back). Returns how many ranges could not be kept.
    pub fn withhold(
        &self,
        session: &SessionKey,
        (topic_id, partition): (Uuid, i32),
        spans: &[(Span, &'static str)],
        arrived: Instant,
        lock_ms: i32,
        seen: &mut ShareSeen,
    ) -> u64 {
        let lock = Duration::from_millis(u64::try_from(lock_ms).unwrap_or(0));
        if spans.is_empty() || lock.is_zero() {
            return 0;
        }
        let mut book = self.book();
        book.expire(Instant::now(), seen);
        book.drop_overlapping(session, (topic_id, partition), spans);
        let mut dropped = 0;
        for (span, reason) in disjoint(spans) {
            let held = Held {
                topic_id,
                partition,
                span,
                reason,
                lock,
                expires: arrived + lock,
                renewals: 0,
            };
            if !book.insert(session, held) {
                dropped += 1;
            }
        }
        book.publish(seen);
        seen.fallback("budget", dropped);
        dropped
    }

    /// What is due in `session` before a request sent at `now`: ranges
    /// whose reason `cleared` says has cleared, or renewed `max_renewals`
    /// times, leave the book to be released; ranges whose lock runs out
    /// within half a lock duration are renewed (their expiry moves to
    /// `now` + lock, which the broker's renewal can only exceed). Ranges
    /// whose lock has run out leave, counted.
    pub fn due(
        &self,
        session: &SessionKey,
        now: Instant,
        rules: Rules,
        cleared: &dyn Fn(Uuid, &'static str) -> bool,
        seen: &mut ShareSeen,
    ) -> Due {
        let mut book = self.book();
        book.expire(now, seen);
        let Some(s) = book.sessions.get_mut(session) else {
            return Due::default();
        };
        if s.quiet(now, cleared) {
            return Due::default();
        }
        let mut due = Due::default();
        let mut moved = Vec::new();
        let mut gone = Vec::new();
        let mut next_due: Option<Instant> = None;
        for (&id, h) in s.entries.iter_mut() {
            let renew_at = h.expires - h.lock / 2;
            let spent = now >= renew_at && h.renewals >= rules.max_renewals;
            if cleared(h.topic_id, h.reason) || spent {
                gone.push(id);
                if spent && !cleared(h.topic_id, h.reason) {
                    seen.fallback("renewals_spent", 1);
                }
                continue;
            }
            if now >= renew_at {
                moved.push((id, h.expires, now + h.lock));
                h.expires = now + h.lock;
                h.renewals += 1;
                due.renew.push((id, h.clone()));
            }
            let at = h.expires - h.lock / 2;
            next_due = Some(next_due.map_or(at, |d| d.min(at)));
        }
        s.next_due = next_due;
        for (id, old, new) in moved {
            book.deadlines.remove(&(old, id));
            book.deadlines.insert((new, id), session.clone());
        }
        for id in gone {
            if let Some(h) = book.remove(session, id) {
                due.release.push(h);
            }
        }
        book.publish(seen);
        due
    }

    /// The broker refused the renewal of entries `ids` of `session` (or the
    /// request failed whole): they leave the book, counted; their records
    /// come back when their locks expire.
    pub fn refused(&self, session: &SessionKey, ids: &[u64], seen: &mut ShareSeen) {
        let mut book = self.book();
        let n = ids
            .iter()
            .filter(|&&id| book.remove(session, id).is_some())
            .count();
        book.publish(seen);
        seen.fallback("refused", n as u64);
    }

    /// The broker answered a renewal with the group's lock duration
    /// `lock_ms`, `sent` being when the renewal left: the renewed entries
    /// `ids` of `session` expire `lock_ms` after `sent` (if that differs).
    pub fn renewed(&self, session: &SessionKey, ids: &[u64], sent: Instant, lock_ms: i32) {
        let Ok(ms) = u64::try_from(lock_ms) else {
            return;
        };
        if ms == 0 {
            return;
        }
        let lock = Duration::from_millis(ms);
        let mut book = self.book();
        for &id in ids {
            let Some(h) = (book.sessions.get_mut(session)).and_then(|s| s.entries.get_mut(&id))
            else {
                continue;
            };
            if h.lock == lock {
                continue;
            }
            let old = h.expires;
            h.lock = lock;
            h.expires = sent + lock;
            let new = h.expires;
            book.deadlines.remove(&(old, id));
            book.deadlines.insert((new, id), session.clone());
        }
    }

    /// `session` is over (a new one at epoch 0 or a close, or its
    /// connection closed): the broker released what its member held, so
    /// nothing of it is renewed any more. Counted as `reason`.
    pub fn forget(&self, session: &SessionKey, reason: &'static str, seen: &mut ShareSeen) {
        let mut book = self.book();
        let ids: Vec<u64> = book
            .sessions
            .get(session)
            .map(|s| s.entries.keys().copied().collect())
            .unwrap_or_default();
        for &id in &ids {
            book.remove(session, id);
        }
        book.publish(seen);
        seen.fallback(reason, ids.len() as u64);
    }

    /// Whether `session` has anything withheld.
    pub fn has(&self, session: &SessionKey) -> bool {
        self.book().sessions.contains_key(session)
    }

    /// Withheld ranges kept, over all sessions.
    pub fn ranges(&self) -> usize {
        self.book().ranges
    }

    /// Bytes of the budget in use.
    pub fn bytes(&self) -> usize {
        self.book().bytes
    }
}

impl Book {
    /// Add `held`; false if the budget has no room for it.
    fn insert(&mut self, session: &SessionKey, held: Held) -> bool {
        let key_bytes = if self.sessions.contains_key(session) {
            0
        } else {
            session_bytes(session)
        };
        if self.bytes + ENTRY_BYTES + key_bytes > self.budget {
            return false;
        }
        self.bytes += ENTRY_BYTES + key_bytes;
        self.ranges += 1;
        self.next_id += 1;
        let id = self.next_id;
        self.deadlines.insert((held.expires, id), session.clone());
        let s = self.sessions.entry(session.clone()).or_default();
        s.add(id, held);
        true
    }

    /// Remove entry `id` of `session`, if it is there.
    fn remove(&mut self, session: &SessionKey, id: u64) -> Option<Held> {
        let s = self.sessions.get_mut(session)?;
        let h = s.take(id)?;
        let empty = s.entries.is_empty();
        self.deadlines.remove(&(h.expires, id));
        self.bytes = self.bytes.saturating_sub(ENTRY_BYTES);
        self.ranges -= 1;
        if empty {
            self.sessions.remove(session);
            self.bytes = self.bytes.saturating_sub(session_bytes(session));
        }
        Some(h)
    }

    /// Remove what `session` has for the offsets of `spans` in the
    /// partition: those records came back, so the old ranges are stale.
    fn drop_overlapping(
        &mut self,
        session: &SessionKey,
        at: (Uuid, i32),
        spans: &[(Span, &'static str)],
    ) {
        let Some(entries) = self.sessions.get(session) else {
            return;
        };
        let stale: Vec<u64> = entries
            .entries
            .iter()
            .filter(|(_, h)| {
                (h.topic_id, h.partition) == at
                    && spans
                        .iter()
                        .any(|&(s, _)| s.0 <= h.span.1 && h.span.0 <= s.1)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            self.remove(session, id);
        }
    }

    /// Drop every entry whose lock has run out by `now`, in deadline order:
    /// the broker has released its records (they come back by themselves).
    fn expire(&mut self, now: Instant, seen: &mut ShareSeen) {
        let mut n = 0;
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, id), session) = entry.remove_entry();
            self.remove(&session, id);
            n += 1;
        }
        seen.fallback("expired", n);
    }

    /// The gauges: ranges and bytes kept, read now (under the lock).
    fn publish(&mut self, seen: &mut ShareSeen) {
        self.reading += 1;
        seen.kept(self.reading, self.ranges, self.bytes);
    }
}

/// `spans` sorted, each offset in one only (the first that names it): one
/// ShareAcknowledge may name an offset once.
fn disjoint(spans: &[(Span, &'static str)]) -> Vec<(Span, &'static str)> {
    let mut sorted = spans.to_vec();
    sorted.sort_unstable_by_key(|&((first, last), _)| (first, last));
    let mut out: Vec<(Span, &'static str)> = Vec::with_capacity(sorted.len());
    for ((first, last), reason) in sorted {
        let first = match out.last() {
            Some(&((_, end), _)) if end >= last => continue,
            Some(&((_, end), _)) if end >= first => end + 1,
            _ => first,
        };
        out.push(((first, last), reason));
    }
    out
}

/// What a session's key costs, for the budget.
fn session_bytes(session: &SessionKey) -> usize {
    session.group.len() + session.member.len() + 64
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Uuid = Uuid::from_u128(7);
    const LOCK_MS: i32 = 4000;
    const LOCK: Duration = Duration::from_millis(4000);

    fn key(member: &str) -> SessionKey {
        SessionKey {
            node: 1,
            group: "g".into(),
            member: member.into(),
        }
    }

    fn never(_: Uuid, _: &'static str) -> bool {
        false
    }

    const RULES: Rules = Rules { max_renewals: 3 };

    fn spans(due: &[(u64, Held)]) -> Vec<Span> {
        due.iter().map(|(_, h)| h.span).collect()
    }

    #[test]
    fn a_range_is_renewed_once_its_lock_nears_its_end_and_not_before() {
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        book.withhold(&key("a"), (T, 0), &[((5, 9), "dlt")], t0, LOCK_MS, seen);
        // More than half the lock left: nothing due.
        assert!(book
            .due(&key("a"), t0 + LOCK / 4, RULES, &never, seen)
            .is_empty());
        let at = t0 + LOCK / 2;
        let due = book.due(&key("a"), at, RULES, &never, seen);
        assert_eq!(spans(&due.renew), [(5, 9)]);
        assert_eq!(due.renew[0].1.expires, at + LOCK, "renewed from now");
        assert_eq!(due.renew[0].1.renewals, 1);
        // Renewed: not due again until half of the new lock has passed.
        assert!(book
            .due(&key("a"), at + LOCK / 4, RULES, &never, seen)
            .is_empty());
        assert_eq!(
            spans(
                &book
                    .due(&key("a"), at + LOCK / 2, RULES, &never, seen)
                    .renew
            ),
            [(5, 9)]
        );
        // Another session has nothing.
        assert!(book
            .due(&key("b"), at + LOCK, RULES, &never, seen)
            .is_empty());
    }

    #[test]
    fn a_cleared_reason_releases_at_once_and_spent_renewals_release_all_the_same() {
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        let spans_ = [((1, 1), "not_loaded"), ((3, 4), "dlt")];
        book.withhold(&key("a"), (T, 0), &spans_, t0, LOCK_MS, seen);
        let loaded = |_: Uuid, r: &'static str| r == "not_loaded";
        let due = book.due(&key("a"), t0, RULES, &loaded, seen);
        let released: Vec<Span> = due.release.iter().map(|h| h.span).collect();
        assert_eq!((released, due.renew.len()), (vec![(1, 1)], 0));
        assert_eq!(book.ranges(), 1);
        // The DLT write's range: renewed RULES.max_renewals times, then released.
        let mut now = t0;
        for n in 1..=RULES.max_renewals {
            now += LOCK / 2;
            let due = book.due(&key("a"), now, RULES, &never, seen);
            assert_eq!((due.renew.len(), due.release.len()), (1, 0), "renewal {n}");
        }
        now += LOCK / 2;
        let due = book.due(&key("a"), now, RULES, &never, seen);
        assert_eq!((due.renew.len(), due.release.len()), (0, 1));
        assert_eq!(
            (book.ranges(), book.bytes(), book.has(&key("a"))),
            (0, 0, false)
        );
    }

    #[test]
    fn ranges_whose_lock_ran_out_leave_by_deadline_and_refused_ones_leave_at_once() {
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        book.withhold(&key("a"), (T, 0), &[((1, 1), "dlt")], t0, LOCK_MS, seen);
        book.withhold(
            &key("b"),
            (T, 1),
            &[((2, 2), "dlt"), ((4, 4), "dlt")],
            t0,
            LOCK_MS,
            seen,
        );
        // Nobody asked in time: the lock ran out, the broker released them.
        assert!(book
            .due(&key("a"), t0 + LOCK, RULES, &never, seen)
            .is_empty());
        assert_eq!(book.ranges(), 0);
        book.withhold(
            &key("b"),
            (T, 1),
            &[((2, 2), "dlt"), ((4, 4), "dlt")],
            t0,
            LOCK_MS,
            seen,
        );
        let due = book.due(&key("b"), t0 + LOCK / 2, RULES, &never, seen);
        let ids: Vec<u64> = due.renew.iter().map(|(id, _)| *id).collect();
        book.refused(&key("b"), &ids[..1], seen);
        assert_eq!(book.ranges(), 1);
        book.forget(&key("b"), "member_gone", seen);
        assert_eq!((book.ranges(), book.bytes()), (0, 0));
    }

    #[test]
    fn a_record_withheld_again_replaces_its_old_range_and_one_offset_is_named_once() {
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        book.withhold(&key("a"), (T, 0), &[((0, 9), "dlt")], t0, LOCK_MS, seen);
        // Part of it came back (the old lock ran out) and is withheld again,
        // with overlapping reasons in one response.
        let again = [((5, 7), "transient"), ((6, 12), "held"), ((8, 8), "dlt")];
        book.withhold(&key("a"), (T, 0), &again, t0 + LOCK, LOCK_MS, seen);
        let due = book.due(&key("a"), t0 + LOCK + LOCK / 2, RULES, &never, seen);
        assert_eq!(spans(&due.renew), [(5, 7), (8, 12)]);
        let reasons: Vec<&str> = due.renew.iter().map(|(_, h)| h.reason).collect();
        assert_eq!(reasons, ["transient", "held"]);
    }

    #[test]
    fn the_budget_bounds_the_bytes_over_all_sessions() {
        let budget = 16 * 1024;
        let book = Withheld::new(budget);
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        let mut dropped = 0;
        for m in 0..1000 {
            let spans: Vec<(Span, &str)> = (0..10).map(|o| ((o * 2, o * 2), "dlt")).collect();
            dropped += book.withhold(&key(&m.to_string()), (T, 0), &spans, t0, LOCK_MS, seen);
        }
        assert!(book.bytes() <= budget, "{} bytes", book.bytes());
        assert_eq!(dropped as usize + book.ranges(), 10_000);
        assert!(book.ranges() > 0);
    }

    #[test]
    fn the_brokers_lock_duration_moves_the_expiry_of_renewed_ranges() {
        let book = Withheld::default();
        let seen = &mut ShareSeen::default();
        let t0 = Instant::now();
        book.withhold(&key("a"), (T, 0), &[((1, 1), "dlt")], t0, LOCK_MS, seen);
        let sent = t0 + LOCK / 2;
        let due = book.due(&key("a"), sent, RULES, &never, seen);
        book.renewed(&key("a"), &[due.renew[0].0], sent, 10_000);
        // With a 10 s lock, half of it is 5 s: not due 4 s after the renewal.
        let four = sent + Duration::from_secs(4);
        assert!(book.due(&key("a"), four, RULES, &never, seen).is_empty());
        let due = book.due(
            &key("a"),
            sent + Duration::from_secs(5),
            RULES,
            &never,
            seen,
        );
        assert_eq!(due.renew.len(), 1);
    }
}
