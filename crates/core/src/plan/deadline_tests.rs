//! The judging deadline (`PartitionInput::deadline`): past it, a partition
//! ends at the next batch that still needs judging, never before its first
//! data batch, and what it delivers is exactly the start of what it would
//! deliver without a deadline.

use std::time::{Duration, Instant};

use super::ahead_tests::{env, outcome, section};
use super::budget::DecodeBudget;
use super::tests::{input, policy, uncommitted};
use super::verdicts::VerdictCache;
use super::*;
use crate::kafka::batch;

/// The plan of `section()` (12 batches of 40 records, poison in batches
/// 1, 6 and 11) under `pol` and `deadline`, with `cache`.
fn plan_by(pol: &Arc<Policy>, deadline: Option<Instant>, cache: &VerdictCache) -> PartitionPlan {
    let (topic, vis) = (Arc::from("t"), uncommitted());
    let records = section();
    let mut inp = input(pol, &topic, &records, &vis);
    inp.deadline = deadline;
    let budget = DecodeBudget::unlimited();
    plan_partition_with(&inp, &env(cache, &budget))
}

#[test]
fn past_the_deadline_a_partition_delivers_its_first_batch_and_is_cut_after_it() {
    let cache = VerdictCache::new(64);
    let pol = policy("divert");
    let p = plan_by(&pol, Some(Instant::now()), &cache);
    let cut = p.cut.expect("cut by the deadline");
    assert_eq!(
        cut.offset, 40,
        "the second batch is the first not delivered"
    );
    // `at` is where that batch starts in the records section.
    let second = batch::segments(&section())[1].clone();
    assert_eq!(
        &section()[cut.at..cut.at + second.bytes().len()],
        &second.bytes()[..]
    );
    assert!(p.changes_anything(), "a cut section must be rebuilt");
    assert!(p.held.is_none(), "a cut is not a hold");
    // Batch 0 is delivered as it came; nothing of batch 1 (and its poison)
    // is planned, so nothing is diverted and 40 records count as judged.
    let (sent, diverted, held, judged) = outcome(&p);
    assert_eq!(&sent[..], &section()[..cut.at]);
    assert_eq!((diverted, held, judged), (vec![], None, 40));
}

#[test]
fn a_deadline_not_reached_changes_nothing() {
    let cache = VerdictCache::new(64);
    let pol = policy("divert");
    let alone = outcome(&plan_by(&pol, None, &VerdictCache::new(64)));
    let p = plan_by(
        &pol,
        Some(Instant::now() + Duration::from_secs(3600)),
        &cache,
    );
    assert_eq!(p.cut, None);
    assert_eq!(outcome(&p), alone);
}

#[test]
fn batches_whose_verdicts_are_known_still_go_out_past_the_deadline() {
    let cache = VerdictCache::new(64);
    // A first fetch judges everything; the same section fetched again past
    // its deadline needs no judging, so nothing is cut.
    let pol = policy("divert");
    let first = plan_by(&pol, None, &cache);
    let again = plan_by(&pol, Some(Instant::now()), &cache);
    assert_eq!(again.cut, None);
    assert_eq!(outcome(&again).1, outcome(&first).1, "same diversions");
    assert_eq!(
        again.apply(None).unwrap(),
        first.apply(None).unwrap(),
        "same records section"
    );
}

#[test]
fn the_cut_part_judged_in_the_background_is_found_by_the_next_fetch() {
    let cache = VerdictCache::new(64);
    let budget = DecodeBudget::unlimited();
    let pol = policy("divert");
    let p = plan_by(&pol, Some(Instant::now()), &cache);
    let cut = p.cut.unwrap();
    // What the filter runs after releasing the response.
    let (topic, vis) = (Arc::from("t"), uncommitted());
    let records = section();
    let judged = judge_ahead(
        &input(&pol, &topic, &records, &vis),
        &env(&cache, &budget),
        cut.at..records.len(),
    );
    assert_eq!(judged, 11 * 40);
    // The next fetch starts at the cut: every batch is known, none cut,
    // and its records count as validated once (judged ahead, then claimed).
    let next = records.slice(cut.at..);
    let mut inp = input(&pol, &topic, &next, &vis);
    inp.deadline = Some(Instant::now());
    let q = plan_partition_with(&inp, &env(&cache, &budget));
    assert_eq!(q.cut, None);
    assert_eq!(q.stats.validated, 11 * 40);
    assert_eq!(q.stats.judged, 11 * 40);
    assert_eq!(
        q.diversions
            .iter()
            .map(|d| d.origin_offset)
            .collect::<Vec<_>>(),
        vec![40, 243, 279, 460]
    );
}

#[test]
fn a_hold_in_the_first_batch_is_a_hold_not_a_cut() {
    let cache = VerdictCache::new(64);
    let mut raw = section().to_vec();
    raw[30] ^= 0xff; // batch 0's CRC no longer holds
    let (pol, topic, vis) = (policy("divert"), Arc::from("t"), uncommitted());
    let records = Bytes::from(raw);
    let mut inp = input(&pol, &topic, &records, &vis);
    inp.deadline = Some(Instant::now());
    let budget = DecodeBudget::unlimited();
    let p = plan_partition_with(&inp, &env(&cache, &budget));
    assert_eq!(p.cut, None);
    assert_eq!(p.held.as_ref().map(|h| h.offset), Some(0));
}
