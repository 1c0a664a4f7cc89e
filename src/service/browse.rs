//! A page of a dead-letter topic: the records that match the filters from
//! a position (a DLT partition and an offset in it) on, at most `limit` of
//! them and at most `scan` records read, and where the next page starts.
//! A DLT of millions of records is read a page at a time, never whole.
//!
//! Also the one JSON shape of a DLT record ([`record_json`]), printed by
//! `dlt inspect --json` and served by the console.
//!
//! Read-only. Marker records are skipped; re-drive attempts (markers that
//! may lie anywhere later in the topic) are not attached to a page's
//! records: `dlt inspect` reads the whole topic for them.

use serde_json::{json, Value};

use super::{escape_controls as esc, format_time, show_bytes, DltError, DltRecord, Filters};
use crate::client::Cluster;
use crate::dlt::trust::{self, Reader};
use crate::dlt_marker::is_marker;

/// ListOffsets' timestamp for a partition's end.
const LATEST: i64 = -1;

/// Where a page starts: a DLT partition and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub partition: i32,
    pub offset: i64,
}

/// One DLT partition's offsets as the page found them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub partition: i32,
    /// The log start (retention may have moved it).
    pub start: i64,
    /// The high watermark.
    pub end: i64,
}

/// What to read.
#[derive(Debug, Clone)]
pub struct PageRequest<'a> {
    pub topic: &'a str,
    /// `None`: the first partition's log start.
    pub from: Option<Position>,
    pub filters: &'a Filters,
    /// Records returned at most.
    pub limit: usize,
    /// Records read at most (matching or not): bounds the time a page
    /// takes when the filters match little.
    pub scan: u64,
    /// Bytes of keys and values returned at most (a page holds at least
    /// one record, whatever its size).
    pub max_bytes: usize,
}

/// A page of records.
#[derive(Debug)]
pub struct Page {
    pub records: Vec<DltRecord>,
    /// Where the next page starts; `None`: the page reached the end of
    /// every partition (as their ends were when read).
    pub next: Option<Position>,
    /// Records read for this page (markers and filtered ones included).
    pub scanned: u64,
    pub partitions: Vec<Span>,
}

/// Read one page of `req.topic` from the dead-letter cluster.
pub async fn page(cluster: &mut Cluster, req: &PageRequest<'_>) -> Result<Page, DltError> {
    let topic = req.topic;
    let partitions = spans(cluster, topic).await?;
    let n = i32::try_from(partitions.len()).unwrap_or(i32::MAX);
    let from = req.from.unwrap_or(Position {
        partition: 0,
        offset: 0,
    });
    if from.partition < 0 || from.partition >= n.max(1) {
        return Err(DltError::Usage(format!(
            "{topic} has no partition {} (it has {n})",
            from.partition
        )));
    }
    let mut page = Page {
        records: Vec::new(),
        next: None,
        scanned: 0,
        partitions: partitions.clone(),
    };
    let mut bytes = 0usize;
    for span in partitions.iter().filter(|s| s.partition >= from.partition) {
        let mut at = span.start;
        if span.partition == from.partition {
            if from.offset > span.end {
                return Err(DltError::Usage(format!(
                    "{topic}-{}: offset {} is past its end ({})",
                    span.partition, from.offset, span.end
                )));
            }
            at = at.max(from.offset);
        }
        if at >= span.end {
            continue;
        }
        let full = page.records.len() >= req.limit || page.scanned >= req.scan;
        let stopped = match full || bytes >= req.max_bytes {
            true => Some(at),
            false => read_into(cluster, req, span.partition, at, &mut page, &mut bytes).await?,
        };
        if let Some(offset) = stopped {
            page.next = Some(Position {
                partition: span.partition,
                offset,
            });
            return Ok(page);
        }
    }
    Ok(page)
}

/// Every partition of `topic` with its log start and end; an error when
/// the topic does not exist.
async fn spans(cluster: &mut Cluster, topic: &str) -> Result<Vec<Span>, DltError> {
    let Some(n) = cluster.partitions(topic).await? else {
        return Err(DltError::Usage(format!("topic {topic} does not exist")));
    };
    let n = i32::try_from(n).unwrap_or(i32::MAX);
    let mut partitions = Vec::with_capacity(n as usize);
    for p in 0..n {
        let start = cluster.log_start(topic, p).await?;
        let end = cluster.list_offset(topic, p, LATEST).await?;
        partitions.push(Span {
            partition: p,
            start,
            end,
        });
    }
    Ok(partitions)
}

/// Read partition `p` of `req.topic` from `at` into `page` (markers
/// skipped, the filters applied; `bytes` counts the keys and values
/// returned) until the page is full: the offset it stopped at, or `None`
/// when the partition was read to its end.
async fn read_into(
    cluster: &mut Cluster,
    req: &PageRequest<'_>,
    p: i32,
    at: i64,
    page: &mut Page,
    bytes: &mut usize,
) -> Result<Option<i64>, DltError> {
    let topic = req.topic;
    let mut full = false;
    let stopped = crate::dlt::read_partition_while(cluster, topic, p, at, &mut |r| {
        let size = r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len);
        let over = !page.records.is_empty() && *bytes + size > req.max_bytes;
        if page.records.len() >= req.limit || page.scanned >= req.scan || over {
            full = true;
            return false;
        }
        page.scanned += 1;
        let Some(ctx) = trust::open(Reader::Inspect, topic, p, r) else {
            return true;
        };
        if is_marker(&ctx) {
            return true;
        }
        let d = DltRecord::from_context(topic, p, r, &ctx, trust::keys());
        if req.filters.matches(&d) {
            *bytes += size;
            page.records.push(d);
        }
        true
    })
    .await?;
    Ok(full.then_some(stopped))
}

/// One DLT record as a JSON object (`dlt inspect --json`, the console).
/// Text is escaped as [`show_bytes`] does; bytes that are not UTF-8 are
/// shown as `0x…` hex.
pub fn record_json(r: &DltRecord) -> Value {
    let other_headers: Vec<Value> = r
        .headers
        .iter()
        .map(|(k, v)| json!({"key": esc(k), "value": v.as_deref().map(|v| show_bytes(Some(v)))}))
        .collect();
    json!({
        "dlt_topic": r.dlt_topic,
        "dlt_partition": r.dlt_partition,
        "dlt_offset": r.dlt_offset,
        "origin_topic": r.origin_topic.as_deref().map(esc),
        "origin_partition": r.origin_partition,
        "origin_offset": r.origin_offset,
        "origin_timestamp": r.origin_timestamp,
        "class": esc(&r.class),
        "rule": esc(&r.rule),
        "reason": esc(&r.reason),
        "policy": esc(&r.policy),
        "failed_at": r.failed_at.map(format_time),
        "failed_at_ms": r.failed_at,
        "attempt": r.attempt,
        "key": r.key.as_deref().map(|k| show_bytes(Some(k))),
        "value": r.value.as_deref().map(|v| show_bytes(Some(v))),
        "headers": other_headers,
        // Confluent's `__rule.*` fields, from antidote's own context only.
        "contract_rule": r.contract_rule.as_ref().map(|c| json!({
            "name": esc(&c.name),
            "mode": esc(&c.mode),
            "subject": esc(&c.subject),
            "topic": esc(&c.topic),
            "exception": esc(&c.exception),
        })),
        "redrive_attempts": r.redrive.iter().map(|a| json!({
            "attempt": a.attempt,
            "outcome": if a.redriven { "redriven" } else { "still-invalid" },
            "reason": esc(&a.reason),
        })).collect::<Vec<_>>(),
    })
}
