//! What a replay knows about its target partitions: which DLT records were
//! replayed into each already (their `x-replayed-from-dlt` headers), and,
//! when executing, the partition's producer lease.
//!
//! Bounded reading: a record can only have been replayed after it was
//! diverted, so a target partition is read from the offset of the oldest
//! `x-failed-at` among the chosen records going to that topic (ListOffsets
//! by timestamp, minus [`CLOCK_MARGIN`] for clocks that disagree), not from
//! its log start. A broker that answers no offset, or one below the true
//! one (tansu 0.6 answers 0), only makes the read longer.
//!
//! Concurrent replays: before its first write to target partition P, a
//! replay takes P's lease (transactional id `antidote-replay/<topic>/<P>`,
//! shared by every run), then reads P again, then writes with the lease's
//! producer id and epoch (the first read, for the decisions, takes no
//! lease: a run that writes nothing to P leaves nothing in it). A newer
//! lease fences an older one's writes; the fenced run takes the lease back
//! and reads P again, so a record the other run wrote meanwhile is skipped.
//! Two runs of the same range write each record once.
//!
//! Apache Kafka refuses an older epoch on P only once P has appended a
//! batch of a newer one (not when InitProducerId hands the newer one out):
//! with InitProducerId alone, run A's write (older epoch) could land after
//! run B had read P and before B's first write, and both wrote that record
//! (one of thirty, every time, in `test_fleet.py`). So taking the lease
//! also writes the new epoch into P, as an ABORT marker of an empty
//! transaction (`dlt::writer::fence::fence_partition`): a control batch, which
//! no consumer sees (it takes an offset). No record is ever written in a
//! transaction; the replays are plain idempotent batches. The lease is
//! taken again within half the coordinator's `transactional.id.expiration.ms`
//! (`dlt::writer::lease::refresh`): after the id expired, a second run would
//! get a new producer id that fences nothing of this run's.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::client::Cluster;
use crate::dlt::read_partition_end;
use crate::dlt::trust::Reader;
use crate::dlt::write::send;
use crate::kafka::builder::{BuildOptions, NewRecord};
use crate::service::{DltError, H_REPLAYED_FROM};

/// How far before the oldest `x-failed-at` a target is read from: the
/// proxy that diverted and the machine that replays may disagree on time.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(3600);
/// ListOffsets' timestamp for "the end of the partition".
const LATEST: i64 = -1;
/// Most times one record is retried after its run was fenced. Each retry
/// waits a jittered, growing pause first: two runs that took the lease
/// back at once would fence each other forever.
const MAX_FENCED: u32 = 8;

/// A target partition's producer lease: (producer id, epoch, next sequence).
#[derive(Clone, Copy)]
struct Lease {
    pid: i64,
    epoch: i16,
    seq: i32,
    /// When it was taken, and how long it may be used (half the
    /// coordinator's `transactional.id.expiration.ms`, an hour at most).
    taken: std::time::Instant,
    refresh: Duration,
}

/// What one write of a replay did.
pub enum Written {
    /// Acknowledged at this offset.
    At(i64),
    /// Another run replayed this DLT record meanwhile: not written.
    Already,
}

/// The replay's view of its targets.
#[derive(Default)]
pub struct Targets {
    /// DLT coordinates found in targets' `x-replayed-from-dlt`.
    pub replayed: HashSet<String>,
    /// Per target topic, the oldest `x-failed-at` of the chosen records.
    oldest: HashMap<String, i64>,
    leases: HashMap<(String, i32), Lease>,
    /// Per target partition, the offset its last read ended at (the next
    /// read, after taking the lease, goes on from there).
    read_to: HashMap<(String, i32), i64>,
    /// Target records read to learn what was replayed (for the report).
    pub read: u64,
}

impl Targets {
    /// Note that a chosen record failed at `failed_at` goes to `topic`.
    pub fn note(&mut self, topic: &str, failed_at: Option<i64>) {
        // Unknown: read the whole partition.
        let at = failed_at.unwrap_or(0);
        let e = self.oldest.entry(topic.to_string()).or_insert(at);
        *e = (*e).min(at);
    }

    /// Read `topic`/`partition` for what was replayed into it: the first
    /// time from the bounded start, then from where the last read ended;
    /// with `lease`, take its producer lease first.
    pub async fn learn(
        &mut self,
        cluster: &mut Cluster,
        topic: &str,
        partition: i32,
        lease: bool,
    ) -> Result<(), DltError> {
        if lease {
            let l = take_lease(cluster, topic, partition).await;
            self.leases.insert((topic.to_string(), partition), l);
        }
        let key = (topic.to_string(), partition);
        let from = match self.read_to.get(&key) {
            Some(&end) => Some(end),
            None => {
                let since = self.oldest.get(topic).copied().unwrap_or(0);
                start_offset(cluster, topic, partition, since).await?
            }
        };
        let replayed = &mut self.replayed;
        let (n, end) = read_partition_end(cluster, topic, partition, from, &mut |p, rec| {
            // Only a replay's own frame names the DLT record it came from
            // (a producer's header of that name is not antidote's).
            let ctx = crate::dlt::trust::open(Reader::Replay, topic, p, rec);
            if let Some(v) = ctx.as_ref().and_then(|c| c.text(H_REPLAYED_FROM)) {
                replayed.insert(v.to_string());
            }
        })
        .await?;
        self.read += n;
        self.read_to.insert(key, end);
        Ok(())
    }

    /// Write `record` (the replay of DLT coordinate `coord`) to
    /// `topic`/`partition` under the partition's lease; fenced by another
    /// run, take the lease back, read again and skip it if that run wrote it.
    pub async fn write(
        &mut self,
        cluster: &mut Cluster,
        topic: &str,
        partition: i32,
        coord: &str,
        record: &NewRecord,
    ) -> Result<Written, DltError> {
        let key = (topic.to_string(), partition);
        for attempt in 0..=MAX_FENCED {
            if attempt > 0 {
                let pause = crate::dlt::backoff(
                    attempt - 1,
                    Duration::from_millis(50),
                    Duration::from_secs(1),
                );
                tokio::time::sleep(pause).await;
            }
            // Taken again before the transactional id can expire: a new
            // producer id would fence nothing of ours (as the DLT lease).
            if self
                .leases
                .get(&key)
                .is_some_and(|l| l.taken.elapsed() >= l.refresh)
            {
                self.leases.remove(&key);
            }
            if !self.leases.contains_key(&key) {
                self.learn(cluster, topic, partition, true).await?;
            }
            if self.replayed.contains(coord) {
                return Ok(Written::Already);
            }
            let l = self.leases.get(&key).copied().unwrap_or(Lease {
                pid: -1,
                epoch: -1,
                seq: -1,
                taken: std::time::Instant::now(),
                refresh: Duration::MAX,
            });
            match produce(cluster, topic, partition, record, l).await? {
                Ok(offset) => {
                    if let Some(l) = self.leases.get_mut(&key).filter(|l| l.pid >= 0) {
                        l.seq = l.seq.wrapping_add(1);
                    }
                    self.replayed.insert(coord.to_string());
                    return Ok(Written::At(offset));
                }
                Err(()) => {
                    self.leases.remove(&key);
                }
            }
        }
        Err(DltError::Produce(format!(
            "{topic}-{partition}: fenced {} times by other replays",
            MAX_FENCED + 1
        )))
    }
}

/// Where to start reading `topic`/`partition` for replays of records that
/// failed at `since` or later: ListOffsets by timestamp, clamped to the log
/// start; no offset answered means nothing that recent: the end.
async fn start_offset(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    since: i64,
) -> Result<Option<i64>, DltError> {
    let ts = since.saturating_sub(CLOCK_MARGIN.as_millis() as i64);
    if ts <= 0 {
        return Ok(None); // from the log start
    }
    let mut at = cluster.list_offset(topic, partition, ts).await?;
    if at < 0 {
        // Nothing that recent: from the end (tansu's "latest" can be lower
        // than the end: a longer read, still safe).
        at = cluster.list_offset(topic, partition, LATEST).await?;
    }
    tracing::debug!(
        topic,
        partition,
        since = ts,
        offset = at,
        "target read starts here"
    );
    Ok(Some(at))
}

/// Most times taking a target's lease starts over after another run's
/// InitProducerId came in between.
const MAX_LOST: u32 = 8;
/// Most times taking a target's lease is tried when it fails (each try asks
/// InitProducerId up to six times while its answer is retriable): then the
/// run writes without fencing. Three concurrent runs on a loaded 3-node
/// cluster once used up three tries (CI, `test_lease.py`), and on Kafka 4.4
/// (transactions v2) under the whole suite's load all five once (each
/// answered CONCURRENT_TRANSACTIONS while another run's abort completed),
/// so twelve, ~1-20 s in all: a replay is a batch job, and waiting for its
/// fence beats writing unfenced.
const MAX_FAILED: u32 = 12;

/// Take the lease of target `topic`/`partition` and make the partition
/// fence every older lease (`dlt::writer::fence::fence_partition`: an
/// aborted empty transaction leaves an ABORT marker of the new epoch in the
/// partition, which no consumer sees). (-1, -1) when the broker gives none
/// (the replay then writes without fencing). A broker without those
/// transaction requests (tansu 0.6 fences from InitProducerId on) leaves
/// the InitProducerId answer as the lease.
async fn take_lease(cluster: &mut Cluster, topic: &str, partition: i32) -> Lease {
    use crate::dlt::writer::fence::{fence_partition, Fence};
    use crate::dlt::writer::lease::refresh;
    let id = format!("antidote-replay/{topic}/{partition}");
    let none = Lease {
        pid: -1,
        epoch: -1,
        seq: -1,
        taken: std::time::Instant::now(),
        refresh: Duration::MAX,
    };
    for attempt in 0..MAX_LOST {
        let taken = std::time::Instant::now();
        match fence_partition(cluster, &id, topic, partition).await {
            Ok(Fence::At { pid, epoch }) => {
                let refresh = refresh(cluster, &id).await;
                tracing::debug!(
                    topic,
                    partition,
                    pid,
                    epoch,
                    ?refresh,
                    "replay target lease taken"
                );
                return Lease {
                    pid,
                    epoch,
                    seq: 0,
                    taken,
                    refresh,
                };
            }
            Ok(Fence::Unsupported { pid, epoch, why }) => {
                tracing::debug!(
                    topic,
                    partition,
                    pid,
                    epoch,
                    why,
                    "replay target lease from InitProducerId only"
                );
                return Lease {
                    pid,
                    epoch,
                    seq: 0,
                    taken,
                    refresh: refresh(cluster, &id).await,
                };
            }
            Ok(Fence::Lost) => {
                again(cluster, (topic, partition), attempt, None).await;
            }
            Err(e) => {
                if !again(cluster, (topic, partition), attempt, Some(&e)).await {
                    return none;
                }
            }
        }
    }
    tracing::warn!(topic, partition, "no producer lease for the replay target (another replay kept taking it): concurrent replays may both write");
    none
}

/// After try `attempt` at a target's lease found it taken by another run
/// meanwhile (`failed` is `None`) or failed: pause before the next try;
/// false (at once) when a failure was the last of [`MAX_FAILED`] tries.
async fn again(
    cluster: &mut Cluster,
    (topic, partition): (&str, i32),
    attempt: u32,
    failed: Option<&str>,
) -> bool {
    cluster.reset();
    let pause = match failed {
        None => {
            tracing::debug!(
                topic,
                partition,
                attempt,
                "another replay took the target's lease meanwhile; again"
            );
            crate::dlt::backoff(
                attempt,
                Duration::from_millis(20),
                Duration::from_millis(1000),
            )
        }
        // Another run's abort can keep InitProducerId answering
        // CONCURRENT_TRANSACTIONS for a while: ask a few more times.
        Some(e) => {
            if attempt + 1 >= MAX_FAILED {
                tracing::warn!(topic, partition, error = %e,
                    "no producer lease for the replay target: concurrent replays may both write");
                return false;
            }
            tracing::debug!(topic, partition, error = %e, "taking the replay target's lease failed; again");
            crate::dlt::backoff(
                attempt,
                Duration::from_millis(100),
                Duration::from_millis(2000),
            )
        }
    };
    tokio::time::sleep(pause).await;
    true
}

/// Produce one record with acks=all under lease `l`: `Ok(Ok(offset))`,
/// `Ok(Err(()))` when fenced, `Err` otherwise. Retries only errors that
/// guarantee nothing was written (leader moved or unknown).
async fn produce(
    cluster: &mut Cluster,
    topic: &str,
    partition: i32,
    record: &NewRecord,
    l: Lease,
) -> Result<Result<i64, ()>, DltError> {
    let opts = BuildOptions::default().idempotent(l.pid, l.epoch, l.seq);
    Ok(send(cluster, topic, partition, record, &opts).await?)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::client::mock_broker::MockBroker;
    use crate::kafka::builder::build_batch;

    fn endpoint() -> crate::client::Endpoint {
        crate::client::Endpoint {
            tls: None,
            sasl: None,
            timeout: Duration::from_secs(2),
            max_frame: 1 << 20,
        }
    }

    fn replayed_from(coord: &str) -> Bytes {
        let r = NewRecord {
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::from_static(b"v")),
            headers: vec![(
                H_REPLAYED_FROM.to_string(),
                Some(Bytes::from(coord.to_string())),
            )],
        };
        build_batch(&[r], &BuildOptions::default()).expect("batch")
    }

    /// The mock answers ListOffsets by timestamp with the partition's end
    /// (no record that recent): a target is then not read at all, while a
    /// record without `x-failed-at` makes the whole partition read.
    #[tokio::test]
    async fn a_target_is_read_from_the_oldest_failure_not_from_its_start() {
        let mock = MockBroker::start().await;
        mock.add_topic("target", 1);
        mock.append("target", 0, replayed_from("t.dlt/0/3"));
        let mut cluster = Cluster::new(vec![mock.addr.clone()], endpoint());

        let mut bounded = Targets::default();
        bounded.note("target", Some(crate::clock::now_ms()));
        bounded
            .learn(&mut cluster, "target", 0, false)
            .await
            .expect("read");
        assert_eq!(bounded.read, 0, "read from the ListOffsets answer");

        let mut whole = Targets::default();
        whole.note("target", None);
        whole
            .learn(&mut cluster, "target", 0, false)
            .await
            .expect("read");
        assert_eq!(whole.read, 1);
        assert!(whole.replayed.contains("t.dlt/0/3"));
    }
}
