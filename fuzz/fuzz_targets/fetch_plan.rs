//! Fetch-response rewriting on arbitrary records sections: split, judge
//! under the reference JSON policy, plan, apply. Never panics; the rebuilt
//! section splits into the same batches (same base offsets, same next fetch
//! offsets, no more records than before; a commit marker that ends a batch
//! which lost its tail counts as part of it), a held partition stops at the cut.
//! A batch that cannot be judged holds the partition there, never passes.
//! Fetched again once its diversions are acknowledged (batches resent as
//! spliced before, from the verdict cache), the section comes out the same.
//! Judged ahead from its middle first (`plan::judge_ahead`, a helper of
//! another core), the plan sends, diverts and holds exactly what the
//! planner alone does, and counts every record it validates once.
#![no_main]

use std::sync::{Arc, OnceLock};

use antidote::plan::budget::DecodeBudget;
use antidote::plan::{judge_ahead, plan_partition, plan_partition_with, Env, PartitionInput, Visibility};
use antidote::plan::verdicts::VerdictCache;
use antidote::kafka::batch::{segments, Segment};
use antidote::policy::{Policy, PolicySet};
use bytes::Bytes;
use kafka_protocol::messages::fetch_response::AbortedTransaction;
use kafka_protocol::messages::ProducerId;
use libfuzzer_sys::fuzz_target;

fn policy() -> &'static Arc<Policy> {
    static P: OnceLock<Arc<Policy>> = OnceLock::new();
    P.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/geofence.yaml");
        PolicySet::load(&[dir]).expect("reference policy").policies()[0].clone()
    })
}

fn batches(section: &Bytes) -> Vec<(i64, i64, i32)> {
    segments(section)
        .iter()
        .filter_map(|s| match s {
            Segment::Batch(b) => Some((b.base_offset(), b.next_offset(), b.records_count())),
            _ => None,
        })
        .collect()
}

/// `batches`, with each commit marker the splice adds after a batch that
/// lost its tail (antidote::kafka::marker) folded into that batch: the
/// data batch ends at the marker's offset and the marker ends the range.
/// `before` says where the input batches end, so a marker that replaced a
/// whole one-offset batch stays an entry of its own.
fn batches_folding_markers(section: &Bytes, before: &[(i64, i64, i32)]) -> Vec<(i64, i64, i32)> {
    let mut out: Vec<(i64, i64, i32)> = Vec::new();
    for s in segments(section) {
        let Segment::Batch(b) = s else { continue };
        let entry = (b.base_offset(), b.next_offset(), b.records_count());
        let marker = b.is_control() && b.producer_id() == -1;
        let input_end = before.get(out.len().wrapping_sub(1)).map(|x| x.1);
        match out.last_mut() {
            Some(last) if marker && last.1 == entry.0 && input_end.is_some_and(|e| e != last.1) => {
                last.1 = entry.1;
            }
            _ => out.push(entry),
        }
    }
    out
}

/// Whether every record offset is unique and inside its batch's range, as
/// on a real broker (hostile sections may repeat offsets across batches,
/// and a ledger keyed by offset then removes both copies on a re-fetch).
fn offsets_are_sane(section: &Bytes) -> bool {
    let mut seen = std::collections::HashSet::new();
    segments(section).iter().all(|s| match s {
        Segment::Batch(b) => b.decode().map_or(true, |d| {
            d.records().all(|r| (b.base_offset()..b.next_offset()).contains(&r.offset) && seen.insert(r.offset))
        }),
        _ => true,
    })
}

fuzz_target!(|data: &[u8]| {
    // Byte 0: flags (bit 0 read_committed, bit 1 hold at a cut, bit 2 one aborted txn).
    let (flags, section) = data.split_first().map(|(f, s)| (*f, s)).unwrap_or((0, &[][..]));
    let section = Bytes::copy_from_slice(section);
    let aborted = vec![AbortedTransaction::default().with_producer_id(ProducerId(1)).with_first_offset(0)];
    let vis = Visibility::new(flags & 1 == 1, (flags & 4 == 4).then_some(&aborted[..]));
    let topic: Arc<str> = Arc::from("geofence.triggers");
    let cache = VerdictCache::new(64);
    let plan = plan_partition(&PartitionInput { policy: policy(), topic: &topic, partition: 0, records: &section, visibility: &vis, now_ms: 1_780_000_000_000, deadline: None }, &cache);
    {
        let ahead_cache = VerdictCache::new(64);
        let env = Env { verdicts: &ahead_cache, budget: &DecodeBudget::unlimited(), already: &|_, _| Vec::new() };
        let input = PartitionInput { policy: policy(), topic: &topic, partition: 0, records: &section, visibility: &vis, now_ms: 1_780_000_000_000, deadline: None };
        judge_ahead(&input, &env, section.len() / 2..section.len());
        let helped = plan_partition_with(&input, &env);
        let offsets = |p: &antidote::plan::PartitionPlan| p.diversions.iter().map(|d| d.origin_offset).collect::<Vec<_>>();
        assert_eq!(offsets(&helped), offsets(&plan), "judged ahead: other diversions");
        assert_eq!(helped.held.as_ref().map(|h| h.offset), plan.held.as_ref().map(|h| h.offset), "judged ahead: another hold");
        assert_eq!(helped.apply(None).ok(), plan.apply(None).ok(), "judged ahead: other bytes");
        assert_eq!(helped.stats.validated, plan.stats.validated, "judged ahead: records counted twice or not at all");
    }
    {
        // A judging deadline already past: the plan is the start of the one
        // made without it, cut at a batch boundary after its first data batch.
        let input = PartitionInput { policy: policy(), topic: &topic, partition: 0, records: &section, visibility: &vis, now_ms: 1_780_000_000_000, deadline: Some(std::time::Instant::now()) };
        let early = plan_partition(&input, &VerdictCache::new(64));
        let offsets = |p: &antidote::plan::PartitionPlan| p.diversions.iter().map(|d| d.origin_offset).collect::<Vec<_>>();
        match early.cut {
            Some(cut) => {
                assert!(early.held.is_none(), "cut and held");
                // (Offsets are the input's: a lying broker's need not rise.)
                assert!(early.judged_to.is_some(), "cut before a data batch was delivered");
                assert!(cut.at > 0 && cut.at < section.len(), "cut outside the section");
                assert!(offsets(&plan).starts_with(&offsets(&early)), "cut: other diversions before the cut");
                if let (Ok(part), Ok(full)) = (early.apply(None), plan.apply(None)) {
                    assert!(full.starts_with(&part), "cut: not the start of the full plan's section");
                }
            }
            None => assert_eq!(early.apply(None).ok(), plan.apply(None).ok(), "deadline without a cut: other bytes"),
        }
    }
    let before = batches(&section);
    let failed = (flags & 2 == 2).then(|| plan.diversions.first().map(|d| d.origin_offset)).flatten();
    let held = plan.held_from(failed);
    let out = match plan.apply(held) {
        Ok(out) => out,
        Err(e) => panic!("apply failed on a planned section: {e}"),
    };
    // Trailing bytes that are not a complete batch pass through verbatim
    // (protocol-notes §2).
    let partial_in = segments(&section).iter().any(|s| matches!(s, Segment::Partial(_)));
    if !plan.changes_anything() {
        // The interceptor forwards the original bytes then; apply must agree.
        assert_eq!(&out[..], &section[..], "apply changed a section with nothing to change");
        return;
    }
    if let Some(h) = &plan.held {
        // Nothing that could not be judged is delivered: only whole batches
        // before it, and never a legacy or partial segment after it.
        assert!(batches(&out).iter().all(|a| a.0 < h.offset), "a batch at or past an unjudged one was delivered");
    }
    let after = batches_folding_markers(&out, &before);
    match held {
        None => {
            assert_eq!(after.len(), before.len(), "batch count changed");
            for (a, b) in after.iter().zip(&before) {
                assert_eq!(a.0, b.0, "base offset changed");
                assert_eq!(a.1, b.1, "next fetch offset changed");
                assert!(a.2 <= b.2, "records appeared");
            }
            if partial_in {
                assert!(segments(&out).iter().any(|s| matches!(s, Segment::Partial(_))), "trailing partial batch dropped");
            }
            if offsets_are_sane(&section) {
                let mut done: Vec<i64> = plan.diversions.iter().map(|d| d.origin_offset).collect();
                done.sort_unstable();
                let ledger = |from: i64, to: i64| -> Vec<i64> {
                    done.iter().copied().filter(|o| (from..to).contains(o)).collect()
                };
                let env = Env { verdicts: &cache, budget: &DecodeBudget::unlimited(), already: &ledger };
                let again = plan_partition_with(&PartitionInput { policy: policy(), topic: &topic, partition: 0, records: &section, visibility: &vis, now_ms: 1_780_000_000_000, deadline: None }, &env);
                assert!(again.diversions.is_empty(), "an acknowledged diversion was planned again");
                // What the interceptor sends: the rebuilt section, or the
                // original when the plan changes nothing.
                let resent = if again.changes_anything() {
                    again.apply(None).expect("apply on a re-fetch")
                } else {
                    section.clone()
                };
                assert_eq!(&resent[..], &out[..], "a re-fetch after the diversions came out different");
            }
        }
        Some(cut) => {
            assert!(after.iter().all(|a| a.0 < cut), "batch at or past the cut delivered");
            for (a, b) in after.iter().zip(&before) {
                assert_eq!(a.0, b.0, "base offset changed");
            }
        }
    }
});
