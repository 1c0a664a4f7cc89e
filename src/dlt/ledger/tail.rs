//! Reading many DLT partitions at once ([`read_new`]): the DLT follower
//! (`dlt::follower`) reads with it every DLT in the ledger from where the
//! rebuild (or the last round) stopped, so diversions written by other
//! instances of a fleet reach this instance's ledger within about
//! `TAIL_INTERVAL` plus one Fetch round trip, and their records keep being
//! removed from responses; the blocked keys and re-drive read with it too.
//!
//! Also the catch-up the producer runs just before a DLT write: read the DLT
//! partition from the tail's position to its end, so a record another
//! instance wrote meanwhile is not written again ([`catch_up`]).
//!
//! Bounds: one Fetch per DLT leader per round (every partition of every
//! loaded DLT on that leader in it, `max_wait_ms` 0, at most
//! [`FETCH_MAX_BYTES`] per response), over the follower's one connection
//! per broker; at most [`MAX_ROUNDS`] rounds per call, so a reader far
//! behind catches up over several calls instead of holding the follower.
//! It never writes, and it never marks a DLT loaded: only the rebuild does.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tracing::debug;

use crate::client::{errors, ClientError, Cluster};
use crate::dlt::read::{self, Visited};
use crate::dlt::trust::{self, Reader};
use crate::kafka::record::Record;
use antidote_core::dlt_record::Origin;

/// Most bytes of one tail Fetch response.
const FETCH_MAX_BYTES: i32 = 8 << 20;
/// Most bytes of one partition in a tail Fetch response.
const PARTITION_MAX_BYTES: i32 = 1 << 20;
/// How long the broker may wait for new DLT records: 1 ms. Not 0: tansu
/// 0.6 answers a Fetch with `max_wait_ms` 0 with no partitions at all, and
/// it waits `max_wait_ms` at the end of a partition even with `min_bytes`
/// 0 (so each read that reaches the end costs this much).
const MAX_WAIT_MS: i32 = 1;
/// Most Fetch rounds per tick.
const MAX_ROUNDS: usize = 16;

/// (DLT, partition).
pub type DltPartition = (String, i32);

/// What one partition of a tail Fetch said: its next position, and the end
/// a read_committed reader can reach (the last stable offset when the
/// broker gives one, else the high watermark).
struct Progress {
    next: i64,
    end: i64,
    /// The partition ends below where it was read to (the DLT was deleted
    /// and created again, or truncated): `next` goes back to its start.
    reset: bool,
}

/// Fetch `parts` (each at its position) from `node`, read_committed, no
/// wait; call `f(dlt, partition, Some(record))` for every record at or
/// after its partition's position, and `f(dlt, partition, None)` when the
/// partition ends below its position (recreated or truncated: it is read
/// again from its start, and every position kept of it is void). The
/// progress of each partition that answered.
async fn fetch_round<F>(
    cluster: &mut Cluster,
    node: i32,
    parts: &[(DltPartition, i64)],
    f: &mut F,
) -> Result<HashMap<DltPartition, Progress>, ClientError>
where
    F: FnMut(&str, i32, Option<&Record<'_>>),
{
    let resp = cluster
        .node(node)
        .await?
        .send(request(parts), 4, 12)
        .await?;
    let position: HashMap<(&str, i32), i64> = parts
        .iter()
        .map(|((t, p), o)| ((t.as_str(), *p), *o))
        .collect();
    let mut out = HashMap::new();
    for t in resp.responses {
        let name = t.topic.0.to_string();
        for p in t.partitions {
            let Some(&from) = position.get(&(name.as_str(), p.partition_index)) else {
                continue;
            };
            let progress = if p.error_code != 0 {
                failed(cluster, &name, &p, from, f).await?
            } else {
                let records = p.records.unwrap_or_default();
                tracing::trace!(dlt = %name, partition = p.partition_index, from, hw = p.high_watermark, bytes = records.len(), "tail fetched");
                let next = visit(&name, p.partition_index, from, &records, f)?;
                let end = match p.last_stable_offset {
                    lso if lso >= 0 => lso.min(p.high_watermark),
                    _ => p.high_watermark,
                };
                Some(Progress {
                    next,
                    end,
                    reset: false,
                })
            };
            if let Some(progress) = progress {
                out.insert((name.clone(), p.partition_index), progress);
            }
        }
    }
    Ok(out)
}

/// One tail Fetch of `parts`, each from its position: read_committed,
/// [`MAX_WAIT_MS`], at most [`FETCH_MAX_BYTES`].
fn request(parts: &[(DltPartition, i64)]) -> FetchRequest {
    let mut by_topic: BTreeMap<&str, Vec<FetchPartition>> = BTreeMap::new();
    for ((t, p), offset) in parts {
        by_topic.entry(t).or_default().push(
            FetchPartition::default()
                .with_partition(*p)
                .with_fetch_offset(*offset)
                .with_partition_max_bytes(PARTITION_MAX_BYTES),
        );
    }
    let topics = by_topic
        .into_iter()
        .map(|(t, ps)| {
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(t.to_string())))
                .with_partitions(ps)
        })
        .collect();
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(FETCH_MAX_BYTES)
        .with_isolation_level(1)
        .with_session_epoch(-1)
        .with_topics(topics)
}

/// A partition of DLT `name` answered with an error, read from `from`:
/// forget its leader if it moved; the progress when the error says where
/// to go on (the log start moved past `from`), else `None` (asked again
/// next round).
async fn failed<F>(
    cluster: &mut Cluster,
    name: &str,
    p: &PartitionData,
    from: i64,
    f: &mut F,
) -> Result<Option<Progress>, ClientError>
where
    F: FnMut(&str, i32, Option<&Record<'_>>),
{
    debug!(dlt = %name, partition = p.partition_index, error = p.error_code, "tail fetch error");
    if moved(p.error_code) {
        // The leader moved (a reassignment took the partition off this
        // broker, a broker stopped): without this the cached leader is
        // asked forever and the tail stands still, silently (the answer is
        // not an error of the request). The next round looks the leader
        // up again.
        cluster.forget_leaders(name);
    }
    if p.error_code != errors::OFFSET_OUT_OF_RANGE {
        return Ok(None);
    }
    // Retention or DeleteRecords moved the log start past `from`: go on
    // from the log start. The answer says nothing of the end (Kafka gives
    // no high watermark with an error), and the log start is not the end:
    // records may follow it. Ask for the end. A position past the end
    // means another partition under the same name (recreated) or a
    // truncated one: read it from its start.
    let start = cluster.log_start(name, p.partition_index).await?;
    let end = cluster.list_offset(name, p.partition_index, -1).await?;
    let reset = from > end;
    let next = if reset { start } else { start.max(from) };
    if reset {
        tracing::warn!(dlt = %name, partition = p.partition_index, position = from, end,
            "DLT partition ends below the position read to (recreated or truncated): reading it from its start");
        f(name, p.partition_index, None);
    }
    Ok(Some(Progress {
        next,
        end: end.max(next),
        reset,
    }))
}

/// Partition errors of a Fetch that mean the broker asked is no longer
/// the partition's leader (or does not hold it at all).
fn moved(code: i16) -> bool {
    use kafka_protocol::ResponseError as E;
    [
        errors::NOT_LEADER_OR_FOLLOWER,
        errors::LEADER_NOT_AVAILABLE,
        errors::UNKNOWN_TOPIC_OR_PARTITION,
        E::FencedLeaderEpoch.code(),
        E::UnknownLeaderEpoch.code(),
        E::ReplicaNotAvailable.code(),
        E::KafkaStorageError.code(),
    ]
    .contains(&code)
}

/// Call `f` for every record of `records` at or after `from`; the offset
/// after the last complete batch (or `from`).
fn visit<F>(
    dlt: &str,
    partition: i32,
    from: i64,
    records: &Bytes,
    f: &mut F,
) -> Result<i64, ClientError>
where
    F: FnMut(&str, i32, Option<&Record<'_>>),
{
    let mut each = |r: &Record<'_>| {
        f(dlt, partition, Some(r));
        true
    };
    match read::visit((dlt, partition), records, from..i64::MAX, &mut each)? {
        Visited::Through(next) | Visited::Stopped(next) => Ok(next),
    }
}

/// Read `parts` from their positions up to their ends (see [`Progress`]),
/// at most [`MAX_ROUNDS`] rounds, calling `f` as [`fetch_round`] does;
/// updates the positions, returns the ends seen.
pub async fn read_new<F>(
    cluster: &mut Cluster,
    positions: &mut HashMap<DltPartition, i64>,
    f: &mut F,
) -> Result<HashMap<DltPartition, i64>, ClientError>
where
    F: FnMut(&str, i32, Option<&Record<'_>>),
{
    let mut ends: HashMap<DltPartition, i64> = HashMap::new();
    let mut todo: Vec<DltPartition> = positions.keys().cloned().collect();
    for _ in 0..MAX_ROUNDS {
        if todo.is_empty() {
            break;
        }
        let mut by_node: BTreeMap<i32, Vec<(DltPartition, i64)>> = BTreeMap::new();
        for dp in todo.drain(..) {
            let node = cluster.leader_id(&dp.0, dp.1).await?;
            let pos = positions.get(&dp).copied().unwrap_or(0);
            by_node.entry(node).or_default().push((dp, pos));
        }
        for (node, parts) in by_node {
            for (dp, pr) in fetch_round(cluster, node, &parts, f).await? {
                ends.insert(dp.clone(), pr.end);
                let old = positions.get(&dp).copied().unwrap_or(0);
                let moved = if pr.reset {
                    pr.next != old
                } else {
                    pr.next > old
                };
                positions.insert(
                    dp.clone(),
                    if pr.reset { pr.next } else { pr.next.max(old) },
                );
                // More to read: another round (a partition that made no
                // progress below its end waits for the next tick).
                if moved && pr.next < pr.end {
                    todo.push(dp);
                }
            }
        }
    }
    Ok(ends)
}

/// Read DLT `dlt`'s `partition` from `from` to its end (as many rounds as
/// it takes); the origins named there that `wanted` keeps (so memory is
/// bounded by the writes asked about, not by what is read). Run by the
/// producer just before writing to that partition.
///
/// The end is where an answer says it is and the read got there. An answer
/// that leaves the partition out (tansu 0.6 answers some Fetches with no
/// partitions at all, or it named an error) says nothing about the end, and
/// one that gives no records below its end has records in flight: tansu 0.6
/// raises a partition's watermark before it stores the batch, so for a
/// moment the end is past what can be read. Taking either for the end
/// would write again what another instance just wrote, so both are asked
/// again, [`CATCH_UP_TRIES`] times 10 ms apart, and then the read fails
/// (the write waits for the next fetch).
pub async fn catch_up(
    cluster: &mut Cluster,
    dlt: &str,
    partition: i32,
    from: i64,
    wanted: impl Fn(&Origin) -> bool,
) -> Result<Vec<Origin>, ClientError> {
    let key = (dlt.to_string(), partition);
    let mut positions = HashMap::from([(key.clone(), from)]);
    let mut found = Vec::new();
    let mut waits = 0;
    loop {
        let before = positions.get(&key).copied().unwrap_or(from);
        let ends = read_new(cluster, &mut positions, &mut |dlt, p, r| {
            let Some(r) = r else { return };
            let ctx = trust::open(Reader::Tail, dlt, p, r);
            if let Some(o) = ctx.and_then(|c| Origin::of(&c)).filter(|o| wanted(o)) {
                found.push(o);
            }
        })
        .await?;
        let now = positions.get(&key).copied().unwrap_or(from);
        let end = ends.get(&key).copied();
        if end.is_some_and(|end| now >= end) {
            return Ok(found);
        }
        if end.is_none() || now <= before {
            waits += 1;
            if waits > CATCH_UP_TRIES {
                let end = end.map_or("unknown".to_string(), |e| e.to_string());
                return Err(crate::client::no_broker(format!(
                    "{dlt}-{partition}: read stuck at offset {now} (end {end})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Fetches [`catch_up`] tries (10 ms apart) when an answer says nothing
/// about the partition's end or gives nothing below it, before it gives up
/// (the write then waits).
const CATCH_UP_TRIES: usize = 20;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::client::mock_broker::MockBroker;
    use crate::client::{Cluster, Endpoint};

    fn endpoint() -> Endpoint {
        Endpoint {
            tls: None,
            sasl: None,
            timeout: Duration::from_secs(2),
            max_frame: 1 << 20,
        }
    }

    /// A broker answering a tail Fetch with NOT_LEADER_OR_FOLLOWER (its
    /// partition moved away, as a reassignment off it does on Kafka): the
    /// cached leader is forgotten, so the next round asks metadata for the
    /// new one instead of the old broker forever.
    #[tokio::test]
    async fn a_tail_fetch_answered_not_leader_forgets_the_cached_leader() {
        let mock = MockBroker::start().await;
        mock.add_topic("t.dlt", 1);
        let mut cluster = Cluster::new(vec![mock.addr.clone()], endpoint());
        assert_eq!(
            cluster.partitions("t.dlt").await.expect("metadata"),
            Some(1)
        );
        mock.state().fail_fetches = 1;
        let mut positions = std::collections::HashMap::from([(("t.dlt".to_string(), 0), 0)]);
        let ends = super::read_new(&mut cluster, &mut positions, &mut |_, _, _| {})
            .await
            .expect("read");
        assert!(
            ends.is_empty(),
            "the refused partition has no end: {ends:?}"
        );
        assert_eq!(
            cluster.known_partitions("t.dlt"),
            None,
            "the leader that refused is still cached"
        );
        // The next round looks the leader up and reads.
        let ends = super::read_new(&mut cluster, &mut positions, &mut |_, _, _| {})
            .await
            .expect("read");
        assert_eq!(ends.get(&("t.dlt".to_string(), 0)), Some(&0));
    }
}
