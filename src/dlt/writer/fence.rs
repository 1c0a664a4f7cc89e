//! Replay's fence of a target partition: the producer lease of a
//! transactional id made visible to one partition without writing a record
//! anyone reads (an aborted empty transaction leaves an ABORT control batch
//! of the new epoch there). The DLT writer's own lease keeps a visible
//! marker record instead (`lease`); why each, with measurements, is in
//! docs/guarantees.md ("The producer lease on Apache Kafka").

use std::time::Duration;

use tokio::time::Instant;

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, DescribeTransactionsRequest, EndTxnRequest, ProducerId, TopicName,
    TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

use super::lease::{coordinator_call, init_producer_id, retriable};
use crate::client::{errors, Cluster};
use crate::dlt::backoff;

/// What [`fence_partition`] came to.
#[derive(Debug)]
pub(crate) enum Fence {
    /// The partition refuses every epoch of `pid` older than `epoch`, and
    /// every older-epoch batch it accepted is below its high watermark:
    /// read it to its end, then write with (`pid`, `epoch`, sequence 0..).
    At { pid: i64, epoch: i16 },
    /// Another writer's InitProducerId came in between (ours was fenced at
    /// the coordinator): take the lease again after a pause.
    Lost,
    /// The broker has no transactions of the versions used here
    /// (AddPartitionsToTxn v0-3, EndTxn v0-4, DescribeTransactions): the
    /// InitProducerId answer (`pid`, `epoch`) is all there is.
    Unsupported { pid: i64, epoch: i16, why: String },
}

/// How long [`fence_partition`] waits for the coordinator to finish
/// writing the abort marker.
const MARKER_WAIT: Duration = Duration::from_secs(15);

/// Take the producer lease of `tid` and make partition `topic`/`partition`
/// fence every older epoch, without writing a record anyone reads.
///
/// Apache Kafka checks a producer's epoch per partition, against the
/// newest epoch that partition has appended (`ProducerAppendInfo.
/// checkProducerEpoch`, a data batch or a transaction marker); the epoch
/// InitProducerId hands out reaches a partition only with a batch of it.
/// Non-transactional batches are never checked with the coordinator (only
/// transactional ones are, KIP-890's verification). So a bumped epoch
/// alone fences nothing until it is written to the partition.
///
/// This writes it as a transaction marker: InitProducerId (epoch E), an
/// empty transaction on the partition (AddPartitionsToTxn), aborted at once
/// (EndTxn): the coordinator writes an ABORT control batch of epoch E to
/// the partition, with acks=all. Consumers never see a control batch. The
/// transaction is `CompleteAbort` (DescribeTransactions) once the marker
/// is acknowledged; only then is the partition read. An older epoch's
/// write is then either before the marker (below the high watermark, so
/// the read finds it) or refused (INVALID_PRODUCER_EPOCH). Another
/// InitProducerId while ours is open or aborting fences ours at the
/// coordinator (PRODUCER_FENCED at AddPartitionsToTxn or EndTxn, or
/// CONCURRENT_TRANSACTIONS for theirs until our marker is written), so of
/// two writers racing, each that gets `Fence::At` has its marker written
/// after every older epoch's.
///
/// TV1 requests (AddPartitionsToTxn v0-3, EndTxn v0-4): the marker keeps
/// epoch E, which the writes then use (TV2 would bump it at EndTxn).
pub(crate) async fn fence_partition(
    cluster: &mut Cluster,
    tid: &str,
    topic: &str,
    partition: i32,
) -> Result<Fence, String> {
    let r = init_producer_id(cluster, tid).await?;
    if r.error_code != 0 {
        return Err(format!("InitProducerId: error code {}", r.error_code));
    }
    let (pid, epoch) = (r.producer_id.0, r.producer_epoch);
    let (add_v, end_v) = match versions(cluster, tid).await? {
        Ok(versions) => versions,
        Err(why) => return Ok(Fence::Unsupported { pid, epoch, why }),
    };
    let txn = Txn {
        tid,
        id: TransactionalId(StrBytes::from_string(tid.to_string())),
        pid,
        epoch,
    };
    let added = add_partition(cluster, &txn, topic, partition, add_v).await?;
    if !went_through("AddPartitionsToTxn", added)? {
        return Ok(Fence::Lost);
    }
    let aborted = abort(cluster, &txn, end_v).await?;
    if !went_through("EndTxn (abort)", aborted)? {
        return Ok(Fence::Lost);
    }
    wait_for_marker(cluster, &txn).await
}

/// The transaction of one fence: `tid` (as a string and as sent) and the
/// producer id and epoch InitProducerId handed out.
struct Txn<'a> {
    tid: &'a str,
    id: TransactionalId,
    pid: i64,
    epoch: i16,
}

/// The versions of AddPartitionsToTxn (v0-3) and EndTxn (v0-4) that `tid`'s
/// coordinator speaks, or why it has no transactions of those versions (or
/// no DescribeTransactions) for a fence.
async fn versions(cluster: &mut Cluster, tid: &str) -> Result<Result<(i16, i16), String>, String> {
    let conn = cluster
        .transaction_coordinator(tid)
        .await
        .map_err(|e| e.to_string())?;
    let versions = (
        conn.version::<AddPartitionsToTxnRequest>(0, 3),
        conn.version::<EndTxnRequest>(0, 4),
        conn.version::<DescribeTransactionsRequest>(0, 0),
    );
    Ok(match versions {
        (Ok(a), Ok(e), Ok(_)) => Ok((a, e)),
        (a, e, d) => Err([a.err(), e.err(), d.err()]
            .into_iter()
            .flatten()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ")),
    })
}

/// Whether the step `what` went through (error code 0) or found the
/// lease taken by a newer epoch; any other error code is an error.
fn went_through(what: &str, code: i16) -> Result<bool, String> {
    match code {
        0 => Ok(true),
        c if fenced(c) => Ok(false),
        c => Err(format!("{what}: error code {c}")),
    }
}

/// Open `txn`'s empty transaction on `topic`/`partition`
/// (AddPartitionsToTxn at version `v`): the first error code of the
/// answer, or 0.
async fn add_partition(
    cluster: &mut Cluster,
    txn: &Txn<'_>,
    topic: &str,
    partition: i32,
    v: i16,
) -> Result<i16, String> {
    let add = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(txn.id.clone())
        .with_v3_and_below_producer_id(ProducerId(txn.pid))
        .with_v3_and_below_producer_epoch(txn.epoch)
        .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![partition])]);
    coordinator_call(
        cluster,
        txn.tid,
        |c: &i16| *c,
        |conn| {
            let add = add.clone();
            Box::pin(async move {
                let r = conn.send_at(add, v).await?;
                Ok(r.results_by_topic_v3_and_below
                    .iter()
                    .flat_map(|t| &t.results_by_partition)
                    .map(|p| p.partition_error_code)
                    .find(|c| *c != 0)
                    .unwrap_or(r.error_code))
            })
        },
    )
    .await
}

/// Abort `txn` (EndTxn at version `v`): the answer's error code.
async fn abort(cluster: &mut Cluster, txn: &Txn<'_>, v: i16) -> Result<i16, String> {
    let end = EndTxnRequest::default()
        .with_transactional_id(txn.id.clone())
        .with_producer_id(ProducerId(txn.pid))
        .with_producer_epoch(txn.epoch)
        .with_committed(false);
    coordinator_call(
        cluster,
        txn.tid,
        |c: &i16| *c,
        |conn| {
            let end = end.clone();
            Box::pin(async move { Ok(conn.send_at(end, v).await?.error_code) })
        },
    )
    .await
}

/// Wait (up to [`MARKER_WAIT`]) for the coordinator to have `txn`'s abort
/// marker written (`CompleteAbort`): the fence then holds, unless a newer
/// epoch took the id meanwhile.
async fn wait_for_marker(cluster: &mut Cluster, txn: &Txn<'_>) -> Result<Fence, String> {
    let (tid, pid, epoch) = (txn.tid, txn.pid, txn.epoch);
    let describe =
        DescribeTransactionsRequest::default().with_transactional_ids(vec![txn.id.clone()]);
    let deadline = Instant::now() + MARKER_WAIT;
    let mut attempt = 0;
    loop {
        let state = match cluster.transaction_coordinator(tid).await {
            Ok(conn) => conn
                .send_at(describe.clone(), 0)
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| {
                    r.transaction_states
                        .into_iter()
                        .next()
                        .ok_or_else(|| "DescribeTransactions: no answer".to_string())
                }),
            Err(e) => Err(e.to_string()),
        };
        match state {
            Ok(s) if s.error_code == 0 => {
                if s.producer_id.0 != pid || s.producer_epoch != epoch {
                    // Someone took the lease after us: they waited for our
                    // marker, and theirs fences us.
                    return Ok(Fence::Lost);
                }
                if s.transaction_state.as_str() == "CompleteAbort" {
                    return Ok(Fence::At { pid, epoch });
                }
            }
            Ok(s) if retriable(s.error_code) => cluster.reset(),
            Ok(s) => return Err(format!("DescribeTransactions: error code {}", s.error_code)),
            Err(_) => cluster.reset(),
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the abort marker of {tid} was not written within {MARKER_WAIT:?}"
            ));
        }
        let pause = backoff(
            attempt.min(4),
            Duration::from_millis(5),
            Duration::from_millis(200),
        );
        attempt += 1;
        tokio::time::sleep(pause).await;
    }
}

/// The coordinator's answer that a newer epoch of the id exists.
fn fenced(code: i16) -> bool {
    matches!(
        code,
        errors::PRODUCER_FENCED | errors::INVALID_PRODUCER_EPOCH
    )
}
