//! Writing a DLT partition once: under the partition's producer lease
//! (`lease`), after reading it to its end, and again after being fenced by
//! another instance. The why of each step is in `lease`'s module doc.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};
use uuid::Uuid;

use super::lease::{Lease, Leases, LEASE_REFRESH};
use super::producer::{finish, ProduceError, Producer, Stopped, Written};
use super::PendingWrite;
use crate::clock::now_ms;
use crate::config::Fencing;
use crate::dlt::backoff;
use crate::dlt::ledger::LedgerKey;
use crate::dlt_record::Origin;
use crate::kafka::builder::NewRecord;
use crate::metrics::DltWriteSeen;

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
