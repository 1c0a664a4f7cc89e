//! Reading a topic partition: from an offset (or its log start) to the high
//! watermark seen by the read's first fetch, one read loop for every reader
//! of one partition. The ledger's loading (`ledger::rebuild`) and the `dlt`
//! commands read whole partitions ([`read_topic`], [`read_partition`]); the
//! DLT follower (`dlt::follower`) reads what was written since its last
//! call for the blocked keys and re-drive ([`follow`]), and hands each
//! record whose frame opened to them as an [`Event`]. Owns no state: the
//! caller keeps the next offset.

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tracing::warn;

use crate::client::{errors, no_broker, ClientError, Cluster};
use crate::dlt_context::Context;
use crate::dlt_marker::Marker;
use crate::kafka::batch::{self, Segment};
use crate::kafka::record::Record;

/// One DLT record whose frame opened: what the readers act on.
pub enum Event<'a> {
    /// A diverted record (or whole batch), with its context headers.
    Diverted {
        ctx: &'a Context<'a>,
        record: &'a Record<'a>,
    },
    /// A marker: release/discard, re-drive attempt, breaker.
    Marker(Marker),
}

/// One fetch returns at most 4 MiB, which bounds a follower's memory.
/// tansu answers a fetch with no wait and no minimum with no partition at
/// all; a short wait for one byte works. At a partition's end the broker
/// waits this long: it bounds the cost of an idle partition per pass.
const FOLLOW_LIMITS: FetchLimits = FetchLimits {
    max_wait_ms: 10,
    max_bytes: 4 << 20,
    partition_max_bytes: 4 << 20,
};

/// ListOffsets' timestamp for a partition's end.
const LATEST: i64 = -1;

/// How long one Fetch may wait and how much it may return.
#[derive(Debug, Clone, Copy)]
struct FetchLimits {
    max_wait_ms: i32,
    max_bytes: i32,
    partition_max_bytes: i32,
}

/// The ledger's reads: 8 MiB per partition, 16 MiB per response.
const READ_LIMITS: FetchLimits = FetchLimits {
    max_wait_ms: 100,
    max_bytes: 16 << 20,
    partition_max_bytes: 8 << 20,
};

/// One Fetch of `topic`/`partition` at `offset` within `limits`: (error
/// code, high watermark, records section).
async fn fetch_partition(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    offset: i64,
    limits: FetchLimits,
) -> Result<(i16, i64, bytes::Bytes), ClientError> {
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(limits.max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(limits.max_bytes)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(limits.partition_max_bytes)])]);
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

/// Read every record of `topic` from each partition's log start to the high
/// watermark it had when first fetched, calling `f(partition, record)`.
pub async fn read_topic<F>(cluster: &mut Cluster, topic: &str, mut f: F) -> Result<u64, ClientError>
where
    F: FnMut(i32, &Record<'_>),
{
    let Some(partitions) = cluster.partitions(topic).await? else {
        return Ok(0);
    };
    let mut count = 0;
    for partition in 0..partitions as i32 {
        count += read_partition(cluster, topic, partition, &mut f).await?;
    }
    Ok(count)
}

/// Read `topic`/`partition` from its log start to the high watermark of the
/// first fetch. Retention moving the log start while reading is followed;
/// any other error ends the read with `Err` (the caller retries).
pub async fn read_partition<F>(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    f: &mut F,
) -> Result<u64, ClientError>
where
    F: FnMut(i32, &Record<'_>),
{
    read_partition_end(cluster, topic, partition, None, f)
        .await
        .map(|(count, _)| count)
}

/// [`read_partition`] from `from` (`None`: the log start), also returning
/// the offset it read to (where a tail of the partition goes on). A `from`
/// past the partition's end is an error.
pub async fn read_partition_end<F>(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    from: Option<i64>,
    f: &mut F,
) -> Result<(u64, i64), ClientError>
where
    F: FnMut(i32, &Record<'_>),
{
    let mut count = 0;
    let mut each = |r: &Record<'_>| {
        count += 1;
        f(partition, r);
        true
    };
    let end = read(
        cluster,
        topic,
        partition,
        from,
        READ_LIMITS,
        Past::Fail,
        &mut each,
    )
    .await?;
    Ok((count, end))
}

/// Read `topic`/`partition` from `from` (`None`: its log start) to the high
/// watermark of the first fetch, calling `f` for each record; returns the
/// offset to continue from. `f` returning false stops the read at that
/// record (it is read again next time): a caller out of room forgets
/// nothing. A partition that now ends below `from` (deleted and created
/// again, or truncated) is read again from its start. A batch that does
/// not decode is an error (the caller retries), never skipped.
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
    read(
        cluster,
        topic,
        partition,
        from,
        FOLLOW_LIMITS,
        Past::FromStart,
        f,
    )
    .await
}

/// A browser's reads (the console): 1 MiB per partition and response (a
/// larger first batch still comes whole); tansu needs a short wait, as
/// for a follower.
const BROWSE_LIMITS: FetchLimits = FetchLimits {
    max_wait_ms: 10,
    max_bytes: 1 << 20,
    partition_max_bytes: 1 << 20,
};

/// Read `topic`/`partition` from `from` to the high watermark of the first
/// fetch, calling `f` for each record until it returns false (that record
/// is where the next read starts); returns that offset, or the end. A
/// `from` past the partition's end is an error. For reading a page of a
/// DLT (`service::browse`), never the whole partition at once.
pub async fn read_partition_while<F>(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    from: i64,
    f: &mut F,
) -> Result<i64, ClientError>
where
    F: FnMut(&Record<'_>) -> bool,
{
    read(
        cluster,
        topic,
        partition,
        Some(from),
        BROWSE_LIMITS,
        Past::Fail,
        f,
    )
    .await
}

/// What a read does when `from` is past the partition's end.
#[derive(Clone, Copy, PartialEq)]
enum Past {
    /// Read again from the log start (a follower whose partition was
    /// recreated below its position).
    FromStart,
    /// Fail with the broker's error (a read asked for a range).
    Fail,
}

/// The one read loop: [`follow`]'s contract, with `limits` per Fetch and
/// `past` for a position past the end.
async fn read<F>(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    from: Option<i64>,
    limits: FetchLimits,
    past: Past,
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
        let (code, hw, records) =
            fetch_partition(cluster, topic, partition, offset, limits).await?;
        if code == errors::OFFSET_OUT_OF_RANGE {
            if let Some(start) = out_of_range(cluster, topic, partition, offset, past).await? {
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
        let next = match visit((topic, partition), &records, offset..end, f)? {
            Visited::Stopped(at) => return Ok(at),
            Visited::Through(next) => next,
        };
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

/// Where a read at `offset` goes on after OFFSET_OUT_OF_RANGE: the log
/// start when it moved past `offset` (retention, DeleteRecords) or, under
/// [`Past::FromStart`], when the partition now ends below `offset`; `None`
/// when the read fails.
async fn out_of_range(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    offset: i64,
    past: Past,
) -> Result<Option<i64>, ClientError> {
    let start = cluster.log_start(topic, partition).await?;
    if start > offset {
        return Ok(Some(start));
    }
    // Past its end: the partition was deleted and created again (or
    // truncated) below where this reader had got to. Read the new one from
    // its start, as the DLT tail does; waiting for its end to pass the old
    // position would miss every record until then.
    if past == Past::FromStart {
        let end = cluster.list_offset(topic, partition, LATEST).await?;
        if end < offset && end >= start {
            warn!(topic, partition, from = offset, end,
                "a followed partition ends below where it was read to (deleted and created again?): read again from its start");
            return Ok(Some(start));
        }
    }
    Ok(None)
}

/// How [`visit`] ended.
pub(crate) enum Visited {
    /// The callback stopped at this offset (it is read again next time).
    Stopped(i64),
    /// Every record was given; the offset after the last complete batch
    /// (at least the range's start).
    Through(i64),
}

/// Give `f` every record in `range` of `records` (fetched from `topic`,
/// `partition`) until it returns false; control batches are skipped. A
/// batch that does not decode is an error, never a gap: a reader (the
/// ledger) would silently lose its entries. The one batch walk of the DLT
/// readers (this module's read loop and the ledger's tail).
pub(crate) fn visit<F>(
    (topic, partition): (&str, i32),
    records: &bytes::Bytes,
    range: std::ops::Range<i64>,
    f: &mut F,
) -> Result<Visited, ClientError>
where
    F: FnMut(&Record<'_>) -> bool,
{
    let mut next = range.start;
    for seg in batch::segments(records) {
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
        for r in d.records().filter(|r| range.contains(&r.offset)) {
            if !f(&r) {
                return Ok(Visited::Stopped(r.offset));
            }
        }
    }
    Ok(Visited::Through(next))
}
