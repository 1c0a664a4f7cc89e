//! Following a topic partition from an offset: read what was written since
//! the last call, up to the high watermark seen by this call's first fetch.
//! The blocked-key set and the re-drive loop follow DLTs this way (they
//! must see records and markers written after the start, by this instance
//! or another). Owns no state: the caller keeps the next offset.

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::client::{errors, no_broker, ClientError, Cluster};
use crate::kafka::batch::{self, Segment};
use crate::kafka::record::Record;

/// Bytes one fetch may return (per partition): bounds a follower's memory.
const FETCH_BYTES: i32 = 4 << 20;

async fn fetch(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<(i16, i64, Bytes), ClientError> {
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        // tansu answers a fetch with no wait and no minimum with no
        // partition at all; a short wait for one byte works. At a
        // partition's end the broker waits this long: it bounds the cost
        // of an idle partition per pass.
        .with_max_wait_ms(10)
        .with_min_bytes(1)
        .with_max_bytes(FETCH_BYTES)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(FETCH_BYTES)])]);
    let resp = cluster
        .leader(topic, partition)
        .await?
        .send(req, 4, 12)
        .await?;
    let p = resp
        .responses
        .into_iter()
        .flat_map(|t| t.partitions)
        .next()
        .ok_or_else(|| no_broker(format!("{topic}-{partition}: empty fetch response")))?;
    Ok((
        p.error_code,
        p.high_watermark,
        p.records.unwrap_or_default(),
    ))
}

/// Read `topic`/`partition` from `from` (`None`: its log start) to the high
/// watermark of the first fetch, calling `f` for each record; returns the
/// offset to continue from. `f` returning false stops the read at that
/// record (it is read again next time): a caller out of room forgets
/// nothing. A batch that does not decode is an error (the caller
/// retries), never skipped.
pub async fn follow<F>(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    from: Option<i64>,
    f: &mut F,
) -> Result<i64, ClientError>
where
    F: FnMut(&Record<'_>) -> bool,
{
    let mut offset = match from {
        Some(o) => o,
        None => cluster.log_start(topic, partition).await?,
    };
    let mut end: Option<i64> = None;
    loop {
        let (code, hw, records) = fetch(cluster, topic, partition, offset).await?;
        if code == errors::OFFSET_OUT_OF_RANGE {
            let start = cluster.log_start(topic, partition).await?;
            if start > offset {
                offset = start;
                continue;
            }
        }
        if code != 0 {
            return Err(no_broker(format!(
                "{topic}-{partition}: fetch at offset {offset}: error {code}"
            )));
        }
        let end = *end.get_or_insert(hw);
        if offset >= end {
            return Ok(offset);
        }
        let mut next = offset;
        for seg in batch::segments(&records) {
            let Segment::Batch(b) = seg else { continue };
            next = next.max(b.next_offset());
            if b.is_control() {
                continue;
            }
            let d = b.decode().map_err(|e| {
                no_broker(format!(
                    "{topic}-{partition}: batch at {}: {e}",
                    b.base_offset()
                ))
            })?;
            for r in d.records().filter(|r| r.offset >= offset && r.offset < end) {
                if !f(&r) {
                    return Ok(r.offset);
                }
            }
        }
        if next <= offset {
            return Err(no_broker(format!(
                "{topic}-{partition}: no progress reading at offset {offset} (high watermark {end})"
            )));
        }
        if next >= end {
            return Ok(next);
        }
        offset = next;
    }
}
