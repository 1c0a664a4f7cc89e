//! The producer lease of a DLT partition ([`Lease`], held in [`Leases`]):
//! what makes a fleet of instances write each diverted record to its DLT
//! once. Writing under it (take the lease, read to the end, write what is
//! missing, again when fenced) is the producer's, in `once`.
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

use std::collections::HashMap;
use std::time::Duration;

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use tokio::time::Instant;
use tracing::debug;

use crate::client::{errors, Cluster};
use crate::dlt::backoff;

/// A DLT partition's producer: its id and epoch (from InitProducerId with a
/// transactional id derived from the partition, so every instance of a
/// fleet shares the id and the newest epoch fences the older writers), and
/// the next sequence number. (-1, -1) when the broker gives none.
#[derive(Clone, Copy)]
pub(super) struct Lease {
    pub(super) pid: i64,
    pub(super) epoch: i16,
    pub(super) seq: i32,
    /// When InitProducerId handed it out (see `lease::LEASE_REFRESH`).
    pub(super) taken: tokio::time::Instant,
    /// How long it is used before InitProducerId is asked again: under half
    /// the coordinator's `transactional.id.expiration.ms` (`lease::refresh`).
    pub(super) refresh: Duration,
}

impl Lease {
    /// No producer id: what is written without a lease (best effort).
    pub(super) fn none(refresh: Duration) -> Lease {
        Lease {
            pid: -1,
            epoch: -1,
            seq: -1,
            taken: Instant::now(),
            refresh,
        }
    }
}

/// The producer leases this instance holds, by DLT partition.
#[derive(Default)]
pub(super) struct Leases {
    held: HashMap<(String, i32), Lease>,
}

impl Leases {
    /// The lease of `key` to write under (no producer id if none is held).
    pub(super) fn current(&self, key: &(String, i32)) -> Lease {
        self.held
            .get(key)
            .copied()
            .unwrap_or_else(|| Lease::none(Duration::ZERO))
    }

    /// `n` records were written under `key`'s lease: its next sequence.
    pub(super) fn advance(&mut self, key: &(String, i32), n: usize) {
        if let Some(l) = self.held.get_mut(key).filter(|l| l.pid >= 0) {
            l.seq = l.seq.wrapping_add(n as i32);
        }
    }

    /// Whether `key`'s lease is held and younger than its refresh.
    pub(super) fn fresh(&self, key: &(String, i32)) -> bool {
        self.held
            .get(key)
            .is_some_and(|l| l.taken.elapsed() < l.refresh)
    }

    pub(super) fn forget(&mut self, key: &(String, i32)) {
        self.held.remove(key);
    }

    /// Forget every lease (the cluster may have been replaced).
    pub(super) fn clear(&mut self) {
        self.held.clear();
    }

    /// Ask `topic`/`partition`'s transaction coordinator for a new epoch of
    /// its transactional id: the lease, not yet held (see [`Leases::hold`]),
    /// or why not.
    pub(super) async fn take(
        cluster: &mut Cluster,
        topic: &str,
        partition: i32,
    ) -> Result<Lease, String> {
        let tid = transactional_id(topic, partition);
        match init_producer_id(cluster, &tid).await {
            Ok(r) if r.error_code == 0 => {
                debug!(
                    dlt = topic,
                    partition,
                    producer_id = r.producer_id.0,
                    epoch = r.producer_epoch,
                    "DLT partition lease taken"
                );
                let taken = Instant::now();
                Ok(Lease {
                    pid: r.producer_id.0,
                    epoch: r.producer_epoch,
                    seq: 0,
                    taken,
                    refresh: refresh(cluster, &tid).await,
                })
            }
            Ok(r) => Err(format!("error code {}", r.error_code)),
            Err(e) => Err(e),
        }
    }

    pub(super) fn hold(&mut self, key: (String, i32), lease: Lease) {
        self.held.insert(key, lease);
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
