//! Dead-lettering: writing diverted records to their dead-letter topic (DLT),
//! acknowledged, exactly once per original record.
//!
//! `DeadLetter::divert` returns only when the record is safely in the DLT
//! (the broker acknowledged it with acks=all), or fails; the interception
//! layer holds a partition on failure rather than skip the record. A ledger
//! of (topic, partition, offset) already diverted makes a record fetched
//! again (another consumer group, a restart of the consumer, a fetch that
//! starts mid-batch) reach the DLT only once; concurrent diversions of the
//! same record share one write. At start the ledger is rebuilt from the
//! DLTs' own `x-original-*` headers, so a restarted proxy does not write a
//! record again. Writes go through the proxy's own producer (`producer`).

mod ledger;
mod producer;

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use tokio::sync::{mpsc, watch};

use crate::client;
use crate::config::{DeadLetter as DeadLetterConfig, HostPort};
use crate::kafka::builder::NewRecord;
use crate::kafka::record::Record;
use crate::policy::{Invalid, Policy, PolicySet};

pub use ledger::read_topic;

/// Why a diversion did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DivertError {
    #[error("dead-letter write failed: {0}")]
    Write(String),
    #[error("the dead-letter producer has stopped")]
    Stopped,
}

/// One record on its way to a dead-letter topic, with its context.
#[derive(Debug, Clone)]
pub struct Diversion {
    pub dlt_topic: String,
    pub origin_topic: Arc<str>,
    pub origin_partition: i32,
    pub origin_offset: i64,
    pub origin_timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
    pub invalid: Invalid,
    pub policy: Arc<str>,
}

impl Diversion {
    pub fn new(
        policy: &Policy,
        topic: &Arc<str>,
        partition: i32,
        record: &Record<'_>,
        invalid: &Invalid,
    ) -> Self {
        Diversion {
            dlt_topic: policy.dead_letter_topic(topic, invalid.class),
            origin_topic: topic.clone(),
            origin_partition: partition,
            origin_offset: record.offset,
            origin_timestamp: record.timestamp,
            key: record.key.map(Bytes::copy_from_slice),
            value: record.value.map(Bytes::copy_from_slice),
            headers: record
                .headers
                .iter()
                .map(|h| {
                    (
                        Bytes::copy_from_slice(h.key),
                        h.value.map(Bytes::copy_from_slice),
                    )
                })
                .collect(),
            invalid: invalid.clone(),
            policy: Arc::from(policy.name.as_str()),
        }
    }

    fn ledger_key(&self) -> LedgerKey {
        (
            self.origin_topic.clone(),
            self.origin_partition,
            self.origin_offset,
        )
    }

    /// The record written to the DLT: original key, value and headers, plus
    /// the context headers an operator needs to act on it.
    pub fn to_record(&self, failed_at_ms: i64) -> NewRecord {
        let mut headers: Vec<(String, Option<Bytes>)> = self
            .headers
            .iter()
            .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
            .collect();
        let mut add = |k: &str, v: String| headers.push((k.to_string(), Some(Bytes::from(v))));
        add(H_TOPIC, self.origin_topic.to_string());
        add(H_PARTITION, self.origin_partition.to_string());
        add(H_OFFSET, self.origin_offset.to_string());
        add(H_TIMESTAMP, self.origin_timestamp.to_string());
        add("x-error-class", self.invalid.class.as_str().to_string());
        add("x-error", self.invalid.reason.clone());
        add("x-error-rule", self.invalid.rule.clone());
        add("x-policy", self.policy.to_string());
        add("x-failed-at", failed_at_ms.to_string());
        NewRecord {
            timestamp: self.origin_timestamp,
            key: self.key.clone(),
            value: self.value.clone(),
            headers,
        }
    }
}

pub const H_TOPIC: &str = "x-original-topic";
pub const H_PARTITION: &str = "x-original-partition";
pub const H_OFFSET: &str = "x-original-offset";
pub const H_TIMESTAMP: &str = "x-original-timestamp";

/// (original topic, partition, offset).
pub type LedgerKey = (Arc<str>, i32, i64);

enum Slot {
    Done,
    /// Being written; resolves to Some(true) on success, Some(false) on failure.
    InFlight(watch::Receiver<Option<bool>>),
}

/// Every record diverted (or being diverted), by origin coordinates, plus an
/// index of diverted offsets per partition so that a batch can be checked
/// against it cheaply.
#[derive(Default)]
pub struct Ledger {
    slots: DashMap<LedgerKey, Slot>,
    by_partition: DashMap<(Arc<str>, i32), BTreeSet<i64>>,
}

impl Ledger {
    /// The record is in its DLT.
    fn done(&self, key: LedgerKey) {
        self.by_partition
            .entry((key.0.clone(), key.1))
            .or_default()
            .insert(key.2);
        self.slots.insert(key, Slot::Done);
    }

    /// The write failed: forget it so the next fetch tries again.
    fn failed(&self, key: &LedgerKey) {
        self.slots.remove(key);
    }

    /// Offsets in `from..to` of `topic`/`partition` already in a DLT.
    pub fn diverted_in(&self, topic: &Arc<str>, partition: i32, from: i64, to: i64) -> Vec<i64> {
        if self.by_partition.is_empty() || from >= to {
            return Vec::new();
        }
        match self.by_partition.get(&(topic.clone(), partition)) {
            Some(set) => set.range(from..to).copied().collect(),
            None => Vec::new(),
        }
    }
}

/// A write request for the producer task.
struct Job {
    diversion: Diversion,
    done: watch::Sender<Option<bool>>,
}

/// The dead-letter writer shared by every connection.
pub struct DeadLetter {
    ledger: Arc<Ledger>,
    jobs: mpsc::UnboundedSender<Job>,
    loaded: watch::Receiver<bool>,
}

impl DeadLetter {
    /// Start the producer and the ledger rebuild for the DLTs of `policies`.
    pub fn start(
        cfg: &DeadLetterConfig,
        upstream_bootstrap: &[HostPort],
        endpoint: client::Endpoint,
        policies: Arc<PolicySet>,
    ) -> Arc<DeadLetter> {
        let bootstrap = cfg
            .bootstrap_servers
            .clone()
            .unwrap_or_else(|| upstream_bootstrap.to_vec());
        let ledger = Arc::new(Ledger::default());
        let (jobs, rx) = mpsc::unbounded_channel();
        let (loaded_tx, loaded) = watch::channel(false);
        let producer = producer::Producer::new(bootstrap.clone(), endpoint.clone(), cfg.clone());
        tokio::spawn(producer.run(rx, ledger.clone()));
        if policies.is_empty() {
            let _ = loaded_tx.send(true);
        } else {
            tokio::spawn(ledger::rebuild(
                bootstrap,
                endpoint,
                policies,
                ledger.clone(),
                loaded_tx,
            ));
        }
        Arc::new(DeadLetter {
            ledger,
            jobs,
            loaded,
        })
    }

    /// Whether the ledger has been rebuilt from the DLTs.
    pub fn is_ready(&self) -> bool {
        *self.loaded.borrow()
    }

    /// Wait until the ledger has been rebuilt from the DLTs (at start).
    pub async fn ready(&self) -> Result<(), DivertError> {
        let mut loaded = self.loaded.clone();
        loaded
            .wait_for(|l| *l)
            .await
            .map(|_| ())
            .map_err(|_| DivertError::Stopped)
    }

    /// Queue `d` for writing, or join a write of the same record already
    /// under way. Submitting is synchronous, so records queued in offset
    /// order reach the DLT in that order. Call after `ready`.
    pub fn submit(&self, d: &Diversion) -> Result<Ticket, DivertError> {
        let rx = match self.ledger.slots.entry(d.ledger_key()) {
            Entry::Occupied(e) => match e.get() {
                Slot::Done => {
                    return Ok(Ticket {
                        rx: None,
                        what: String::new(),
                    })
                }
                Slot::InFlight(rx) => rx.clone(),
            },
            Entry::Vacant(v) => {
                let (tx, rx) = watch::channel(None);
                v.insert(Slot::InFlight(rx.clone()));
                self.jobs
                    .send(Job {
                        diversion: d.clone(),
                        done: tx,
                    })
                    .map_err(|_| DivertError::Stopped)?;
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
    pub async fn divert(&self, d: &Diversion) -> Result<(), DivertError> {
        self.ready().await?;
        self.submit(d)?.wait().await
    }

    /// Whether this record is known to be in its DLT already.
    pub fn is_diverted(&self, key: &LedgerKey) -> bool {
        matches!(self.ledger.slots.get(key).as_deref(), Some(Slot::Done))
    }

    /// The ledger, for checking batches against what was diverted before.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
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
