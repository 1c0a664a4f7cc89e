//! Judging ahead (`judge_ahead`): whatever a helper judged, and whenever,
//! the plan is the one the planner makes alone, and every record counts as
//! validated exactly once.

use super::budget::DecodeBudget;
use super::tests::{batch, corrupt, input, policy, uncommitted};
use super::verdicts::VerdictCache;
use super::*;
use crate::kafka::compression::Compression;

const BATCHES: i64 = 12;
const PER_BATCH: usize = 40;

/// Twelve batches of 40 records, every third one compressed, with a
/// poison record in batches 1, 6 and 11 (two in 6).
pub(super) fn section() -> Bytes {
    let mut raw = Vec::new();
    for i in 0..BATCHES {
        let poison: &[usize] = match i {
            1 => &[0],
            6 => &[3, 39],
            11 => &[20],
            _ => &[],
        };
        let codec = if i % 3 == 0 {
            Compression::Lz4
        } else {
            Compression::None
        };
        raw.extend(batch(
            i * PER_BATCH as i64,
            PER_BATCH,
            poison,
            codec,
            -1,
            false,
        ));
    }
    Bytes::from(raw)
}

/// What a plan sends and diverts, and how many records it counts.
pub(super) fn outcome(p: &PartitionPlan) -> (Bytes, Vec<i64>, Option<i64>, u64) {
    (
        p.apply(p.held_from(None)).unwrap(),
        p.diversions.iter().map(|d| d.origin_offset).collect(),
        p.held.as_ref().map(|h| h.offset),
        p.stats.judged,
    )
}

pub(super) fn env<'a>(cache: &'a VerdictCache, budget: &'a Arc<DecodeBudget>) -> Env<'a> {
    Env {
        verdicts: cache,
        budget,
        already: &|_, _| Vec::new(),
    }
}

#[test]
fn a_stretch_judged_ahead_gives_the_plan_made_alone_counted_once() {
    for (action, parts) in [("divert", 2), ("divert", 3), ("divert", 5), ("drop", 3)] {
        stretch_judged_ahead(action, parts);
    }
}

fn stretch_judged_ahead(action: &str, parts: usize) {
    let (pol, t, vis) = (policy(action), Arc::from("t"), uncommitted());
    let records = section();
    let budget = DecodeBudget::unlimited();
    let alone = plan_partition(&input(&pol, &t, &records, &vis), &VerdictCache::new(64));
    let total = (BATCHES as u64) * PER_BATCH as u64;
    let removed = (alone.diversions.len() + alone.invalid_count(Action::Drop)) as u64;
    assert_eq!((alone.stats.validated, removed), (total, 4), "{action}");
    let cache = VerdictCache::new(64);
    let e = env(&cache, &budget);
    let inp = input(&pol, &t, &records, &vis);
    let stretches = stretches(records.len(), parts);
    let ahead: u64 = stretches[1..]
        .iter()
        .map(|s| judge_ahead(&inp, &e, s.clone()))
        .sum();
    assert!(
        ahead > 0 && ahead < total,
        "{parts}: helpers judged {ahead}"
    );
    let p = plan_partition_with(&inp, &e);
    assert_eq!(outcome(&p), outcome(&alone), "{action}, {parts} stretches");
    assert_eq!(
        p.invalid_count(Action::Drop),
        alone.invalid_count(Action::Drop)
    );
    assert_eq!(
        (p.stats.validated, p.stats.cached_batches),
        (total, 0),
        "{parts}: what helpers judged counts as validated by this fetch"
    );
    // The next fetch of the same batches recalls every verdict.
    let again = plan_partition_with(&inp, &e);
    assert_eq!(outcome(&again), outcome(&alone));
    assert_eq!(
        (again.stats.validated, again.stats.cached_batches),
        (0, BATCHES as u64)
    );
}

#[test]
fn a_helper_and_the_planner_at_the_same_time_give_the_plan_made_alone() {
    let (pol, t, vis) = (policy("divert"), Arc::from("t"), uncommitted());
    let records = section();
    let budget = DecodeBudget::unlimited();
    let alone = plan_partition(&input(&pol, &t, &records, &vis), &VerdictCache::new(64));
    let total = (BATCHES as u64) * PER_BATCH as u64;
    for round in 0..50 {
        let cache = VerdictCache::new(64);
        let e = env(&cache, &budget);
        let inp = input(&pol, &t, &records, &vis);
        // From the middle, or from the start (racing the planner batch for batch).
        let from = if round % 2 == 0 { records.len() / 2 } else { 0 };
        let (p, ahead) = std::thread::scope(|s| {
            let helper = s.spawn(|| {
                let e = env(&cache, &budget);
                judge_ahead(&input(&pol, &t, &records, &vis), &e, from..records.len())
            });
            let p = plan_partition_with(&inp, &e);
            (p, helper.join().unwrap())
        });
        assert_eq!(outcome(&p), outcome(&alone), "round {round}");
        assert_eq!(
            p.stats.validated, total,
            "round {round}: helper judged {ahead}"
        );
        assert_eq!(p.stats.cached_batches, 0, "round {round}");
    }
}

#[test]
fn a_helper_stops_where_the_planner_must_hold() {
    let (pol, t, vis) = (policy("divert"), Arc::from("t"), uncommitted());
    let mut raw = batch(0, 3, &[1], Compression::None, -1, false);
    raw.extend(corrupt(batch(3, 2, &[], Compression::None, -1, false)));
    raw.extend(batch(5, 2, &[], Compression::None, -1, false));
    let records = Bytes::from(raw);
    let (cache, budget) = (VerdictCache::new(16), DecodeBudget::unlimited());
    let e = env(&cache, &budget);
    let inp = input(&pol, &t, &records, &vis);
    assert_eq!(
        judge_ahead(&inp, &e, 1..records.len()),
        0,
        "stops at the corrupt batch"
    );
    let p = plan_partition_with(&inp, &e);
    assert_eq!(p.held.map(|h| h.offset), Some(3));
    assert_eq!(p.diversions.len(), 1);
}

#[test]
fn a_helper_leaves_half_the_decode_budget_to_planners() {
    let (pol, t, vis) = (policy("divert"), Arc::from("t"), uncommitted());
    let records = Bytes::from(batch(0, 4, &[2], Compression::Zstd, -1, false));
    let cache = VerdictCache::new(16);
    let budget = DecodeBudget::new(64 << 20);
    let e = env(&cache, &budget);
    let inp = input(&pol, &t, &records, &vis);
    let held = budget.try_reserve((32 << 20) + 1).unwrap();
    assert_eq!(
        judge_ahead(&inp, &e, 0..records.len()),
        0,
        "over half in use"
    );
    drop(held);
    assert_eq!(judge_ahead(&inp, &e, 0..records.len()), 4);
    assert_eq!(budget.used(), 0, "a helper keeps no decoded batch");
    let p = plan_partition_with(&inp, &e);
    assert_eq!((p.stats.validated, p.diversions.len()), (4, 1));
}

#[test]
fn stretches_cover_the_section_in_order() {
    assert_eq!(stretches(10, 3), [0..3, 3..6, 6..10]);
    assert_eq!(stretches(10, 1), vec![0..10]);
    assert_eq!(stretches(10, 0), vec![0..10]);
    assert_eq!(stretches(0, 2), [0..0, 0..0]);
}
