//! Running a replay against the clusters: read the chosen DLT records,
//! learn each target's partitions and what was already replayed into it,
//! apply [`super::decide`] to each record, produce with acks=all, and hand
//! each record's [`Outcome`] to the caller's [`Sink`].
//!
//! Owns the I/O side of a replay only; every decision is made by the pure
//! [`super::decide`]; printing is the caller's.

use crate::dlt::trust::{self, Reader};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::keys::{self, GroupKey, Unit};
use super::targets::{Targets as Seen, Written};
use super::{decide, selected, Decision, Outcome, ReplayPlan, Report, Sink};
use crate::client::Cluster;
use crate::kafka::builder::NewRecord;
use crate::registry::Registry;
use crate::service::{read_dlt, Context, DltError, DltRecord};

/// Partition count of each target topic (`None`: it does not exist).
type Targets = BTreeMap<String, Option<usize>>;

/// Run the replay `args` describes with `ctx`'s clusters and current
/// policies; each record's outcome goes to `sink` as it is known.
pub async fn run(
    ctx: &Context,
    args: &ReplayPlan,
    sink: &mut dyn Sink,
) -> Result<Report, DltError> {
    if args.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(DltError::Usage("--rate must be a positive number".into()));
    }
    let registry = super::super::decode::registry(ctx)?;
    let mut cluster = ctx.dead_letter_cluster()?;
    if cluster.partitions(&args.topic).await?.is_none() {
        return Err(DltError::Usage(format!(
            "dead-letter topic {} does not exist",
            args.topic
        )));
    }
    let records = read_selected(&mut cluster, args, sink).await?;
    // A blocked key's records go together (keys.rs); markers go to the DLT.
    let units = keys::units(&mut cluster, &args.topic, &ctx.policies, records).await?;
    let dlt = ctx.dead_letter_cluster()?;
    // Targets live on the upstream cluster; the DLT may live elsewhere
    // (dead_letter.bootstrap_servers).
    let target_cluster = if ctx.config.dead_letter.bootstrap_servers.is_some() {
        ctx.upstream_cluster()?
    } else {
        cluster
    };
    let mut runner = Runner {
        args,
        dlt,
        cluster: target_cluster,
        targets: Targets::new(),
        seen: Seen::default(),
        report: Report::default(),
        started: Instant::now(),
        sent: 0,
        registry,
    };
    let all: Vec<&DltRecord> = units
        .iter()
        .flat_map(|u| match u {
            Unit::One(r) => std::slice::from_ref(&**r).iter(),
            Unit::Key(_, rs) => rs.iter(),
        })
        .collect();
    runner.load_targets(&all).await?;
    // `--rate` paces the writes, not the reading of the targets.
    runner.started = Instant::now();
    for u in &units {
        match u {
            Unit::One(r) => {
                let d = runner.decide(ctx, r).await;
                runner.apply(r, &d, sink).await?;
                tracing::debug!(coordinate = %r.coordinate(), decision = d.label(), "replay decision");
            }
            Unit::Key(g, rs) => runner.replay_key(ctx, g, rs, sink).await?,
        }
        sink.progress(&runner.report);
    }
    Ok(runner.report)
}

/// The DLT records `args` selects, in DLT order, the first copy of each
/// origin only. Past `limit` nothing more is kept (the first ones in DLT
/// order are what `limit` chooses): memory stays bounded on a large DLT;
/// past `max_bytes` of keys and values too (the console). What was left
/// out is told to `sink`.
async fn read_selected(
    cluster: &mut Cluster,
    args: &ReplayPlan,
    sink: &mut dyn Sink,
) -> Result<Vec<DltRecord>, DltError> {
    let (mut kept, mut bytes, mut full) = (0usize, 0usize, false);
    let mut records = read_dlt(Reader::Replay, cluster, &args.topic, |r| {
        let size = r.key.as_ref().map_or(0, |k| k.len()) + r.value.as_ref().map_or(0, |v| v.len());
        let room = args
            .max_bytes
            .is_none_or(|m| bytes + size <= m || kept == 0);
        let keep = selected(args, r) && args.limit.is_none_or(|n| kept < n) && !full;
        full |= keep && !room;
        let keep = keep && room;
        kept += usize::from(keep);
        bytes += if keep { size } else { 0 };
        keep
    })
    .await?;
    if full {
        sink.notice(&format!(
            "only the first {kept} selected records were considered: their keys and values fill {bytes} bytes (at most {} at once)",
            args.max_bytes.unwrap_or(0)
        ));
    }
    let duplicates = drop_later_copies(&mut records);
    if duplicates > 0 {
        sink.notice(&format!("{duplicates} later copies of DLT records with the same origin skipped (the first copy is replayed)"));
    }
    Ok(records)
}

/// The last record of a blocked key's `rs` that is written (decided
/// `Replay` in `ds`) carries `x-released-through`: `through`, the key's
/// last origin offset.
fn mark_released_through(rs: &[DltRecord], ds: &mut [Decision], through: i64) {
    if let Some((
        r,
        Decision::Replay {
            record,
            topic,
            partition,
            attempt,
        },
    )) = rs
        .iter()
        .zip(ds.iter_mut())
        .rev()
        .find(|(_, d)| matches!(d, Decision::Replay { .. }))
    {
        *record = super::replay_record(
            r,
            *attempt,
            record.timestamp,
            Some(through),
            &crate::dlt::trust::seal(topic, *partition),
        );
    }
}

/// The state of one replay run against its target cluster.
struct Runner<'a> {
    args: &'a ReplayPlan,
    /// The dead-letter cluster, for release markers.
    dlt: Cluster,
    cluster: Cluster,
    targets: Targets,
    /// What was replayed into the targets already, and their leases.
    seen: Seen,
    report: Report,
    started: Instant,
    /// Records produced so far (for `--rate`).
    sent: u64,
    /// Where `registry: true` policies' schemas are fetched for re-validation.
    registry: Option<Arc<Registry>>,
}

impl Runner<'_> {
    /// Learn each target topic's partitions, and read each existing target
    /// partition, from the oldest `x-failed-at` of the records going there,
    /// for the DLT coordinates it already holds (no double replays). No
    /// lease yet: a partition's lease is taken, and the partition read
    /// again, before its first write (`targets::Targets::write`), so a run
    /// that writes nothing to a partition leaves nothing in it (on Kafka a
    /// lease leaves an ABORT control batch, one offset).
    async fn load_targets(&mut self, records: &[&DltRecord]) -> Result<(), DltError> {
        for r in records {
            if let Some(t) = self.args.to.clone().or_else(|| r.origin_topic.clone()) {
                self.seen.note(&t, r.failed_at);
                self.targets.entry(t).or_insert(None);
            }
        }
        for (t, n) in self.targets.iter_mut() {
            *n = self.cluster.partitions(t).await?;
            for p in 0..n.unwrap_or(0) as i32 {
                self.seen.learn(&mut self.cluster, t, p, false).await?;
            }
        }
        tracing::debug!(
            records = self.seen.read,
            "target records read for earlier replays"
        );
        Ok(())
    }

    /// The decision for one record, counted as considered. A record still
    /// invalid as `transient` (its schema is not cached yet) is decided
    /// again once the registry has been asked for what is missing.
    async fn decide(&mut self, ctx: &Context, r: &DltRecord) -> Decision {
        self.report.considered += 1;
        let d = self.decide_now(ctx, r);
        if let (Decision::StillInvalid { class, .. }, Some(reg)) = (&d, &self.registry) {
            if class == crate::policy::Class::Transient.as_str() {
                reg.resolve_wants(reg.timeout()).await;
                return self.decide_now(ctx, r);
            }
        }
        d
    }

    fn decide_now(&self, ctx: &Context, r: &DltRecord) -> Decision {
        let targets = &self.targets;
        decide(
            self.args,
            &ctx.policies,
            trust::keys(),
            r,
            |t| targets.get(t).copied().flatten(),
            &self.seen.replayed,
            crate::clock::now_ms(),
        )
    }

    /// Replay a blocked key's records together, in order, or none of them;
    /// the last one written carries `x-released-through`, and a release
    /// marker follows once all are written.
    async fn replay_key(
        &mut self,
        ctx: &Context,
        g: &GroupKey,
        rs: &[DltRecord],
        sink: &mut dyn Sink,
    ) -> Result<(), DltError> {
        let mut ds: Vec<Decision> = Vec::with_capacity(rs.len());
        for r in rs {
            ds.push(self.decide(ctx, r).await);
        }
        let key = crate::service::show_bytes(Some(&g.2));
        let ok = |d: &Decision| {
            matches!(
                d,
                Decision::Replay { .. } | Decision::AlreadyReplayed { .. }
            )
        };
        if let Some(i) = ds.iter().position(|d| !ok(d)) {
            let why = ds.get(i).map_or("", |d| d.label());
            let blocker = rs.get(i).map(DltRecord::coordinate).unwrap_or_default();
            return self.hold_back(g, rs, &blocker, why, sink);
        }
        let through = rs
            .iter()
            .filter_map(|r| r.origin_offset)
            .max()
            .unwrap_or(-1);
        mark_released_through(rs, &mut ds, through);
        let failed = self.report.failed;
        for (r, d) in rs.iter().zip(&ds) {
            self.apply(r, d, sink).await?;
            if self.report.failed > failed {
                return Ok(()); // stop: the rest would overtake the failed one
            }
        }
        if self.args.execute {
            keys::write_marker(&mut self.dlt, &self.args.topic, g, through, false).await?;
            let o = Outcome::Released {
                key,
                topic: g.0.clone(),
                partition: g.1,
                through,
            };
            sink.outcome(o, &self.report)?;
        }
        Ok(())
    }

    /// None of a blocked key's records `rs` is replayed: the one at
    /// `blocker` cannot be (`why`). Each is told to `sink` as held back.
    fn hold_back(
        &mut self,
        g: &GroupKey,
        rs: &[DltRecord],
        blocker: &str,
        why: &'static str,
        sink: &mut dyn Sink,
    ) -> Result<(), DltError> {
        let key = crate::service::show_bytes(Some(&g.2));
        for r in rs {
            self.report.refused += 1;
            let o = Outcome::HeldBack {
                coord: r.coordinate(),
                key: key.clone(),
                topic: g.0.clone(),
                partition: g.1,
                blocker: blocker.to_string(),
                why,
            };
            sink.outcome(o, &self.report)?;
        }
        Ok(())
    }

    /// Carry out decision `d` for record `r`; its outcome to `sink`.
    async fn apply(
        &mut self,
        r: &DltRecord,
        d: &Decision,
        sink: &mut dyn Sink,
    ) -> Result<(), DltError> {
        let coord = r.coordinate();
        let report = &mut self.report;
        let o = match d {
            Decision::Replay {
                topic,
                partition,
                attempt,
                record,
            } => {
                let target = Target {
                    topic,
                    partition: *partition,
                    attempt: *attempt,
                };
                return self.replay(r, &target, record, sink).await;
            }
            Decision::AlreadyReplayed { topic } => {
                report.already_replayed += 1;
                Outcome::AlreadyReplayed {
                    coord,
                    topic: topic.clone(),
                    partition: None,
                }
            }
            Decision::StillInvalid {
                class,
                rule,
                reason,
            } => {
                report.still_invalid += 1;
                Outcome::StillInvalid {
                    coord,
                    class: class.clone(),
                    rule: rule.clone(),
                    reason: reason.clone(),
                }
            }
            refused => {
                report.refused += 1;
                let why = refusal(refused, self.args.max_attempts);
                Outcome::Refused { coord, why }
            }
        };
        sink.outcome(o, &self.report)
    }

    /// Write (or, in a dry run, report) one replay.
    async fn replay(
        &mut self,
        r: &DltRecord,
        target: &Target<'_>,
        record: &NewRecord,
        sink: &mut dyn Sink,
    ) -> Result<(), DltError> {
        let coord = r.coordinate();
        let (topic, partition, attempt) = (target.topic, target.partition, target.attempt);
        if !self.args.execute {
            self.report.would_replay += 1;
            let o = Outcome::WouldReplay {
                coord,
                topic: topic.to_string(),
                partition,
                origin: r.origin(),
                attempt,
            };
            return sink.outcome(o, &self.report);
        }
        if let Some(rate) = self.args.rate {
            let due = self.started + Duration::from_secs_f64(self.sent as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        self.sent += 1;
        let written = self
            .seen
            .write(&mut self.cluster, topic, partition, &coord, record)
            .await;
        let o = match written {
            Ok(Written::Already) => {
                self.report.already_replayed += 1;
                Outcome::AlreadyReplayed {
                    coord,
                    topic: topic.to_string(),
                    partition: Some(partition),
                }
            }
            Ok(Written::At(offset)) => {
                self.report.replayed += 1;
                Outcome::Replayed {
                    coord,
                    topic: topic.to_string(),
                    partition,
                    offset,
                    origin: r.origin(),
                    attempt,
                }
            }
            Err(e) => {
                self.report.failed += 1;
                self.cluster.reset();
                Outcome::Failed {
                    coord,
                    topic: topic.to_string(),
                    partition,
                    error: e.to_string(),
                }
            }
        };
        sink.outcome(o, &self.report)
    }
}

/// Where one replay goes.
struct Target<'a> {
    topic: &'a str,
    partition: i32,
    attempt: u32,
}

/// Why a refused decision was refused, for its `refused` line.
fn refusal(d: &Decision, max_attempts: u32) -> String {
    match d {
        Decision::RefusedStale => "class stale (use --include-stale)".into(),
        Decision::RefusedRedacted => {
            "class redact: never replayed (its contents were not kept)".into()
        }
        Decision::RefusedWholeBatch => {
            "a whole undecodable batch (raw bytes, not one record)".into()
        }
        Decision::RefusedMaxAttempts { attempts } => {
            format!("already replayed {attempts} times (--max-attempts {max_attempts})")
        }
        Decision::NoOrigin => format!("no {} header; use --to", crate::dlt::H_TOPIC),
        Decision::TargetMissing { topic } => format!("target topic {topic} does not exist"),
        other => other.label().to_string(),
    }
}

/// Produce one record with acks=all, no producer id; its offset.
pub use crate::dlt::write::produce_plain as produce;

/// Keep the first DLT record of each origin (topic, partition, offset):
/// a DLT written by instances without a producer lease (an older antidote,
/// a broker without InitProducerId) can hold a record twice. How many were
/// dropped.
fn drop_later_copies(records: &mut Vec<DltRecord>) -> usize {
    let before = records.len();
    let mut seen = HashSet::new();
    records.retain(
        |r| match (&r.origin_topic, r.origin_partition, r.origin_offset) {
            (Some(t), Some(p), Some(o)) => seen.insert((t.clone(), p, o)),
            _ => true,
        },
    );
    before - records.len()
}
