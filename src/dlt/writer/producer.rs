//! The proxy's own dead-letter producer, its task: acks=all, idempotent
//! where the broker supports InitProducerId, one Produce in flight at a
//! time. It takes the queued jobs in rounds, makes sure each DLT exists
//! (creating it with a `max.message.bytes` of `limits.max_frame_bytes`, so
//! a batch the proxy can frame is one the topic accepts), looks up the
//! origin topics' ids, and hands each DLT partition's jobs to `once`.
//!
//! Jobs queue up while a write is under way and go out together in the next
//! round, one batch (or a few, see `once`) per DLT partition. A record of
//! origin partition P goes to DLT partition P mod (DLT partitions), keeping
//! one origin partition's diversions in order. Every DLT partition has its
//! own outcome: a partition the broker acknowledged is never failed or
//! written again because another one failed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use uuid::Uuid;

use super::lease::Leases;
use super::PendingWrite;
use crate::client::Cluster;
use crate::clock::now_ms;
use crate::config::DeadLetterConfig;
use crate::dlt::ledger::Ledger;

/// Most jobs taken into one round.
const MAX_JOBS_PER_ROUND: usize = 1000;
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
