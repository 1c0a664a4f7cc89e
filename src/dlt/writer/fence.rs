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
    let txn_id = TransactionalId(StrBytes::from_string(tid.to_string()));
    let versions = match cluster.transaction_coordinator(tid).await {
        Ok(conn) => (
            conn.version::<AddPartitionsToTxnRequest>(0, 3),
            conn.version::<EndTxnRequest>(0, 4),
            conn.version::<DescribeTransactionsRequest>(0, 0),
        ),
        Err(e) => return Err(e.to_string()),
    };
    let (add_v, end_v) = match versions {
        (Ok(a), Ok(e), Ok(_)) => (a, e),
        (a, e, d) => {
            let why = [a.err(), e.err(), d.err()]
                .into_iter()
                .flatten()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            return Ok(Fence::Unsupported { pid, epoch, why });
        }
    };
    let add = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(txn_id.clone())
        .with_v3_and_below_producer_id(ProducerId(pid))
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![partition])]);
    let code = coordinator_call(
        cluster,
        tid,
        |c: &i16| *c,
        |conn| {
            let add = add.clone();
            Box::pin(async move {
                let r = conn.send_at(add, add_v).await?;
                Ok(r.results_by_topic_v3_and_below
                    .iter()
                    .flat_map(|t| &t.results_by_partition)
                    .map(|p| p.partition_error_code)
                    .find(|c| *c != 0)
                    .unwrap_or(r.error_code))
            })
        },
    )
    .await?;
    match code {
        0 => {}
        c if fenced(c) => return Ok(Fence::Lost),
        c => return Err(format!("AddPartitionsToTxn: error code {c}")),
    }
    let end = EndTxnRequest::default()
        .with_transactional_id(txn_id.clone())
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_committed(false);
    let code = coordinator_call(
        cluster,
        tid,
        |c: &i16| *c,
        |conn| {
            let end = end.clone();
            Box::pin(async move { Ok(conn.send_at(end, end_v).await?.error_code) })
        },
    )
    .await?;
    match code {
        0 => {}
        c if fenced(c) => return Ok(Fence::Lost),
        c => return Err(format!("EndTxn (abort): error code {c}")),
    }
    // Wait for the coordinator to have the marker written.
    let describe = DescribeTransactionsRequest::default().with_transactional_ids(vec![txn_id]);
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
