//! Rebuilding the ledger of diverted records at start, and reading a topic
//! from the beginning (shared with the `dlt` commands).
//!
//! The DLTs are the ledger's source of truth: each DLT record carries
//! `x-original-topic`, `x-original-partition` and `x-original-offset`. At
//! start every existing DLT that a policy can write to is read to its high
//! watermark and each original record is marked as diverted; diversions
//! wait until this is done, so a restarted proxy never writes a record
//! twice. Reading ends at the high watermark seen by the first fetch of
//! each partition (later records were written by this proxy, which knows
//! them already).

use std::sync::Arc;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{Ledger, LedgerKey, H_OFFSET, H_PARTITION, H_TOPIC};
use crate::client::{ClientError, Cluster, Endpoint};
use crate::config::HostPort;
use crate::kafka::batch::{self, Segment};
use crate::kafka::record::Record;
use crate::policy::{Class, PolicySet};

/// Read every record of `topic` from its start to the high watermark each
/// partition had when first fetched, calling `f(partition, record)`.
pub async fn read_topic<F>(cluster: &mut Cluster, topic: &str, mut f: F) -> Result<u64, ClientError>
where
    F: FnMut(i32, &Record<'_>),
{
    let Some(partitions) = cluster.partitions(topic).await? else {
        return Ok(0);
    };
    let mut count = 0;
    for partition in 0..partitions as i32 {
        let mut offset = 0i64;
        let mut end: Option<i64> = None;
        loop {
            let req = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(100)
                .with_min_bytes(1)
                .with_max_bytes(16 << 20)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition(partition)
                        .with_fetch_offset(offset)
                        .with_partition_max_bytes(8 << 20)])]);
            let resp = cluster
                .leader(topic, partition)
                .await?
                .send(req, 4, 12)
                .await?;
            let Some(p) = resp
                .responses
                .iter()
                .flat_map(|t| t.partitions.iter())
                .next()
            else {
                break;
            };
            if p.error_code != 0 {
                warn!(
                    topic,
                    partition,
                    error_code = p.error_code,
                    "reading topic: fetch error"
                );
                break;
            }
            let end = *end.get_or_insert(p.high_watermark);
            let mut next = offset;
            for seg in batch::segments(p.records.as_ref().unwrap_or(&bytes::Bytes::new())) {
                let Segment::Batch(b) = seg else { continue };
                next = next.max(b.next_offset());
                if b.is_control() {
                    continue;
                }
                match b.decode() {
                    Ok(d) => {
                        for r in d.records().filter(|r| r.offset >= offset && r.offset < end) {
                            count += 1;
                            f(partition, &r);
                        }
                    }
                    Err(e) => {
                        warn!(topic, partition, base_offset = b.base_offset(), error = %e, "reading topic: bad batch")
                    }
                }
            }
            if next <= offset || next >= end {
                break;
            }
            offset = next;
        }
    }
    Ok(count)
}

/// The original (topic, partition, offset) a DLT record names, if it names one.
pub fn origin_of(r: &Record<'_>) -> Option<LedgerKey> {
    let text = |k| {
        r.header(k)
            .flatten()
            .and_then(|v| std::str::from_utf8(v).ok())
    };
    let topic = text(H_TOPIC)?;
    let partition = text(H_PARTITION)?.parse().ok()?;
    let offset = text(H_OFFSET)?.parse().ok()?;
    Some((Arc::from(topic), partition, offset))
}

/// Rebuild the ledger from every existing DLT the policies can write to,
/// then signal `loaded`. Retries until the cluster answers.
pub(super) async fn rebuild(
    bootstrap: Vec<HostPort>,
    ep: Endpoint,
    policies: Arc<PolicySet>,
    ledger: Arc<Ledger>,
    loaded: watch::Sender<bool>,
) {
    let mut cluster = Cluster::new(bootstrap, ep);
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        match rebuild_once(&mut cluster, &policies, &ledger).await {
            Ok((topics, records)) => {
                info!(topics, records, "dead-letter ledger rebuilt from the DLTs");
                let _ = loaded.send(true);
                return;
            }
            Err(e) => {
                warn!(error = %e, "rebuilding the dead-letter ledger failed; retrying");
                cluster.reset();
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
        }
    }
}

async fn rebuild_once(
    cluster: &mut Cluster,
    policies: &PolicySet,
    ledger: &Ledger,
) -> Result<(usize, u64), ClientError> {
    let meta = cluster.metadata(None).await?;
    let existing: std::collections::HashSet<String> = meta
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
        .collect();
    let mut dlts = std::collections::BTreeSet::new();
    for topic in &existing {
        if let Some(p) = policies.for_topic(topic) {
            for class in [Class::Poison, Class::Stale, Class::Unknown] {
                let dlt = p.dead_letter_topic(topic, class);
                if existing.contains(&dlt) && &dlt != topic {
                    dlts.insert(dlt);
                }
            }
        }
    }
    let mut records = 0;
    for dlt in &dlts {
        records += read_topic(cluster, dlt, |_, r| {
            if let Some(key) = origin_of(r) {
                ledger.done(key);
            }
        })
        .await?;
    }
    Ok((dlts.len(), records))
}
