//! The producer lease of a DLT partition, and writing under it: what makes
//! a fleet of instances write each diverted record to its DLT once.
//!
//! Every instance asks InitProducerId for the same transactional id per DLT
//! partition ([`transactional_id`]): the broker hands them one producer id
//! and a new epoch each time, and once the partition holds a batch of the
//! newer epoch (the lease marker below), it refuses writes of older ones
//! (PRODUCER_FENCED / INVALID_PRODUCER_EPOCH). Whoever holds the newest
//! epoch reads the partition to its end before writing, so it writes only
//! what nobody wrote before its lease began, and nobody else can write
//! after that. A fenced writer waits a jittered pause, takes the lease back
//! and reads again. No transaction is begun: only the fencing is used
//! (tansu 0.6 does not abort an older epoch's open transaction, see
//! `scripts/tansu_txn_probe.py`).
//!
//! InitProducerId goes to the transaction coordinator of the transactional
//! id (FindCoordinator), as Kafka requires on a cluster of several brokers.
//! If it cannot be had, the write waits (fails closed) unless
//! `dead_letter.fencing: best_effort`.
//!
//! Taking the lease writes a `lease` marker (`dlt_marker::lease_record`)
//! under the new epoch before the read, unless the epoch is 0 (the broker
//! just made the producer id: nobody wrote with it before). A new producer
//! id also comes back after the transactional id expired
//! (`transactional.id.expiration.ms`, 7 days by default, counted from the
//! id's last InitProducerId: writes do not keep it alive) and would fence
//! no one; that cannot meet a live writer, because a lease is taken again
//! before a write once it is older than [`LEASE_REFRESH`] (1 hour) or half
//! the coordinator's expiration ([`refresh`]), which keeps the id alive and
//! moves a stale writer to the new id's newest epoch (`tests/test_lease.py`
//! runs a broker with a 4 s expiration).
//!
//! Apache Kafka (4.1, `ProducerAppendInfo.checkProducerEpoch`) fences an
//! older epoch on a partition only once that partition has appended a
//! batch of the newer one (data or transaction marker), not when
//! InitProducerId hands the newer one out; non-transactional batches are
//! never checked with the coordinator. Without the marker, a write another
//! instance had already read for could land between our read and our
//! write, and the record would be written twice (what `dlt replay` did
//! against Kafka before its lease wrote an ABORT marker, see
//! `fence::fence_partition`). After the marker, every older-epoch write either
//! is in the log before it (so the read finds it) or is refused. tansu 0.6
//! refuses older epochs from InitProducerId on. The DLT keeps a marker
//! record rather than `fence::fence_partition`'s control batch: it is cheaper
//! (one write, about 1 ms, against about 5 ms on one Kafka 4.1.2 broker,
//! `benches/lease_fence.py`) and shows in the DLT who took the lease when.
//!
//! One gap is left on tansu 0.6: it checks the epoch, then raises the
//! watermark, then stores the batch, not atomically, so a write checked
//! just before our lease can land just after our read. The read does not
//! stop early while a raised watermark has no batch behind it yet
//! (`tail::catch_up`), which narrows this to the check-to-raise step.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, warn};
use uuid::Uuid;

use super::producer::{finish, Lease, ProduceError, Producer};
use super::PendingWrite;
use crate::client::{errors, Cluster};
use crate::clock::now_ms;
use crate::config::Fencing;
use crate::dlt::backoff;
use crate::dlt::ledger::LedgerKey;
use crate::dlt_record::Origin;
use crate::kafka::builder::NewRecord;

/// Most times one round re-reads and re-writes a DLT partition after being
/// fenced by another instance.
const MAX_FENCED_RETRIES: usize = 3;

impl Producer {
    /// Write `jobs` to DLT partition `topic`/`partition` exactly once: hold
    /// the partition's producer lease, read the partition to its end (a
    /// record another instance wrote is not written again), write the rest.
    /// Fenced by another instance in between: its epoch is newer, so it
    /// read and wrote after our reading; take the lease back, read again,
    /// write what is still missing. False if any job failed.
    pub(super) async fn write_partition(
        &mut self,
        topic: &str,
        partition: i32,
        mut jobs: Vec<PendingWrite>,
        ids: &HashMap<Arc<str>, Uuid>,
        failed_at: i64,
    ) -> bool {
        for attempt in 0..=MAX_FENCED_RETRIES {
            let fenced = match self.ensure_lease(topic, partition).await {
                Claim::Held => {
                    let Some(todo) = self.not_yet_written(topic, partition, jobs, ids).await else {
                        return false;
                    };
                    let fenced;
                    (jobs, fenced) = self
                        .write_missing(topic, partition, todo, ids, failed_at)
                        .await;
                    if jobs.is_empty() {
                        return true;
                    }
                    fenced
                }
                Claim::Fenced => true,
                Claim::Failed => false,
            };
            if !fenced || attempt == MAX_FENCED_RETRIES {
                break;
            }
            crate::metrics::global().dlt_write_result("fenced", Duration::ZERO);
            self.leases.remove(&(topic.to_string(), partition));
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
        false
    }

    /// Write `todo` (the jobs no one wrote yet) under the held lease and
    /// finish those acknowledged; the jobs not written, and whether the
    /// write was fenced.
    async fn write_missing(
        &mut self,
        topic: &str,
        partition: i32,
        todo: Vec<PendingWrite>,
        ids: &HashMap<Arc<str>, Uuid>,
        failed_at: i64,
    ) -> (Vec<PendingWrite>, bool) {
        if todo.is_empty() {
            return (todo, false);
        }
        let records: Vec<NewRecord> = todo
            .iter()
            .map(|j| {
                j.diversion.to_record(
                    failed_at,
                    ids.get(&j.diversion.origin_topic).copied(),
                    &crate::dlt::trust::seal(topic, partition),
                )
            })
            .collect();
        let (ok, fenced) = self.send_split(topic, partition, &records).await;
        let (done, rest): (Vec<_>, Vec<_>) = todo.into_iter().zip(ok).partition(|(_, ok)| *ok);
        done.into_iter()
            .for_each(|(j, _)| finish(&self.ledger, j, true));
        (rest.into_iter().map(|(j, _)| j).collect(), fenced)
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
    ) -> Option<Vec<PendingWrite>> {
        let from = match self.ledger.tail_position(&(topic.to_string(), partition)) {
            Some(from) => Ok(from),
            None => self.cluster.log_start(topic, partition).await,
        };
        let keys: HashSet<LedgerKey> = jobs
            .iter()
            .map(|j| super::ledger_key(&j.diversion))
            .collect();
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
                let key = super::ledger_key(&j.diversion);
                there.contains(&key) || self.ledger.contains(&key)
            });
        crate::metrics::global().fleet_found_at_write(found.len() as u64);
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
    async fn ensure_lease(&mut self, topic: &str, partition: i32) -> Claim {
        let key = (topic.to_string(), partition);
        if self
            .leases
            .get(&key)
            .is_some_and(|l| l.taken.elapsed() < l.refresh)
        {
            return Claim::Held;
        }
        self.leases.remove(&key);
        let tid = transactional_id(topic, partition);
        let result = init_producer_id(&mut self.cluster, &tid).await;
        let lease = match result {
            Ok(r) if r.error_code == 0 => {
                debug!(
                    dlt = topic,
                    partition,
                    producer_id = r.producer_id.0,
                    epoch = r.producer_epoch,
                    "DLT partition lease taken"
                );
                let taken = Instant::now();
                Lease {
                    pid: r.producer_id.0,
                    epoch: r.producer_epoch,
                    seq: 0,
                    taken,
                    refresh: refresh(&mut self.cluster, &tid).await,
                }
            }
            other => {
                let why = match other {
                    Ok(r) => format!("error code {}", r.error_code),
                    Err(e) => e,
                };
                // The coordinator may have moved: look it up again next time.
                self.cluster.reset();
                if self.cfg.fencing == Fencing::BestEffort {
                    warn!(dlt = topic, partition, error = %why, "InitProducerId failed; writing without fencing (dead_letter.fencing: best_effort)");
                    Lease {
                        pid: -1,
                        epoch: -1,
                        seq: -1,
                        taken: Instant::now(),
                        refresh: LEASE_REFRESH,
                    }
                } else {
                    crate::metrics::global().dlt_write_result("lease_failed", Duration::ZERO);
                    warn!(dlt = topic, partition, error = %why, "InitProducerId failed: the DLT partition's writes wait (held) and are retried; antidote_dlt_writes_total{{result=\"lease_failed\"}}");
                    return Claim::Failed;
                }
            }
        };
        self.leases.insert(key.clone(), lease);
        if lease.pid < 0 || lease.epoch == 0 {
            return Claim::Held;
        }
        let marker =
            crate::dlt_marker::lease_record(now_ms(), &crate::dlt::trust::seal(topic, partition));
        match self.produce(topic, partition, &[marker]).await {
            Ok(()) => Claim::Held,
            Err(e) => {
                self.leases.remove(&key);
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

/// How many times InitProducerId is asked when its answer is retriable,
/// before the write waits for the next round (about 1.5 s in all).
const LEASE_TRIES: u32 = 6;

/// Longest a lease is used before InitProducerId is asked again. Asking
/// keeps the transactional id alive (Kafka expires one unused for
/// `transactional.id.expiration.ms`, 7 days by default; a new producer id
/// would fence no one), and lets an instance notice a newer epoch without
/// waiting for a refused write. Shorter when the coordinator expires ids
/// sooner ([`refresh`]).
pub(super) const LEASE_REFRESH: Duration = Duration::from_secs(3600);

/// How long a lease of `tid` may be used: [`LEASE_REFRESH`], or half the
/// `transactional.id.expiration.ms` of `tid`'s coordinator if that is less.
///
/// Kafka expires a transactional id `transactional.id.expiration.ms` after
/// its last InitProducerId or transaction step (`TransactionStateManager.
/// shouldExpire`: `txnLastUpdateTimestamp`; writes under the producer id do
/// not count), checking every `transaction.remove.expired.transaction.
/// cleanup.interval.ms`; the next InitProducerId then makes a new producer
/// id, whose epochs fence nothing of the old one. A writer that re-takes its
/// lease within half the expiration has it taken at least half the
/// expiration before the id can expire, so no write under the old producer
/// id comes after a new one is handed out. The value is asked of the
/// coordinator (DescribeConfigs); if it cannot be had, the default (7 days)
/// is assumed.
pub(crate) async fn refresh(cluster: &mut Cluster, tid: &str) -> Duration {
    match id_expiration(cluster, tid).await {
        Ok(exp) => LEASE_REFRESH.min(exp / 2),
        Err(e) => {
            debug!(error = %e, tid, "transactional.id.expiration.ms of the coordinator unknown; the lease is taken again after the longest refresh");
            // A broker may close the connection on a request it does not
            // serve (tansu 0.6): open new ones for what follows.
            cluster.reset();
            LEASE_REFRESH
        }
    }
}

/// `transactional.id.expiration.ms` of `tid`'s transaction coordinator
/// (DescribeConfigs of that broker).
pub(crate) async fn id_expiration(cluster: &mut Cluster, tid: &str) -> Result<Duration, String> {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::{DescribeConfigsRequest, FindCoordinatorRequest};
    const KEY: &str = "transactional.id.expiration.ms";
    // Learns the brokers (metadata) if the coordinator is a new one.
    cluster
        .transaction_coordinator(tid)
        .await
        .map_err(|e| e.to_string())?;
    let conn = cluster.any().await.map_err(|e| e.to_string())?;
    let v = conn
        .version::<FindCoordinatorRequest>(1, 6)
        .map_err(|e| e.to_string())?;
    let key = StrBytes::from_string(tid.to_string());
    let mut req = FindCoordinatorRequest::default().with_key_type(1);
    req = if v >= 4 {
        req.with_coordinator_keys(vec![key])
    } else {
        req.with_key(key)
    };
    let resp = conn.send_at(req, v).await.map_err(|e| e.to_string())?;
    let node = match resp.coordinators.first() {
        Some(c) if v >= 4 => c.node_id.0,
        _ => resp.node_id.0,
    };
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(4) // BROKER
            .with_resource_name(StrBytes::from_string(node.to_string()))
            .with_configuration_keys(Some(vec![StrBytes::from_static_str(KEY)]))]);
    let resp = cluster
        .node(node)
        .await
        .map_err(|e| e.to_string())?
        .send(req, 1, 4)
        .await
        .map_err(|e| e.to_string())?;
    let r = resp
        .results
        .first()
        .ok_or_else(|| "DescribeConfigs: no result".to_string())?;
    if r.error_code != 0 {
        return Err(format!("DescribeConfigs: error code {}", r.error_code));
    }
    r.configs
        .iter()
        .find(|c| c.name.as_str() == KEY)
        .and_then(|c| c.value.as_ref())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| format!("DescribeConfigs: no {KEY}"))
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

/// The transactional id of DLT partition `topic`/`partition`: the same in
/// every instance, so InitProducerId hands them one producer id and the
/// newest epoch fences the others. Only used for fencing: no transaction is
/// ever begun (the batches are not transactional).
fn transactional_id(topic: &str, partition: i32) -> String {
    format!("antidote-dlt/{topic}/{partition}")
}

/// InitProducerId for `tid` at its transaction coordinator, asked again
/// (up to [`LEASE_TRIES`] times, jittered) while the answer is retriable:
/// another InitProducerId or an abort of the same id under way
/// (CONCURRENT_TRANSACTIONS), the coordinator loading, moving or not there
/// yet, the network. The last answer, or why there was none.
pub(crate) async fn init_producer_id(
    cluster: &mut Cluster,
    tid: &str,
) -> Result<InitProducerIdResponse, String> {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(
            tid.to_string(),
        ))))
        .with_transaction_timeout_ms(60_000);
    // v2+ in practice: tansu answers v0 and v1 with error -1.
    coordinator_call(
        cluster,
        tid,
        |r: &InitProducerIdResponse| r.error_code,
        |conn| {
            let req = req.clone();
            Box::pin(async move { conn.send(req, 0, 4).await })
        },
    )
    .await
}

/// A request to a transaction coordinator, in flight.
pub(super) type CallFuture<'a, R> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<R, crate::client::ClientError>> + Send + 'a>,
>;

/// One request to `tid`'s transaction coordinator, made by `call`, asked
/// again (up to [`LEASE_TRIES`] times, jittered) while the error `code` of
/// its answer is retriable or there was none. The last answer, or why there
/// was none.
pub(super) async fn coordinator_call<R, F>(
    cluster: &mut Cluster,
    tid: &str,
    code: impl Fn(&R) -> i16,
    call: F,
) -> Result<R, String>
where
    F: for<'a> Fn(&'a mut crate::client::Connection) -> CallFuture<'a, R>,
{
    let mut result = Err(String::new());
    for attempt in 0..LEASE_TRIES {
        result = match cluster.transaction_coordinator(tid).await {
            Ok(conn) => call(conn).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let again = match &result {
            Ok(r) => retriable(code(r)),
            Err(_) => true,
        };
        if !again || attempt + 1 == LEASE_TRIES {
            break;
        }
        cluster.reset();
        let pause = backoff(
            attempt,
            Duration::from_millis(20),
            Duration::from_millis(500),
        );
        tokio::time::sleep(pause).await;
    }
    result
}

/// An answer of the transaction coordinator worth asking again for.
pub(super) fn retriable(code: i16) -> bool {
    matches!(
        code,
        errors::COORDINATOR_LOAD_IN_PROGRESS
            | errors::COORDINATOR_NOT_AVAILABLE
            | errors::NOT_COORDINATOR
            | errors::CONCURRENT_TRANSACTIONS
    )
}
