//! Following a topic partition from an offset: read what was written since
//! the last call, up to the high watermark seen by this call's first fetch.
//! The DLT follower (`dlt::follower`) reads DLTs this way for the
//! blocked keys and re-drive (they must see records and markers written
//! after the start, by this instance or another), and hands each record
//! whose frame opened to them as an [`Event`]. Owns no state: the caller
//! keeps the next offset.

use tracing::warn;

use crate::client::{errors, no_broker, ClientError, Cluster};
use crate::dlt::ledger::rebuild::{fetch_partition, FetchLimits};
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
const LIMITS: FetchLimits = FetchLimits {
    max_wait_ms: 10,
    max_bytes: 4 << 20,
    partition_max_bytes: 4 << 20,
};

/// ListOffsets' timestamp for a partition's end.
const LATEST: i64 = -1;

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
        let (code, hw, records) =
            fetch_partition(cluster, topic, partition, offset, LIMITS).await?;
        if code == errors::OFFSET_OUT_OF_RANGE {
            let start = cluster.log_start(topic, partition).await?;
            if start > offset {
                offset = start;
                continue;
            }
            // Past its end: the partition was deleted and created again (or
            // truncated) below where this reader had got to. Read the new
            // one from its start, as the DLT tail does; waiting for its end
            // to pass the old position would miss every record until then.
            let end = cluster.list_offset(topic, partition, LATEST).await?;
            if end < offset && end >= start {
                warn!(topic, partition, from = offset, end,
                    "a followed partition ends below where it was read to (deleted and created again?): read again from its start");
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
