//! Writing a DLT partition once: under the partition's producer lease
//! (`lease`), after reading it to its end, and again after being fenced by
//! another instance (the why of each step is in `lease`'s module doc);
//! then sending the records and finishing each job.
//!
//! Sending: batches of at most [`MAX_BATCH_BYTES`], compressed with
//! `dead_letter.compression`. A batch refused as too large
//! (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE) is split in halves and
//! re-sent, down to single records; a single record still too large fails
//! only its own job (logged as an error, counted as
//! `antidote_dlt_writes_total{result="too_large"}`). Any other refusal
//! fails the partition's remaining jobs, so that its diversions stay in
//! order; the interception layer holds their origin partitions and a later
//! fetch tries again.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, error, warn};
use uuid::Uuid;

use super::lease::{Lease, Leases, LEASE_REFRESH};
use super::producer::{finish, Producer, Written};
use super::PendingWrite;
use crate::client::errors;
use crate::clock::now_ms;
use crate::config::Fencing;
use crate::dlt::backoff;
use crate::dlt::ledger::LedgerKey;
use crate::dlt_record::Origin;
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
use crate::metrics::{DltWriteSeen, Produced};

/// Most record bytes (before compression) put in one batch up front: under
/// Kafka's default `max.message.bytes` (1 MiB), so a DLT created by someone
/// else with defaults rarely needs a split.
const MAX_BATCH_BYTES: usize = 900 * 1024;
/// Most times one round re-reads and re-writes a DLT partition after being
/// fenced by another instance.
const MAX_FENCED_RETRIES: usize = 3;

impl Producer {
    /// Write `jobs` to DLT partition `topic`/`partition` exactly once: hold
    /// the partition's producer lease, read the partition to its end (a
    /// record another instance wrote is not written again), write the rest.
    /// Fenced by another instance in between: its epoch is newer, so it
    /// read and wrote after our reading; take the lease back, read again,
    /// write what is still missing.
    ///
    /// What the write came to (every lease attempt, catch-up read and
    /// Produce of it) is reported once, at its end
    /// ([`crate::metrics::Metrics::dlt_written`]): a DLT partition is the
    /// writer's unit, with its own lease, its own read to the end and its
    /// own outcome.
    pub(super) async fn write_partition(
        &mut self,
        topic: &str,
        partition: i32,
        jobs: Vec<PendingWrite>,
        ids: &HashMap<Arc<str>, Uuid>,
        failed_at: i64,
    ) -> Written {
        let mut seen = DltWriteSeen::default();
        let written = self
            .write_leased(topic, partition, jobs, ids, failed_at, &mut seen)
            .await;
        crate::metrics::global().dlt_written(seen);
        written
    }

    /// [`Producer::write_partition`]'s attempts, noting what each came to
    /// in `seen`.
    async fn write_leased(
        &mut self,
        topic: &str,
        partition: i32,
        mut jobs: Vec<PendingWrite>,
        ids: &HashMap<Arc<str>, Uuid>,
        failed_at: i64,
        seen: &mut DltWriteSeen,
    ) -> Written {
        for attempt in 0..=MAX_FENCED_RETRIES {
            let fenced = match self.ensure_lease(topic, partition, seen).await {
                Claim::Held => {
                    let todo = self.not_yet_written(topic, partition, jobs, ids, seen);
                    let Some(todo) = todo.await else {
                        return Written::Failed;
                    };
                    let stopped;
                    (jobs, stopped) = self
                        .write_missing(topic, partition, todo, ids, failed_at, seen)
                        .await;
                    match stopped {
                        _ if jobs.is_empty() => return Written::All,
                        // Only records too large for the DLT are left: the
                        // lease stays good for the next try.
                        None => {
                            jobs.into_iter()
                                .for_each(|j| finish(&self.ledger, j, false));
                            return Written::TooLarge;
                        }
                        Some(Stopped::Fenced) => true,
                        Some(Stopped::Failed) => false,
                    }
                }
                Claim::Fenced => true,
                Claim::Failed => false,
            };
            if !fenced || attempt == MAX_FENCED_RETRIES {
                break;
            }
            seen.fenced += 1;
            self.leases.forget(&(topic.to_string(), partition));
            // Jittered: two instances taking the lease back at once would
            // fence each other again.
            let pause = backoff(
                attempt as u32,
                Duration::from_millis(20),
                Duration::from_millis(500),
            );
            tokio::time::sleep(pause).await;
        }
        jobs.into_iter()
            .for_each(|j| finish(&self.ledger, j, false));
        Written::Failed
    }

    /// Write `todo` (the jobs no one wrote yet) under the held lease and
    /// finish those acknowledged; the jobs not written, and why the write
    /// stopped early if it did.
    async fn write_missing(
        &mut self,
        topic: &str,
        partition: i32,
        todo: Vec<PendingWrite>,
        ids: &HashMap<Arc<str>, Uuid>,
        failed_at: i64,
        seen: &mut DltWriteSeen,
    ) -> (Vec<PendingWrite>, Option<Stopped>) {
        if todo.is_empty() {
            return (todo, None);
        }
        let mut records: Vec<NewRecord> = todo
            .iter()
            .map(|j| {
                j.diversion.to_record(
                    failed_at,
                    ids.get(&j.diversion.origin_topic).copied(),
                    &crate::dlt::trust::seal(topic, partition),
                )
            })
            .collect();
        let (ok, stopped) = self.send_split(topic, partition, &mut records, seen).await;
        let (done, rest): (Vec<_>, Vec<_>) = todo.into_iter().zip(ok).partition(|(_, ok)| *ok);
        done.into_iter()
            .for_each(|(j, _)| finish(&self.ledger, j, true));
        (rest.into_iter().map(|(j, _)| j).collect(), stopped)
    }

    /// Read DLT partition `topic`/`partition` from where the ledger's tail
    /// stopped to its end, and finish (acknowledged) the jobs whose record
    /// is there already: another instance of a fleet wrote it since the
    /// tail last looked. The jobs still to write; `None` (all failed) when
    /// the DLT cannot be read, since then it cannot be written either.
    async fn not_yet_written(
        &mut self,
        topic: &str,
        partition: i32,
        jobs: Vec<PendingWrite>,
        ids: &HashMap<Arc<str>, Uuid>,
        seen: &mut DltWriteSeen,
    ) -> Option<Vec<PendingWrite>> {
        let from = match self.ledger.tail_position(&(topic.to_string(), partition)) {
            Some(from) => Ok(from),
            None => self.cluster.log_start(topic, partition).await,
        };
        let keys: HashSet<LedgerKey> = jobs.iter().map(|j| j.key.clone()).collect();
        let wanted = |o: &Origin| keys.contains(&(o.topic.clone(), o.partition, o.offset));
        let found = match from {
            Ok(from) => {
                crate::dlt::ledger::tail::catch_up(
                    &mut self.cluster,
                    topic,
                    partition,
                    from,
                    wanted,
                )
                .await
            }
            Err(e) => Err(e),
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                warn!(error = %e, dlt = topic, partition, records = jobs.len(), "reading the DLT before writing failed; the write waits for the next fetch");
                jobs.into_iter()
                    .for_each(|j| finish(&self.ledger, j, false));
                return None;
            }
        };
        let there: HashSet<(Arc<str>, i32, i64)> = found
            .into_iter()
            .filter(|o| match (o.topic_id, ids.get(&o.topic)) {
                (Some(written), Some(now)) => written == *now,
                _ => true,
            })
            .map(|o| (o.topic, o.partition, o.offset))
            .collect();
        let (found, todo): (Vec<PendingWrite>, Vec<PendingWrite>) =
            jobs.into_iter().partition(|j| {
                // Before the tail's position, the ledger has it (the tail
                // records entries before it moves its position).
                there.contains(&j.key) || self.ledger.contains(&j.key)
            });
        seen.found_at_write += found.len() as u64;
        found
            .into_iter()
            .for_each(|j| finish(&self.ledger, j, true));
        Some(todo)
    }

    /// Send `records` to `topic`/`partition`: in batches of at most
    /// [`MAX_BATCH_BYTES`], each split in halves while the broker refuses it
    /// as too large or for a timestamp. A single record whose timestamp the
    /// DLT refuses is sent again, once, stamped with the time of its
    /// diversion (the original stays in `x-original-timestamp`). Whether
    /// each record was acknowledged, and why sending stopped early if it did
    /// (a single record too large does not stop it); what each Produce came
    /// to is noted in `seen`.
    pub(super) async fn send_split(
        &mut self,
        topic: &str,
        partition: i32,
        records: &mut [NewRecord],
        seen: &mut DltWriteSeen,
    ) -> (Vec<bool>, Option<Stopped>) {
        let mut ok = vec![false; records.len()];
        let mut retimed = vec![false; records.len()];
        let mut stopped = None;
        // Ranges still to send, the next one last (so they go in order).
        let mut todo: Vec<Range<usize>> = chunks(records, MAX_BATCH_BYTES);
        todo.reverse();
        while let Some(r) = todo.pop() {
            let started = Instant::now();
            match self.produce(topic, partition, &records[r.clone()]).await {
                Ok(()) => {
                    seen.produced.push((Produced::Ok, started.elapsed()));
                    seen.written += r.len() as u64;
                    ok[r].fill(true);
                }
                Err(e @ (ProduceError::TooLarge(..) | ProduceError::BadTimestamp(..)))
                    if r.len() > 1 =>
                {
                    let mid = r.start + r.len() / 2;
                    let why = match e {
                        ProduceError::TooLarge(..) => "batch too large for the DLT: splitting",
                        _ => "a record's timestamp refused by the DLT: splitting",
                    };
                    debug!(dlt = topic, partition, records = r.len(), "{why}");
                    todo.push(mid..r.end);
                    todo.push(r.start..mid);
                }
                Err(e @ ProduceError::BadTimestamp(..)) if !retimed[r.start] => {
                    seen.produced.push((Produced::Retimed, started.elapsed()));
                    warn!(error = %e, dlt = topic, partition, timestamp = records[r.start].timestamp, "the DLT refused a dead-letter record's timestamp: sent again with the time of its diversion (the original is in x-original-timestamp)");
                    records[r.start].timestamp = now_ms();
                    retimed[r.start] = true;
                    todo.push(r);
                }
                Err(e @ ProduceError::Fenced(..)) => {
                    stopped = Some(Stopped::Fenced);
                    debug!(error = %e, dlt = topic, partition, "fenced by another writer of the DLT partition");
                    break;
                }
                Err(e @ ProduceError::TooLarge(..)) => {
                    seen.produced.push((Produced::TooLarge, started.elapsed()));
                    // Retried on every fetch of its partition: logged once a
                    // minute per DLT partition (the metric counts each).
                    if too_large_logged_recently(topic, partition) {
                        debug!(error = %e, dlt = topic, partition, "a single dead-letter record is still too large for its DLT");
                    } else {
                        error!(error = %e, dlt = topic, partition, "a single dead-letter record is too large for its DLT; its partition stays held");
                    }
                }
                Err(e) => {
                    seen.produced.push((Produced::Error, started.elapsed()));
                    warn!(error = %e, dlt = topic, partition, records = todo.iter().map(|r| r.len()).sum::<usize>() + r.len(), "dead-letter write failed");
                    stopped = Some(Stopped::Failed);
                    break;
                }
            }
        }
        (ok, stopped)
    }

    /// Produce one batch to one partition with acks=all, retrying network
    /// errors (jittered backoff) with the same bytes.
    pub(super) async fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        records: &[NewRecord],
    ) -> Result<(), ProduceError> {
        let key = (topic.to_string(), partition);
        let what = || format!("{topic}-{partition}");
        let lease = self.leases.current(&key);
        let opts = BuildOptions::default()
            .compression(self.cfg.compression.codec())
            .idempotent(lease.pid, lease.epoch, lease.seq);
        let batch = build_batch(records, &opts)
            .map_err(|e| ProduceError::Failed(format!("{}: {e}", what())))?;
        let code = self.send_retrying(topic, partition, batch).await?;
        match code {
            0 | errors::DUPLICATE_SEQUENCE_NUMBER => {
                self.leases.advance(&key, records.len());
                Ok(())
            }
            errors::MESSAGE_TOO_LARGE | errors::RECORD_LIST_TOO_LARGE => {
                Err(ProduceError::TooLarge(what(), code))
            }
            errors::INVALID_TIMESTAMP => Err(ProduceError::BadTimestamp(what(), code)),
            errors::OUT_OF_ORDER_SEQUENCE_NUMBER
            | errors::UNKNOWN_PRODUCER_ID
            | errors::INVALID_PRODUCER_EPOCH
            | errors::PRODUCER_FENCED => Err(ProduceError::Fenced(what(), code)),
            errors::NOT_LEADER_OR_FOLLOWER
            | errors::LEADER_NOT_AVAILABLE
            | errors::UNKNOWN_TOPIC_OR_PARTITION => {
                self.cluster.reset();
                Err(ProduceError::Failed(format!(
                    "{}: leader not available (error {code})",
                    what()
                )))
            }
            other => Err(ProduceError::Failed(format!(
                "{}: produce error {other}",
                what()
            ))),
        }
    }

    /// One Produce request, retried on network errors; the partition's
    /// error code.
    async fn send_retrying(
        &mut self,
        topic: &str,
        partition: i32,
        batch: Bytes,
    ) -> Result<i16, ProduceError> {
        let mut last_err = String::new();
        for attempt in 0..3u32 {
            match self.cluster.produce(topic, partition, batch.clone()).await {
                Ok(p) => return Ok(p.error_code),
                Err(e) => {
                    last_err = e.to_string();
                    self.cluster.reset();
                    tokio::time::sleep(backoff(
                        attempt,
                        Duration::from_millis(100),
                        Duration::from_secs(1),
                    ))
                    .await;
                }
            }
        }
        Err(ProduceError::Failed(last_err))
    }

    /// Take `topic`/`partition`'s producer lease unless held (and younger
    /// than [`LEASE_REFRESH`]): InitProducerId at the transaction
    /// coordinator of the partition's transactional id bumps its epoch, and
    /// the lease marker written under it makes the partition refuse every
    /// other instance's older epoch (see the module's doc).
    ///
    /// Fails closed: when InitProducerId cannot be had (coordinator moving
    /// or loading, refused, unreachable), no lease is cached and the write
    /// waits (its partition is held), unless `dead_letter.fencing:
    /// best_effort`, which writes without fencing or idempotence then.
    async fn ensure_lease(
        &mut self,
        topic: &str,
        partition: i32,
        seen: &mut DltWriteSeen,
    ) -> Claim {
        let key = (topic.to_string(), partition);
        if self.leases.fresh(&key) {
            return Claim::Held;
        }
        self.leases.forget(&key);
        let lease = match Leases::take(&mut self.cluster, topic, partition).await {
            Ok(lease) => lease,
            Err(why) => {
                // The coordinator may have moved: look it up again next time.
                self.cluster.reset();
                if self.cfg.fencing == Fencing::BestEffort {
                    warn!(dlt = topic, partition, error = %why, "InitProducerId failed; writing without fencing (dead_letter.fencing: best_effort)");
                    Lease::none(LEASE_REFRESH)
                } else {
                    seen.lease_failed += 1;
                    warn!(dlt = topic, partition, error = %why, "InitProducerId failed: the DLT partition's writes wait (held) and are retried; antidote_dlt_writes_total{{result=\"lease_failed\"}}");
                    return Claim::Failed;
                }
            }
        };
        self.leases.hold(key.clone(), lease);
        if lease.pid < 0 || lease.epoch == 0 {
            return Claim::Held;
        }
        let marker =
            crate::dlt_marker::lease_record(now_ms(), &crate::dlt::trust::seal(topic, partition));
        match self.produce(topic, partition, &[marker]).await {
            Ok(()) => Claim::Held,
            Err(e) => {
                self.leases.forget(&key);
                match e {
                    ProduceError::Fenced(..) => {
                        debug!(error = %e, dlt = topic, partition, "lease marker fenced by another writer of the DLT partition");
                        Claim::Fenced
                    }
                    e => {
                        warn!(error = %e, dlt = topic, partition, "writing the DLT partition's lease marker failed; the write waits");
                        Claim::Failed
                    }
                }
            }
        }
    }
}

/// What taking a DLT partition's lease came to.
pub(super) enum Claim {
    /// Held: the partition can be read and written.
    Held,
    /// A newer epoch fenced the lease marker: take the lease again.
    Fenced,
    /// The lease marker could not be written: the write waits.
    Failed,
}

/// Why [`Producer::send_split`] stopped before its last batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stopped {
    /// A newer epoch of the partition's lease fenced the write.
    Fenced,
    /// The broker refused or did not answer.
    Failed,
}

/// Why one batch was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProduceError {
    #[error("{0}: the broker refused the batch as too large (error {1})")]
    TooLarge(String, i16),
    /// A record's timestamp is outside what the DLT accepts
    /// (`message.timestamp.{before,after}.max.ms`).
    #[error("{0}: the broker refused a record's timestamp (error {1})")]
    BadTimestamp(String, i16),
    #[error("{0}")]
    Failed(String),
    /// Another writer took this DLT partition's producer epoch (or the
    /// broker lost our producer state): read the partition again first.
    #[error("{0}: producer fenced or unknown (error {1})")]
    Fenced(String, i16),
}

/// Consecutive ranges of `records` of at most `max_bytes` each (by value,
/// key and header sizes); a record larger than that gets a range of its own.
fn chunks(records: &[NewRecord], max_bytes: usize) -> Vec<Range<usize>> {
    let size = |r: &NewRecord| {
        r.key.as_ref().map_or(0, Bytes::len)
            + r.value.as_ref().map_or(0, Bytes::len)
            + r.headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Bytes::len) + 8)
                .sum::<usize>()
            + 24
    };
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, r) in records.iter().enumerate() {
        let s = size(r);
        if i > start && bytes + s > max_bytes {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += s;
    }
    if start < records.len() {
        out.push(start..records.len());
    }
    out
}

/// Whether the too-large error of `topic`/`partition` was logged in the
/// last minute (else it is noted as logged now). At most one entry per DLT
/// partition that ever held a too-large record.
fn too_large_logged_recently(topic: &str, partition: i32) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LOGGED: OnceLock<Mutex<HashMap<(String, i32), Instant>>> = OnceLock::new();
    const EVERY: std::time::Duration = std::time::Duration::from_secs(60);
    let mut m = LOGGED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    match m.get_mut(&(topic.to_string(), partition)) {
        Some(at) if now.duration_since(*at) < EVERY => true,
        Some(at) => {
            *at = now;
            false
        }
        None => {
            m.insert((topic.to_string(), partition), now);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value_len: usize) -> NewRecord {
        NewRecord {
            timestamp: 1,
            key: None,
            value: Some(Bytes::from(vec![b'x'; value_len])),
            headers: vec![],
        }
    }

    #[test]
    fn chunks_bound_bytes_and_keep_order() {
        let recs: Vec<_> = [10, 10, 100, 10, 500, 10].iter().map(|&n| rec(n)).collect();
        assert_eq!(chunks(&recs, 200), [0..3, 3..4, 4..5, 5..6]);
        // One chunk: the records 0 to 5.
        #[allow(clippy::single_range_in_vec_init)]
        let one = [0..6];
        assert_eq!(chunks(&recs, 10_000), one);
        assert!(chunks(&[], 10).is_empty());
    }
}
