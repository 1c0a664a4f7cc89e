//! What the requesting consumer will see of transactional batches: under
//! READ_COMMITTED, batches of aborted transactions are dropped by the
//! client, so the planner neither judges nor diverts them. Nor records
//! below the partition's log start: Kafka returns a whole batch that
//! DeleteRecords or retention cut in the middle, but those records are
//! deleted (no client position can be below the log start, so no client
//! hands them to its application), and diverting one would copy a record
//! an operator deleted into a DLT, from which a replay could bring it back.

use std::borrow::Cow;

use super::verdicts::Judged;
use crate::kafka::batch::Batch;

/// Which transactional batches the requesting consumer will see.
pub struct Visibility {
    read_committed: bool,
    /// (producer id, first offset), sorted by first offset.
    aborted: Vec<(i64, i64)>,
    /// The partition's log start offset (-1: not known, Fetch v0-4).
    log_start: i64,
}

impl Visibility {
    pub fn new(
        read_committed: bool,
        aborted: Option<&[kafka_protocol::messages::fetch_response::AbortedTransaction]>,
    ) -> Self {
        let mut aborted: Vec<(i64, i64)> = aborted
            .unwrap_or_default()
            .iter()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect();
        aborted.sort_by_key(|a| a.1);
        Visibility {
            read_committed,
            aborted,
            log_start: -1,
        }
    }

    /// The partition's log start offset, from the Fetch response (v5+).
    pub fn with_log_start(mut self, log_start: i64) -> Self {
        self.log_start = log_start;
        self
    }

    /// Whether the record at `offset` is below the log start: deleted.
    pub fn deleted(&self, offset: i64) -> bool {
        offset < self.log_start
    }

    /// `invalid` without the records below the log start (borrowed when
    /// none is: the common case costs no copy).
    pub(super) fn not_deleted<'a>(&self, invalid: &'a [Judged]) -> Cow<'a, [Judged]> {
        if invalid.iter().any(|j| self.deleted(j.offset)) {
            invalid
                .iter()
                .filter(|j| !self.deleted(j.offset))
                .cloned()
                .collect()
        } else {
            Cow::Borrowed(invalid)
        }
    }
}

/// Tracks aborted producers while walking batches in offset order, the way
/// the Java consumer does (CompletedFetch.consumeAbortedTransactionsUpTo).
pub(super) struct AbortTracker<'a> {
    vis: &'a Visibility,
    next: usize,
    open: Vec<i64>,
}

impl<'a> AbortTracker<'a> {
    pub(super) fn new(vis: &'a Visibility) -> Self {
        AbortTracker {
            vis,
            next: 0,
            open: Vec::new(),
        }
    }

    /// Whether the client will drop `batch` as part of an aborted transaction.
    pub(super) fn is_aborted(&mut self, batch: &Batch) -> bool {
        if !self.vis.read_committed {
            return false;
        }
        let last = batch.last_offset();
        while let Some(&(pid, first)) = self.vis.aborted.get(self.next) {
            if first > last {
                break;
            }
            self.open.push(pid);
            self.next += 1;
        }
        if batch.is_control() {
            // An abort marker closes its producer's aborted transaction; a
            // commit marker for a producer in the list cannot occur.
            self.open.retain(|&p| p != batch.producer_id());
            return false;
        }
        batch.is_transactional() && self.open.contains(&batch.producer_id())
    }
}
