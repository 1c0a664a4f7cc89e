//! The cap on client connections (`limits.max_connections`).
//!
//! Each client connection costs two sockets (it dials the broker at once)
//! and two frame buffers, so the number served at once is bounded by
//! configuration, not by traffic. Over the cap a connection is accepted and
//! closed at once (the listener's backlog must keep draining, or the kernel
//! would queue connections the proxy never serves), counted, and logged at
//! most once per `LOG_EVERY`, so a connection flood cannot flood the log.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// At most one warning about refused connections per this long.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Counts the connections served and the ones refused.
#[derive(Debug)]
pub struct ConnectionLimit {
    max: usize,
    open: Arc<AtomicUsize>,
    refused_since_log: AtomicU64,
    last_log: Mutex<Option<Instant>>,
}

/// One served connection; frees its place when dropped.
#[derive(Debug)]
pub struct Slot {
    open: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ConnectionLimit {
    pub fn new(max: u32) -> Self {
        ConnectionLimit {
            max: max as usize,
            open: Arc::new(AtomicUsize::new(0)),
            refused_since_log: AtomicU64::new(0),
            last_log: Mutex::new(None),
        }
    }

    /// A place for one more connection, or `None` at the cap.
    pub fn try_acquire(&self) -> Option<Slot> {
        let taken = self
            .open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            });
        taken.ok().map(|_| Slot {
            open: self.open.clone(),
        })
    }

    /// Connections served now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Count one refused connection; returns how many to report if a
    /// warning is due now (the first refusal, then at most one per
    /// `LOG_EVERY`), `None` otherwise.
    pub fn refused(&self, now: Instant) -> Option<u64> {
        self.refused_since_log.fetch_add(1, Ordering::SeqCst);
        let mut last = match self.last_log.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        if last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            return None;
        }
        *last = Some(now);
        Some(self.refused_since_log.swap(0, Ordering::SeqCst))
    }
}

/// File descriptors each served connection holds: the client's socket and
/// the broker connection dialled for it.
const FDS_PER_CONNECTION: u64 = 2;

/// Descriptors kept for listeners, the proxy's own connections and files.
const FDS_RESERVED: u64 = 128;

/// A warning when `max_connections` cannot be reached under the process's
/// open-file limit: accepts would then fail with EMFILE before the cap.
pub fn fd_limit_warning(max_connections: u32) -> Option<String> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    check_fd_limit(max_connections, soft_open_files(&limits)?)
}

fn check_fd_limit(max_connections: u32, soft: u64) -> Option<String> {
    let needed = u64::from(max_connections) * FDS_PER_CONNECTION + FDS_RESERVED;
    (needed > soft).then(|| {
        format!(
            "limits.max_connections {max_connections} needs about {needed} open files but the \
             limit is {soft}: raise it (ulimit -n) or lower limits.max_connections"
        )
    })
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text.
fn soft_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_beyond_the_open_file_limit_is_reported() {
        let text = "Limit                     Soft Limit           Hard Limit           Units\n\
                    Max open files            1024                 4096                 files\n";
        assert_eq!(soft_open_files(text), Some(1024));
        assert!(check_fd_limit(10_000, 1024).unwrap().contains("ulimit -n"));
        assert!(check_fd_limit(400, 1024).is_none());
        assert_eq!(
            soft_open_files("Max open files unlimited unlimited files\n"),
            None
        );
    }

    #[test]
    fn slots_are_capped_and_freed_on_drop() {
        let limit = ConnectionLimit::new(2);
        let a = limit.try_acquire().unwrap();
        let _b = limit.try_acquire().unwrap();
        assert!(limit.try_acquire().is_none());
        assert_eq!(limit.open(), 2);
        drop(a);
        assert_eq!(limit.open(), 1);
        assert!(limit.try_acquire().is_some());
    }

    #[test]
    fn refusals_are_logged_at_most_once_per_interval_with_their_count() {
        let limit = ConnectionLimit::new(1);
        let t0 = Instant::now();
        assert_eq!(limit.refused(t0), Some(1));
        assert_eq!(limit.refused(t0 + Duration::from_secs(1)), None);
        assert_eq!(limit.refused(t0 + Duration::from_secs(2)), None);
        assert_eq!(
            limit.refused(t0 + LOG_EVERY + Duration::from_secs(1)),
            Some(3)
        );
    }
}
