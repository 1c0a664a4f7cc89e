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
//! Bounded: at most [`MAX_SESSIONS`] sessions and [`MAX_PER_SESSION`]
//! offsets each. Past that the new acknowledgements are not kept: their
//! records come back when their locks expire and are settled then.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// Sessions with acknowledgements waiting, at most.
pub const MAX_SESSIONS: usize = 10_000;
/// Offsets waiting per session, at most.
pub const MAX_PER_SESSION: usize = 100_000;

/// One share session, as the proxy can tell it: the broker the connection
/// leads to (its node id; -1 for a bootstrap connection), the group and the
/// member.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub node: i32,
    pub group: String,
    pub member: String,
}

/// One acknowledgement the proxy owes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owed {
    pub topic_id: Uuid,
    pub partition: i32,
    pub offset: i64,
    /// The acknowledge type (`plan::share::REJECT` or `ACCEPT`).
    pub ack: i8,
    /// The acquisition lock runs out (with a margin) at this instant.
    pub expires: Instant,
}

/// Acknowledgements waiting, by session.
#[derive(Default)]
pub struct ShareAcks {
    sessions: Mutex<HashMap<SessionKey, Vec<Owed>>>,
}

/// When an acknowledgement sent now still finds its lock held: the
/// response's lock duration less a margin for the client's think time
/// before its next request reaches the broker (a quarter, at most 5 s).
pub fn lock_deadline(now: Instant, lock_timeout_ms: i32) -> Instant {
    let lock = Duration::from_millis(u64::try_from(lock_timeout_ms).unwrap_or(0));
    let margin = (lock / 4).min(Duration::from_secs(5));
    now + lock.saturating_sub(margin)
}

impl ShareAcks {
    /// Owe `owed` in `key`'s session. Returns how many could not be kept
    /// (bounds reached).
    pub fn owe(&self, key: &SessionKey, owed: impl IntoIterator<Item = Owed>) -> usize {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if !sessions.contains_key(key) && sessions.len() >= MAX_SESSIONS {
            sessions.retain(|_, v| {
                v.retain(|o| o.expires > now);
                !v.is_empty()
            });
        }
        let mut dropped = 0;
        if !sessions.contains_key(key) && sessions.len() >= MAX_SESSIONS {
            return owed.into_iter().count();
        }
        let list = sessions.entry(key.clone()).or_default();
        for o in owed {
            if list.len() >= MAX_PER_SESSION {
                list.retain(|o| o.expires > now);
            }
            if list.len() >= MAX_PER_SESSION {
                dropped += 1;
                continue;
            }
            list.push(o);
        }
        dropped
    }

    /// Everything `key`'s session is owed whose lock still holds at `now`
    /// (the rest is forgotten: those records come back by themselves).
    pub fn take(&self, key: &SessionKey, now: Instant) -> Vec<Owed> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let mut owed = sessions.remove(key).unwrap_or_default();
        owed.retain(|o| o.expires > now);
        // Once per offset: a record delivered again is acknowledged once.
        owed.sort_by_key(|o| (o.topic_id, o.partition, o.offset));
        owed.dedup_by_key(|o| (o.topic_id, o.partition, o.offset));
        owed
    }

    /// A new session replaced `key`'s (epoch 0): the broker released what
    /// the old one held, so nothing is owed for it any more.
    pub fn forget(&self, key: &SessionKey) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.remove(key);
    }

    /// Acknowledgements waiting, over all sessions.
    pub fn waiting(&self) -> usize {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.values().map(Vec::len).sum()
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

    fn owed(offset: i64, expires: Instant) -> Owed {
        Owed {
            topic_id: Uuid::from_u128(7),
            partition: 0,
            offset,
            ack: crate::plan::share::REJECT,
            expires,
        }
    }

    #[test]
    fn owed_acks_go_to_their_session_once_and_expired_ones_are_forgotten() {
        let book = ShareAcks::default();
        let now = Instant::now();
        let later = now + Duration::from_secs(30);
        book.owe(&key("a"), [owed(1, later), owed(2, now), owed(1, later)]);
        book.owe(&key("b"), [owed(9, later)]);
        assert_eq!(book.waiting(), 4);
        let got = book.take(&key("a"), now + Duration::from_millis(1));
        assert_eq!(got.iter().map(|o| o.offset).collect::<Vec<_>>(), [1]);
        assert!(book.take(&key("a"), now).is_empty(), "taken once");
        book.forget(&key("b"));
        assert_eq!(book.waiting(), 0);
    }

    #[test]
    fn a_session_holds_a_bounded_number_of_acks() {
        let book = ShareAcks::default();
        let later = Instant::now() + Duration::from_secs(30);
        let dropped = book.owe(
            &key("a"),
            (0..MAX_PER_SESSION as i64 + 5).map(|o| owed(o, later)),
        );
        assert_eq!((dropped, book.waiting()), (5, MAX_PER_SESSION));
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
