//! The proxy's own dead-letter producer: acks=all, idempotent where the
//! broker supports InitProducerId, one Produce in flight at a time.
//!
//! Jobs queue up while a write is under way and go out together in the next
//! round, one batch (or a few, see below) per DLT partition. A record of
//! origin partition P goes to DLT partition P mod (DLT partitions), keeping
//! one origin partition's diversions in order.
//!
//! Every DLT partition has its own outcome: a partition the broker
//! acknowledged is never failed or written again because another one failed.
//! A batch refused as too large (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE) is
//! split in halves and re-sent, down to single records; a single record
//! still too large fails only its own job (logged as an error, counted as
//! `antidote_dlt_writes_total{result="too_large"}`). Any other refusal fails
//! that partition's remaining jobs, so that a partition's diversions stay
//! in order; the interception layer holds their origin partitions and a
//! later fetch tries again. Batches are compressed with
//! `dead_letter.compression`, and a DLT the proxy creates gets a
//! `max.message.bytes` of `limits.max_frame_bytes`, so a batch the proxy can
//! frame is one the topic accepts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use super::lease::Leases;
use super::PendingWrite;
use crate::client::{errors, Cluster};
use crate::clock::now_ms;
use crate::config::DeadLetterConfig;
use crate::dlt::backoff;
use crate::dlt::ledger::Ledger;
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
use crate::metrics::{DltWriteSeen, Produced};

/// Most jobs taken into one round.
const MAX_JOBS_PER_ROUND: usize = 1000;
/// Most record bytes (before compression) put in one batch up front: under
/// Kafka's default `max.message.bytes` (1 MiB), so a DLT created by someone
/// else with defaults rarely needs a split.
const MAX_BATCH_BYTES: usize = 900 * 1024;
/// How long an origin topic's id is used before it is looked up again.
const ID_TTL: Duration = Duration::from_secs(30);

/// How writing jobs to a DLT partition (or topic, or round) came out;
/// ordered from best to worst.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Written {
    /// Every job acknowledged.
    All,
    /// Only records the broker refused as too large for the DLT failed.
    TooLarge,
    /// A read, lease or write failed: the cluster may have changed.
    Failed,
}

/// Why [`Producer::send_split`] stopped before its last batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stopped {
    /// A newer epoch of the partition's lease fenced the write.
    Fenced,
    /// The broker refused or did not answer.
    Failed,
}

/// Why one batch was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProduceError {
    #[error("{0}: the broker refused the batch as too large (error {1})")]
    TooLarge(String, i16),
    /// A record's timestamp is outside what the DLT accepts
    /// (`message.timestamp.{before,after}.max.ms`).
    #[error("{0}: the broker refused a record's timestamp (error {1})")]
    BadTimestamp(String, i16),
    #[error("{0}")]
    Failed(String),
    /// Another writer took this DLT partition's producer epoch (or the
    /// broker lost our producer state): read the partition again first.
    #[error("{0}: producer fenced or unknown (error {1})")]
    Fenced(String, i16),
}

pub struct Producer {
    /// The dead-letter cluster.
    pub(super) cluster: Cluster,
    /// The upstream cluster, for the origin topics' ids.
    pub(super) upstream: Cluster,
    pub(super) cfg: DeadLetterConfig,
    /// `max.message.bytes` given to the DLTs the proxy creates.
    pub(super) max_message_bytes: u32,
    pub(super) ledger: Arc<Ledger>,
    /// Asks the ledger loader to load a DLT it has not heard of.
    pub(super) wake: mpsc::UnboundedSender<()>,
    /// Per DLT partition: the producer lease this instance holds.
    pub(super) leases: Leases,
    pub(super) created: HashSet<String>,
    /// Origin topic ids and when they were looked up.
    pub(super) ids: HashMap<Arc<str>, (Uuid, Instant)>,
}

impl Producer {
    pub fn new(
        cluster: Cluster,
        upstream: Cluster,
        cfg: DeadLetterConfig,
        max_message_bytes: u32,
        ledger: Arc<Ledger>,
        wake: mpsc::UnboundedSender<()>,
    ) -> Self {
        Producer {
            cluster,
            upstream,
            cfg,
            max_message_bytes,
            ledger,
            wake,
            leases: Leases::default(),
            created: HashSet::new(),
            ids: HashMap::new(),
        }
    }

    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<PendingWrite>) {
        while let Some(first) = rx.recv().await {
            let mut jobs = vec![first];
            while jobs.len() < MAX_JOBS_PER_ROUND {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            self.round(jobs).await;
        }
    }

    /// Write one round of jobs, each DLT partition on its own.
    async fn round(&mut self, mut jobs: Vec<PendingWrite>) {
        let failed_at = now_ms();
        // Diversions arrive from concurrent tasks: write them in origin order.
        jobs.sort_by(|a, b| {
            let (a, b) = (&a.diversion, &b.diversion);
            (&a.origin_topic, a.origin_partition, a.origin_offset).cmp(&(
                &b.origin_topic,
                b.origin_partition,
                b.origin_offset,
            ))
        });
        let ids = self.origin_ids(&jobs).await;
        let mut by_topic: BTreeMap<String, Vec<PendingWrite>> = BTreeMap::new();
        for j in jobs {
            by_topic
                .entry(j.diversion.dlt_topic.clone())
                .or_default()
                .push(j);
        }
        let mut worst = Written::All;
        for (topic, jobs) in by_topic {
            worst = worst.max(self.write_topic(&topic, jobs, &ids, failed_at).await);
        }
        if worst == Written::Failed {
            // Start from scratch next time: the cluster may have been
            // replaced (topics, producer ids and sequences gone). Not after
            // a record refused as too large: that says nothing of the
            // cluster, and a new lease would write a new lease marker to the
            // DLT on every retry while the partition is held.
            self.cluster.reset();
            self.created.clear();
            self.leases.clear();
        }
    }

    /// Write `jobs` to DLT `topic`; the worst of its partitions' outcomes.
    async fn write_topic(
        &mut self,
        topic: &str,
        jobs: Vec<PendingWrite>,
        ids: &HashMap<Arc<str>, Uuid>,
        failed_at: i64,
    ) -> Written {
        if !self.wait_loaded(topic).await {
            warn!(
                dlt = topic,
                records = jobs.len(),
                "dead-letter write postponed: the DLT is not loaded into the ledger yet"
            );
            jobs.into_iter()
                .for_each(|j| finish(&self.ledger, j, false));
            return Written::Failed;
        }
        // Read back from the DLT meanwhile (written before a restart or a
        // reload): acknowledged without a second write.
        let (already, jobs): (Vec<PendingWrite>, Vec<PendingWrite>) =
            jobs.into_iter().partition(|j| self.ledger.contains(&j.key));
        already
            .into_iter()
            .for_each(|j| finish(&self.ledger, j, true));
        if jobs.is_empty() {
            return Written::All;
        }
        let n = match self.ensure_topic(topic).await {
            Ok(n) => n as i32,
            Err(e) => {
                warn!(error = %e, records = jobs.len(), "dead-letter write failed");
                jobs.into_iter()
                    .for_each(|j| finish(&self.ledger, j, false));
                return Written::Failed;
            }
        };
        let mut by_part: BTreeMap<i32, Vec<PendingWrite>> = BTreeMap::new();
        for j in jobs {
            by_part
                .entry(j.diversion.origin_partition.rem_euclid(n))
                .or_default()
                .push(j);
        }
        let mut worst = Written::All;
        for (partition, jobs) in by_part {
            worst = worst.max(
                self.write_partition(topic, partition, jobs, ids, failed_at)
                    .await,
            );
        }
        worst
    }

    /// Wait (up to `dead_letter.timeout`) until `topic` is read back into the
    /// ledger, so a record already in it is not written twice.
    async fn wait_loaded(&mut self, topic: &str) -> bool {
        if self.ledger.want(topic) {
            let _ = self.wake.send(());
        }
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        self.ledger
            .wait_loaded(&[topic.to_string()], deadline)
            .await
    }

    /// The ids of the origin topics of `jobs`, from upstream metadata at
    /// most [`ID_TTL`] old (a lookup per write would add a round trip to
    /// every diversion); a topic whose id changed has its old ledger
    /// entries dropped. A topic whose id is unknown is written without
    /// `x-original-topic-id`, which the ledger accepts.
    async fn origin_ids(&mut self, jobs: &[PendingWrite]) -> HashMap<Arc<str>, Uuid> {
        let mut topics: Vec<Arc<str>> = jobs
            .iter()
            .map(|j| j.diversion.origin_topic.clone())
            .collect();
        topics.dedup();
        let stale: Vec<String> = topics
            .iter()
            .filter(|t| self.ids.get(*t).is_none_or(|(_, at)| at.elapsed() > ID_TTL))
            .map(|t| t.to_string())
            .collect();
        if !stale.is_empty() {
            match self.upstream.metadata(Some(&stale)).await {
                Ok(meta) => {
                    for t in meta
                        .topics
                        .iter()
                        .filter(|t| t.error_code == 0 && !t.topic_id.is_nil())
                    {
                        let Some(topic) = t
                            .name
                            .as_ref()
                            .and_then(|n| topics.iter().find(|x| ***x == *n.as_str()))
                        else {
                            continue;
                        };
                        self.ledger.observe_topic_id(topic, t.topic_id);
                        self.ids.insert(topic.clone(), (t.topic_id, Instant::now()));
                    }
                }
                Err(e) => {
                    debug!(error = %e, "origin topic ids unavailable");
                    self.upstream.reset();
                }
            }
        }
        topics
            .into_iter()
            .filter_map(|t| self.ids.get(&t).map(|(id, _)| (t.clone(), *id)))
            .collect()
    }

    /// Send `records` to `topic`/`partition`: in batches of at most
    /// [`MAX_BATCH_BYTES`], each split in halves while the broker refuses it
    /// as too large or for a timestamp. A single record whose timestamp the
    /// DLT refuses is sent again, once, stamped with the time of its
    /// diversion (the original stays in `x-original-timestamp`). Whether
    /// each record was acknowledged, and why sending stopped early if it did
    /// (a single record too large does not stop it); what each Produce came
    /// to is noted in `seen`.
    pub(super) async fn send_split(
        &mut self,
        topic: &str,
        partition: i32,
        records: &mut [NewRecord],
        seen: &mut DltWriteSeen,
    ) -> (Vec<bool>, Option<Stopped>) {
        let mut ok = vec![false; records.len()];
        let mut retimed = vec![false; records.len()];
        let mut stopped = None;
        // Ranges still to send, the next one last (so they go in order).
        let mut todo: Vec<Range<usize>> = chunks(records, MAX_BATCH_BYTES);
        todo.reverse();
        while let Some(r) = todo.pop() {
            let started = Instant::now();
            match self.produce(topic, partition, &records[r.clone()]).await {
                Ok(()) => {
                    seen.produced.push((Produced::Ok, started.elapsed()));
                    seen.written += r.len() as u64;
                    ok[r].fill(true);
                }
                Err(e @ (ProduceError::TooLarge(..) | ProduceError::BadTimestamp(..)))
                    if r.len() > 1 =>
                {
                    let mid = r.start + r.len() / 2;
                    let why = match e {
                        ProduceError::TooLarge(..) => "batch too large for the DLT: splitting",
                        _ => "a record's timestamp refused by the DLT: splitting",
                    };
                    debug!(dlt = topic, partition, records = r.len(), "{why}");
                    todo.push(mid..r.end);
                    todo.push(r.start..mid);
                }
                Err(e @ ProduceError::BadTimestamp(..)) if !retimed[r.start] => {
                    seen.produced.push((Produced::Retimed, started.elapsed()));
                    warn!(error = %e, dlt = topic, partition, timestamp = records[r.start].timestamp, "the DLT refused a dead-letter record's timestamp: sent again with the time of its diversion (the original is in x-original-timestamp)");
                    records[r.start].timestamp = now_ms();
                    retimed[r.start] = true;
                    todo.push(r);
                }
                Err(e @ ProduceError::Fenced(..)) => {
                    stopped = Some(Stopped::Fenced);
                    debug!(error = %e, dlt = topic, partition, "fenced by another writer of the DLT partition");
                    break;
                }
                Err(e @ ProduceError::TooLarge(..)) => {
                    seen.produced.push((Produced::TooLarge, started.elapsed()));
                    // Retried on every fetch of its partition: logged once a
                    // minute per DLT partition (the metric counts each).
                    if too_large_logged_recently(topic, partition) {
                        debug!(error = %e, dlt = topic, partition, "a single dead-letter record is still too large for its DLT");
                    } else {
                        error!(error = %e, dlt = topic, partition, "a single dead-letter record is too large for its DLT; its partition stays held");
                    }
                }
                Err(e) => {
                    seen.produced.push((Produced::Error, started.elapsed()));
                    warn!(error = %e, dlt = topic, partition, records = todo.iter().map(|r| r.len()).sum::<usize>() + r.len(), "dead-letter write failed");
                    stopped = Some(Stopped::Failed);
                    break;
                }
            }
        }
        (ok, stopped)
    }

    /// Make sure `topic` exists (creating it if needed); its partition count.
    async fn ensure_topic(&mut self, topic: &str) -> Result<usize, String> {
        for attempt in 0..20 {
            match self
                .cluster
                .partitions(topic)
                .await
                .map_err(|e| e.to_string())?
            {
                Some(n) if n > 0 => return Ok(n),
                _ => {}
            }
            if self.created.insert(topic.to_string()) {
                self.create_topic(topic).await?;
            }
            tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
            let _ = self.cluster.metadata(Some(&[topic.to_string()])).await;
        }
        Err(format!("dead-letter topic {topic} has no partitions"))
    }

    /// Create `topic` with a `max.message.bytes` that fits what the proxy
    /// writes; a broker that refuses the config gets a plain create.
    async fn create_topic(&mut self, topic: &str) -> Result<(), String> {
        let (p, rf) = (self.cfg.partitions, self.cfg.replication_factor);
        info!(
            topic,
            partitions = p,
            max_message_bytes = self.max_message_bytes,
            "creating dead-letter topic"
        );
        let configs = [("max.message.bytes", self.max_message_bytes.to_string())];
        match self.cluster.create_topic(topic, p, rf, &configs).await {
            Ok(()) => Ok(()),
            Err(e) => {
                warn!(topic, error = %e, "creating the dead-letter topic with max.message.bytes failed; creating it without");
                self.cluster
                    .create_topic(topic, p, rf, &[])
                    .await
                    .map_err(|e| format!("cannot create dead-letter topic {topic}: {e}"))
            }
        }
    }

    /// Produce one batch to one partition with acks=all, retrying network
    /// errors (jittered backoff) with the same bytes.
    pub(super) async fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        records: &[NewRecord],
    ) -> Result<(), ProduceError> {
        let key = (topic.to_string(), partition);
        let what = || format!("{topic}-{partition}");
        let lease = self.leases.current(&key);
        let opts = BuildOptions::default()
            .compression(self.cfg.compression.codec())
            .idempotent(lease.pid, lease.epoch, lease.seq);
        let batch = build_batch(records, &opts)
            .map_err(|e| ProduceError::Failed(format!("{}: {e}", what())))?;
        let code = self.send_retrying(topic, partition, batch).await?;
        match code {
            0 | errors::DUPLICATE_SEQUENCE_NUMBER => {
                self.leases.advance(&key, records.len());
                Ok(())
            }
            errors::MESSAGE_TOO_LARGE | errors::RECORD_LIST_TOO_LARGE => {
                Err(ProduceError::TooLarge(what(), code))
            }
            errors::INVALID_TIMESTAMP => Err(ProduceError::BadTimestamp(what(), code)),
            errors::OUT_OF_ORDER_SEQUENCE_NUMBER
            | errors::UNKNOWN_PRODUCER_ID
            | errors::INVALID_PRODUCER_EPOCH
            | errors::PRODUCER_FENCED => Err(ProduceError::Fenced(what(), code)),
            errors::NOT_LEADER_OR_FOLLOWER
            | errors::LEADER_NOT_AVAILABLE
            | errors::UNKNOWN_TOPIC_OR_PARTITION => {
                self.cluster.reset();
                Err(ProduceError::Failed(format!(
                    "{}: leader not available (error {code})",
                    what()
                )))
            }
            other => Err(ProduceError::Failed(format!(
                "{}: produce error {other}",
                what()
            ))),
        }
    }

    /// One Produce request, retried on network errors; the partition's
    /// error code.
    async fn send_retrying(
        &mut self,
        topic: &str,
        partition: i32,
        batch: Bytes,
    ) -> Result<i16, ProduceError> {
        let mut last_err = String::new();
        for attempt in 0..3u32 {
            match self.cluster.produce(topic, partition, batch.clone()).await {
                Ok(p) => return Ok(p.error_code),
                Err(e) => {
                    last_err = e.to_string();
                    self.cluster.reset();
                    tokio::time::sleep(backoff(
                        attempt,
                        Duration::from_millis(100),
                        Duration::from_secs(1),
                    ))
                    .await;
                }
            }
        }
        Err(ProduceError::Failed(last_err))
    }
}

/// Consecutive ranges of `records` of at most `max_bytes` each (by value,
/// key and header sizes); a record larger than that gets a range of its own.
fn chunks(records: &[NewRecord], max_bytes: usize) -> Vec<Range<usize>> {
    let size = |r: &NewRecord| {
        r.key.as_ref().map_or(0, Bytes::len)
            + r.value.as_ref().map_or(0, Bytes::len)
            + r.headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Bytes::len) + 8)
                .sum::<usize>()
            + 24
    };
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, r) in records.iter().enumerate() {
        let s = size(r);
        if i > start && bytes + s > max_bytes {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += s;
    }
    if start < records.len() {
        out.push(start..records.len());
    }
    out
}

/// Report a job's outcome: the ledger first (so a new claim sees it), then
/// whoever waits.
pub(super) fn finish(ledger: &Ledger, job: PendingWrite, ok: bool) {
    let d = &job.diversion;
    if ok {
        info!(topic = %d.origin_topic, partition = d.origin_partition, offset = d.origin_offset,
            class = d.invalid.class.as_str(), rule = %d.invalid.rule, dlt = %d.dlt_topic,
            reason = %d.invalid.log_reason(), "record diverted");
    }
    ledger.finish(&job.key, ok);
    let _ = job.done.send(Some(ok));
}

/// Whether the too-large error of `topic`/`partition` was logged in the
/// last minute (else it is noted as logged now). At most one entry per DLT
/// partition that ever held a too-large record.
fn too_large_logged_recently(topic: &str, partition: i32) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LOGGED: OnceLock<Mutex<HashMap<(String, i32), Instant>>> = OnceLock::new();
    const EVERY: std::time::Duration = std::time::Duration::from_secs(60);
    let mut m = LOGGED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    match m.get_mut(&(topic.to_string(), partition)) {
        Some(at) if now.duration_since(*at) < EVERY => true,
        Some(at) => {
            *at = now;
            false
        }
        None => {
            m.insert((topic.to_string(), partition), now);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value_len: usize) -> NewRecord {
        NewRecord {
            timestamp: 1,
            key: None,
            value: Some(Bytes::from(vec![b'x'; value_len])),
            headers: vec![],
        }
    }

    #[test]
    fn chunks_bound_bytes_and_keep_order() {
        let recs: Vec<_> = [10, 10, 100, 10, 500, 10].iter().map(|&n| rec(n)).collect();
        assert_eq!(chunks(&recs, 200), [0..3, 3..4, 4..5, 5..6]);
        // One chunk: the records 0 to 5.
        #[allow(clippy::single_range_in_vec_init)]
        let one = [0..6];
        assert_eq!(chunks(&recs, 10_000), one);
        assert!(chunks(&[], 10).is_empty());
    }
}
