//! The planner against hand-built batches: splicing, holds, visibility,
//! the verdict cache and the ledger of earlier diversions.

use super::budget::DecodeBudget;
use super::verdicts::VerdictCache;
use super::*;
use crate::kafka::batch;
use crate::kafka::batch::Segment;
use crate::kafka::batch::{ATTR_CONTROL, ATTR_TRANSACTIONAL};
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
use crate::kafka::compression::Compression;
use crate::policy::PolicySet;
use kafka_protocol::messages::fetch_response::AbortedTransaction;
use kafka_protocol::messages::ProducerId;
use std::path::Path;

/// Partition 0 of `topic` at the test clock.
pub(super) fn input<'a>(
    policy: &'a Arc<Policy>,
    topic: &'a Arc<str>,
    records: &'a Bytes,
    visibility: &'a Visibility,
) -> PartitionInput<'a> {
    PartitionInput {
        policy,
        topic,
        partition: 0,
        records,
        visibility,
        now_ms: 0,
        deadline: None,
    }
}

const POLICY: &str = "policies:\n  - name: p\n    topics: [t]\n    value: { format: json }\n    rules:\n      - coordinates: { lat: /lat, lon: /lon }\n";

pub(super) fn policy(action: &str) -> Arc<Policy> {
    let text = format!("{POLICY}    on_invalid: {action}\n");
    let set = PolicySet::parse(&text, Path::new("p.yaml")).unwrap();
    set.for_topic("t").unwrap().clone()
}

/// A batch at `base` whose records are valid unless their index is in `poison`.
pub(super) fn batch(
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
        add_attributes(&mut b, ATTR_TRANSACTIONAL);
    }
    b
}

/// Set attribute bits on a built batch and fix its CRC.
fn add_attributes(b: &mut [u8], bits: i16) {
    let attrs = i16::from_be_bytes([b[21], b[22]]) | bits;
    b[21..23].copy_from_slice(&attrs.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// An abort marker (a control batch: key version 0, type 0) of `pid` at `base`.
fn abort_marker(base: i64, pid: i64) -> Vec<u8> {
    let marker = NewRecord {
        timestamp: 1_000,
        key: Some(vec![0, 0, 0, 0].into()),
        value: Some(vec![0, 0, 0, 0, 0, 0].into()),
        headers: vec![],
    };
    let opts = BuildOptions::default().idempotent(pid, 0, 0);
    let mut b = build_batch(&[marker], &opts).unwrap().to_vec();
    b[..8].copy_from_slice(&base.to_be_bytes());
    add_attributes(&mut b, ATTR_TRANSACTIONAL | ATTR_CONTROL);
    b
}

fn plan(section: Vec<u8>, action: &str, vis: &Visibility) -> PartitionPlan {
    let cache = VerdictCache::new(16);
    plan_partition(
        &input(&policy(action), &Arc::from("t"), &Bytes::from(section), vis),
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

pub(super) fn uncommitted() -> Visibility {
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
    assert_eq!(p.invalid_count(Action::Drop), 1);
    assert_eq!(offsets(&p.apply(None).unwrap()), vec![(0, vec![0, 2], 3)]);
    let p = plan(
        batch(0, 3, &[1], Compression::None, -1, false),
        "pass",
        &uncommitted(),
    );
    assert!(!p.changes_anything());
    assert_eq!(p.invalid_count(Action::Pass), 1);
}

/// DeleteRecords (or retention) cut a batch: Kafka returns it whole, but
/// records below the log start are deleted. None of them is diverted (a
/// DLT copy would bring back what an operator deleted); records from the
/// log start on are judged as usual. A batch wholly below it is untouched.
#[test]
fn records_below_the_log_start_are_never_diverted() {
    let mut section = batch(0, 5, &[0, 2], Compression::None, -1, false);
    section.extend(batch(5, 3, &[0], Compression::Lz4, -1, false));
    let p = plan(section.clone(), "divert", &uncommitted().with_log_start(2));
    let diverted: Vec<i64> = p.diversions.iter().map(|d| d.origin_offset).collect();
    assert_eq!(diverted, vec![2, 5]);
    assert_eq!(
        offsets(&p.apply(None).unwrap()),
        vec![(0, vec![0, 1, 3, 4], 5), (5, vec![6, 7], 8)]
    );
    let p = plan(section, "divert", &uncommitted().with_log_start(5));
    let diverted: Vec<i64> = p.diversions.iter().map(|d| d.origin_offset).collect();
    assert_eq!(
        diverted,
        vec![5],
        "the first batch is wholly below the log start"
    );
}

/// The abort marker closes its producer's aborted transaction: a later,
/// committed transaction of the same producer is visible and judged (it was
/// skipped unjudged while control batches bypassed the abort tracker).
#[test]
fn a_committed_transaction_after_an_aborted_one_of_the_same_producer_is_judged() {
    let mut section = batch(0, 2, &[], Compression::None, 42, true);
    section.extend(abort_marker(2, 42));
    section.extend(batch(3, 3, &[1], Compression::None, 42, true));
    let aborted = [AbortedTransaction::default()
        .with_producer_id(ProducerId(42))
        .with_first_offset(0)];
    let p = plan(section, "divert", &Visibility::new(true, Some(&aborted)));
    let diverted: Vec<i64> = p.diversions.iter().map(|d| d.origin_offset).collect();
    assert_eq!(diverted, vec![4]);
}

/// A batch whose last offset is i64::MAX (hostile; `next_offset` wraps)
/// is planned under read_committed without overflowing (fuzz finding
/// `fuzz/artifacts-found/fetch_plan-last-offset-i64max`).
#[test]
fn a_batch_ending_at_the_top_of_the_offset_range_is_planned_under_read_committed() {
    let section = batch(i64::MAX - 2, 3, &[1], Compression::None, 42, true);
    let aborted = [AbortedTransaction::default()
        .with_producer_id(ProducerId(7))
        .with_first_offset(0)];
    let p = plan(section, "divert", &Visibility::new(true, Some(&aborted)));
    let diverted: Vec<i64> = p.diversions.iter().map(|d| d.origin_offset).collect();
    assert_eq!(diverted, vec![i64::MAX - 1]);
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
        &input(&policy("divert"), &Arc::from("t"), &section, &uncommitted()),
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
    let first = plan_partition(&input(&pol, &t, &section, &uncommitted()), &cache);
    let second = plan_partition(&input(&pol, &t, &section, &uncommitted()), &cache);
    assert_eq!((first.stats.validated, first.stats.cached_batches), (4, 0));
    assert_eq!(
        (second.stats.validated, second.stats.cached_batches),
        (0, 1)
    );
    assert_eq!(second.diversions.len(), 1);
}

/// Plan `section` under `pol` with the ledger saying `done` are diverted.
fn replan(pol: &Arc<Policy>, section: &Bytes, cache: &VerdictCache, done: &[i64]) -> PartitionPlan {
    let already = |from: i64, to: i64| {
        done.iter()
            .copied()
            .filter(|o| (from..to).contains(o))
            .collect()
    };
    plan_partition_with(
        &input(pol, &Arc::from("t"), section, &uncommitted()),
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

/// A batch with poison below the log start (deleted: never judged into a
/// DLT) and poison above it: the batch cannot be resent as spliced (its
/// splice was not the verdicts' alone), so a re-fetch decodes it again, and
/// the record in its DLT already is settled, not diverted again.
/// fuzz/fetch_plan found it (CI at ea34c9a) with a lying broker's batch at
/// base offset -2 (below the unknown log start, -1); after DeleteRecords a
/// real broker sends such a batch whole.
#[test]
fn a_record_in_its_dlt_is_not_diverted_again_beside_one_below_the_log_start() {
    let pol = policy("divert");
    let t: Arc<str> = Arc::from("t");
    for (base, log_start) in [(-2, -1), (10, 11)] {
        let cache = VerdictCache::new(16);
        let section = Bytes::from(batch(base, 3, &[0, 2], Compression::None, -1, false));
        let vis = uncommitted().with_log_start(log_start);
        let plan = |done: &[i64]| {
            let already = |from: i64, to: i64| -> Vec<i64> {
                done.iter()
                    .copied()
                    .filter(|o| (from..to).contains(o))
                    .collect()
            };
            let env = Env {
                verdicts: &cache,
                budget: &DecodeBudget::unlimited(),
                already: &already,
            };
            plan_partition_with(&input(&pol, &t, &section, &vis), &env)
        };
        let first = plan(&[]);
        let done: Vec<i64> = first.diversions.iter().map(|d| d.origin_offset).collect();
        assert_eq!(done, [base + 2], "the deleted record is not diverted");
        let again = plan(&done);
        let again_at: Vec<i64> = again.diversions.iter().map(|d| d.origin_offset).collect();
        assert!(
            again_at.is_empty(),
            "base {base}: planned again: {again_at:?}"
        );
        assert_eq!(again.settled.len(), 1, "base {base}: settled as diverted");
        assert_eq!(again.apply(None).unwrap(), first.apply(None).unwrap());
    }
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
    assert_eq!(later.settled.len(), 3);
    assert_eq!(
        (later.invalid_count(Action::Divert), later.stats.validated),
        (3, 0)
    );
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
    assert_eq!(
        (again.invalid_count(Action::Drop), again.settled.len()),
        (1, 1)
    );
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
    let sizing = VerdictCache::new(16);
    replan(&pol, &first, &sizing, &[]).apply(None).unwrap();
    // A new header and a range for each run of kept records.
    let one = sizing.spliced_bytes();
    assert!(one > 61 && one < first.len(), "{one}");
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

/// A clean batch's verdict is for its bytes: a corrupt copy at the same
/// offset, with the same stored CRC and length (a broker that flips bits),
/// is decoded, fails its CRC and holds the partition. Before, the cached
/// "nothing to remove" passed it on unread, poison and all.
#[test]
fn a_corrupt_copy_of_a_clean_batch_is_held_not_passed_on_its_verdict() {
    let cache = VerdictCache::new(16);
    let pol = policy("divert");
    let t: Arc<str> = Arc::from("t");
    let good = batch(0, 4, &[], Compression::None, -1, false);
    let first = plan_partition(
        &input(&pol, &t, &Bytes::from(good.clone()), &uncommitted()),
        &cache,
    );
    assert!(!first.changes_anything());
    // The last record's value, `{"lat":52,"lon":4}`, made out of range.
    let mut bad = good.clone();
    let at = bad
        .windows(5)
        .rposition(|w| w == b"52,\"l")
        .expect("the last lat");
    bad[at..at + 2].copy_from_slice(b"95");
    assert_eq!(bad.len(), good.len());
    let bad = Bytes::from(bad);
    let again = plan_partition(&input(&pol, &t, &bad, &uncommitted()), &cache);
    assert_eq!(
        again.held.as_ref().map(|h| h.offset),
        Some(0),
        "held, not passed"
    );
    assert_eq!(again.stats.undecodable_batches, 1);
    assert_eq!(again.apply(again.held_from(None)).unwrap(), Bytes::new());
    // The good copy still passes on its verdict, unread.
    let third = plan_partition(&input(&pol, &t, &Bytes::from(good), &uncommitted()), &cache);
    assert!(!third.changes_anything());
    assert_eq!(third.stats.cached_batches, 1);
}

/// `batch` with its last byte flipped: the stored CRC no longer matches.
pub(super) fn corrupt(mut b: Vec<u8>) -> Vec<u8> {
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

/// `batch` with a byte after its last record, its length and CRC fixed:
/// well framed, but its records do not parse.
pub(super) fn trailing_byte(mut b: Vec<u8>) -> Vec<u8> {
    b.push(0);
    crate::kafka::splice::finish_header(&mut b).expect("a batch under 2 GiB");
    b
}

/// A batch is read once, as it is judged, so a record that does not parse
/// (here a byte after the last one, CRC intact) is found only after the
/// records before it were judged: it holds the partition there all the
/// same, the poison judged in it is not diverted, and nothing is cached,
/// so the next fetch (reading the cache first) holds there again.
#[test]
fn a_batch_found_malformed_while_judged_is_held_and_not_cached() {
    let mut raw = batch(0, 3, &[1], Compression::None, -1, false);
    raw.extend(trailing_byte(batch(
        3,
        3,
        &[1],
        Compression::None,
        -1,
        false,
    )));
    raw.extend(batch(6, 2, &[], Compression::None, -1, false));
    let section = Bytes::from(raw);
    let (pol, cache) = (policy("divert"), VerdictCache::new(16));
    for round in 0..2 {
        let p = replan(&pol, &section, &cache, &[]);
        let held = p.held.clone().expect("held at the malformed batch");
        assert_eq!(held.offset, 3, "round {round}");
        assert!(matches!(&held.reason, HoldReason::Undecodable(why) if why.contains("bytes left")));
        assert_eq!(p.stats.undecodable_batches, 1);
        let diverted: Vec<i64> = p.diversions.iter().map(|d| d.origin_offset).collect();
        assert_eq!(diverted, [1], "only the poison before the malformed batch");
        let out = p.apply(p.held_from(None)).unwrap();
        assert_eq!(offsets(&out), vec![(0, vec![0, 2], 3)]);
    }
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
    let p = plan_partition_with(&input(&pol, &t, &raw, &uncommitted()), &env);
    assert_eq!(
        p.held.as_ref().map(|h| h.reason.clone()),
        Some(HoldReason::Budget)
    );
    assert!(p.diversions.is_empty());
    drop(other);
    let p = plan_partition_with(&input(&pol, &t, &raw, &uncommitted()), &env);
    assert!(p.held.is_none());
    assert_eq!(p.diversions.len(), 1);
    assert!(
        budget.used() > 0,
        "the decoded batch holds its bytes while the plan lives"
    );
    drop(p);
    assert_eq!(budget.used(), 0, "and gives them back when it is dropped");
}
