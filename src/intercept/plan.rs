//! Planning one partition's records: which batches pass as they are, which
//! lose records, and which records go to a dead-letter topic. Pure: no I/O,
//! so it is unit-tested and fuzzed without sockets.
//!
//! Fail closed: a batch that cannot be judged (it does not decode, it is a
//! legacy magic 0/1 message set, or the decode budget is spent) is never
//! forwarded unjudged. The plan stops there and holds the partition at that
//! batch's base offset: the client gets the records before it and fetches
//! it again. Undecodable and legacy batches stay held until an operator acts
//! (the `antidote_held_partitions` alert); a budget hold clears by itself.
//!
//! Visibility comes first (protocol-notes §4): under READ_COMMITTED a
//! transactional batch of an aborted transaction is never surfaced to the
//! client, so it is neither judged nor dead-lettered; it is forwarded as it
//! is and the client drops it, as it would without the proxy.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::deadletter::Diversion;
use crate::intercept::budget::{DecodeBudget, Reservation};
use crate::intercept::verdicts::{Known, VerdictCache};
use crate::kafka::batch::{self, Batch, BatchError, DecodedBatch, Segment};
use crate::kafka::compression::{Compression, DEFAULT_MAX_DECOMPRESSED};
use crate::policy::{Action, Policy, Undecodable};

/// Which transactional batches the requesting consumer will see.
pub struct Visibility {
    read_committed: bool,
    /// (producer id, first offset), sorted by first offset.
    aborted: Vec<(i64, i64)>,
}

impl Visibility {
    pub fn new(
        read_committed: bool,
        aborted: Option<&[kafka_protocol::messages::fetch_response::AbortedTransaction]>,
    ) -> Self {
        let mut aborted: Vec<(i64, i64)> = aborted
            .unwrap_or_default()
            .iter()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect();
        aborted.sort_by_key(|a| a.1);
        Visibility {
            read_committed,
            aborted,
        }
    }
}

/// Tracks aborted producers while walking batches in offset order, the way
/// the Java consumer does (CompletedFetch.consumeAbortedTransactionsUpTo).
struct AbortTracker<'a> {
    vis: &'a Visibility,
    next: usize,
    open: Vec<i64>,
}

impl<'a> AbortTracker<'a> {
    fn new(vis: &'a Visibility) -> Self {
        AbortTracker {
            vis,
            next: 0,
            open: Vec::new(),
        }
    }

    /// Whether the client will drop `batch` as part of an aborted transaction.
    fn is_aborted(&mut self, batch: &Batch) -> bool {
        if !self.vis.read_committed {
            return false;
        }
        let last = batch.next_offset() - 1;
        while let Some(&(pid, first)) = self.vis.aborted.get(self.next) {
            if first > last {
                break;
            }
            self.open.push(pid);
            self.next += 1;
        }
        if batch.is_control() {
            // An abort marker closes its producer's aborted transaction; a
            // commit marker for a producer in the list cannot occur.
            self.open.retain(|&p| p != batch.producer_id());
            return false;
        }
        batch.is_transactional() && self.open.contains(&batch.producer_id())
    }
}

/// What happens to one segment of the records section.
enum SegmentPlan {
    /// Forwarded as the bytes that arrived.
    Keep { bytes: Bytes, base: i64 },
    /// Rebuilt without the records whose `keep` is false. `cache`: where
    /// to keep the result for later fetches, when `keep` removes exactly
    /// what the verdicts remove.
    Splice {
        batch: Batch,
        decoded: DecodedBatch,
        keep: Vec<bool>,
        cache: Option<Known>,
        /// The decode budget held by `decoded` until the plan is dropped.
        _memory: Option<Reservation>,
    },
    /// Spliced by an earlier fetch (nothing in it left to divert); `next`
    /// is the batch's next offset.
    Spliced { bytes: Bytes, next: i64 },
}

/// The plan for one partition of one Fetch response.
pub struct PartitionPlan {
    pub topic: Arc<str>,
    pub partition: i32,
    pub policy: Arc<Policy>,
    segments: Vec<SegmentPlan>,
    /// Records to write to dead-letter topics before the response is released.
    pub diversions: Vec<Diversion>,
    /// Invalid records dropped or passed (not diverted), for counting.
    pub not_diverted: Vec<(Action, crate::policy::Invalid)>,
    /// Invalid records removed because an earlier fetch diverted them and
    /// nothing is left to write (batches resent as spliced before); counted
    /// as diverted, like a diversion the ledger finds done.
    pub already_diverted: Vec<crate::policy::Invalid>,
    /// Counts for logs and metrics.
    pub stats: PlanStats,
    /// The first batch that could not be judged: nothing from it on is
    /// delivered in this response.
    pub held: Option<Hold>,
}

/// Where and why a partition is held because a batch could not be judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The base offset of the batch that could not be judged.
    pub offset: i64,
    pub reason: HoldReason,
}

/// Why a batch could not be judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldReason {
    /// Corrupt (CRC), unknown codec, malformed records, or decompressing
    /// past the per-batch cap.
    Undecodable(String),
    /// A magic 0/1 message set: the proxy does not judge the legacy format.
    Legacy,
    /// The decode budget is spent by other responses in flight.
    Budget,
}

impl HoldReason {
    /// The `reason` label of `antidote_held_batches_total`.
    pub fn as_str(&self) -> &'static str {
        match self {
            HoldReason::Undecodable(_) => "undecodable",
            HoldReason::Legacy => "legacy",
            HoldReason::Budget => "budget",
        }
    }
}

impl std::fmt::Display for HoldReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HoldReason::Undecodable(e) => write!(f, "batch cannot be decoded: {e}"),
            HoldReason::Legacy => f.write_str("legacy (magic 0/1) message set"),
            HoldReason::Budget => f.write_str("decode budget spent by responses in flight"),
        }
    }
}

/// What a plan found, for counting.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PlanStats {
    /// Records judged in this response, verdicts from the cache included.
    pub judged: u64,
    /// Records validated now (not from the cache).
    pub validated: u64,
    pub diverted: u64,
    pub dropped: u64,
    pub passed_invalid: u64,
    pub undecodable_batches: u64,
    pub cached_batches: u64,
}

impl PartitionPlan {
    /// Whether the records section must be rebuilt.
    pub fn changes_anything(&self) -> bool {
        self.held.is_some()
            || self
                .segments
                .iter()
                .any(|s| !matches!(s, SegmentPlan::Keep { .. }))
    }

    /// Where delivery must stop: the lower of this plan's own hold and
    /// `failed_from` (the first diversion that did not succeed).
    pub fn held_from(&self, failed_from: Option<i64>) -> Option<i64> {
        match (self.held.as_ref().map(|h| h.offset), failed_from) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Build the new records section. `held_from`: the lowest offset whose
    /// diversion failed; nothing at or after it is delivered, and the batch
    /// containing it ends just before it so the client fetches it again.
    pub fn apply(&self, held_from: Option<i64>) -> Result<Bytes, BatchError> {
        let cut = held_from.unwrap_or(i64::MAX);
        let mut out = BytesMut::new();
        for seg in &self.segments {
            match seg {
                SegmentPlan::Keep { bytes, base } => {
                    // Without a hold everything kept goes out, the trailing
                    // partial batch included (its `base` is unknown).
                    if held_from.is_some() && *base >= cut {
                        break;
                    }
                    out.extend_from_slice(bytes);
                }
                SegmentPlan::Splice {
                    batch,
                    decoded,
                    keep,
                    cache: slot,
                    ..
                } => {
                    let base = batch.base_offset();
                    if held_from.is_some() && base >= cut {
                        break;
                    }
                    let within = cut < batch.next_offset();
                    // Outside a hold a removed tail ends in a commit marker,
                    // so librdkafka's position reaches the batch's end.
                    let spliced = if within {
                        batch::splice(batch, decoded, keep, Some(cut))?
                    } else {
                        crate::kafka::marker::splice_marking_tail(batch, decoded, keep)?
                    };
                    out.extend_from_slice(&spliced);
                    if within {
                        break;
                    }
                    if let Some(known) = slot {
                        known.keep_spliced(spliced);
                    }
                }
                SegmentPlan::Spliced { bytes, next } => {
                    // Holds are at records still to divert, never in here;
                    // should one be, the batch waits whole for the refetch.
                    if held_from.is_some() && cut < *next {
                        break;
                    }
                    out.extend_from_slice(bytes);
                }
            }
        }
        Ok(out.freeze())
    }
}

/// Plan one partition: judge (or recall) every visible record of every batch.
pub fn plan_partition(
    policy: &Arc<Policy>,
    topic: &Arc<str>,
    partition: i32,
    records: &Bytes,
    vis: &Visibility,
    now_ms: i64,
    cache: &VerdictCache,
) -> PartitionPlan {
    let env = Env {
        verdicts: cache,
        budget: &DecodeBudget::unlimited(),
        already: &|_, _| Vec::new(),
    };
    plan_partition_with(policy, topic, partition, records, vis, now_ms, &env)
}

/// Offsets in `from..to` already in a dead-letter topic.
pub type AlreadyDiverted<'a> = &'a dyn Fn(i64, i64) -> Vec<i64>;

/// What planning consults besides the records: verdicts reached before, the
/// shared decode budget, and the ledger of records already diverted.
pub struct Env<'a> {
    pub verdicts: &'a VerdictCache,
    pub budget: &'a Arc<DecodeBudget>,
    pub already: AlreadyDiverted<'a>,
}

/// `plan_partition`, also removing records diverted earlier even if the
/// current policy finds them valid: once a record is in its DLT, that is its
/// home (a fixed copy comes back through `dlt replay`), so a policy fix does
/// not make the original reappear next to its replayed copy.
pub fn plan_partition_with(
    policy: &Arc<Policy>,
    topic: &Arc<str>,
    partition: i32,
    records: &Bytes,
    vis: &Visibility,
    now_ms: i64,
    env: &Env<'_>,
) -> PartitionPlan {
    let (cache, already) = (env.verdicts, env.already);
    let mut plan = PartitionPlan {
        topic: topic.clone(),
        partition,
        policy: policy.clone(),
        not_diverted: Vec::new(),
        already_diverted: Vec::new(),
        segments: Vec::new(),
        diversions: Vec::new(),
        stats: PlanStats::default(),
        held: None,
    };
    let mut aborts = AbortTracker::new(vis);
    for seg in batch::segments(records) {
        let batch = match seg {
            Segment::Batch(b) => b,
            Segment::Legacy(bytes) => {
                // A magic 0/1 message set starts with its first offset.
                let base = bytes
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, i64::from_be_bytes);
                plan.held = Some(Hold {
                    offset: base,
                    reason: HoldReason::Legacy,
                });
                break;
            }
            Segment::Partial(bytes) => {
                plan.segments.push(SegmentPlan::Keep {
                    bytes,
                    base: i64::MAX,
                });
                continue;
            }
        };
        // is_aborted first: it must see the abort markers (control batches).
        if aborts.is_aborted(&batch) || batch.is_control() {
            plan.segments.push(keep(&batch));
            continue;
        }
        // A batch judged before (another consumer group, a re-fetch) with
        // nothing to remove passes without even being decoded; one whose
        // removals are all done may be sent as spliced before.
        let earlier = already(batch.base_offset(), batch.next_offset());
        let known = cache.lookup(policy, topic, partition, &batch);
        if let Some(k) = &known {
            plan.stats.cached_batches += 1;
            plan.stats.judged += batch.records_count().max(0) as u64;
            if k.verdicts().is_empty() && earlier.is_empty() {
                plan.segments.push(keep(&batch));
                continue;
            }
            if let Some(bytes) = resend_spliced(&mut plan, &batch, k, &earlier) {
                plan.segments.push(SegmentPlan::Spliced {
                    bytes,
                    next: batch.next_offset(),
                });
                continue;
            }
        }
        let (decoded, memory) = match decode_within(&batch, env.budget) {
            Ok(d) => d,
            Err(reason) => {
                // Never forwarded unjudged, never dropped: diverted whole
                // (if the policy says so) or held here.
                if let HoldReason::Undecodable(why) = &reason {
                    plan.stats.undecodable_batches += 1;
                    if policy.on_undecodable == Undecodable::Divert {
                        if let Some(seg) = divert_whole(&mut plan, &batch, why, &earlier) {
                            plan.segments.push(seg);
                            continue;
                        }
                    }
                }
                plan.held = Some(Hold {
                    offset: batch.base_offset(),
                    reason,
                });
                break;
            }
        };
        let (known, cached) = match known {
            Some(k) => (k, true),
            None => {
                plan.stats.judged += decoded.len() as u64;
                let (k, judged_here) =
                    cache.judge(policy, topic, partition, &batch, &decoded, now_ms);
                if judged_here {
                    plan.stats.validated += decoded.len() as u64;
                } else {
                    plan.stats.cached_batches += 1;
                }
                (k, !judged_here)
            }
        };
        let invalid = known.verdicts().clone();
        if invalid.is_empty() && earlier.is_empty() {
            plan.segments.push(keep(&batch));
            continue;
        }
        let mut keep_mask = vec![true; decoded.len()];
        for (i, k) in keep_mask.iter_mut().enumerate() {
            if decoded
                .offset(i)
                .is_some_and(|o| earlier.binary_search(&o).is_ok())
            {
                *k = false;
            }
        }
        let mut divert = vec![None; decoded.len()];
        for j in invalid.iter() {
            let Some(k) = keep_mask.get_mut(j.index) else {
                continue;
            };
            match policy.on_invalid {
                Action::Pass => {
                    plan.stats.passed_invalid += 1;
                    plan.not_diverted.push((Action::Pass, j.invalid.clone()));
                }
                Action::Drop => {
                    plan.stats.dropped += 1;
                    plan.not_diverted.push((Action::Drop, j.invalid.clone()));
                    *k = false;
                }
                Action::Divert => {
                    *k = false;
                    divert[j.index] = Some(&j.invalid);
                }
            }
        }
        if !cached && policy.on_invalid != Action::Divert {
            for j in invalid.iter() {
                let v = &j.invalid;
                tracing::info!(%topic, partition, offset = j.offset,
                    class = v.class.as_str(), rule = %v.rule, reason = %v.log_reason(),
                    action = ?policy.on_invalid, "invalid record not diverted");
            }
        }
        if divert.iter().any(Option::is_some) {
            for (record, verdict) in decoded.records().zip(&divert) {
                if let Some(verdict) = verdict {
                    plan.stats.diverted += 1;
                    plan.diversions
                        .push(Diversion::new(policy, topic, partition, &record, verdict));
                }
            }
        }
        if keep_mask.iter().all(|k| *k) {
            plan.segments.push(keep(&batch));
        } else {
            // Worth keeping for later fetches only if it removes exactly
            // what the verdicts remove (not also records diverted under an
            // earlier policy).
            let exact = policy.on_invalid != Action::Pass
                && earlier
                    .iter()
                    .all(|o| invalid.iter().any(|j| j.offset == *o));
            plan.segments.push(SegmentPlan::Splice {
                batch,
                decoded,
                keep: keep_mask,
                cache: exact.then_some(known),
                _memory: memory,
            });
        }
    }
    plan
}

/// The batch of `known` as spliced by an earlier fetch, if this fetch
/// would splice it the same way and has nothing left to divert in it:
/// every invalid record removed (and, when diverted, already in its DLT),
/// nothing else removed. Counts what it stands for as the full path does.
/// The batch's CRC is checked first: the cache matches on the stored CRC,
/// and a corrupt copy must go out as it came (as the full path sends an
/// undecodable batch), not be replaced by the good one.
fn resend_spliced(
    plan: &mut PartitionPlan,
    batch: &Batch,
    known: &Known,
    earlier: &[i64],
) -> Option<Bytes> {
    let invalid = known.verdicts();
    let action = plan.policy.on_invalid;
    let removes_exactly = match action {
        Action::Pass => false,
        Action::Drop => earlier
            .iter()
            .all(|o| invalid.iter().any(|j| j.offset == *o)),
        Action::Divert => {
            invalid.len() == earlier.len()
                && invalid
                    .iter()
                    .all(|j| earlier.binary_search(&j.offset).is_ok())
        }
    };
    if !removes_exactly {
        return None;
    }
    let bytes = known.spliced()?;
    if !batch.crc_valid() {
        return None;
    }
    for j in invalid.iter() {
        match action {
            Action::Divert => {
                plan.stats.diverted += 1;
                plan.already_diverted.push(j.invalid.clone());
            }
            _ => {
                plan.stats.dropped += 1;
                plan.not_diverted.push((Action::Drop, j.invalid.clone()));
            }
        }
    }
    Some(bytes)
}

/// Plan `batch`, which cannot be decoded, as diverted whole: one DLT record
/// holding its raw bytes (unless an earlier fetch wrote it: its base offset
/// is in the ledger), and an empty batch plus a commit marker in its place.
/// `None` if even its header is unusable for that (then it is held).
fn divert_whole(
    plan: &mut PartitionPlan,
    batch: &Batch,
    why: &str,
    earlier: &[i64],
) -> Option<SegmentPlan> {
    let bytes = crate::kafka::marker::replace_whole(batch).ok()?;
    let reason = format!("batch cannot be decoded: {why}");
    let d = Diversion::whole_batch(&plan.policy, &plan.topic, plan.partition, batch, reason);
    plan.stats.diverted += 1;
    if earlier.contains(&batch.base_offset()) {
        plan.already_diverted.push(d.invalid);
    } else {
        tracing::warn!(topic = %plan.topic, partition = plan.partition,
            base_offset = batch.base_offset(), last_offset = batch.next_offset() - 1,
            error = why, "batch cannot be decoded: diverted whole");
        plan.diversions.push(d);
    }
    Some(SegmentPlan::Spliced {
        bytes,
        next: batch.next_offset(),
    })
}

/// Decompressed bytes first reserved for a compressed batch, as a multiple
/// of its compressed size; one that expands further is decoded again under
/// the per-batch cap.
const EXPANSION_GUESS: usize = 32;

/// Decode `batch`, holding its decompressed bytes against `budget` (a
/// reservation is `None` for uncompressed batches, whose records are a
/// slice of the response).
fn decode_within(
    batch: &Batch,
    budget: &Arc<DecodeBudget>,
) -> Result<(DecodedBatch, Option<Reservation>), HoldReason> {
    let undecodable = |e: BatchError| HoldReason::Undecodable(e.to_string());
    if batch.compression() == Some(Compression::None) || batch.compression().is_none() {
        return batch.decode().map(|d| (d, None)).map_err(undecodable);
    }
    let cap = DEFAULT_MAX_DECOMPRESSED;
    let guess = batch
        .bytes()
        .len()
        .saturating_mul(EXPANSION_GUESS)
        .clamp(1 << 20, cap);
    let mut limit = guess;
    loop {
        let mut memory = budget.try_reserve(limit).ok_or(HoldReason::Budget)?;
        match batch.decode_with_limit(limit) {
            Ok(d) => {
                memory.shrink_to(d.memory());
                return Ok((d, Some(memory)));
            }
            Err(BatchError::TooLarge { .. }) if limit < cap => limit = cap,
            Err(e) => return Err(undecodable(e)),
        }
    }
}

fn keep(batch: &Batch) -> SegmentPlan {
    SegmentPlan::Keep {
        bytes: batch.bytes().clone(),
        base: batch.base_offset(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::batch::ATTR_TRANSACTIONAL;
    use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
    use crate::kafka::compression::Compression;
    use crate::policy::PolicySet;
    use kafka_protocol::messages::fetch_response::AbortedTransaction;
    use kafka_protocol::messages::ProducerId;
    use std::path::Path;

    const POLICY: &str = "policies:\n  - name: p\n    topics: [t]\n    value: { format: json }\n    rules:\n      - coordinates: { lat: /lat, lon: /lon }\n";

    fn policy(action: &str) -> Arc<Policy> {
        let text = format!("{POLICY}    on_invalid: {action}\n");
        let set = PolicySet::parse(&text, Path::new("p.yaml")).unwrap();
        set.for_topic("t").unwrap().clone()
    }

    /// A batch at `base` whose records are valid unless their index is in `poison`.
    fn batch(
        base: i64,
        n: usize,
        poison: &[usize],
        codec: Compression,
        pid: i64,
        transactional: bool,
    ) -> Vec<u8> {
        let records: Vec<NewRecord> = (0..n)
            .map(|i| NewRecord {
                timestamp: 1_000 + i as i64,
                key: Some(format!("k{i}").into_bytes().into()),
                value: Some(if poison.contains(&i) {
                    r#"{"lat":91.5,"lon":4}"#.into()
                } else {
                    r#"{"lat":52,"lon":4}"#.into()
                }),
                headers: vec![],
            })
            .collect();
        let opts = BuildOptions::default()
            .compression(codec)
            .idempotent(pid, 0, 0);
        let mut b = build_batch(&records, &opts).unwrap().to_vec();
        b[..8].copy_from_slice(&base.to_be_bytes());
        if transactional {
            let attrs = i16::from_be_bytes([b[21], b[22]]) | ATTR_TRANSACTIONAL;
            b[21..23].copy_from_slice(&attrs.to_be_bytes());
            let crc = crc32c::crc32c(&b[21..]);
            b[17..21].copy_from_slice(&crc.to_be_bytes());
        }
        b
    }

    fn plan(section: Vec<u8>, action: &str, vis: &Visibility) -> PartitionPlan {
        let cache = VerdictCache::new(16);
        plan_partition(
            &policy(action),
            &Arc::from("t"),
            0,
            &Bytes::from(section),
            vis,
            0,
            &cache,
        )
    }

    /// (baseOffset, record offsets, next fetch offset) per data batch; a
    /// commit marker after a batch (kafka::marker) only moves its next offset.
    fn offsets(section: &Bytes) -> Vec<(i64, Vec<i64>, i64)> {
        let mut out: Vec<(i64, Vec<i64>, i64)> = Vec::new();
        for s in batch::segments(section) {
            match s {
                Segment::Batch(b) if b.is_control() => match out.last_mut() {
                    Some(last) if last.2 == b.base_offset() => last.2 = b.next_offset(),
                    _ => out.push((b.base_offset(), vec![], b.next_offset())),
                },
                Segment::Batch(b) => {
                    let d = b.decode().unwrap();
                    let offs = d.records().map(|r| r.offset).collect();
                    out.push((b.base_offset(), offs, b.next_offset()));
                }
                _ => {}
            }
        }
        out
    }

    fn markers(section: &Bytes) -> Vec<i64> {
        batch::segments(section)
            .into_iter()
            .filter_map(|s| match s {
                Segment::Batch(b) if b.is_control() => Some(b.base_offset()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_removed_tail_ends_in_a_marker_but_never_at_a_hold() {
        let mut section = batch(0, 5, &[1, 4], Compression::None, -1, false);
        section.extend(batch(5, 3, &[1], Compression::None, -1, false));
        section.extend(batch(8, 2, &[0, 1], Compression::Zstd, -1, false));
        let p = plan(section, "divert", &uncommitted());
        let out = p.apply(None).unwrap();
        assert_eq!(markers(&out), vec![4, 9], "tail-removed batches only");
        assert_eq!(
            offsets(&out),
            vec![(0, vec![0, 2, 3], 5), (5, vec![5, 7], 8), (8, vec![], 10)]
        );
        // Held at 9 (its diversion failed): no marker may step over it.
        let held = p.apply(Some(9)).unwrap();
        assert_eq!(markers(&held), vec![4]);
        assert_eq!(offsets(&held).last(), Some(&(8, vec![], 9)));
        // Dropped records are gone for good too.
        let p = plan(
            batch(0, 2, &[1], Compression::None, -1, false),
            "drop",
            &uncommitted(),
        );
        assert_eq!(markers(&p.apply(None).unwrap()), vec![1]);
    }

    fn uncommitted() -> Visibility {
        Visibility::new(false, None)
    }

    #[test]
    fn a_clean_section_is_left_alone() {
        let p = plan(
            batch(0, 5, &[], Compression::None, -1, false),
            "divert",
            &uncommitted(),
        );
        assert!(!p.changes_anything());
        assert!(p.diversions.is_empty());
        assert_eq!(p.stats.validated, 5);
    }

    #[test]
    fn poison_is_removed_and_offsets_and_next_fetch_offset_are_kept() {
        for codec in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let mut section = batch(0, 5, &[0, 2, 4], codec, -1, false);
            section.extend(batch(5, 3, &[0, 1, 2], codec, -1, false));
            let p = plan(section, "divert", &uncommitted());
            let out = p.apply(None).unwrap();
            assert_eq!(
                offsets(&out),
                vec![(0, vec![1, 3], 5), (5, vec![], 8)],
                "{codec:?}"
            );
            let diverted: Vec<i64> = p.diversions.iter().map(|d| d.origin_offset).collect();
            assert_eq!(diverted, vec![0, 2, 4, 5, 6, 7]);
            assert_eq!(p.diversions[0].invalid.rule, "coordinates");
        }
    }

    #[test]
    fn a_failed_diversion_holds_the_partition_just_before_it() {
        let mut section = batch(0, 5, &[3], Compression::None, -1, false);
        section.extend(batch(5, 3, &[], Compression::None, -1, false));
        let p = plan(section, "divert", &uncommitted());
        // Records 0-2 are delivered; the client fetches offset 3 next.
        assert_eq!(
            offsets(&p.apply(Some(3)).unwrap()),
            vec![(0, vec![0, 1, 2], 3)]
        );
        // A hold at a batch's first offset withholds that batch and the rest.
        let mut section = batch(0, 2, &[], Compression::None, -1, false);
        section.extend(batch(2, 2, &[0], Compression::None, -1, false));
        let p = plan(section, "divert", &uncommitted());
        assert_eq!(
            offsets(&p.apply(Some(2)).unwrap()),
            vec![(0, vec![0, 1], 2)]
        );
    }

    #[test]
    fn drop_removes_without_diverting_and_pass_delivers() {
        let p = plan(
            batch(0, 3, &[1], Compression::None, -1, false),
            "drop",
            &uncommitted(),
        );
        assert!(p.diversions.is_empty());
        assert_eq!(p.stats.dropped, 1);
        assert_eq!(offsets(&p.apply(None).unwrap()), vec![(0, vec![0, 2], 3)]);
        let p = plan(
            batch(0, 3, &[1], Compression::None, -1, false),
            "pass",
            &uncommitted(),
        );
        assert!(!p.changes_anything());
        assert_eq!(p.stats.passed_invalid, 1);
    }

    #[test]
    fn aborted_records_are_not_dead_lettered_under_read_committed() {
        let section = batch(0, 3, &[1], Compression::None, 42, true);
        let aborted = [AbortedTransaction::default()
            .with_producer_id(ProducerId(42))
            .with_first_offset(0)];
        let p = plan(
            section.clone(),
            "divert",
            &Visibility::new(true, Some(&aborted)),
        );
        assert!(p.diversions.is_empty() && !p.changes_anything());
        // Another producer's abort does not hide this batch.
        let other = [AbortedTransaction::default()
            .with_producer_id(ProducerId(7))
            .with_first_offset(0)];
        assert_eq!(
            plan(
                section.clone(),
                "divert",
                &Visibility::new(true, Some(&other))
            )
            .diversions
            .len(),
            1
        );
        // read_uncommitted consumers see aborted records, so they are judged.
        assert_eq!(plan(section, "divert", &uncommitted()).diversions.len(), 1);
    }

    #[test]
    fn a_record_diverted_earlier_stays_out_even_when_now_valid() {
        let cache = VerdictCache::new(16);
        let section = Bytes::from(batch(10, 4, &[], Compression::None, -1, false));
        let already = |from: i64, to: i64| {
            if (from..to).contains(&12) {
                vec![12]
            } else {
                vec![]
            }
        };
        let p = plan_partition_with(
            &policy("divert"),
            &Arc::from("t"),
            0,
            &section,
            &uncommitted(),
            0,
            &Env {
                verdicts: &cache,
                budget: &DecodeBudget::unlimited(),
                already: &already,
            },
        );
        assert!(
            p.diversions.is_empty(),
            "already in its DLT: not written again"
        );
        assert_eq!(
            offsets(&p.apply(None).unwrap()),
            vec![(10, vec![10, 11, 13], 14)]
        );
    }

    #[test]
    fn a_trailing_partial_batch_survives_a_rewrite_but_not_a_hold() {
        let mut section = batch(0, 3, &[1], Compression::None, -1, false);
        let partial = batch(3, 2, &[], Compression::None, -1, false);
        section.extend_from_slice(&partial[..40]);
        let p = plan(section, "divert", &uncommitted());
        assert!(p.apply(None).unwrap().ends_with(&partial[..40]));
        assert!(!p.apply(Some(1)).unwrap().ends_with(&partial[..40]));
    }

    #[test]
    fn a_batch_judged_once_is_not_validated_again() {
        let cache = VerdictCache::new(16);
        let section = Bytes::from(batch(0, 4, &[1], Compression::None, -1, false));
        let pol = policy("divert");
        let t: Arc<str> = Arc::from("t");
        let first = plan_partition(&pol, &t, 0, &section, &uncommitted(), 0, &cache);
        let second = plan_partition(&pol, &t, 0, &section, &uncommitted(), 0, &cache);
        assert_eq!((first.stats.validated, first.stats.cached_batches), (4, 0));
        assert_eq!(
            (second.stats.validated, second.stats.cached_batches),
            (0, 1)
        );
        assert_eq!(second.diversions.len(), 1);
    }

    /// Plan `section` under `pol` with the ledger saying `done` are diverted.
    fn replan(
        pol: &Arc<Policy>,
        section: &Bytes,
        cache: &VerdictCache,
        done: &[i64],
    ) -> PartitionPlan {
        let already = |from: i64, to: i64| {
            done.iter()
                .copied()
                .filter(|o| (from..to).contains(o))
                .collect()
        };
        plan_partition_with(
            pol,
            &Arc::from("t"),
            0,
            section,
            &uncommitted(),
            0,
            &Env {
                verdicts: cache,
                budget: &DecodeBudget::unlimited(),
                already: &already,
            },
        )
    }

    fn is_resent(p: &PartitionPlan) -> Vec<bool> {
        p.segments
            .iter()
            .map(|s| matches!(s, SegmentPlan::Spliced { .. }))
            .collect()
    }

    #[test]
    fn a_spliced_batch_is_resent_once_its_poison_is_in_the_dlt() {
        let cache = VerdictCache::new(16);
        let mut raw = batch(0, 4, &[1], Compression::Lz4, -1, false);
        raw.extend(batch(4, 3, &[], Compression::None, -1, false));
        raw.extend(batch(7, 3, &[0, 2], Compression::None, -1, false));
        let section = Bytes::from(raw);
        let pol = policy("divert");
        let first = replan(&pol, &section, &cache, &[]);
        assert_eq!(first.diversions.len(), 3);
        let sent = first.apply(None).unwrap();

        // Diversions not acknowledged yet: judged from the cache, but
        // decoded and diverted again (joining the write under way).
        let pending = replan(&pol, &section, &cache, &[]);
        assert_eq!(pending.diversions.len(), 3);
        assert_eq!(is_resent(&pending), [false, false, false]);

        // All in the DLT: the spliced bytes are resent, nothing decoded.
        let later = replan(&pol, &section, &cache, &[1, 7, 9]);
        assert_eq!(is_resent(&later), [true, false, true]);
        assert!(
            later.changes_anything(),
            "resent batches replace the originals"
        );
        assert!(later.diversions.is_empty());
        assert_eq!(later.already_diverted.len(), 3);
        assert_eq!((later.stats.diverted, later.stats.validated), (3, 0));
        assert_eq!(later.apply(None).unwrap(), sent);
        assert_eq!(
            offsets(&sent),
            vec![
                (0, vec![0, 2, 3], 4),
                (4, vec![4, 5, 6], 7),
                (7, vec![8], 10)
            ]
        );

        // Only some in the DLT (the others' writes failed): full path.
        let partly = replan(&pol, &section, &cache, &[1]);
        assert_eq!(is_resent(&partly), [true, false, false]);
        assert_eq!(partly.diversions.len(), 2);
    }

    #[test]
    fn a_batch_spliced_differently_is_not_kept() {
        // Offset 2 was diverted under an earlier policy; this one finds only
        // 1 invalid. The splice removes both, which the verdicts alone do not
        // say, so it is not kept for resending.
        let cache = VerdictCache::new(16);
        let section = Bytes::from(batch(0, 4, &[1], Compression::None, -1, false));
        let pol = policy("divert");
        replan(&pol, &section, &cache, &[2]).apply(None).unwrap();
        let again = replan(&pol, &section, &cache, &[1, 2]);
        assert_eq!(is_resent(&again), [false]);
        assert_eq!(
            offsets(&again.apply(None).unwrap()),
            vec![(0, vec![0, 3], 4)]
        );
    }

    #[test]
    fn dropped_records_are_resent_spliced_and_counted() {
        let cache = VerdictCache::new(16);
        let section = Bytes::from(batch(0, 4, &[1], Compression::Zstd, -1, false));
        let pol = policy("drop");
        let sent = replan(&pol, &section, &cache, &[]).apply(None).unwrap();
        let again = replan(&pol, &section, &cache, &[]);
        assert_eq!(is_resent(&again), [true]);
        assert!(again.changes_anything());
        assert_eq!((again.stats.dropped, again.not_diverted.len()), (1, 1));
        assert_eq!(again.apply(None).unwrap(), sent);
    }

    #[test]
    fn passed_records_are_never_spliced() {
        let cache = VerdictCache::new(16);
        let section = Bytes::from(batch(0, 4, &[1], Compression::None, -1, false));
        let pol = policy("pass");
        replan(&pol, &section, &cache, &[]).apply(None).unwrap();
        let again = replan(&pol, &section, &cache, &[]);
        assert!(!again.changes_anything());
        assert_eq!(cache.spliced_bytes(), 0);
    }

    #[test]
    fn spliced_batches_stay_within_their_budget_oldest_dropped_first() {
        let first = Bytes::from(batch(0, 4, &[1], Compression::None, -1, false));
        let second = Bytes::from(batch(4, 4, &[1], Compression::None, -1, false));
        let pol = policy("drop");
        let one = replan(&pol, &first, &VerdictCache::new(16), &[])
            .apply(None)
            .unwrap()
            .len();
        let cache = VerdictCache::with_spliced_budget(16, one + one / 2);
        replan(&pol, &first, &cache, &[]).apply(None).unwrap();
        assert_eq!(cache.spliced_bytes(), one);
        replan(&pol, &second, &cache, &[]).apply(None).unwrap();
        assert_eq!(
            cache.spliced_bytes(),
            one,
            "the first was dropped for the second"
        );
        assert_eq!(is_resent(&replan(&pol, &first, &cache, &[])), [false]);
        assert_eq!(is_resent(&replan(&pol, &second, &cache, &[])), [true]);
        cache.clear();
        assert_eq!(cache.spliced_bytes(), 0);
    }

    #[test]
    fn a_hold_inside_a_resent_batch_stops_before_it() {
        let cache = VerdictCache::new(16);
        let mut raw = batch(0, 3, &[], Compression::None, -1, false);
        raw.extend(batch(3, 3, &[1], Compression::None, -1, false));
        let section = Bytes::from(raw);
        let pol = policy("divert");
        replan(&pol, &section, &cache, &[]).apply(None).unwrap();
        let again = replan(&pol, &section, &cache, &[4]);
        assert_eq!(is_resent(&again), [false, true]);
        assert_eq!(
            offsets(&again.apply(Some(5)).unwrap()),
            vec![(0, vec![0, 1, 2], 3)]
        );
    }

    #[test]
    fn a_corrupt_copy_of_a_spliced_batch_is_not_replaced_by_the_good_one() {
        let cache = VerdictCache::new(16);
        let good = batch(0, 4, &[1], Compression::None, -1, false);
        let pol = policy("drop");
        replan(&pol, &Bytes::from(good.clone()), &cache, &[])
            .apply(None)
            .unwrap();
        let mut corrupt = good;
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0x55; // same stored CRC, different body
        let corrupt = Bytes::from(corrupt);
        let again = replan(&pol, &corrupt, &cache, &[]);
        assert!(is_resent(&again).is_empty(), "held before it, not resent");
        assert_eq!(again.stats.undecodable_batches, 1);
        assert_eq!(again.held.as_ref().map(|h| h.offset), Some(0));
        assert_eq!(again.apply(again.held_from(None)).unwrap(), Bytes::new());
    }

    /// `batch` with its last byte flipped: the stored CRC no longer matches.
    fn corrupt(mut b: Vec<u8>) -> Vec<u8> {
        let last = b.len() - 1;
        b[last] ^= 0x55;
        b
    }

    #[test]
    fn an_undecodable_batch_holds_the_partition_after_the_valid_batches_before_it() {
        let mut raw = batch(0, 3, &[1], Compression::None, -1, false);
        raw.extend(corrupt(batch(3, 2, &[], Compression::None, -1, false)));
        raw.extend(batch(5, 2, &[], Compression::None, -1, false));
        let p = plan(raw, "divert", &uncommitted());
        let held = p.held.clone().expect("held at the corrupt batch");
        assert_eq!(held.offset, 3);
        assert!(matches!(held.reason, HoldReason::Undecodable(_)));
        assert!(p.changes_anything());
        assert_eq!(
            p.diversions.len(),
            1,
            "the poison before the hold is still diverted"
        );
        let out = p.apply(p.held_from(None)).unwrap();
        assert_eq!(
            offsets(&out),
            vec![(0, vec![0, 2], 3)],
            "nothing at or after offset 3"
        );
    }

    #[test]
    fn on_undecodable_divert_writes_the_raw_batch_once_and_moves_on() {
        let text = format!("{POLICY}    on_undecodable: divert\n");
        let set = PolicySet::parse(&text, Path::new("p.yaml")).unwrap();
        let pol = set.for_topic("t").unwrap().clone();
        let bad = corrupt(batch(3, 2, &[], Compression::None, -1, false));
        let mut raw = batch(0, 3, &[], Compression::None, -1, false);
        raw.extend(&bad);
        raw.extend(batch(5, 2, &[], Compression::None, -1, false));
        let section = Bytes::from(raw);
        let cache = VerdictCache::new(16);
        let p = replan(&pol, &section, &cache, &[]);
        assert!(p.held.is_none(), "diverted, not held");
        let [d] = &p.diversions[..] else {
            panic!("one diversion: {:?}", p.diversions.len())
        };
        assert_eq!((d.origin_offset, d.invalid.rule.as_str()), (3, "batch"));
        assert_eq!(
            d.value.as_deref(),
            Some(&bad[..]),
            "the raw batch, byte for byte"
        );
        let out = p.apply(None).unwrap();
        assert_eq!(
            offsets(&out),
            vec![(0, vec![0, 1, 2], 3), (3, vec![], 5), (5, vec![5, 6], 7)]
        );
        assert_eq!(markers(&out), vec![4], "the batch's last offset is carried");
        // Once in the DLT (the ledger has its base offset): not written again.
        let again = replan(&pol, &section, &cache, &[3]);
        assert!(again.diversions.is_empty());
        assert_eq!(again.apply(None).unwrap(), out);
        // A failed diversion holds before the batch.
        assert_eq!(
            offsets(&p.apply(Some(3)).unwrap()),
            vec![(0, vec![0, 1, 2], 3)]
        );
    }

    #[test]
    fn an_unknown_codec_is_held_not_forwarded() {
        let mut b = batch(0, 2, &[], Compression::None, -1, false);
        let attrs = i16::from_be_bytes([b[21], b[22]]) | 7; // codec id 7 does not exist
        b[21..23].copy_from_slice(&attrs.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        let p = plan(b, "divert", &uncommitted());
        assert_eq!(p.held.as_ref().map(|h| h.offset), Some(0));
        assert_eq!(p.apply(p.held_from(None)).unwrap(), Bytes::new());
    }

    #[test]
    fn a_legacy_message_set_is_held_not_forwarded_unjudged() {
        let mut raw = batch(0, 2, &[], Compression::None, -1, false);
        // A magic 1 message at offset 2: offset i64, size i32, crc, magic 1, ...
        let mut legacy = Vec::new();
        legacy.extend(2i64.to_be_bytes());
        let msg = [
            &[0u8; 4][..],
            &[1, 0],
            &0i64.to_be_bytes(),
            &(-1i32).to_be_bytes(),
            &3i32.to_be_bytes(),
            b"bad",
        ]
        .concat();
        legacy.extend((msg.len() as i32).to_be_bytes());
        legacy.extend(msg);
        raw.extend(legacy);
        let p = plan(raw, "divert", &uncommitted());
        let held = p.held.clone().expect("held at the legacy set");
        assert_eq!((held.offset, held.reason), (2, HoldReason::Legacy));
        assert_eq!(
            offsets(&p.apply(p.held_from(None)).unwrap()),
            vec![(0, vec![0, 1], 2)]
        );
    }

    #[test]
    fn a_spent_budget_holds_a_compressed_batch_and_a_free_one_decodes_it() {
        let raw = Bytes::from(batch(0, 4, &[2], Compression::Zstd, -1, false));
        let budget = DecodeBudget::new(1);
        let other = budget
            .try_reserve(1)
            .expect("first reservation always fits");
        let cache = VerdictCache::new(16);
        let env = Env {
            verdicts: &cache,
            budget: &budget,
            already: &|_, _| Vec::new(),
        };
        let pol = policy("divert");
        let t: Arc<str> = Arc::from("t");
        let p = plan_partition_with(&pol, &t, 0, &raw, &uncommitted(), 0, &env);
        assert_eq!(
            p.held.as_ref().map(|h| h.reason.clone()),
            Some(HoldReason::Budget)
        );
        assert!(p.diversions.is_empty());
        drop(other);
        let p = plan_partition_with(&pol, &t, 0, &raw, &uncommitted(), 0, &env);
        assert!(p.held.is_none());
        assert_eq!(p.diversions.len(), 1);
        assert!(
            budget.used() > 0,
            "the decoded batch holds its bytes while the plan lives"
        );
        drop(p);
        assert_eq!(budget.used(), 0, "and gives them back when it is dropped");
    }
}
