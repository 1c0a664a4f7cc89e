//! Reading dead-letter topics back into the ledger (at start, after a policy
//! reload, and for a DLT first asked about later; the reads themselves are
//! `dlt::read`'s).
//!
//! The DLTs are the ledger's source of truth, but not every record in them
//! is trusted: a record counts for origin topic T only if it was read from
//! the DLT that T's policy writes to, and only if its `x-original-topic-id`
//! (when present) is T's current id. So a record forged into some other
//! topic cannot hide offsets of T, and a deleted and recreated T keeps its
//! valid records. A partition is read from its log start (ListOffsets
//! earliest), never from 0, so retention does not make it unreadable;
//! errors are retried with a bounded, jittered backoff, never skipped, and
//! a DLT counts as loaded only once every partition was read to its end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};
use uuid::Uuid;

use super::Ledger;
use crate::client::{ClientError, Cluster};
use crate::dlt::backoff;
use crate::dlt::read::read_partition_end;
use crate::dlt::trust::{self, Reader};
use crate::kafka::record::Record;
use crate::policy::{Class, PolicySet};
use antidote_core::dlt_record::Origin;

/// Whether a DLT record naming `origin`, read from `dlt`, may count as a
/// diversion: `dlt` must be the DLT `origin.topic`'s policy writes to, and
/// its topic id (when the record names one and the topic exists) must be
/// the topic's current id.
pub fn trusted(policies: &PolicySet, dlt: &str, origin: &Origin, current_id: Option<Uuid>) -> bool {
    let topic = &*origin.topic;
    let Some(p) = policies.policing(topic) else {
        return false;
    };
    if !Class::ALL
        .iter()
        .any(|&c| p.dead_letter_topic(topic, c) == dlt)
    {
        return false;
    }
    match (origin.topic_id, current_id) {
        (Some(written), Some(now)) => written == now,
        _ => true,
    }
}

/// Pause between two rounds of the DLT follower.
pub const TAIL_INTERVAL: Duration = Duration::from_millis(200);
/// How often the upstream's topics are listed again, to learn DLTs of
/// policy topics created since (and their ids).
pub const DISCOVER_INTERVAL: Duration = Duration::from_secs(5);

/// What keeps the ledger loaded: on start, on every policy change and
/// whenever a DLT is first asked about, it reads every DLT not yet loaded.
/// The DLT follower (`dlt::follower`) runs it, and follows the loaded DLTs
/// between loads.
pub(crate) struct Loader {
    /// The dead-letter cluster (where the DLTs are).
    pub dlt: Cluster,
    /// The upstream cluster (where the origin topics and their ids are).
    pub upstream: Cluster,
    pub ledger: Arc<Ledger>,
    pub policies: watch::Receiver<Arc<PolicySet>>,
    pub wake: mpsc::UnboundedReceiver<()>,
    /// Set once the DLTs known at start are loaded.
    pub started: watch::Sender<bool>,
    /// The policies of the last complete load. A topic that writes to an
    /// already loaded DLT under the new policies but did not under these
    /// had its records in that DLT read as untrusted: the DLT is read again.
    pub previous: Option<Arc<PolicySet>>,
    /// The policy topics' current ids (for trusting what the tail reads).
    pub ids: HashMap<String, Uuid>,
    /// When the upstream's topics were last listed (by a load or the tail).
    pub discovered: Option<tokio::time::Instant>,
}

/// Whether `policies` send records of `topic` to `dlt`.
fn writes_to(policies: &PolicySet, topic: &str, dlt: &str) -> bool {
    policies.policing(topic).is_some_and(|p| {
        Class::ALL
            .iter()
            .any(|&c| p.dead_letter_topic(topic, c) == dlt)
    })
}

impl Loader {
    /// Every [`DISCOVER_INTERVAL`]: list the upstream's topics (a policy
    /// topic created since has DLTs to load); true when a DLT must be
    /// loaded.
    pub(crate) async fn discover(&mut self) -> bool {
        let due = self
            .discovered
            .is_none_or(|at| at.elapsed() >= DISCOVER_INTERVAL);
        if due {
            let policies = self.policies.borrow().clone();
            if let Err(e) = self.origin_topics(&policies).await {
                warn!(error = %e, "listing the upstream's topics for new DLTs failed");
                self.upstream.reset();
            }
            if !self.ledger.pending().is_empty() {
                return true;
            }
        }
        false
    }

    /// Load until every wanted DLT is loaded, retrying errors.
    pub(crate) async fn load_all(&mut self) {
        let mut attempt = 0u32;
        loop {
            match self.load_once().await {
                Ok(()) => {
                    if !*self.started.borrow() {
                        // Once, after the start: later loads add little,
                        // and shrinking then would only make appends regrow.
                        self.ledger.shrink();
                    }
                    let (entries, bytes) = self.ledger.footprint();
                    info!(entries, bytes, "dead-letter ledger rebuilt from the DLTs");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, "loading the dead-letter ledger failed; retrying");
                    self.dlt.reset();
                    self.upstream.reset();
                    tokio::time::sleep(backoff(
                        attempt,
                        Duration::from_millis(200),
                        Duration::from_secs(5),
                    ))
                    .await;
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }

    async fn load_once(&mut self) -> Result<(), ClientError> {
        let policies = self.policies.borrow_and_update().clone();
        if policies.is_empty() && self.ledger.pending().is_empty() {
            return Ok(()); // nothing is policed: nothing to load
        }
        let ids = self.origin_topics(&policies).await?;
        let pending = self.ledger.pending();
        if pending.is_empty() {
            self.previous = Some(policies);
            return Ok(());
        }
        let existing = existing_topics(&mut self.dlt).await?;
        for dlt in pending {
            if existing.contains(&dlt) {
                let (read, kept) = self.load_dlt(&policies, &ids, &dlt).await?;
                info!(dlt = %dlt, records = read, entries = kept, "dead-letter ledger loaded from DLT");
            }
            self.ledger.loaded(&dlt);
        }
        self.previous = Some(policies);
        Ok(())
    }

    /// The current ids of the upstream's policy topics; marks the DLTs of
    /// those topics as wanted.
    async fn origin_topics(
        &mut self,
        policies: &PolicySet,
    ) -> Result<HashMap<String, Uuid>, ClientError> {
        let meta = self.upstream.metadata(None).await?;
        let mut ids = HashMap::new();
        for t in meta.topics.iter().filter(|t| t.error_code == 0) {
            let Some(name) = t.name.as_ref().map(|n| n.to_string()) else {
                continue;
            };
            let Some(p) = policies.policing(&name) else {
                continue;
            };
            for class in Class::ALL {
                let dlt = p.dead_letter_topic(&name, class);
                let newly = self
                    .previous
                    .as_ref()
                    .is_some_and(|old| !writes_to(old, &name, &dlt));
                if newly && self.ledger.is_loaded(&dlt) {
                    self.ledger.unload(&dlt);
                } else {
                    self.ledger.want(&dlt);
                }
            }
            if !t.topic_id.is_nil() {
                self.ledger
                    .observe_topic_id(&Arc::from(name.as_str()), t.topic_id);
                ids.insert(name, t.topic_id);
            }
        }
        self.ids = ids.clone();
        self.discovered = Some(tokio::time::Instant::now());
        Ok(ids)
    }

    /// Read `dlt` into the ledger; (records read, entries kept).
    async fn load_dlt(
        &mut self,
        policies: &PolicySet,
        ids: &HashMap<String, Uuid>,
        dlt: &str,
    ) -> Result<(u64, u64), ClientError> {
        let (ledger, mut kept, mut ignored) = (&self.ledger, 0u64, 0u64);
        let mut f = |p, r: &Record<'_>| {
            let Some(ctx) = trust::open(Reader::Ledger, dlt, p, r) else {
                return;
            };
            let Some(o) = Origin::of(&ctx) else { return };
            if trusted(policies, dlt, &o, ids.get(&*o.topic).copied()) {
                ledger.insert(&(o.topic, o.partition, o.offset));
                kept += 1;
            } else {
                ignored += 1;
            }
        };
        let mut read = 0;
        let partitions = self.dlt.partitions(dlt).await?.unwrap_or(0);
        for p in 0..partitions as i32 {
            let (n, end) = read_partition_end(&mut self.dlt, dlt, p, None, &mut f).await?;
            read += n;
            // The tail goes on from here.
            ledger.set_tail_position((dlt.to_string(), p), end);
        }
        if ignored > 0 {
            warn!(dlt, ignored, "DLT records ignored by the ledger: their origin topic does not write to this DLT, or its topic id is not the topic's current id");
        }
        Ok((read, kept))
    }
}

/// Names of the topics that exist on `cluster`.
async fn existing_topics(
    cluster: &mut Cluster,
) -> Result<std::collections::HashSet<String>, ClientError> {
    let meta = cluster.metadata(None).await?;
    Ok(meta
        .topics
        .iter()
        .filter(|t| t.error_code == 0)
        .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
        .collect())
}
