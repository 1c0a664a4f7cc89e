//! The DLT writer: writing diverted records to their dead-letter topic
//! (DLT), acknowledged, exactly once per original record.
//!
//! `DeadLetter::divert` returns only when the record is safely in the DLT
//! (the broker acknowledged it with acks=all), or fails; the interception
//! layer holds a partition on failure rather than skip the record. A ledger
//! of (topic, partition, offset) already diverted (`dlt::ledger`) makes a record
//! fetched again (another consumer group, a restart of the consumer, a
//! fetch that starts mid-batch) reach the DLT only once; concurrent
//! diversions of the same record share one write. The ledger is read back
//! from the DLTs themselves (`ledger::rebuild`) at start, after a policy reload and
//! for a DLT first asked about later; until a topic's DLT is loaded,
//! `is_loaded` says so and the interception holds that topic. Writes go
//! through the proxy's own producer (`producer`); the DLT record format
//! (header names, bounds) is defined once, in the core's `dlt_record`.
//!
//! Several instances share nothing but the cluster: after the rebuild, the
//! ledger keeps reading every loaded DLT (`ledger::tail`), so other instances'
//! diversions reach it within about 200 ms; and each DLT partition is
//! written under a producer lease shared by the fleet (`lease`): the
//! newest lease fences the other writers, and its holder reads the
//! partition to its end before writing, so a record is written once.

pub(crate) mod fence;
pub(crate) mod lease;
mod once;
mod producer;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::client::{self, Cluster};
use crate::config::{DeadLetterConfig, HostPort};
use crate::policy::{Class, Policy, PolicySet};

use super::follower::{Follower, KeyReaders};
use super::ledger::{self, rebuild, Ledger, LedgerKey};
use crate::dlt_record::Diversion;

/// Why a diversion did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DivertError {
    #[error("dead-letter write failed: {0}")]
    Write(String),
    #[error("the dead-letter producer has stopped")]
    Stopped,
}

/// The ledger's key of a diversion: its origin (topic, partition, offset).
fn ledger_key(d: &Diversion) -> LedgerKey {
    (d.origin_topic.clone(), d.origin_partition, d.origin_offset)
}

/// A write request for the producer task.
pub(crate) struct PendingWrite {
    diversion: Diversion,
    /// The diversion's ledger key, worked out once at submit.
    key: LedgerKey,
    done: watch::Sender<Option<bool>>,
}

/// The dead-letter writer shared by every connection.
pub struct DeadLetter {
    ledger: Arc<Ledger>,
    jobs: mpsc::UnboundedSender<PendingWrite>,
    /// True once the DLTs known at start are loaded.
    started: watch::Receiver<bool>,
    policies: watch::Sender<Arc<PolicySet>>,
    /// Tells the loader that a DLT was asked about.
    wake: mpsc::UnboundedSender<()>,
}

impl DeadLetter {
    /// Start the producer and the DLT follower (the ledger's reader alone)
    /// for the DLTs of `policies` ([`DeadLetter::new`], then
    /// [`Workers::spawn`]).
    pub fn start(
        cfg: &DeadLetterConfig,
        upstream_bootstrap: &[HostPort],
        upstream: client::Endpoint,
        endpoint: client::Endpoint,
        policies: Arc<PolicySet>,
    ) -> Arc<DeadLetter> {
        let (dead_letter, workers) =
            DeadLetter::new(cfg, upstream_bootstrap, upstream, endpoint, policies);
        workers.spawn(None);
        dead_letter
    }

    /// The writer for the DLTs of `policies`, and its two tasks (the
    /// producer, and the DLT follower that loads and follows the ledger),
    /// not started. `upstream` reaches the
    /// cluster of the origin topics (their ids), `endpoint` the dead-letter
    /// cluster.
    pub fn new(
        cfg: &DeadLetterConfig,
        upstream_bootstrap: &[HostPort],
        upstream: client::Endpoint,
        endpoint: client::Endpoint,
        policies: Arc<PolicySet>,
    ) -> (Arc<DeadLetter>, Workers) {
        let bootstrap = cfg
            .bootstrap_servers
            .clone()
            .unwrap_or_else(|| upstream_bootstrap.to_vec());
        let ledger = Arc::new(Ledger::default());
        let (jobs, rx) = mpsc::unbounded_channel();
        let (started_tx, started) = watch::channel(false);
        let (policies_tx, policies_rx) = watch::channel(policies);
        let (wake, wake_rx) = mpsc::unbounded_channel();
        let producer = producer::Producer::new(
            Cluster::new(bootstrap.clone(), endpoint.clone()),
            Cluster::new(upstream_bootstrap.to_vec(), upstream.clone()),
            cfg.clone(),
            endpoint.max_frame,
            ledger.clone(),
            wake.clone(),
        );
        let loader = rebuild::Loader {
            dlt: Cluster::new(bootstrap, endpoint),
            upstream: Cluster::new(upstream_bootstrap.to_vec(), upstream),
            ledger: ledger.clone(),
            policies: policies_rx,
            wake: wake_rx,
            started: started_tx,
            previous: None,
            ids: Default::default(),
            discovered: None,
        };
        let dead_letter = Arc::new(DeadLetter {
            ledger,
            jobs,
            started,
            policies: policies_tx,
            wake,
        });
        let workers = Workers {
            producer,
            jobs: rx,
            loader,
        };
        (dead_letter, workers)
    }

    /// Whether every DLT known to the policies has been read back into the
    /// ledger (for /readyz).
    pub fn is_ready(&self) -> bool {
        *self.started.borrow() && self.ledger.pending().is_empty()
    }

    /// Whether `dlt` has been read back into the ledger. Cheap; a DLT not
    /// heard of before (a topic created since) is queued for loading, and
    /// until then this says false: hold the topics that write to it.
    pub fn is_loaded(&self, dlt: &str) -> bool {
        if self.ledger.is_loaded(dlt) {
            return true;
        }
        if self.ledger.want(dlt) {
            let _ = self.wake.send(());
        }
        false
    }

    /// Whether every DLT `policy` writes `topic`'s records to is loaded.
    pub fn is_loaded_for(&self, policy: &Policy, topic: &str) -> bool {
        Class::ALL
            .iter()
            .all(|&c| self.is_loaded(&policy.dead_letter_topic(topic, c)))
    }

    /// Like [`DeadLetter::is_loaded_for`], but a DLT not loaded yet is given
    /// up to `wait` to load (a topic created since the start has a DLT
    /// nobody asked about: reading it, or learning it does not exist, takes
    /// a metadata round trip or two).
    pub async fn wait_loaded_for(&self, policy: &Policy, topic: &str, wait: Duration) -> bool {
        if self.is_loaded_for(policy, topic) {
            return true;
        }
        let dlts: Vec<String> = Class::ALL
            .iter()
            .map(|&c| policy.dead_letter_topic(topic, c))
            .collect();
        let deadline = tokio::time::Instant::now() + wait;
        self.ledger.wait_loaded(&dlts, deadline).await
    }

    /// New policies are in force: load the DLTs they add.
    pub fn policies_changed(&self, policies: Arc<PolicySet>) {
        self.policies.send_replace(policies);
    }

    /// Wait until the DLTs known at start are loaded.
    pub async fn ready(&self) -> Result<(), DivertError> {
        let mut started = self.started.clone();
        started
            .wait_for(|l| *l)
            .await
            .map(|_| ())
            .map_err(|_| DivertError::Stopped)
    }

    /// Queue `d` for writing, or join a write of the same record already
    /// under way. Submitting is synchronous, so records queued in offset
    /// order reach the DLT in that order. Call after `ready`.
    pub fn submit(&self, d: &Diversion) -> Result<Ticket, DivertError> {
        let key = ledger_key(d);
        let rx = match self.ledger.claim(key.clone()) {
            ledger::Claim::Done => {
                return Ok(Ticket {
                    rx: None,
                    what: String::new(),
                })
            }
            ledger::Claim::InFlight(rx) => rx,
            ledger::Claim::Mine(done, rx) => {
                let job = PendingWrite {
                    diversion: d.clone(),
                    key,
                    done,
                };
                if let Err(failed) = self.jobs.send(job) {
                    self.ledger.finish(&failed.0.key, false);
                    return Err(DivertError::Stopped);
                }
                rx
            }
        };
        let what = format!(
            "{} partition {} offset {} -> {}",
            d.origin_topic, d.origin_partition, d.origin_offset, d.dlt_topic
        );
        Ok(Ticket { rx: Some(rx), what })
    }

    /// Write `d` to its DLT; `Ok` once it is acknowledged (now or earlier).
    /// The filter submits many at once (`submit`); tests write one.
    #[cfg(test)]
    pub async fn divert(&self, d: &Diversion) -> Result<(), DivertError> {
        self.ready().await?;
        self.submit(d)?.wait().await
    }

    /// Whether this record is known to be in its DLT already.
    #[cfg(test)]
    pub fn is_diverted(&self, key: &LedgerKey) -> bool {
        self.ledger.contains(key)
    }

    /// The ledger, for checking batches against what was diverted before.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }
}

/// The dead-letter writer's tasks, built by [`DeadLetter::new`]: the
/// producer, and the ledger's loader, which the DLT follower runs.
pub struct Workers {
    producer: producer::Producer,
    jobs: mpsc::UnboundedReceiver<PendingWrite>,
    loader: rebuild::Loader,
}

impl Workers {
    /// Start the producer and the DLT follower, with the blocked keys,
    /// breakers and re-drive among its readers when given (needs a tokio
    /// runtime).
    pub fn spawn(self, readers: Option<KeyReaders>) {
        tokio::spawn(self.producer.run(self.jobs));
        tokio::spawn(Follower::new(self.loader, readers).run());
    }
}

/// A diversion under way (or already done).
pub struct Ticket {
    rx: Option<watch::Receiver<Option<bool>>>,
    what: String,
}

impl Ticket {
    /// `Ok` once the record is acknowledged by its DLT.
    pub async fn wait(self) -> Result<(), DivertError> {
        let Some(mut rx) = self.rx else { return Ok(()) };
        match rx.wait_for(|o| o.is_some()).await.map(|o| *o) {
            Ok(Some(true)) => Ok(()),
            // Failed: the producer removed the ledger slot, so the next
            // fetch of the record tries again.
            _ => Err(DivertError::Write(self.what)),
        }
    }
}
