//! The proxy's own dead-letter producer: acks=all, idempotent where the
//! broker supports InitProducerId, one Produce in flight at a time.
//!
//! Jobs queue up while a write is under way and go out together in the next
//! request, one batch per DLT partition. A record of origin partition P goes
//! to DLT partition P mod (DLT partitions), keeping one origin partition's
//! diversions in order. A request that fails on the network is retried with
//! the same batch bytes (same producer id and sequence, so the broker can
//! drop a duplicate) until the job's attempt budget runs out; then the jobs
//! fail, the ledger forgets them, and the interception layer holds their
//! partitions until a later fetch tries again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::InitProducerIdRequest;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Job, Ledger};
use crate::client::{errors, Cluster, Endpoint};
use crate::config::{DeadLetter as DeadLetterConfig, HostPort};
use crate::intercept::now_ms;
use crate::kafka::builder::{build_batch, BuildOptions};

/// Most jobs sent in one Produce request.
const MAX_JOBS_PER_REQUEST: usize = 1000;

pub struct Producer {
    cluster: Cluster,
    cfg: DeadLetterConfig,
    /// (producer id, epoch); (-1, -1) when the broker has no idempotence.
    pid: (i64, i16),
    pid_known: bool,
    sequences: HashMap<(String, i32), i32>,
    created: std::collections::HashSet<String>,
}

impl Producer {
    pub fn new(bootstrap: Vec<HostPort>, ep: Endpoint, cfg: DeadLetterConfig) -> Self {
        Producer {
            cluster: Cluster::new(bootstrap, ep),
            cfg,
            pid: (-1, -1),
            pid_known: false,
            sequences: HashMap::new(),
            created: Default::default(),
        }
    }

    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Job>, ledger: Arc<Ledger>) {
        while let Some(first) = rx.recv().await {
            let mut jobs = vec![first];
            while jobs.len() < MAX_JOBS_PER_REQUEST {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            let started = std::time::Instant::now();
            let result = self.write(&jobs).await;
            let ok = result.is_ok();
            if let Err(e) = &result {
                warn!(error = %e, records = jobs.len(), "dead-letter write failed");
                // Start from scratch next time: the cluster may have been
                // replaced (topics, producer ids and sequences gone).
                self.cluster.reset();
                self.created.clear();
                self.pid_known = false;
            } else {
                debug!(records = jobs.len(), elapsed = ?started.elapsed(), "dead-letter write acknowledged");
            }
            for job in jobs {
                let d = &job.diversion;
                let key = d.ledger_key();
                if ok {
                    info!(topic = %d.origin_topic, partition = d.origin_partition, offset = d.origin_offset,
                        class = d.invalid.class.as_str(), rule = %d.invalid.rule, dlt = %d.dlt_topic,
                        reason = %d.invalid.reason, "record diverted");
                    ledger.done(key);
                } else {
                    ledger.failed(&key);
                }
                let _ = job.done.send(Some(ok));
            }
        }
    }

    /// Write every job's record; Ok only if all were acknowledged.
    async fn write(&mut self, jobs: &[Job]) -> Result<(), String> {
        let failed_at = now_ms();
        // Diversions arrive from concurrent tasks: write them in origin order.
        let mut jobs: Vec<&Job> = jobs.iter().collect();
        jobs.sort_by(|a, b| {
            let (a, b) = (&a.diversion, &b.diversion);
            (&a.origin_topic, a.origin_partition, a.origin_offset).cmp(&(
                &b.origin_topic,
                b.origin_partition,
                b.origin_offset,
            ))
        });
        // Group by DLT topic, then DLT partition, keeping arrival order.
        let mut by_topic: BTreeMap<String, Vec<&Job>> = BTreeMap::new();
        for j in jobs {
            by_topic
                .entry(j.diversion.dlt_topic.clone())
                .or_default()
                .push(j);
        }
        let mut batches: Vec<(String, i32, Vec<&Job>)> = Vec::new();
        for (topic, jobs) in by_topic {
            let n = self.ensure_topic(&topic).await? as i32;
            let mut by_part: BTreeMap<i32, Vec<&Job>> = BTreeMap::new();
            for j in jobs {
                by_part
                    .entry(j.diversion.origin_partition.rem_euclid(n))
                    .or_default()
                    .push(j);
            }
            batches.extend(by_part.into_iter().map(|(p, js)| (topic.clone(), p, js)));
        }
        self.ensure_pid().await;
        for (topic, partition, jobs) in batches {
            let records: Vec<_> = jobs
                .iter()
                .map(|j| j.diversion.to_record(failed_at))
                .collect();
            let started = std::time::Instant::now();
            let result = self.produce(&topic, partition, &records).await;
            crate::metrics::global().dlt_write(result.is_ok(), started.elapsed());
            result?;
        }
        Ok(())
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
                info!(
                    topic,
                    partitions = self.cfg.partitions,
                    "creating dead-letter topic"
                );
                self.cluster
                    .create_topic(topic, self.cfg.partitions, self.cfg.replication_factor)
                    .await
                    .map_err(|e| format!("cannot create dead-letter topic {topic}: {e}"))?;
            }
            tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
            let _ = self.cluster.metadata(Some(&[topic.to_string()])).await;
        }
        Err(format!("dead-letter topic {topic} has no partitions"))
    }

    /// Ask for a producer id once; brokers without idempotence get -1.
    async fn ensure_pid(&mut self) {
        if self.pid_known {
            return;
        }
        let req = InitProducerIdRequest::default().with_transaction_timeout_ms(60_000);
        let result = match self.cluster.any().await {
            Ok(conn) => conn.send(req, 0, 4).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(r) if r.error_code == 0 => {
                self.pid = (r.producer_id.0, r.producer_epoch);
                info!(
                    producer_id = self.pid.0,
                    "dead-letter producer is idempotent"
                );
            }
            Ok(r) => warn!(
                error_code = r.error_code,
                "InitProducerId refused; producing without idempotence"
            ),
            Err(e) => warn!(error = %e, "InitProducerId failed; producing without idempotence"),
        }
        self.pid_known = true;
        self.sequences.clear();
    }

    /// Produce one batch to one partition with acks=all, retrying network
    /// errors with the same bytes.
    async fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        records: &[crate::kafka::builder::NewRecord],
    ) -> Result<(), String> {
        let seq_key = (topic.to_string(), partition);
        let mut rebuilt_for_new_pid = false;
        loop {
            let seq = if self.pid.0 >= 0 {
                *self.sequences.get(&seq_key).unwrap_or(&0)
            } else {
                -1
            };
            let opts = BuildOptions::default().idempotent(self.pid.0, self.pid.1, seq);
            let batch = build_batch(records, &opts).map_err(|e| e.to_string())?;
            let mut last_err = String::new();
            let mut outcome = None;
            for attempt in 0..3u32 {
                match self.send_once(topic, partition, batch.clone()).await {
                    Ok(code) => {
                        outcome = Some(code);
                        break;
                    }
                    Err(e) => {
                        last_err = e;
                        self.cluster.reset();
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    }
                }
            }
            let Some(code) = outcome else {
                return Err(last_err);
            };
            match code {
                0 | errors::DUPLICATE_SEQUENCE_NUMBER => {
                    if self.pid.0 >= 0 {
                        self.sequences
                            .insert(seq_key, seq.wrapping_add(records.len() as i32));
                    }
                    return Ok(());
                }
                errors::OUT_OF_ORDER_SEQUENCE_NUMBER
                | errors::UNKNOWN_PRODUCER_ID
                | errors::INVALID_PRODUCER_EPOCH
                    if !rebuilt_for_new_pid =>
                {
                    // Our sequence state no longer matches the broker's: start over.
                    self.pid_known = false;
                    self.ensure_pid().await;
                    rebuilt_for_new_pid = true;
                }
                errors::NOT_LEADER_OR_FOLLOWER
                | errors::LEADER_NOT_AVAILABLE
                | errors::UNKNOWN_TOPIC_OR_PARTITION => {
                    self.cluster.reset();
                    return Err(format!(
                        "{topic}-{partition}: leader not available (error {code})"
                    ));
                }
                other => return Err(format!("{topic}-{partition}: produce error {other}")),
            }
        }
    }

    /// One Produce request; the partition's error code, or a network error.
    async fn send_once(
        &mut self,
        topic: &str,
        partition: i32,
        batch: Bytes,
    ) -> Result<i16, String> {
        self.cluster
            .produce(topic, partition, batch)
            .await
            .map(|p| p.error_code)
            .map_err(|e| e.to_string())
    }
}
